"""Plumbing the rollout-based scripts (the PPO family, distill.py, pqn.py) call around their algorithm, in view in
their loops."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from tensordict import TensorDict

from common.checkpoint import save
from common.evaluation import evaluate
from common.run import Due, checkpoints_to_write
from common.stats import add_to, episode_sums, log, nonfinite, reduce_iteration, zero_

if TYPE_CHECKING:
    from common.buffer import RolloutStorage
    from common.record import Run


def iteration_stats(device, kinds: tuple[str, ...] = ("losses",)) -> dict:
    """What an iteration's compiled functions gather on the device for log_iteration: "episodes" (episode_sums), one
    dict of named sums per kind (add_to), "nonfinite" (the NaN guard's counts)."""
    return {"episodes": torch.zeros(3, device=device, dtype=torch.float64), **{k: {} for k in kinds}, "nonfinite": {}}


def with_game_score(transition: dict, info: dict) -> dict:
    """Atari: a life is the learner's episode, the game's score is what is logged. Where the env's info has the game's
    reward and end (Atari's presets), the transition keeps them beside the learner's reward and done."""
    if "game_over" in info:
        transition.update(game_rewards=info["game_reward"].float(), game_over=info["game_over"])
    return transition


def rollout_episodes(data: TensorDict, dones: torch.Tensor, ep_stats: torch.Tensor, episodes: torch.Tensor) -> None:
    """The sums of the episodes that ended in a [T, N] rollout into `episodes`: the game's score where there is one."""
    episode_sums(ep_stats, data.get("game_rewards", data["rewards"]), data.get("game_over", dones), sums=episodes)


def rollout_nonfinite(data: TensorDict) -> dict:
    """The NaN guard's counts of a rollout, by name: the non-finite entries of its policy observations and rewards."""
    return {"observations": nonfinite(data["obs", "policy"]), "rewards": nonfinite(data["rewards"])}


def add_update_means(stats: dict, loss_sums: dict, num_updates: int) -> None:
    """Each loss's mean over an update's `num_updates` minibatches into stats["losses"]; the non-finite ones counted."""
    means = {name: total / num_updates for name, total in loss_sums.items()}
    add_to(stats["losses"], means)
    add_to(stats["nonfinite"], {"losses": (~torch.isfinite(torch.stack(list(means.values())))).sum()})


def log_iteration(run: Run, stats: dict, iterations: int, local: dict, kinds: tuple[str, ...] = ("losses",)) -> None:
    """Log the statistics gathered on the device since the last log, over all ranks in one host read, then zero them.
    The means over `iterations` are tagged kind/name (a name with its own tag keeps it). A collective."""
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
