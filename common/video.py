"""Evaluation videos: frames to an mp4 file, to TensorBoard and to wandb.

The frames come from the eval envs' `render(env_ids)` (gymnasium's own renderers for the
built-in classic envs and `gym:` envs), only for the recorded envs and only during an evaluation
with --capture-video. Pixel envs without a renderer of their own (the built-in MinAtar games,
envpool's Atari) draw their frames from the observation itself (common.envs.frames).
The writers are optional dependencies: the `[video]` extra.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

EXTRA = 'pip install -e ".[video]"'
TENSORBOARD_MAX_SIDE = 256  # TensorBoard gets a downscaled GIF; the mp4 keeps the full frames


def check_dependencies(pygame: bool) -> None:
    """Stop before training, with one line naming the extra, when a video could not be written (`pygame`: the
    env's frames are drawn by gymnasium's classic renderers, not from its images; the caller knows the env)."""
    missing = []
    for module in ("imageio", "imageio_ffmpeg", "PIL") + (("pygame",) if pygame else ()):
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
    with imageio.get_writer(
        path, fps=fps, codec="libx264", quality=7, macro_block_size=1, ffmpeg_log_level="error"
    ) as writer:
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
