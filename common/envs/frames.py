"""Video frames drawn from image observations, for envs without a renderer of their own (the built-in
MinAtar games, envpool's Atari): their `render(env_ids)` returns `frames_from_image` of what they observe.
Pure numpy: common.video writes the frames and imports nothing from the env package.
"""

from __future__ import annotations

import numpy as np

IMAGE_KINDS = ("stack", "rgb", "objects")


def frames_from_image(image, kind: str = "stack", min_side: int = 160) -> list[np.ndarray]:
    """Video frames (uint8 [H', W', 3]) of image observations uint8 [N, C, H, W] (a tensor or an array).

    kind: "stack": C stacked grayscale frames (Atari's), the newest (last) one is shown;
    "rgb": C = 3 colour channels; "objects": one channel per kind of object (MinAtar's), each in a
    colour of its own on black; where objects overlap, the rarer kind in the frame shows (a ball
    inside a wall of bricks stays visible).
    Each side is enlarged by the same whole factor (nearest neighbour) to at least `min_side` pixels,
    so that a 10x10 MinAtar board is not a smudge in a video player.
    """
    if kind not in IMAGE_KINDS:
        raise ValueError(f"kind must be one of {', '.join(IMAGE_KINDS)}, got {kind!r}")
    image = image.detach().cpu().numpy() if hasattr(image, "detach") else np.asarray(image)
    if image.ndim != 4 or image.dtype != np.uint8:
        raise ValueError(f"expected uint8 images [N, C, H, W], got {image.dtype} {list(image.shape)}")
    n, c, h, w = image.shape
    if kind == "stack":
        rgb = np.repeat(image[:, -1:], 3, axis=1)
    elif kind == "rgb":
        if c != 3:
            raise ValueError(f"kind 'rgb' needs 3 channels, got {c}")
        rgb = image
    else:
        # Evenly spaced hues at full saturation: neighbouring channels get distinct colours.
        hues = np.arange(c) / c
        palette = np.stack([np.clip(np.abs((hues * 6 + k) % 6 - 3) - 1, 0, 1) for k in (0, 4, 2)], axis=1)
        on = image > 127
        rarity = np.where(on, on.sum((2, 3))[:, :, None, None], h * w + 1)
        top = np.where(on.any(1), np.argmin(rarity, axis=1), -1)  # per pixel: the rarest kind of object set there
        rgb = np.where(top[:, None] >= 0, (palette[top] * 255).astype(np.uint8).transpose(0, 3, 1, 2), 0).astype(
            np.uint8
        )
    scale = max(1, -(-min_side // min(h, w)))
    rgb = rgb.transpose(0, 2, 3, 1).repeat(scale, axis=1).repeat(scale, axis=2)
    return [np.ascontiguousarray(frame) for frame in rgb]
