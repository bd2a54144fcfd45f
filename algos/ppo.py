"""Proximal Policy Optimization for massively parallel, GPU-resident environments.

    python algos/ppo.py --env-id CartPole-v1 --num-envs 4096
    torchrun --nproc-per-node 8 algos/ppo.py --env-id Pendulum-v1 --num-envs 4096

Args -> Agent -> GAE, the adaptive learning rate, the gradient clip's groups -> the PPO loss (rsl_rl's symmetry) ->
targets -> train (setup; the iteration's functions: the env step, the rollout, a minibatch's update, the update's
epochs; the block that compiles and captures them in place; the loop: rollout -> targets -> update -> log ->
eval/save); the run around it is in common/.
`--num-envs` is per process, `--total-timesteps` counts env steps over all. An mjlab task's rsl_rl config brings
rsl_rl's update (--kl-estimator, --lr-adapt, --lr-max, --grad-clip, --adam-eps, --shuffle, --std-type; the plain
defaults are ours: docs/rsl_rl.md). References: Schulman et al. 2017 (PPO), 2016 (GAE); Huang et al. 2022, "The 37
implementation details of PPO"; Rudin et al. 2022 (rsl_rl); Mittal et al. 2024 (symmetry).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import gymnasium as gym
import torch
import torch.nn as nn
import torch.nn.functional as F
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
from common.stats import add_to, explained_variance, record_env_log

ALGO = "ppo"


@dataclass
class Args(RunArgs):
    bf16: bool = False
    """run the networks under bfloat16 autocast (distribution math and losses stay float32)"""
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
    """the KL the adaptive schedule and --target-kl read: the sampled k3 estimate from the log-prob ratios, or the
    analytic KL(old || new) between the distribution the rollout acted with (stored with it) and the current one
    (rsl_rl)"""
    lr_adapt: Literal["after-step", "before-step"] = "after-step"
    """when the adaptive schedule changes the rate: after a minibatch's step, for the next one, or before it, from the
    KL measured on that same minibatch, a KL of exactly 0 (the policy not moved yet) leaving the rate as it is (rsl_rl)
    """
    lr_max: Annotated[float, Gt(0)] = 5e-3
    """the adaptive rate's cap (rsl_rl: 1e-2; adapt_learning_rate says why ours is lower)"""
    gamma: Annotated[float, Ge(0), Le(1)] = 0.99
    """discount factor"""
    gae_lambda: Annotated[float, Ge(0), Le(1)] = 0.95
    """GAE lambda"""
    timeout_bootstrap: Literal["unless-terminated", "every-timeout"] = "unless-terminated"
    """a step that both terminates and times out: no bootstrap (ours), or gamma * V like every time-out (rsl_rl's)"""
    adv_norm: Literal["none", "minibatch", "batch"] = "minibatch"
    """normalize advantages per minibatch (CleanRL), once over the whole batch (rsl_rl), or not at all"""
    adv_std: Literal["unbiased", "population"] = "unbiased"
    """the std --adv-norm divides by: torch's unbiased one, or the population's (brax's jnp.std)"""
    clip_coef: Annotated[float, Ge(0)] = 0.2
    """surrogate clipping coefficient"""
    clip_vloss: bool = True
    """clip the value loss around the old values"""
    ent_coef: Annotated[float, Ge(0)] = 0.005
    """entropy bonus coefficient"""
    vf_coef: Annotated[float, Ge(0)] = 1.0
    """value loss coefficient (the value loss is 0.5 * (V - R)^2: rsl_rl's value_loss_coef, without the 0.5, is half
    of it)"""
    max_grad_norm: Annotated[float, Gt(0)] = 1.0
    """gradient-norm clip (--grad-clip: of what); inf: none (brax's max_grad_norm=None), the gradients as they are"""
    grad_clip: Literal["global", "per-network"] = "global"
    """clip one norm over all the gradients, or the actor's (its std among them) and the critic's apart (rsl_rl 5)"""
    adam_eps: Annotated[float, Gt(0)] = 1e-5
    """Adam's epsilon (CleanRL's 1e-5; rsl_rl's is torch's default, 1e-8)"""
    shuffle: Literal["every-epoch", "once", "never"] = "every-epoch"
    """the minibatches: a new shuffle of the batch every epoch, one shuffle for all the epochs of an update (rsl_rl),
    or the batch in order"""
    target_kl: Annotated[float | None, Gt(0)] = None
    """stop the epoch loop early when the approximate KL exceeds this"""
    hidden_sizes: Annotated[tuple[int, ...], Ge(1)] = (64, 64)
    """hidden layer sizes of the actor (and of the critic, unless --critic-hidden-sizes)"""
    critic_hidden_sizes: Annotated[tuple[int, ...] | None, Ge(1)] = None
    """hidden layer sizes of the critic, where they differ from the actor's (brax's: policy 4x32, value 5x256)"""
    activation: Literal["tanh", "elu", "relu", "silu"] = "tanh"
    """activation of the hidden layers"""
    encoder: Literal["nature", "impala", "minatar", "mlp"] = "nature"
    """encoder of uint8 image groups [C, H, W]: the Atari DQN CNN, IMPALA's ResNet, MinAtar's conv, or flat frames"""
    init_log_std: float = 0.0
    """initial log standard deviation of the Gaussian policy (continuous actions)"""
    std_type: Literal["log", "scalar"] = "log"
    """the Gaussian's state-independent std, learned as its log, or as the std itself, floored at 1e-6 (rsl_rl's
    "scalar")"""
    policy_dist: Literal["gaussian", "tanh-normal"] = "gaussian"
    """continuous actions: a Gaussian with a state-independent std (--std-type), its sample clipped to the bounds; or
    brax's tanh-squashed Gaussian: the actor outputs the mean and the std's pre-softplus (std = softplus + 0.001, of
    the state), the env gets tanh of the sample (scaled to the bounds), the log-prob counts tanh's Jacobian"""
    entropy: Literal["analytic", "sampled"] = "analytic"
    """the entropy bonus: the Gaussian's; or brax's one-sample estimate for --policy-dist tanh-normal, the Gaussian's
    plus tanh's log-det-Jacobian at a sample"""
    shared_encoder: bool = False
    """one image encoder under both heads, trained by both losses (CleanRL's Atari agent); the critic reads 'policy'"""
    asymmetric_critic: bool = True
    """feed the critic the env's 'critic' observations when it provides them"""
    obs_norm: bool = True
    """normalize observations with running statistics of the rollouts"""
    obs_clip: Annotated[float, Gt(0)] = 10.0
    """clip normalized observations to [-obs_clip, obs_clip]"""
    reward_norm: bool = True
    """scale rewards by the running std of the discounted return (a value loss of O(1): the gradient clip spares the
    policy)"""
    reward_clip: Annotated[float, Gt(0)] = 10.0
    """clip normalized rewards to [-reward_clip, reward_clip]"""
    reward_scale: Annotated[float, Gt(0)] = 1.0
    """rewards times this before the targets, after --reward-norm (brax's reward_scaling)"""
    gae: Literal["rollout", "in-loss"] = "rollout"
    """GAE once per rollout from the rollout's values, a time-out bootstrapped with V(final observation); or brax's: in
    each minibatch's loss from the current critic, over whole unrolls of --unroll-length steps (the minibatches are
    unrolls), each unroll's end bootstrapped with V(next observation), a time-out's step masked out"""
    unroll_length: Annotated[int | None, Ge(1)] = None
    """--gae in-loss: the steps of one unroll, dividing --num-steps (default: --num-steps; brax's unroll_length)"""
    symmetry: Literal["none", "log", "augmentation", "mirror-loss", "both"] = "none"
    """rsl_rl's, by the env's mirror: each minibatch with its mirror images, a loss between the actor's output on mirror
    images and its mirrored output, both, or neither but logging mirror_loss and symmetry_error"""
    mirror_loss_coef: Annotated[float, Ge(0)] = 1.0
    """weight of the mirror loss (rsl_rl's mirror_loss_coeff)"""


# Named settings (common.settings): the env id family's unless --settings names another; flags given win.
SETTINGS = {
    # CleanRL's ppo_continuous_action.py beyond the defaults (tests/test_settings.py checks all of its values); an
    # evaluation every 51,200 steps on 8 envs
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
    # CleanRL's ppo_atari_envpool.py (rewards clipped by the atari preset; one nature CNN under two linear heads); an
    # evaluation on 8 games every 50 iterations
    "atari": dict(
        env_kwargs='{"preset": "atari"}',
        total_timesteps=10_000_000,
        num_envs=8,
        num_steps=128,
        update_epochs=4,
        learning_rate=2.5e-4,
        lr_schedule="linear",
        clip_coef=0.1,
        ent_coef=0.01,
        vf_coef=0.5,
        max_grad_norm=0.5,
        reward_norm=False,
        shared_encoder=True,
        hidden_sizes=(),
        num_eval_envs=8,
        eval_interval=50,
    ),
    # the MinAtar rows of the learning results (tests/benchmarks/results/README.md); an evaluation on 16 envs every 10
    # iterations
    "minatar": dict(
        total_timesteps=655_360,  # the MinAtar tables' budget: 160 iterations of 128 x 32
        num_envs=128,
        num_steps=32,
        num_minibatches=8,
        update_epochs=4,
        ent_coef=0.01,
        encoder="minatar",
        num_eval_envs=16,
        eval_interval=10,
    ),
    # the goal lies hundreds of steps away: at gamma 0.99 its reward fades under the action costs (README, exploration)
    "mountaincar": dict(gamma=0.999, init_log_std=0.5),
    "task": rsl_rl_settings,  # the task's registered rsl_rl runner config, field by field
}


# --- Networks ---
class Agent(nn.Module):
    """Actor and critic MLPs and the observation normalizers, so that one state_dict holds all. Discrete spaces get a
    Categorical over logits; Box spaces a diagonal Gaussian with a state-independent std (learned as its log, or as
    itself: --std-type). The critic reads the "critic" group when given. A group's shape is one env's
    (common.nets.group_mlp): an image group is never normalized."""

    def __init__(self, obs_shape, critic_obs_shape, action_space: gym.Space, args: Args, pixel_high=(255.0, 255.0)):
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.critic_key = "critic" if critic_obs_shape is not None else "policy"
        act_dim = nets.action_size(action_space)
        # --policy-dist tanh-normal: the actor's output is the mean and the std's pre-softplus
        self.squashed = not self.discrete and args.policy_dist == "tanh-normal"
        self.sampled_entropy = self.squashed and args.entropy == "sampled"
        net = dict(hidden=args.hidden_sizes, activation=args.activation, encoder=args.encoder)
        out_dim = 2 * act_dim if self.squashed else act_dim
        self.actor = nets.group_mlp(obs_shape, out_dim, out_gain=0.01, max_value=pixel_high[0], **net)
        critic_max = pixel_high[1] if critic_obs_shape is not None else pixel_high[0]
        net["hidden"] = args.critic_hidden_sizes or args.hidden_sizes
        self.critic = nets.group_mlp(critic_obs_shape or obs_shape, 1, out_gain=1.0, max_value=critic_max, **net)
        self.shared_encoder = args.shared_encoder  # the critic's head on the actor's encoder (one module)
        if self.shared_encoder:
            nets.share_encoder(self.actor, self.critic, critic_obs_shape)
        self.std_type = args.std_type
        if self.squashed:  # the std is the actor's
            pass
        elif not self.discrete and args.std_type == "log":
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
        return self.critic(obs_n[self.critic_key]).squeeze(-1).float()

    def distribution(self, out: torch.Tensor, std=None) -> torch.distributions.Distribution:  # out: logits, or the mean
        # validate_args=False: argument checks read tensors on the host, a sync on every step.
        if self.discrete:
            return torch.distributions.Categorical(logits=out, validate_args=False)
        if self.squashed:  # brax's NormalTanhDistribution: of the action before tanh, its std the actor's
            loc, pre = out.chunk(2, -1)
            return torch.distributions.Normal(loc, F.softplus(pre) + 0.001, validate_args=False)
        std = self.action_std() if std is None else std  # another std: the one a rollout acted with
        return torch.distributions.Normal(out, std.expand_as(out), validate_args=False)

    def log_prob(self, d: torch.distributions.Distribution, action: torch.Tensor) -> torch.Tensor:
        """log pi(action) of each row; tanh-normal: of the stored pre-tanh action, with tanh's Jacobian (brax's)."""
        if self.discrete:
            return d.log_prob(action)
        return (d.log_prob(action) - log_det_tanh(action) if self.squashed else d.log_prob(action)).sum(-1)

    def log_prob_entropy(self, out: torch.Tensor, action: torch.Tensor):
        d = self.distribution(out)
        log_prob = self.log_prob(d, action)  # first: the order the graph is built in is the backward's sum order
        entropy = d.entropy()
        if self.sampled_entropy:  # brax's estimate: plus tanh's log-det-Jacobian at one sample of the Gaussian
            entropy = entropy + log_det_tanh(d.loc + d.scale * torch.randn_like(d.loc))
        return log_prob, entropy if self.discrete else entropy.sum(-1)

    def kl(self, old_out: torch.Tensor, old_std, out: torch.Tensor) -> torch.Tensor:
        """KL(old || new) of each row, exact: the distribution the rollout acted with (its output, its std) against the
        current one (rsl_rl's measure for the adaptive rate)."""
        kl = torch.distributions.kl_divergence(self.distribution(old_out, old_std), self.distribution(out))
        return kl if self.discrete else kl.sum(-1)

    def to_env(self, action: torch.Tensor) -> torch.Tensor:
        """A Box's actions on their way to the env: clipped to its bounds, or (tanh-normal) tanh scaled to them."""
        if not self.squashed:
            return nets.clip_to_bounds(self, action)
        squashed = torch.tanh(action)
        if self.action_low.numel() == 0:
            return squashed
        return self.action_low + (squashed + 1.0) * 0.5 * (self.action_high - self.action_low)

    def deterministic(self, policy_obs: torch.Tensor) -> torch.Tensor:
        """The evaluated (and exported) policy on raw observations: the likeliest action, or the clipped mean."""
        out = self.actor(self.obs_rms(policy_obs)).float()
        if self.discrete:
            return out.argmax(-1)
        return self.to_env(out.chunk(2, -1)[0] if self.squashed else out)

    def act(self, obs: TensorDict):
        """One acting step: normalize, sample; the action, its log-prob and the actor's output (the logits or mean)."""
        out = self.actor(self.obs_rms(obs["policy"])).float()  # float32 even under bf16 autocast
        action = nets.sample(d := self.distribution(out))
        return action, self.log_prob(d, action), out


def log_det_tanh(x: torch.Tensor) -> torch.Tensor:
    """log |d tanh(x) / dx|, as brax's TanhBijector computes it: 2 (log 2 - x - softplus(-2x)), stable for large |x|."""
    return 2.0 * (math.log(2.0) - x - F.softplus(-2.0 * x))


# --- GAE with truncation bootstrapping (and brax's, of unrolls); the adaptive learning rate; the gradient clip's groups
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
    """GAE(lambda) over a [T, N] rollout. A *terminated* episode has no future: no bootstrap. A *truncated* one does:
    its last reward gets gamma * V(final_obs), the true last observation's value, and the lambda-chain stops there.
    Treating truncation as termination teaches the critic that time-outs are terminal (Pardo et al., 2018)."""
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


def unroll_advantages(rewards, values, bootstrap, termination, truncation, gamma: float, lam: float):
    """(value targets, advantages) of [M, U] unrolls as brax's compute_gae: a termination ends the future, a time-out's
    step is masked out (no advantage, its target its own value, the chain cut there), each unroll's end bootstrapped
    with V of its next observation. Without gradient (brax's stop_gradient)."""
    with torch.no_grad():
        mask = 1.0 - truncation
        not_terminal = 1.0 - termination
        next_values = torch.cat([values[:, 1:], bootstrap[:, None]], 1)
        deltas = (rewards + gamma * not_terminal * next_values - values) * mask
        acc, chain = torch.zeros_like(bootstrap), []
        for t in reversed(range(values.shape[1])):
            acc = deltas[:, t] + gamma * not_terminal[:, t] * mask[:, t] * lam * acc
            chain.append(acc)
        vs = torch.stack(chain[::-1], 1) + values
        next_vs = torch.cat([vs[:, 1:], bootstrap[:, None]], 1)
        return vs, (rewards + gamma * not_terminal * next_vs - values) * mask


def adapt_learning_rate(lr: torch.Tensor, kl: torch.Tensor, args: Args) -> None:
    """rsl_rl's schedule, in place on the device: lr / 1.5 when a minibatch's KL is above 2x --desired-kl, lr * 1.5
    below half of it, kept in [1e-5, --lr-max]. Our cap is 5e-3, not rsl_rl's 1e-2, where a solved task's rate sits (its
    advantages are noise) and the policy drifts off what it solved. Before the step (--lr-adapt before-step, rsl_rl's),
    a KL of exactly 0 leaves the rate: the policy has not moved yet, the first minibatch of an update."""
    lower = kl < 0.5 * args.desired_kl
    if args.lr_adapt == "before-step":
        lower = lower & (kl > 0.0)
    factor = torch.where(kl > 2.0 * args.desired_kl, 1 / 1.5, torch.where(lower, 1.5, 1.0))
    lr.copy_((lr * factor).clamp(1e-5, args.lr_max))


def gradient_groups(agent: Agent, args: Args) -> list[list[nn.Parameter]]:
    """The parameters whose gradient norm is clipped to --max-grad-norm, group by group: all of them as one, or rsl_rl
    5's two models apart (--grad-clip per-network), the actor with the Gaussian's std and the critic (a shared encoder
    in both, as rsl_rl shares its CNN)."""
    if args.grad_clip == "global":
        return [list(agent.parameters())]
    actor = [p for name, p in agent.named_parameters() if not name.startswith("critic.")]
    return [actor, list(agent.critic.parameters())]


# --- The PPO loss of a minibatch, with rsl_rl's symmetry ---
def ppo_loss(agent: Agent, mb: TensorDict, args: Args, output_mirror=None):
    """Clipped surrogate + (clipped) value loss - entropy bonus (+ mirror loss): the loss and what is logged, by name.
    --symmetry (rsl_rl's): the actor also reads the minibatch's mirror images. Augmentation adds them to the surrogate
    and value losses with the originals' old log-probs, values, advantages and returns, as rsl_rl does: (m(s), m(a)) was
    drawn exactly as likely as (s, a), by the mirror image of the acting policy, so pi_old(a|s) is its behaviour
    probability; a symmetric task gives it the same value and advantage. Entropy and KL are the originals'."""
    b = mb.shape[0]  # the originals' rows; with --symmetry the actor reads their mirror images after them
    obs_n, mb = symmetry.with_mirror_images(mb, args)
    with torch.autocast(mb.device.type, dtype=torch.bfloat16, enabled=args.bf16):
        if agent.shared_encoder:  # the encoder once, both heads on its features (the critic's on the rows it reads)
            features = agent.actor[0](obs_n["policy"])
            out, newvalue = agent.actor[1](features), agent.critic[1](features[: mb.shape[0]]).squeeze(-1)
        else:
            out, newvalue = agent.actor(obs_n["policy"]), agent.value(mb["obs_n"])
    out, newvalue = out.float(), newvalue.float()  # float32 even under bf16 autocast
    newlogprob, entropy = agent.log_prob_entropy(out[: mb.shape[0]], mb["actions"])
    returns, adv = mb.get("returns", None), mb.get("advantages", None)
    if args.gae == "in-loss":  # brax's: the minibatch's unrolls [M, U], from the critic as it is now
        bootstrap = agent.value(mb["next_obs_n"]).float()
        returns, adv = unroll_advantages(
            mb["rewards"],
            newvalue.detach(),
            bootstrap,
            mb["termination"],
            mb["truncation"],
            args.gamma,
            args.gae_lambda,
        )
    logratio = newlogprob - mb["logprobs"]
    ratio = logratio.exp()
    with torch.no_grad():
        if args.kl_estimator == "analytic":  # rsl_rl's: the distribution the rollout acted with against this one
            old_std = None if agent.discrete or agent.squashed else mb["old_std"][:b]
            approx_kl = agent.kl(mb["old_out"][:b], old_std, out[:b]).mean()
        else:
            approx_kl = ((ratio[:b] - 1) - logratio[:b]).mean()  # k3 estimator: unbiased, always >= 0
        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()
    if args.adv_norm == "minibatch":  # the originals' statistics (rsl_rl normalizes before it adds the mirror images)
        std = adv[:b].std() if args.adv_std == "unbiased" else adv[:b].std(correction=0)  # brax's: jnp.std, ddof 0
        adv = (adv - adv[:b].mean()) / (std + 1e-8)
    pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
    if args.clip_vloss:
        v_clipped = mb["values"] + (newvalue - mb["values"]).clamp(-args.clip_coef, args.clip_coef)
        v_loss = 0.5 * torch.max((newvalue - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean()
    entropy_loss = entropy[:b].mean()
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
    logged = {
        "policy_loss": pg_loss.detach(),
        "value_loss": v_loss.detach(),
        "entropy": entropy_loss.detach(),
        "approx_kl": approx_kl,
        "clipfrac": clipfrac,
    }
    if args.symmetry != "none":  # rsl_rl's mirror loss: the output on the mirror images against the mirrored output on
        # the originals; logged with its symmetry error, mean |pi(m(s)) - m(pi(s))| (common.symmetry.mirror_loss)
        mirror_loss, symmetry_error = symmetry.mirror_loss(agent, out, b, output_mirror)
        if args.symmetry in ("mirror-loss", "both"):
            loss = loss + args.mirror_loss_coef * mirror_loss
        logged["mirror_loss"], logged["charts/symmetry_error"] = mirror_loss.detach(), symmetry_error
    return loss, logged


# --- One iteration: rollout (train's env_step and rollout_fn) -> targets -> update (train's update_fn) ---
# Functions of tensors that live as long as the run, so that on CUDA they compile and capture whole.
@torch.no_grad()
def targets(
    agent: Agent,
    reward_normalizer: RewardNormalizer,
    data: TensorDict,
    next_obs: TensorDict,
    data_augmentation,
    ep_stats: torch.Tensor,
    episodes: torch.Tensor,
    args: Args,
):
    """The episode statistics, values, (normalized) rewards and GAE of a rollout, then the observation statistics for
    the next one: the flat batch the update reads (with --symmetry, their mirror images too), logged statistics,
    non-finite counts."""
    terminated, truncated = data["terminated"], data["truncated"]
    dones = terminated | truncated
    loop.rollout_episodes(data, dones, ep_stats, episodes)  # the logged returns: the game's score where the env has one
    nonfinite_counts = loop.rollout_nonfinite(data)  # the NaN guard's: observations and rewards
    obs_n = agent.normalize(data["obs"])  # the same statistics the policy acted with
    # --symmetry: the mirror images, mirrored raw, then normalized (the normalizer's mean is not symmetric)
    mirrored = symmetry.rollout_images(args, data_augmentation, data["obs"], data["actions"], agent.normalize)
    with torch.autocast(data["rewards"].device.type, dtype=torch.bfloat16, enabled=args.bf16):
        values = agent.value(obs_n)
        next_value = agent.value(agent.normalize(next_obs))
    rewards = data["rewards"]
    if args.reward_norm:
        reward_normalizer.update(rewards, dones)
        rewards = reward_normalizer.normalize(rewards)
    rewards = rewards * args.reward_scale  # brax's reward_scaling (1: none)
    if args.gae == "in-loss":  # brax's: each minibatch's loss computes them, of whole unrolls
        update_group_statistics(agent, data["obs"])
        batch = unrolls(obs_n, agent.normalize(next_obs), data, rewards, values, args)
        returns, advantages = unroll_advantages(
            batch["rewards"],
            batch["values"],
            agent.value(batch["next_obs_n"]).float(),
            batch["termination"],
            batch["truncation"],
            args.gamma,
            args.gae_lambda,
        )  # the rollout's, for the log
        return batch, {"explained_variance": explained_variance(returns, batch["values"])}, nonfinite_counts
    advantages, returns = compute_advantages(
        rewards,
        values,
        next_value,
        data["final_values"],
        terminated,
        truncated,
        args.gamma,
        args.gae_lambda,
        args.timeout_bootstrap == "every-timeout",
    )
    if args.adv_norm == "batch":
        std = advantages.std() if args.adv_std == "unbiased" else advantages.std(correction=0)
        advantages = (advantages - advantages.mean()) / (std + 1e-8)
    update_group_statistics(agent, data["obs"])  # the next rollout's statistics come from this rollout only
    batch = {"obs_n": obs_n, "actions": data["actions"], "logprobs": data["logprobs"], "values": values}
    if args.kl_estimator == "analytic":  # the distribution the rollout acted with (env_step stored it)
        batch.update({key: data[key] for key in ("old_out", "old_std") if key in data.keys()})
    batch = TensorDict({**batch, "advantages": advantages, "returns": returns, **mirrored}, values.shape, values.device)
    return batch.reshape(-1), {"explained_variance": explained_variance(returns, values)}, nonfinite_counts


def unrolls(obs_n: TensorDict, next_obs_n: TensorDict, data: TensorDict, rewards, values, args: Args) -> TensorDict:
    """--gae in-loss: the [T, N] rollout as [N x T / U] unrolls of U = --unroll-length steps (brax's minibatches are
    unrolls), each with the normalized observation after its last step (the next unroll's first, or the rollout's
    next), brax's termination (terminated) and truncation (a time-out that did not terminate) as floats."""
    steps, n = rewards.shape
    u = args.unroll_length or steps
    following = torch.cat([obs_n[1:], next_obs_n.unsqueeze(0)], 0)[u - 1 :: u]  # [T / U, N]: after each unroll

    def split(x):  # [T, N, ...] -> [N * T / U, U, ...], each env's steps in order
        return x.transpose(0, 1).reshape(n * (steps // u), u, *x.shape[2:])

    fields = {"actions": data["actions"], "logprobs": data["logprobs"], "values": values, "rewards": rewards}
    fields["termination"] = data["terminated"].float()
    fields["truncation"] = (data["truncated"] & ~data["terminated"]).float()
    if args.kl_estimator == "analytic":
        fields.update({key: data[key] for key in ("old_out", "old_std") if key in data.keys()})
    batch = {key: split(x) for key, x in fields.items()}
    batch["obs_n"] = obs_n.apply(split, batch_size=[n * (steps // u), u])
    batch["next_obs_n"] = following.apply(
        lambda x: x.transpose(0, 1).reshape(n * (steps // u), *x.shape[2:]), batch_size=[n * (steps // u)]
    )
    return TensorDict(batch, [n * (steps // u)], rewards.device)


def check_unrolls(args: Args) -> None:
    """--gae in-loss's one-line errors: unrolls that split neither the rollout nor the minibatches; what it excludes."""
    if args.gae != "in-loss":
        return
    u = args.unroll_length or args.num_steps
    count = args.num_envs * (args.num_steps // u)
    if args.num_steps % u or count % args.num_minibatches:
        raise SystemExit(
            f"error: --gae in-loss: --unroll-length {u} must divide --num-steps {args.num_steps}, and its "
            f"{count} unrolls (--num-envs x num_steps / unroll_length) must divide into --num-minibatches "
            f"{args.num_minibatches}"
        )
    if args.symmetry != "none" or args.adv_norm == "batch":
        raise SystemExit("error: --gae in-loss goes without --symmetry and with a per-minibatch (or no) --adv-norm")


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
    check_unrolls(args)
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

    # what the checkpoints hold besides the counters, restored in place
    state = TrainingState(
        agent,
        {"adam": optimizer},
        envs,
        replicated={"learning_rate": lr, "reward_normalizer": reward_normalizer},
        per_rank={"ep_stats": ep_stats, "reward_returns": reward_normalizer.returns},
    )
    next_obs = restore(run, state, next_obs)
    if args.eval_only:
        return eval_only(run, eval_envs, agent_inference)

    storage = RolloutStorage(args.num_steps, args.num_envs, device)
    # what the log reads, gathered on the device: episodes, losses, non-finite counts
    stats = loop.iteration_stats(device)

    # --- the iteration's functions: acting, the env step, the rollout, the targets, a minibatch's update, the update;
    # the compile-and-capture block below rebinds their names in place ---
    act = agent_inference.act  # the action, its log-prob and the distribution's output

    def final_value(final_obs: TensorDict) -> torch.Tensor:
        """V(final_obs), the time-out bootstrap, at the step (the targets' weights): stored in place of a frame."""
        with torch.no_grad(), acting_autocast(device, args.bf16):
            return agent_inference.value(agent_inference.normalize(final_obs))

    def env_step(obs: TensorDict):
        """Act and step every env once: (next observation, the transition to store, the env's info)."""
        with torch.no_grad(), acting_autocast(device, args.bf16):  # bf16 without a cache of cast weights
            action, logprob, out = act(obs)
        next_obs, reward, terminated, truncated, info = envs.step(agent_inference.to_env(action))
        transition = {
            "obs": obs,
            "final_values": final_value(info["final_obs"]),
            "actions": action,
            "logprobs": logprob,
            "rewards": reward.float(),
            "terminated": terminated,
            "truncated": truncated,
        }
        # the distribution acted with: the update's KL(old || new) reads it (rsl_rl)
        if args.kl_estimator == "analytic":
            transition["old_out"] = out
            if not (agent_inference.discrete or agent_inference.squashed):  # tanh-normal: the std is in `out`
                transition["old_std"] = agent_inference.action_std().expand_as(out)
        # Atari: a life is the learner's episode, the game's score is what is logged
        return next_obs, TensorDict(loop.with_game_score(transition, info), batch_size=[envs.num_envs]), info

    def rollout_fn(obs: TensorDict) -> TensorDict:
        """env_step --num-steps times, each transition into the storage at its step and the env's own metrics
        recorded: the observation after the last step. No host sync: with a built-in env, one CUDA graph."""
        for step in range(args.num_steps):
            obs, transition, info = env_step(obs)
            storage.write(step, transition)
            record_env_log(run, info)
        return obs

    def targets_fn(obs: TensorDict):
        """The targets of the rollout in the storage (targets, above), from the run's state."""
        return targets(
            agent, reward_normalizer, storage.data, obs, data_augmentation, ep_stats, stats["episodes"], args
        )

    def update_minibatch(mb: TensorDict):
        """One gradient step on a minibatch (gradients averaged over ranks); returns its losses."""
        loss, losses = ppo_loss(agent, mb, args, output_mirror)
        if args.lr_schedule == "adaptive" and args.lr_adapt == "before-step":  # rsl_rl's: this step at the new rate
            adapt_learning_rate(lr, distributed.all_reduce(losses["approx_kl"].clone(), "mean"), args)
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        distributed.all_reduce_gradients(agent.parameters())
        for group in clip_groups:
            nn.utils.clip_grad_norm_(group, args.max_grad_norm)
        optimizer.step()
        return losses

    def update_fn(obs: TensorDict) -> None:
        """The targets of the rollout, then the epochs of the update; their statistics into `stats`."""
        batch, rollout_stats, nonfinite_counts = targets_fn(obs)
        add_to(stats["losses"], rollout_stats)
        add_to(stats["nonfinite"], nonfinite_counts)
        # epochs of minibatches over the batch (--shuffle); the adaptive learning rate after each minibatch from the
        # ranks' mean KL (the same lr on every rank), or before its step (--lr-adapt before-step: update_minibatch's)
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
        final_value = captured(run, "final value", compiled(run, final_value))
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
            loop.log_iteration(run, stats, iterations_since_last_log, {"charts/learning_rate": lr})
        if loop.evaluate_and_save(run, due, eval_envs, agent_inference, state, next_obs):
            break
    return finish(run, agent)


if __name__ == "__main__":
    main(parse_args(Args))
