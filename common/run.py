"""The run lifecycle every script shares, as plain functions over one small dataclass (`Run`, common.record).

    run = start_run(args, ALGO)              # torchrun's group and this rank's device; writes nothing
    with closing(run):                       # whatever ends the run: graphs, writers, group released
        open_run(run)                        # the run dir's lock (one writer), then the checkpoint to resume
        envs, eval_envs = make_envs(run)     # per-rank seeds, a clear error for a bad id or kwargs
        ... networks, optimizers, TrainingState; restore (common.checkpoint) ...
        ... the algorithm's functions, then one block that compiles and captures them (common.capture) ...
        begin_training(run, "what runs")     # writes config.json, TensorBoard; the signal handler
        while ...:
            ... rollout -> targets -> update ...
            due = what_is_due(run, final_iteration)                # decided once, from counters and flags
            if due.log: log(run, reduce_iteration(run, ...))       # common.stats: one all-reduce, one read
            if due.eval: evaluate(run, eval_envs, policy)          # common.evaluation
            if names := checkpoints_to_write(run, due): save(run, names, state, next_obs)
            if run.stop_reason: break
        return finish(run, model)

Collectives: `open_run`, `restore`, `reduce_iteration`, `evaluate`, `save` and `finish` talk to
the other ranks, so every rank calls them at the same points of the loop; what guards them (`due`,
`checkpoints_to_write`, `run.stop_reason`) depends on reduced values only, so it is the same on
every rank.
"""

from __future__ import annotations

import errno
import itertools
import json
import logging
import math
import os
import random
import shutil
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from common import distributed, settings, video
from common.args import (
    check_numbers,
    derive_seed,
    env_seed,
    eval_seed,
    from_command_line,
    given_flags,
    script_name,
    take_flags_from,
    usage_error,
)
from common.capture import check_torch, peak_memory_mb, read_timings, release_graphs
from common.checkpoint import (
    BEST,
    LAST,
    CheckpointError,
    OutputError,
    check_complete,
    check_written_by,
    checkpoint_dir,
    checkpoints_without_last,
    elastic_restart_count,
    load_checkpoint,
    remove_dead_temporaries,
    resolve_resume,
    run_totals,
    stable_run_name,
    write_atomically,
)
from common.envs import draws_with_pygame, eval_env_kwargs, make_env
from common.evaluation import eval_steps
from common.lock import LOCK, lock_lost, release, release_lock, take_lock
from common.record import Run
from common.stats import PROGRESS_SECONDS, Progress, closing_words, continue_command, plural

CONFIG = "config.json"  # the run's named settings and resolved values
UNTRANSLATED = "settings_untranslated"  # config.json's list of a task config's fields that have no flag here


# ----------------------------------------------------------------------------------------------
# Starting a run
# ----------------------------------------------------------------------------------------------
def start_run(args, algo: str, device_defaults: dict[str, tuple] | None = None) -> Run:
    """Join torchrun's process group (when launched by it) and pick this rank's device. Writes nothing.

    `algo` is the script's ALGO; the run is named after the script's file (`script_name`), so a copy is a script of
    its own that still reads its original's checkpoints. `device_defaults` {flag: (on CUDA, elsewhere)} fills the
    flags left at None (sizes that suit a GPU starve a CPU of gradient steps)."""
    check_torch()  # a torch outside pyproject.toml's range: one line, and the run goes on
    given = given_flags(args)
    info = distributed.setup(args.device, timeout_seconds=args.dist_timeout)
    cuda = info.device.type == "cuda"
    for name, (on_cuda, elsewhere) in {"log_interval": (1, 1), **(device_defaults or {})}.items():
        if getattr(args, name) is None:
            setattr(args, name, on_cuda if cuda else elsewhere)
    for name in ("compile", "cudagraphs"):  # they pay for their start-up within a minute on a GPU, not on a CPU
        if getattr(args, name) == "auto":
            setattr(args, name, cuda)
    if args.torch_deterministic == "auto":
        args.torch_deterministic = not cuda
    if args.cudagraphs and info.device.type != "cuda":
        raise SystemExit("error: --cudagraphs needs a CUDA device; drop it or use --device cuda")
    check_numbers(args)  # one line naming the flag, before anything is written
    if args.export is not None and not args.eval_only:
        raise SystemExit(
            "error: --export DIR goes with --eval-only --resume PATH (or use --export-best while training)"
        )
    _check_extras(args)
    # the flags are good: what the machine and the named settings mean for the run, before anything else is said
    notes = [settings.choose_threads() if from_command_line(args) else None]  # not for a run inside another program
    if untranslated := getattr(args, "_settings_origin", ("", []))[1]:
        notes.append(f"settings {args.settings}: the task's config has no flag here for {'; '.join(untranslated)}")
    for line in filter(None, notes) if info.is_main else ():
        print(line, flush=True)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.use_deterministic_algorithms(args.torch_deterministic, warn_only=True)
    if args.compile:
        # Dynamo caches compiled code per code object: the closures of a script's main and the eval
        # step are the same code objects in every run of one process, and once their entries reach
        # the recompile limit dynamo runs them eagerly without a word. Each run compiles its own.
        torch._dynamo.reset()
        for name in ("torch._dynamo.variables.ctx_manager", "torch._dynamo.variables.torch"):
            logging.getLogger(name).addFilter(_not_a_profiler_notice)
    return Run(
        args=args,
        algo=script_name(type(args), algo),
        algorithm=algo,
        rank=info.rank,
        world_size=info.world_size,
        device=info.device,
        is_main=info.is_main,
        given=given,
    )


def _check_extras(args) -> None:
    """Stop with one line when a flag needs a package that is not installed (checked again once a resumed run has
    taken its flags from its checkpoint)."""
    if args.capture_video:
        video.check_dependencies(pygame=draws_with_pygame(args.env_id))
    if args.track:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise SystemExit("error: --track needs wandb: pip install wandb (or the [wandb] extra)") from None
    if args.export is not None or args.export_best:
        try:
            import onnx  # noqa: F401
        except ImportError:
            raise SystemExit('error: --export needs onnx: pip install -e ".[export]"') from None


def _not_a_profiler_notice(record: logging.LogRecord) -> bool:
    """Dynamo's warning that it ignores a profiler range ("Profiler record function ... will be ignored": the
    one torch.optim's step opens) says nothing a run can act on: it is dropped, dynamo's other warnings stay."""
    return not str(record.msg).startswith("Profiler ")


def make_envs(run: Run, action_space: type | None = None, hint: str = ""):
    """This rank's training and eval envs, then the torch seed of this rank. An action space not of the kind
    `action_space` (gym.spaces.Box or Discrete) stops here, with `hint` pointing at the scripts that can act in it."""
    args = run.args
    try:
        kwargs, eval_kwargs = (_json_object(flag, getattr(args, flag)) for flag in ("env_kwargs", "eval_env_kwargs"))
        envs = make_env(args.env_id, args.num_envs, run.device, seed=env_seed(run), **kwargs)
        space = envs.single_action_space
        if action_space is not None and not isinstance(space, action_space):
            raise ValueError(
                f"{run.algo}.py needs {action_space.__name__} actions, but {args.env_id} has {space}; {hint}"
            )
        render = "rgb_array" if args.capture_video else None
        eval_kwargs, implied = eval_env_kwargs(kwargs, eval_kwargs)  # a training preset implies its eval preset
        args._eval_notice = implied  # said after the start line (begin_training), which comes first
        eval_envs = make_env(
            args.env_id, args.num_eval_envs, run.device, seed=eval_seed(run, 0), render_mode=render, **eval_kwargs
        )
    except (ValueError, TypeError) as e:  # unknown id (the message lists the known ones), bad --env-kwargs (JSON too)
        raise SystemExit(f"error: {e}") from None
    if args.capture_video:  # one frame now: a renderer that cannot work (no GL, no display) stops the run here
        try:
            eval_envs.reset()
            eval_envs.render([0])
        except Exception as e:
            raise SystemExit(
                f"error: --capture-video: {args.env_id} cannot render frames here ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}); MuJoCo envs on a machine without a display need "
                f"MUJOCO_GL=egl or osmesa; or run without --capture-video"
            ) from None
    run.observation_space, run.action_space = envs.single_observation_space, envs.single_action_space
    # After the envs: some simulators (mjlab) seed the global generators. All three, as CleanRL
    # does, so that code added to a script that draws from numpy or random is seeded too.
    random.seed(derive_seed(run, "random"))
    np.random.seed(derive_seed(run, "numpy") % 2**32)
    torch.manual_seed(derive_seed(run, "torch"))
    return envs, eval_envs


def _json_object(flag: str, text: str | None) -> dict:
    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError as e:
        raise ValueError(
            f"--{flag.replace('_', '-')} is not valid JSON ({e.msg} at column {e.colno}): {text!r}; "
            f"""e.g. '{{"max_episode_steps": 100}}' (keys in double quotes)"""
        ) from None
    if not isinstance(value, dict):
        raise ValueError(f"--{flag.replace('_', '-')} must be a JSON object, got {text!r}")
    return value


def open_run(run: Run) -> dict | None:
    """Decide the run directory (one name across torchrun restarts, which resume), take its lock (rank 0 of a training
    run, for the job), and load the checkpoint to resume from, taking from it the flags the command line left alone.
    Writes nothing but the lock: a start that cannot go on leaves the directory as it found it (`close` releases the
    lock and removes a directory this start made; `begin_training` writes the run). A collective. Returns the
    checkpoint.

    An existing run directory is never written over (_existing_run_dir); one that a live process trains (its lock)
    stops any run of it but --eval-only."""
    args = run.args
    run_name, later_group, error = args.run_name, False, None
    if run.is_main:
        default = f"{args.env_id.replace(':', '-').replace('/', '-')}__{run.algo}__{args.seed}__{int(time.time())}"
        try:
            if args.eval_only:
                run_name = run_name or default
            else:
                run_name, later_group = stable_run_name(run_name, default, args.output_dir)
        except OSError:
            run_name = run_name or default  # reported when the directory is written
        later_group = later_group or elastic_restart_count() > 0
        run.run_dir = Path(args.output_dir) / run_name
        # The lock first, then the look: what this start decides (a new run, a resume and from which last.pt, an
        # overwrite, a refusal) it decides from the run directory as no other process can change it any more. A start
        # held up anywhere before this line sees what the run became meanwhile. --eval-only writes no run: it may
        # read one that trains, and takes no lock.
        error = None if args.eval_only else _lock_run_dir(run)
        error = error or _existing_run_dir(run.run_dir, args, later_group)
    # rank 0 decides for all: after a node joined, the new node's agent counts no restart
    decided = (run_name, later_group, error, run.output_failed)
    run_name, later_group, error, run.output_failed = distributed.broadcast_object(decided)
    if error:
        raise SystemExit(error)  # `closing` releases the lock and removes a directory this start made
    run.run_dir = Path(args.output_dir) / run_name
    if args.resume is None and later_group and not args.eval_only:
        args.resume = "auto"  # torchrun restarted or re-formed the worker group: continue from last.pt
    try:
        run.resume_path = resolve_resume(args.resume, run.run_dir) if args.resume else None
        if args.resume == "auto" and run.resume_path is None and not args.eval_only:
            _start_without_last(run)
        if args.eval_only and run.resume_path is None:
            raise CheckpointError("--eval-only needs --resume PATH of a checkpoint")
        if run.resume_path is not None:
            run.checkpoint = load_checkpoint(run.resume_path)
            check_written_by(run, run.checkpoint, run.resume_path)
            check_complete(run.checkpoint, run.resume_path)
            take_flags_from(run, run.checkpoint)
    except CheckpointError as e:
        raise SystemExit(f"error: {e}") from None
    if run.checkpoint is not None:
        _say_untranslated_again(run)
    if run.checkpoint is not None and not args.eval_only:
        _check_extras(args)  # the flags the run was started with (--capture-video, --track, --export-best) included
    if run.checkpoint is not None:
        run.global_step, run.iteration = run.checkpoint["global_step"], run.checkpoint["iteration"]
        run.best_eval_return = run.checkpoint["best_eval_return"]
        run.totals = run.checkpoint.get("totals", {})
        run.last_train_return = run.totals.get("last_train_return", math.nan)  # until an episode of this process ends
        run.last_eval_return = run.totals.get("last_eval_return", math.nan)  # until an evaluation of this process
        if run.resume_path.resolve() == (checkpoint_dir(run.run_dir) / LAST).resolve():
            run.saved[LAST] = run.global_step  # the last good checkpoint until this process writes one
        if args.total_timesteps < run.global_step and not args.eval_only:
            raise SystemExit(
                f"error: {run.resume_path} is at global step {run.global_step:,}, past --total-timesteps "
                f"{args.total_timesteps:,}: drop --total-timesteps (the run's is "
                f"{run.checkpoint['args']['total_timesteps']:,}) or give a larger one"
            )
    elif args.init_from is not None:
        try:
            path = resolve_resume(args.init_from, run.run_dir)
            run.init_checkpoint = load_checkpoint(path)
            check_complete(run.init_checkpoint, path)
        except CheckpointError as e:
            raise SystemExit(f"error: --init-from: {e}") from None
        run.init_path = path
    return run.checkpoint


def _say_untranslated_again(run: Run) -> None:
    """A resumed run of a task's config: the fields that have no flag here, as its config.json keeps them, said again
    (unless the start said them already) and kept for the config.json this process writes."""
    args = run.args
    origin, said = getattr(args, "_settings_origin", ("", []))
    try:
        # the resumed checkpoint's run: checkpoints/<name>.pt beside its config.json
        kept = json.loads((run.resume_path.resolve().parent.parent / CONFIG).read_text()).get(UNTRANSLATED) or []
    except (OSError, ValueError, AttributeError):
        return
    if kept and kept != said:
        args._settings_origin = (origin, kept)
        run.say(f"settings {args.settings}: the task's config has no flag here for {'; '.join(kept)} (the run's)")


def _start_without_last(run: Run) -> None:
    """--resume auto where the run directory has no last.pt. Checkpoints there: the run cannot continue by itself and
    is not written over (one line naming them and the commands that use them). None: a run that died before its
    first save starts again (its earlier files moved aside under the lock, `_move_earlier_files`). No directory: a new
    run, said with its directory, so that a mistyped --run-name is seen at once."""
    run_dir = run.run_dir
    others = checkpoints_without_last(run_dir)
    if others:
        named = ", ".join(
            f"{p.name} (global step {step:,})" if step is not None else f"{p.name} (unreadable)" for p, step in others
        )
        use = next((p for p, step in others if step is not None), others[0][0])
        raise CheckpointError(
            f"--resume auto: {run_dir} has no {LAST} but has {named}; nothing was written. Continue from one with "
            f"the same command and --resume {use} instead of --resume auto, or start the run over with --overwrite "
            f"(it removes them)"
        )
    if _run_files(run_dir):
        run.started_again = True
        run.say(
            f"--resume auto: {run_dir} has no checkpoint (its run ended before its first save): starting it again; "
            f"its earlier files move to {_earlier_dir(run_dir).name}/ beside it"
        )
    elif run.made_dirs or not run_dir.exists():  # (rank 0 made it for its lock a moment ago)
        run.say(f"--resume auto: no run in {run_dir} yet: starting it")


def _earlier_dir(run_dir: Path) -> Path:
    """Where a run started again keeps the files of its earlier start: beside the run directory, so that TensorBoard
    shows them as a run of their own, never mixed into the new run's curves."""
    for n in itertools.count(1):
        aside = run_dir.with_name(f"{run_dir.name}.earlier-{n}")
        if not aside.exists():
            return aside


def _move_earlier_files(run_dir: Path) -> None:
    """The lock held: move the earlier start's files (events, config.json, summary.json, videos; not the lock) aside,
    none deleted. A directory without a checkpoint has nothing else a run reads."""
    entries = [e for e in run_dir.iterdir() if e.name != LOCK and not e.name.startswith(LOCK + ".")]
    entries = [e for e in entries if not (e.name == "checkpoints" and e.is_dir() and not any(e.glob("*.pt")))]
    if not entries:
        return
    aside = _earlier_dir(run_dir)
    aside.mkdir()
    for entry in entries:
        entry.rename(aside / entry.name)


def _lock_run_dir(run: Run) -> str | None:
    """Rank 0 of a training run: make the run directory (noting the directories this start made, so that a start that
    cannot go on removes them) and take its lock, before anything of the run is read. The one-line error when a live
    process holds it, else None. A directory that cannot be made or locked (a full disk, no permission) ends the start
    with the one line of an unwritable output (exit status 1)."""
    run_dir = run.run_dir
    try:
        missing = [d for d in (run_dir, *run_dir.parents) if not d.exists()]
        for d in reversed(missing):
            try:
                d.mkdir()  # one at a time: only those this start made are removed again
            except FileExistsError:
                continue  # another start made it this moment: the lock says whose run it is
            run.made_dirs.insert(0, d)
        return take_lock(run)
    except OSError as e:
        run.output_failed = True  # a disk or a permission, not bad input: status 1
        cause = f"{e.strerror or e}" + (f" [errno {e.errno}]" if e.errno else "")
        full = e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        _remove_made_dirs(run)
        return (  # said by every rank (open_run broadcasts it), exit status 1
            f"error: cannot write the run directory {run_dir} ({cause}); nothing of the run was written. "
            f"{'Free space' if full else 'Make it writable'} or choose --output-dir, then start it with: "
            f"{continue_command(run)}"
        )


def _remove_made_dirs(run: Run) -> None:
    """A start that did not begin training: remove the directories it made, if nothing is in them (its lock is
    released first), deepest first. A directory another process wrote into meanwhile stays."""
    for d in run.made_dirs:
        try:
            d.rmdir()
        except OSError:
            break  # not empty (another run's, or one that began), or not ours to remove: its parents stay too
    run.made_dirs = []


def _run_files(run_dir: Path) -> list[Path]:
    """The entries of `run_dir` that belong to a run: all but the lock and its own temporary files."""
    if not run_dir.is_dir():
        return []
    return [e for e in run_dir.iterdir() if e.name != LOCK and not e.name.startswith(LOCK + ".")]


def _the_run_in(run_dir: Path) -> str:
    """The run that `run_dir` holds, in a few words: its script, env, seed, step and how it ended, from its
    summary.json and config.json (whatever of them can be read)."""

    def read(name):
        try:
            value = json.loads((run_dir / name).read_text())
        except (OSError, ValueError):
            return {}
        return value if isinstance(value, dict) else {}

    summary, config = read("summary.json"), read(CONFIG)
    words = [f"{summary['algo']}.py" if summary.get("algo") else "a run"]
    if env_id := summary.get("env_id") or config.get("env_id"):
        words[0] += f" on {env_id}"
    if "seed" in config:
        words.append(f"seed {config['seed']}")
    if isinstance(summary.get("global_step"), int):
        reason = str(summary.get("stop_reason"))
        ended = {
            "total_timesteps": "finished",
            "error": "ended by an error",
            "max_wall_seconds": "stopped at --max-wall-seconds",
            "target_return": "stopped at --target-return",
        }.get(reason, f"stopped by {reason.partition(':')[2] or reason}")
        words.append(f"at global step {summary['global_step']:,}, {ended}")
    elif (checkpoint_dir(run_dir) / LAST).is_file():
        words.append("with a last.pt")
    else:
        words.append("with no summary.json")
    return ", ".join(words)


def _existing_run_dir(run_dir: Path, args, later_group: bool) -> str | None:
    """The one-line error for a run that would write over an existing run directory, or None. Judged with the lock
    held: a run that finished while this start was on its way is named, and kept."""
    if args.overwrite and args.resume is not None:
        return "error: --overwrite starts the run over and --resume continues it: drop one of them"
    if args.eval_only or args.resume is not None or later_group or args.overwrite:
        return None
    if _run_files(run_dir):
        return (
            f"error: the run directory {run_dir} exists; continue it with --resume auto, start another with "
            f"--run-name NAME, or remove it with --overwrite (it holds {_the_run_in(run_dir)}; nothing was written)"
        )
    return None


def begin_training(run: Run, description: str, steps_per_iteration: int, graphs: str | None = None) -> None:
    """Write the run directory (config.json, TensorBoard, wandb), print what runs (`description`; `graphs`: what is
    captured) and its cadence, and start the clocks, the signal handler and the progress lines. A collective.

    A resumed run that is at its end already says so and exits (status 0) before anything is written. The run ends
    at the last whole iteration within --total-timesteps (at least one), run.final_step."""
    args = run.args
    total = max(args.total_timesteps, steps_per_iteration)
    run.final_step = run.global_step + (total - run.global_step) // steps_per_iteration * steps_per_iteration
    run.steps_per_iteration, run.iteration_at_start = steps_per_iteration, run.iteration
    ckpt = run.checkpoint
    same_shape = ckpt is not None and ckpt["args"]["num_envs"] == args.num_envs and ckpt["world_size"] == run.world_size
    if (
        ckpt is not None
        and run.final_step == run.global_step
        and (same_shape or run.global_step >= args.total_timesteps)
    ):
        # the run is at its end: resuming it changes nothing, its summary and logs least of all
        run.say(
            f"{run.algo}: the run in {run.run_dir} is finished (global step {run.global_step:,} of --total-timesteps "
            f"{args.total_timesteps:,}); nothing to do, no file changed. Extend it with a larger --total-timesteps"
        )
        raise SystemExit(0)
    if ckpt is not None and run.final_step == run.global_step < args.total_timesteps and not same_shape:
        # resumed with bigger iterations than the run's, and not one fits in what is left of it
        raise SystemExit(
            f"error: an iteration of {run.world_size} process(es) x {args.num_envs} envs is "
            f"{steps_per_iteration:,} env steps, more than the {args.total_timesteps - run.global_step:,} "
            f"left from step {run.global_step:,} to --total-timesteps {args.total_timesteps:,}: resume "
            f"with the checkpoint's --num-envs {ckpt['args']['num_envs']} or a larger --total-timesteps"
        )
    error = _write_run_dir(run) if run.is_main else None
    error = distributed.broadcast_object(error)
    if error:
        raise SystemExit(error)
    run.guard = distributed.PreemptionGuard()
    run.start_time = run.last_save_time = time.time()
    run.steps_at_start = run.reduced_step = run.global_step
    if not run.is_main:
        return
    compiling = (
        "on" + (" (compiling takes a minute or more on a CPU)" if run.device.type == "cpu" else "")
        if args.compile
        else "off"
    )
    copied = f" (a copy of {run.algorithm}.py)" if run.algo != run.algorithm else ""
    origin = getattr(args, "_settings_origin", ("", []))[0]
    named = f"settings {args.settings}{f' ({origin})' if origin else ''}; " if args.settings else ""
    print(
        f"{run.algo}{copied} on {args.env_id}: {plural(run.world_size, 'process', 'processes')} x "
        f"{plural(args.num_envs, 'env')} on {run.device}; {named}"
        f"{description}; compile {compiling}, CUDA graphs: {graphs or ('on' if args.cudagraphs else 'off')}; "
        f"{iterations_to_run(run)} to step {run.final_step:,}; "
        f"run dir {run.run_dir}\n{cadence(run)}",
        flush=True,
    )
    if getattr(args, "_eval_notice", None):
        run.say(args._eval_notice)
    if args.progress:
        run.progress = Progress(run)


def iterations_to_run(run: Run) -> str:
    """The iterations this process runs, in words: of a resumed run, also how many the run has in all."""
    left = (run.final_step - run.global_step) // run.steps_per_iteration
    if run.iteration == 0:
        return plural(left, "iteration")
    return f"{plural(left, 'iteration')} this sitting, {run.iteration + left} in all,"


def cadence(run: Run) -> str:
    """The start's second line: when the run evaluates, checkpoints and logs, in env steps. The flags count
    iterations, whose size --num-envs scales (and the world size): the line names both."""
    args, per = run.args, run.steps_per_iteration
    every = lambda n: f"every {plural(n * per, 'step')} ({plural(n, 'iteration')}"  # noqa: E731
    if args.eval_interval > 0:
        where = " per process" if run.world_size > 1 else ""
        said = (
            f"eval {every(args.eval_interval)} of {per:,}; {plural(args.num_eval_envs, 'env')}{where} x "
            f"{plural(args.eval_episodes, 'episode')}, at most {plural(eval_steps(run), 'step')} each)"
        )
    else:
        said = "no evaluation (--eval-interval 0)"
    timed = f" or {args.save_interval_seconds:g} s" if args.save_interval_seconds else ""
    said += f", last.pt {every(args.save_interval)}){timed}"
    if args.checkpoint_interval > 0:
        kept = f", the newest {args.keep_checkpoints} kept" if args.keep_checkpoints else ""
        said += f", step_<step>.pt {every(args.checkpoint_interval)}{kept})"
    said += f", a log {every(args.log_interval)})"
    if args.progress:
        said += f", a progress line at one of them at least every {PROGRESS_SECONDS:.0f} s"
    return said


def _write_run_dir(run: Run) -> str | None:
    """Rank 0: the run directory's lock, config.json, the TensorBoard writer and wandb. Returns an error line, or
    None."""
    args = run.args
    try:
        if run.lock is not None:  # taken by open_run, before anything of the run was read
            error = lock_lost(run)
        else:  # a run's own code that skipped open_run: before any file of the run
            run.run_dir.mkdir(parents=True, exist_ok=True)
            error = take_lock(run)
        if error:
            return error
        run.made_dirs = []  # the run begins: its directory stays, whatever ends it
        if args.overwrite:
            _clear_run_dir(run.run_dir)  # held: no process that started meanwhile loses a file
        elif run.started_again:
            _move_earlier_files(run.run_dir)  # held: the files are those of a run that no process writes
        if notice := remove_dead_temporaries(run.run_dir):
            run.say(notice)
        checkpoint_dir(run.run_dir).mkdir(exist_ok=True)
    except OSError as e:
        return f"error: cannot write the run directory {run.run_dir} ({e.strerror}); choose --output-dir"
    try:
        _write_config(run)
    except OSError as e:
        return output_failed(run, getattr(e, "filename", None) or str(run.run_dir / CONFIG), e)
    _quiet_writer_thread()
    if args.track:
        import wandb

        run.wandb_run = wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            name=run.run_dir.name,
            id=run.run_dir.name,
            resume="allow",
            config=asdict(args),
            sync_tensorboard=True,
            dir=str(run.run_dir),
        )
    _open_writer(run)
    return None


def _open_writer(run: Run) -> None:
    """The run's TensorBoard writer, a new event file, with the run's flags as its first record."""
    from torch.utils.tensorboard import SummaryWriter

    # purge_step: a resumed run drops the events logged after its checkpoint, so each curve
    # stays one line without the repeated steps of the work lost to a fault.
    run.writer = SummaryWriter(str(run.run_dir), purge_step=run.global_step + 1 if run.checkpoint else None)
    table = "\n".join(f"|{k}|{v}|" for k, v in asdict(run.args).items())
    run.writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")


def _clear_run_dir(run_dir: Path) -> None:
    """--overwrite: remove everything in `run_dir` but its lock (and its temporary files), which this process
    holds."""
    for entry in run_dir.iterdir():
        if entry.name == LOCK or entry.name.startswith(LOCK + "."):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _write_config(run: Run) -> None:
    """config.json, atomically, and not at all where it holds these values already (a resume that changes
    nothing)."""
    path = run.run_dir / CONFIG
    untranslated = getattr(run.args, "_settings_origin", ("", []))[1]
    kept = {UNTRANSLATED: list(untranslated)} if untranslated else {}
    text = json.dumps({**run.foreign_flags, **asdict(run.args), **kept}, indent=2).encode()
    try:
        if path.read_bytes() == text:
            return
    except OSError:
        pass  # none yet, or unreadable: written anew
    write_atomically(path, lambda f: f.write(text))


# ----------------------------------------------------------------------------------------------
# What an iteration does besides training
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Due:
    """What this iteration does besides training, from the counters and flags alone (the same on every rank)."""

    log: bool  # reduce and log the statistics: every --log-interval iterations, and before an evaluation or a save
    eval: bool  # every --eval-interval iterations and at the end
    last: bool  # last.pt: every --save-interval iterations and at the end
    numbered: bool  # step_<global_step>.pt: every --checkpoint-interval iterations


def what_is_due(run: Run, final_iteration: bool) -> Due:
    """This iteration's Due, from the counters and flags. Before an iteration that writes, rank 0 looks that its run
    directory is still there (`_run_dir_removed`)."""
    args, i = run.args, run.iteration
    evaluate = args.eval_interval > 0 and (i % args.eval_interval == 0 or final_iteration)
    last = final_iteration or i % args.save_interval == 0
    numbered = args.checkpoint_interval > 0 and i % args.checkpoint_interval == 0
    due = Due(
        log=i % args.log_interval == 0 or evaluate or last or numbered, eval=evaluate, last=last, numbered=numbered
    )
    watched = run.is_main and run.lock is not None and run.guard is not None and run.removed_at is None
    if due.log and watched and _run_dir_removed(run):
        _make_run_dir_again(run)
    return due


def _run_dir_removed(run: Run) -> bool:
    """Whether the run directory was removed under the run (its lock and config.json gone: one stat while it is
    there). A lock deleted alone is the heartbeat's to write again (common.lock)."""
    return not (run.run_dir / LOCK).is_file() and not (run.run_dir / CONFIG).is_file()


def _make_run_dir_again(run: Run) -> None:
    """Rank 0, its run directory removed while the run trains: make it again under the lock taken again, with
    config.json and a new event file, and stop the run after this iteration as a signal would, so that every rank
    saves last.pt of this step (`finish` then ends the run with the line that says so). Where it cannot be made
    again, or another process holds it now, the run ends here with the line that says that nothing was saved."""
    run_dir, step = run.run_dir, run.global_step
    run.removed_at = step
    gone = f"error: the run directory {run_dir} was removed while the run trained (at global step {step:,})"
    release_lock_quietly(run.lock)
    run.lock = None
    _close_quietly(run)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        refused = take_lock(run)
    except OSError as e:
        raise SystemExit(_cannot_make_again(run, gone, e)) from None
    if refused:
        run.output_failed = True
        raise SystemExit(f"{gone}; another process holds it now: nothing was saved, the run there is that one's")
    try:
        _write_config(run)
        _open_writer(run)
    except OSError as e:
        raise SystemExit(output_failed(run, getattr(e, "filename", None) or str(run_dir / CONFIG), e)) from None
    run.say(f"notice: {gone.removeprefix('error: ')}: made it again; saving last.pt after this iteration and stopping")
    run.guard.received = run.guard.received or "the removal of its run directory"


def _cannot_make_again(run: Run, gone: str, error: OSError) -> str:
    """The line of a removed run directory that cannot be made again: nothing was saved, and what starts it again."""
    run.output_failed = True
    return (
        f"{gone}, and cannot be made again ({error.strerror or error}): nothing was saved; the run's state at that "
        f"step is lost. Once {run.run_dir} can be made, start the run again with: {continue_command(run)}"
    )


def _close_quietly(run: Run) -> None:
    """Close the run's TensorBoard writer, whose file is gone: its failures say nothing new."""
    writer, run.writer = run.writer, None
    try:
        if writer is not None:
            writer.close()
    except Exception:  # noqa: BLE001 -- its file went with the directory
        pass


def checkpoints_to_write(run: Run, due: Due) -> list[str]:
    """The checkpoints to write after this iteration's log and evaluation (a stop and --save-interval-seconds are
    known from the log). Reads the run, changes nothing."""
    names = [BEST] if run.best_iteration == run.iteration else []
    if due.last or run.stop_reason or (due.log and run.save_time_due):
        names.append(LAST)
    if due.numbered:
        names.append(f"step_{run.global_step}.pt")
    return names


# ----------------------------------------------------------------------------------------------
# Finishing
# ----------------------------------------------------------------------------------------------
def close(run: Run) -> None:
    """Let go of everything the run holds, in the order that cannot hang: the signal handlers, the
    writers, the CUDA graphs, and last the process group. Called by `finish` and
    `eval_only`, and by `closing` on any other exit; a second call does nothing.

    On an error each step is tried and its own failure reported, so that the process group still
    goes and the error that ended the run is the one the process exits with."""
    if run.closed:
        return
    run.closed = True
    _hold_signals(run)  # first: a signal that arrives while the run closes changes nothing of how it ends
    steps = [
        ("TensorBoard writer", run.writer.close if run.writer is not None else None),
        ("wandb", run.wandb_run.finish if run.wandb_run is not None else None),
        ("run directory's lock", lambda: release_lock(run)),  # after the writers: nothing of this run writes now
        ("directories of a start that did not begin", (lambda: _remove_made_dirs(run)) if run.made_dirs else None),
        ("CUDA graphs", lambda: release_graphs(run)),
        ("process group", distributed.cleanup),
        # a run inside another program gives the program its own handlers back; a program keeps holding them until
        # it exits, so that a signal after the teardown cannot turn a saved stop (0) into 143
        ("signal handlers", run.guard.restore if run.guard is not None and not from_command_line(run.args) else None),
    ]
    for what, step in steps:
        if step is None:
            continue
        try:
            step()
        except Exception as e:  # noqa: BLE001 -- teardown goes on; the run's own error is what counts
            if not run.output_failed:  # after a failed write, the writers' closing fails for the same cause
                print(f"warning: closing the run's {what} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def _hold_signals(run: Run) -> None:
    """From the end of training on (`finish`, `close`): SIGTERM, SIGUSR1 and SIGINT are said and ignored, so that a
    repeated signal (a scheduler's, a second Ctrl-C) cannot change the exit status the run has reached: 0 after the
    stop a first one asked for saved last.pt. The teardown takes seconds; kill -9 still ends it."""
    if run.guard is None or getattr(run.guard, "held", False):
        return
    run.guard.held = True

    def teardown(signum, frame):
        if run.is_main:  # os.write: safe inside a handler that interrupts a print
            name = signal.Signals(signum).name
            os.write(2, f"{name}: the run is closing already; it ends as it was ending\n".encode())

    for name in distributed.PreemptionGuard.SIGNALS:
        if (sig := getattr(signal, name, None)) is not None:
            signal.signal(sig, teardown)


@contextmanager
def closing(run: Run):
    """`with closing(run):` around a script's training: whatever ends it (a return, an error, Ctrl-C), the run is
    closed before the exception goes on, so a failed rank releases its graphs and leaves the process group at once
    instead of hanging in its teardown. A file of the run that cannot be written (a full disk, a quota, a read-only
    directory) ends the run with one line (`output_failed`) instead of the error's traceback."""
    try:
        yield run
    except OSError as e:
        if _vanished(run):
            raise SystemExit(_saved_again(run)) from None
        what = _unwritten(run, e)
        if what is None:
            raise
        raise SystemExit(output_failed(run, what, e)) from None
    except SystemExit as e:  # bad input found before training began: a usage error's status, as a bad flag's (2)
        if isinstance(e.code, str) and _vanished(run):  # the lock's heartbeat found the run directory gone
            raise SystemExit(_saved_again(run)) from None
        bad_input = not run.output_failed  # a file that could not be written is not bad input: status 1
        if run.guard is None and isinstance(e.code, str) and e.code.startswith("error:") and bad_input:
            raise usage_error(e.code) from None  # the line on stderr and as the message, exit status 2
        raise
    except RuntimeError as e:
        if (line := distributed.lost_peer(e)) is None:
            raise
        last = _kept(run) if run.run_dir is not None and not run.args.eval_only else None
        raise SystemExit(line + (f"; {last}. Continue with: {continue_command(run)}" if last else "")) from None
    finally:
        close(run)


def _unwritten(run: Run, error: OSError) -> str | None:
    """The file of the run that `error` failed to write, in words, or None for an error of another kind."""
    if isinstance(error, OutputError):  # the atomic writes: checkpoints, summary.json, config.json, the export, videos
        return error.filename
    if run.run_dir is None:
        return None
    for frame in reversed(traceback.extract_tb(error.__traceback__)):  # the innermost writer's package names it
        parts = Path(frame.filename).parts
        if "tensorboard" in parts:  # an event: scalars, the eval video's GIF
            return f"the TensorBoard event file in {run.run_dir}"
        if "wandb" in parts:  # wandb's copy of a file it logs (the eval video, TensorBoard's events), its own files
            return f"{error.filename} (wandb's copy)" if error.filename else f"wandb's files of {run.run_dir}"
    return None


def output_failed(run: Run, what: str, error: OSError) -> str:
    """The one line of a run that cannot write `what`: the cause, the last good checkpoint and the command that
    continues the run (all writes are atomic or appends: nothing earlier is lost); summary.json where it can be."""
    run.output_failed = True
    cause = f"{error.strerror or error}" + (f" [errno {error.errno}]" if error.errno else "")
    full = error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    if run.args.eval_only:  # it writes no run: nothing to keep, nothing to continue
        return (
            f"error: cannot write {what} ({cause}); {run.resume_path} is untouched. "
            f"{'Free space' if full else 'Make it writable'}, then run it again"
        )
    kept = _kept(run)
    summary = run.run_dir / "summary.json"
    if what != str(summary):
        try:
            write_summary(run, summary_of(run, params_in_sync=None, error=f"cannot write {what}: {cause}"))
        except OSError:
            kept += "; summary.json not written either"
    return (
        f"error: cannot write {what} ({cause}); {kept}, nothing earlier lost. "
        f"{'Free space' if full else 'Make it writable'} (or move the run directory and give its new --output-dir), "
        f"then continue with: {continue_command(run)}"
    )


def _kept(run: Run) -> str:
    """The run's checkpoints on disk now, in words: last.pt with its step, else the others with theirs. Only files
    that exist are named."""
    last = checkpoint_dir(run.run_dir) / LAST
    if last.is_file():
        if LAST in run.saved:
            return f"the last good checkpoint is {last} (global step {run.saved[LAST]:,})"
        return f"the last good checkpoint is {last} (of an earlier process)"
    others = [(p, step) for p, step in checkpoints_without_last(run.run_dir) if step is not None]
    if others:
        named = ", ".join(f"{p.name} (global step {step:,})" for p, step in others)
        return f"no {LAST} was written yet; the run's checkpoints in {checkpoint_dir(run.run_dir)}: {named}"
    return "no checkpoint was written yet"


def _vanished(run: Run) -> bool:
    """Rank 0 of a run that began training: whether its run directory was removed under it (its lock's file is gone,
    or the lock's heartbeat found the directory gone)."""
    if not run.is_main or run.lock is None or run.guard is None or run.run_dir is None:
        return False
    return run.lock.vanished or not (run.run_dir / LOCK).is_file()


class _NoEnvSnapshot:
    """The envs of a checkpoint written after the fact: no snapshot, so a resume starts fresh episodes (the next
    observation is the script's, out of reach here)."""

    @staticmethod
    def state_dict() -> dict:
        return {}


def _saved_again(run: Run) -> str:
    """The run directory was removed while the run trained: make it again and save what this process holds (last.pt
    of the model, optimizers and state at this step, config.json, a new event file), under the lock taken again, and
    return the one line that says so; or the line that says exactly that nothing was saved."""
    run_dir, step = run.run_dir, run.global_step
    run.output_failed = True  # the writers of the removed files fail as they close: no warnings of theirs
    old, run.lock = run.lock, None
    release_lock_quietly(old)
    _close_quietly(run)
    gone = f"error: the run directory {run_dir} was removed while the run trained (at global step {step:,})"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        refused = take_lock(run)
    except OSError as e:
        return _cannot_make_again(run, gone, e)
    if refused:
        return f"{gone}; another process holds it now: nothing was saved, the run there is that process's"
    saved, missed = [], []
    if run.held is not None and run.world_size == 1:
        from common.checkpoint import save as save_checkpoints

        try:
            save_checkpoints(run, [LAST], replace(run.held, envs=_NoEnvSnapshot()), None)
        except Exception as e:  # noqa: BLE001 -- whatever failed, the line says what is on disk
            missed.append(f"{LAST} ({getattr(e, 'strerror', None) or e})")
        if (checkpoint_dir(run_dir) / LAST).is_file():
            saved.append(f"checkpoints/{LAST} (global step {step:,}; its envs start new episodes when resumed)")
    elif run.held is not None:
        missed.append(f"{LAST} (the state of {run.world_size} processes cannot be gathered once one has stopped)")
    else:
        missed.append(f"{LAST} (the script restored no TrainingState, so none is in reach)")
    try:
        _write_config(run)
        saved.append(CONFIG)
    except OSError as e:
        missed.append(f"{CONFIG} ({e.strerror})")
    try:
        _open_writer(run)
        run.writer.flush()
        saved.append("a new event file")
    except OSError as e:
        missed.append(f"an event file ({e.strerror})")
    try:
        write_summary(run, summary_of(run, params_in_sync=None, error="the run directory was removed"))
        saved.append("summary.json")
    except OSError:
        missed.append("summary.json")
    if not saved:
        return f"{gone}: made it again, but nothing was saved ({'; '.join(missed)})"
    return (
        f"{gone}: made it again with what this process held: {', '.join(saved)}"
        + (f"; not saved: {'; '.join(missed)}" if missed else "")
        + f". Continue with: {continue_command(run)}"
    )


def release_lock_quietly(lock) -> None:
    """Stop a lock's heartbeat and let go of it (its file is gone with its directory)."""
    if lock is not None:
        try:
            release(lock)  # the heartbeat stops first; the file it would remove is gone
        except OSError:
            pass


def _quiet_writer_thread() -> None:
    """TensorBoard's writer thread re-raises a failed write, printing its traceback, and the writer's next call in
    the run raises it again, where it becomes the run's one line (`closing`): the thread's print is dropped. Other
    threads' errors are printed as before. Installed once per process."""
    earlier = threading.excepthook
    if getattr(earlier, "quiets_tensorboard", False):
        return

    def hook(args):
        if not (isinstance(args.exc_value, OSError) and type(args.thread).__module__.startswith("tensorboard")):
            earlier(args)

    hook.quiets_tensorboard = True
    threading.excepthook = hook


def summary_of(run: Run, params_in_sync: bool | None, extra: dict | None = None, error: str | None = None) -> dict:
    """The run's summary.json: the same fields for every script, and a script's `extra` ones."""
    read_timings(run)
    ckpts = checkpoint_dir(run.run_dir)
    totals = run_totals(run)  # the whole run's: this process's seconds on top of its earlier processes'
    finite = lambda x: None if math.isnan(x) or math.isinf(x) else x  # noqa: E731 -- strict JSON: null, not NaN
    return {
        "algo": run.algo,
        "algorithm": run.algorithm,
        "env_id": run.args.env_id,
        "run_dir": str(run.run_dir),
        "global_step": run.global_step,
        "iteration": run.iteration,
        "wall_seconds": totals["wall_seconds"],
        "processes": totals["processes"],
        "sps": run.sps,
        "last_train_return": finite(run.last_train_return),
        "last_eval_return": finite(run.last_eval_return),  # of the latest evaluation, the run's final one at its end
        "best_eval_return": finite(run.best_eval_return),
        "stop_reason": "error" if error else run.stop_reason or "total_timesteps",
        **({"error": error} if error else {}),
        "world_size": run.world_size,
        "params_in_sync": params_in_sync,
        "rollout_seconds": totals["seconds"].get("rollout"),
        "update_seconds": totals["seconds"].get("update"),
        "evaluation_seconds": totals["seconds"].get("evaluation", 0.0),
        # until each hot function ran compiled and captured (its first calls, their work included)
        "compile_seconds": sum(run.compile_seconds.values()),
        "compile_seconds_by_function": run.compile_seconds,
        "compile": bool(run.args.compile),
        "cudagraphs": bool(run.args.cudagraphs),
        "peak_memory_mb": peak_memory_mb(run.device),
        "checkpoints": {
            name: str(ckpts / file) for name, file in (("last", LAST), ("best", BEST)) if (ckpts / file).is_file()
        },
        **(extra or {}),
    }


def write_summary(run: Run, summary: dict) -> None:
    """summary.json, atomically: a write that fails (OutputError) leaves an earlier process's summary whole."""
    write_atomically(run.run_dir / "summary.json", lambda f: f.write(json.dumps(summary, indent=2).encode()))


def finish(run: Run, model: torch.nn.Module, extra: dict | None = None) -> dict:
    """Check that the ranks' parameters agree, write summary.json, close the run. A collective. Returns the
    summary."""
    _hold_signals(run)  # training is over: a repeated signal cannot change how the run ends
    in_sync = distributed.check_in_sync(model)  # averaged gradients keep every rank's weights bit-identical
    if not in_sync and run.is_main:
        print(
            "warning: the ranks' parameters differ; a non-deterministic collective or a rank-local update diverged "
            "them",
            flush=True,
        )
    summary = summary_of(run, in_sync, extra)
    if run.is_main:
        write_summary(run, summary)
        run.say("\n".join(closing_words(run, summary)))
    removed = run.removed_at is not None and run.is_main
    close(run)
    if removed:  # made again and saved (_make_run_dir_again): the run did not end as asked, status 1
        raise SystemExit(
            f"error: the run directory {run.run_dir} was removed while the run trained (at global step "
            f"{run.removed_at:,}): made it again with what this process held: {checkpoint_dir(run.run_dir) / LAST} "
            f"(global step {run.saved.get(LAST, run.global_step):,}), {CONFIG}, a new event file and summary.json. "
            f"Continue with: {continue_command(run)}"
        )
    return summary
