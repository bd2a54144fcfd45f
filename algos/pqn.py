"""Parallel Q-learning (PQN) for massively parallel, GPU-resident environments, discrete actions.

    python algos/pqn.py --env-id CartPole-v1 --num-envs 1024
    python algos/pqn.py --env-id CartPole-v1 --device cpu --num-envs 64 --num-minibatches 4 --hidden-sizes 64 64
    torchrun --nproc-per-node 8 algos/pqn.py --env-id Acrobot-v1 --num-envs 4096

The file, top to bottom: Args -> Q-network -> Q(lambda) targets -> the epsilon schedule -> an
iteration's targets -> main and train (setup; the iteration's functions, the rollout and the update's epochs among
them; one block that compiles and captures them in place, two CUDA graphs on a GPU, the rollout and the targets with
the update; then
the loop: epsilon-greedy rollout -> Q(lambda) targets -> epochs of minibatch regression -> log every
--log-interval -> eval/save). No replay buffer and no target network:
the many parallel envs decorrelate the data, and LayerNorm in the Q-network keeps the bootstrapped
regression stable. The run around it (run directory, checkpoints, torchrun, evaluation, logging) is
in common/. `--num-envs` is per process; `--total-timesteps` counts env steps over all processes.
References: Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning" (PQN);
Watkins 1989 and Peng & Williams 1996 (Q(lambda)); CleanRL's DQN for the flag names.
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
import torch.nn.functional as F
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
if importlib.util.find_spec("common") is None:
    sys.exit(
        f"error: {Path(__file__).name} needs the project's common/ package: keep it in algos/, or pip install -e ."
    )

from common import distributed, loop  # noqa: E402
from common.args import Ge, Gt, Le, RunArgs, parse_args  # noqa: E402
from common.buffer import RolloutStorage  # noqa: E402
from common.capture import captured, compiled, timed, unwrapped_calls  # noqa: E402
from common.checkpoint import TrainingState, restore  # noqa: E402
from common.evaluation import eval_only  # noqa: E402
from common.nets import ACTIVATIONS, agent_and_twin, group_encoder, layer_init  # noqa: E402
from common.nets import observation_shape, pixel_high  # noqa: E402
from common.normalize import observation_normalizer  # noqa: E402
from common.run import begin_training, closing, finish, make_envs, open_run, start_run, what_is_due  # noqa: E402
from common.stats import add_to, nonfinite, record_env_log  # noqa: E402

ALGO = "pqn"


@dataclass
class Args(RunArgs):
    env_id: str = "CartPole-v1"
    """environment id with a Discrete action space: a built-in env (CartPole-v1, Acrobot-v1, MountainCar-v0) or an
    adapter id"""
    num_envs: int = 1024
    eval_only: bool = False
    """load --resume, evaluate the policy (epsilon-greedy with --eval-epsilon), print the returns, and exit"""

    # --- PQN ---
    total_timesteps: Annotated[int, Ge(1)] = 5_111_808
    """env steps to train for, summed over all processes (by default whole iterations of the default sizes)"""
    num_steps: Annotated[int, Ge(1)] = 16
    """steps per env per rollout; the batch per process is num_envs * num_steps"""
    num_minibatches: Annotated[int, Ge(1)] = 8
    """minibatches per epoch"""
    update_epochs: Annotated[int, Ge(1)] = 2
    """epochs over the batch per iteration"""
    learning_rate: Annotated[float, Gt(0)] = 2.5e-3
    """initial learning rate of Adam"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the iterations"""
    gamma: Annotated[float, Ge(0), Le(1)] = 0.99
    """discount factor"""
    q_lambda: Annotated[float, Ge(0), Le(1)] = 0.65
    """lambda of the Q(lambda) targets (0: one-step Q-learning, 1: Monte-Carlo returns within the rollout)"""
    reward_scale: Annotated[float, Gt(0)] = 0.1
    """rewards are multiplied by this in the targets (the Q-values learn scaled returns; logged returns stay raw):
    Q-values of O(10), not O(100), for the last Linear after a LayerNorm to regress"""
    loss: Literal["mse", "huber"] = "mse"
    """regression loss of Q(s, a) on the targets: 0.5 * squared error, or Huber (delta 1)"""
    max_grad_norm: Annotated[float, Gt(0)] = 10.0
    """global gradient-norm clip"""
    start_e: Annotated[float, Ge(0), Le(1)] = 1.0
    """epsilon of the epsilon-greedy policy at the start"""
    end_e: Annotated[float, Ge(0), Le(1)] = 0.05
    """epsilon at the end of the linear decay (kept afterwards)"""
    exploration_fraction: Annotated[float, Ge(0), Le(1)] = 0.2
    """fraction of --total-timesteps over which epsilon decays from start_e to end_e"""
    epsilon_spread: Annotated[float, Ge(0), Le(1)] = 0.0
    """per-env exploration: env i of M (over all processes) uses epsilon * (1 - spread * i / (M - 1)); 0: all alike"""
    eval_epsilon: Annotated[float, Ge(0), Le(1)] = 0.05
    """epsilon of the evaluated policy, the DQN protocol's (Mnih et al. 2015, CleanRL's DQN evaluation): a greedy
    policy can repeat one action forever (Breakout without FIRE); 0 evaluates the greedy policy, which --export
    writes whatever this is"""
    hidden_sizes: Annotated[tuple[int, ...], Ge(1)] = (128, 128)
    """hidden layer sizes of the Q-network (each Linear -> LayerNorm -> activation)"""
    activation: Literal["relu", "tanh", "elu", "silu"] = "relu"
    """activation of the hidden layers"""
    encoder: Literal["nature", "impala", "minatar", "mlp"] = "nature"
    """encoder of image observations (uint8 [C, H, W]) before the hidden layers: the Atari DQN CNN, IMPALA's
    ResNet, MinAtar's one-conv network (PQN's there), or the flattened frames; its Linear gets a LayerNorm too"""
    obs_norm: bool = True
    """normalize observations with running statistics of the rollouts (Acrobot's velocities reach 28, its
    angles' sines 1: unnormalized, the velocities dominate the first LayerNorm)"""
    obs_clip: Annotated[float, Gt(0)] = 10.0
    """clip normalized observations to [-obs_clip, obs_clip]"""


# Named settings (common.settings): the set of the env id's family unless --settings names another; flags given win.
SETTINGS = {
    # the MinAtar rows of the learning results (tests/benchmarks/results), PQN's own MinAtar config (purejaxql): 128
    # envs x 32 steps, 32 minibatches, 2 epochs, Adam 5e-4, epsilon to 0.05 over the first 10%, unscaled rewards,
    # MinAtar's one-conv network and one 128-unit layer; an evaluation on 16 envs every 10 iterations
    "minatar": dict(
        total_timesteps=655_360,  # the MinAtar tables' budget: 160 iterations of 128 x 32
        num_envs=128,
        num_steps=32,
        num_minibatches=32,
        learning_rate=5e-4,
        reward_scale=1.0,
        exploration_fraction=0.1,
        hidden_sizes=(128,),
        encoder="minatar",
        num_eval_envs=16,
        eval_interval=10,
    ),
    # PQN's own Atari config (purejaxql's pqn_atari): 128 envs x 32 steps, 32 minibatches, 2 epochs, 2.5e-4 over 10M
    # steps, lambda 0.65, gradient clip 10, epsilon decayed over the first 10%, with CleanRL's pqn_atari_envpool.py's
    # end epsilon 0.01 and annealed lr (purejaxql's: 0.001, constant); rewards clipped (the atari preset) and unscaled;
    # the nature CNN (its Linear with a LayerNorm) under one linear head; an evaluation on 8 envs every 512,000 steps
    # (purejaxql's 8 test envs; 20 over the 10M steps: at most 5% of the steps, common.evaluation's budget)
    "atari": dict(
        env_kwargs='{"preset": "atari"}',
        total_timesteps=10_000_000,
        num_envs=128,
        num_steps=32,
        num_minibatches=32,
        learning_rate=2.5e-4,
        end_e=0.01,
        exploration_fraction=0.1,
        reward_scale=1.0,
        hidden_sizes=(),
        num_eval_envs=8,
        eval_interval=125,
    ),
}


# ----------------------------------------------------------------------------------------------
# Q-network: an MLP with LayerNorm after every hidden Linear (before the activation)
# ----------------------------------------------------------------------------------------------
class QNetwork(nn.Module):
    """Q(s, .) for every action, with the observation normalizer so that one state_dict holds all.

    LayerNorm is what lets PQN drop the target network: it keeps the features bounded, and with
    them the bootstrapped regression from diverging (Gallici et al., 2024). Observations of one env
    are [D] vectors (an int will do) or uint8 [C, H, W] images, which go through an --encoder first
    (scaled by 1/pixel_high there, never normalized), or a dict term -> shape (common.nets.TermsEncoder).
    """

    def __init__(self, obs_shape, num_actions: int, args: Args, pixel_high: float = 255.0):
        super().__init__()
        obs_shape = (obs_shape,) if isinstance(obs_shape, int) else obs_shape
        encoder = group_encoder(
            obs_shape, args.encoder, pixel_high, layer_norm=True
        )  # frames' (or terms') encoder, if any
        layers, last = ([], obs_shape[0]) if encoder is None else ([encoder], encoder.out_dim)
        for h in args.hidden_sizes:
            layers += [layer_init(nn.Linear(last, h)), nn.LayerNorm(h), ACTIVATIONS[args.activation]()]
            last = h
        layers.append(layer_init(nn.Linear(last, num_actions), gain=1.0))
        self.q = nn.Sequential(*layers)
        self.obs_rms = observation_normalizer(obs_shape, args.obs_norm, args.obs_clip)
        self.eval_epsilon = args.eval_epsilon

    def forward(self, obs_n: torch.Tensor) -> torch.Tensor:  # Q-values [..., num_actions] of normalized obs
        return self.q(obs_n)

    def deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        """The exported policy on raw observations: the greedy action."""
        return self.q(self.obs_rms(obs)).argmax(-1)

    def evaluation_action(self, obs: torch.Tensor) -> torch.Tensor:
        """The evaluated policy (common.evaluation): epsilon-greedy with --eval-epsilon."""
        return self.act(obs, self.eval_epsilon)

    def act(self, obs: torch.Tensor, epsilon: torch.Tensor | float) -> torch.Tensor:
        """Epsilon-greedy with one epsilon per env (a tensor [N]) or one for all: a uniform action with probability
        epsilon."""
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


def epsilon_at(step: int, total_steps: int, args: Args) -> float:
    """Linear decay from start_e to end_e over exploration_fraction of the run, then constant."""
    duration = args.exploration_fraction * total_steps
    return args.end_e + (args.start_e - args.end_e) * max(0.0, 1.0 - step / duration) if duration > 0 else args.end_e


# ----------------------------------------------------------------------------------------------
# One iteration: rollout (train's env_step and rollout_fn) -> targets -> update, each a function of tensors
# that live as long as the run, so that on CUDA they are compiled and captured whole (with a built-in env, all T
# steps of the rollout are one CUDA graph; the targets and all epochs and minibatches of the update another).
# `stats` gathers on the device, by name, what the logs read every --log-interval iterations.
# ----------------------------------------------------------------------------------------------
@torch.no_grad()
def targets(
    qnet: QNetwork, data: TensorDict, next_obs: TensorDict, ep_stats: torch.Tensor, episodes: torch.Tensor, args: Args
):
    """Episode statistics; max-Q of the next observations, batched; the Q(lambda) targets;
    then the observation statistics for the next rollout. Returns the flat batch the update reads
    and the counts of non-finite values by name."""
    # the logged returns: the game's score where the env reports one apart from the learner's rewards (Atari's presets)
    loop.rollout_episodes(data, data["terminated"] | data["truncated"], ep_stats, episodes)
    obs_n = qnet.obs_rms(data["obs"])  # the same statistics the policy acted with
    q_max = qnet(obs_n).amax(-1)
    last_q_max = qnet(qnet.obs_rms(next_obs["policy"])).amax(-1)
    next_q_max = torch.cat([q_max[1:], last_q_max.unsqueeze(0)])
    rewards = data["rewards"] * args.reward_scale
    q_targets = q_lambda_targets(
        rewards, next_q_max, data["final_q_max"], data["terminated"], data["truncated"], args.gamma, args.q_lambda
    )
    nonfinite_counts = {
        name: nonfinite(x)
        for name, x in (("observations", data["obs"]), ("rewards", data["rewards"]), ("targets", q_targets))
    }
    if args.obs_norm:  # statistics for the next rollout come from this rollout's data only
        qnet.obs_rms.update(data["obs"])
    batch = TensorDict(
        {"obs_n": obs_n, "actions": data["actions"], "targets": q_targets},
        batch_size=rewards.shape,
        device=rewards.device,
    )
    return batch.reshape(-1), nonfinite_counts


# ----------------------------------------------------------------------------------------------
def main(args: Args) -> dict:
    run = start_run(args, ALGO, {"log_interval": (10, 1)})
    with closing(run):  # on any exit, an error included: graphs released, then the process group left
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
    envs, eval_envs = make_envs(
        run, gym.spaces.Discrete, hint="for continuous actions use algos/ppo.py, algos/td3.py or algos/sac.py"
    )

    next_obs, _ = envs.reset()  # the seeds make_envs gave them
    obs_shape, num_actions = observation_shape(next_obs, "policy"), int(envs.single_action_space.n)
    high = pixel_high(envs.single_observation_space)  # 255 for uint8 frames: the encoder divides by it
    # the same initial weights on every rank, and a grad-free twin for acting that shares the network's storage
    qnet, qnet_inference = agent_and_twin(lambda: QNetwork(obs_shape, num_actions, args, high), device)
    lr = torch.tensor(args.learning_rate, device=device)  # a tensor: the schedule updates it in place
    # capturable on CUDA: step counts and lr stay on the device, so optimizer.step() never syncs.
    optimizer = torch.optim.Adam(qnet.parameters(), lr=lr, eps=1e-5, capturable=device.type == "cuda")
    ep_stats = torch.zeros(2, args.num_envs, device=device, dtype=torch.float64)  # running return, length
    # Per-env epsilon: the schedule's value scaled by the env's place among all envs of all ranks.
    env_index = run.rank * args.num_envs + torch.arange(args.num_envs, device=device)
    eps_scale = 1.0 - args.epsilon_spread * env_index / max(1, run.world_size * args.num_envs - 1)
    eps_mean_scale = 1.0 - args.epsilon_spread / 2 if run.world_size * args.num_envs > 1 else 1.0
    epsilon = torch.empty(args.num_envs, device=device)  # one fixed buffer, refilled every iteration

    # what the checkpoints hold besides the counters, restored in place
    state = TrainingState(
        qnet, {"adam": optimizer}, envs, replicated={"learning_rate": lr}, per_rank={"ep_stats": ep_stats}
    )
    next_obs = restore(run, state, next_obs)
    if args.eval_only:
        return eval_only(run, eval_envs, qnet_inference)

    storage = RolloutStorage(args.num_steps, args.num_envs, device)
    # what the log reads, gathered on the device: episodes, losses, non-finite counts
    stats = loop.iteration_stats(device)

    # --- the iteration's functions: acting, the env step, the rollout, the targets, a minibatch's update, the update;
    # the compile-and-capture block below rebinds their names in place ---
    act = qnet_inference.act  # epsilon-greedy

    @torch.no_grad()
    def final_q_max(final_obs: torch.Tensor) -> torch.Tensor:
        """max_a Q(final_obs, a), the time-out bootstrap, at the step: stored in place of a second observation per step
        (half the storage of frames). The weights and statistics the targets read: nothing changes them within a
        rollout."""
        return qnet_inference(qnet_inference.obs_rms(final_obs)).amax(-1)

    def env_step(obs: TensorDict):
        """Act epsilon-greedily and step every env once: (next observation, the transition to store, the env's info)."""
        action = act(obs["policy"], epsilon)
        next_obs, reward, terminated, truncated, info = envs.step(action)
        transition = {
            "obs": obs["policy"],
            "final_q_max": final_q_max(info["final_obs"]["policy"]),
            "actions": action,
            "rewards": reward.float(),
            "terminated": terminated,
            "truncated": truncated,
        }
        # Atari: a life is the learner's episode, the game's score is what is logged
        return next_obs, TensorDict(loop.with_game_score(transition, info), batch_size=[envs.num_envs]), info

    def update_minibatch(mb: TensorDict):
        """One gradient step on a minibatch; returns its loss and mean Q for logging (on the device)."""
        q = qnet(mb["obs_n"]).gather(-1, mb["actions"].unsqueeze(-1)).squeeze(-1)
        loss = F.huber_loss(q, mb["targets"]) if args.loss == "huber" else 0.5 * (q - mb["targets"]).square().mean()
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        distributed.all_reduce_gradients(qnet.parameters())
        nn.utils.clip_grad_norm_(qnet.parameters(), args.max_grad_norm)
        optimizer.step()
        return {"td_loss": loss.detach(), "q_values": q.mean().detach()}

    def rollout_fn(obs: TensorDict) -> TensorDict:
        """The env step --num-steps times, each transition into the storage at its step and the env's own metrics
        recorded: the observation after the last step. No host sync: with a built-in env, one CUDA graph."""
        for step in range(args.num_steps):
            obs, transition, info = env_step(obs)
            storage.write(step, transition)
            record_env_log(run, info)
        return obs

    def targets_fn(obs: TensorDict):
        """The Q(lambda) targets of the rollout in the storage (targets, above), from the run's state."""
        return targets(qnet, storage.data, obs, ep_stats, stats["episodes"], args)

    def update_fn(obs: TensorDict) -> None:
        """The Q(lambda) targets of the rollout, then the epochs of the update; their statistics into `stats`."""
        batch, nonfinite_counts = targets_fn(obs)
        add_to(stats["nonfinite"], nonfinite_counts)
        loss_sums = {}
        for epoch in range(args.update_epochs):  # epochs of shuffled minibatches over the [T*N] batch
            perm = torch.randperm(batch.shape[0], device=batch.device)
            for start in range(0, batch.shape[0], minibatch_size):
                add_to(loss_sums, update_minibatch(batch[perm[start : start + minibatch_size]]))
        loop.add_update_means(stats, loss_sums, args.update_epochs * args.num_minibatches)

    # --- compile (--compile) and capture (--cudagraphs) the functions above, unchanged, each name rebound in place
    # once: the functions that call it read the wrapped one through their closures (a warning names any that kept
    # the function from before) ---
    if whole_rollout := getattr(envs, "capturable", False):  # a built-in env steps inside the graph: the whole
        env_step = compiled(run, env_step)  # rollout is one
    else:  # an adapter's simulator cannot be captured: it steps eagerly between the captured acting steps
        act = captured(run, "acting", compiled(run, act))
        final_q_max = captured(run, "final value", compiled(run, final_q_max))
    update_minibatch, targets_fn = compiled(run, update_minibatch), compiled(run, targets_fn)
    rollout_fn = captured(run, "rollout", rollout_fn, capture=whole_rollout)
    # the targets and every epoch of the update as one graph: the batch never leaves it
    update_fn = captured(run, "update", update_fn)
    unwrapped_calls(run, locals())
    graphs = "off"  # what the CUDA graphs hold, as the start line says it
    if args.cudagraphs:
        graphs = f"{'the whole rollout' if whole_rollout else 'each acting step'}, the targets and the whole update"
    minibatches = f"{args.num_minibatches} minibatch{'es' if args.num_minibatches > 1 else ''}"
    said = f"batch {global_batch} per iteration ({minibatches} of {minibatch_size} per process)"
    begin_training(run, said, global_batch, graphs)
    # counted in env steps: a run resumed with another world size ends at --total-timesteps, its schedules continuing
    while run.global_step + global_batch <= total_steps:
        run.iteration += 1
        lr_now = args.learning_rate * (1.0 - run.global_step / total_steps) if args.anneal_lr else None
        if lr_now is not None:
            lr.fill_(lr_now)
        eps_now = epsilon_at(run.global_step, total_steps, args)
        torch.mul(eps_scale, eps_now, out=epsilon)

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
            local = {
                "charts/learning_rate": lr_now if lr_now is not None else lr,
                "charts/epsilon": eps_now * eps_mean_scale,  # the mean over all envs
            }
            loop.log_iteration(run, stats, iterations_since_last_log, local)
        if loop.evaluate_and_save(run, due, eval_envs, qnet_inference, state, next_obs):
            break
    return finish(run, qnet)


if __name__ == "__main__":
    main(parse_args(Args))
