"""Statistics: gathered on the device by name between two log points, reduced over the ranks in
one host read, checked for non-finite values, and written to TensorBoard.

    episode_sums(running, rewards, dones, sums)   # finished episodes' return, length and count
    add_to(sums, {"value_loss": v, ...})          # named running sums, in place on the device
    record_env_log(run, info)                     # the env's own metrics (env/...)
    log(run, reduce_iteration(run, episodes=..., means=..., checks=...))
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tensordict import TensorDictBase

from common import distributed
from common.args import SITTING_FLAGS, as_flag, from_command_line, run_command
from common.capture import read_timings
from common.checkpoint import LAST, checkpoint_dir, checkpoints_without_last

if TYPE_CHECKING:
    from common.record import Run


@torch.no_grad()
def episode_sums(
    running: torch.Tensor, rewards: torch.Tensor, dones: torch.Tensor, sums: torch.Tensor | None = None
) -> torch.Tensor:
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


def add_to(sums: dict[str, torch.Tensor], values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Add named scalars (0-d tensors) into `sums` in place, on the device; returns `sums`.

    A name seen for the first time gets a float64 sum of its own, a copy of its value: a script's
    sums start as {} and take their names from what its loss functions return, so a new logged
    scalar is one entry in a loss's dict. In a captured function the first call (an eager warm-up)
    creates them; every later call, the capture and its replays, adds in place. Never inside a
    compiled function: a new name there would make torch.compile trace it twice.
    """
    for name, value in values.items():
        if name in sums:
            sums[name] += value
        else:
            sums[name] = value.detach().to(torch.float64, copy=True)
    return sums


def nonfinite(x) -> torch.Tensor:
    """How many entries of `x` are NaN or infinite (a 0-d tensor, on the device): a tensor, or every leaf of
    a TensorDict (a term group's terms; uint8 frames count none)."""
    if isinstance(x, TensorDictBase):
        return sum(nonfinite(v) for v in x.values(include_nested=True, leaves_only=True))
    return (~torch.isfinite(x)).sum()


def zero_(stats) -> None:
    """Zero in place every tensor of `stats` (a tensor, or a dict of them, nested): the sums start over after a log."""
    if isinstance(stats, dict):
        for value in stats.values():
            zero_(value)
    else:
        stats.zero_()


def explained_variance(returns: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """1 - Var(returns - values) / Var(returns), how much of the returns' variance the critic's values explain (NaN
    when the returns do not vary): a 0-d tensor on the device, logged as losses/explained_variance."""
    var_y = returns.var()
    return torch.where(var_y > 0, 1 - (returns - values).var() / var_y, torch.nan)


def record_env_log(run: Run, info: dict) -> None:
    """Add the env's own metrics of one step (info["log"]: name -> number or 0-d tensor) to the sums
    logged under env/ (each name: the mean over the steps that reported it, read by reduce_iteration).

    Numbers are summed on the host as floats; a tensor is summed on its device, into a float64
    running sum of our own (in place after the first report of the interval): no host read and no
    host-to-device copy per step.
    """
    log_values = info.get("log", {})
    if log_values and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"the env reports metrics ({', '.join(log_values)}) inside a captured rollout, where their "
            f"Python sums would not run again; an env that logs must say capturable = False"
        )
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


def reduce_iteration(
    run: Run,
    episodes: torch.Tensor | None = None,
    means: dict | None = None,
    checks: dict | None = None,
    local: dict | None = None,
) -> dict[str, float]:
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
    flags = [
        run.guard is not None and run.guard.received is not None,
        args.max_wall_seconds is not None and now - run.start_time >= args.max_wall_seconds,
        args.save_interval_seconds is not None and now - run.last_save_time >= args.save_interval_seconds,
    ]
    as_row = lambda v: torch.as_tensor(v, device=dev).double().reshape(-1)  # noqa: E731
    reduced = [
        as_row(episodes if episodes is not None else [0.0, 0.0, 0.0]),
        *(as_row(v) for v in means.values()),
        *(as_row(v.all()) for v in checks.values()),
        torch.tensor(flags, dtype=torch.float64).to(dev),
    ]
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
        run.progress.at_log_point(run)


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """`n` and its noun, singular or plural: "1 iteration", "2,048 steps", "1 process", "2 processes"."""
    return f"{n:,} {noun if n == 1 else nouns or noun + 's'}"


def train_return(run: Run) -> str:
    """The last training return as the lines say it."""
    return "no episode finished yet" if math.isnan(run.last_train_return) else f"{run.last_train_return:.2f}"


def duration(seconds: float) -> str:
    """A time left in words: "40 s", "12 min", "3 h 05 min", "2 d 04 h"."""
    minutes = int(seconds // 60)
    if minutes < 1:
        return f"{seconds:.0f} s"
    if minutes < 60:
        return f"{minutes} min"
    if minutes < 24 * 60:
        return f"{minutes // 60} h {minutes % 60:02d} min"
    return f"{minutes // (24 * 60)} d {minutes // 60 % 24:02d} h"


PROGRESS_SECONDS = 30.0  # the most wall time between two lines of a run that logs at least that often


class Progress:
    """--progress on rank 0: a line that shows the run is alive (step, SPS, the last training return, the time left)
    at the last log point before PROGRESS_SECONDS pass since the start line or the last such line (an evaluation's
    line counts as one), the next log point expected as far off as the last one was. Printed at the log points only,
    so it costs no host read of its own, and plain lines (no carriage returns), so a terminal and a log file read
    alike. Where the log points themselves are further apart than twice that, it says once how to get more: they
    are the only points a line can come from."""

    clock = staticmethod(time.monotonic)

    def __init__(self, run: Run):
        self.last_line = self.last_log = self.clock()
        self.last_log_iteration = run.iteration
        self.told = False

    def write(self, line: str) -> None:  # Run.say's
        print(line, flush=True)

    def shown(self) -> None:
        """A line that says as much was printed (an evaluation's)."""
        self.last_line = self.clock()

    def at_log_point(self, run: Run) -> None:
        now = self.clock()
        apart, iterations = now - self.last_log, run.iteration - self.last_log_iteration
        first = self.last_log_iteration == run.iteration_at_start  # its time holds the start-up (compiling)
        self.last_log, self.last_log_iteration = now, run.iteration
        if now - self.last_line + apart >= PROGRESS_SECONDS:
            self.last_line = now
            left = (run.final_step - run.global_step) / run.sps if run.sps > 0 else math.inf
            print(
                f"iteration {run.iteration} step {run.global_step:,} of {run.final_step:,}: train return "
                f"{train_return(run)}, SPS {run.sps:,.0f}, {duration(left) if left < math.inf else '?'} left",
                flush=True,
            )
        if not first and not self.told and iterations > 0 and apart > 2 * PROGRESS_SECONDS:
            self.told = True
            each = apart / iterations
            how = (
                f"--log-interval {max(1, int(PROGRESS_SECONDS // each))} logs every {PROGRESS_SECONDS:.0f} s"
                if each < PROGRESS_SECONDS
                else "fewer --num-envs or --num-steps make shorter iterations"
            )
            print(
                f"notice: the log points are {apart:.0f} s apart ({plural(iterations, 'iteration')} of {each:.1f} s), "
                f"so are the progress lines; {how}",
                flush=True,
            )


# Flags of the sitting that the command which continues a run does not repeat: it names the run directory and how to
# resume itself; the sitting's others that were given (--device, --max-wall-seconds) are repeated
_NOT_REPEATED = {"resume", "overwrite", "run_name", "output_dir", "eval_only", "export", "progress"}


def closing_words(run: Run, summary: dict) -> list[str]:
    """What the run did, in a few lines: steps and speed, why it ended, the returns, where its files
    are, and, when it stopped early, the command that continues it."""
    args, reason = run.args, summary["stop_reason"]
    lines = [
        f"{run.algo} on {args.env_id}: {plural(run.global_step, 'step')} ({plural(run.iteration, 'iteration')}"
        f"{f', {run.iteration - run.iteration_at_start} this sitting' if run.iteration_at_start else ''}) in "
        f"{summary['wall_seconds']:.0f} s, {run.sps:,.0f} steps/s; {_why_it_ended(run, reason)}"
    ]
    best, last, train = summary["best_eval_return"], summary["last_eval_return"], summary["last_train_return"]
    lines.append(
        f"{'no evaluation ran' if best is None else f'eval return: best {best:.2f}'}"
        f"{f', last {last:.2f}' if last is not None else ''}; "
        f"{'last train return ' + format(train, '.2f') if train is not None else 'no training episode finished'}"
    )
    kept = ", ".join(Path(path).name for path in summary["checkpoints"].values()) or "none written"
    lines.append(f"checkpoints: {checkpoint_dir(run.run_dir)} ({kept}); summary: {run.run_dir / 'summary.json'}")
    if reason.startswith("signal") or reason == "max_wall_seconds":
        lines.append(f"continue with: {continue_command(run)}")
    return lines


def _why_it_ended(run: Run, reason: str) -> str:
    """The end of the first closing line: the flag that ended the run, or the signal. A budget that is not a whole
    number of iterations ends at the last whole one (at least one runs): the line says so."""
    total, step, per = run.args.total_timesteps, run.global_step, run.steps_per_iteration
    if reason == "total_timesteps" and step < total:
        return (
            f"--total-timesteps {total:,} rounded down to whole iterations of {per:,} steps "
            f"({plural(total - step, 'step')} not run)"
        )
    if reason == "total_timesteps" and step > total:
        return f"--total-timesteps {total:,} is less than an iteration of {per:,} steps: one ran"
    ended = {
        "total_timesteps": f"--total-timesteps {total:,} reached",
        "target_return": "--target-return reached",
        "max_wall_seconds": "--max-wall-seconds reached",
    }
    return ended.get(reason, "stopped by " + reason.partition(":")[2])


def continue_command(run: Run) -> str:
    """The command that continues this run, whether or not a checkpoint was written: the run's own flags (each whose
    value is not the default of the set it was started with, as the "from the checkpoint" line has them, so that
    where no checkpoint holds them the run starts again as it was), the sitting's flags that were given, its run
    directory, and --resume auto; where the run has no last.pt but other checkpoints, --resume of its newest one."""
    args = run.args
    as_program = from_command_line(args)
    try:
        own = run_command(run, {**run.foreign_flags, **asdict(args)}, SITTING_FLAGS)
    except (Exception, SystemExit):  # noqa: BLE001 -- a set not resolvable here (an error's line must not fail)
        own = " ".join(as_flag(name, getattr(args, name)) for name in sorted(run.given - SITTING_FLAGS))
    sitting = [as_flag(name, getattr(args, name)) for name in sorted((run.given & SITTING_FLAGS) - _NOT_REPEATED)]
    resume = "auto"
    if not (checkpoint_dir(run.run_dir) / LAST).is_file():  # --resume auto would refuse: the newest other one
        others = [(step, str(p)) for p, step in checkpoints_without_last(run.run_dir) if step is not None]
        resume = max(others)[1] if others else resume
    return " ".join(
        [
            f"python {sys.argv[0] if as_program else f'algos/{run.algo}.py'}",
            *filter(None, [own, *sitting]),
            f"--output-dir {args.output_dir} --run-name {run.run_dir.name} --resume {resume}",
        ]
    )
