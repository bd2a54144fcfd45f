"""What the PPO-family scripts do around their algorithm, the same in each (ppo.py and ppo_rnd.py use all of it,
ppo_lstm.py and distill.py the log and the end of an iteration): the sizes of an iteration and its batch split into
minibatches, the statistics an iteration gathers on the device, the start line (what the CUDA graphs hold), the log
of an iteration's statistics, and the evaluation, checkpoints and stop that end an iteration."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from common.checkpoint import save
from common.evaluation import evaluate
from common.run import Due, begin_training, checkpoints_to_write
from common.stats import log, reduce_iteration, zero_

if TYPE_CHECKING:
    from common.record import Run


def minibatch_size(args, batch_size: int) -> int:
    """The minibatch of a batch of num_envs * num_steps (per process) in --num-minibatches, or a one-line error before
    anything runs when it does not divide."""
    if batch_size % args.num_minibatches != 0:
        raise SystemExit(
            f"error: the batch of num_envs*num_steps = {args.num_envs}*{args.num_steps} = {batch_size} does "
            f"not divide into --num-minibatches {args.num_minibatches}; pick a divisor of {batch_size}"
        )
    return batch_size // args.num_minibatches


def iteration_sizes(run: Run) -> tuple[int, int, int]:
    """(minibatch per process, global batch, total env steps) of a run: an iteration is num_envs * num_steps env steps
    per process (the batch, split into --num-minibatches: a one-line error when it does not divide) and the global
    batch over all ranks; the run goes on to --total-timesteps, counted in env steps over all ranks, at least one
    iteration."""
    args = run.args
    batch_size = args.num_envs * args.num_steps
    global_batch = batch_size * run.world_size
    return minibatch_size(args, batch_size), global_batch, max(args.total_timesteps, global_batch)


def iteration_stats(device, kinds: tuple[str, ...] = ("losses",)) -> dict:
    """What an iteration's compiled functions gather on the device for the log (log_iteration reads it every
    --log-interval): "episodes", the finished episodes' sums (common.stats.episode_sums); one dict of named sums per
    kind (a loss returns a dict: common.stats.add_to); "nonfinite", the counts of the NaN guard, by name."""
    return {"episodes": torch.zeros(3, device=device, dtype=torch.float64), **{k: {} for k in kinds}, "nonfinite": {}}


def begin_iterations(run: Run, global_batch: int, minibatch: int, whole_rollout: bool) -> None:
    """begin_training with the PPO family's start line: the batch, its minibatches and what the CUDA graphs hold."""
    args = run.args
    said = f"batch {global_batch} per iteration ({args.num_minibatches} minibatches of {minibatch} per process)"
    begin_training(run, said, global_batch, graphs_said(args, whole_rollout))


def graphs_said(args, whole_rollout: bool) -> str:
    """What the CUDA graphs hold, as begin_training says it: the whole rollout (a built-in env) or each acting step
    (an adapter), then the targets and the whole update, or, with --target-kl (the epoch loop reads the KL on the
    host), the targets and each minibatch update apart."""
    if not args.cudagraphs:
        return "off"
    alone = getattr(args, "target_kl", None) is not None
    return (
        f"{'the whole rollout' if whole_rollout else 'each acting step'}, "
        f"{'the targets, each minibatch update' if alone else 'the targets and the whole update'}"
    )


def log_iteration(run: Run, stats: dict, iterations: int, local: dict, kinds: tuple[str, ...] = ("losses",)) -> None:
    """Log the statistics gathered on the device since the last log, over all ranks in one host read: stats'
    "episodes", the mean over `iterations` of each of its sums of `kinds` (tagged kind/name; a name with its own tag,
    as charts/symmetry_error, keeps it), its "nonfinite" counts as the NaN guard, and `local` (rank 0's, e.g. the
    learning rate); then zero the sums for the next. A collective."""
    means = {
        name if "/" in name else f"{kind}/{name}": total / iterations
        for kind in kinds
        for name, total in stats[kind].items()
    }
    checks = {name: count == 0 for name, count in stats["nonfinite"].items()}
    log(run, reduce_iteration(run, episodes=stats["episodes"], means=means, checks=checks, local=local))
    zero_(stats)


def evaluate_and_save(run: Run, due: Due, eval_envs, policy, state, next_obs) -> bool:
    """The end of an iteration, the same decisions on every rank: the evaluation and the checkpoints that are due
    (after the log, whose statistics decide a stop or a timed save). True when the run stops here. A collective."""
    if due.eval:
        evaluate(run, eval_envs, policy)
    if names := checkpoints_to_write(run, due):
        save(run, names, state, next_obs)
    return bool(run.stop_reason)
