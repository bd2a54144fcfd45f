"""Checkpoints that survive a kill and load with `torch.load(weights_only=True)`.

A checkpoint is one file holding a dict of tensors and plain Python values (never pickled
objects): format version, algorithm, env id, args, counters, model/optimizer/normalizer state
dicts, best eval return, the RNG states of every rank and the env state where available.
Writes are atomic (temporary file in the same directory, fsync, rename), so a process killed
in the middle of a save leaves the previous `last.pt` intact.
"""

from __future__ import annotations

import os
import pickle
import random
import zipfile
from pathlib import Path

import numpy as np
import torch

# 2: per-rank state (RNG, env, ...) under "ranks", optimizers under "optimizers" (1: "rng", "env", "optimizer")
FORMAT_VERSION = 2
LAST, BEST = "last.pt", "best.pt"


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, unreadable, or belongs to another run shape."""


def checkpoint_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(state: dict, path: str | os.PathLike) -> Path:
    """Write `state` to `path` atomically: readers see the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    # The rename is only durable once the directory entry is on disk too.
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def load_checkpoint(
    path: str | os.PathLike,
    algo: str | None = None,
    env_id: str | None = None,
    map_location: str | torch.device = "cpu",
) -> dict:
    """Load a checkpoint safely and check that it belongs to `algo` and `env_id` when given."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}: check the path, or start without --resume")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; a cut-off one has no directory
        raise CheckpointError(f"{path} is truncated or corrupt (not a complete archive); resume from another checkpoint, e.g. best.pt")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{path} is not a checkpoint of this project: it holds Python objects that a safe load refuses ({e})"
        ) from None
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError) as e:
        raise CheckpointError(
            f"{path} is truncated or corrupt ({type(e).__name__}); resume from another checkpoint, e.g. best.pt"
        ) from None
    if not isinstance(state, dict) or "format_version" not in state:
        raise CheckpointError(f"{path} is not a checkpoint of this project (no format_version entry)")
    if state["format_version"] != FORMAT_VERSION:
        age = "newer" if state["format_version"] > FORMAT_VERSION else "older"
        raise CheckpointError(
            f"{path} has format version {state['format_version']}, {age} than this code's {FORMAT_VERSION}: "
            f"use the version of the scripts that wrote it"
        )
    if algo is not None and state.get("algo") != algo:
        raise CheckpointError(f"{path} was written by {state.get('algo')!r}, not {algo!r}: it cannot resume this script")
    if env_id is not None and state.get("env_id") != env_id:
        raise CheckpointError(
            f"{path} was trained on env {state.get('env_id')!r}, not {env_id!r}: pass --env-id {state.get('env_id')}"
        )
    return state


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """`optimizer.load_state_dict(state)` that keeps this run's device-dependent settings.

    load_state_dict copies the saved param groups' settings over the current ones. For Adam
    that includes `capturable`: a checkpoint written on CPU and resumed on CUDA would come back
    non-capturable (CUDA graph capture of `step()` then fails, and every step syncs on `lr`), and
    one written on CUDA fails on CPU. So `capturable`, `foreach` and `fused` stay as this run
    built them, step counters move to where that setting wants them, and a tensor learning rate
    stays the same tensor (schedules and captured graphs hold it), filled with the saved value.
    """
    kept = [{k: g[k] for k in ("capturable", "foreach", "fused", "lr") if k in g} for g in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, own in zip(optimizer.param_groups, kept):
        saved_lr = group["lr"]
        group.update(own)
        if torch.is_tensor(own.get("lr")):
            own["lr"].fill_(float(saved_lr))
        else:
            group["lr"] = saved_lr  # a float lr: the checkpoint's value, as plain load_state_dict does
        capturable = own.get("capturable", False)
        for p in group["params"]:
            s = optimizer.state.get(p, {})
            if torch.is_tensor(s.get("step")):
                s["step"] = s["step"].to(device=p.device if capturable else "cpu", dtype=torch.float32)


def resolve_resume(resume: str | None, run_dir: str | os.PathLike) -> Path | None:
    """--resume PATH -> PATH (must exist); --resume auto -> the run's last.pt if there is one."""
    if resume is None or resume == "":
        return None
    if resume == "auto":
        last = checkpoint_dir(run_dir) / LAST
        return last if last.is_file() else None
    path = Path(resume)
    if path.is_dir():  # a run directory or its checkpoints/ folder
        for candidate in (path / LAST, checkpoint_dir(path) / LAST):
            if candidate.is_file():
                return candidate
    if not path.is_file():
        raise CheckpointError(f"--resume {resume}: no such checkpoint file")
    return path


def capture_rng_state() -> dict:
    """This process's RNG states (torch CPU, its CUDA device, numpy, random) as safe-to-load values."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"].cpu())
    npst = state["numpy"]
    np.random.set_state(
        ("MT19937", npst["keys"].numpy().astype(np.uint32), npst["pos"], npst["has_gauss"], npst["cached_gaussian"])
    )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())


def elastic_restart_count() -> int:
    """How many times torchrun has restarted this worker group (0 on a first launch or without torchrun)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def stable_run_name(run_name: str | None, default_name: str, output_dir: str | os.PathLike) -> tuple[str, bool]:
    """The run name that survives torchrun restarts of the worker group, and whether an earlier
    worker group of this launch started it (the workers then continue from its last.pt).

    The default name carries a timestamp, which a restarted worker would compute anew and so
    lose its run directory. Under torchrun, the first worker group of a launch records the name
    in a marker keyed by the launch (torchrun's run id, i.e. --rdzv-id, or this host and the
    launcher's pid when the run id is the default 'none'); the groups after it read it back.
    With a run id, a marker is enough to tell a later group: torchrun re-forms the group when a
    node joins or leaves without counting a restart, and a new node's agent counts from 0. Call
    it on rank 0 only. Outside torchrun: (run_name or default_name, False).
    """
    name = run_name or default_name
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None:
        return name, False
    single_agent = run_id in ("", "none")  # static rendezvous: one launcher, which counts its restarts
    if single_agent:
        import socket

        run_id = f"{socket.gethostname()}-{os.getppid()}"
    marker = Path(output_dir) / ".launches" / run_id
    if marker.is_file() and (elastic_restart_count() > 0 or not single_agent):
        return run_name or marker.read_text().strip(), True
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(name)
    return name, False
