"""Soft Actor-Critic for massively parallel, GPU-resident environments (FastSAC style).

    torchrun --nproc-per-node 8 algos/sac.py --env-id <task> --num-envs 1024 --batch-size 32768
    python algos/sac.py --env-id Pendulum-v1 --device cpu --num-envs 64 --batch-size 512 --num-updates 4 \
        --hidden-sizes 64 64 --q-lr 3e-3 --policy-lr 3e-3 --tau 0.05 --learning-starts 3200
        # CPU, seeds 1-3: eval return >= -200 after 13-21k env steps (200-325 iterations)

One file, read top to bottom: Args -> networks -> setup -> loop (act, store, update, log).
An iteration is one vectorised step of every env followed by `--num-updates` gradient updates
on large replay batches; `--num-envs` is per process, `--total-timesteps` counts env steps of
all processes. Continuous actions only (use ppo.py or pqn.py for discrete ones).
References: Haarnoja et al. 2018 (SAC, and "SAC algorithms and applications": automatic
entropy tuning); Fujimoto et al. 2018 (clipped double Q); Seo et al. 2025 (FastTD3 / FastSAC).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import gymnasium as gym
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from tensordict import TensorDict, from_module
from torch.utils.tensorboard import SummaryWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from common import distributed  # noqa: E402
from common.buffer import ReplayBuffer  # noqa: E402
from common.checkpoint import (  # noqa: E402
    BEST, FORMAT_VERSION, LAST, CheckpointError, checkpoint_dir, elastic_restart_count, gather_rng_states,
    load_checkpoint, load_optimizer_state, resolve_resume, restore_rank_rng_state, save_checkpoint, stable_run_name,
)
from common.envs import make_env  # noqa: E402
from common.normalize import RewardNormalizer, RunningMeanStd  # noqa: E402

ALGO = "sac"


@dataclass
class Args:
    # --- experiment ---
    env_id: str = "Pendulum-v1"
    """environment id with a continuous (Box) action space: a built-in env or an adapter prefix (gym:..., mjlab:...)"""
    num_envs: int = 1024
    """parallel environments per process (per GPU)"""
    env_kwargs: str | None = None
    """JSON object of extra make_env arguments, e.g. '{"max_episode_steps": 100}' or '{"vectorization": "async"}'"""
    total_timesteps: int = 10_000_000
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
    """name of the run directory; default {env_id}__sac__{seed}__{timestamp}"""
    resume: str | None = None
    """checkpoint to resume from: a path, a run directory, or 'auto' (this run's last.pt if it exists)"""
    eval_only: bool = False
    """load --resume, evaluate the deterministic policy, print the returns, and exit"""
    save_interval: int = 2000
    """iterations between writes of checkpoints/last.pt (also written at the end and on SIGTERM/SIGUSR1)"""
    save_interval_seconds: float | None = None
    """also write last.pt when this many seconds have passed since the last write (checked every --log-interval)"""
    save_buffer: bool = False
    """store every rank's replay buffer in last.pt, so that --resume continues bit-exactly (large files)"""
    eval_interval: int = 500
    """iterations between evaluations (0 disables); best.pt is written when the eval return improves"""
    eval_episodes: int = 1
    """episodes per eval env in an evaluation"""
    num_eval_envs: int = 128
    """eval environments per process (separate from the training envs)"""
    log_interval: int = 100
    """iterations between log writes, NaN checks, stop checks and normalizer updates (the loop's host syncs)"""
    target_return: float | None = None
    """stop once the eval return reaches this value"""
    max_wall_seconds: float | None = None
    """stop (and save) after this many seconds of training, checked every --log-interval iterations"""
    track: bool = False
    """mirror the TensorBoard logs to Weights & Biases"""
    wandb_project_name: str = "parallel-rl"
    """wandb project"""
    wandb_entity: str | None = None
    """wandb team or user"""
    progress: bool = True
    """show a progress bar on the main process (only on a terminal, never under CI)"""
    compile: bool = False
    """torch.compile the acting step and the two update steps"""
    cudagraphs: bool = False
    """capture the acting and update steps in CUDA graphs (CUDA only)"""
    bf16: bool = False
    """run the networks under bfloat16 autocast (losses, targets and parameters stay float32)"""
    dist_timeout: float = 600.0
    """seconds a collective may wait for the other ranks before the run fails (a dead or hung rank)"""

    # --- SAC ---
    buffer_size: int = 1_000_000
    """replay capacity per process in transitions (buffer_size // num_envs per env)"""
    batch_size: int | None = None
    """transitions per gradient update, per process; default 32768 on CUDA, 1024 on CPU"""
    num_updates: int = 2
    """gradient updates of the critics per iteration (one vectorised env step)"""
    learning_starts: int = 10_000
    """env steps (all processes) of uniform random actions before the first update"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 0.1
    """soft target update rate: target <- target + tau * (online - target), after every critic update"""
    n_step: int = 3
    """n-step returns (cut at episode ends)"""
    policy_lr: float = 3e-4
    """Adam learning rate of the actor"""
    q_lr: float = 3e-4
    """Adam learning rate of the critics"""
    policy_frequency: int = 2
    """critic updates per actor (and temperature) update"""
    alpha: float = 0.2
    """entropy temperature (the initial one with --autotune)"""
    autotune: bool = True
    """tune the temperature so that the policy's entropy approaches --target-entropy"""
    target_entropy: float | None = None
    """entropy target of the tuning; default -act_dim (entropy of the squashed policy in [-1, 1] units)"""
    log_std_min: float = -5.0
    """lower bound of the Gaussian's log std"""
    log_std_max: float = 2.0
    """upper bound of the Gaussian's log std"""
    hidden_sizes: tuple[int, ...] = (256, 256)
    """hidden layer sizes of the actor"""
    critic_hidden_sizes: tuple[int, ...] | None = None
    """hidden layer sizes of each critic; default: --hidden-sizes"""
    asymmetric_critic: bool = True
    """feed the critics the env's 'critic' observations when it provides them"""
    obs_norm: bool = True
    """normalize observations with running statistics of the collected data"""
    obs_clip: float = 10.0
    """clip normalized observations to [-obs_clip, obs_clip]"""
    reward_norm: bool = False
    """scale rewards by the running std of the discounted return"""
    reward_clip: float = 10.0
    """clip normalized (n-step) rewards to [-reward_clip, reward_clip]"""


NUM_CRITICS = 2  # clipped double Q (the minimum of the two)


# ----------------------------------------------------------------------------------------------
# Networks
# ----------------------------------------------------------------------------------------------
def mlp(in_dim: int, out_dim: int, hidden: tuple[int, ...], linear=nn.Linear) -> nn.Sequential:
    """ReLU MLP; `linear(in, out)` builds each layer (nn.Linear, or an ensemble of them)."""
    layers, last = [], in_dim
    for h in hidden:
        layers += [linear(last, h), nn.ReLU()]
        last = h
    layers.append(linear(last, out_dim))
    return nn.Sequential(*layers)


class EnsembleLinear(nn.Module):
    """`num` independent linear layers evaluated as one batched matmul: [B, in] or [E, B, in] -> [E, B, out].

    Why not torch.vmap over stacked modules: stacked plain Parameters are what the optimizer,
    state_dict, all_reduce_gradients, the in-place target lerp_ and torch.compile/CUDA graphs
    already handle, with no functional_call plumbing; the math stays visible, and every layer
    of every critic is one GEMM. Each member starts from nn.Linear's own initialisation.
    """

    def __init__(self, num: int, in_dim: int, out_dim: int):
        super().__init__()
        members = [nn.Linear(in_dim, out_dim) for _ in range(num)]
        self.weight = nn.Parameter(torch.stack([m.weight.detach().T for m in members]))  # [E, in, out]
        self.bias = nn.Parameter(torch.stack([m.bias.detach() for m in members]).unsqueeze(1))  # [E, 1, out]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.matmul(x, self.weight)  # broadcasts [B, in] over the members
        return out + self.bias.to(out.dtype)  # keeps bfloat16 under autocast


def squashed_log_prob(u: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """log-density of a = tanh(u), u ~ Normal(mean, exp(log_std)), summed over the action dims.

    Change of variables: log p(a) = log N(u) - log|da/du| with da/du = 1 - tanh(u)^2. That
    difference of squares cancels to 0 in float32 once |u| > ~9; the identity
    log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)) stays exact for any u.
    The density is over the policy's [-1, 1] actions, so --target-entropy means the same for any bounds.
    """
    normal = -0.5 * ((u - mean) * torch.exp(-log_std)) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
    return (normal - 2 * (math.log(2) - u - F.softplus(-2 * u))).sum(-1)


class Agent(nn.Module):
    """Tanh-squashed Gaussian actor, an ensemble of critics and its target, the entropy temperature,
    the observation normalizers and the action bounds: one state_dict holds all. Actions live in
    [-1, 1]; `to_env` scales them to the env's bounds."""

    def __init__(self, obs_dim: int, critic_obs_dim: int | None, low: torch.Tensor, high: torch.Tensor, args: Args):
        super().__init__()
        act_dim = low.shape[0]
        self.critic_key = "critic" if critic_obs_dim is not None else "policy"
        self.actor = mlp(obs_dim, 2 * act_dim, args.hidden_sizes)  # mean and log std
        self.log_std_range = (args.log_std_min, args.log_std_max)
        self.critic = mlp((critic_obs_dim or obs_dim) + act_dim, 1, args.critic_hidden_sizes or args.hidden_sizes,
                          linear=functools.partial(EnsembleLinear, NUM_CRITICS))
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.register_buffer("action_scale", (high - low) / 2)
        self.register_buffer("action_bias", (high + low) / 2)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(args.alpha)), requires_grad=args.autotune)
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

    def q(self, critic: nn.Module, obs_n: TensorDict, action: torch.Tensor) -> torch.Tensor:
        """[E, B] Q-values of every critic of the ensemble."""
        return critic(torch.cat([obs_n[self.critic_key], action], -1)).squeeze(-1).float()  # float32 under bf16 autocast

    def sample(self, policy_obs_n: torch.Tensor, deterministic: bool = False):
        """Reparameterised action in [-1, 1] and its log-prob (tanh of the mean when deterministic)."""
        mean, log_std = self.actor(policy_obs_n).float().chunk(2, -1)
        lo, hi = self.log_std_range
        log_std = lo + 0.5 * (hi - lo) * (torch.tanh(log_std) + 1)  # smooth squash into [lo, hi]
        if deterministic:
            return torch.tanh(mean), None
        u = mean + torch.exp(log_std) * torch.randn_like(mean)
        return torch.tanh(u), squashed_log_prob(u, mean, log_std)

    def act(self, obs: TensorDict, deterministic: bool = False) -> torch.Tensor:
        return self.sample(self.obs_rms(obs["policy"]), deterministic)[0]

    def to_env(self, action: torch.Tensor) -> torch.Tensor:
        return action * self.action_scale + self.action_bias


# ----------------------------------------------------------------------------------------------
# Evaluation: deterministic policy on separate envs, reduced over ranks
# ----------------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(agent: Agent, eval_envs, episodes: int, seed: int):
    """Mean return and length of the first `episodes` episodes of every eval env, over all ranks."""
    n, dev = eval_envs.num_envs, eval_envs.device
    obs, _ = eval_envs.reset(seed=seed)
    ep_ret = torch.zeros(n, device=dev, dtype=torch.float64)
    ep_len = torch.zeros(n, device=dev, dtype=torch.float64)
    done_count = torch.zeros(n, device=dev, dtype=torch.long)
    sums = torch.zeros(3, device=dev, dtype=torch.float64)  # return sum, length sum, episodes
    max_steps = getattr(eval_envs, "max_episode_steps", None) or 10_000
    for step in range(max_steps * episodes + 1):
        obs, reward, terminated, truncated, _ = eval_envs.step(agent.to_env(agent.act(obs, deterministic=True)))
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


# ----------------------------------------------------------------------------------------------
def main(args: Args) -> dict:
    # --- distributed setup and checks of the arguments, before anything is written ---
    dist_info = distributed.setup(args.device, timeout_seconds=args.dist_timeout)
    rank, world_size, device, master = dist_info.rank, dist_info.world_size, dist_info.device, dist_info.is_main
    if args.cudagraphs and device.type != "cuda":
        raise SystemExit("error: --cudagraphs needs a CUDA device; drop it or use --device cuda")
    batch_size = args.batch_size or (32768 if device.type == "cuda" else 1024)
    capacity = args.buffer_size // args.num_envs  # slots per env
    for name in ("num_envs", "batch_size", "n_step", "policy_frequency", "log_interval", "save_interval", "num_eval_envs"):
        if (value := batch_size if name == "batch_size" else getattr(args, name)) < 1:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be >= 1, got {value}")
    if capacity < args.n_step:
        raise SystemExit(f"error: --buffer-size {args.buffer_size} gives {capacity} slots per env for {args.num_envs} envs, "
                         f"fewer than --n-step {args.n_step}; raise --buffer-size to at least {args.n_step * args.num_envs}")
    if args.alpha <= 0 or args.log_std_min >= args.log_std_max:
        raise SystemExit(f"error: need --alpha > 0 and --log-std-min < --log-std-max, got {args.alpha}, {args.log_std_min}, {args.log_std_max}")
    steps_per_iteration = args.num_envs * world_size
    total_steps = max(args.total_timesteps, steps_per_iteration)  # at least one iteration
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)

    # --- environments: continuous actions only; different seeds per rank; separate eval envs ---
    try:
        env_kwargs = json.loads(args.env_kwargs) if args.env_kwargs else {}
        envs = make_env(args.env_id, args.num_envs, device, seed=args.seed + rank * args.num_envs, **env_kwargs)
    except (ValueError, TypeError) as e:  # unknown id (the message lists the known ones), bad --env-kwargs
        raise SystemExit(f"error: {e}") from None
    space = envs.single_action_space
    if not isinstance(space, gym.spaces.Box):
        raise SystemExit(f"error: {ALGO}.py needs continuous (Box) actions, but {args.env_id} has {space}; "
                         f"use algos/ppo.py or algos/pqn.py for discrete actions")
    if not space.is_bounded():
        raise SystemExit(f"error: {ALGO}.py scales a tanh policy to the action bounds, but {args.env_id}'s action space {space} is unbounded")
    eval_envs = make_env(args.env_id, args.num_eval_envs, device, seed=args.seed + 10**8 + rank * args.num_eval_envs, **env_kwargs)
    torch.manual_seed(args.seed + rank)  # after the envs: some simulators (mjlab) seed the global generators
    next_obs, _ = envs.reset(seed=args.seed + rank * args.num_envs)
    obs_dim = next_obs["policy"].shape[-1]
    critic_dim = next_obs["critic"].shape[-1] if args.asymmetric_critic and "critic" in next_obs.keys() else None
    act_dim = space.shape[0]
    target_entropy = -float(act_dim) if args.target_entropy is None else args.target_entropy

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
        # purge_step: a resumed run drops the events logged after its checkpoint (one line per curve).
        writer = SummaryWriter(str(run_dir), purge_step=checkpoint["global_step"] + 1 if checkpoint else None)
        table = "\n".join(f"|{k}|{v}|" for k, v in asdict(args).items())
        writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")

    # --- agent, optimizers, normalizers, replay buffer ---
    low, high = (torch.as_tensor(b, dtype=torch.float32) for b in (space.low, space.high))
    agent = Agent(obs_dim, critic_dim, low, high, args).to(device)
    distributed.broadcast_module(agent)  # identical initial weights (and targets) on every rank
    # Grad-free twin for acting that shares the agent's storage: no copies, no autograd in the loop.
    agent_inference = Agent(obs_dim, critic_dim, low, high, args).to(device)
    from_module(agent).data.to_module(agent_inference)
    actor_optimizer = torch.optim.Adam(agent.actor.parameters(), lr=args.policy_lr, capturable=device.type == "cuda")
    q_optimizer = torch.optim.Adam(agent.critic.parameters(), lr=args.q_lr, capturable=device.type == "cuda")
    alpha_optimizer = torch.optim.Adam([agent.log_alpha], lr=args.q_lr, capturable=device.type == "cuda")
    reward_normalizer = RewardNormalizer(args.num_envs, args.gamma, clip=args.reward_clip).to(device) if args.reward_norm else None
    buffer = ReplayBuffer(args.num_envs, capacity, device)

    # --- resume ---
    global_step, start_iteration, best_eval_return = 0, 0, -math.inf
    update_count, last_fold = 0, 0  # critic updates so far; iteration of the last normalizer update
    ep_stats = torch.zeros(2, args.num_envs, device=device, dtype=torch.float64)  # running return, length
    if checkpoint is not None:
        try:
            agent.load_state_dict(checkpoint["model"])
            load_optimizer_state(actor_optimizer, checkpoint["optimizer"]["actor"])
            load_optimizer_state(q_optimizer, checkpoint["optimizer"]["critic"])
            load_optimizer_state(alpha_optimizer, checkpoint["optimizer"]["alpha"])
        except (RuntimeError, ValueError, KeyError) as e:
            saved = checkpoint["args"]
            raise SystemExit(
                f"error: {resume_path} holds networks of another shape (saved with --hidden-sizes "
                f"{' '.join(map(str, saved['hidden_sizes']))}, --critic-hidden-sizes {saved['critic_hidden_sizes']}, "
                f"obs_norm={saved['obs_norm']}); resume with the same flags ({str(e).splitlines()[0][:120]})"
            ) from None
        if reward_normalizer is not None and checkpoint.get("reward_normalizer") is not None:
            reward_normalizer.load_state_dict(checkpoint["reward_normalizer"])
        global_step, start_iteration = checkpoint["global_step"], checkpoint["iteration"]
        best_eval_return, update_count, last_fold = checkpoint["best_eval_return"], checkpoint["update_count"], checkpoint["last_fold"]
        same_shape = checkpoint["world_size"] == world_size and checkpoint["args"]["num_envs"] == args.num_envs
        if same_shape and restore_rank_rng_state(checkpoint["rng"], rank, world_size):
            env_ckpt = checkpoint["env"][rank]
            if env_ckpt["state"]:  # an env that cannot be snapshotted (gym:, mjlab:) starts fresh episodes
                envs.load_state_dict(env_ckpt["state"])
                next_obs = TensorDict(env_ckpt["next_obs"], batch_size=[args.num_envs]).to(device)
                ep_stats.copy_(env_ckpt["ep_stats"])
                if reward_normalizer is not None and env_ckpt["reward_returns"] is not None:
                    reward_normalizer.returns.copy_(env_ckpt["reward_returns"])  # this rank's envs, not rank 0's
            if env_ckpt["buffer"] is not None:
                try:
                    buffer.load_state_dict(env_ckpt["buffer"])
                except ValueError as e:  # another --buffer-size
                    raise CheckpointError(str(e)) from None
        elif master:
            print(f"notice: checkpoint from {checkpoint['world_size']} process(es) x {checkpoint['args']['num_envs']} envs; "
                  f"env and RNG streams re-derived from the seed (model, optimizers, normalizers restored)", flush=True)
        if master and not args.eval_only:
            if len(buffer) == 0:
                print("notice: the checkpoint holds no replay buffer (save it with --save-buffer); refilling it before updates resume", flush=True)
            print(f"resumed from {resume_path} at iteration {start_iteration}, global step {global_step}", flush=True)

    if args.eval_only:
        ret, length = evaluate(agent_inference, eval_envs, args.eval_episodes, seed=args.seed + 10**8 + rank * args.num_eval_envs)
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

    def update_critic(b: TensorDict):
        """One critic step on a batch, then the soft target update; returns (q_loss, mean Q) on the device."""
        with torch.no_grad(), autocast():
            # Soft target: min over the target critics of Q(s', a') - alpha * log pi(a'|s'), a' ~ pi(s').
            next_action, next_logp = agent.sample(b["next_obs_n", "policy"])
            next_q = agent.q(agent.critic_target, b["next_obs_n"], next_action).min(0).values
            target = b["rewards"] + b["bootstrap"] * (next_q - agent.log_alpha.exp() * next_logp)
        with autocast():
            q = agent.q(agent.critic, b["obs_n"], b["actions"])
        q_loss = ((q - target) ** 2).mean(-1).sum()  # MSE, summed over critics
        q_optimizer.zero_grad(set_to_none=False)
        q_loss.backward()
        distributed.all_reduce_gradients(agent.critic.parameters())
        q_optimizer.step()
        with torch.no_grad():
            for p_target, p in zip(agent.critic_target.parameters(), agent.critic.parameters()):
                p_target.lerp_(p, args.tau)
        return torch.stack([q_loss.detach(), q.detach().mean()])

    def update_actor(b: TensorDict):
        """One actor step (max of min-Q plus entropy), then one temperature step; returns (loss, alpha, entropy)."""
        with autocast():
            action, logp = agent.sample(b["obs_n", "policy"])
            q = agent.q(agent.critic, b["obs_n"], action).min(0).values
        alpha = agent.log_alpha.exp().detach()
        actor_loss = (alpha * logp - q).mean()
        actor_optimizer.zero_grad(set_to_none=False)
        actor_loss.backward()
        distributed.all_reduce_gradients(agent.actor.parameters())
        actor_optimizer.step()
        if args.autotune:
            # Gradient descent on alpha * (entropy - target): alpha grows while the entropy is below the target.
            alpha_loss = -(agent.log_alpha * (logp.detach() + target_entropy)).mean()
            alpha_optimizer.zero_grad(set_to_none=False)
            alpha_loss.backward()
            distributed.all_reduce_gradients([agent.log_alpha])
            alpha_optimizer.step()
        return torch.stack([actor_loss.detach(), alpha, -logp.detach().mean()])

    if args.compile:
        policy_step = torch.compile(policy_step)
        update_critic = torch.compile(update_critic)
        update_actor = torch.compile(update_actor)
    if args.cudagraphs:
        from tensordict.nn import CudaGraphModule

        warmup = 3 if args.compile else 2  # eager calls before capture; compiled functions recompile once more
        policy_step = CudaGraphModule(policy_step, warmup=warmup)
        update_critic = CudaGraphModule(update_critic, warmup=warmup)
        update_actor = CudaGraphModule(update_actor, warmup=warmup)

    def sample_batch() -> TensorDict:
        """An n-step batch with normalized observations and bootstrap = discount * (1 - terminated)."""
        b = buffer.sample(batch_size, args.n_step, args.gamma)
        rewards = b["rewards"].float()
        if reward_normalizer is not None:
            rewards = reward_normalizer.normalize(rewards)
        return TensorDict(
            {"obs_n": agent.normalize(b["obs"]), "next_obs_n": agent.normalize(b["next_obs"]), "actions": b["actions"],
             "rewards": rewards, "bootstrap": (b["discount"] * ~b["terminated"]).float()},
            batch_size=[batch_size],
        )

    def fold_statistics(iteration: int) -> None:
        """Fold the transitions stored since the last fold into the normalizers (a collective under torchrun)."""
        nonlocal last_fold
        k = min(iteration - last_fold, len(buffer))
        last_fold = iteration
        if k == 0 or not (args.obs_norm or reward_normalizer is not None):
            return
        slots = (buffer.ptr - k + torch.arange(k, device=device)) % capacity  # chronological
        window = buffer.data[:, slots]  # [N, k]
        if args.obs_norm:
            agent.obs_rms.update(window["obs", "policy"])
            if agent.critic_obs_rms is not None:
                agent.critic_obs_rms.update(window["obs", "critic"])
        if reward_normalizer is not None:
            reward_normalizer.update(window["rewards"].T, (window["terminated"] | window["truncated"]).T)

    def ready() -> bool:
        """Updates run once the buffer holds learning_starts transitions over all ranks (again after a resume without it)."""
        return len(buffer) >= args.n_step and len(buffer) * steps_per_iteration >= args.learning_starts

    guard = distributed.PreemptionGuard()
    if master:
        print(f"{ALGO} on {args.env_id}: {world_size} process(es) x {args.num_envs} envs on {device}; {args.num_updates} updates of "
              f"batch {batch_size} per step; {capacity} buffer slots per env; {total_steps // steps_per_iteration} iterations; run dir {run_dir}", flush=True)
    progress = None
    if master and args.progress and not os.environ.get("CI") and sys.stderr.isatty():
        from tqdm import tqdm

        progress = tqdm(total=total_steps, initial=global_step, unit="step", unit_scale=True, dynamic_ncols=True)

    def save(path_name: str, iteration: int, with_buffer: bool):
        """Every rank contributes its RNG, env and (optionally) buffer state; rank 0 writes atomically."""
        rng = gather_rng_states()
        env_state = distributed.all_gather_object({
            "state": envs.state_dict(), "next_obs": next_obs.cpu().to_dict(), "ep_stats": ep_stats.cpu(),
            "buffer": buffer.state_dict() if with_buffer else None,
            "reward_returns": reward_normalizer.returns.cpu() if reward_normalizer is not None else None,
        })
        if not master:
            return None
        return save_checkpoint(
            {
                "format_version": FORMAT_VERSION, "algo": ALGO, "env_id": args.env_id, "args": asdict(args),
                "world_size": world_size, "global_step": global_step, "iteration": iteration,
                "model": agent.state_dict(),
                "optimizer": {"actor": actor_optimizer.state_dict(), "critic": q_optimizer.state_dict(),
                              "alpha": alpha_optimizer.state_dict()},
                "reward_normalizer": reward_normalizer.state_dict() if reward_normalizer is not None else None,
                "best_eval_return": best_eval_return, "update_count": update_count, "last_fold": last_fold,
                "rng": rng, "env": env_state,
            },
            checkpoint_dir(run_dir) / path_name,
        )

    zeros = functools.partial(torch.zeros, device=device, dtype=torch.float64)
    # Statistics accumulated on the device between two syncs.
    ep_sums, loss_sums, finite = zeros(3), zeros(5), torch.ones(2, device=device, dtype=torch.bool)
    critic_updates, actor_updates, steps_since_log = 0, 0, 0
    env_log_sums: dict[str, list] = {}  # the env's own metrics (info["log"]): name -> [sum, steps reported]
    start_time, stop_reason = time.time(), "total_timesteps"
    last_train_return, sps, iteration = float("nan"), 0.0, start_iteration
    steps_at_start, last_save_time, was_ready = global_step, time.time(), ready()
    # Counted in env steps, not iterations: a run resumed with another world size still ends at --total-timesteps.
    while global_step + steps_per_iteration <= total_steps:
        iteration += 1
        final_iteration = global_step + 2 * steps_per_iteration > total_steps
        # --- act and store: no host-device synchronisation here ---
        with torch.no_grad():
            if global_step < args.learning_starts:
                action = torch.rand(args.num_envs, act_dim, device=device) * 2 - 1
            else:
                action = policy_step(next_obs)
            obs = next_obs
            next_obs, reward, terminated, truncated, info = envs.step(agent.to_env(action))
            done = terminated | truncated
            # The true next observation: the final one where the episode ended (next_obs has reset).
            real_next_obs = torch.where(done, info["final_obs"], next_obs)
            buffer.add(TensorDict(
                {"obs": obs, "actions": action, "rewards": reward.float(), "terminated": terminated,
                 "truncated": truncated, "next_obs": real_next_obs},
                batch_size=[args.num_envs],
            ))
            ep_stats[0] += reward
            ep_stats[1] += 1
            ep_sums += torch.stack([(ep_stats[0] * done).sum(), (ep_stats[1] * done).sum(), done.sum().double()])
            ep_stats *= ~done
            for k, v in info.get("log", {}).items():
                acc = env_log_sums.setdefault(k, [0.0, 0])
                acc[0], acc[1] = acc[0] + v, acc[1] + 1
            finite &= torch.stack([torch.isfinite(real_next_obs["policy"]).all(), torch.isfinite(reward).all()])
        global_step += steps_per_iteration
        steps_since_log += steps_per_iteration

        # --- normalizer statistics: every log interval and before the first update ---
        is_ready = ready()
        if iteration % args.log_interval == 0 or (is_ready and not was_ready):
            fold_statistics(iteration)
        was_ready = is_ready

        # --- updates: num_updates critic steps, the actor every policy_frequency-th ---
        if is_ready:
            for _ in range(args.num_updates):
                batch = sample_batch()
                loss_sums[:2] += update_critic(batch)
                critic_updates += 1
                update_count += 1
                if update_count % args.policy_frequency == 0:
                    loss_sums[2:] += update_actor(batch)
                    actor_updates += 1

        # --- once per log interval (and before evals and saves): one host sync ---
        eval_now = args.eval_interval > 0 and (iteration % args.eval_interval == 0 or final_iteration)
        save_now = iteration % args.save_interval == 0 or final_iteration
        if not (iteration % args.log_interval == 0 or eval_now or save_now):
            continue
        # Decisions from this rank's clock or signals, summed over ranks: all stop or save together.
        now = time.time()
        flags = torch.tensor([guard.received is not None, args.max_wall_seconds is not None and now - start_time >= args.max_wall_seconds,
                              args.save_interval_seconds is not None and now - last_save_time >= args.save_interval_seconds],
                             dtype=torch.float64).to(device)
        packed = torch.cat([ep_sums, finite.double(), torch.isfinite(loss_sums).double(), loss_sums, flags])
        distributed.all_reduce(packed)  # sums add up; flags and checks are read as counts over ranks
        # The env's own metrics are rank 0's alone (ranks may report different keys); same single sync.
        env_means = [torch.as_tensor(total / count, device=device).double().mean().reshape(1) for total, count in env_log_sums.values()]
        host = torch.cat([packed, *env_means]).tolist()
        ep_ret_sum, ep_len_sum, ep_count = host[0:3]
        checks = ("observations", "rewards", "q_loss", "q_values", "actor_loss", "alpha", "entropy")
        nonfinite = [name for name, ok in zip(checks, host[3:10]) if ok < world_size]
        if nonfinite:
            raise FloatingPointError(
                f"non-finite {', '.join(nonfinite)} between global steps {global_step - steps_since_log:,} and {global_step:,} "
                f"(iteration {iteration}); last good checkpoint kept in {checkpoint_dir(run_dir)}"
            )
        q_loss, q_values = (x / world_size / max(critic_updates, 1) for x in host[10:12])
        actor_loss, alpha, entropy = (x / world_size / max(actor_updates, 1) for x in host[12:15])
        env_values = host[18:]
        stop_signal, out_of_time, save_time_due = (x > 0 for x in host[15:18])
        sps = (global_step - steps_at_start) / (time.time() - start_time)
        if ep_count > 0:
            last_train_return = ep_ret_sum / ep_count
        if master:
            writer.add_scalar("charts/SPS", sps, global_step)
            if ep_count > 0:
                writer.add_scalar("charts/episodic_return", ep_ret_sum / ep_count, global_step)
                writer.add_scalar("charts/episodic_length", ep_len_sum / ep_count, global_step)
            if critic_updates > 0:
                writer.add_scalar("losses/q_loss", q_loss, global_step)
                writer.add_scalar("losses/q_values", q_values, global_step)
            if actor_updates > 0:
                writer.add_scalar("losses/actor_loss", actor_loss, global_step)
                writer.add_scalar("losses/alpha", alpha, global_step)
                writer.add_scalar("losses/entropy", entropy, global_step)
            for name, value in zip(env_log_sums.keys(), env_values):
                writer.add_scalar(f"env/{name}", value, global_step)
            if progress is not None:
                progress.update(steps_since_log)
                progress.set_postfix(sps=f"{sps:,.0f}", ret=f"{last_train_return:.1f}", refresh=False)
        ep_sums.zero_()
        loss_sums.zero_()
        finite.fill_(True)
        critic_updates, actor_updates, steps_since_log = 0, 0, 0
        env_log_sums = {}

        # --- evaluation, checkpoints and stop conditions (identical decisions on every rank) ---
        reached_target = False
        if eval_now:
            eval_return, eval_length = evaluate(agent_inference, eval_envs, args.eval_episodes, seed=args.seed + 10**8 + rank * args.num_eval_envs + iteration)
            if master:
                writer.add_scalar("eval/episodic_return", eval_return, global_step)
                writer.add_scalar("eval/episodic_length", eval_length, global_step)
                msg = f"iteration {iteration} step {global_step:,}: eval return {eval_return:.2f}, train return {last_train_return:.2f}, SPS {sps:,.0f}"
                print(msg, flush=True) if progress is None else progress.write(msg)
            if eval_return > best_eval_return:
                best_eval_return = eval_return
                save(BEST, iteration, with_buffer=False)
            reached_target = args.target_return is not None and eval_return >= args.target_return
        if reached_target or out_of_time or stop_signal or save_now or save_time_due:
            save(LAST, iteration, with_buffer=args.save_buffer)
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
        "world_size": world_size, "params_in_sync": in_sync, "peak_memory_mb": peak_memory_mb(device),
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
