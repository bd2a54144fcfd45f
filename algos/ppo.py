"""Proximal Policy Optimization for massively parallel, GPU-resident environments.

    python algos/ppo.py --env-id CartPole-v1 --num-envs 4096
    torchrun --nproc-per-node 8 algos/ppo.py --env-id Pendulum-v1 --num-envs 4096

One file, read top to bottom: Args -> setup -> networks -> rollout -> GAE -> update -> logging.
`--num-envs` is per process; `--total-timesteps` counts env steps over all processes.
References: Schulman et al. 2017 (PPO), 2016 (GAE); Huang et al. 2022, "The 37 implementation
details of PPO"; Rudin et al. 2022 (rsl_rl: adaptive learning rate from the measured KL).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import gymnasium as gym
import torch
import torch.nn as nn
import tyro
from tensordict import TensorDict, from_module
from torch.utils.tensorboard import SummaryWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from common import distributed  # noqa: E402
from common.buffer import RolloutStorage  # noqa: E402
from common.checkpoint import (  # noqa: E402
    BEST, FORMAT_VERSION, LAST, CheckpointError, checkpoint_dir, elastic_restart_count, gather_rng_states,
    load_checkpoint, load_optimizer_state, resolve_resume, restore_rank_rng_state, save_checkpoint, stable_run_name,
)
from common.envs import make_env  # noqa: E402
from common.normalize import RewardNormalizer, RunningMeanStd  # noqa: E402

ALGO = "ppo"


@dataclass
class Args:
    # --- experiment ---
    env_id: str = "CartPole-v1"
    """environment id: a built-in env (CartPole-v1, Pendulum-v1, ...) or an adapter prefix (gym:..., mjlab:...)"""
    num_envs: int = 4096
    """parallel environments per process (per GPU)"""
    env_kwargs: str | None = None
    """JSON object of extra make_env arguments, e.g. '{"max_episode_steps": 100}' or '{"vectorization": "async"}'"""
    total_timesteps: int = 5_000_000
    """env steps to train for, summed over all processes"""
    seed: int = 1
    """seed of the experiment; rank r seeds its envs and sampling with seed + r"""
    device: str = "auto"
    """'auto' (this rank's GPU if any, else CPU), 'cpu', 'cuda'"""
    torch_deterministic: bool = True
    """use deterministic algorithms (cudnn.deterministic, deterministic kernels where they exist)"""
    output_dir: str = "runs"
    """where run directories are created"""
    run_name: str | None = None
    """name of the run directory; default {env_id}__ppo__{seed}__{timestamp}"""
    resume: str | None = None
    """checkpoint to resume from: a path, a run directory, or 'auto' (this run's last.pt if it exists)"""
    eval_only: bool = False
    """load --resume, evaluate the deterministic policy, print the returns, and exit"""
    save_interval: int = 50
    """iterations between writes of checkpoints/last.pt (also written at the end and on SIGTERM/SIGUSR1)"""
    save_interval_seconds: float | None = None
    """also write last.pt when this many seconds have passed since the last write"""
    eval_interval: int = 10
    """iterations between evaluations (0 disables); best.pt is written when the eval return improves"""
    eval_episodes: int = 1
    """episodes per eval env in an evaluation"""
    num_eval_envs: int = 128
    """eval environments per process (separate from the training envs)"""
    target_return: float | None = None
    """stop once the eval return reaches this value"""
    max_wall_seconds: float | None = None
    """stop (and save) after this many seconds of training"""
    track: bool = False
    """mirror the TensorBoard logs to Weights & Biases"""
    wandb_project_name: str = "parallel-rl"
    """wandb project"""
    wandb_entity: str | None = None
    """wandb team or user"""
    progress: bool = True
    """show a progress bar on the main process (only on a terminal, never under CI)"""
    compile: bool = False
    """torch.compile the acting step, the advantage computation and the update step"""
    cudagraphs: bool = False
    """capture the acting and update steps in CUDA graphs (CUDA only)"""
    bf16: bool = False
    """run the networks under bfloat16 autocast (distribution math and losses stay float32)"""
    dist_timeout: float = 600.0
    """seconds a collective may wait for the other ranks before the run fails (a dead or hung rank)"""

    # --- PPO ---
    num_steps: int = 24
    """steps per env per rollout; the batch per process is num_envs * num_steps"""
    num_minibatches: int = 4
    """minibatches per epoch"""
    update_epochs: int = 5
    """epochs over the batch per iteration"""
    learning_rate: float = 1e-3
    """initial learning rate of Adam"""
    lr_schedule: Literal["constant", "linear", "adaptive"] = "adaptive"
    """constant; linear anneal to 0; or adaptive from the measured KL (rsl_rl)"""
    anneal_lr: bool = False
    """CleanRL's flag: same as --lr-schedule linear"""
    desired_kl: float = 0.01
    """KL the adaptive schedule aims for: lr / 1.5 above 2x, lr * 1.5 below 0.5x"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    norm_adv: bool = True
    """normalize advantages"""
    adv_norm_scope: Literal["minibatch", "batch"] = "minibatch"
    """normalize advantages per minibatch (CleanRL) or once over the whole batch (rsl_rl)"""
    clip_coef: float = 0.2
    """surrogate clipping coefficient"""
    clip_vloss: bool = True
    """clip the value loss around the old values"""
    ent_coef: float = 0.005
    """entropy bonus coefficient"""
    vf_coef: float = 1.0
    """value loss coefficient"""
    max_grad_norm: float = 1.0
    """global gradient-norm clip"""
    target_kl: float | None = None
    """stop the epoch loop early when the approximate KL exceeds this"""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """hidden layer sizes of the actor and the critic"""
    activation: Literal["tanh", "elu", "relu", "silu"] = "tanh"
    """activation of the hidden layers"""
    init_log_std: float = 0.0
    """initial log standard deviation of the Gaussian policy (continuous actions)"""
    asymmetric_critic: bool = True
    """feed the critic the env's 'critic' observations when it provides them"""
    obs_norm: bool = True
    """normalize observations with running statistics of the rollouts"""
    obs_clip: float = 10.0
    """clip normalized observations to [-obs_clip, obs_clip]"""
    reward_norm: bool = True
    """scale rewards by the running std of the discounted return (keeps the value loss O(1), so the
    global gradient clip does not starve the policy when returns are large)"""
    reward_clip: float = 10.0
    """clip normalized rewards to [-reward_clip, reward_clip]"""


# ----------------------------------------------------------------------------------------------
# Networks
# ----------------------------------------------------------------------------------------------
ACTIVATIONS = {"tanh": nn.Tanh, "elu": nn.ELU, "relu": nn.ReLU, "silu": nn.SiLU}


def layer_init(layer: nn.Linear, gain: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, out_dim: int, hidden: tuple[int, ...], activation: str, out_gain: float) -> nn.Sequential:
    layers, last = [], in_dim
    for h in hidden:
        layers += [layer_init(nn.Linear(last, h)), ACTIVATIONS[activation]()]
        last = h
    layers.append(layer_init(nn.Linear(last, out_dim), gain=out_gain))
    return nn.Sequential(*layers)


class Agent(nn.Module):
    """Actor and critic MLPs, with the observation normalizers so that one state_dict holds all.

    Discrete spaces get a Categorical over logits; Box spaces a diagonal Gaussian with a
    state-independent log-std. The critic reads the "critic" observations when given.
    """

    def __init__(self, obs_dim: int, critic_obs_dim: int | None, action_space: gym.Space, args: Args):
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.critic_key = "critic" if critic_obs_dim is not None else "policy"
        act_dim = int(action_space.n) if self.discrete else int(action_space.shape[0])
        self.actor = mlp(obs_dim, act_dim, args.hidden_sizes, args.activation, out_gain=0.01)
        self.critic = mlp(critic_obs_dim or obs_dim, 1, args.hidden_sizes, args.activation, out_gain=1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((act_dim,), args.init_log_std))
        clip = args.obs_clip
        self.obs_rms = RunningMeanStd(obs_dim, clip=clip) if args.obs_norm else nn.Identity()
        self.critic_obs_rms = (
            RunningMeanStd(critic_obs_dim, clip=clip) if args.obs_norm and critic_obs_dim is not None else None
        )

    def normalize(self, obs: TensorDict) -> TensorDict:
        out = {"policy": self.obs_rms(obs["policy"])}
        if self.critic_key == "critic":
            out["critic"] = self.critic_obs_rms(obs["critic"]) if self.critic_obs_rms is not None else obs["critic"]
        return TensorDict(out, batch_size=obs.batch_size)

    def value(self, obs_n: TensorDict) -> torch.Tensor:
        return self.critic(obs_n[self.critic_key]).squeeze(-1).float()

    def dist(self, policy_obs_n: torch.Tensor) -> torch.distributions.Distribution:
        out = self.actor(policy_obs_n).float()  # float32 even under bf16 autocast
        # validate_args=False: argument checks read tensors on the host, a sync on every step.
        if self.discrete:
            return torch.distributions.Categorical(logits=out, validate_args=False)
        return torch.distributions.Normal(out, self.log_std.exp().expand_as(out), validate_args=False)

    def log_prob_entropy(self, policy_obs_n: torch.Tensor, action: torch.Tensor):
        d = self.dist(policy_obs_n)
        if self.discrete:
            return d.log_prob(action), d.entropy()
        return d.log_prob(action).sum(-1), d.entropy().sum(-1)

    def act(self, obs: TensorDict, deterministic: bool = False):
        """One acting step: normalize, sample (or take the mode), return the action and its log-prob."""
        policy_obs_n = self.obs_rms(obs["policy"])
        d = self.dist(policy_obs_n)
        if deterministic:
            action = d.probs.argmax(-1) if self.discrete else d.mean
        else:
            action = d.sample()
        logprob = d.log_prob(action) if self.discrete else d.log_prob(action).sum(-1)
        return action, logprob


# ----------------------------------------------------------------------------------------------
# GAE with truncation bootstrapping
# ----------------------------------------------------------------------------------------------
def compute_advantages(rewards, values, next_value, final_values, terminated, truncated, gamma: float, lam: float):
    """GAE(lambda) over a [T, N] rollout.

    An episode that *terminated* has no future: no bootstrap. One that was *truncated* by the
    time limit does: its last reward gets gamma * V(final_obs), the value of the true last
    observation (the env has already reset to a new episode), and the lambda-chain stops there
    because the next stored state belongs to the new episode. Treating truncation as
    termination teaches the critic that time-outs are terminal, which biases every value near
    the time limit (Pardo et al., 2018).
    """
    bootstrap = truncated & ~terminated
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


# ----------------------------------------------------------------------------------------------
# Evaluation: deterministic policy on separate envs, reduced over ranks
# ----------------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(agent: Agent, eval_envs, episodes: int, seed: int, bounds=None):
    """Mean return and length of the first `episodes` episodes of every eval env, over all ranks."""
    n, dev = eval_envs.num_envs, eval_envs.device
    obs, _ = eval_envs.reset(seed=seed)
    ep_ret = torch.zeros(n, device=dev, dtype=torch.float64)
    ep_len = torch.zeros(n, device=dev, dtype=torch.float64)
    done_count = torch.zeros(n, device=dev, dtype=torch.long)
    sums = torch.zeros(3, device=dev, dtype=torch.float64)  # return sum, length sum, episodes
    max_steps = getattr(eval_envs, "max_episode_steps", None) or 10_000
    for step in range(max_steps * episodes + 1):
        action, _ = agent.act(obs, deterministic=True)
        obs, reward, terminated, truncated, _ = eval_envs.step(to_env_action(action, bounds))
        active = done_count < episodes
        ep_ret += reward.double() * active
        ep_len += active.double()
        done = (terminated | truncated) & active
        sums += torch.stack([(ep_ret * done).sum(), (ep_len * done).sum(), done.double().sum()])
        done_count += done.long()
        ep_ret *= ~done
        ep_len *= ~done
        if step % 64 == 63 and bool((done_count >= episodes).all()):  # a sync every 64 steps, not every step
            break
    distributed.all_reduce(sums)
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


def peak_memory_mb(device: torch.device) -> float:
    """Peak GPU memory allocated by torch on CUDA; peak resident set size of the process on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def action_bounds(space: gym.Space, device):
    """(low, high) tensors of a bounded Box, else None: Gaussian samples are clipped to them
    before they reach the env (the stored action and its log-prob keep the raw sample)."""
    if isinstance(space, gym.spaces.Box) and space.is_bounded():
        return torch.as_tensor(space.low, device=device), torch.as_tensor(space.high, device=device)
    return None


def to_env_action(action: torch.Tensor, bounds) -> torch.Tensor:
    return action if bounds is None else torch.maximum(torch.minimum(action, bounds[1]), bounds[0])


# ----------------------------------------------------------------------------------------------
def main(args: Args) -> dict:
    # --- distributed setup: rank, world size, device; seed offset per rank (nanoGPT's recipe) ---
    dist_info = distributed.setup(args.device, timeout_seconds=args.dist_timeout)
    rank, world_size, device, master = dist_info.rank, dist_info.world_size, dist_info.device, dist_info.is_main
    if args.anneal_lr:
        args.lr_schedule = "linear"
    if args.cudagraphs and device.type != "cuda":
        raise SystemExit("error: --cudagraphs needs a CUDA device; drop it or use --device cuda")
    batch_size = args.num_envs * args.num_steps  # per process
    if batch_size % args.num_minibatches != 0:
        raise SystemExit(
            f"error: the batch of num_envs*num_steps = {args.num_envs}*{args.num_steps} = {batch_size} does not divide "
            f"into --num-minibatches {args.num_minibatches}; pick a divisor of {batch_size}"
        )
    minibatch_size = batch_size // args.num_minibatches
    global_batch = batch_size * world_size
    total_steps = max(args.total_timesteps, global_batch)  # at least one iteration
    num_iterations = total_steps // global_batch
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)

    # --- environments: different seeds per rank; eval envs separate from training envs ---
    try:
        env_kwargs = json.loads(args.env_kwargs) if args.env_kwargs else {}
        envs = make_env(args.env_id, args.num_envs, device, seed=args.seed + rank * args.num_envs, **env_kwargs)
        eval_envs = make_env(args.env_id, args.num_eval_envs, device, seed=args.seed + 10**8 + rank * args.num_eval_envs, **env_kwargs)
    except (ValueError, TypeError) as e:  # unknown id (the message lists the known ones), bad --env-kwargs
        raise SystemExit(f"error: {e}") from None

    torch.manual_seed(args.seed + rank)  # after the envs: some simulators (mjlab) seed the global generators

    # --- run directory: rank 0 names it (the same name after a torchrun restart), everyone agrees ---
    run_name = args.run_name
    if run_name is None and master:
        default = f"{args.env_id.replace(':', '-').replace('/', '-')}__{ALGO}__{args.seed}__{int(time.time())}"
        try:
            run_name = default if args.eval_only else stable_run_name(default, args.output_dir)
        except OSError:
            run_name = default  # reported just below, with the directory
    run_name = distributed.broadcast_object(run_name)
    run_dir = Path(args.output_dir) / run_name
    if master and not args.eval_only:
        try:
            checkpoint_dir(run_dir).mkdir(parents=True, exist_ok=True)
            (run_dir / "config.json").write_text(json.dumps(asdict(args), indent=2))
        except OSError as e:
            raise SystemExit(f"error: cannot write the run directory {run_dir} ({e.strerror}); choose --output-dir") from None
    distributed.barrier()
    if args.resume is None and elastic_restart_count() > 0:
        args.resume = "auto"  # torchrun restarted the workers after a fault: continue from last.pt
    resume_path = resolve_resume(args.resume, run_dir) if args.resume else None
    if args.eval_only and resume_path is None:
        raise SystemExit("error: --eval-only needs --resume PATH of a checkpoint")
    checkpoint = load_checkpoint(resume_path, algo=ALGO, env_id=args.env_id) if resume_path else None

    writer, wandb_run = None, None
    if master and not args.eval_only:
        if args.track:
            try:
                import wandb
            except ImportError:
                raise SystemExit("error: --track needs wandb: pip install wandb (or the [wandb] extra)") from None
            wandb_run = wandb.init(
                project=args.wandb_project_name, entity=args.wandb_entity, name=run_name, id=run_name,
                resume="allow", config=asdict(args), sync_tensorboard=True, dir=str(run_dir),
            )
        # purge_step: a resumed run drops the events logged after its checkpoint, so the curves
        # stay one line without the repeated steps of the work lost to the fault.
        writer = SummaryWriter(str(run_dir), purge_step=checkpoint["global_step"] + 1 if checkpoint else None)
        table = "\n".join(f"|{k}|{v}|" for k, v in asdict(args).items())
        writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")

    bounds = action_bounds(envs.single_action_space, device)
    next_obs, _ = envs.reset(seed=args.seed + rank * args.num_envs)
    obs_dim = next_obs["policy"].shape[-1]
    critic_dim = next_obs["critic"].shape[-1] if args.asymmetric_critic and "critic" in next_obs.keys() else None

    agent = Agent(obs_dim, critic_dim, envs.single_action_space, args).to(device)
    distributed.broadcast_module(agent)  # identical initial weights on every rank
    # Grad-free twin for acting that shares the agent's storage: no copies, no autograd in the rollout.
    agent_inference = Agent(obs_dim, critic_dim, envs.single_action_space, args).to(device)
    from_module(agent).data.to_module(agent_inference)
    lr = torch.tensor(args.learning_rate, device=device)  # a tensor: schedules update it in place
    # capturable on CUDA: step counts and lr stay on the device, so optimizer.step() never syncs.
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, capturable=device.type == "cuda")
    reward_normalizer = RewardNormalizer(args.num_envs, args.gamma, clip=args.reward_clip).to(device) if args.reward_norm else None

    # --- resume ---
    global_step, start_iteration, best_eval_return = 0, 0, -math.inf
    ep_stats = torch.zeros(2, args.num_envs, device=device, dtype=torch.float64)  # running return, length
    if checkpoint is not None:
        try:
            agent.load_state_dict(checkpoint["model"])
            load_optimizer_state(optimizer, checkpoint["optimizer"])
        except (RuntimeError, ValueError, KeyError) as e:
            saved = checkpoint["args"]
            raise SystemExit(
                f"error: {resume_path} holds networks of another shape (saved with --hidden-sizes "
                f"{' '.join(map(str, saved['hidden_sizes']))}, obs_norm={saved['obs_norm']}); resume with the same flags "
                f"({str(e).splitlines()[0][:120]})"
            ) from None
        lr.fill_(checkpoint["learning_rate"])
        if reward_normalizer is not None and "reward_normalizer" in checkpoint:
            reward_normalizer.load_state_dict(checkpoint["reward_normalizer"])
        global_step, start_iteration = checkpoint["global_step"], checkpoint["iteration"]
        best_eval_return = checkpoint["best_eval_return"]
        same_shape = checkpoint["world_size"] == world_size and checkpoint["args"]["num_envs"] == args.num_envs
        if same_shape and restore_rank_rng_state(checkpoint["rng"], rank, world_size) and "env" in checkpoint:
            env_ckpt = checkpoint["env"][rank]
            if env_ckpt["state"]:  # an env that cannot be snapshotted (gym:, mjlab:) starts fresh episodes
                envs.load_state_dict(env_ckpt["state"])
                next_obs = TensorDict(env_ckpt["next_obs"], batch_size=[args.num_envs]).to(device)
                ep_stats.copy_(env_ckpt["ep_stats"])
                if reward_normalizer is not None and "reward_returns" in env_ckpt:
                    reward_normalizer.returns.copy_(env_ckpt["reward_returns"])
        elif master:
            print(f"notice: checkpoint from {checkpoint['world_size']} process(es) x {checkpoint['args']['num_envs']} envs; "
                  f"env and RNG streams re-derived from the seed (model, optimizer, normalizers restored)", flush=True)
        if master:
            print(f"resumed from {resume_path} at iteration {start_iteration}, global step {global_step}", flush=True)

    if args.eval_only:
        ret, length = evaluate(agent_inference, eval_envs, args.eval_episodes, seed=args.seed + 10**8 + rank * args.num_eval_envs, bounds=bounds)
        if master:
            print(json.dumps({"eval_episodic_return": ret, "eval_episodic_length": length, "checkpoint": str(resume_path)}))
        distributed.cleanup()
        return {"eval_return": ret}

    # --- the three hot functions; compiled / graph-captured on request ---
    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)

    def policy_step(obs: TensorDict):
        with autocast():
            return agent_inference.act(obs)

    def update_minibatch(mb: TensorDict):
        """One gradient step on a minibatch; returns its losses for logging (on the device)."""
        with autocast():
            newlogprob, entropy = agent.log_prob_entropy(mb["obs_n", "policy"], mb["actions"])
            newvalue = agent.value(mb["obs_n"])
        logratio = newlogprob - mb["logprobs"]
        ratio = logratio.exp()
        with torch.no_grad():
            approx_kl = ((ratio - 1) - logratio).mean()  # k3 estimator: unbiased, always >= 0
            clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()
        adv = mb["advantages"]
        if args.norm_adv and args.adv_norm_scope == "minibatch":
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
        if args.clip_vloss:
            v_clipped = mb["values"] + (newvalue - mb["values"]).clamp(-args.clip_coef, args.clip_coef)
            v_loss = 0.5 * torch.max((newvalue - mb["returns"]) ** 2, (v_clipped - mb["returns"]) ** 2).mean()
        else:
            v_loss = 0.5 * ((newvalue - mb["returns"]) ** 2).mean()
        entropy_loss = entropy.mean()
        loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        distributed.all_reduce_gradients(agent.parameters())
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizer.step()
        return torch.stack([pg_loss, v_loss, entropy_loss, approx_kl, clipfrac]).detach()

    advantages_fn = compute_advantages
    if args.compile:
        policy_step = torch.compile(policy_step)
        update_minibatch = torch.compile(update_minibatch)
        advantages_fn = torch.compile(compute_advantages)
    if args.cudagraphs:
        from tensordict.nn import CudaGraphModule

        warmup = 3 if args.compile else 2  # eager calls before capture; compiled functions recompile once more
        policy_step = CudaGraphModule(policy_step, warmup=warmup)
        update_minibatch = CudaGraphModule(update_minibatch, warmup=warmup)

    storage = RolloutStorage(args.num_steps, args.num_envs, device)
    guard = distributed.PreemptionGuard()
    if master:
        print(
            f"{ALGO} on {args.env_id}: {world_size} process(es) x {args.num_envs} envs on {device}; batch "
            f"{global_batch} per iteration ({batch_size} per process, {args.num_minibatches} minibatches of "
            f"{minibatch_size}); {num_iterations} iterations for {total_steps} steps; run dir {run_dir}",
            flush=True,
        )
    progress = None
    if master and args.progress and not os.environ.get("CI") and sys.stderr.isatty():
        from tqdm import tqdm

        progress = tqdm(total=total_steps, initial=global_step, unit="step", unit_scale=True, dynamic_ncols=True)

    def save(path_name: str, iteration: int):
        """Every rank contributes its RNG and env state; rank 0 writes atomically."""
        rng = gather_rng_states()
        per_rank = {"state": envs.state_dict(), "next_obs": next_obs.cpu().to_dict(), "ep_stats": ep_stats.cpu()}
        if reward_normalizer is not None:  # each rank's envs have their own partial discounted returns
            per_rank["reward_returns"] = reward_normalizer.returns.cpu()
        env_state = distributed.all_gather_object(per_rank)
        if not master:
            return None
        return save_checkpoint(
            {
                "format_version": FORMAT_VERSION, "algo": ALGO, "env_id": args.env_id, "args": asdict(args),
                "world_size": world_size, "global_step": global_step, "iteration": iteration,
                "model": agent.state_dict(), "optimizer": optimizer.state_dict(), "learning_rate": float(lr),
                "reward_normalizer": reward_normalizer.state_dict() if reward_normalizer is not None else None,
                "best_eval_return": best_eval_return, "rng": rng, "env": env_state,
            },
            checkpoint_dir(run_dir) / path_name,
        )

    start_time, stop_reason = time.time(), "total_timesteps"
    last_train_return, sps, iteration = float("nan"), 0.0, start_iteration
    steps_at_start, last_save_time = global_step, time.time()
    time_totals = [0.0, 0.0]  # rollout, update seconds
    sync_device = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    # Counted in env steps, not iterations: a run resumed with another world size still ends at
    # --total-timesteps and its linear schedule continues where it was.
    while global_step + global_batch <= total_steps:
        iteration += 1
        final_iteration = global_step + 2 * global_batch > total_steps
        if args.lr_schedule == "linear":
            lr.fill_(args.learning_rate * (1.0 - global_step / total_steps))

        # --- rollout: no host-device synchronisation in this loop ---
        rollout_start = time.time()
        env_log_sums: dict[str, list] = {}  # name -> [sum, steps on which the env reported it]
        for step in range(args.num_steps):
            with torch.no_grad():
                action, logprob = policy_step(next_obs)
            obs = next_obs
            next_obs, reward, terminated, truncated, info = envs.step(to_env_action(action, bounds))
            storage.write(step, TensorDict(
                {"obs": obs, "final_obs": info["final_obs"], "actions": action, "logprobs": logprob,
                 "rewards": reward.float(), "terminated": terminated, "truncated": truncated},
                batch_size=[args.num_envs],
            ))
            for k, v in info.get("log", {}).items():
                acc = env_log_sums.setdefault(k, [0.0, 0])
                acc[0], acc[1] = acc[0] + v, acc[1] + 1
        sync_device()  # two syncs per iteration so the rollout/update split is GPU time, not launch time
        rollout_time = time.time() - rollout_start
        time_totals[0] += rollout_time
        global_step += global_batch
        data = storage.data

        # --- finished-episode statistics, on the device ---
        with torch.no_grad():
            dones = data["terminated"] | data["truncated"]
            ep_sums = torch.zeros(3, device=device, dtype=torch.float64)  # return sum, length sum, count
            for t in range(args.num_steps):
                ep_stats[0] += data["rewards"][t]
                ep_stats[1] += 1
                d = dones[t]
                ep_sums += torch.stack([(ep_stats[0] * d).sum(), (ep_stats[1] * d).sum(), d.sum().double()])
                ep_stats *= ~d

        # --- values, bootstrap values and advantages, batched over the whole rollout ---
        with torch.no_grad():
            obs_n = agent.normalize(data["obs"])  # the same statistics the policy acted with
            with autocast():
                values = agent.value(obs_n)
                final_values = agent.value(agent.normalize(data["final_obs"]))
                next_value = agent.value(agent.normalize(next_obs))
            rewards = data["rewards"]
            if reward_normalizer is not None:
                reward_normalizer.update(rewards, dones)
                rewards = reward_normalizer.normalize(rewards)
            advantages, returns = advantages_fn(
                rewards, values, next_value, final_values, data["terminated"], data["truncated"], args.gamma, args.gae_lambda
            )
            if args.norm_adv and args.adv_norm_scope == "batch":
                advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
            # Statistics for the next rollout come from this rollout's data only (never eval data).
            if args.obs_norm:
                agent.obs_rms.update(data["obs", "policy"])
                if agent.critic_obs_rms is not None:
                    agent.critic_obs_rms.update(data["obs", "critic"])

        # --- update: epochs of shuffled minibatches over the [T*N] batch ---
        update_start = time.time()
        batch = TensorDict(
            {"obs_n": obs_n, "actions": data["actions"], "logprobs": data["logprobs"], "values": values,
             "advantages": advantages, "returns": returns},
            batch_size=[args.num_steps, args.num_envs],
        ).reshape(-1)
        loss_sums = torch.zeros(5, device=device)
        num_updates = 0
        for epoch in range(args.update_epochs):
            perm = torch.randperm(batch_size, device=device)
            for start in range(0, batch_size, minibatch_size):
                stats = update_minibatch(batch[perm[start : start + minibatch_size]])
                loss_sums += stats
                num_updates += 1
                if args.lr_schedule == "adaptive":
                    kl = distributed.all_reduce(stats[3].clone(), "mean")  # same decision on every rank
                    factor = torch.where(kl > 2.0 * args.desired_kl, 1 / 1.5, torch.where(kl < 0.5 * args.desired_kl, 1.5, 1.0))
                    lr.copy_((lr * factor).clamp(1e-5, 1e-2))
            if args.target_kl is not None:
                epoch_kl = distributed.all_reduce(loss_sums[3:4] / num_updates, "mean")
                if epoch_kl.item() > args.target_kl:  # one sync per epoch, only when asked for
                    break
        sync_device()
        update_time = time.time() - update_start
        time_totals[1] += update_time

        # --- once per iteration: one host sync for logging, the NaN guard and the stop signal ---
        with torch.no_grad():
            y_pred, y_true = values.reshape(-1), returns.reshape(-1)
            var_y = y_true.var()
            explained_var = torch.where(var_y > 0, 1 - (y_true - y_pred).var() / var_y, torch.nan)
            finite = torch.stack([
                torch.isfinite(data["obs", "policy"]).all(), torch.isfinite(data["rewards"]).all(),
                torch.isfinite(loss_sums).all(),
            ]).double()
            # Decisions from this rank's clock or signals, summed over ranks: all stop or save together.
            now = time.time()
            flags = [guard.received is not None,
                     args.max_wall_seconds is not None and now - start_time >= args.max_wall_seconds,
                     args.save_interval_seconds is not None and now - last_save_time >= args.save_interval_seconds]
            stop_flag = torch.tensor([float(f) for f in flags], device=device, dtype=torch.float64)
            packed = torch.cat([ep_sums, finite, stop_flag, loss_sums.double() / num_updates, explained_var.double().reshape(1)])
            distributed.all_reduce(packed)  # episode sums add up; the rest is averaged below
            # The env's own metrics are rank 0's alone (ranks may report different keys); same single sync.
            env_means = [torch.as_tensor(s / c, device=device).double().mean().reshape(1) for s, c in env_log_sums.values()]
            host = torch.cat([packed, *env_means]).tolist()
        ep_ret_sum, ep_len_sum, ep_count = host[0:3]
        nonfinite = [name for name, ok in zip(("observations", "rewards", "losses"), host[3:6]) if ok < world_size]
        if nonfinite:
            raise FloatingPointError(
                f"non-finite {', '.join(nonfinite)} at iteration {iteration}; last good checkpoint kept in {checkpoint_dir(run_dir)}"
            )
        stop_signal, out_of_time, save_time_due = (x > 0 for x in host[6:9])
        pg_loss, v_loss, entropy, approx_kl, clipfrac = [x / world_size for x in host[9:14]]
        explained = host[14] / world_size
        env_values = host[15:]
        sps = (global_step - steps_at_start) / (time.time() - start_time)
        if ep_count > 0:
            last_train_return = ep_ret_sum / ep_count

        if master:
            writer.add_scalar("charts/SPS", sps, global_step)
            writer.add_scalar("charts/learning_rate", float(lr), global_step)
            if ep_count > 0:
                writer.add_scalar("charts/episodic_return", ep_ret_sum / ep_count, global_step)
                writer.add_scalar("charts/episodic_length", ep_len_sum / ep_count, global_step)
            for name, value in zip(("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac"), (pg_loss, v_loss, entropy, approx_kl, clipfrac)):
                writer.add_scalar(f"losses/{name}", value, global_step)
            writer.add_scalar("losses/explained_variance", explained, global_step)
            for name, value in zip(env_log_sums.keys(), env_values):
                writer.add_scalar(f"env/{name}", value, global_step)
            writer.add_scalar("charts/rollout_seconds", rollout_time, global_step)
            writer.add_scalar("charts/update_seconds", update_time, global_step)
            writer.flush()  # the curves on disk keep up with training, also for a run that gets killed
            if progress is not None:
                progress.update(global_batch)
                progress.set_postfix(sps=f"{sps:,.0f}", ret=f"{last_train_return:.1f}", refresh=False)

        # --- evaluation, checkpoints and stop conditions (identical decisions on every rank) ---
        reached_target = False
        if args.eval_interval > 0 and (iteration % args.eval_interval == 0 or final_iteration):
            eval_return, eval_length = evaluate(agent_inference, eval_envs, args.eval_episodes, seed=args.seed + 10**8 + rank * args.num_eval_envs + iteration, bounds=bounds)
            if master:
                writer.add_scalar("eval/episodic_return", eval_return, global_step)
                writer.add_scalar("eval/episodic_length", eval_length, global_step)
                msg = f"iteration {iteration}/{num_iterations} step {global_step:,}: eval return {eval_return:.2f}, train return {last_train_return:.2f}, SPS {sps:,.0f}"
                (progress.write if progress is not None else print)(msg)
            if eval_return > best_eval_return:
                best_eval_return = eval_return
                save(BEST, iteration)
            reached_target = args.target_return is not None and eval_return >= args.target_return
        save_due = iteration % args.save_interval == 0 or final_iteration or save_time_due
        if reached_target or out_of_time or stop_signal or save_due:
            save(LAST, iteration)
            last_save_time = time.time()
        if reached_target or out_of_time or stop_signal:
            stop_reason = "target_return" if reached_target else "max_wall_seconds" if out_of_time else f"signal:{guard.received or 'peer'}"
            break

    # --- wrap up ---
    guard.restore()
    in_sync = distributed.check_in_sync(agent)  # averaged gradients keep every rank's weights bit-identical
    if not in_sync and master:
        print("warning: the ranks' parameters differ; a non-deterministic collective or a rank-local update diverged them", flush=True)
    if progress is not None:
        progress.close()
    summary = {
        "algo": ALGO, "env_id": args.env_id, "run_dir": str(run_dir), "global_step": global_step, "iteration": iteration,
        "wall_seconds": time.time() - start_time, "sps": sps,
        "last_train_return": None if math.isnan(last_train_return) else last_train_return,  # strict JSON: no NaN
        "best_eval_return": best_eval_return if best_eval_return > -math.inf else None, "stop_reason": stop_reason,
        "world_size": world_size, "params_in_sync": in_sync,
        "rollout_seconds": time_totals[0], "update_seconds": time_totals[1], "peak_memory_mb": peak_memory_mb(device),
        "checkpoints": {"last": str(checkpoint_dir(run_dir) / LAST), "best": str(checkpoint_dir(run_dir) / BEST)},
    }
    if master:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        writer.close()
        if wandb_run is not None:
            wandb_run.finish()
        print(json.dumps(summary), flush=True)
    distributed.cleanup()
    return summary


if __name__ == "__main__":
    try:
        main(tyro.cli(Args))
    except CheckpointError as e:
        raise SystemExit(f"error: {e}") from None
