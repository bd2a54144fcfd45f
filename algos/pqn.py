"""Parallel Q-learning (PQN) for massively parallel, GPU-resident environments, discrete actions.

    python algos/pqn.py --env-id CartPole-v1 --num-envs 1024
    python algos/pqn.py --env-id CartPole-v1 --device cpu --num-envs 64 --num-minibatches 4 --hidden-sizes 64 64 --reward-scale 0.1
    torchrun --nproc-per-node 8 algos/pqn.py --env-id Acrobot-v1 --num-envs 4096

One file, read top to bottom: Args -> setup -> Q-network -> epsilon-greedy rollout -> Q(lambda)
targets -> epochs of minibatch regression -> logging. No replay buffer and no target network:
the many parallel envs decorrelate the data, and LayerNorm in the Q-network keeps the
bootstrapped regression stable. `--num-envs` is per process; `--total-timesteps` counts env
steps over all processes.
References: Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning" (PQN);
Watkins 1989 and Peng & Williams 1996 (Q(lambda)); CleanRL's DQN for the flag names.
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
import torch.nn.functional as F
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
from common.normalize import RunningMeanStd  # noqa: E402

ALGO = "pqn"


@dataclass
class Args:
    # --- experiment ---
    env_id: str = "CartPole-v1"
    """environment id with a Discrete action space: a built-in env (CartPole-v1, Acrobot-v1, MountainCar-v0) or an adapter id"""
    num_envs: int = 1024
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
    """name of the run directory; default {env_id}__pqn__{seed}__{timestamp}"""
    resume: str | None = None
    """checkpoint to resume from: a path, a run directory, or 'auto' (this run's last.pt if it exists)"""
    eval_only: bool = False
    """load --resume, evaluate the greedy policy, print the returns, and exit"""
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
    """torch.compile the acting step, the Q(lambda) targets and the update step"""
    cudagraphs: bool = False
    """capture the acting and update steps in CUDA graphs (CUDA only)"""
    dist_timeout: float = 600.0
    """seconds a collective may wait for the other ranks before the run fails (a dead or hung rank)"""

    # --- PQN ---
    num_steps: int = 16
    """steps per env per rollout; the batch per process is num_envs * num_steps"""
    num_minibatches: int = 8
    """minibatches per epoch"""
    update_epochs: int = 2
    """epochs over the batch per iteration"""
    learning_rate: float = 2.5e-3
    """initial learning rate of Adam"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the iterations"""
    gamma: float = 0.99
    """discount factor"""
    q_lambda: float = 0.65
    """lambda of the Q(lambda) targets (0: one-step Q-learning, 1: Monte-Carlo returns within the rollout)"""
    reward_scale: float = 1.0
    """rewards are multiplied by this in the targets (the Q-values learn scaled returns; logged returns stay raw)"""
    loss: Literal["mse", "huber"] = "mse"
    """regression loss of Q(s, a) on the targets: 0.5 * squared error, or Huber (delta 1)"""
    max_grad_norm: float = 10.0
    """global gradient-norm clip"""
    start_e: float = 1.0
    """epsilon of the epsilon-greedy policy at the start"""
    end_e: float = 0.05
    """epsilon at the end of the linear decay (kept afterwards)"""
    exploration_fraction: float = 0.2
    """fraction of --total-timesteps over which epsilon decays from start_e to end_e"""
    epsilon_spread: float = 0.0
    """per-env exploration: env i of M (over all processes) uses epsilon * (1 - spread * i / (M - 1)); 0: all alike"""
    hidden_sizes: tuple[int, ...] = (128, 128)
    """hidden layer sizes of the Q-network (each Linear -> LayerNorm -> activation)"""
    activation: Literal["relu", "tanh", "elu", "silu"] = "relu"
    """activation of the hidden layers"""
    obs_norm: bool = False
    """normalize observations with running statistics of the rollouts"""
    obs_clip: float = 10.0
    """clip normalized observations to [-obs_clip, obs_clip]"""


# ----------------------------------------------------------------------------------------------
# Q-network: an MLP with LayerNorm after every hidden Linear (before the activation)
# ----------------------------------------------------------------------------------------------
ACTIVATIONS = {"tanh": nn.Tanh, "elu": nn.ELU, "relu": nn.ReLU, "silu": nn.SiLU}


def layer_init(layer: nn.Linear, gain: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


class QNetwork(nn.Module):
    """Q(s, .) for every action, with the observation normalizer so that one state_dict holds all.

    LayerNorm is what lets PQN drop the target network: it keeps the features bounded, and with
    them the bootstrapped regression from diverging (Gallici et al., 2024).
    """

    def __init__(self, obs_dim: int, num_actions: int, args: Args):
        super().__init__()
        layers, last = [], obs_dim
        for h in args.hidden_sizes:
            layers += [layer_init(nn.Linear(last, h)), nn.LayerNorm(h), ACTIVATIONS[args.activation]()]
            last = h
        layers.append(layer_init(nn.Linear(last, num_actions), gain=1.0))
        self.q = nn.Sequential(*layers)
        self.obs_rms = RunningMeanStd(obs_dim, clip=args.obs_clip) if args.obs_norm else nn.Identity()

    def forward(self, obs_n: torch.Tensor) -> torch.Tensor:  # Q-values [..., num_actions] of normalized obs
        return self.q(obs_n)

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q(self.obs_rms(obs)).argmax(-1)

    def act(self, obs: torch.Tensor, epsilon: torch.Tensor) -> torch.Tensor:
        """Epsilon-greedy with one epsilon per env (a tensor [N]): a uniform action with probability epsilon."""
        q = self.q(self.obs_rms(obs))
        random_action = torch.randint(q.shape[-1], q.shape[:-1], device=q.device)
        explore = torch.rand(q.shape[:-1], device=q.device) < epsilon
        return torch.where(explore, random_action, q.argmax(-1))


# ----------------------------------------------------------------------------------------------
# Q(lambda) targets with truncation bootstrapping
# ----------------------------------------------------------------------------------------------
def q_lambda_targets(rewards, next_q_max, final_q_max, terminated, truncated, gamma: float, lam: float):
    """Peng's Q(lambda) targets over a [T, N] rollout, computed backwards from the last step.

    next_q_max[t] = max_a Q(obs[t+1], a) (for t = T-1: of the observation after the rollout),
    final_q_max[t] = max_a Q(final_obs[t], a). Inside an episode the target mixes the one-step
    bootstrap with the next target:

        G_t = r_t + gamma * ((1 - lam) * next_q_max[t] + lam * G_{t+1}),  G_T := next_q_max[T-1]

    An episode that *terminated* at t has no future: G_t = r_t. One *truncated* by the time
    limit does: G_t = r_t + gamma * max_a Q(final_obs[t], a), the true last observation (the
    env has already reset obs[t+1] to a new episode). The lambda-chain is cut at both.
    """
    targets = torch.empty_like(rewards)
    after_end = torch.where(terminated, 0.0, final_q_max)  # value after an episode end
    done = terminated | truncated
    ret = next_q_max[-1]
    for t in reversed(range(rewards.shape[0])):
        ret = rewards[t] + gamma * torch.where(done[t], after_end[t], (1 - lam) * next_q_max[t] + lam * ret)
        targets[t] = ret
    return targets


# ----------------------------------------------------------------------------------------------
# Evaluation: greedy policy on separate envs, reduced over ranks
# ----------------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(qnet: QNetwork, eval_envs, episodes: int, seed: int):
    """Mean return and length of the first `episodes` episodes of every eval env, over all ranks."""
    n, dev = eval_envs.num_envs, eval_envs.device
    obs, _ = eval_envs.reset(seed=seed)
    ep = torch.zeros(2, n, device=dev, dtype=torch.float64)  # running return, length
    done_count = torch.zeros(n, device=dev, dtype=torch.long)
    sums = torch.zeros(3, device=dev, dtype=torch.float64)  # return sum, length sum, episodes
    max_steps = getattr(eval_envs, "max_episode_steps", None) or 10_000
    for step in range(max_steps * episodes + 1):
        obs, reward, terminated, truncated, _ = eval_envs.step(qnet.greedy(obs["policy"]))
        active = done_count < episodes
        ep += torch.stack([reward.double(), torch.ones_like(ep[1])]) * active
        done = (terminated | truncated) & active
        sums += torch.stack([(ep[0] * done).sum(), (ep[1] * done).sum(), done.double().sum()])
        done_count += done.long()
        ep *= ~done
        if step % 64 == 63 and bool((done_count >= episodes).all()):  # a sync every 64 steps, not every step
            break
    distributed.all_reduce(sums)
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


# ----------------------------------------------------------------------------------------------
def main(args: Args) -> dict:
    # --- distributed setup: rank, world size, device; seed offset per rank (nanoGPT's recipe) ---
    dist_info = distributed.setup(args.device, timeout_seconds=args.dist_timeout)
    rank, world_size, device, master = dist_info.rank, dist_info.world_size, dist_info.device, dist_info.is_main
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

    # --- environments first: a continuous action space stops here, before anything is written ---
    try:
        env_kwargs = json.loads(args.env_kwargs) if args.env_kwargs else {}
        envs = make_env(args.env_id, args.num_envs, device, seed=args.seed + rank * args.num_envs, **env_kwargs)
    except (ValueError, TypeError) as e:  # unknown id (the message lists the known ones), bad --env-kwargs
        raise SystemExit(f"error: {e}") from None
    if not isinstance(envs.single_action_space, gym.spaces.Discrete):
        raise SystemExit(
            f"error: pqn.py needs a discrete action space, but {args.env_id} has {envs.single_action_space}; "
            f"for continuous actions use algos/ppo.py, algos/td3.py or algos/sac.py"
        )
    eval_envs = make_env(args.env_id, args.num_eval_envs, device, seed=args.seed + 10**8 + rank * args.num_eval_envs, **env_kwargs)

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
        # purge_step: a resumed run drops the events logged after its checkpoint (one curve, no repeats)
        writer = SummaryWriter(str(run_dir), purge_step=checkpoint["global_step"] + 1 if checkpoint else None)
        table = "\n".join(f"|{k}|{v}|" for k, v in asdict(args).items())
        writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")

    next_obs, _ = envs.reset(seed=args.seed + rank * args.num_envs)
    obs_dim, num_actions = next_obs["policy"].shape[-1], int(envs.single_action_space.n)
    qnet = QNetwork(obs_dim, num_actions, args).to(device)
    distributed.broadcast_module(qnet)  # identical initial weights on every rank
    # Grad-free twin for acting that shares the network's storage: no copies, no autograd in the rollout.
    qnet_inference = QNetwork(obs_dim, num_actions, args).to(device)
    from_module(qnet).data.to_module(qnet_inference)
    lr = torch.tensor(args.learning_rate, device=device)  # a tensor: the schedule updates it in place
    lr_now = args.learning_rate  # its host copy, for logging without a device read
    # capturable on CUDA: step counts and lr stay on the device, so optimizer.step() never syncs.
    optimizer = torch.optim.Adam(qnet.parameters(), lr=lr, eps=1e-5, capturable=device.type == "cuda")

    # --- epsilon: a linear schedule of the global step, scaled per env (global env index) ---
    env_index = rank * args.num_envs + torch.arange(args.num_envs, device=device)
    eps_scale = 1.0 - args.epsilon_spread * env_index / max(1, world_size * args.num_envs - 1)
    eps_mean_scale = 1.0 - args.epsilon_spread / 2 if world_size * args.num_envs > 1 else 1.0
    epsilon = torch.empty(args.num_envs, device=device)  # one fixed buffer, refilled every iteration

    def epsilon_at(step: int) -> float:
        duration = args.exploration_fraction * total_steps
        return args.end_e + (args.start_e - args.end_e) * max(0.0, 1.0 - step / duration) if duration > 0 else args.end_e

    # --- resume ---
    global_step, start_iteration, best_eval_return = 0, 0, -math.inf
    ep_stats = torch.zeros(2, args.num_envs, device=device, dtype=torch.float64)  # running return, length
    if checkpoint is not None:
        try:
            qnet.load_state_dict(checkpoint["model"])
            load_optimizer_state(optimizer, checkpoint["optimizer"])
        except (RuntimeError, ValueError, KeyError):
            saved = {k: checkpoint["args"].get(k) for k in ("hidden_sizes", "obs_norm")}
            raise CheckpointError(
                f"{resume_path} holds a Q-network of another shape: trained with {saved}, this run has "
                f"{ {k: getattr(args, k) for k in saved} }; pass the checkpoint's --hidden-sizes / --obs-norm"
            ) from None
        lr.fill_(checkpoint["learning_rate"])
        lr_now = checkpoint["learning_rate"]
        global_step, start_iteration = checkpoint["global_step"], checkpoint["iteration"]
        best_eval_return = checkpoint["best_eval_return"]
        same_shape = checkpoint["world_size"] == world_size and checkpoint["args"]["num_envs"] == args.num_envs
        if same_shape and restore_rank_rng_state(checkpoint["rng"], rank, world_size) and "env" in checkpoint:
            env_ckpt = checkpoint["env"][rank]
            if env_ckpt["state"]:  # an env that cannot be snapshotted (gym:, mjlab:) starts fresh episodes
                envs.load_state_dict(env_ckpt["state"])
                next_obs = TensorDict(env_ckpt["next_obs"], batch_size=[args.num_envs]).to(device)
                ep_stats.copy_(env_ckpt["ep_stats"])
        elif master:
            print(f"notice: checkpoint from {checkpoint['world_size']} process(es) x {checkpoint['args']['num_envs']} envs; "
                  f"env and RNG streams re-derived from the seed (model, optimizer, normalizer restored)", flush=True)
        if master:
            print(f"resumed from {resume_path} at iteration {start_iteration}, global step {global_step}", flush=True)

    eval_seed = args.seed + 10**8 + rank * args.num_eval_envs
    if args.eval_only:
        ret, length = evaluate(qnet_inference, eval_envs, args.eval_episodes, seed=eval_seed)
        if master:
            print(json.dumps({"eval_episodic_return": ret, "eval_episodic_length": length, "checkpoint": str(resume_path)}))
        distributed.cleanup()
        return {"eval_return": ret}

    # --- the three hot functions; compiled / graph-captured on request ---
    def policy_step(obs: torch.Tensor, epsilon: torch.Tensor) -> torch.Tensor:
        return qnet_inference.act(obs, epsilon)

    def update_minibatch(mb: TensorDict):
        """One gradient step on a minibatch; returns its loss and mean Q for logging (on the device)."""
        q = qnet(mb["obs_n"]).gather(-1, mb["actions"].unsqueeze(-1)).squeeze(-1)
        loss = F.huber_loss(q, mb["targets"]) if args.loss == "huber" else 0.5 * (q - mb["targets"]).square().mean()
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        distributed.all_reduce_gradients(qnet.parameters())
        nn.utils.clip_grad_norm_(qnet.parameters(), args.max_grad_norm)
        optimizer.step()
        return torch.stack([loss, q.mean()]).detach()

    targets_fn = q_lambda_targets
    if args.compile:
        policy_step = torch.compile(policy_step)
        update_minibatch = torch.compile(update_minibatch)
        targets_fn = torch.compile(q_lambda_targets)
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
        env_state = distributed.all_gather_object(
            {"state": envs.state_dict(), "next_obs": next_obs.cpu().to_dict(), "ep_stats": ep_stats.cpu()}
        )
        if not master:
            return None
        return save_checkpoint(
            {
                "format_version": FORMAT_VERSION, "algo": ALGO, "env_id": args.env_id, "args": asdict(args),
                "world_size": world_size, "global_step": global_step, "iteration": iteration,
                "model": qnet.state_dict(), "optimizer": optimizer.state_dict(), "learning_rate": float(lr),
                "epsilon": epsilon_at(global_step), "best_eval_return": best_eval_return, "rng": rng, "env": env_state,
            },
            checkpoint_dir(run_dir) / path_name,
        )

    start_time, stop_reason = time.time(), "total_timesteps"
    last_train_return, sps, iteration = float("nan"), 0.0, start_iteration
    steps_at_start, last_save_time = global_step, time.time()
    time_totals = [0.0, 0.0]  # rollout, update seconds
    sync_device = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    # Counted in env steps, not iterations: a run resumed with another world size still ends at
    # --total-timesteps and its schedules (functions of the global step) continue where they were.
    while global_step + global_batch <= total_steps:
        iteration += 1
        final_iteration = global_step + 2 * global_batch > total_steps
        if args.anneal_lr:
            lr_now = args.learning_rate * (1.0 - global_step / total_steps)
            lr.fill_(lr_now)
        eps_now = epsilon_at(global_step)
        torch.mul(eps_scale, eps_now, out=epsilon)

        # --- rollout: no host-device synchronisation in this loop ---
        rollout_start = time.time()
        env_log_sums: dict[str, list] = {}  # name -> [sum, steps on which the env reported it]
        for step in range(args.num_steps):
            with torch.no_grad():
                action = policy_step(next_obs["policy"], epsilon)
            obs = next_obs
            next_obs, reward, terminated, truncated, info = envs.step(action)
            storage.write(step, TensorDict(
                {"obs": obs["policy"], "final_obs": info["final_obs"]["policy"], "actions": action,
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

        with torch.no_grad():
            # --- finished-episode statistics, on the device ---
            dones = data["terminated"] | data["truncated"]
            ep_sums = torch.zeros(3, device=device, dtype=torch.float64)  # return sum, length sum, count
            for t in range(args.num_steps):
                ep_stats[0] += data["rewards"][t]
                ep_stats[1] += 1
                d = dones[t]
                ep_sums += torch.stack([(ep_stats[0] * d).sum(), (ep_stats[1] * d).sum(), d.sum().double()])
                ep_stats *= ~d

            # --- max-Q of next and final observations, batched over the rollout; Q(lambda) targets ---
            obs_n = qnet.obs_rms(data["obs"])  # the same statistics the policy acted with
            q_max = qnet(obs_n).amax(-1)
            last_q_max = qnet(qnet.obs_rms(next_obs["policy"])).amax(-1)
            next_q_max = torch.cat([q_max[1:], last_q_max.unsqueeze(0)])
            final_q_max = qnet(qnet.obs_rms(data["final_obs"])).amax(-1)
            rewards = data["rewards"] * args.reward_scale
            targets = targets_fn(rewards, next_q_max, final_q_max, data["terminated"], data["truncated"], args.gamma, args.q_lambda)
            if args.obs_norm:  # statistics for the next rollout come from this rollout's data only
                qnet.obs_rms.update(data["obs"])

        # --- update: epochs of shuffled minibatches over the [T*N] batch ---
        update_start = time.time()
        batch = TensorDict(
            {"obs_n": obs_n, "actions": data["actions"], "targets": targets}, batch_size=[args.num_steps, args.num_envs]
        ).reshape(-1)
        loss_sums = torch.zeros(2, device=device)
        for epoch in range(args.update_epochs):
            perm = torch.randperm(batch_size, device=device)
            for start in range(0, batch_size, minibatch_size):
                loss_sums += update_minibatch(batch[perm[start : start + minibatch_size]])
        sync_device()
        update_time = time.time() - update_start
        time_totals[1] += update_time

        # --- once per iteration: one host sync for logging, the NaN guard and the stop signal ---
        with torch.no_grad():
            finite = torch.stack([
                torch.isfinite(data["obs"]).all(), torch.isfinite(data["rewards"]).all(),
                torch.isfinite(targets).all(), torch.isfinite(loss_sums).all(),
            ]).double()
            # Decisions from this rank's clock or signals, summed over ranks: all stop or save together.
            now = time.time()
            flags = [guard.received is not None,
                     args.max_wall_seconds is not None and now - start_time >= args.max_wall_seconds,
                     args.save_interval_seconds is not None and now - last_save_time >= args.save_interval_seconds]
            stop_flag = torch.tensor([float(f) for f in flags], device=device, dtype=torch.float64)
            packed = torch.cat([ep_sums, finite, stop_flag, loss_sums.double() / (args.update_epochs * args.num_minibatches)])
            distributed.all_reduce(packed)  # episode sums add up; the rest is averaged below
            # The env's own metrics are rank 0's alone (ranks may report different keys); same single sync.
            env_means = [torch.as_tensor(s / c, device=device).double().mean().reshape(1) for s, c in env_log_sums.values()]
            host = torch.cat([packed, *env_means]).tolist()
        ep_ret_sum, ep_len_sum, ep_count = host[0:3]
        nonfinite = [name for name, ok in zip(("observations", "rewards", "targets", "losses"), host[3:7]) if ok < world_size]
        if nonfinite:
            raise FloatingPointError(
                f"non-finite {', '.join(nonfinite)} at iteration {iteration}; last good checkpoint kept in {checkpoint_dir(run_dir)}"
            )
        stop_signal, out_of_time, save_time_due = (x > 0 for x in host[7:10])
        td_loss, q_values = [x / world_size for x in host[10:12]]
        env_values = host[12:]
        sps = (global_step - steps_at_start) / (time.time() - start_time)
        if ep_count > 0:
            last_train_return = ep_ret_sum / ep_count

        if master:
            writer.add_scalar("charts/SPS", sps, global_step)
            writer.add_scalar("charts/learning_rate", lr_now, global_step)
            writer.add_scalar("charts/epsilon", eps_now * eps_mean_scale, global_step)  # mean over all envs
            if ep_count > 0:
                writer.add_scalar("charts/episodic_return", ep_ret_sum / ep_count, global_step)
                writer.add_scalar("charts/episodic_length", ep_len_sum / ep_count, global_step)
            writer.add_scalar("losses/td_loss", td_loss, global_step)
            writer.add_scalar("losses/q_values", q_values, global_step)
            for name, value in zip(env_log_sums.keys(), env_values):
                writer.add_scalar(f"env/{name}", value, global_step)
            writer.add_scalar("charts/rollout_seconds", rollout_time, global_step)
            writer.add_scalar("charts/update_seconds", update_time, global_step)
            if progress is not None:
                progress.update(global_batch)
                progress.set_postfix(sps=f"{sps:,.0f}", ret=f"{last_train_return:.1f}", eps=f"{eps_now:.2f}", refresh=False)

        # --- evaluation, checkpoints and stop conditions (identical decisions on every rank) ---
        reached_target = False
        if args.eval_interval > 0 and (iteration % args.eval_interval == 0 or final_iteration):
            eval_return, eval_length = evaluate(qnet_inference, eval_envs, args.eval_episodes, seed=eval_seed + iteration)
            if master:
                writer.add_scalar("eval/episodic_return", eval_return, global_step)
                writer.add_scalar("eval/episodic_length", eval_length, global_step)
                msg = (f"iteration {iteration}/{num_iterations} step {global_step:,}: eval return {eval_return:.2f}, "
                       f"train return {last_train_return:.2f}, epsilon {eps_now:.3f}, SPS {sps:,.0f}")
                progress.write(msg) if progress is not None else print(msg, flush=True)
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
    in_sync = distributed.check_in_sync(qnet)  # averaged gradients keep every rank's weights bit-identical
    if not in_sync and master:
        print("warning: the ranks' parameters differ; a non-deterministic collective or a rank-local update diverged them", flush=True)
    if progress is not None:
        progress.close()
    summary = {
        "algo": ALGO, "env_id": args.env_id, "run_dir": str(run_dir), "global_step": global_step, "iteration": iteration,
        "wall_seconds": time.time() - start_time, "sps": sps,
        "last_train_return": None if math.isnan(last_train_return) else last_train_return,  # strict JSON: no NaN
        "best_eval_return": best_eval_return if best_eval_return > -math.inf else None, "stop_reason": stop_reason,
        "world_size": world_size, "params_in_sync": in_sync, "rollout_seconds": time_totals[0], "update_seconds": time_totals[1],
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
