"""Checkpoints that survive a kill and load with `torch.load(weights_only=True)`.

    state = TrainingState(model, optimizers, replicated={...}, per_rank={...}, envs=envs)  # declared once
    next_obs = restore(run, state, next_obs)       # in place, from --resume (or a torchrun restart)
    save(run, names, state, next_obs)              # best.pt / last.pt / step_N.pt of this iteration

A checkpoint is a dict of tensors and plain values, never pickled objects (a safe load refuses those). Writes are
atomic (temporary file, fsync, rename): a process killed mid-save leaves the previous `last.pt` intact.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from common import distributed
from common.args import RUN_FLAGS
from common.export import export_policy

if TYPE_CHECKING:
    from common.record import Run

# 4: TrainingState.replicated under "state", each rank's per_rank under ranks[r]["state"]. 3, still read, had them
# beside the format's own keys (FORMAT_KEYS, RANK_KEYS): its other keys are the script's state.
FORMAT_VERSION = 4
FORMAT_KEYS = {
    "format_version",
    "algo",
    "algorithm",
    "totals",
    "env_id",
    "args",
    "world_size",
    "global_step",
    "iteration",
    "best_eval_return",
    "model",
    "optimizers",
    "ranks",
    "state",
}
RANK_KEYS = {"rng", "env", "next_obs", "buffer", "state"}
LAST, BEST = "last.pt", "best.pt"
EXPORT = "export"  # the folder of the policy exported with best.pt (--export-best)
ARTIFACTS = {LAST: "last", BEST: "best", EXPORT: "policy"}  # with --track: what is uploaded, as <run name>-<kind>


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, unreadable, or belongs to another run shape."""


def algorithm_of(ckpt: dict) -> str:
    """The ALGO of the script that wrote `ckpt` ("algo" in one older than scripts named by their files)."""
    return ckpt.get("algorithm", ckpt.get("algo"))


def check_written_by(run: Run, ckpt: dict, path) -> None:
    """That `ckpt` (--resume's) continues a run of this script: not another algorithm's, nor, without
    --resume-other-script, another script's of the same algorithm (a copy). --eval-only reads any of the algorithm."""
    writer = ckpt.get("algo")
    if algorithm_of(ckpt) != run.algorithm:
        raise CheckpointError(f"{path} was written by {writer!r}, not {run.algo!r}: it cannot resume this script")
    if writer != run.algo and not (run.args.eval_only or run.args.resume_other_script):
        raise CheckpointError(
            f"{path} is a run of {writer}.py, not of {run.algo}.py: resuming it here would go on with this script's "
            f"code and flags in the other's run. Start a new run from its weights with --init-from {path}, resume it "
            f"with {writer}.py, or pass --resume-other-script to continue it with {run.algo}.py"
        )


# The entries a checkpoint of this format holds whatever wrote it: a dict without one is not a whole checkpoint
REQUIRED_KEYS = (
    "args",
    "global_step",
    "iteration",
    "best_eval_return",
    "world_size",
    "model",
    "optimizers",
    "state",
    "ranks",
)


def check_complete(ckpt: dict, path) -> None:
    """That `ckpt` has every entry a resume or --init-from reads: one line naming those it lacks, else nothing."""
    missing = [key for key in REQUIRED_KEYS if key not in ckpt]
    if missing:
        raise CheckpointError(
            f"{path} is not a whole checkpoint: its format {ckpt.get('format_version')} dict has no "
            f"{', '.join(missing)}; {_another_checkpoint(Path(path))}"
        )


def run_totals(run: Run) -> dict:
    """What a run's summary adds up over its processes (a run resumed k times has k + 1). Saved in every
    checkpoint; the next process starts from the one it resumes."""
    before = run.totals
    seconds = dict(before.get("seconds", {}))
    for phase, s in run.seconds.items():
        seconds[phase] = seconds.get(phase, 0.0) + s
    return {
        "wall_seconds": before.get("wall_seconds", 0.0) + time.time() - run.start_time,
        "seconds": seconds,
        "processes": before.get("processes", 0) + 1,
        "last_train_return": run.last_train_return,
        "last_eval_return": run.last_eval_return,
    }


def checkpoint_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


class OutputError(OSError):
    """A file of the run that could not be written (a full disk, a quota, a read-only or vanished directory):
    `filename` is the file, `errno` and `strerror` the system's cause. The file's earlier version is intact."""


def write_atomically(path: str | os.PathLike, write) -> Path:
    """Call `write(f)` on a temporary file beside `path`, then move it over `path`: readers see the old file or
    the new one, never half. A failed write (OutputError) leaves the old file and no temporary file behind."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        # The rename is only durable once the directory entry is on disk too.
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except (OSError, RuntimeError) as e:
        # torch.save reports a failed write as its own RuntimeError ("unexpected pos") raised while handling the
        # OSError of the write: the OSError is the cause worth a line
        cause = e
        while cause is not None and not isinstance(cause, OSError):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        raise OutputError(cause.errno, cause.strerror or str(cause), str(path)) from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # a directory that went read-only or away: nothing more to clean
    return path


def remove_dead_temporaries(run_dir: str | os.PathLike) -> str | None:
    """Remove the temporary files of `write_atomically` (.<name>.<pid>.tmp) that processes killed during a write left
    in `run_dir` and its checkpoints/, never this process's nor a running pid's. Called by the lock's holder, the one
    process that writes the run. Returns the line that says what was removed, or None."""
    removed, size = 0, 0
    for folder in (Path(run_dir), checkpoint_dir(run_dir)):
        for tmp in folder.glob(".*.tmp") if folder.is_dir() else ():
            try:
                pid = int(tmp.name.rsplit(".", 2)[-2])
            except (ValueError, IndexError):
                continue  # not one of ours
            if pid == os.getpid() or _runs(pid):
                continue
            try:
                bytes_ = tmp.stat().st_size
                tmp.unlink()
            except OSError:
                continue
            removed, size = removed + 1, size + bytes_
    if not removed:
        return None
    return (
        f"notice: removed {removed} temporary file(s) ({size / 1e6:.1f} MB) that processes killed during a save "
        f"left in {run_dir}"
    )


def _runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def save_checkpoint(state: dict, path: str | os.PathLike) -> Path:
    """Write `state` to `path` atomically (`write_atomically`)."""
    return write_atomically(path, lambda f: torch.save(state, f))


def load_checkpoint(
    path: str | os.PathLike,
    algo: str | None = None,
    env_id: str | None = None,
    map_location: str | torch.device = "cpu",
) -> dict:
    """Load a checkpoint safely and check that it belongs to `algo` (a copy's belong to its original's) and `env_id`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}: check the path, or start without --resume")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; a cut-off one has no directory
        raise CheckpointError(f"{path} is truncated or corrupt (not a complete archive); {_another_checkpoint(path)}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        # torch's own text is several lines with ANSI escapes: the one fact it holds is the line below
        raise CheckpointError(
            f"{path} is not a checkpoint of this project: it holds Python objects that a safe load "
            f"(weights_only) refuses; {_another_checkpoint(path)}"
        ) from None
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError) as e:
        raise CheckpointError(
            f"{path} is truncated or corrupt ({type(e).__name__}); {_another_checkpoint(path)}"
        ) from None
    if not isinstance(state, dict) or "format_version" not in state:
        raise CheckpointError(f"{path} is not a checkpoint of this project (no format_version entry)")
    if state["format_version"] == 3:  # the script's own state beside the format's keys: moved into its namespaces
        state = {
            **{k: v for k, v in state.items() if k in FORMAT_KEYS},
            "format_version": FORMAT_VERSION,
            "state": {k: v for k, v in state.items() if k not in FORMAT_KEYS},
            "ranks": [
                {
                    **{k: v for k, v in r.items() if k in RANK_KEYS},
                    "state": {k: v for k, v in r.items() if k not in RANK_KEYS},
                }
                for r in state.get("ranks", [])
            ],
        }
    if state["format_version"] != FORMAT_VERSION:
        age = "newer" if state["format_version"] > FORMAT_VERSION else "older"
        raise CheckpointError(
            f"{path} has format version {state['format_version']}, {age} than this code's {FORMAT_VERSION}: "
            f"use the version of the scripts that wrote it"
        )
    if algo is not None and algorithm_of(state) != algo:
        raise CheckpointError(
            f"{path} was written by {state.get('algo')!r}, not {algo!r}: it cannot resume this script"
        )
    if env_id is not None and state.get("env_id") != env_id:
        raise CheckpointError(
            f"{path} was trained on env {state.get('env_id')!r}, not {env_id!r}: pass --env-id {state.get('env_id')}"
        )
    return state


def _another_checkpoint(path: Path) -> str:
    """The advice of a checkpoint that cannot be read: the command that resumes from another one of its run, if any."""
    others = sorted(p for p in path.parent.glob("*.pt") if p.name != path.name and not p.name.startswith("."))
    if not others:
        return "no other checkpoint beside it: start the run over with --overwrite (it removes the run directory)"
    best = path.parent / BEST
    other = best if best in others else others[-1]
    return f"resume from another checkpoint of the run with --resume {other}"


def checkpoints_without_last(run_dir: str | os.PathLike) -> list[tuple[Path, int | None]]:
    """The checkpoints of `run_dir` other than last.pt (best.pt first, then step_<N>.pt by step), each with its global
    step (None where it cannot be read)."""
    ckpts = checkpoint_dir(run_dir)
    found = [p for p in ckpts.glob("*.pt") if p.name != LAST and not p.name.startswith(".")] if ckpts.is_dir() else []
    found.sort(key=lambda p: (p.name != BEST, len(p.name), p.name))
    steps = []
    for p in found:
        try:
            steps.append((p, int(torch.load(p, map_location="cpu", weights_only=True)["global_step"])))
        except Exception:  # noqa: BLE001 -- a damaged one is named without its step
            steps.append((p, None))
    return steps


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """`optimizer.load_state_dict(state)` that keeps this run's device-dependent settings. Plain load_state_dict
    copies the saved `capturable` over: a CPU checkpoint resumed on CUDA would fail graph capture of `step()` (and
    sync on `lr` every step), a CUDA one fail on CPU. So `capturable`, `foreach` and `fused` stay this run's, step
    counters move where that wants them, and a tensor lr stays the same tensor (schedules and graphs hold it)."""
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
    """The run name that survives torchrun restarts of the worker group, and whether an earlier worker group of this
    launch started it (the workers then continue from its last.pt). Rank 0 only. The default name's timestamp would
    change on a restart, so the first group records the name in a marker keyed by the launch (--rdzv-id, or host and
    launcher pid for 'none'). With a run id a marker alone tells a later group: torchrun re-forms the group without
    counting a restart when a node joins or leaves, and a new node's agent counts from 0."""
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


# ----------------------------------------------------------------------------------------------
# A run's checkpoints: what a script declares, saved and restored across ranks (collectives)
# ----------------------------------------------------------------------------------------------
@dataclass
class TrainingState:
    """What a script's checkpoints hold besides the run's counters, declared once in its `train`: `save` writes it
    and `restore` reads it back in place, so the two never disagree on a name.

    - `model`, `optimizers`: the same on every rank; rank 0's are written.
    - `replicated`: {name: a module or object with state_dict/load_state_dict, a tensor (filled in place) or a dict
      of host counters (updated in place)}, the same on every rank.
    - `per_rank`: {name: tensor} of this rank's envs, gathered to rank 0 with its RNG states and env snapshot, and
      read back only where this rank's envs continue their episodes exactly (the run names those it cannot).
    - `buffer`: a replay buffer, in last.pt when `save_buffer`.

    A checkpoint to resume must hold exactly the names the script declares: a copy that adds one resumes its own
    runs, and starts from another script's with --init-from.
    """

    model: torch.nn.Module
    optimizers: dict
    envs: Any
    replicated: dict = field(default_factory=dict)
    per_rank: dict = field(default_factory=dict)
    buffer: Any = None
    save_buffer: bool = False


def _state_of(obj):
    if hasattr(obj, "state_dict"):
        return obj.state_dict()
    return dict(obj) if isinstance(obj, dict) else obj


def _load_into(obj, saved) -> None:
    if hasattr(obj, "load_state_dict"):
        obj.load_state_dict(saved)
    elif isinstance(obj, dict):
        obj.update(saved)
    else:
        obj.copy_(torch.as_tensor(saved))


def _to_cpu(x):
    """Tensors (also inside dicts, lists and TensorDicts) as CPU tensors, the rest as is."""
    if isinstance(x, TensorDictBase):
        return x.detach().cpu().to_dict()
    if torch.is_tensor(x):
        return x.detach().cpu()
    if isinstance(x, dict):
        return {k: _to_cpu(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_cpu(v) for v in x)
    return x


def _to_device(x, device):
    return torch.utils._pytree.tree_map(lambda v: v.to(device) if torch.is_tensor(v) else v, x)


def export_run_policy(run: Run, out_dir, model: torch.nn.Module, source) -> Path:
    """The deterministic policy of `model` exported to `out_dir`, labelled with the run; a failed write: OutputError."""
    info = {
        "algo": run.algo,
        "env_id": run.args.env_id,
        "global_step": run.global_step,
        "iteration": run.iteration,
        "checkpoint": str(source),
    }
    try:
        return export_policy(out_dir, model, run.observation_space, run.action_space, info)
    except OSError as e:
        raise OutputError(e.errno, e.strerror or str(e), str(out_dir)) from None


def save(run: Run, names: list[str], state: TrainingState, next_obs) -> None:
    """Write the checkpoints `names` (BEST, LAST, step_N.pt) of this iteration. A collective: every rank calls it.
    Each rank's own state goes to rank 0 as CPU tensors, so that no rank rebuilds another's tensors on its GPU."""
    args = run.args
    mine = {"rng": capture_rng_state(), "env": state.envs.state_dict(), "next_obs": next_obs, "state": state.per_rank}
    if LAST in names and state.save_buffer:
        mine["buffer"] = state.buffer.state_dict()
    ranks = distributed.gather_object(_to_cpu(mine))
    # the run's lock handle (common.lock) says when another process holds the run now: its checkpoints stay its own
    if run.is_main and run.lock is not None and run.lock.lost:
        raise SystemExit(run.lock.lost)
    if run.is_main:
        checkpoint = {
            "format_version": FORMAT_VERSION,
            "algo": run.algo,
            "algorithm": run.algorithm,
            "env_id": args.env_id,
            "args": {**run.foreign_flags, **asdict(args)},
            "totals": run_totals(run),
            "world_size": run.world_size,
            "global_step": run.global_step,
            "iteration": run.iteration,
            "best_eval_return": run.best_eval_return,
            "model": state.model.state_dict(),
            "optimizers": {k: opt.state_dict() for k, opt in state.optimizers.items()},
            "state": {k: _to_cpu(_state_of(v)) for k, v in state.replicated.items()},
        }
        for name in names:
            keep = ranks if name == LAST else [{k: v for k, v in r.items() if k != "buffer"} for r in ranks]
            save_checkpoint({**checkpoint, "ranks": keep}, checkpoint_dir(run.run_dir) / name)
            run.saved[name] = run.global_step  # the last good one, named when a later write fails
        if args.keep_checkpoints > 0:  # the newest M numbered checkpoints stay
            numbered = sorted(checkpoint_dir(run.run_dir).glob("step_*.pt"), key=lambda p: int(p.stem[5:]))
            for old in numbered[: -args.keep_checkpoints]:
                old.unlink()
        if BEST in names and args.export_best:
            export_run_policy(run, run.run_dir / EXPORT, state.model, BEST)
        if run.wandb_run is not None:
            run.uploads.update(name for name in names if name in (LAST, BEST))
            if BEST in names and args.export_best:
                run.uploads.add(EXPORT)
            if LAST in names:  # at the save interval (and the end), not at every new best
                upload_checkpoints(run)
    if LAST in names:
        run.last_save_time = time.time()


def upload_checkpoints(run: Run) -> None:
    """With --track, log the checkpoints written since their last upload as wandb artifacts: a run whose disk is lost
    resumes from one. wandb stages a copy of each file at once (uploaded in the background); a copy it cannot write
    (its staging folder on a full disk) raises OutputError naming it, and the run's own files are whole."""
    import wandb

    base = re.sub(r"[^\w.-]", "-", run.run_dir.name)  # an artifact's name allows letters, digits, - _ .
    for kind in sorted(run.uploads):
        source = run.run_dir / EXPORT if kind == EXPORT else checkpoint_dir(run.run_dir) / kind
        try:
            artifact = wandb.Artifact(
                f"{base}-{ARTIFACTS[kind]}",
                type="model",
                metadata={"algo": run.algo, "env_id": run.args.env_id, "global_step": run.global_step},
            )
            if kind == EXPORT:
                artifact.add_dir(str(source))
            else:
                artifact.add_file(str(source), name=kind)
            run.wandb_run.log_artifact(artifact, aliases=["latest", f"step_{run.global_step}"])
        except OSError as e:
            where = f" in {Path(e.filename).parent}" if e.filename and Path(e.filename) != source else ""
            raise OutputError(e.errno, e.strerror or str(e), f"wandb's staging copy of {source}{where}") from None
    run.uploads.clear()


def restore(run: Run, state: TrainingState, next_obs):
    """Read the resumed checkpoint back into `state` in place, or a new run's --init-from (`init_from`); returns the
    next observation to act on. Model, optimizers and replicated state always come back; this rank's RNG states only
    with the same world size and --num-envs (else re-derived from the seed); its env snapshot, next observation and
    per-rank tensors only where the envs can be snapshotted (gym:, mjlab: start fresh). The run says what it leaves."""
    ckpt, args = run.checkpoint, run.args
    run.held = state  # what a run whose directory is removed under it saves again (common.run)
    if ckpt is None:
        if run.init_checkpoint is not None:
            init_from(run, state)
        return next_obs
    if not args.eval_only:
        _check_own_state(run, state, ckpt)
    try:
        state.model.load_state_dict(ckpt["model"])
        for name, opt in state.optimizers.items():
            load_optimizer_state(opt, ckpt["optimizers"][name])
    except (RuntimeError, ValueError, KeyError) as e:
        raise SystemExit(
            f"error: {run.resume_path} holds networks of another shape than this run builds; it was saved "
            f"with {_saved_network_flags(ckpt, args)}: resume with those ({str(e).splitlines()[0][:120]})"
        ) from None
    for name, obj in state.replicated.items():
        if name in ckpt["state"]:  # all of them, but for --eval-only of another script's checkpoint
            _load_into(obj, _to_device(ckpt["state"][name], run.device))
    run.say(f"resumed from {run.resume_path} at iteration {run.iteration}, global step {run.global_step}")
    mine, continues = None, False
    if args.eval_only:  # the eval envs are seeded as the checkpoint's evaluation was: nothing of the ranks is needed
        return next_obs
    if ckpt["world_size"] != run.world_size or ckpt["args"]["num_envs"] != args.num_envs:
        run.say(
            f"notice: checkpoint from {ckpt['world_size']} process(es) x {ckpt['args']['num_envs']} envs, this run "
            f"{run.world_size} x {args.num_envs}; env and RNG streams re-derived from the seed (networks, optimizers, "
            f"normalizers restored)"
        )
    else:
        restore_rng_state(ckpt["ranks"][run.rank]["rng"])  # CPU tensors
        mine = _to_device(ckpt["ranks"][run.rank], run.device)
        continues = bool(mine.get("env"))  # an env without snapshots (gym:, mjlab:) starts fresh episodes
        if continues:
            state.envs.load_state_dict(mine["env"])
            next_obs = TensorDict(mine["next_obs"], batch_size=[args.num_envs], device=run.device)
            for name, tensor in state.per_rank.items():
                tensor.copy_(mine["state"][name])
    if not continues and state.per_rank:
        why = "the envs start fresh episodes" if mine is not None else "another world size or --num-envs"
        run.say(
            f"notice: per-rank state not restored ({why}), starting from its initial values: "
            f"{', '.join(state.per_rank)}"
        )
    if state.buffer is not None:
        _restore_buffer(run, state.buffer, mine, continues)
    return next_obs


def _check_own_state(run: Run, state: TrainingState, ckpt: dict) -> None:
    """One line, before anything is loaded, when the checkpoint's own state is not the script's."""
    parts = {
        "replicated": (set(state.replicated), set(ckpt["state"])),
        "per-rank": (set(state.per_rank), set(ckpt["ranks"][0]["state"]) if ckpt["ranks"] else set(state.per_rank)),
    }
    lacks = [f"{n} ({kind})" for kind, (declared, saved) in parts.items() for n in sorted(declared - saved)]
    extra = [f"{n} ({kind})" for kind, (declared, saved) in parts.items() for n in sorted(saved - declared)]
    if lacks or extra:
        what = "; ".join(
            ([f"it lacks {', '.join(lacks)}, which this script declares"] if lacks else [])
            + ([f"it holds {', '.join(extra)}, which this script does not declare"] if extra else [])
        )
        raise SystemExit(
            f"error: {run.resume_path} was written by a script with other checkpoint state ({ckpt['algo']}): "
            f"{what}; resume it with the script that wrote it, or start a new run from its weights with "
            f"--init-from {run.resume_path}"
        )


def init_from(run: Run, state: TrainingState) -> None:
    """A new run from --init-from's checkpoint: the model tensors whose name and shape match, and the normalizers
    (modules) of the same name; no counters, optimizer, RNG or env state. Says what it took and what it left."""
    ckpt, path = run.init_checkpoint, run.init_path
    own = state.model.state_dict()
    # A tensor shared under several names (ppo's --shared-encoder) loads from its first name only: a checkpoint of
    # separate encoders gives the shared one the actor's, not the critic's written over it.
    first = {}
    for k, v in own.items():
        first.setdefault(v.data_ptr() if v.numel() else k, k)
    aliases = {k for k, v in own.items() if first[v.data_ptr() if v.numel() else k] != k}
    own = {k: v for k, v in own.items() if k not in aliases}
    taken = {k: v for k, v in ckpt["model"].items() if k in own and own[k].shape == v.shape}
    if not taken:
        raise SystemExit(
            f"error: --init-from {path}: none of its {len(ckpt['model'])} model tensors fits this run's "
            f"networks (names or shapes differ); it was saved with {_saved_network_flags(ckpt, run.args)}"
        )
    state.model.load_state_dict(taken, strict=False)
    left = [f"{k}{list(own[k].shape)}" for k in own if k not in taken]
    normalizers = [
        name for name, obj in state.replicated.items() if isinstance(obj, torch.nn.Module) and name in ckpt["state"]
    ]
    for name in normalizers:
        _load_into(state.replicated[name], _to_device(ckpt["state"][name], run.device))
    run.say(
        f"initialised from {path} ({ckpt['algo']} on {ckpt['env_id']}, global step {ckpt['global_step']:,}): "
        f"{len(taken)} of {len(own)} model tensors"
        + (f", normalizers {', '.join(normalizers)}" if normalizers else "")
        + (f"; kept this run's initialisation for {', '.join(left)}" if left else "")
        + (
            f"; not used: {', '.join(k for k in ckpt['model'] if k not in taken)}"
            if len(taken) < len(ckpt["model"])
            else ""
        )
    )


def _saved_network_flags(ckpt: dict, args) -> str:
    saved, now = ckpt["args"], asdict(args)
    differ = [k for k in saved if k not in RUN_FLAGS and k in now and saved[k] != now[k]]
    value = lambda v: " ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)  # noqa: E731
    return " ".join(f"--{k.replace('_', '-')} {value(saved[k])}" for k in differ) or "(the same flags)"


def _restore_buffer(run: Run, buffer, mine: dict | None, continues: bool) -> None:
    if mine is not None and "buffer" in mine:
        try:
            buffer.load_state_dict(mine["buffer"])
        except ValueError as e:  # another --buffer-size
            raise SystemExit(f"error: {e}") from None
        if not continues:
            buffer.end_episodes()  # the envs start fresh episodes: no n-step window across the join
    if len(buffer) == 0 and not run.args.eval_only:
        ckpt = run.checkpoint
        if mine is None and "buffer" in ckpt["ranks"][0]:  # each rank's buffer holds its own envs' steps
            run.say(
                f"notice: the checkpoint's replay buffers belong to {ckpt['world_size']} process(es) x "
                f"{ckpt['args']['num_envs']} envs, not this run's; refilling them before updates resume"
            )
        else:
            run.say(
                "notice: the checkpoint holds no replay buffer (save it with --save-buffer); refilling it before "
                "updates resume"
            )
