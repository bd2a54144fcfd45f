"""Evaluation videos to an mp4 file, to TensorBoard and to wandb: the eval envs' `render(env_ids)` frames (pixel envs
without a renderer draw them from the observation: common.envs.frames). The writers are the `[video]` extra."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import threading
from fractions import Fraction
from pathlib import Path

import numpy as np

from common.checkpoint import OutputError

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
    """H.264 mp4 of uint8 [H, W, 3] frames (sides padded to even sizes, as the codec needs), written whole or not at
    all; a failure raises OutputError naming `path` and ffmpeg's cause. ffmpeg runs here, not through imageio's
    writer, which ignores ffmpeg's exit status (a full disk left a truncated mp4); the command is imageio's for the
    same options (libx264, quality 7 = crf 15, yuv420p), so the files are the same."""
    import imageio_ffmpeg

    h, w = frames[0].shape[:2]
    pad = ((0, h % 2), (0, w % 2), (0, 0))
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")  # ffmpeg picks the container by the suffix
    cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-y", "-f", "rawvideo", "-vcodec", "rawvideo"]
    cmd += ["-s", f"{w + w % 2}x{h + h % 2}", "-pix_fmt", "rgb24", "-r", str(Fraction(fps).limit_denominator())]
    cmd += ["-i", "-", "-an", "-vcodec", "libx264", "-pix_fmt", "yuv420p", "-crf", "15", "-v", "error", str(tmp)]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        said = []  # ffmpeg's error lines, read as they come (a full pipe would stall it)
        reader = threading.Thread(target=lambda: said.append(proc.stderr.read()), daemon=True)
        reader.start()
        try:
            for frame in frames:
                proc.stdin.write((np.pad(frame, pad, mode="edge") if h % 2 or w % 2 else frame).tobytes())
        except BrokenPipeError:
            pass  # ffmpeg stopped: its exit status and its lines say why
        finally:
            try:
                proc.stdin.close()  # the end of the input: ffmpeg writes the file's index and exits
            except BrokenPipeError:
                pass
            code = proc.wait()
            reader.join()
        if code != 0:
            raise _ffmpeg_error(b"".join(said).decode(errors="replace"), code)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise OutputError(e.errno, e.strerror or str(e), str(path)) from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
    return path


def _ffmpeg_error(said: str, code: int) -> OSError:
    """ffmpeg's failure as an OSError: the system error its lines name (No space left on device, ...), or its last."""
    for number in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EIO):
        if os.strerror(number) in said:
            return OSError(number, os.strerror(number))
    last = said.strip().splitlines()[-1] if said.strip() else f"exit status {code}"
    return OSError(None, f"ffmpeg failed: {last}")


def add_video(writer, tag: str, frames: list[np.ndarray], step: int, fps: float) -> None:
    """A video in TensorBoard's images tab: an animated GIF, as SummaryWriter.add_video writes, without moviepy."""
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
