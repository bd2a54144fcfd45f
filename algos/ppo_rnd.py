"""PPO with random network distillation (RND): an intrinsic reward for states the agent has rarely seen.

    python algos/ppo_rnd.py --env-id MountainCarContinuous-v0 --num-envs 4096

ppo.py (read it first; this file keeps its order and its flags: tests/test_flag_parity.py lists the differences)
plus RND (Burda et al. 2018): a predictor learns to match a frozen random network on the states visited; its error on
a state, divided by the running std of its discounted return, is the intrinsic reward, large where the agent has rarely
been.
Two value heads (CleanRL's ppo_rnd_envpool.py), not rsl_rl's one summed reward: the critic predicts the extrinsic
return (episodic, --gamma) and the intrinsic one (non-episodic, --rnd-gamma); the advantage is A_ext + weight *
A_int. Why: novelty does not end with an episode. Summed into one episodic reward, the intrinsic stream stops
wherever an episode does, so a terminal goal (MountainCarContinuous-v0: +100, then the end) costs the agent the
novelty it would have found by wandering on, and one critic fits a steady return and a fading one at once. Apart,
the weight (and its schedule) scales an advantage without refitting the critic; the price is one more critic output.
References: Burda et al. 2018; Schwarke et al. 2023 (rsl_rl's RND); the predictor has an Adam of its own, as there.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import gymnasium as gym
import torch
import torch.nn as nn
from tensordict import TensorDict

# ruff: noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
if importlib.util.find_spec("common") is None:
    sys.exit(
        f"error: {Path(__file__).name} needs the project's common/ package: keep it in algos/, or pip install -e ."
    )

from common import distributed, loop, nets, symmetry
from common.args import Ge, Gt, Le, RunArgs, parse_args
from common.buffer import RolloutStorage
from common.capture import acting_autocast, captured, compiled, timed, unwrapped_calls
from common.checkpoint import TrainingState, restore
from common.evaluation import eval_only
from common.normalize import RewardNormalizer, normalize_groups, observation_normalizer, update_group_statistics
from common.run import begin_training, closing, finish, make_envs, open_run, start_run, what_is_due
from common.settings import rsl_rl_settings
from common.stats import add_to, explained_variance, nonfinite, record_env_log

ALGO = "ppo_rnd"


@dataclass
class Args(RunArgs):
    bf16: bool = False
    """run the agent's networks under bfloat16 autocast (distribution math, losses and RND stay float32)"""
    total_timesteps: Annotated[int, Ge(1)] = 5_111_808
    """env steps to train for, summed over all processes (by default whole iterations of the default sizes)"""
    num_steps: Annotated[int, Ge(1)] = 24
    """steps per env per rollout; the batch per process is num_envs * num_steps"""
    num_minibatches: Annotated[int, Ge(1)] = 4
    """minibatches per epoch"""
    update_epochs: Annotated[int, Ge(1)] = 5
    """epochs over the batch per iteration"""
    learning_rate: Annotated[float, Gt(0)] = 1e-3
    """initial learning rate of Adam"""
    lr_schedule: Literal["constant", "linear", "adaptive"] = "adaptive"
    """constant; linear anneal to 0; or adaptive from the measured KL (rsl_rl)"""
    desired_kl: Annotated[float, Gt(0)] = 0.01
    """KL the adaptive schedule aims for: lr / 1.5 above 2x, lr * 1.5 below 0.5x"""
    kl_estimator: Literal["k3", "analytic"] = "k3"
    """the KL the adaptive schedule and --target-kl read: ppo.py's sampled k3 estimate, or the analytic KL(old || new)
    (rsl_rl)"""
    lr_adapt: Literal["after-step", "before-step"] = "after-step"
    """ppo.py's: the adapted rate for the next minibatch's step, or (rsl_rl) for this one's, from its KL"""
    lr_max: Annotated[float, Gt(0)] = 5e-3
    """the adaptive rate's cap (rsl_rl: 1e-2; ppo.py's adapt_learning_rate says why ours is lower)"""
    gamma: Annotated[float, Ge(0), Le(1)] = 0.99
    """discount factor"""
    gae_lambda: Annotated[float, Ge(0), Le(1)] = 0.95
    """GAE lambda"""
    timeout_bootstrap: Literal["unless-terminated", "every-timeout"] = "unless-terminated"
    """a step that both terminates and times out: no bootstrap (ours), or gamma * V like every time-out (rsl_rl's)"""
    adv_norm: Literal["none", "minibatch", "batch"] = "minibatch"
    """normalize advantages per minibatch (CleanRL), once over the whole batch (rsl_rl), or not at all"""
    clip_coef: Annotated[float, Ge(0)] = 0.2
    """surrogate clipping coefficient"""
    clip_vloss: bool = True
    """clip the value loss around the old values"""
    ent_coef: Annotated[float, Ge(0)] = 0.005
    """entropy bonus coefficient"""
    vf_coef: Annotated[float, Ge(0)] = 1.0
    """value loss coefficient (of each head's 0.5 * (V - R)^2, as ppo.py's)"""
    max_grad_norm: Annotated[float, Gt(0)] = 1.0
    """gradient-norm clip of the agent (--grad-clip: of what; the predictor is not clipped, as in rsl_rl)"""
    grad_clip: Literal["global", "per-network"] = "global"
    """ppo.py's: one norm over all the agent's gradients, or the actor's and the critic's apart (rsl_rl 5)"""
    adam_eps: Annotated[float, Gt(0)] = 1e-5
    """epsilon of both Adams, the agent's and the predictor's (rsl_rl's is torch's default, 1e-8)"""
    shuffle: Literal["every-epoch", "once", "never"] = "every-epoch"
    """ppo.py's: a new shuffle every epoch, one for all the epochs of an update (rsl_rl), or the batch in order"""
    target_kl: Annotated[float | None, Gt(0)] = None
    """stop the epoch loop early when the approximate KL exceeds this"""
    hidden_sizes: Annotated[tuple[int, ...], Ge(1)] = (64, 64)
    """hidden layer sizes of the actor and the critic"""
    activation: Literal["tanh", "elu", "relu", "silu"] = "tanh"
    """activation of the hidden layers"""
    encoder: Literal["nature", "impala", "minatar", "mlp"] = "nature"
    """encoder of image groups (uint8 [C, H, W]): Atari DQN CNN, IMPALA ResNet, MinAtar's conv, or flattened frames"""
    init_log_std: float = 0.0
    """initial log standard deviation of the Gaussian policy (continuous actions)"""
    std_type: Literal["log", "scalar"] = "log"
    """ppo.py's: the Gaussian's std learned as its log, or as itself, floored at 1e-6 (rsl_rl's "scalar")"""
    shared_encoder: bool = False
    """one image encoder under the policy and both value heads, trained by both losses; the critic reads 'policy'"""
    asymmetric_critic: bool = True
    """feed the critic the env's 'critic' observations when it provides them"""
    obs_norm: bool = True
    """normalize observations with running statistics of the rollouts"""
    obs_clip: Annotated[float, Gt(0)] = 10.0
    """clip normalized observations to [-obs_clip, obs_clip]"""
    reward_norm: bool = True
    """scale rewards by the running std of the discounted return (keeps the value loss O(1))"""
    reward_clip: Annotated[float, Gt(0)] = 10.0
    """clip normalized rewards to [-reward_clip, reward_clip]"""
    symmetry: Literal["none", "log", "augmentation", "mirror-loss", "both"] = "none"
    """ppo.py's (rsl_rl's, by the env's mirror): augmentation, a mirror loss, both, or neither but logging them"""
    mirror_loss_coef: Annotated[float, Ge(0)] = 1.0
    """weight of the mirror loss (rsl_rl's mirror_loss_coeff)"""
    rnd_weight: Annotated[float, Ge(0)] = 1.0
    """weight of the intrinsic advantage beside the extrinsic one (rsl_rl's rnd_cfg.weight)"""
    rnd_weight_final: Annotated[float | None, Ge(0)] = None
    """a linear schedule from --rnd-weight to this over --rnd-weight-steps (equal steps: a switch); None: constant"""
    rnd_weight_steps: Annotated[tuple[int, int], Ge(0)] = (0, 0)
    """where the schedule starts and ends, in steps of one env (rsl_rl's initial_step, final_step)"""
    rnd_gamma: Annotated[float, Ge(0), Le(1)] = 0.99
    """discount of the intrinsic return, which runs on across episode ends"""
    rnd_obs_group: Literal["policy", "critic"] = "policy"
    """the observation group RND reads (rsl_rl's obs_groups["rnd_state"])"""
    rnd_hidden_sizes: Annotated[tuple[int, ...], Ge(1)] = (64, 64)
    """hidden layer sizes of the predictor"""
    rnd_target_hidden_sizes: Annotated[tuple[int, ...], Ge(1)] = (64, 64)
    """hidden layer sizes of the frozen random target"""
    rnd_num_outputs: Annotated[int, Ge(1)] = 16
    """size of the embedding the predictor learns to match"""
    rnd_learning_rate: Annotated[float, Gt(0)] = 1e-3
    """learning rate of the predictor's Adam"""
    rnd_state_norm: bool = True
    """normalize RND's input with running statistics of its own, clipped to [-5, 5] (rsl_rl's state_normalization)"""
    rnd_reward_norm: bool = True
    """divide the intrinsic reward by the running std of its discounted return (rsl_rl's reward_normalization)"""


# Named settings (common.settings): the set of the env id's family unless --settings names another; flags given win.
SETTINGS = {
    # ppo.py's, CleanRL's ppo_continuous_action.py; an evaluation every 51,200 steps on 8 envs
    "mujoco": dict(
        total_timesteps=999_424,  # CleanRL's 1M-step MuJoCo run: its 488 whole iterations of 2048 steps
        num_envs=1,
        num_steps=2048,
        num_minibatches=32,
        update_epochs=10,
        learning_rate=3e-4,
        lr_schedule="linear",
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        num_eval_envs=8,
        eval_interval=25,
    ),
    "task": rsl_rl_settings,  # the task's registered rsl_rl runner config, field by field
}


# --- Networks: ppo.py's, with two value heads; RND and its weight's schedule ---
class Agent(nn.Module):
    """ppo.py's actor and critic (two outputs: the extrinsic and the intrinsic value) with the observation normalizers.
    A group's shape is one env's: [D], [C, H, W] for uint8 images (an --encoder's, never normalized), or term -> shape.
    """

    def __init__(self, obs_shape, critic_obs_shape, action_space: gym.Space, args: Args, pixel_high=(255.0, 255.0)):
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.critic_key = "critic" if critic_obs_shape is not None else "policy"
        act_dim = nets.action_size(action_space)
        net = dict(hidden=args.hidden_sizes, activation=args.activation, encoder=args.encoder)
        self.actor = nets.group_mlp(obs_shape, act_dim, out_gain=0.01, max_value=pixel_high[0], **net)
        critic_max = pixel_high[1] if critic_obs_shape is not None else pixel_high[0]
        self.critic = nets.group_mlp(critic_obs_shape or obs_shape, 2, out_gain=1.0, max_value=critic_max, **net)
        self.shared_encoder = args.shared_encoder  # the critic's heads on the actor's encoder (one module)
        if self.shared_encoder:
            nets.share_encoder(self.actor, self.critic, critic_obs_shape)
        self.std_type = args.std_type
        if not self.discrete and args.std_type == "log":
            self.log_std = nn.Parameter(torch.full((act_dim,), args.init_log_std))
        elif not self.discrete:  # rsl_rl's "scalar": the std itself is the parameter
            self.std = nn.Parameter(torch.full((act_dim,), args.init_log_std).exp())
        nets.register_action_bounds(self, action_space)  # Gaussian samples are clipped to them on their way to the env
        self.obs_rms = observation_normalizer(obs_shape, args.obs_norm, args.obs_clip)
        self.critic_obs_rms = observation_normalizer(critic_obs_shape, args.obs_norm, args.obs_clip)

    normalize = normalize_groups  # each group through its own statistics (common.normalize)

    def action_std(self) -> torch.Tensor:
        return self.log_std.exp() if self.std_type == "log" else self.std.clamp(min=1e-6)  # rsl_rl 5's floor

    def value(self, obs_n: TensorDict) -> torch.Tensor:
        """[..., 2]: the extrinsic value, then the intrinsic one."""
        return self.critic(obs_n[self.critic_key]).float()  # float32 even under bf16 autocast

    def distribution(self, out: torch.Tensor, std=None) -> torch.distributions.Distribution:  # out: logits, or the mean
        # validate_args=False: argument checks read tensors on the host, a sync on every step.
        if self.discrete:
            return torch.distributions.Categorical(logits=out, validate_args=False)
        std = self.action_std() if std is None else std  # another std: the one a rollout acted with
        return torch.distributions.Normal(out, std.expand_as(out), validate_args=False)

    def log_prob_entropy(self, out: torch.Tensor, action: torch.Tensor):
        d = self.distribution(out)
        return (d.log_prob(action), d.entropy()) if self.discrete else (d.log_prob(action).sum(-1), d.entropy().sum(-1))

    def kl(self, old_out: torch.Tensor, old_std, out: torch.Tensor) -> torch.Tensor:
        """ppo.py's: KL(old || new) of each row, exact, the distribution the rollout acted with against this one."""
        kl = torch.distributions.kl_divergence(self.distribution(old_out, old_std), self.distribution(out))
        return kl if self.discrete else kl.sum(-1)

    to_env = nets.clip_to_bounds  # a Box's actions clipped to its bounds on their way to the env

    def deterministic(self, policy_obs: torch.Tensor) -> torch.Tensor:
        """The evaluated (and exported) policy on raw observations: the mode, clipped to the action bounds."""
        out = self.actor(self.obs_rms(policy_obs)).float()
        return out.argmax(-1) if self.discrete else self.to_env(out)

    def act(self, obs: TensorDict):
        """One acting step: normalize, sample; the action, its log-prob and the actor's output (the logits or mean)."""
        out = self.actor(self.obs_rms(obs["policy"])).float()  # float32 even under bf16 autocast
        action = nets.sample(d := self.distribution(out))
        return action, (d.log_prob(action) if self.discrete else d.log_prob(action).sum(-1)), out


class RND(nn.Module):
    """Random network distillation: `error(x_n)` is the predictor's mean squared distance to the frozen random
    target on each (normalized) observation, the novelty of that state and, averaged, the predictor's loss."""

    def __init__(self, shape, args: Args, pixel_high: float):
        super().__init__()
        net = dict(activation=args.activation, encoder=args.encoder, max_value=pixel_high, out_gain=1.0)
        self.predictor = nets.group_mlp(shape, args.rnd_num_outputs, args.rnd_hidden_sizes, **net)
        self.target = nets.group_mlp(shape, args.rnd_num_outputs, args.rnd_target_hidden_sizes, **net)
        self.target.requires_grad_(False)
        self.obs_rms = observation_normalizer(shape, args.rnd_state_norm, 5.0)  # [-5, 5]: Burda et al.'s clip

    def error(self, x_n) -> torch.Tensor:
        return (self.predictor(x_n) - self.target(x_n)).square().mean(-1)

    def novelty(self, obs: TensorDict, group: str) -> torch.Tensor:
        return self.error(self.obs_rms(obs[group]))


def rnd_weight_at(env_steps: int, args: Args) -> float:
    """The intrinsic advantage's weight after `env_steps` steps of one env (rsl_rl counts so)."""
    if args.rnd_weight_final is None:
        return args.rnd_weight
    start, end = args.rnd_weight_steps
    done = 1.0 if env_steps >= end else max(env_steps - start, 0) / max(end - start, 1)
    return args.rnd_weight + (args.rnd_weight_final - args.rnd_weight) * done


# --- GAE with truncation bootstrapping, the adaptive learning rate, the PPO loss (ppo.py's, two value heads) ---
def compute_advantages(
    rewards,
    values,
    next_value,
    final_values,
    terminated,
    truncated,
    gamma: float,
    lam: float,
    every_timeout: bool = False,
):
    """GAE(lambda) over a [T, N] rollout; a truncated episode's last reward gets gamma * V(final_obs) (ppo.py)."""
    bootstrap = truncated if every_timeout else truncated & ~terminated  # --timeout-bootstrap
    rewards = rewards + gamma * final_values * bootstrap
    dones = (terminated | truncated).float()
    advantages = torch.zeros_like(rewards)
    last_gae = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):
        next_v = next_value if t == rewards.shape[0] - 1 else values[t + 1]
        not_done = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_v * not_done - values[t]
        last_gae = delta + gamma * lam * not_done * last_gae
        advantages[t] = last_gae
    return advantages, advantages + values


def adapt_learning_rate(lr: torch.Tensor, kl: torch.Tensor, args: Args) -> None:
    """rsl_rl's schedule, in place on the device: lr / 1.5 when a minibatch's KL is above 2x --desired-kl, lr * 1.5
    below half of it, kept in [1e-5, --lr-max] (ppo.py says why 5e-3); before the step (--lr-adapt before-step), a KL
    of exactly 0 (the policy not moved yet) leaves it."""
    lower = kl < 0.5 * args.desired_kl
    if args.lr_adapt == "before-step":
        lower = lower & (kl > 0.0)
    factor = torch.where(kl > 2.0 * args.desired_kl, 1 / 1.5, torch.where(lower, 1.5, 1.0))
    lr.copy_((lr * factor).clamp(1e-5, args.lr_max))


def gradient_groups(agent: Agent, args: Args) -> list[list[nn.Parameter]]:
    """ppo.py's: the groups of parameters whose gradient norm --max-grad-norm clips apart (--grad-clip)."""
    if args.grad_clip == "global":
        return [list(agent.parameters())]
    actor = [p for name, p in agent.named_parameters() if not name.startswith("critic.")]
    return [actor, list(agent.critic.parameters())]


def ppo_loss(agent: Agent, mb: TensorDict, args: Args, output_mirror=None):
    """Clipped surrogate + (clipped) value losses - entropy bonus (+ mirror loss); returns the loss and its logged parts
    by name. --symmetry as ppo.py's: a mirror image takes its original's old log-prob, values and advantage (the
    intrinsic ones too, as rsl_rl's RND with symmetry); the predictor learns on the originals only."""
    b = mb.shape[0]  # the originals' rows; with --symmetry the actor reads their mirror images after them
    obs_n, mb = symmetry.with_mirror_images(mb, args)
    with torch.autocast(mb.device.type, dtype=torch.bfloat16, enabled=args.bf16):
        if agent.shared_encoder:  # the encoder once, both heads on its features (the critic's on the rows it reads)
            features = agent.actor[0](obs_n["policy"])
            out, newvalue = agent.actor[1](features), agent.critic[1](features[: mb.shape[0]])
        else:
            out, newvalue = agent.actor(obs_n["policy"]), agent.value(mb["obs_n"])
    out, newvalue = out.float(), newvalue.float()  # float32 even under bf16 autocast
    newlogprob, entropy = agent.log_prob_entropy(out[: mb.shape[0]], mb["actions"])
    logratio = newlogprob - mb["logprobs"]
    ratio = logratio.exp()
    with torch.no_grad():
        if args.kl_estimator == "analytic":  # rsl_rl's: the distribution the rollout acted with against this one
            approx_kl = agent.kl(mb["old_out"][:b], None if agent.discrete else mb["old_std"][:b], out[:b]).mean()
        else:
            approx_kl = ((ratio[:b] - 1) - logratio[:b]).mean()  # k3 estimator: unbiased, always >= 0
        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()
    adv = mb["advantages"]
    if args.adv_norm == "minibatch":  # the originals' statistics (rsl_rl normalizes before it adds the mirror images)
        adv = (adv - adv[:b].mean()) / (adv[:b].std() + 1e-8)
    pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
    if args.clip_vloss:
        v_clipped = mb["values"] + (newvalue - mb["values"]).clamp(-args.clip_coef, args.clip_coef)
        v_loss = 0.5 * torch.max((newvalue - mb["returns"]) ** 2, (v_clipped - mb["returns"]) ** 2).mean(0).sum()
    else:  # each head's mean, summed: the extrinsic and the intrinsic value loss
        v_loss = 0.5 * ((newvalue - mb["returns"]) ** 2).mean(0).sum()
    entropy_loss = entropy[:b].mean()
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
    logged = {
        "policy_loss": pg_loss.detach(),
        "value_loss": v_loss.detach(),
        "entropy": entropy_loss.detach(),
        "approx_kl": approx_kl,
        "clipfrac": clipfrac,
    }
    if args.symmetry != "none":  # ppo.py's mirror loss and symmetry error (common.symmetry.mirror_loss)
        mirror_loss, symmetry_error = symmetry.mirror_loss(agent, out, b, output_mirror)
        if args.symmetry in ("mirror-loss", "both"):
            loss = loss + args.mirror_loss_coef * mirror_loss
        logged["mirror_loss"], logged["charts/symmetry_error"] = mirror_loss.detach(), symmetry_error
    return loss, logged


# --- One iteration: rollout (train's env_step and rollout_fn) -> targets -> update (ppo.py) ---
@torch.no_grad()
def targets(
    agent: Agent,
    rnd: RND,
    reward_normalizers: tuple[RewardNormalizer, RewardNormalizer],
    rnd_weight: torch.Tensor,
    data: TensorDict,
    next_obs: TensorDict,
    data_augmentation,
    ep_stats: torch.Tensor,
    episodes: torch.Tensor,
    args: Args,
):
    """Episode statistics, values, (normalized) rewards and GAE of a rollout, extrinsic and intrinsic, then the
    observation statistics for the next one. Returns the flat batch, the logged statistics (losses/, charts/),
    non-finite counts."""
    terminated, truncated = data["terminated"], data["truncated"]
    dones = terminated | truncated
    loop.rollout_episodes(data, dones, ep_stats, episodes)  # the logged returns: the game's score where the env has one
    nonfinite_counts = loop.rollout_nonfinite(data)  # the NaN guard's: observations and rewards
    nonfinite_counts["intrinsic_rewards"] = nonfinite(data["int_rewards"])
    obs_n = agent.normalize(data["obs"])  # the same statistics the policy acted with
    # --symmetry: the mirror images, mirrored raw, then normalized (the normalizer's mean is not symmetric)
    mirrored = symmetry.rollout_images(args, data_augmentation, data["obs"], data["actions"], agent.normalize)
    with torch.autocast(data["rewards"].device.type, dtype=torch.bfloat16, enabled=args.bf16):
        values, next_value = agent.value(obs_n), agent.value(agent.normalize(next_obs))  # [T, N, 2], [N, 2]
    rewards, int_rewards = data["rewards"], data["int_rewards"]
    if args.reward_norm:
        reward_normalizers[0].update(rewards, dones)
        rewards = reward_normalizers[0].normalize(rewards)
    never = torch.zeros_like(dones)  # the intrinsic return is not cut at episode ends (Burda et al.)
    if args.rnd_reward_norm:
        reward_normalizers[1].update(int_rewards, never)
        int_rewards = reward_normalizers[1].normalize(int_rewards)
    final_values, no_bootstrap = data["final_values"], torch.zeros_like(int_rewards)
    adv_ext, ret_ext = compute_advantages(
        rewards,
        values[..., 0],
        next_value[..., 0],
        final_values,
        terminated,
        truncated,
        args.gamma,
        args.gae_lambda,
        args.timeout_bootstrap == "every-timeout",
    )
    adv_int, ret_int = compute_advantages(
        int_rewards, values[..., 1], next_value[..., 1], no_bootstrap, never, never, args.rnd_gamma, args.gae_lambda
    )
    advantages, returns = adv_ext + rnd_weight * adv_int, torch.stack((ret_ext, ret_int), -1)
    if args.adv_norm == "batch":
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    rnd_obs_n = rnd.obs_rms(data["obs", args.rnd_obs_group])  # the statistics its rewards were computed with
    update_group_statistics(agent, data["obs"])  # the next rollout's statistics come from this rollout only
    rnd.obs_rms.update(data["obs", args.rnd_obs_group])
    batch = {"obs_n": obs_n, "rnd_obs_n": rnd_obs_n, "actions": data["actions"], "logprobs": data["logprobs"]}
    batch = {**batch, "values": values, "advantages": advantages, "returns": returns, **mirrored}
    if args.kl_estimator == "analytic":  # the distribution the rollout acted with (env_step stored it)
        batch.update({key: data[key] for key in ("old_out", "old_std") if key in data.keys()})
    batch = TensorDict(batch, dones.shape, values.device)
    charts = {"intrinsic_reward": (rnd_weight * int_rewards).mean()}  # as the advantage weighs it
    rollout_stats = {"explained_variance": explained_variance(ret_ext, values[..., 0])}  # the extrinsic head's
    return batch.reshape(-1), rollout_stats, charts, nonfinite_counts


def main(args: Args) -> dict:
    # on any exit, an error included: graphs released, then the process group left
    with closing(start_run(args, ALGO, {"log_interval": (10, 1)})) as run:
        return train(run, args)


def train(run, args: Args) -> dict:
    open_run(run)  # the run directory and the checkpoint to resume (whose flags it takes): nothing written yet
    device = run.device
    batch_size = args.num_envs * args.num_steps  # per process
    if batch_size % args.num_minibatches != 0:  # a one-line error before anything runs
        raise SystemExit(
            f"error: the batch of num_envs*num_steps = {args.num_envs}*{args.num_steps} = {batch_size} does "
            f"not divide into --num-minibatches {args.num_minibatches}; pick a divisor of {batch_size}"
        )
    minibatch_size = batch_size // args.num_minibatches
    global_batch = batch_size * run.world_size
    total_steps = max(args.total_timesteps, global_batch)  # at least one iteration
    envs, eval_envs = make_envs(run)
    next_obs, _ = envs.reset()  # the seeds make_envs gave them
    data_augmentation, output_mirror = symmetry.mirrors(envs, next_obs, args, device)
    obs_shape, critic_shape, pixel_highs = nets.group_shapes(envs, next_obs, args)  # critic_shape: None without one
    # the same initial weights on every rank, and a grad-free twin for acting that shares the agent's storage
    agent, agent_inference = nets.agent_and_twin(
        lambda: Agent(obs_shape, critic_shape, envs.single_action_space, args, pixel_highs), device
    )
    lr = torch.tensor(args.learning_rate, device=device)  # a tensor: schedules update it in place
    # capturable on CUDA: step counts and lr stay on the device, so optimizer.step() never syncs.
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=args.adam_eps, capturable=device.type == "cuda")
    clip_groups = gradient_groups(agent, args)  # --grad-clip: all the gradients, or the actor's and the critic's apart
    reward_normalizer = RewardNormalizer(args.num_envs, args.gamma, clip=args.reward_clip).to(device)
    ep_stats = torch.zeros(2, args.num_envs, device=device, dtype=torch.float64)  # running return, length
    rnd_shape = nets.chosen_group_shape(next_obs, args.rnd_obs_group, "--rnd-obs-group", args.env_id)
    rnd_high = pixel_highs[args.rnd_obs_group == "critic"]
    # one random target and one predictor on every rank, and the grad-free twin the rollout reads
    rnd, rnd_inference = nets.agent_and_twin(lambda: RND(rnd_shape, args, rnd_high), device)
    rnd_lr = torch.tensor(args.rnd_learning_rate, device=device)
    rnd_optimizer = torch.optim.Adam(
        rnd.predictor.parameters(), lr=rnd_lr, eps=args.adam_eps, capturable=device.type == "cuda"
    )
    # not clipped: the raw scale would be lost (the intrinsic advantage is weighed against the extrinsic one)
    int_normalizer = RewardNormalizer(args.num_envs, args.rnd_gamma, clip=None).to(device)
    rnd_weight = torch.tensor(args.rnd_weight, device=device)  # set from the schedule every iteration

    # what the checkpoints hold besides the counters, restored in place
    state = TrainingState(
        agent,
        {"adam": optimizer, "rnd_adam": rnd_optimizer},
        envs,
        replicated={
            "learning_rate": lr,
            "reward_normalizer": reward_normalizer,
            "rnd": rnd,
            "intrinsic_reward_normalizer": int_normalizer,
        },
        per_rank={
            "ep_stats": ep_stats,
            "reward_returns": reward_normalizer.returns,
            "intrinsic_returns": int_normalizer.returns,
        },
    )
    next_obs = restore(run, state, next_obs)
    if args.eval_only:
        return eval_only(run, eval_envs, agent_inference)

    storage = RolloutStorage(args.num_steps, args.num_envs, device)
    stats = loop.iteration_stats(device, kinds=("losses", "charts"))  # what the log reads, gathered on the device

    # --- the iteration's functions: acting, the step's values, the env step, the rollout, the targets, a minibatch's
    # update, the update; the compile-and-capture block below rebinds their names in place ---
    act = agent_inference.act  # the action, its log-prob and the distribution's output

    def step_values(next_obs: TensorDict, final_obs: TensorDict, done: torch.Tensor):
        """At the step, with the weights and statistics the targets read: V_ext(final_obs), the time-out bootstrap, and
        the intrinsic reward, the novelty of the state reached (the true last one where an episode ended)."""
        with acting_autocast(device, args.bf16):
            final_value = agent_inference.value(agent_inference.normalize(final_obs))[..., 0]
        group = args.rnd_obs_group
        novelty = torch.where(done, rnd_inference.novelty(final_obs, group), rnd_inference.novelty(next_obs, group))
        return final_value, novelty

    def env_step(obs: TensorDict):
        """Act and step every env once: (next observation, the transition to store, the env's info)."""
        with acting_autocast(device, args.bf16):  # under no_grad (the rollout's); bf16 without a cache of cast weights
            action, logprob, out = act(obs)
        next_obs, reward, terminated, truncated, info = envs.step(agent_inference.to_env(action))
        final_value, novelty = step_values(next_obs, info["final_obs"], terminated | truncated)
        transition = {
            "obs": obs,
            "final_values": final_value,
            "int_rewards": novelty,
            "actions": action,
            "logprobs": logprob,
            "rewards": reward.float(),
            "terminated": terminated,
            "truncated": truncated,
        }
        # the distribution acted with: the update's KL(old || new) reads it (rsl_rl)
        if args.kl_estimator == "analytic":
            transition["old_out"] = out
            if not agent_inference.discrete:
                transition["old_std"] = agent_inference.action_std().expand_as(out)
        # Atari: a life is the learner's episode, the game's score is what is logged
        return next_obs, TensorDict(loop.with_game_score(transition, info), batch_size=[envs.num_envs]), info

    def update_minibatch(mb: TensorDict):
        """A gradient step of the agent and of the predictor (not clipped, as rsl_rl's) on a minibatch; its losses."""
        loss, losses = ppo_loss(agent, mb, args, output_mirror)
        if args.lr_schedule == "adaptive" and args.lr_adapt == "before-step":  # rsl_rl's: this step at the new rate
            adapt_learning_rate(lr, distributed.all_reduce(losses["approx_kl"].clone(), "mean"), args)
        rnd_loss = rnd.error(mb["rnd_obs_n"]).mean()
        optimizer.zero_grad(set_to_none=False)
        rnd_optimizer.zero_grad(set_to_none=False)
        (loss + rnd_loss).backward()  # no parameter in common: each gets its own loss's gradient
        distributed.all_reduce_gradients([*agent.parameters(), *rnd.predictor.parameters()])
        for group in clip_groups:
            nn.utils.clip_grad_norm_(group, args.max_grad_norm)
        optimizer.step()
        rnd_optimizer.step()
        return {**losses, "rnd_loss": rnd_loss.detach()}

    def rollout_fn(obs: TensorDict) -> TensorDict:
        """The env step --num-steps times, each transition into the storage at its step and the env's own metrics
        recorded: the observation after the last step. No host sync: with a built-in env, one CUDA graph."""
        for step in range(args.num_steps):
            obs, transition, info = env_step(obs)
            storage.write(step, transition)
            record_env_log(run, info)
        return obs

    def targets_fn(obs: TensorDict):
        """The targets of the rollout in the storage (targets, above), from the run's state."""
        normalizers = (reward_normalizer, int_normalizer)
        return targets(
            agent, rnd, normalizers, rnd_weight, storage.data, obs, data_augmentation, ep_stats, stats["episodes"], args
        )

    def update_fn(obs: TensorDict) -> None:
        """The targets of the rollout, then the epochs of the update; their statistics into `stats`."""
        batch, rollout_stats, charts, nonfinite_counts = targets_fn(obs)
        add_to(stats["losses"], rollout_stats)
        add_to(stats["charts"], charts)
        add_to(stats["nonfinite"], nonfinite_counts)
        # epochs of minibatches (--shuffle); the adaptive lr after each from the ranks' mean KL (or before its step:
        # update_minibatch's)
        size, loss_sums, num_updates = batch.shape[0], {}, 0
        for epoch in range(args.update_epochs):
            if args.shuffle == "never":
                perm = torch.arange(size, device=batch.device)
            elif epoch == 0 or args.shuffle == "every-epoch":  # "once": one permutation for every epoch (rsl_rl's)
                perm = torch.randperm(size, device=batch.device)
            for start in range(0, size, minibatch_size):
                losses = update_minibatch(batch[perm[start : start + minibatch_size]])
                add_to(loss_sums, losses)
                num_updates += 1
                if args.lr_schedule == "adaptive" and args.lr_adapt == "after-step":
                    adapt_learning_rate(lr, distributed.all_reduce(losses["approx_kl"].clone(), "mean"), args)
            if args.target_kl is not None:  # one host read per epoch, only when asked (the update is not captured)
                if distributed.all_reduce(loss_sums["approx_kl"] / num_updates, "mean").item() > args.target_kl:
                    break
        loop.add_update_means(stats, loss_sums, num_updates)

    # --- compile (--compile) and capture (--cudagraphs) the functions above, unchanged, each name rebound in place
    # once: the functions that call it read the wrapped one through their closures (a warning names any that kept
    # the function from before) ---
    if whole_rollout := getattr(envs, "capturable", False):  # a built-in env steps inside the graph: the whole
        env_step = compiled(run, env_step)  # rollout is one
    else:  # an adapter's simulator cannot be captured: it steps eagerly between the captured acting steps
        act = captured(run, "acting", compiled(run, act))
        step_values = captured(run, "values and novelty", compiled(run, step_values))
    update_minibatch, targets_fn = compiled(run, update_minibatch), compiled(run, targets_fn)
    if args.target_kl is not None:  # the epoch loop reads the KL on the host: targets and each minibatch apart
        targets_fn = captured(run, "targets", targets_fn)
        update_minibatch = captured(run, "minibatch update", update_minibatch)
    rollout_fn = captured(run, "rollout", rollout_fn, capture=whole_rollout)
    if args.target_kl is None:  # the targets and every epoch of the update as one graph: the batch never leaves it
        update_fn = captured(run, "update", update_fn)
    unwrapped_calls(run, locals())
    graphs = "off"  # what the CUDA graphs hold, as the start line says it
    if args.cudagraphs:
        graphs = "the whole rollout, " if whole_rollout else "each acting step, "
        graphs += "the targets and the whole update" if args.target_kl is None else "the targets, each minibatch update"
    said = f"batch {global_batch} per iteration ({args.num_minibatches} minibatches of {minibatch_size} per process)"
    begin_training(run, said, global_batch, graphs)
    # counted in env steps: a run resumed with another world size ends at --total-timesteps all the same
    while run.global_step + global_batch <= total_steps:
        run.iteration += 1
        if args.lr_schedule == "linear":
            lr.fill_(args.learning_rate * (1.0 - run.global_step / total_steps))
        rnd_weight.fill_(rnd_weight_at(run.global_step // (args.num_envs * run.world_size), args))

        with timed(run, "rollout"), torch.no_grad():
            next_obs = rollout_fn(next_obs)
        loop.say_storage_once(run, storage)
        run.global_step += global_batch
        with timed(run, "update"):
            update_fn(next_obs)
        # the log (one host read), evaluation and checkpoints that are due, the same on every rank
        due = what_is_due(run, final_iteration=run.global_step >= run.final_step)  # begin_training set final_step
        if due.log:  # every --log-interval iterations, and before an evaluation or a save
            iterations_since_last_log = (run.global_step - run.reduced_step) // global_batch
            local = {"charts/learning_rate": lr, "charts/rnd_weight": rnd_weight}
            loop.log_iteration(run, stats, iterations_since_last_log, local, ("losses", "charts"))
        if loop.evaluate_and_save(run, due, eval_envs, agent_inference, state, next_obs):
            break
    return finish(run, agent)


if __name__ == "__main__":
    main(parse_args(Args))
