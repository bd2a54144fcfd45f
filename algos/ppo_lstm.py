"""Recurrent PPO (LSTM or GRU) for partially observed, massively parallel, GPU-resident environments.

    python algos/ppo_lstm.py --env-id CartPole-v1 --env-kwargs '{"mask_velocity": true}'
    torchrun --nproc-per-node 8 algos/ppo_lstm.py --env-id Pendulum-v1 --env-kwargs '{"mask_velocity": true}'

algos/ppo.py with a memory. Top to bottom: Args -> networks (Agent: a recurrent cell shared by an actor and a critic
head) -> the hidden state's carry-over and resets, the minibatch rule -> GAE, the adaptive learning rate, the PPO loss
of a minibatch of sequences -> targets -> main and train (setup, the hidden states and what the checkpoints hold; the
iteration's functions, the rollout loop and the update's epochs among them, then one block that compiles and captures
them in place; the loop). Each env's hidden state lives through the rollouts, zeroed where its episode ends
(carry_over); the update replays each env's rollout as one sequence from the state it started with (truncated BPTT
over --num-steps), zeroed at the episode starts as the rollout did (episode_starts), minibatches being sets of envs
with all their steps, so --num-minibatches divides --num-envs (env_minibatches). The state of a batch of envs is one
tensor [k * rnn_layers, batch, rnn_hidden_size] (k = 2 for an LSTM: the h rows, then the c rows;
common.nets.rnn_step's layout), the batch at dim 1: a minibatch of envs is `state[:, envs]`, and the exported policy
takes it so. Flags as ppo.py's, less those tests/test_flag_parity.py lists with the reason (--symmetry: a hidden state
has no known mirror image; rsl_rl refuses symmetry with a recurrent policy too). References: Schulman et al. 2017
(PPO); Hausknecht & Stone 2015 (recurrent policies for partial observability); Huang et al. 2022 ("The 37
implementation details of PPO", the LSTM details); Rudin et al. 2022 (rsl_rl)."""

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

from common import distributed, loop, nets
from common.args import Ge, Gt, Le, RunArgs, parse_args
from common.buffer import RolloutStorage
from common.capture import acting_autocast, captured, compiled, timed, unwrapped_calls
from common.checkpoint import TrainingState, restore
from common.evaluation import eval_only
from common.normalize import RewardNormalizer, normalize_groups, observation_normalizer, update_group_statistics
from common.recurrent import EvalPolicy, allow_rnn, recurrent_cell, state_shape_of
from common.run import begin_training, closing, finish, make_envs, open_run, start_run, what_is_due
from common.settings import rsl_rl_settings
from common.stats import add_to, explained_variance, record_env_log

ALGO = "ppo_lstm"


@dataclass
class Args(RunArgs):
    cell: Literal["lstm", "gru"] = "lstm"
    """the recurrent cell"""
    rnn_hidden_size: Annotated[int, Ge(1)] = 64
    """hidden units of the cell (per layer)"""
    rnn_layers: Annotated[int, Ge(1)] = 1
    """stacked layers of the cell"""
    bf16: bool = False
    """run the networks under bfloat16 autocast (distribution math and losses stay float32)"""
    total_timesteps: Annotated[int, Ge(1)] = 5_111_808
    """env steps to train for, summed over all processes (by default whole iterations of the default sizes)"""
    num_steps: Annotated[int, Ge(1)] = 32
    """steps per env per rollout, also the length of the replayed sequences (truncated BPTT)"""
    num_minibatches: Annotated[int, Ge(1)] = 4
    """minibatches per epoch, each a set of envs with all their steps"""
    update_epochs: Annotated[int, Ge(1)] = 5
    """epochs over the batch per iteration"""
    learning_rate: Annotated[float, Gt(0)] = 1e-3
    """initial learning rate of Adam"""
    lr_schedule: Literal["constant", "linear", "adaptive"] = "adaptive"
    """constant; linear anneal to 0; or adaptive from the measured KL (rsl_rl)"""
    desired_kl: Annotated[float, Gt(0)] = 0.01
    """KL the adaptive schedule aims for (adapt_learning_rate)"""
    kl_estimator: Literal["k3", "analytic"] = "k3"
    """ppo.py's: the sampled k3 estimate, or the analytic KL(old || new) of the acting and the current distribution
    (rsl_rl)"""
    lr_adapt: Literal["after-step", "before-step"] = "after-step"
    """ppo.py's: the adapted rate for the next minibatch's step, or (rsl_rl) for this one's, from its KL"""
    lr_max: Annotated[float, Gt(0)] = 1e-2
    """the adaptive rate's cap (rsl_rl's 1e-2; ppo.py's 5e-3)"""
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
    """value loss coefficient"""
    max_grad_norm: Annotated[float, Gt(0)] = 0.5
    """gradient-norm clip (CleanRL's 0.5, tighter than ppo.py's 1.0; --grad-clip: of what)"""
    grad_clip: Literal["global", "per-network"] = "global"
    """one norm over all the gradients, or the actor's and the critic's apart (rsl_rl 5; the cell and the policy
    group's encoder, which both heads read, are in both)"""
    adam_eps: Annotated[float, Gt(0)] = 1e-5
    """Adam's epsilon (CleanRL's 1e-5; rsl_rl's is torch's default, 1e-8)"""
    shuffle: Literal["every-epoch", "once", "never"] = "every-epoch"
    """the minibatches of envs: a new shuffle every epoch, one for all the epochs of an update, or the envs in order
    (rsl_rl's recurrent minibatches)"""
    hidden_sizes: Annotated[tuple[int, ...], Ge(1)] = (64,)
    """hidden layer sizes of the actor and critic heads after the cell"""
    activation: Literal["tanh", "elu", "relu", "silu"] = "tanh"
    """activation of the heads' hidden layers"""
    encoder: Literal["nature", "impala", "minatar", "mlp"] = "nature"
    """encoder of image groups (uint8 [C, H, W]) before the cell or the critic head: as ppo.py's --encoder"""
    init_log_std: float = 0.0
    """initial log standard deviation of the Gaussian policy (continuous actions)"""
    std_type: Literal["log", "scalar"] = "log"
    """ppo.py's: the Gaussian's std learned as its log, or as itself, floored at 1e-6 (rsl_rl's "scalar")"""
    asymmetric_critic: bool = True
    """feed the critic head the env's 'critic' observations (beside the cell's output) when it provides them"""
    obs_norm: bool = True
    """normalize observations with running statistics of the rollouts"""
    obs_clip: Annotated[float, Gt(0)] = 10.0
    """clip normalized observations to [-obs_clip, obs_clip]"""
    reward_norm: bool = True
    """scale rewards by the running std of the discounted return"""
    reward_clip: Annotated[float, Gt(0)] = 10.0
    """clip normalized rewards to [-reward_clip, reward_clip]"""


# Named settings (common.settings): the set of the env id's family unless --settings names another; flags given win.
SETTINGS = {
    # ppo.py's: CleanRL's ppo_continuous_action.py (64 tanh units after the cell); an evaluation every 51,200 steps
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
        num_eval_envs=8,
        eval_interval=25,
    ),
    "task": rsl_rl_settings,  # the task's registered rsl_rl runner config, field by field
}


# --- Networks ---
def group_encoders(shapes: tuple, kind: str, pixel_highs: tuple) -> tuple[tuple[nn.Module, int], ...]:
    """(encoder, width of what it gives) of each of the agent's groups, in order (`shapes`: one env's, a tuple or a
    dict of terms; None for a group it lacks): an image group or a group of terms is read by an --encoder `kind` of its
    own (common.nets.group_encoder), as wide as its features; a vector group by nn.Identity, as wide as itself; a group
    the agent lacks by nn.Identity, of width 0. An int D is the vector group [D]."""
    out = []
    for shape, high in zip(shapes, pixel_highs):
        shape = (shape,) if isinstance(shape, int) else shape
        encoder = nets.group_encoder(shape, kind, high) or nn.Identity()
        out.append((encoder, 0 if not shape else getattr(encoder, "out_dim", None) or shape[0]))
    return tuple(out)


class Agent(nn.Module):
    """A recurrent cell over the normalized policy observations, shared by an actor head and a critic head (one cell
    step per env step, as CleanRL's; the critic head also reads the "critic" observations when given), with the
    observation normalizers: one state_dict holds all. Discrete spaces get a Categorical over logits; Box spaces a
    diagonal Gaussian with a state-independent log-std. A group's shape is one env's (an int will do for [D]); images
    and groups of terms are read by an --encoder of their own first (common.nets.group_encoder), never normalized."""

    def __init__(self, obs_shape, critic_obs_shape, action_space: gym.Space, args: Args, pixel_high=(255.0, 255.0)):
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.critic_key = "critic" if critic_obs_shape is not None else "policy"
        # each group's encoder and the width of what it gives: the cell reads the policy's, features or the vector
        shapes = obs_shape, critic_obs_shape
        (self.encoder, obs_dim), (self.critic_encoder, critic_dim) = group_encoders(shapes, args.encoder, pixel_high)
        act_dim = nets.action_size(action_space)
        self.rnn = recurrent_cell(args.cell, obs_dim, args.rnn_hidden_size, args.rnn_layers)
        self.state_shape = state_shape_of(self.rnn)  # one env's (rows, hidden): k * layers rows of hidden units
        self.actor = nets.mlp(args.rnn_hidden_size, act_dim, args.hidden_sizes, args.activation, out_gain=0.01)
        self.critic = nets.mlp(args.rnn_hidden_size + critic_dim, 1, args.hidden_sizes, args.activation, out_gain=1.0)
        self.std_type = args.std_type
        if not self.discrete and args.std_type == "log":
            self.log_std = nn.Parameter(torch.full((act_dim,), args.init_log_std))
        elif not self.discrete:  # rsl_rl's "scalar": the std itself is the parameter
            self.std = nn.Parameter(torch.full((act_dim,), args.init_log_std).exp())
        nets.register_action_bounds(self, action_space)  # Gaussian samples are clipped to them on their way to the env
        self.obs_rms = observation_normalizer(obs_shape, args.obs_norm, args.obs_clip)
        self.critic_obs_rms = observation_normalizer(critic_obs_shape, args.obs_norm, args.obs_clip)

    normalize = normalize_groups  # each group through its own statistics (common.normalize)

    def memory(self, policy_obs_n: torch.Tensor, state: torch.Tensor):
        """One cell step: normalized observations [B, obs_dim] and the state -> (output [B, H], next state), with
        common.nets.rnn_step (no fused kernel: the graph compiled on a CPU is the GPU's)."""
        return nets.rnn_step(self.rnn, self.encoder(policy_obs_n), state)

    def replay(self, policy_obs_n: torch.Tensor, state: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        """The cell over sequences [T, B, ...] from `state`, zeroed where an episode starts (starts [T, B]) as the
        rollout zeroed it: the outputs [T, B, H] the rollout acted on, to float rounding (the same step as acting)."""
        keep, outputs = (~starts).unsqueeze(-1), []
        features = self.encoder(policy_obs_n)  # an image group's frames: every step's in one batch
        for t in range(features.shape[0]):
            out, state = nets.rnn_step(self.rnn, features[t], state * keep[t])
            outputs.append(out)
        return torch.stack(outputs)

    def value(self, out: torch.Tensor, obs_n: TensorDict) -> torch.Tensor:
        if self.critic_key == "critic":
            out = torch.cat([out, self.critic_encoder(obs_n["critic"]).to(out.dtype)], -1)
        return self.critic(out).squeeze(-1).float()

    def dist(self, out: torch.Tensor) -> torch.distributions.Distribution:
        return self.distribution(self.actor(out).float())  # the logits or the mean, float32 even under bf16 autocast

    def action_std(self) -> torch.Tensor:
        return self.log_std.exp() if self.std_type == "log" else self.std.clamp(min=1e-6)  # rsl_rl 5's floor

    def distribution(self, x: torch.Tensor, std=None) -> torch.distributions.Distribution:  # x: logits, or the mean
        # validate_args=False: argument checks read tensors on the host, a sync on every step.
        if self.discrete:
            return torch.distributions.Categorical(logits=x, validate_args=False)
        std = self.action_std() if std is None else std  # another std: the one a rollout acted with
        return torch.distributions.Normal(x, std.expand_as(x), validate_args=False)

    def log_prob_entropy(self, out: torch.Tensor, action: torch.Tensor):
        d = self.dist(out)
        return (d.log_prob(action), d.entropy()) if self.discrete else (d.log_prob(action).sum(-1), d.entropy().sum(-1))

    def kl(self, old_x: torch.Tensor, old_std, out: torch.Tensor) -> torch.Tensor:
        """ppo.py's: KL(old || new) of each step, exact, the distribution the rollout acted with (the actor's output
        `old_x`, its std) against the one of the cell's outputs `out`."""
        kl = torch.distributions.kl_divergence(self.distribution(old_x, old_std), self.dist(out))
        return kl if self.discrete else kl.sum(-1)

    to_env = nets.clip_to_bounds  # a Box's actions clipped to its bounds on their way to the env

    def act(self, obs: TensorDict, state: torch.Tensor):
        """One acting step: (sampled action, its log-prob, the value, the next state, the actor's output: the logits
        or the mean)."""
        obs_n = self.normalize(obs)
        out, state = self.memory(obs_n["policy"], state)
        x = self.actor(out).float()  # float32 even under bf16 autocast
        action = nets.sample(d := self.distribution(x))
        logprob = d.log_prob(action) if self.discrete else d.log_prob(action).sum(-1)
        return action, logprob, self.value(out, obs_n), state, x

    def value_from(self, obs: TensorDict, state: torch.Tensor) -> torch.Tensor:
        """V(obs) for observations reached with the hidden state `state`: one cell step, then the critic."""
        obs_n = self.normalize(obs)
        return self.value(self.memory(obs_n["policy"], state)[0], obs_n)

    def recurrent_step(self, policy_obs: torch.Tensor, state: torch.Tensor):
        """The evaluated and exported policy on raw observations: (greedy action or clipped mean, next state)."""
        out, state = self.memory(self.obs_rms(policy_obs), state)
        out = self.actor(out).float()
        return (out.argmax(-1) if self.discrete else self.to_env(out)), state


# --- The hidden state: carried over step to step, zeroed where an episode ends; minibatches of sequences ---
def carry_over(live: torch.Tensor, next_state: torch.Tensor, done: torch.Tensor) -> None:
    """The live hidden states [rows, N, H] move on to `next_state` in place, zeroed for the envs whose episode ended
    (done [N]) before the next step reads them."""
    live.copy_(next_state * ~done.unsqueeze(-1))


def episode_starts(dones: torch.Tensor) -> torch.Tensor:
    """Where an episode starts in a [T, N] rollout of `dones`: the step after each done, where the update's replay
    zeroes the state as the rollout did (never step 0: the rollout's copy of the state was zeroed already)."""
    return torch.cat([torch.zeros_like(dones[:1]), dones[:-1]])


def env_minibatches(args: Args) -> int:
    """Envs per minibatch: a minibatch is a set of envs with their whole sequences, so --num-minibatches divides
    --num-envs, or a one-line error before anything runs."""
    if args.num_envs % args.num_minibatches != 0:
        raise SystemExit(
            f"error: --num-envs {args.num_envs} does not divide into --num-minibatches {args.num_minibatches} "
            f"(a minibatch is a set of envs with their whole sequences); pick a divisor of {args.num_envs}"
        )
    return args.num_envs // args.num_minibatches


# --- GAE with truncation bootstrapping, the adaptive learning rate, the clip's groups (as ppo.py's); the loss ---
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
    """GAE(lambda) over a [T, N] rollout. A truncated episode's last reward gets gamma * V(final_obs)
    and the lambda-chain stops there; a terminated one gets no bootstrap (Pardo et al., 2018)."""
    bootstrap = truncated if every_timeout else truncated & ~terminated  # --timeout-bootstrap
    rewards = rewards + gamma * final_values * bootstrap
    dones = (terminated | truncated).float()
    advantages = torch.zeros_like(rewards)
    last_gae = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):
        not_done = 1.0 - dones[t]
        delta = rewards[t] + gamma * (next_value if t == rewards.shape[0] - 1 else values[t + 1]) * not_done - values[t]
        advantages[t] = last_gae = delta + gamma * lam * not_done * last_gae
    return advantages, advantages + values


def adapt_learning_rate(lr: torch.Tensor, kl: torch.Tensor, args: Args) -> None:
    """rsl_rl's schedule in place: lr / 1.5 when a minibatch's KL is above 2x --desired-kl, * 1.5 below half, in
    [1e-5, --lr-max]; before the step (--lr-adapt before-step), a KL of exactly 0 (the policy not moved yet) leaves it.
    """
    lower = kl < 0.5 * args.desired_kl
    if args.lr_adapt == "before-step":
        lower = lower & (kl > 0.0)
    factor = torch.where(kl > 2.0 * args.desired_kl, 1 / 1.5, torch.where(lower, 1.5, 1.0))
    lr.copy_((lr * factor).clamp(1e-5, args.lr_max))


def gradient_groups(agent: Agent, args: Args) -> list[list[nn.Parameter]]:
    """The groups of parameters whose gradient norm --max-grad-norm clips apart (--grad-clip, as ppo.py's): all of
    them, or the actor's and the critic's, the cell and the policy group's encoder in both (both heads read them)."""
    if args.grad_clip == "global":
        return [list(agent.parameters())]
    named = list(agent.named_parameters())
    actor = [p for name, p in named if name.split(".")[0] not in ("critic", "critic_encoder")]
    return [actor, [p for name, p in named if name.split(".")[0] not in ("actor", "log_std", "std")]]


def ppo_loss(agent: Agent, mb: TensorDict, state: torch.Tensor, args: Args):
    """Replay the minibatch's envs [T, B] from their initial hidden states, then the clipped surrogate + (clipped) value
    loss - entropy bonus over all their steps; returns the loss and what is logged of it, by name (losses/<name>)."""
    with torch.autocast(mb.device.type, dtype=torch.bfloat16, enabled=args.bf16):
        out = agent.replay(mb["obs_n", "policy"], state, mb["starts"])
        newlogprob, entropy = agent.log_prob_entropy(out, mb["actions"])
        newvalue = agent.value(out, mb["obs_n"])
        if args.kl_estimator == "analytic":  # rsl_rl's: the distribution the rollout acted with against this one
            with torch.no_grad():
                approx_kl = agent.kl(mb["old_out"], None if agent.discrete else mb["old_std"], out).mean()
    logratio = newlogprob - mb["logprobs"]
    ratio = logratio.exp()
    with torch.no_grad():
        if args.kl_estimator == "k3":
            approx_kl = ((ratio - 1) - logratio).mean()  # k3 estimator: unbiased, always >= 0
        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()
    adv = mb["advantages"]
    if args.adv_norm == "minibatch":
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
    if args.clip_vloss:
        v_clipped = mb["values"] + (newvalue - mb["values"]).clamp(-args.clip_coef, args.clip_coef)
        v_loss = 0.5 * torch.max((newvalue - mb["returns"]) ** 2, (v_clipped - mb["returns"]) ** 2).mean()
    else:
        v_loss = 0.5 * ((newvalue - mb["returns"]) ** 2).mean()
    entropy_loss = entropy.mean()
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
    return loss, {
        "policy_loss": pg_loss.detach(),
        "value_loss": v_loss.detach(),
        "entropy": entropy_loss.detach(),
        "approx_kl": approx_kl,
        "clipfrac": clipfrac,
    }


# --- One iteration: rollout (train's rollout_fn) -> targets -> update ---
# Functions of tensors that live as long as the run (the hidden states included), so that on CUDA each is compiled
# and captured whole.
@torch.no_grad()
def targets(
    agent: Agent,
    reward_normalizer: RewardNormalizer,
    data: TensorDict,
    next_obs: TensorDict,
    rnn_state: torch.Tensor,
    ep_stats: torch.Tensor,
    episodes: torch.Tensor,
    args: Args,
):
    """The episode statistics, (normalized) rewards and GAE of a rollout, then the observation statistics for the next
    one. Returns the [T, N] batch of sequences the update reads, the logged statistics and non-finite counts by name."""
    terminated, truncated = data["terminated"], data["truncated"]
    dones = terminated | truncated
    loop.rollout_episodes(data, dones, ep_stats, episodes)  # the logged returns: the game's score where the env has one
    nonfinite_counts = loop.rollout_nonfinite(data)  # the NaN guard's: observations and rewards
    obs_n = agent.normalize(data["obs"])  # the same statistics the policy acted with
    values, rewards = data["values"], data["rewards"]  # values computed while acting, from the cell's outputs
    with torch.autocast(data["rewards"].device.type, dtype=torch.bfloat16, enabled=args.bf16):
        next_value = agent.value_from(next_obs, rnn_state)  # the state the next rollout starts from
    if args.reward_norm:
        reward_normalizer.update(rewards, dones)
        rewards = reward_normalizer.normalize(rewards)
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
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    update_group_statistics(agent, data["obs"])  # the next rollout's statistics come from this rollout only
    starts = episode_starts(dones)  # where the replay zeroes the state, as the rollout did
    batch = dict(obs_n=obs_n, starts=starts, actions=data["actions"], logprobs=data["logprobs"], values=values)
    if args.kl_estimator == "analytic":  # the distribution the rollout acted with (env_step stored it)
        batch.update({key: data[key] for key in ("old_out", "old_std") if key in data.keys()})
    batch = TensorDict({**batch, "advantages": advantages, "returns": returns}, values.shape, values.device)
    return batch, {"explained_variance": explained_variance(returns, values)}, nonfinite_counts


# --- main and train ---
def main(args: Args) -> dict:
    with closing(start_run(args, ALGO, {"log_interval": (10, 1)})) as run, allow_rnn():  # dynamo traces the cell
        return train(run, args)  # on any exit, an error included: graphs released, then the process group left


def train(run, args: Args) -> dict:
    open_run(run)  # the run directory and the checkpoint to resume (whose flags it takes): nothing written yet
    device = run.device
    envs_per_minibatch = env_minibatches(args)  # or a one-line error: the envs must divide
    global_batch = args.num_envs * args.num_steps * run.world_size  # env steps of an iteration, over all ranks
    total_steps = max(args.total_timesteps, global_batch)  # at least one iteration
    envs, eval_envs = make_envs(run)

    next_obs, _ = envs.reset()  # the seeds make_envs gave them
    refused = "--export of a recurrent policy" if args.export or args.export_best else None
    obs_shape, critic_shape, pixel_highs = nets.group_shapes(envs, next_obs, args, refused)  # critic_shape: or None
    space = envs.single_action_space
    # rank 0's initial weights on every rank, and a grad-free twin for acting that shares the agent's storage
    agent, agent_inference = nets.agent_and_twin(
        lambda: Agent(obs_shape, critic_shape, space, args, pixel_highs), device
    )
    eval_policy = EvalPolicy(agent_inference, args.num_eval_envs, "agent")  # one hidden state per eval env
    lr = torch.tensor(args.learning_rate, device=device)  # a tensor: schedules update it in place
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=args.adam_eps, capturable=device.type == "cuda")
    clip_groups = gradient_groups(agent, args)  # --grad-clip: all the gradients, or the actor's and the critic's apart
    reward_normalizer = RewardNormalizer(args.num_envs, args.gamma, clip=args.reward_clip).to(device)

    ep_stats = torch.zeros(2, args.num_envs, device=device, dtype=torch.float64)  # running return, length
    # each env's hidden state, zero (an episode's start): the live one, which the rollout writes in place (a captured
    # graph reads it where it is), and the one at the start of the rollout, which the update replays from
    rnn_state = torch.zeros(agent.state_shape[0], args.num_envs, agent.state_shape[1], device=device)
    initial_state = torch.zeros_like(rnn_state)

    # what the checkpoints hold besides the counters, restored in place: the agent and its Adam; the learning rate and
    # the reward normalizer, the same on every rank; each rank's own envs' running returns and lengths, partial
    # discounted returns and live hidden states, so that a resume is exact
    state = TrainingState(
        agent,
        {"adam": optimizer},
        envs,
        replicated={"learning_rate": lr, "reward_normalizer": reward_normalizer},
        per_rank={"ep_stats": ep_stats, "reward_returns": reward_normalizer.returns, "rnn_state": rnn_state},
    )
    next_obs = restore(run, state, next_obs)  # envs that start fresh episodes start from zero states
    if args.eval_only:
        return eval_only(run, eval_envs, eval_policy)

    storage = RolloutStorage(args.num_steps, args.num_envs, device)
    # what the log reads, gathered on the device: episodes, losses, non-finite counts
    stats = loop.iteration_stats(device)

    # --- the iteration's functions: acting, the end of a step, the env step, the rollout, the targets, a minibatch's
    # update, the update; the compile-and-capture block below rebinds their names in place ---
    def policy_step(obs: TensorDict):
        """The action, its log-prob, the value, the cell's next state and the distribution's output."""
        with torch.no_grad(), acting_autocast(device, args.bf16):
            return agent_inference.act(obs, rnn_state)

    def end_step(final_obs: TensorDict, state: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """V(final_obs), then the hidden states of the envs whose episode ended are zeroed in place. final_obs follows
        the episode's last action, so the cell reads it with the state the episode had reached (`state`, before any
        reset), as the rollout would have had the episode gone on: its value is V of the episode's true next step."""
        with torch.no_grad(), acting_autocast(device, args.bf16):
            final_value = agent_inference.value_from(final_obs, state)
        carry_over(rnn_state, state, done)
        return final_value

    def env_step(obs: TensorDict):
        """Act and step every env once: (next observation, the transition to store, the env's info)."""
        action, logprob, value, state, out = policy_step(obs)
        next_obs, reward, terminated, truncated, info = envs.step(agent_inference.to_env(action))
        final_value = end_step(info["final_obs"], state, terminated | truncated)
        transition = {
            "obs": obs,
            "actions": action,
            "logprobs": logprob,
            "values": value,
            "final_values": final_value,
            "rewards": reward.float(),
            "terminated": terminated,
            "truncated": truncated,
        }
        # the distribution acted with: the update's KL(old || new) reads it (rsl_rl)
        if args.kl_estimator == "analytic":
            transition["old_out"] = out
            if not agent_inference.discrete:
                transition["old_std"] = agent_inference.action_std().expand_as(out)
        transition = loop.with_game_score(transition, info)  # Atari: the game's score is what is logged
        return next_obs, TensorDict(transition, batch_size=[envs.num_envs]), info

    def update_minibatch(mb: TensorDict, state: torch.Tensor):
        """One gradient step on a minibatch of sequences (gradients averaged over ranks); returns its losses."""
        loss, losses = ppo_loss(agent, mb, state, args)
        if args.lr_schedule == "adaptive" and args.lr_adapt == "before-step":  # rsl_rl's: this step at the new rate
            adapt_learning_rate(lr, distributed.all_reduce(losses["approx_kl"].clone(), "mean"), args)
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        distributed.all_reduce_gradients(agent.parameters())
        for group in clip_groups:
            nn.utils.clip_grad_norm_(group, args.max_grad_norm)
        optimizer.step()
        return losses

    def rollout_fn(obs: TensorDict) -> TensorDict:
        """--num-steps env steps, each transition into the storage at its step; no host sync, so that a built-in
        env's whole rollout is one CUDA graph. Returns the observation after the last step."""
        initial_state.copy_(rnn_state)  # the hidden states the rollout starts from: the update replays from them
        for step in range(args.num_steps):
            obs, transition, info = env_step(obs)
            storage.write(step, transition)
            record_env_log(run, info)  # the env's own metrics, logged under env/
        return obs

    def targets_fn(obs: TensorDict):
        """The targets of the rollout in the storage (targets, above), from the run's state."""
        return targets(agent, reward_normalizer, storage.data, obs, rnn_state, ep_stats, stats["episodes"], args)

    def update_fn(obs: TensorDict) -> None:
        """The targets of the rollout, then the epochs of the update; their statistics into `stats`."""
        batch, rollout_stats, nonfinite = targets_fn(obs)
        add_to(stats["losses"], rollout_stats)
        add_to(stats["nonfinite"], nonfinite)
        # epochs of minibatches of shuffled envs, each with its whole sequence and its initial hidden state; the
        # adaptive learning rate after each minibatch from the ranks' mean KL
        num_envs, loss_sums, num_updates = batch.shape[1], {}, 0
        envs_per_minibatch = num_envs // args.num_minibatches
        for epoch in range(args.update_epochs):
            if args.shuffle == "never":  # the envs in order (rsl_rl's recurrent minibatches)
                perm = torch.arange(num_envs, device=batch.device)
            elif epoch == 0 or args.shuffle == "every-epoch":  # "once": one permutation for every epoch
                perm = torch.randperm(num_envs, device=batch.device)
            for start in range(0, num_envs, envs_per_minibatch):
                mb_envs = perm[start : start + envs_per_minibatch]  # the minibatch's envs
                losses = update_minibatch(batch[:, mb_envs], initial_state[:, mb_envs])
                add_to(loss_sums, losses)
                num_updates += 1
                if args.lr_schedule == "adaptive" and args.lr_adapt == "after-step":
                    adapt_learning_rate(lr, distributed.all_reduce(losses["approx_kl"].clone(), "mean"), args)
        loop.add_update_means(stats, loss_sums, num_updates)

    # --- compile (--compile) and capture (--cudagraphs) the functions above, unchanged, each name rebound in place
    # once: the functions that call it read the wrapped one through their closures (a warning names any that kept
    # the function from before) ---
    if whole_rollout := getattr(envs, "capturable", False):  # a built-in env steps inside the graph: the whole
        env_step = compiled(run, env_step)  # rollout is one
    else:  # an adapter's simulator cannot be captured: it steps eagerly between the captured acting steps
        policy_step = captured(run, "acting", compiled(run, policy_step))
        end_step = captured(run, "end of step", compiled(run, end_step))
    update_minibatch, targets_fn = compiled(run, update_minibatch), compiled(run, targets_fn)
    rollout_fn = captured(run, "rollout", rollout_fn, capture=whole_rollout)
    # the targets and every epoch of the update as one graph: the batch never leaves it
    update_fn = captured(run, "update", update_fn)
    unwrapped_calls(run, locals())
    # the start line: the batch as minibatches of envs, then the cell
    said = (
        f"batch {global_batch} per iteration ({args.num_minibatches} minibatches of {envs_per_minibatch} envs x "
        f"{args.num_steps} steps per process); {args.cell} {args.rnn_layers}x{args.rnn_hidden_size}"
    )
    begin_training(run, said, global_batch)
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

        # the log when due (every --log-interval iterations, and before an evaluation or a save: one host read) of the
        # iterations since the last log, then the evaluation and checkpoints due; a stop, the same on every rank
        due = what_is_due(run, final_iteration=run.global_step >= run.final_step)  # begin_training set final_step
        if due.log:
            iterations_since_last_log = (run.global_step - run.reduced_step) // run.steps_per_iteration
            loop.log_iteration(run, stats, iterations_since_last_log, {"charts/learning_rate": lr})
        if loop.evaluate_and_save(run, due, eval_envs, eval_policy, state, next_obs):
            break
    return finish(run, agent)


if __name__ == "__main__":
    main(parse_args(Args))
