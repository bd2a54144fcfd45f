"""The run lifecycle every script shares, as plain functions over one small dataclass.

    run = start_run(args, "ppo")               # rank, world size, device; nothing is written yet
    envs, eval_envs = make_envs(run)         # per-rank seeds, a clear error for a bad id or kwargs
    open_run(run)                            # run dir, config.json, resume, TensorBoard, wandb
    ... networks, optimizers ...
    rank_state = restore(run, envs, model, optimizers)
    while ...:
        ... rollout -> targets -> update ...
        stats = reduce_iteration(run, episodes=..., means=..., checks=...)  # one all-reduce, one read
        log(run, stats)
        if eval_due(run, final): evaluate(run, eval_envs, act)
        if names := checkpoints_due(run, final): save(run, names, ...)
        if run.stop_reason: break
    finish(run, model)

Collectives: `restore` (when ranks disagree), `reduce_iteration`, `evaluate`, `save` and `finish`
talk to the other ranks, so every rank calls them at the same points of the loop; the
decisions that guard them (`eval_due`, `checkpoints_due`, `run.stop_reason`) are taken from
reduced values only, so they are the same on every rank.

Scripts keep what a researcher changes: Args, networks, losses, targets, the update, the
rollout, the compile switch, the tags they log and their own checkpoint fields.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import random
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from common import distributed, video
from common.checkpoint import (
    BEST, FORMAT_VERSION, LAST, CheckpointError, capture_rng_state, checkpoint_dir, elastic_restart_count,
    load_checkpoint, load_optimizer_state, resolve_resume, restore_rng_state, save_checkpoint, stable_run_name,
)
from common.envs import make_env
from common.export import export_policy

__all__ = [
    "BEST", "LAST", "CheckpointError", "Run", "RunArgs", "checkpoints_due", "closing", "eval_due", "eval_only", "evaluate",
    "episode_sums", "finish", "host_read_due", "log", "make_envs", "open_run", "record_env_log", "reduce_iteration",
    "restore", "restore_buffer", "save", "start_run", "timed", "begin_training", "compiled", "captured",
]


@dataclass
class RunArgs:
    """The flags of the run around the algorithm; each script's Args extends them (and may change defaults)."""

    env_id: str = "CartPole-v1"
    """environment id: a built-in env (CartPole-v1, Pendulum-v1, ...) or an adapter prefix (gym:..., mjlab:...)"""
    num_envs: int = 4096
    """parallel environments per process (per GPU)"""
    env_kwargs: str | None = None
    """JSON object of extra make_env arguments, e.g. '{"max_episode_steps": 100}' or '{"vectorization": "async"}'"""
    total_timesteps: int = 5_000_000
    """env steps to train for, summed over all processes"""
    seed: int = 1
    """seed of the experiment; every env stream and generator of every rank derives from a hash of (seed, rank, stream)"""
    device: str = "auto"
    """'auto' (this rank's GPU if any, else CPU), 'cpu', 'cuda'"""
    torch_deterministic: bool | Literal["auto"] = "auto"
    """deterministic kernels (cudnn.deterministic, torch.use_deterministic_algorithms): True, False, or auto (on
    CPU, where exact resume rests on them and they cost nothing; off on CUDA, where they are sort-based and slow)"""
    output_dir: str = "runs"
    """where run directories are created"""
    run_name: str | None = None
    """name of the run directory; default {env_id}__{algo}__{seed}__{timestamp}"""
    resume: str | None = None
    """checkpoint to resume from: a path, a run directory, or 'auto' (this run's last.pt if it exists)"""
    eval_only: bool = False
    """load --resume, evaluate the deterministic policy, print the returns, and exit"""
    save_interval: int = 50
    """iterations between writes of checkpoints/last.pt (also written at the end and on SIGTERM/SIGUSR1)"""
    save_interval_seconds: float | None = None
    """also write last.pt when this many seconds have passed since the last write (checked when the statistics are logged)"""
    eval_interval: int = 10
    """iterations between evaluations (0 disables); best.pt is written when the eval return improves"""
    eval_episodes: int = 1
    """episodes per eval env in an evaluation"""
    num_eval_envs: int = 128
    """eval environments per process (separate from the training envs)"""
    eval_env_kwargs: str | None = None
    """JSON object merged over --env-kwargs for the eval envs only (evaluate on a differently configured env)"""
    capture_video: bool = False
    """record the episodes of the first --video-envs eval envs at every evaluation: TensorBoard (videos/eval),
    wandb, and videos/step_<global_step>.mp4 in the run directory (needs the [video] extra)"""
    video_envs: int = 1
    """eval envs whose episodes --capture-video records (their videos follow one another)"""
    checkpoint_interval: int = 0
    """also keep checkpoints/step_<global_step>.pt every this many iterations (0: only last.pt and best.pt)"""
    keep_checkpoints: int = 0
    """keep only the newest this many step_<global_step>.pt files (0: all)"""
    export: str | None = None
    """with --eval-only: write the checkpoint's deterministic policy to this directory (policy.pt TorchScript,
    policy.onnx, policy.json), observation normalization included"""
    export_best: bool = False
    """export the policy to {run_dir}/export/ every time best.pt is written"""
    target_return: float | None = None
    """stop once the eval return reaches this value"""
    max_wall_seconds: float | None = None
    """stop (and save) after this many seconds of training (checked when the statistics are logged)"""
    track: bool = False
    """mirror the TensorBoard logs to Weights & Biases"""
    wandb_project_name: str = "parallel-rl"
    """wandb project"""
    wandb_entity: str | None = None
    """wandb team or user"""
    progress: bool = True
    """show a progress bar on the main process (only on a terminal, never under CI)"""
    compile: bool | Literal["auto"] = "auto"
    """torch.compile the hot functions (acting with the env step, targets, update): True, False, or auto (on CUDA)"""
    cudagraphs: bool | Literal["auto"] = "auto"
    """capture the hot functions in CUDA graphs (a built-in env's whole rollout, the whole update): True, False,
    or auto (on CUDA)"""
    log_interval: int | None = None
    """iterations between two reductions of the statistics (logs, NaN guard, stop flags: one host read each);
    default by device"""
    dist_timeout: float = 600.0
    """seconds a collective may wait for the other ranks before the run fails (a dead or hung rank)"""


# Flags that change how a run is driven, not what the networks are: left out of the
# "saved with ..." hint of a checkpoint that does not fit.
_RUN_FLAGS = {f for f in RunArgs.__dataclass_fields__} - {"env_id", "env_kwargs"}


@dataclass
class Run:
    """The handles and counters of one run, on every rank. Checkpoints carry the counters."""

    args: Any
    algo: str
    rank: int
    world_size: int
    device: torch.device
    is_main: bool  # rank 0: the one process that logs, prints and writes checkpoints
    run_dir: Path | None = None
    writer: Any = None  # TensorBoard SummaryWriter on rank 0
    wandb_run: Any = None
    checkpoint: dict | None = None  # the checkpoint this run resumes from
    resume_path: Path | None = None
    global_step: int = 0
    iteration: int = 0
    best_eval_return: float = -math.inf
    new_best: bool = False  # the evaluation of this iteration improved on best_eval_return
    last_train_return: float = math.nan
    sps: float = 0.0
    stop_reason: str | None = None  # set once every rank agrees to stop after this iteration
    save_time_due: bool = False  # --save-interval-seconds has passed on some rank
    seconds: dict = field(default_factory=dict)  # seconds per phase, summed (see `timed`)
    compile_seconds: dict = field(default_factory=dict)  # wall seconds until compiled and captured, per function
    graphs: list = field(default_factory=list)  # the CudaGraphModules of captured(), released in finish()
    interval_seconds: dict = field(default_factory=dict)  # phase -> [seconds, iterations] since the last log
    pending_timings: list = field(default_factory=list)  # (phase, start event, end event) not yet read (CUDA)
    env_log: dict = field(default_factory=dict)  # the env's info["log"]: name -> [sum, steps reported]
    eval_chunks: dict = field(default_factory=dict)  # (eval envs, model, episodes) -> (captured chunk, accumulators)
    start_time: float = field(default_factory=time.time)
    last_save_time: float = field(default_factory=time.time)
    steps_at_start: int = 0
    reduced_step: int = 0  # global step of the last reduce_iteration
    guard: Any = None
    progress: Any = None
    closed: bool = False  # close() ran: graphs, writers and the process group are gone
    observation_space: Any = None  # of one env's "policy" observations (for export)
    action_space: Any = None


# ----------------------------------------------------------------------------------------------
# Starting a run
# ----------------------------------------------------------------------------------------------
def start_run(args, algo: str, device_defaults: dict[str, tuple] | None = None) -> Run:
    """Join torchrun's process group (when launched by it) and pick this rank's device. Writes nothing.

    `device_defaults` {flag: (on CUDA, elsewhere)} fills the flags left at None once the device is
    known (sizes that suit a GPU starve a CPU of gradient steps); the resolved values are what the
    run's config.json and checkpoints record.
    """
    info = distributed.setup(args.device, timeout_seconds=args.dist_timeout)
    cuda = info.device.type == "cuda"
    for name, (on_cuda, elsewhere) in {"log_interval": (1, 1), **(device_defaults or {})}.items():
        if getattr(args, name) is None:
            setattr(args, name, on_cuda if cuda else elsewhere)
    for name in ("compile", "cudagraphs"):  # they pay for their start-up within a minute on a GPU; eager is faster on a CPU
        if getattr(args, name) == "auto":
            setattr(args, name, cuda)
    if args.torch_deterministic == "auto":
        args.torch_deterministic = not cuda
    if args.cudagraphs and info.device.type != "cuda":
        raise SystemExit("error: --cudagraphs needs a CUDA device; drop it or use --device cuda")
    for name in ("num_envs", "num_eval_envs", "save_interval", "eval_episodes", "video_envs", "log_interval"):
        if getattr(args, name) < 1:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.export is not None and not args.eval_only:
        raise SystemExit("error: --export DIR goes with --eval-only --resume PATH (or use --export-best while training)")
    if args.capture_video:
        video.check_dependencies(builtin_env=":" not in args.env_id)
    if args.export is not None or args.export_best:
        try:
            import onnx  # noqa: F401
        except ImportError:
            raise SystemExit('error: --export needs onnx: pip install -e ".[export]"') from None
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.use_deterministic_algorithms(args.torch_deterministic, warn_only=True)
    if args.compile:
        # Dynamo caches compiled code per code object: the closures of a script's main and the eval
        # step are the same code objects in every run of one process, and once their entries reach
        # the recompile limit dynamo runs them eagerly without a word. Each run compiles its own.
        torch._dynamo.reset()
    return Run(args=args, algo=algo, rank=info.rank, world_size=info.world_size, device=info.device, is_main=info.is_main)


def derive_seed(run: Run, stream: str) -> int:
    """A 62-bit seed for one random stream of this rank, hashed from (--seed, rank, stream).

    Env i of a batch seeded s gets seed s + i, so with seeds like `seed + rank * num_envs` the
    runs --seed 1 and --seed 2 would share all but one env stream, and ranks would overlap the
    same way. Hashed bases put every (seed, rank, stream) at an unrelated place in a 2**62
    range: two runs, two ranks, or the training and eval envs share a stream only if their bases
    fall within num_envs of each other (probability about num_envs / 2**62).
    """
    digest = hashlib.blake2b(f"{run.args.seed}/{run.rank}/{stream}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def env_seed(run: Run) -> int:
    """Seed of this rank's training envs (env i gets env_seed + i)."""
    return derive_seed(run, "envs")


def eval_seed(run: Run, iteration: int) -> int:
    """Seed of this rank's eval envs for the evaluation at `iteration`: each evaluation sees new
    episodes, and --eval-only of a checkpoint replays the evaluation of its iteration."""
    return derive_seed(run, f"eval/{iteration}")


def make_envs(run: Run, action_space: type | None = None, hint: str = ""):
    """This rank's training and eval envs, then the torch seed of this rank.

    `action_space` (gym.spaces.Box or Discrete) is the kind the script can act in: another kind
    stops here, before anything is written, with `hint` pointing at the scripts that can.
    """
    args = run.args
    try:
        kwargs, eval_kwargs = (_json_object(flag, getattr(args, flag)) for flag in ("env_kwargs", "eval_env_kwargs"))
        envs = make_env(args.env_id, args.num_envs, run.device, seed=env_seed(run), **kwargs)
        space = envs.single_action_space
        if action_space is not None and not isinstance(space, action_space):
            raise ValueError(f"{run.algo}.py needs {action_space.__name__} actions, but {args.env_id} has {space}; {hint}")
        render = "rgb_array" if args.capture_video else None
        eval_envs = make_env(args.env_id, args.num_eval_envs, run.device, seed=eval_seed(run, 0), render_mode=render,
                             **{**kwargs, **eval_kwargs})
    except (ValueError, TypeError) as e:  # unknown id (the message lists the known ones), bad --env-kwargs (JSON too)
        raise SystemExit(f"error: {e}") from None
    if args.capture_video:  # one frame now: a renderer that cannot work (no GL, no display) stops the run here
        try:
            eval_envs.reset()
            eval_envs.render([0])
        except Exception as e:
            raise SystemExit(f"error: --capture-video: {args.env_id} cannot render frames here ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}); MuJoCo envs on a machine without a display need "
                             f"MUJOCO_GL=egl or osmesa; or run without --capture-video") from None
    run.observation_space, run.action_space = envs.single_observation_space, envs.single_action_space
    # After the envs: some simulators (mjlab) seed the global generators. All three, as CleanRL
    # does, so that code added to a script that draws from numpy or random is seeded too.
    random.seed(derive_seed(run, "random"))
    np.random.seed(derive_seed(run, "numpy") % 2**32)
    torch.manual_seed(derive_seed(run, "torch"))
    return envs, eval_envs


def _json_object(flag: str, text: str | None) -> dict:
    value = json.loads(text) if text else {}
    if not isinstance(value, dict):
        raise ValueError(f"--{flag.replace('_', '-')} must be a JSON object, got {text!r}")
    return value


def open_run(run: Run) -> dict | None:
    """The run directory (one name across torchrun restarts), config.json, the checkpoint to resume
    from, and on rank 0 the TensorBoard writer (and wandb). Returns the checkpoint, or None."""
    args = run.args
    run_name, later_group = args.run_name, False
    if run.is_main:
        default = f"{args.env_id.replace(':', '-').replace('/', '-')}__{run.algo}__{args.seed}__{int(time.time())}"
        try:
            if args.eval_only:
                run_name = run_name or default
            else:
                run_name, later_group = stable_run_name(run_name, default, args.output_dir)
        except OSError:
            run_name = run_name or default  # reported just below, with the directory
        later_group = later_group or elastic_restart_count() > 0
    # rank 0 decides for all: after a node joined, the new node's agent counts no restart
    run_name, later_group = distributed.broadcast_object((run_name, later_group))
    run.run_dir = Path(args.output_dir) / run_name
    if run.is_main and not args.eval_only:
        try:
            checkpoint_dir(run.run_dir).mkdir(parents=True, exist_ok=True)
            (run.run_dir / "config.json").write_text(json.dumps(asdict(args), indent=2))
        except OSError as e:
            raise SystemExit(f"error: cannot write the run directory {run.run_dir} ({e.strerror}); choose --output-dir") from None
    distributed.barrier()
    if args.resume is None and later_group and not args.eval_only:
        args.resume = "auto"  # torchrun restarted or re-formed the worker group: continue from last.pt
    try:
        run.resume_path = resolve_resume(args.resume, run.run_dir) if args.resume else None
        if args.eval_only and run.resume_path is None:
            raise CheckpointError("--eval-only needs --resume PATH of a checkpoint")
        if run.resume_path is not None:
            run.checkpoint = load_checkpoint(run.resume_path, algo=run.algo, env_id=args.env_id)
    except CheckpointError as e:
        raise SystemExit(f"error: {e}") from None
    if run.checkpoint is not None:
        run.global_step, run.iteration = run.checkpoint["global_step"], run.checkpoint["iteration"]
        run.best_eval_return = run.checkpoint["best_eval_return"]
    if run.is_main and not args.eval_only:
        if args.track:
            try:
                import wandb
            except ImportError:
                raise SystemExit("error: --track needs wandb: pip install wandb (or the [wandb] extra)") from None
            run.wandb_run = wandb.init(
                project=args.wandb_project_name, entity=args.wandb_entity, name=run.run_dir.name, id=run.run_dir.name,
                resume="allow", config=asdict(args), sync_tensorboard=True, dir=str(run.run_dir),
            )
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: a resumed run drops the events logged after its checkpoint, so each curve
        # stays one line without the repeated steps of the work lost to a fault.
        run.writer = SummaryWriter(str(run.run_dir), purge_step=run.global_step + 1 if run.checkpoint else None)
        table = "\n".join(f"|{k}|{v}|" for k, v in asdict(args).items())
        run.writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
    return run.checkpoint


def begin_training(run: Run, description: str) -> None:
    """Print what runs, start the clocks, the signal handler and the progress bar: the loop starts next."""
    run.guard = distributed.PreemptionGuard()
    run.start_time = run.last_save_time = time.time()
    run.steps_at_start = run.reduced_step = run.global_step
    if not run.is_main:
        return
    print(f"{run.algo} on {run.args.env_id}: {run.world_size} process(es) x {run.args.num_envs} envs on {run.device}; "
          f"{description}; run dir {run.run_dir}", flush=True)
    if run.args.progress and not os.environ.get("CI") and sys.stderr.isatty():
        from tqdm import tqdm

        run.progress = tqdm(total=run.args.total_timesteps, initial=run.global_step, unit="step", unit_scale=True,
                            dynamic_ncols=True)


# ----------------------------------------------------------------------------------------------
# Checkpoints: save and restore (collectives)
# ----------------------------------------------------------------------------------------------
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


def save(run: Run, names: list[str], model: torch.nn.Module, optimizers: dict, state: dict | None = None,
         per_rank: dict | None = None, last_only: dict | None = None) -> None:
    """Write the checkpoints `names` (BEST and/or LAST) of this iteration. A collective: every rank calls it.

    `model`, `optimizers` and `state` (schedules, normalizers) are the same on every rank: rank 0's
    are written. `per_rank` is each rank's own state (env snapshot, next observation, episode
    statistics, partial returns): it is gathered to rank 0 as CPU tensors, with each rank's RNG
    states, so that no rank rebuilds another's tensors on its GPU. `last_only` per-rank entries
    (a replay buffer) go into last.pt only. Rank 0 writes each file atomically.
    """
    mine = {"rng": capture_rng_state(), **(per_rank or {})}
    if LAST in names and last_only:
        mine.update(last_only)
    ranks = distributed.gather_object(_to_cpu(mine))
    if run.is_main:
        checkpoint = {
            "format_version": FORMAT_VERSION, "algo": run.algo, "env_id": run.args.env_id, "args": asdict(run.args),
            "world_size": run.world_size, "global_step": run.global_step, "iteration": run.iteration,
            "best_eval_return": run.best_eval_return, "model": model.state_dict(),
            "optimizers": {k: opt.state_dict() for k, opt in optimizers.items()}, **(state or {}),
        }
        for name in names:
            keep = ranks if name == LAST else [{k: v for k, v in r.items() if k not in (last_only or {})} for r in ranks]
            save_checkpoint({**checkpoint, "ranks": keep}, checkpoint_dir(run.run_dir) / name)
        if run.args.keep_checkpoints > 0:  # the newest M numbered checkpoints stay
            numbered = sorted(checkpoint_dir(run.run_dir).glob("step_*.pt"), key=lambda p: int(p.stem[5:]))
            for old in numbered[: -run.args.keep_checkpoints]:
                old.unlink()
        if BEST in names and run.args.export_best:
            export_policy(run.run_dir / "export", model, run.observation_space, run.action_space, _export_info(run, BEST))
    if LAST in names:
        run.last_save_time = time.time()


def restore(run: Run, envs, model: torch.nn.Module, optimizers: dict) -> dict | None:
    """Load the resumed checkpoint's model and optimizers, and this rank's RNG and env state.

    Returns this rank's saved state (tensors on the device, "next_obs" a TensorDict) with
    "envs_continue": True when the envs carry on their episodes exactly, False when they start
    fresh (an env that cannot be snapshotted); None when nothing of this rank can be restored:
    no checkpoint, or one from another world size or --num-envs (its streams are re-derived from
    the seed, and the run says so).
    """
    ckpt = run.checkpoint
    if ckpt is None:
        return None
    try:
        model.load_state_dict(ckpt["model"])
        for name, opt in optimizers.items():
            load_optimizer_state(opt, ckpt["optimizers"][name])
    except (RuntimeError, ValueError, KeyError) as e:
        saved, now = ckpt["args"], asdict(run.args)
        differ = [k for k in saved if k not in _RUN_FLAGS and saved[k] != now.get(k)]
        flags = " ".join(f"--{k.replace('_', '-')} {_flag_value(saved[k])}" for k in differ) or "(the same flags)"
        raise SystemExit(f"error: {run.resume_path} holds networks of another shape than this run builds; it was saved "
                         f"with {flags}: resume with those ({str(e).splitlines()[0][:120]})") from None
    if run.is_main:
        print(f"resumed from {run.resume_path} at iteration {run.iteration}, global step {run.global_step}", flush=True)
    if ckpt["world_size"] != run.world_size or ckpt["args"]["num_envs"] != run.args.num_envs:
        if run.is_main:
            print(f"notice: checkpoint from {ckpt['world_size']} process(es) x {ckpt['args']['num_envs']} envs; env and "
                  f"RNG streams re-derived from the seed (networks, optimizers, normalizers restored)", flush=True)
        return None
    mine = ckpt["ranks"][run.rank]
    restore_rng_state(mine["rng"])
    out = {k: _to_device(v, run.device) for k, v in mine.items() if k != "rng"}
    out["envs_continue"] = bool(mine.get("env"))  # an env without snapshots (gym:, mjlab:) starts fresh episodes
    if out["envs_continue"]:
        envs.load_state_dict(mine["env"])
        out["next_obs"] = TensorDict(out["next_obs"], batch_size=[run.args.num_envs], device=run.device)
    return out


def restore_buffer(run: Run, buffer, rank_state: dict | None) -> None:
    """This rank's replay buffer (common.buffer.ReplayBuffer) from the checkpoint written with
    --save-buffer, if it holds one; without one the run says it refills the buffer."""
    if rank_state and "buffer" in rank_state:
        try:
            buffer.load_state_dict(rank_state["buffer"])
        except ValueError as e:  # another --buffer-size
            raise SystemExit(f"error: {e}") from None
        if not rank_state["envs_continue"]:
            buffer.end_episodes()  # the envs start fresh episodes: no n-step window across the join
    if run.checkpoint is not None and len(buffer) == 0 and run.is_main and not run.args.eval_only:
        ckpt = run.checkpoint
        if rank_state is None and "buffer" in ckpt["ranks"][0]:  # each rank's buffer holds its own envs' steps
            print(f"notice: the checkpoint's replay buffers belong to {ckpt['world_size']} process(es) x "
                  f"{ckpt['args']['num_envs']} envs, not this run's; refilling them before updates resume", flush=True)
        else:
            print("notice: the checkpoint holds no replay buffer (save it with --save-buffer); refilling it before updates resume", flush=True)


def _to_device(x, device):
    if torch.is_tensor(x):
        return x.to(device)
    if isinstance(x, dict):
        return {k: _to_device(v, device) for k, v in x.items()}
    return x


def _flag_value(v) -> str:
    return " ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


# ----------------------------------------------------------------------------------------------
# Inside the loop
# ----------------------------------------------------------------------------------------------
@contextmanager
def timed(run: Run, phase: str):
    """Seconds of a phase, summed in run.seconds and logged as charts/<phase>_seconds (the mean
    over the iterations since the last log that ran the phase: td3/sac's updates start late). On
    CUDA they are the device's seconds between two events recorded around the phase, read at the
    next log: timing makes no sync, so the host queues the next phase while the device runs this
    one, as it would untimed. Elsewhere, wall seconds. Once or twice per iteration, never inside
    a step's function."""
    if run.device.type != "cuda":
        t0 = time.time()
        yield
        _add_seconds(run, phase, time.time() - t0)
        return
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    yield
    end = torch.cuda.Event(enable_timing=True)
    end.record()
    run.pending_timings.append((phase, start, end))


def _add_seconds(run: Run, phase: str, seconds: float) -> None:
    run.seconds[phase] = run.seconds.get(phase, 0.0) + seconds
    acc = run.interval_seconds.setdefault(phase, [0.0, 0])
    acc[0] += seconds
    acc[1] += 1


def read_timings(run: Run) -> None:
    """The CUDA phase times recorded since the last read, added to the sums (waits for the last event)."""
    for phase, start, end in run.pending_timings:
        end.synchronize()
        _add_seconds(run, phase, start.elapsed_time(end) / 1e3)
    run.pending_timings.clear()


def compiled(run: Run, fn: Callable) -> Callable:
    """`fn` under `torch.compile` with --compile, else `fn`: for the per-step functions (acting and
    the env step, a minibatch's update) whose loops `captured` then takes whole."""
    return torch.compile(fn) if run.args.compile else fn


def captured(run: Run, name: str, fn: Callable, capture: bool = True) -> Callable:
    """`fn` captured in one CUDA graph with --cudagraphs (tensordict's CudaGraphModule: eager warm-up
    calls, one capture, then one replay per call); `capture=False` for a function that cannot be.

    What a captured `fn` may do: take and return tensors and TensorDicts (copied into and out of
    the graph's own buffers at every call) and change tensors that live as long as the graph
    (parameters, optimizer state, normalizers, an env's state, preallocated storage) in place;
    never read a tensor on the host, rebind an attribute to a new tensor, or keep Python state
    that must change between calls (a replay runs the kernels of the capture call, nothing else).
    The warm-up and capture calls do their work like any other, so no step is wasted.

    With --compile or --cudagraphs, the wall time of the calls until `fn` runs at full speed
    (compiling what it calls, warm-up, capture, the work of those calls included) goes to
    run.compile_seconds[name], summary.json and one printed line.
    """
    args = run.args
    do_capture = bool(args.cudagraphs) and capture
    if not (args.compile or do_capture):
        return fn
    calls = 2  # a compiled function traces on its first call and may specialise once more on its second
    if do_capture:
        from tensordict.nn import CudaGraphModule

        warmup = 3 if args.compile else 2  # eager calls before the capture
        fn, calls = CudaGraphModule(fn, warmup=warmup), warmup  # the last of the warm-up calls captures
        run.graphs.append(fn)
    left = [calls]

    def timed_until_ready(*a, **k):
        if not left[0]:
            return fn(*a, **k)
        t0 = time.perf_counter()
        out = fn(*a, **k)
        if run.device.type == "cuda":
            torch.cuda.synchronize(run.device)
        run.compile_seconds[name] = run.compile_seconds.get(name, 0.0) + time.perf_counter() - t0
        left[0] -= 1
        if not left[0]:
            how = " and ".join(w for w, on in (("compiled", args.compile), ("captured", do_capture)) if on)
            _print(run, f"{name}: {how} in {run.compile_seconds[name]:.1f} s (its first {calls} calls, work included)")
        return out

    timed_until_ready.ready = lambda: not left[0]  # compiled and captured: every later call is a replay
    return timed_until_ready


@torch.no_grad()
def episode_sums(running: torch.Tensor, rewards: torch.Tensor, dones: torch.Tensor,
                 sums: torch.Tensor | None = None) -> torch.Tensor:
    """Return sum, length sum and count [3] (float64) of the episodes that finished in [T, N] steps,
    added into `sums` when given (a per-step caller keeps one accumulator: nothing allocated per step).

    `running` [2, N] holds each env's return and length so far; it is updated in place and
    zeroed where an episode ends. On the device, without a host read.
    """
    if sums is None:
        sums = torch.zeros(3, device=running.device, dtype=torch.float64)
    for t in range(rewards.shape[0]):
        running[0] += rewards[t]
        running[1] += 1
        d = dones[t]
        sums += torch.stack([(running[0] * d).sum(), (running[1] * d).sum(), d.sum().double()])
        running *= ~d
    return sums


def record_env_log(run: Run, info: dict) -> None:
    """Add the env's own metrics of one step (info["log"]: name -> number or 0-d tensor) to the sums
    logged under env/ (each name: the mean over the steps that reported it, read by reduce_iteration).

    Numbers are summed on the host as floats; a tensor is summed on its device, into a float64
    running sum of our own (in place after the first report of the interval): no host read and no
    host-to-device copy per step.
    """
    log_values = info.get("log", {})
    if log_values and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"the env reports metrics ({', '.join(log_values)}) inside a captured rollout, where their "
                           f"Python sums would not run again; an env that logs must say capturable = False")
    for k, v in log_values.items():
        acc = run.env_log.get(k)
        if acc is None:  # a copy, never the env's tensor: the sum is updated in place
            run.env_log[k] = [v.detach().to(torch.float64, copy=True) if isinstance(v, torch.Tensor) else float(v), 1]
            continue
        s = acc[0]
        if isinstance(s, torch.Tensor) and (not isinstance(v, torch.Tensor) or v.shape == s.shape):
            s += v.detach() if isinstance(v, torch.Tensor) else v
        else:
            acc[0] = s + (v.detach() if isinstance(v, torch.Tensor) else v)
        acc[1] += 1


def reduce_iteration(run: Run, episodes: torch.Tensor | None = None, means: dict | None = None,
                     checks: dict | None = None, local: dict | None = None) -> dict[str, float]:
    """The statistics since the last call over all ranks: one all-reduce and one host read. A collective.

    - `episodes`: [3] return sum, length sum and count of finished episodes (from episode_sums),
      summed over ranks -> charts/episodic_return and charts/episodic_length when any finished;
    - `means`: {tag: scalar tensor}, averaged over ranks (losses/...);
    - `checks`: {name: bool tensor} that must hold on every rank: the NaN guard. A failed one
      raises FloatingPointError naming it, before anything is saved, so the last good
      checkpoint stays;
    - `local`: {tag: scalar tensor or float}, rank 0's own values (e.g. the learning rate), read
      in the same host read, with the env's own metrics (env/<name>, rank 0's alone: ranks may
      report different keys).

    This rank's stop and save flags (a signal, --max-wall-seconds, --save-interval-seconds) ride
    along: one rank's flag counts for all, so every rank stops or saves after the same iteration.
    Returns {tag: float} with charts/SPS.
    """
    args, dev = run.args, run.device
    means, checks, local = means or {}, checks or {}, dict(local or {})
    local.update({f"env/{k}": torch.as_tensor(s / c, device=dev).double().mean() for k, (s, c) in run.env_log.items()})
    run.env_log = {}
    now = time.time()
    flags = [run.guard is not None and run.guard.received is not None,
             args.max_wall_seconds is not None and now - run.start_time >= args.max_wall_seconds,
             args.save_interval_seconds is not None and now - run.last_save_time >= args.save_interval_seconds]
    as_row = lambda v: torch.as_tensor(v, device=dev).double().reshape(-1)  # noqa: E731
    reduced = [as_row(episodes if episodes is not None else [0.0, 0.0, 0.0]),
               *(as_row(v) for v in means.values()), *(as_row(v.all()) for v in checks.values()),
               torch.tensor(flags, dtype=torch.float64).to(dev)]
    packed = distributed.all_reduce(torch.cat(reduced))
    host = torch.cat([packed, *(as_row(v) for v in local.values())]).tolist()

    ep_return, ep_length, ep_count = host[0:3]
    values = iter(host[3:])
    out = {tag: next(values) / run.world_size for tag in means}
    failed = [name for name in checks if next(values) < run.world_size]
    stop_signal, out_of_time, save_time_due = (next(values) > 0 for _ in range(3))
    out.update({tag: next(values) for tag in local})
    if failed:
        raise FloatingPointError(
            f"non-finite {', '.join(failed)} at iteration {run.iteration} (global steps {run.reduced_step:,} to "
            f"{run.global_step:,}); last good checkpoint kept in {checkpoint_dir(run.run_dir)}"
        )
    run.reduced_step = run.global_step
    run.save_time_due = save_time_due
    if out_of_time:
        run.stop_reason = "max_wall_seconds"
    elif stop_signal:
        run.stop_reason = f"signal:{(run.guard and run.guard.received) or 'peer'}"
    run.sps = (run.global_step - run.steps_at_start) / max(time.time() - run.start_time, 1e-9)
    out["charts/SPS"] = run.sps
    if ep_count > 0:
        run.last_train_return = ep_return / ep_count
        out["charts/episodic_return"] = run.last_train_return
        out["charts/episodic_length"] = ep_length / ep_count
    return out


def log(run: Run, stats: dict[str, float]) -> None:
    """Write the scalars (tag -> value, x-axis: global step) on rank 0 and flush, so the curves on
    disk keep up with training, also for a run that gets killed."""
    read_timings(run)
    interval_seconds, run.interval_seconds = run.interval_seconds, {}
    if not run.is_main:
        return
    for tag, value in stats.items():
        run.writer.add_scalar(tag, value, run.global_step)
    for phase, (seconds, iterations) in interval_seconds.items():
        run.writer.add_scalar(f"charts/{phase}_seconds", seconds / iterations, run.global_step)
    run.writer.flush()
    if run.progress is not None:
        run.progress.update(run.global_step - run.progress.n)
        run.progress.set_postfix(sps=f"{run.sps:,.0f}", ret=f"{run.last_train_return:.1f}", refresh=False)


def _print(run: Run, msg: str) -> None:
    if run.is_main:
        run.progress.write(msg) if run.progress is not None else print(msg, flush=True)


# ----------------------------------------------------------------------------------------------
# Evaluation and the decisions around it
# ----------------------------------------------------------------------------------------------
def eval_due(run: Run, final_iteration: bool) -> bool:
    return run.args.eval_interval > 0 and (run.iteration % run.args.eval_interval == 0 or final_iteration)


EVAL_CHUNK = 64  # eval steps between two host reads ("has every env finished?"); one graph with --cudagraphs


def _eval_step(eval_envs, model, episodes: int, acc: dict, obs: TensorDict) -> TensorDict:
    """One deterministic step of every eval env; the first `episodes` episodes of each env are
    added into `acc` in place (running return/length, episodes done, and the sums of returns,
    lengths, episodes, successes and success reports)."""
    obs, reward, terminated, truncated, info = eval_envs.step(model.deterministic(obs["policy"]))
    if hasattr(model, "reset_state"):  # a recurrent policy: zero the hidden state of the envs whose episode ended
        model.reset_state(terminated | truncated)
    running, done_count = acc["running"], acc["done_count"]
    active = done_count < episodes
    running += torch.stack([reward.double(), torch.ones_like(running[1])]) * active
    done = (terminated | truncated) & active
    ended = done.double().sum()
    success = info.get("success")  # per env, valid where an episode ended
    succeeded = (success.bool() & done).double().sum() if success is not None else torch.zeros_like(ended)
    reported = ended if success is not None else torch.zeros_like(ended)
    acc["sums"] += torch.stack([(running[0] * done).sum(), (running[1] * done).sum(), ended, succeeded, reported])
    done_count += done.long()
    running *= ~done
    return obs


def _eval_chunk(run: Run | None, eval_envs, model, episodes: int):
    """EVAL_CHUNK eval steps as one function over accumulators that live as long as it does:
    compiled and captured (a built-in env) once per run, model and eval envs. Returns (chunk, acc)."""
    n, dev = eval_envs.num_envs, eval_envs.device
    key = (id(eval_envs), id(model), episodes)
    cache = run.eval_chunks if run is not None else {}
    if key not in cache:
        acc = {"running": torch.zeros(2, n, device=dev, dtype=torch.float64),  # return, length
               "done_count": torch.zeros(n, device=dev, dtype=torch.long),
               "sums": torch.zeros(5, device=dev, dtype=torch.float64)}
        step = functools.partial(_eval_step, eval_envs, model, episodes, acc)
        capturable = getattr(eval_envs, "capturable", False)
        if run is not None and capturable:
            step = compiled(run, step)

        def chunk(obs: TensorDict) -> TensorDict:
            for _ in range(EVAL_CHUNK):
                obs = step(obs)
            return obs

        cache[key] = (captured(run, "evaluation", chunk, capture=capturable) if run is not None else chunk, acc)
    return cache[key]


@torch.no_grad()
def run_episodes(eval_envs, model: torch.nn.Module, episodes: int, seed: int, record: int = 0,
                 run: Run | None = None) -> dict:
    """The first `episodes` episodes of every eval env with `model.deterministic(obs)`, reduced over
    all ranks (a collective): mean return and length, the success rate where the env reports
    per-env success at episode ends (info["success"]), and the frames of the first `record` envs.

    A recurrent policy keeps one hidden state per eval env inside `model` and has
    `reset_state(done)`, a bool [num_eval_envs]: it is called with all True after the eval envs'
    reset and with terminated | truncated after every step, and zeroes those envs' state in place.

    Without recording, the steps run EVAL_CHUNK at a time, with one host read after each chunk
    (compiled and captured as the run's flags ask, given `run` and a built-in env). Recording
    reads the recorded envs' state to the host at every step: evaluation only.
    """
    chunk, acc = _eval_chunk(run, eval_envs, model, episodes)
    for t in acc.values():
        t.zero_()
    obs, _ = eval_envs.reset(seed=seed)
    if hasattr(model, "reset_state"):
        model.reset_state(torch.ones(eval_envs.num_envs, dtype=torch.bool, device=eval_envs.device))
    recorded = list(range(min(record, eval_envs.num_envs)))
    frames = {i: [f] for i, f in zip(recorded, eval_envs.render(recorded))} if recorded else {}
    max_steps = getattr(eval_envs, "max_episode_steps", None) or 10_000
    done_count = acc["done_count"]
    for start in range(0, max_steps * episodes + 1, EVAL_CHUNK):  # the steps past an env's episodes add nothing
        if not recorded:
            obs = chunk(obs)
        else:
            for _ in range(EVAL_CHUNK):
                obs = _eval_step(eval_envs, model, episodes, acc, obs)
                # the recorded envs that are still within their episodes: one host read per step
                alive = [i for i, c in zip(recorded, done_count[recorded].tolist()) if c < episodes]
                for i, f in zip(alive, eval_envs.render(alive) if alive else []):
                    frames[i].append(f)
                recorded = alive
        if bool((done_count >= episodes).all()):  # one sync per chunk, not per step
            break
    sums = distributed.all_reduce(acc["sums"].clone())
    ret, length, count, succ, rep = sums.tolist()
    return {"return": ret / count, "length": length / count, "success_rate": succ / rep if rep > 0 else None,
            "frames": [frame for i in sorted(frames) for frame in frames[i]]}


def _record_video(run: Run, eval_envs, frames: list, writer=None) -> Path:
    """The recorded frames as videos/step_<global_step>.mp4 (and in TensorBoard and wandb)."""
    fps = getattr(eval_envs, "render_fps", 30)
    path = video.write_mp4(run.run_dir / "videos" / f"step_{run.global_step}.mp4", frames, fps)
    if writer is not None:
        video.add_video(writer, "videos/eval", frames, run.global_step, fps)
    if run.wandb_run is not None:
        import wandb

        run.wandb_run.log({"videos/eval": wandb.Video(str(path), format="mp4")}, step=run.global_step)
    return path


def evaluate(run: Run, eval_envs, model: torch.nn.Module) -> float:
    """Evaluate `model.deterministic` on the eval envs (a collective), log eval/ (and a video with
    --capture-video), keep the best return, and stop at --target-return. Returns the mean return."""
    args = run.args
    record = args.video_envs if args.capture_video and run.is_main else 0  # rank 0's envs are the ones shown
    t0 = time.time()
    result = run_episodes(eval_envs, model, args.eval_episodes, seed=eval_seed(run, run.iteration), record=record, run=run)
    run.seconds["evaluation"] = run.seconds.get("evaluation", 0.0) + time.time() - t0  # ends with a host read
    ret = result["return"]
    if run.is_main:
        run.writer.add_scalar("eval/episodic_return", ret, run.global_step)
        run.writer.add_scalar("eval/episodic_length", result["length"], run.global_step)
        if result["success_rate"] is not None:
            run.writer.add_scalar("eval/success_rate", result["success_rate"], run.global_step)
        if result["frames"]:
            _record_video(run, eval_envs, result["frames"], run.writer)
        run.writer.flush()
    _print(run, f"iteration {run.iteration} step {run.global_step:,}: eval return {ret:.2f}, "
                f"train return {run.last_train_return:.2f}, SPS {run.sps:,.0f}")
    run.new_best = ret > run.best_eval_return
    run.best_eval_return = max(ret, run.best_eval_return)
    if args.target_return is not None and ret >= args.target_return:
        run.stop_reason = "target_return"
    return ret


def checkpoints_due(run: Run, final_iteration: bool) -> list[str]:
    """best.pt after an evaluation that improved; last.pt every --save-interval iterations, at the
    end, when --save-interval-seconds has passed, and before a stop."""
    names = [BEST] if run.new_best else []
    run.new_best = False
    if run.stop_reason or final_iteration or run.save_time_due or run.iteration % run.args.save_interval == 0:
        names.append(LAST)
    if run.args.checkpoint_interval > 0 and run.iteration % run.args.checkpoint_interval == 0:
        names.append(f"step_{run.global_step}.pt")
    return names


def host_read_due(run: Run, final_iteration: bool) -> bool:
    """Whether this iteration evaluates or may save, so that its statistics must be reduced first
    (for scripts that reduce every --log-interval iterations only)."""
    args = run.args
    return (final_iteration or eval_due(run, final_iteration) or run.iteration % args.save_interval == 0
            or (args.checkpoint_interval > 0 and run.iteration % args.checkpoint_interval == 0))


def _export_info(run: Run, source: str) -> dict:
    return {"algo": run.algo, "env_id": run.args.env_id, "global_step": run.global_step, "iteration": run.iteration,
            "checkpoint": str(source)}


def eval_only(run: Run, eval_envs, model: torch.nn.Module) -> dict:
    """--eval-only: evaluate the resumed checkpoint's policy, print the result as JSON, and end;
    with --capture-video also record it (videos/ of the checkpoint's run directory), with --export
    also write the exported policy.

    The eval envs get the seeds of the evaluation at the checkpoint's iteration: with the same
    eval flags, best.pt gives back the return it was saved for (exactly, on CPU)."""
    args = run.args
    record = args.video_envs if args.capture_video and run.is_main else 0
    result = run_episodes(eval_envs, model, args.eval_episodes, seed=eval_seed(run, run.iteration), record=record, run=run)
    out = {"eval_episodic_return": result["return"], "eval_episodic_length": result["length"],
           "checkpoint": str(run.resume_path)}
    if result["success_rate"] is not None:
        out["eval_success_rate"] = result["success_rate"]
    if run.is_main and result["frames"]:
        run.run_dir = run.resume_path.resolve().parent.parent  # the checkpoint's run directory
        out["video"] = str(_record_video(run, eval_envs, result["frames"]))
    if run.is_main and args.export is not None:
        out["export"] = str(export_policy(args.export, model, run.observation_space, run.action_space,
                                          _export_info(run, run.resume_path)))
    if run.is_main:
        print(json.dumps(out))
    close(run)
    return {"eval_return": result["return"], "eval_length": result["length"], **out}


# ----------------------------------------------------------------------------------------------
# Finishing
# ----------------------------------------------------------------------------------------------
def peak_memory_mb(device: torch.device) -> float:
    """Peak GPU memory allocated by torch on CUDA; peak resident set size of the process on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def release_graphs(run: Run) -> None:
    """Free the CUDA graphs of the run before its process group goes: destroying an NCCL
    communicator that live graphs still hold collectives of can hang the process at exit."""
    if run.graphs and run.device.type == "cuda":
        torch.cuda.synchronize(run.device)
        for module in run.graphs:
            graph = getattr(module, "graph", None)  # absent where the capture call never came
            if graph is not None:
                graph.reset()
    run.graphs.clear()


def close(run: Run) -> None:
    """Let go of everything the run holds, in the order that cannot hang: the signal handlers, the
    progress bar, the writers, the CUDA graphs, and last the process group. Called by `finish` and
    `eval_only`, and by `closing` on any other exit; a second call does nothing.

    On an error each step is tried and its own failure reported, so that the process group still
    goes and the error that ended the run is the one the process exits with."""
    if run.closed:
        return
    run.closed = True
    steps = [("signal handlers", run.guard.restore if run.guard is not None else None),
             ("progress bar", run.progress.close if run.progress is not None else None),
             ("TensorBoard writer", run.writer.close if run.writer is not None else None),
             ("wandb", run.wandb_run.finish if run.wandb_run is not None else None),
             ("CUDA graphs", lambda: release_graphs(run)),
             ("process group", distributed.cleanup)]
    for what, step in steps:
        if step is None:
            continue
        try:
            step()
        except Exception as e:  # noqa: BLE001 -- teardown goes on; the run's own error is what counts
            print(f"warning: closing the run's {what} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


@contextmanager
def closing(run: Run):
    """`with closing(run):` around a script's training: whatever ends it (a return, an error such as
    the NaN guard's or an out-of-memory, Ctrl-C), the run is closed (`close`) before the exception
    goes on, so a failed rank releases its graphs and leaves the process group at once instead of
    hanging in its teardown, and the process exits with the error's status."""
    try:
        yield run
    finally:
        close(run)


def finish(run: Run, model: torch.nn.Module) -> dict:
    """Check that the ranks' parameters agree, write summary.json (the same fields for every
    script), close the writers and leave the process group. A collective. Returns the summary."""
    in_sync = distributed.check_in_sync(model)  # averaged gradients keep every rank's weights bit-identical
    if not in_sync and run.is_main:
        print("warning: the ranks' parameters differ; a non-deterministic collective or a rank-local update diverged them", flush=True)
    read_timings(run)
    ckpts = checkpoint_dir(run.run_dir)
    summary = {
        "algo": run.algo, "env_id": run.args.env_id, "run_dir": str(run.run_dir), "global_step": run.global_step,
        "iteration": run.iteration, "wall_seconds": time.time() - run.start_time, "sps": run.sps,
        "last_train_return": None if math.isnan(run.last_train_return) else run.last_train_return,  # strict JSON
        "best_eval_return": run.best_eval_return if run.best_eval_return > -math.inf else None,
        "stop_reason": run.stop_reason or "total_timesteps", "world_size": run.world_size, "params_in_sync": in_sync,
        "rollout_seconds": run.seconds.get("rollout"), "update_seconds": run.seconds.get("update"),
        "evaluation_seconds": run.seconds.get("evaluation", 0.0),
        # until each hot function ran compiled and captured (its first calls, their work included)
        "compile_seconds": sum(run.compile_seconds.values()), "compile_seconds_by_function": run.compile_seconds,
        "compile": bool(run.args.compile), "cudagraphs": bool(run.args.cudagraphs),
        "peak_memory_mb": peak_memory_mb(run.device),
        "checkpoints": {"last": str(ckpts / LAST), "best": str(ckpts / BEST)},
    }
    if run.is_main:
        (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        print(json.dumps(summary), flush=True)
    close(run)
    return summary
