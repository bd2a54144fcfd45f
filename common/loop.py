"""What the rollout-based scripts do around their algorithm, the same in each (ppo.py and ppo_rnd.py use all of it,
ppo_lstm.py all but the sizes and the start line, which are a recurrent run's, distill.py also not the non-finite counts
and the storage line, pqn.py all but the rollout's non-finite counts, for it counts its Q targets too): the sizes of
an iteration and its batch split into minibatches, the statistics an iteration gathers on the device, the Atari game's
score beside a life's, the rollout (the script's env step repeated into the storage), a rollout's episodes and
non-finite counts, an update's mean losses, which of the iteration's functions are compiled and captured, the start line
(what the CUDA graphs hold), the storage's layout said once, the log of an iteration's statistics, and the evaluation,
checkpoints and stop that end an iteration."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from tensordict import TensorDict

from common.capture import captured, compiled
from common.checkpoint import save
from common.evaluation import evaluate
from common.run import Due, begin_training, checkpoints_to_write, what_is_due
from common.stats import add_to, episode_sums, log, nonfinite, record_env_log, reduce_iteration, zero_

if TYPE_CHECKING:
    from common.buffer import RolloutStorage
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


def iteration_sizes(run: Run) -> tuple[int, int]:
    """(global batch, total env steps) of a run: an iteration is num_envs * num_steps env steps per process (the
    batch, split into --num-minibatches: a one-line error when it does not divide) and the global batch over all
    ranks; the run goes on to --total-timesteps, counted in env steps over all ranks, at least one iteration."""
    args = run.args
    batch_size = args.num_envs * args.num_steps
    minibatch_size(args, batch_size)  # or the error, before anything runs
    global_batch = batch_size * run.world_size
    return global_batch, max(args.total_timesteps, global_batch)


def iteration_stats(device, kinds: tuple[str, ...] = ("losses",)) -> dict:
    """What an iteration's compiled functions gather on the device for the log (log_iteration reads it every
    --log-interval): "episodes", the finished episodes' sums (common.stats.episode_sums); one dict of named sums per
    kind (a loss returns a dict: common.stats.add_to); "nonfinite", the counts of the NaN guard, by name."""
    return {"episodes": torch.zeros(3, device=device, dtype=torch.float64), **{k: {} for k in kinds}, "nonfinite": {}}


def with_game_score(transition: dict, info: dict) -> dict:
    """Atari: a life is the learner's episode, the game's score is what is logged. Where the env's info has the game's
    reward and end (Atari's presets), the transition keeps them beside the learner's reward and done."""
    if "game_over" in info:
        transition.update(game_rewards=info["game_reward"].float(), game_over=info["game_over"])
    return transition


def rollout(run: Run, env_step: Callable, next_obs: TensorDict, storage: RolloutStorage) -> TensorDict:
    """A rollout: storage.num_steps calls of the script's `env_step` (act, then step every env once), each transition
    written to storage at its step and the env's log recorded; returns the observation after the last step. No host
    sync: on CUDA a built-in env's whole rollout is one graph (compile_and_capture)."""
    for step in range(storage.num_steps):
        next_obs, transition, info = env_step(next_obs)
        storage.write(step, transition)
        record_env_log(run, info)
    return next_obs


def rollout_episodes(data: TensorDict, dones: torch.Tensor, ep_stats: torch.Tensor, episodes: torch.Tensor) -> None:
    """The sums of the episodes that ended in a [T, N] rollout into `episodes` (common.stats.episode_sums, the running
    return and length of each env in `ep_stats`): the game's score where the env reports one apart from the learner's
    rewards (with_game_score), the learner's own returns otherwise."""
    episode_sums(ep_stats, data.get("game_rewards", data["rewards"]), data.get("game_over", dones), sums=episodes)


def rollout_nonfinite(data: TensorDict) -> dict:
    """The NaN guard's counts of a rollout, by name: the non-finite entries of its policy observations and rewards."""
    return {"observations": nonfinite(data["obs", "policy"]), "rewards": nonfinite(data["rewards"])}


def add_update_means(stats: dict, loss_sums: dict, num_updates: int) -> None:
    """The mean over an update's `num_updates` minibatches of each loss summed in `loss_sums`, by name, into
    stats["losses"], and how many of them are non-finite into stats["nonfinite"] (the NaN guard's "losses")."""
    means = {name: total / num_updates for name, total in loss_sums.items()}
    add_to(stats["losses"], means)
    add_to(stats["nonfinite"], {"losses": (~torch.isfinite(torch.stack(list(means.values())))).sum()})


def compile_and_capture(
    run: Run,
    envs,
    env_step: Callable,
    step_parts: dict[str, Callable],
    update_minibatch: Callable,
    targets_fn: Callable,
    rollout_fn: Callable,
    update_fn: Callable,
) -> tuple:
    """The iteration's functions compiled (--compile) and captured (--cudagraphs), each unchanged, returned in the
    order given (`step_parts` as a tuple of its values): the script rebinds its names to them, which the functions
    that call them read at each call. A built-in env steps inside the graph: the whole rollout is one, its env step
    compiled. An adapter's simulator cannot be captured: its step runs eagerly between the captured acting steps, and
    each of `step_parts` (the functions the env step calls on the device, by the name the run says: "acting", ...) is
    compiled and captured alone. The targets and every epoch of the update are one graph (the batch never leaves
    it), except with --target-kl: the epoch loop reads the KL on the host, so the targets and each minibatch update
    are captured alone."""
    if whole_rollout := getattr(envs, "capturable", False):
        env_step = compiled(run, env_step)
    else:
        step_parts = {name: captured(run, name, compiled(run, fn)) for name, fn in step_parts.items()}
    update_minibatch, targets_fn = compiled(run, update_minibatch), compiled(run, targets_fn)
    if (target_kl := getattr(run.args, "target_kl", None)) is not None:  # ppo_lstm, distill and pqn have none
        targets_fn = captured(run, "targets", targets_fn)
        update_minibatch = captured(run, "minibatch update", update_minibatch)
    rollout_fn = captured(run, "rollout", rollout_fn, capture=whole_rollout)
    if target_kl is None:
        update_fn = captured(run, "update", update_fn)
    return env_step, tuple(step_parts.values()), update_minibatch, targets_fn, rollout_fn, update_fn


def begin_iterations(run: Run, global_batch: int, envs) -> None:
    """begin_training with ppo's, ppo_rnd's and pqn's start line: the batch, its minibatches and what the CUDA graphs
    hold (a built-in env's whole rollout, as compile_and_capture captures it)."""
    args = run.args
    minibatch = minibatch_size(args, args.num_envs * args.num_steps)
    said = f"batch {global_batch} per iteration ({args.num_minibatches} minibatches of {minibatch} per process)"
    begin_training(run, said, global_batch, graphs_said(args, getattr(envs, "capturable", False)))


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


def say_storage_once(run: Run, storage: RolloutStorage) -> None:
    """The storage's layout (images: uint8), said once per process, after its first rollout has laid it out."""
    if run.iteration == run.iteration_at_start + 1:
        run.say(storage.describe())


def end_iteration(run: Run, stats: dict, local: dict, eval_envs, policy, state, next_obs, kinds=("losses",)) -> bool:
    """The end of an iteration, after its update and its steps counted (run.global_step), the same decisions on every
    rank (what_is_due): the log when due (every --log-interval iterations, and before an evaluation or a save: one
    host read) of the iterations since the last log (their steps since then, run.reduced_step), then the evaluation
    and checkpoints due (evaluate_and_save). True when the run stops here. A collective."""
    due = what_is_due(run, final_iteration=run.global_step >= run.final_step)  # begin_training set run.final_step
    if due.log:
        iterations_in_stats = (run.global_step - run.reduced_step) // run.steps_per_iteration
        log_iteration(run, stats, iterations_in_stats, local, kinds)
    return evaluate_and_save(run, due, eval_envs, policy, state, next_obs)
