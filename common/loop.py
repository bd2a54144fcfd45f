"""What the PPO-family scripts do around their algorithm, the same in each (ppo.py uses it; ppo_rnd.py and
ppo_lstm.py write it out): the batch split into minibatches, what the CUDA graphs hold as the start line says it, the
log of an iteration's statistics, and the evaluation, checkpoints and stop that end an iteration."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from common.capture import captured, compiled
from common.checkpoint import save
from common.evaluation import evaluate
from common.run import Due, checkpoints_to_write
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


def compile_and_capture(
    run: Run,
    whole_rollout: bool,
    acting: dict[str, Callable],
    env_step,
    update_minibatch,
    targets_fn,
    rollout_fn,
    update_fn,
) -> tuple:
    """The iteration's functions compiled (--compile) and captured (--cudagraphs), unchanged, returned in the order
    given (the `acting` functions first) for the script to rebind, so that the functions calling them call these.
    `whole_rollout` (a built-in env, which steps inside the graph): the env step compiled, the rollout one graph.
    Otherwise (an adapter's simulator cannot be captured: it steps eagerly between graphs): each `acting` function
    (name -> the acting step and what else runs at a step) compiled and captured alone. Then the targets and every epoch
    of the update as one graph (the batch never leaves it); with --target-kl, whose epoch loop reads the KL on the host,
    the targets and each minibatch update captured alone."""
    if whole_rollout:
        env_step = compiled(run, env_step)
    else:
        acting = {name: captured(run, name, compiled(run, fn)) for name, fn in acting.items()}
    update_minibatch, targets_fn = compiled(run, update_minibatch), compiled(run, targets_fn)
    alone = getattr(run.args, "target_kl", None) is not None
    if alone:
        targets_fn = captured(run, "targets", targets_fn)
        update_minibatch = captured(run, "minibatch update", update_minibatch)
    rollout_fn = captured(run, "rollout", rollout_fn, capture=whole_rollout)
    if not alone:
        update_fn = captured(run, "update", update_fn)
    return (*acting.values(), env_step, update_minibatch, targets_fn, rollout_fn, update_fn)


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
