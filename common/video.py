"""Evaluation videos: frames to an mp4 file, to TensorBoard and to wandb.

The frames come from the eval envs' `render(env_ids)` (gymnasium's own renderers for the
built-in classic envs and `gym:` envs), only for the recorded envs and only during an evaluation
with --capture-video. Pixel envs without a renderer of their own (the built-in MinAtar games,
envpool's Atari) draw their frames from the observation itself: `frames_from_image`.
The writers are optional dependencies: the `[video]` extra.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

EXTRA = 'pip install -e ".[video]"'
TENSORBOARD_MAX_SIDE = 256  # TensorBoard gets a downscaled GIF; the mp4 keeps the full frames


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
        rgb = np.where(top[:, None] >= 0, (palette[top] * 255).astype(np.uint8).transpose(0, 3, 1, 2), 0).astype(np.uint8)
    scale = max(1, -(-min_side // min(h, w)))
    rgb = rgb.transpose(0, 2, 3, 1).repeat(scale, axis=1).repeat(scale, axis=2)
    return [np.ascontiguousarray(frame) for frame in rgb]


def check_dependencies(env_id: str) -> None:
    """Stop before training, with one line naming the extra, when a video could not be written (pygame
    only for the built-in envs that gymnasium's classic renderers draw, not those drawn from images)."""
    from common.envs import BUILTIN_ENVS
    from common.envs.core import TorchEnv

    env = BUILTIN_ENVS.get(env_id)
    draws_with_pygame = env is not None and env.render is TorchEnv.render
    missing = []
    for module in ("imageio", "imageio_ffmpeg", "PIL") + (("pygame",) if draws_with_pygame else ()):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise SystemExit(f"error: --capture-video needs {', '.join(missing)}: {EXTRA}")


def write_mp4(path: Path, frames: list[np.ndarray], fps: float) -> Path:
    """H.264 mp4 of uint8 [H, W, 3] frames (sides padded to even sizes, as the codec needs)."""
    import imageio.v2 as imageio

    path.parent.mkdir(parents=True, exist_ok=True)
    h, w = frames[0].shape[:2]
    pad = ((0, h % 2), (0, w % 2), (0, 0))
    with imageio.get_writer(path, fps=fps, codec="libx264", quality=7, macro_block_size=1,
                            ffmpeg_log_level="error") as writer:
        for frame in frames:
            writer.append_data(np.pad(frame, pad, mode="edge") if h % 2 or w % 2 else frame)
    return path


def add_video(writer, tag: str, frames: list[np.ndarray], step: int, fps: float) -> None:
    """A video in TensorBoard's images tab (an animated GIF, which is what SummaryWriter.add_video
    writes, without its moviepy dependency)."""
    from PIL import Image
    from torch.utils.tensorboard.summary import Summary

    h, w = frames[0].shape[:2]
    scale = min(1.0, TENSORBOARD_MAX_SIDE / max(h, w))
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    images = [Image.fromarray(f).resize(size, Image.BILINEAR) for f in frames]
    buf = io.BytesIO()
    images[0].save(buf, format="GIF", save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    image = Summary.Image(height=size[1], width=size[0], colorspace=3, encoded_image_string=buf.getvalue())
    writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)
