"""The wiring td3.py and sac.py share around their algorithm: the checks of a replay run's flags and action space,
the step of every env and its replay write, the phases of the actor's schedule, which of the iteration's functions
are compiled and captured, the normalizers' folds up to the first update, and the loop's log, evaluation and save.

    capacity = replay_capacity(args)                        # slots per env, checked against --n-step
    low, high = action_bounds(envs, args, ALGO)             # a bounded Box, which a tanh policy is scaled to
    obs_dim, critic_dim = obs_dims(next_obs, args, "td3.py")
    action, next_obs, reward, terminated, truncated, info = act_and_step(envs, agent, policy, bf16, obs)
    next_obs, done = store(run, buffer, ep_stats, stats, obs, action, next_obs, reward, terminated, truncated, info)
    actor_at, phases = actor_schedule(num_updates, policy_frequency)
    collect_policy, collect_random, update_fn, whole_step = compile_and_capture(
        run, envs, agent, acting, collect, critic_step, actor_step, update, actor_at, phases)
    description, graphs = described(args, capacity, whole_step, phases)   # the start line's words
    ready = replay_ready(run, buffer)                       # before the loop; in it:
    ready = fold_and_ready(run, buffer, counters, obs_normalizers, reward_normalizer, ready)
    if log_eval_save(run, final_iteration, stats, updates, eval_envs, agent_inference, state, next_obs): break

The networks, losses, targets, the acting policy and the update steps stay in the scripts: what is here takes
them as arguments. The scripts import these names (tests/benchmarks/gpu_check.py wraps a script's
`log_eval_save`, where its host reads start).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import torch
from tensordict import TensorDict

from common.capture import captured, compiled
from common.checkpoint import save
from common.evaluation import evaluate
from common.nets import vector_size
from common.normalize import RunningMeanStd
from common.run import checkpoints_to_write, what_is_due
from common.stats import add_to, episode_sums, log, record_env_log, reduce_iteration, zero_

if TYPE_CHECKING:
    from common.record import Run


def replay_capacity(args) -> int:
    """Slots per env of the replay buffer (--buffer-size over --num-envs): a clear error when an n-step window
    does not fit in them."""
    capacity = args.buffer_size // args.num_envs
    if capacity < args.n_step:
        raise SystemExit(
            f"error: --buffer-size {args.buffer_size} gives {capacity} slots per env for {args.num_envs} envs, "
            f"fewer than --n-step {args.n_step}; raise --buffer-size to at least {args.n_step * args.num_envs}"
        )
    return capacity


def action_bounds(envs, args, algo: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The low and high bounds (float32 tensors) of the envs' Box action space, which a tanh policy is scaled
    to: a clear error for an unbounded one."""
    space = envs.single_action_space
    if not space.is_bounded():
        raise SystemExit(
            f"error: {algo}.py scales a tanh policy to the action bounds, but {args.env_id}'s action space {space} is "
            "unbounded"
        )
    return tuple(torch.as_tensor(b, dtype=torch.float32) for b in (space.low, space.high))


def obs_dims(obs: TensorDict, args, script: str) -> tuple[int, int | None]:
    """Sizes of the policy's observations and of the critics' own ('critic' group, with --asymmetric-critic where
    the env provides one; else None: the critics take the policy's)."""
    critic = args.asymmetric_critic and "critic" in obs.keys()
    return vector_size(obs, "policy", script), vector_size(obs, "critic", script) if critic else None


def act_and_step(envs, agent, policy, bf16: bool, obs: TensorDict):
    """An action in [-1, 1] from `policy(obs)`, or uniform ones (the warm-up) when `policy` is None,
    and one step of every env with it, scaled to the env's bounds (`agent.to_env`)."""
    device = agent.action_scale.device
    if policy is None:
        action = torch.rand(envs.num_envs, agent.action_scale.shape[0], device=device) * 2 - 1
    else:
        # no autocast cache: a captured acting step must cast the weights itself at every replay
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16, cache_enabled=False):
            action = policy(obs)
    return action, *envs.step(agent.to_env(action))


def new_stats(device: torch.device) -> dict:
    """The sums the loop gathers between two logs, by name: finished episodes, the critic's and the actor's
    statistics (what their steps return), the non-finite counts of the collected data."""
    return {"episodes": torch.zeros(3, device=device, dtype=torch.float64), "critic": {}, "actor": {}, "nonfinite": {}}


def store(run: Run, buffer, ep_stats, stats: dict, obs, action, next_obs, reward, terminated, truncated, info):
    """Write the transition into the replay buffer (its device half: the loop advances the host copy), and add
    the episode statistics and the non-finite counts to `stats`. No host read. Returns the next observation and
    which episodes ended."""
    done = terminated | truncated
    # The true next observation: the final one where the episode ended (next_obs has reset).
    real_next_obs = torch.where(done, info["final_obs"], next_obs)
    buffer.write(
        TensorDict(
            {
                "obs": obs,
                "actions": action,
                "rewards": reward.float(),
                "terminated": terminated,
                "truncated": truncated,
                "next_obs": real_next_obs,
            },
            batch_size=[buffer.num_envs],
        )
    )
    episode_sums(ep_stats, reward.unsqueeze(0), done.unsqueeze(0), sums=stats["episodes"])
    add_to(
        stats["nonfinite"],
        {"observations": (~torch.isfinite(real_next_obs["policy"])).sum(), "rewards": (~torch.isfinite(reward)).sum()},
    )
    record_env_log(run, info)
    return next_obs, done


def actor_schedule(num_updates: int, policy_frequency: int) -> tuple[dict[int, tuple[int, ...]], int]:
    """The actor steps after every policy_frequency-th critic step of the run: which steps of an iteration those
    are depends on its phase (critic steps before it, mod policy_frequency). {phase: the critic steps of an
    iteration the actor follows}, and how many distinct phases the run meets (one update function is captured
    per phase: a single one when num_updates is a multiple of policy_frequency)."""
    actor_at = {
        p: tuple(i for i in range(num_updates) if (p + i + 1) % policy_frequency == 0) for p in range(policy_frequency)
    }
    return actor_at, policy_frequency // math.gcd(num_updates, policy_frequency)


def compile_and_capture(
    run: Run,
    envs,
    agent,
    acting: Callable,
    collect: Callable,
    critic_step: Callable,
    actor_step: Callable,
    update: Callable,
    actor_at: dict,
    phases: int,
) -> tuple:
    """The iteration's functions compiled (--compile) and captured (--cudagraphs), each unchanged: `acting(obs)`, the
    policy's action in [-1, 1]; `collect(step, obs)`, one step of every env by `step` (act_and_step with `agent`, the
    acting policy, or with uniform actions) and its replay write, returning the next observation; the critic's and the
    actor's steps; `update(critic_step, actor_step, at)`, an iteration's updates, the actor after the critic steps `at`.
    A built-in env steps inside the graph: acting, env step and replay write are one, the policy's step compiled with
    the env's (the random warm-up's is not worth a compile). An adapter's simulator cannot be captured: it steps
    eagerly after the captured acting. One update function is captured per phase of the actor's schedule (`actor_at`
    and `phases`, actor_schedule's). Returns (collect with the policy, collect with uniform actions, {phase: update},
    whether the whole step is captured)."""
    whole_step = getattr(envs, "capturable", False)
    if not whole_step:
        acting = captured(run, "acting", compiled(run, acting))
    policy_step = lambda obs: act_and_step(envs, agent, acting, run.args.bf16, obs)
    if whole_step:
        policy_step = compiled(run, policy_step)
    random_step = lambda obs: act_and_step(envs, agent, None, False, obs)  # uniform actions
    collect_policy = captured(run, "step", lambda obs: collect(policy_step, obs), capture=whole_step)
    collect_random = captured(run, "random step", lambda obs: collect(random_step, obs), capture=whole_step)
    critic_step, actor_step = compiled(run, critic_step), compiled(run, actor_step)

    def update_at(at: tuple[int, ...]) -> Callable:
        return lambda: update(critic_step, actor_step, at)

    update_fn = {
        phase: captured(run, "update" if phases == 1 else f"update, phase {phase}", update_at(at))
        for phase, at in actor_at.items()
    }
    return collect_policy, collect_random, update_fn, whole_step


def described(args, capacity: int, whole_step: bool, phases: int) -> tuple[str, str]:
    """What the start line says of the run (begin_training's description) and of what --cudagraphs captures."""
    description = f"{args.num_updates} updates of batch {args.batch_size} per step; {capacity} buffer slots per env"
    if not args.cudagraphs:
        return description, "off"
    return description, (
        f"{'each env step with acting and replay write' if whole_step else 'each acting step'}, all "
        f"{args.num_updates} updates of an iteration ({phases} graph{'s' if phases > 1 else ''}: one per phase of "
        "the actor's schedule)"
    )


def replay_ready(run: Run, buffer) -> bool:
    """Whether the updates run: an n-step window in every env, and --learning-starts env steps (all ranks) stored."""
    args = run.args
    return len(buffer) >= args.n_step and len(buffer) * args.num_envs * run.world_size >= args.learning_starts


def fold_and_ready(run: Run, buffer, counters: dict, obs_normalizers: dict, reward_normalizer, was_ready: bool) -> bool:
    """Fold the transitions since the last fold into the normalizers (`obs_normalizers`: group -> the agent's
    normalizer, or an Identity without --obs-norm; `reward_normalizer` with --reward-norm) every --log-interval and
    as the updates start; returns whether they run (`replay_ready`). A collective where it folds."""
    ready = replay_ready(run, buffer)
    if run.iteration % run.args.log_interval == 0 or (ready and not was_ready):
        buffer.fold_into(
            min(run.iteration - counters["last_fold"], len(buffer)),
            {group: m for group, m in obs_normalizers.items() if isinstance(m, RunningMeanStd)},
            reward_normalizer if run.args.reward_norm else None,
        )
        counters["last_fold"] = run.iteration
    return ready


def log_eval_save(
    run: Run, final_iteration: bool, stats: dict, updates: dict, eval_envs, agent, state, next_obs
) -> bool:
    """Once per log interval (and before evals and saves): the means of the critic's and the actor's statistics
    over their `updates` (losses/<name>), the episodes and the NaN guard in one host read; then the evaluation
    of `agent` and the checkpoints that are due (the same decisions on every rank). Zeroes the sums and
    `updates`; returns whether the run stops."""
    due = what_is_due(run, final_iteration)
    if not due.log:
        return False
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
    zero_(stats)
    updates.update(critic=0, actor=0)
    if due.eval:
        evaluate(run, eval_envs, agent)
    if names := checkpoints_to_write(run, due):
        save(run, names, state, next_obs)
    return bool(run.stop_reason)
