"""TD3 for massively parallel, GPU-resident environments (FastTD3 style).

    torchrun --nproc-per-node 8 algos/td3.py --env-id <task> --num-envs 1024 --batch-size 32768
    python algos/td3.py --env-id Pendulum-v1 --device cpu     # CPU defaults: 32 envs, batches of 512

Top to bottom: Args -> networks (ensemble critics, C51 projection, Agent) -> the TD target's inputs (n_step_batch: the
n-step return, the bootstrap, the normalization, from the replay's windows) and the losses -> the loop's pieces (the
exploration noise, the replay write, the delayed actor's schedule, when learning starts) -> train (setup; the
iteration's functions: acting, the env step with its replay write and the normalizers' fold, the critic and actor
steps, the update; the block that compiles and captures them in place; the loop: warm-up or act, step, store ->
update, the critic every step and the actor on its delay -> log, eval, save). An iteration is one step of every env
(`--num-envs` per process) followed by `--num-updates` gradient updates on large replay batches. Continuous actions.
common/offpolicy.py holds the plumbing td3.py and sac.py share (the replay's size and action-space checks, the
observation sizes, the loop's log/eval/save).
References: Fujimoto et al. 2018 (TD3); Bellemare et al. 2017 (C51); Seo et al. 2025 (FastTD3).
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import gymnasium as gym
import torch
import torch.nn as nn
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
if importlib.util.find_spec("common") is None:
    sys.exit(
        f"error: {Path(__file__).name} needs the project's common/ package: keep it in algos/, or pip install -e ."
    )

from common import distributed  # noqa: E402
from common.args import Ge, Gt, Le, RunArgs, parse_args  # noqa: E402
from common.buffer import ReplayBuffer  # noqa: E402
from common.capture import acting_autocast, captured, compiled, timed, unwrapped_calls  # noqa: E402
from common.checkpoint import TrainingState, restore  # noqa: E402
from common.evaluation import eval_only  # noqa: E402
from common.nets import EnsembleLinear, agent_and_twin, mlp  # noqa: E402
from common.normalize import (  # noqa: E402
    RewardNormalizer,
    RunningMeanStd,
    Unnormalized,
    normalize_groups,
    update_group_statistics,
)
from common.offpolicy import action_bounds, add_step, log_eval_save, new_stats, obs_dims, replay_capacity  # noqa: E402
from common.run import begin_training, closing, finish, make_envs, open_run, start_run  # noqa: E402
from common.settings import fasttd3_settings  # noqa: E402
from common.stats import add_to, episode_sums, record_env_log  # noqa: E402

ALGO = "td3"


@dataclass
class Args(RunArgs):
    env_id: str = "Pendulum-v1"
    """environment id with a continuous (Box) action space: a built-in env or an adapter prefix (gym:..., mjlab:...)"""
    num_envs: int | None = None
    """envs per process; default 1024 on CUDA, 32 elsewhere"""
    total_timesteps: int = 10_240_000  # whole iterations of either default num_envs (1024 or 32)
    save_interval: int = 2000
    save_buffer: bool = False
    """store every rank's replay buffer in last.pt, so that --resume continues bit-exactly (large files)"""
    eval_interval: int = 500
    log_interval: int = 100
    """iterations between log writes, NaN checks and stop checks (the loop's host reads); nothing else hangs on it"""
    bf16: bool = False
    """run the networks under bfloat16 autocast (losses, targets and parameters stay float32)"""

    # --- TD3 ---
    buffer_size: Annotated[int, Ge(1)] = 1_000_000
    """replay capacity per process in transitions (buffer_size // num_envs per env)"""
    batch_size: Annotated[int | None, Ge(1)] = None
    """transitions per gradient update, per process; default 32768 on CUDA, 512 elsewhere"""
    num_updates: Annotated[int, Ge(1)] = 2
    """gradient updates of the critics per iteration (one vectorised env step)"""
    learning_starts: Annotated[int, Ge(0)] = 10_000
    """env steps (all processes) of uniform random actions before the first update"""
    gamma: Annotated[float, Ge(0), Le(1)] = 0.99
    """discount factor"""
    tau: Annotated[float, Ge(0), Le(1)] = 0.1
    """soft target update rate: target <- target + tau * (online - target), after every critic update"""
    n_step: Annotated[int, Ge(1)] = 3
    """n-step returns (cut at episode ends)"""
    policy_lr: Annotated[float, Gt(0)] = 3e-4
    """Adam learning rate of the actor"""
    q_lr: Annotated[float, Gt(0)] = 3e-4
    """Adam learning rate of the critics"""
    policy_frequency: Annotated[int, Ge(1)] = 2
    """critic updates per actor update (TD3's delayed policy update)"""
    std_min: Annotated[float, Ge(0)] = 0.001
    """smallest exploration noise std (per env, drawn uniformly in [std_min, std_max] at every episode start)"""
    std_max: Annotated[float, Ge(0)] = 0.4
    """largest exploration noise std, in units of the half action range"""
    policy_noise: Annotated[float, Ge(0)] = 0.2
    """std of the target policy smoothing noise"""
    noise_clip: Annotated[float, Ge(0)] = 0.5
    """clip of the target policy smoothing noise"""
    hidden_sizes: Annotated[tuple[int, ...], Ge(1)] = (256, 256)
    """hidden layer sizes of the actor"""
    critic_hidden_sizes: Annotated[tuple[int, ...] | None, Ge(1)] = None
    """hidden layer sizes of each critic; default: --hidden-sizes"""
    distributional: bool = False
    """C51 critics: a categorical return distribution on --num-atoms atoms in [--v-min, --v-max]"""
    num_atoms: Annotated[int, Ge(1)] = 101
    """atoms of the distributional critic"""
    v_min: float = -250.0
    """lowest atom (in reward units after --reward-norm)"""
    v_max: float = 250.0
    """highest atom"""
    asymmetric_critic: bool = True
    """feed the critics the env's 'critic' observations when it provides them"""
    obs_norm: bool = True
    """normalize observations with running statistics of the collected data"""
    obs_clip: Annotated[float, Gt(0)] = 10.0
    """clip normalized observations to [-obs_clip, obs_clip]"""
    reward_norm: bool = False
    """scale rewards by the running std of the discounted return"""
    reward_clip: Annotated[float, Gt(0)] = 10.0
    """clip normalized (n-step) rewards to [-reward_clip, reward_clip]"""


# Named settings (common.settings): the set of the env id's family unless --settings names another; flags given win.
# mujoco: gymnasium MuJoCo on a CPU: 1-step returns, Adam at 1e-3 (Fujimoto et al.), 8 updates of 256 per step of 32
# envs (0.25 per transition: the replay of few envs turns over slowly, each step may learn more), the target critics
# at Fujimoto et al.'s and CleanRL's tau 0.005 (at 0.1 with 8 updates a critic diverged once in every Ant seed) and no
# observation normalization (CleanRL's; ahead on Ant at 100k steps). The updates cost twice those of 4 per env step.
# Humanoid-v5 needs --obs-norm: its contact forces reach thousands and saturate the actor's tanh.
SETTINGS = {
    "mujoco": dict(
        total_timesteps=1_000_000,  # CleanRL's MuJoCo budget (31,250 iterations of 32 envs)
        num_envs=32,
        batch_size=256,
        num_updates=8,
        tau=0.005,
        obs_norm=False,
        n_step=1,
        q_lr=1e-3,
        policy_lr=1e-3,
        num_eval_envs=10,
        eval_interval=1563,
    ),
    "task": fasttd3_settings,  # a Playground task: FastTD3's published settings (its Playground defaults, its tasks')
}

# Sizes resolved once the device is known: (on CUDA, elsewhere). The CUDA ones are FastTD3's; a CPU, where the env
# steps and the updates share the cores, takes fewer envs (more updates per env step) and smaller batches.
DEVICE_DEFAULTS = {"num_envs": (1024, 32), "batch_size": (32768, 512)}

NUM_CRITICS = 2  # clipped double Q


# ----------------------------------------------------------------------------------------------
# Networks (ReLU MLPs; the critics an ensemble of them, common/nets.py)
# ----------------------------------------------------------------------------------------------
def categorical_projection(
    probs: torch.Tensor, rewards: torch.Tensor, bootstrap: torch.Tensor, v_min: float, v_max: float
) -> torch.Tensor:
    """C51's projection of the distribution of rewards + bootstrap * Z back onto Z's atoms.

    probs [..., B, A] on A evenly spaced atoms in [v_min, v_max]; rewards, bootstrap [B]
    (bootstrap = discount * (1 - terminated)). Each shifted atom is clamped to the support
    and splits its mass between its two neighbouring atoms in proportion to the distance,
    with two scatter_adds for the whole batch. Mass is preserved row by row.
    """
    num_atoms = probs.shape[-1]
    atoms = torch.linspace(v_min, v_max, num_atoms, device=probs.device, dtype=probs.dtype)
    shifted = (rewards.unsqueeze(-1) + bootstrap.unsqueeze(-1) * atoms).clamp(v_min, v_max)  # [B, A]
    pos = (shifted - v_min) / ((v_max - v_min) / (num_atoms - 1))  # fractional atom index in [0, A-1]
    # A NaN reward gives a NaN position: index with 0 there and let the NaN flow into the target
    # (and the loss), where the NaN guard names it, instead of an out-of-bounds index.
    lower = torch.nan_to_num(pos.floor(), nan=0.0).clamp(0, num_atoms - 1)
    frac = pos - lower  # share of the upper neighbour; 0 when the atom lands exactly on one
    lower_idx = lower.long().expand_as(probs)
    upper_idx = (lower.long() + 1).clamp(max=num_atoms - 1).expand_as(probs)
    out = torch.zeros_like(probs)
    out.scatter_add_(-1, lower_idx, probs * (1 - frac))
    out.scatter_add_(-1, upper_idx, probs * frac)
    return out


class Agent(nn.Module):
    """Deterministic tanh actor, an ensemble of critics and its target, the observation normalizers
    and the action bounds: one state_dict holds all. Actions live in [-1, 1]; `to_env` scales them."""

    def __init__(self, obs_dim: int, critic_obs_dim: int | None, low: torch.Tensor, high: torch.Tensor, args: Args):
        super().__init__()
        act_dim = low.shape[0]
        self.critic_key = "critic" if critic_obs_dim is not None else "policy"
        self.actor = nn.Sequential(mlp(obs_dim, act_dim, args.hidden_sizes), nn.Tanh())
        self.num_out = args.num_atoms if args.distributional else 1
        self.critic = mlp(
            (critic_obs_dim or obs_dim) + act_dim,
            self.num_out,
            args.critic_hidden_sizes or args.hidden_sizes,
            linear=functools.partial(EnsembleLinear, NUM_CRITICS),
        )
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.register_buffer("action_scale", (high - low) / 2)
        self.register_buffer("action_bias", (high + low) / 2)
        self.register_buffer(
            "atoms", torch.linspace(args.v_min, args.v_max, args.num_atoms) if args.distributional else torch.zeros(0)
        )
        clip = args.obs_clip
        self.obs_rms = RunningMeanStd(obs_dim, clip=clip) if args.obs_norm else Unnormalized()
        self.critic_obs_rms = (
            RunningMeanStd(critic_obs_dim, clip=clip) if args.obs_norm and critic_obs_dim else Unnormalized()
        )

    normalize = normalize_groups  # each group through its own statistics (common.normalize)

    def q_out(self, critic: nn.Module, obs_n: TensorDict, action: torch.Tensor) -> torch.Tensor:
        """[E, B] Q-values, or [E, B, A] logits of the return distribution (distributional)."""
        out = critic(torch.cat([obs_n[self.critic_key], action], -1)).float()  # float32 even under bf16 autocast
        return out if self.num_out > 1 else out.squeeze(-1)

    def q_value(self, out: torch.Tensor) -> torch.Tensor:
        return (out.softmax(-1) * self.atoms).sum(-1) if self.num_out > 1 else out

    def act(self, obs: TensorDict, noise_std: torch.Tensor | None = None) -> torch.Tensor:
        """Action in [-1, 1]; with `noise_std` ([N, 1]) plus Gaussian exploration noise, clipped."""
        action = self.actor(self.obs_rms(obs["policy"])).float()
        if noise_std is not None:
            action = (action + torch.randn_like(action) * noise_std).clamp(-1.0, 1.0)
        return action

    def to_env(self, action: torch.Tensor) -> torch.Tensor:
        return action * self.action_scale + self.action_bias

    def deterministic(self, policy_obs: torch.Tensor) -> torch.Tensor:
        """The evaluated (and exported) policy on raw observations: the actor's action in the env's units."""
        return self.to_env(self.actor(self.obs_rms(policy_obs)).float())


# ----------------------------------------------------------------------------------------------
# The TD target's inputs and the losses
# ----------------------------------------------------------------------------------------------
def n_step_batch(agent: Agent, window: TensorDict, reward_normalizer: RewardNormalizer, args: Args) -> TensorDict:
    """A batch of replay windows (common/buffer.py samples them as stored: the first transition's obs and action, the
    n rewards and episode ends, `included`: the window up to its first episode end, `next_obs`: the observation after
    the last included transition) as the critic's target reads it: the n-step return, the discounted sum of the
    included rewards, scaled by the running std of the return with --reward-norm; the bootstrap factor
    gamma ** (included steps), 0 where the window ends in a termination (a truncated episode still bootstraps from its
    true last observation); both observations normalized with the statistics the policy acts with."""
    included = window["included"]  # [B, n]
    discounts = args.gamma ** torch.arange(included.shape[1], device=included.device).to(window["rewards"].dtype)
    rewards = (window["rewards"] * discounts * included).sum(1)
    if args.reward_norm:
        rewards = reward_normalizer.normalize(rewards)
    terminated = (window["terminated"] & included).any(1)  # the last included transition ended the episode so
    bootstrap = args.gamma ** included.sum(1).to(discounts.dtype) * ~terminated
    return TensorDict(
        obs_n=agent.normalize(window["obs"]),
        next_obs_n=agent.normalize(window["next_obs"]),
        actions=window["actions"],
        rewards=rewards,
        bootstrap=bootstrap.float(),
        batch_size=window.batch_size,
        device=included.device,
    )


def critic_loss(agent: Agent, b: TensorDict, args: Args):
    """Clipped double-Q regression on the n-step target with target policy smoothing (or C51's
    cross-entropy on the projected distribution); returns the loss and the mean Q."""
    with torch.no_grad(), torch.autocast(b.device.type, dtype=torch.bfloat16, enabled=args.bf16):
        # Target policy smoothing: the current actor's action plus clipped noise.
        noise = (torch.randn_like(b["actions"]) * args.policy_noise).clamp(-args.noise_clip, args.noise_clip)
        next_action = (agent.actor(b["next_obs_n", "policy"]).float() + noise).clamp(-1.0, 1.0)
        next_out = agent.q_out(agent.critic_target, b["next_obs_n"], next_action)
        if args.distributional:
            projected = categorical_projection(
                next_out.softmax(-1), b["rewards"], b["bootstrap"], args.v_min, args.v_max
            )
            # Clipped double Q: every critic learns the projected distribution with the lowest mean.
            lowest = agent.q_value(next_out).argmin(0)  # [B]
            target = projected.gather(0, lowest.view(1, -1, 1).expand(1, *projected.shape[1:])).squeeze(0)
        else:
            target = b["rewards"] + b["bootstrap"] * next_out.min(0).values
    with torch.autocast(b.device.type, dtype=torch.bfloat16, enabled=args.bf16):
        out = agent.q_out(agent.critic, b["obs_n"], b["actions"])
    if args.distributional:
        q_loss = -(target * out.log_softmax(-1)).sum(-1).mean(-1).sum()  # cross-entropy, summed over critics
    else:
        q_loss = ((out - target) ** 2).mean(-1).sum()  # MSE, summed over critics
    return q_loss, agent.q_value(out.detach()).mean()


def actor_loss(agent: Agent, b: TensorDict, args: Args):
    """Maximise the critics' mean Q of the actor's action."""
    with torch.autocast(b.device.type, dtype=torch.bfloat16, enabled=args.bf16):
        action = agent.actor(b["obs_n", "policy"])
        return -agent.q_value(agent.q_out(agent.critic, b["obs_n"], action)).mean()


def check_args(args: Args) -> None:
    """Flags that cannot work together: a clear error before anything runs (each flag alone: common.args)."""
    if not 0 <= args.std_min <= args.std_max:
        raise SystemExit(f"error: need 0 <= --std-min <= --std-max, got {args.std_min} and {args.std_max}")
    if args.distributional and (args.num_atoms < 2 or args.v_min >= args.v_max):
        raise SystemExit(
            f"error: --distributional needs --num-atoms >= 2 and --v-min < --v-max, got {args.num_atoms}, "
            f"{args.v_min}, {args.v_max}"
        )


# ----------------------------------------------------------------------------------------------
# The loop's pieces: the exploration noise, the replay write, the delayed actor's phases, when learning starts. The
# loop itself is train's, with the functions the compile-and-capture block wraps (acting, the env step, the updates).
# ----------------------------------------------------------------------------------------------
def draw_noise_std(args: Args, device: torch.device) -> torch.Tensor:
    """Each env's exploration noise std for an episode: uniform in [std_min, std_max] (FastTD3's mix of scales)."""
    return torch.rand(args.num_envs, 1, device=device) * (args.std_max - args.std_min) + args.std_min


def store(run, buffer: ReplayBuffer, ep_stats: torch.Tensor, stats: dict, transition: TensorDict, info: dict) -> None:
    """Write the transition (obs, actions, rewards, terminated, truncated, next_obs: the true final observation where
    an episode ended) into the replay buffer (its device half: the loop advances the host copy), and add the episode
    statistics and the non-finite counts to `stats`. No host read."""
    buffer.write(transition)
    reward, done = transition["rewards"], transition["terminated"] | transition["truncated"]
    episode_sums(ep_stats, reward.unsqueeze(0), done.unsqueeze(0), sums=stats["episodes"])
    add_to(
        stats["nonfinite"],
        {
            "observations": (~torch.isfinite(transition["next_obs", "policy"])).sum(),
            "rewards": (~torch.isfinite(reward)).sum(),
        },
    )
    record_env_log(run, info)


def actor_schedule(num_updates: int, policy_frequency: int) -> tuple[dict[int, tuple[int, ...]], int]:
    """TD3's delayed actor: it steps after every policy_frequency-th critic step of the run. Which steps of an
    iteration those are depends on its phase (critic steps before it, mod policy_frequency): {phase: the critic steps
    of an iteration the actor follows}, and how many distinct phases the run meets (one update function is captured
    per phase: a single one when num_updates is a multiple of policy_frequency)."""
    actor_at = {
        p: tuple(i for i in range(num_updates) if (p + i + 1) % policy_frequency == 0) for p in range(policy_frequency)
    }
    return actor_at, policy_frequency // math.gcd(num_updates, policy_frequency)


def replay_ready(run, buffer: ReplayBuffer) -> bool:
    """When learning starts: an n-step window in every env, and --learning-starts env steps (all ranks) stored."""
    args = run.args
    return len(buffer) >= args.n_step and len(buffer) * args.num_envs * run.world_size >= args.learning_starts


def main(args: Args) -> dict:
    run = start_run(args, ALGO, device_defaults=DEVICE_DEFAULTS)
    with closing(run):  # on any exit, an error included: graphs released, then the process group left
        return train(run, args)


def train(run, args: Args) -> dict:
    open_run(run)  # the run directory and the checkpoint to resume (whose flags it takes)
    device, capacity = run.device, replay_capacity(args)  # slots per env
    check_args(args)
    steps_per_iteration = args.num_envs * run.world_size
    total_steps = max(args.total_timesteps, steps_per_iteration)  # at least one iteration
    envs, eval_envs = make_envs(run, gym.spaces.Box, hint="use algos/ppo.py or algos/pqn.py for discrete actions")
    low, high = action_bounds(envs, args, ALGO)
    next_obs, _ = envs.reset()  # the seeds make_envs gave them

    # --- agent (and its grad-free twin for acting), optimizers, normalizers, replay buffer ---
    obs_dim, critic_dim = obs_dims(next_obs, args, "td3.py")
    agent, agent_inference = agent_and_twin(lambda: Agent(obs_dim, critic_dim, low, high, args), device)
    actor_optimizer = torch.optim.Adam(agent.actor.parameters(), lr=args.policy_lr, capturable=device.type == "cuda")
    q_optimizer = torch.optim.Adam(agent.critic.parameters(), lr=args.q_lr, capturable=device.type == "cuda")
    reward_normalizer = RewardNormalizer(args.num_envs, args.gamma, clip=args.reward_clip).to(device)
    buffer = ReplayBuffer(args.num_envs, capacity, device, capturable=bool(args.cudagraphs))  # sampled in a graph
    ep_stats = torch.zeros(2, args.num_envs, device=device, dtype=torch.float64)  # running return, length
    noise_std = draw_noise_std(args, device)

    # --- what the checkpoints hold besides the counters, restored in place ---
    counters = {"update_count": 0}  # critic updates so far
    state = TrainingState(
        agent,
        {"actor": actor_optimizer, "critic": q_optimizer},
        envs,
        replicated={"reward_normalizer": reward_normalizer, "counters": counters},
        per_rank={"ep_stats": ep_stats, "noise_std": noise_std, "reward_returns": reward_normalizer.returns},
        buffer=buffer,
        save_buffer=args.save_buffer,
    )
    next_obs = restore(run, state, next_obs)
    if args.eval_only:
        return eval_only(run, eval_envs, agent_inference)

    # --- one iteration's functions, of tensors that live as long as the run (on CUDA each is captured whole); the
    # compile-and-capture block below rebinds their names in place. `stats` gathers what the logs read ---
    stats = new_stats(device)

    def act(obs: TensorDict) -> torch.Tensor:
        """The policy's action in [-1, 1] plus each env's exploration noise of this episode, clipped."""
        with acting_autocast(device, args.bf16):
            return agent_inference.act(obs, noise_std=noise_std)

    def random_act(obs: TensorDict) -> torch.Tensor:
        """The warm-up's uniform random actions in [-1, 1]."""
        return torch.rand(args.num_envs, low.shape[0], device=device) * 2 - 1

    def act_and_step(obs: TensorDict):
        """The policy's action and every env's step with it, scaled to the env's bounds."""
        action = act(obs)
        return action, *envs.step(agent.to_env(action))

    def step(obs: TensorDict, warmup: bool) -> TensorDict:
        """One step of every env, with the warm-up's random actions or the policy's; the transition stored by name,
        folded into the normalizers, a new noise std for each env that starts an episode. No host read. Returns the
        next observation."""
        if warmup:
            action = random_act(obs)
            next_obs, reward, terminated, truncated, info = envs.step(agent.to_env(action))
        else:
            action, next_obs, reward, terminated, truncated, info = act_and_step(obs)
        done = terminated | truncated
        real_next_obs = torch.where(done, info["final_obs"], next_obs)  # where an episode ended, next_obs has reset
        transition = TensorDict(
            obs=obs,
            actions=action,
            rewards=reward.float(),
            terminated=terminated,
            truncated=truncated,
            next_obs=real_next_obs,
            batch_size=[args.num_envs],
        )
        store(run, buffer, ep_stats, stats, transition, info)
        # the normalizers fold in every stored transition, on their own schedule (never the log's; a collective)
        update_group_statistics(agent, obs)
        if args.reward_norm:
            reward_normalizer.update(transition["rewards"], done)
        noise_std.copy_(torch.where(done.unsqueeze(-1), draw_noise_std(args, device), noise_std))
        return next_obs

    def critic_step(batch: TensorDict) -> dict:
        """One critic step (gradients averaged over ranks), then the soft target update; its statistics by name."""
        q_loss, q_mean = critic_loss(agent, batch, args)
        q_optimizer.zero_grad(set_to_none=False)
        q_loss.backward()
        distributed.all_reduce_gradients(agent.critic.parameters())
        q_optimizer.step()
        with torch.no_grad():
            for p_target, p in zip(agent.critic_target.parameters(), agent.critic.parameters()):
                p_target.lerp_(p, args.tau)
        return {"q_loss": q_loss.detach(), "q_values": q_mean}

    def actor_step(batch: TensorDict) -> dict:
        """One actor step; its loss by name."""
        loss = actor_loss(agent, batch, args)
        actor_optimizer.zero_grad(set_to_none=False)
        loss.backward()
        distributed.all_reduce_gradients(agent.actor.parameters())
        actor_optimizer.step()
        return {"actor_loss": loss.detach()}

    def update(actor_at: tuple[int, ...]) -> None:
        """--num-updates critic steps, each on a fresh batch of n-step windows, and an actor step after the critic
        steps `actor_at`; their statistics, by name, and their steps, counted, into stats."""
        for i in range(args.num_updates):
            batch = n_step_batch(agent, buffer.sample(args.batch_size, args.n_step), reward_normalizer, args)
            add_step(stats["critic"], critic_step(batch))
            if i in actor_at:
                add_step(stats["actor"], actor_step(batch))

    # --- compile (--compile) and capture (--cudagraphs) the functions above, unchanged, each name rebound in place
    # once: the functions that call it read the wrapped one through their closures (a warning names any that kept
    # the function from before) ---
    whole_step = getattr(envs, "capturable", False)
    if whole_step:  # a built-in env steps inside the graph: acting, env step and replay write are one
        act_and_step = compiled(run, act_and_step)  # (the random warm-up's: eager)
    else:  # an adapter's simulator cannot be captured: it steps eagerly after the captured acting
        act = captured(run, "acting", compiled(run, act))
    policy_step = captured(run, "step", functools.partial(step, warmup=False), capture=whole_step)
    random_step = captured(run, "random step", functools.partial(step, warmup=True), capture=whole_step)
    critic_step, actor_step = compiled(run, critic_step), compiled(run, actor_step)
    actor_at, phases = actor_schedule(args.num_updates, args.policy_frequency)
    update_at_phase = {  # one graph per phase of the actor's schedule
        phase: captured(run, "update" if phases == 1 else f"update, phase {phase}", functools.partial(update, at))
        for phase, at in actor_at.items()
    }
    unwrapped_calls(run, locals())
    description = f"{args.num_updates} updates of batch {args.batch_size} per step; {capacity} buffer slots per env"
    graphs = "off"
    if args.cudagraphs:
        graphs = (
            f"{'each env step with acting and replay write' if whole_step else 'each acting step'}, all "
            f"{args.num_updates} updates of an iteration ({phases} graph{'s' if phases > 1 else ''}: one per phase of "
            "the actor's schedule)"
        )
    begin_training(run, description, steps_per_iteration, graphs)
    # In env steps, not iterations: a run resumed with another world size still ends at --total-timesteps.
    while run.global_step + steps_per_iteration <= total_steps:
        run.iteration += 1
        final_iteration = run.global_step + 2 * steps_per_iteration > total_steps
        # --- act, step, store (and fold into the normalizers): no host-device synchronisation here ---
        with timed(run, "rollout"), torch.no_grad():
            if run.global_step < args.learning_starts:  # the warm-up: uniform random actions
                next_obs = random_step(next_obs)
            else:
                next_obs = policy_step(next_obs)
        buffer.advance_host()  # the write ran on the device (a graph replay runs no Python)
        run.global_step += steps_per_iteration

        # --- update: --num-updates critic steps, the actor after every --policy-frequency-th of the run ---
        if replay_ready(run, buffer):
            with timed(run, "update"):
                update_at_phase[counters["update_count"] % args.policy_frequency]()
            counters["update_count"] += args.num_updates

        # --- once per log interval (and before evals and saves): one host read; evaluation, checkpoints, stop ---
        if log_eval_save(run, final_iteration, stats, eval_envs, agent_inference, state, next_obs):
            break
    return finish(run, agent)


if __name__ == "__main__":
    main(parse_args(Args))
