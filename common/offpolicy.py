"""Plumbing td3.py and sac.py share, plain functions their loops call: the replay's size and the action space's
checks, the observation sizes, the statistics' sums and the loop's log/eval/save. tests/benchmarks/gpu_check.py
wraps a script's `log_eval_save`, where its host reads start."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from tensordict import TensorDict

from common.checkpoint import save
from common.evaluation import evaluate
from common.nets import vector_size
from common.run import checkpoints_to_write, what_is_due
from common.stats import add_to, log, reduce_iteration, zero_

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


def new_stats(device: torch.device) -> dict:
    """The sums the loop gathers on the device between two logs: "episodes" (episode_sums), "nonfinite" (the NaN
    guard's counts), and one dict of named sums per part of the update, "critic" and "actor" (add_step adds into
    them; a copy may add a part of its own)."""
    return {"episodes": torch.zeros(3, device=device, dtype=torch.float64), "critic": {}, "actor": {}, "nonfinite": {}}


def add_step(sums: dict, values: dict) -> None:
    """One step's statistics, by name, into `sums` (common.stats.add_to), and the step counted there, as "steps":
    log_eval_save logs each statistic's mean over the steps counted since the last log. Where a part steps, in the
    update's graph: no host read."""
    first = next(iter(values.values()))
    add_to(sums, {**values, "steps": torch.ones((), device=first.device)})


def log_eval_save(
    run: Run, final_iteration: bool, stats: dict, eval_envs, agent, state, next_obs, local: dict | None = None
) -> bool:
    """Once per log interval: each part's mean statistics over its steps since the last log (losses/<name>; a name
    with its own tag keeps it; a part that made no step logs nothing), the script's own scalars `local` ({tag:
    tensor or number} as they are now, e.g. charts/policy_noise), the episodes and the NaN guard in one host read,
    then the evaluation and checkpoints due (the same decisions on every rank: a collective). Zeroes the sums;
    returns whether the run stops."""
    due = what_is_due(run, final_iteration)
    if not due.log:
        return False
    parts = [part for part, sums in stats.items() if isinstance(sums, dict) and part != "nonfinite"]
    # the sums and the step counts over all ranks; the means are taken once they are read (where a part stepped)
    sums = {(part, name): total for part in parts for name, total in stats[part].items()}
    checks = {
        **{name: count == 0 for name, count in stats["nonfinite"].items()},
        **{name: torch.isfinite(total) for (part, name), total in sums.items() if name != "steps"},
    }
    means = {f"{part}/{name}": total for (part, name), total in sums.items()}
    reduced = reduce_iteration(run, episodes=stats["episodes"], means=means, checks=checks, local=local)
    logged = {tag: value for tag, value in reduced.items() if tag not in means}
    for part, name in sums:
        steps = reduced[f"{part}/steps"]
        if name != "steps" and steps:
            logged[name if "/" in name else f"losses/{name}"] = reduced[f"{part}/{name}"] / steps
    log(run, logged)
    zero_(stats)
    if due.eval:
        evaluate(run, eval_envs, agent)
    if names := checkpoints_to_write(run, due):
        save(run, names, state, next_obs)
    return bool(run.stop_reason)
