"""Plumbing td3.py and sac.py share, plain functions their loops call. tests/benchmarks/gpu_check.py wraps a script's
`log_eval_save`, where its host reads start."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from tensordict import TensorDict

from common.checkpoint import save
from common.evaluation import evaluate
from common.nets import vector_size
from common.run import checkpoints_to_write, what_is_due
from common.stats import log, reduce_iteration, zero_

if TYPE_CHECKING:
    from common.record import Run


def replay_capacity(args) -> int:
    """Slots per env of the replay buffer (--buffer-size over --num-envs); an error when an n-step window won't fit."""
    capacity = args.buffer_size // args.num_envs
    if capacity < args.n_step:
        raise SystemExit(
            f"error: --buffer-size {args.buffer_size} gives {capacity} slots per env for {args.num_envs} envs, "
            f"fewer than --n-step {args.n_step}; raise --buffer-size to at least {args.n_step * args.num_envs}"
        )
    return capacity


def action_bounds(envs, args, algo: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 low and high bounds of the Box action space a tanh policy is scaled to; an error if unbounded."""
    space = envs.single_action_space
    if not space.is_bounded():
        raise SystemExit(
            f"error: {algo}.py scales a tanh policy to the action bounds, but {args.env_id}'s action space {space} is "
            "unbounded"
        )
    return tuple(torch.as_tensor(b, dtype=torch.float32) for b in (space.low, space.high))


def obs_dims(obs: TensorDict, args, script: str) -> tuple[int, int | None]:
    """Sizes of the policy's observations and of the critics' own (the 'critic' group, else None: the policy's)."""
    critic = args.asymmetric_critic and "critic" in obs.keys()
    return vector_size(obs, "policy", script), vector_size(obs, "critic", script) if critic else None


def new_stats(device: torch.device, update_count: int) -> dict:
    """The sums the loop gathers between two logs: episodes, the critic's and actor's statistics, non-finite counts;
    and the run's critic updates at the last log (`update_count` to start: a resumed run's)."""
    sums = {"episodes": torch.zeros(3, device=device, dtype=torch.float64), "critic": {}, "actor": {}, "nonfinite": {}}
    return {**sums, "logged_updates": update_count}


def log_eval_save(
    run: Run, final_iteration: bool, stats: dict, updates: tuple[int, int], eval_envs, agent, state, next_obs
) -> bool:
    """Once per log interval: the critic's and actor's mean statistics over their steps since the last log, the
    episodes and the NaN guard in one host read, then the evaluation and checkpoints due (the same decisions on every
    rank: a collective). `updates`: the run's critic steps so far and the critic steps per actor step (the actor
    steps after every policy_frequency-th). Zeroes the sums; returns whether the run stops."""
    due = what_is_due(run, final_iteration)
    if not due.log:
        return False
    (critic_steps, policy_frequency), logged = updates, stats["logged_updates"]
    updates = {"critic": critic_steps - logged, "actor": critic_steps // policy_frequency - logged // policy_frequency}
    means = {
        f"losses/{name}": total / updates[part]
        for part in ("critic", "actor")
        if updates[part]
        for name, total in stats[part].items()
    }
    checks = {
        **{name: count == 0 for name, count in stats["nonfinite"].items()},
        **{name: torch.isfinite(total) for part in ("critic", "actor") for name, total in stats[part].items()},
    }
    log(run, reduce_iteration(run, episodes=stats["episodes"], means=means, checks=checks))
    zero_({part: stats[part] for part in ("episodes", "critic", "actor", "nonfinite")})
    stats["logged_updates"] = critic_steps
    if due.eval:
        evaluate(run, eval_envs, agent)
    if names := checkpoints_to_write(run, due):
        save(run, names, state, next_obs)
    return bool(run.stop_reason)
