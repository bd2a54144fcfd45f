"""Teacher-student distillation (DAgger) for massively parallel, GPU-resident environments.

    python algos/ppo.py --env-id CartPole-v1 --run-name teacher                              # a teacher, full state
    python algos/distill.py --env-id CartPole-v1 --env-kwargs '{"mask_velocity": true}' \\
        --teacher runs/teacher/checkpoints/best.pt                                         # a student, with memory
    python algos/ppo_lstm.py --env-id CartPole-v1 --env-kwargs '{"mask_velocity": true}' --init-from runs/STUDENT

A frozen teacher (a checkpoint of ppo.py, ppo_lstm.py or this script, with its own observation normalizer) reads
the privileged observation group (`critic` where the env has one); the student reads `policy`, through a
recurrent cell (--cell lstm|gru) or not (--cell none), with its own normalizer. The student's actions drive the
envs (DAgger: it learns on the states its own mistakes lead to; --teacher-action-prob mixes the teacher's in
early), and after each rollout the student regresses on what the teacher did there: the teacher's deterministic
action for Box actions (mse or huber on the student's mean), the teacher's distribution for Discrete ones (KL).
A recurrent student is trained by truncated BPTT over the rollout from the hidden states it started with, zeroed
at episode starts, as ppo_lstm.py's update does (carry_over, episode_starts); minibatches are sets of envs with all
their steps, so --num-minibatches divides --num-envs (env_minibatches). The student has the module and tensor names of
ppo_lstm.py's actor (cell lstm/gru) and ppo.py's (cell none), normalizer included: those scripts fine-tune it with
--init-from. Top to bottom: Args -> Policy (student and teacher alike), the teacher's loading (its checks:
common/teacher.py) -> the hidden state's carry-over and resets, the minibatch rule -> the loss -> targets -> update ->
main and train (setup, the hidden states and what the checkpoints hold; the iteration's functions, the rollout loop
among them, then one block that compiles and captures them; the loop).
References: Ross et al. 2011 (DAgger); Chen et al. 2019 ("Learning by cheating": privileged teachers);
Rudin et al. 2022 (rsl_rl, whose Distillation runner this follows).
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

# ruff: noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
if importlib.util.find_spec("common") is None:
    sys.exit(
        f"error: {Path(__file__).name} needs the project's common/ package: keep it in algos/, or pip install -e ."
    )

from common import distributed, loop, nets
from common.args import Ge, Gt, Le, RunArgs, parse_args
from common.buffer import RolloutStorage
from common.capture import captured, compiled, timed, unwrapped_calls
from common.checkpoint import TrainingState, restore
from common.evaluation import eval_only
from common.normalize import observation_normalizer
from common.recurrent import EvalPolicy, allow_rnn, recurrent_cell, state_shape_of
from common.run import begin_training, closing, finish, make_envs, open_run, start_run, what_is_due
from common.stats import add_to, record_env_log
from common.teacher import note_teacher, teacher_checkpoint, teacher_group

ALGO = "distill"
TEACHERS = ("ppo", "ppo_lstm", "distill")  # the algorithms whose actors Policy rebuilds by name (a copy of one too)


@dataclass
class Args(RunArgs):
    teacher: str | None = None
    """checkpoint of the teacher (ppo.py, ppo_lstm.py, distill.py or a copy of one), frozen, with its normalizer"""
    teacher_obs: str | None = None
    """observation group the teacher reads: default 'critic' where the env has one (the full state), else 'policy'"""
    teacher_action_prob: Annotated[float, Ge(0), Le(1)] = 0.0
    """probability that an env steps with the teacher's action instead of the student's, annealed linearly to 0"""
    teacher_action_fraction: Annotated[float, Gt(0), Le(1)] = 0.25
    """fraction of --total-timesteps over which --teacher-action-prob anneals to 0"""
    student_sample: bool = True
    """Discrete: the student samples its actions (the states its PPO fine-tuning visits), not argmax (Box: its mean)"""
    cell: Literal["none", "lstm", "gru"] = "lstm"
    """the student's recurrent cell (as ppo_lstm.py's), or none: an MLP (as ppo.py's actor)"""
    rnn_hidden_size: Annotated[int, Ge(1)] = 64
    """hidden units of the cell (per layer)"""
    rnn_layers: Annotated[int, Ge(1)] = 1
    """stacked layers of the cell"""
    hidden_sizes: Annotated[tuple[int, ...], Ge(1)] = (64,)
    """hidden layer sizes of the student's actor head (give the same to ppo.py / ppo_lstm.py to fine-tune it)"""
    activation: Literal["tanh", "elu", "relu", "silu"] = "tanh"
    """activation of the actor head's hidden layers"""
    total_timesteps: Annotated[int, Ge(1)] = 5_111_808
    """env steps to train for, summed over all processes (by default whole iterations of the default sizes)"""
    num_steps: Annotated[int, Ge(1)] = 32
    """steps per env per rollout, also the length of the replayed sequences (truncated BPTT)"""
    num_minibatches: Annotated[int, Ge(1)] = 4
    """minibatches per epoch: each is num_envs / num_minibatches envs with all their num_steps steps"""
    update_epochs: Annotated[int, Ge(1)] = 2
    """epochs over the rollout per iteration"""
    learning_rate: Annotated[float, Gt(0)] = 1e-3
    """learning rate of Adam"""
    lr_schedule: Literal["constant", "linear"] = "constant"
    """constant, or linear anneal to 0"""
    loss: Literal["mse", "huber"] = "mse"
    """Box actions: the regression of the student's mean on the teacher's action (Discrete: always KL)"""
    max_grad_norm: Annotated[float, Gt(0)] = 1.0
    """global gradient-norm clip"""
    obs_norm: bool = True
    """normalize the student's observations with running statistics of the rollouts"""
    obs_clip: Annotated[float, Gt(0)] = 10.0
    """clip normalized observations to [-obs_clip, obs_clip]"""


# Named settings (common.settings): the set of the env id's family unless --settings names another; flags given win.
# None measured for distillation yet (its teacher's task decides): only builtin, the defaults above.
SETTINGS = {}


# --- Networks: one Policy class for the student and the teacher ---
class Policy(nn.Module):
    """An actor: normalized observations -> (a recurrent cell ->) an MLP head -> logits (Discrete) or the mean
    action (Box). Its tensors are named as ppo_lstm.py's Agent names them (rnn.*, actor.*, obs_rms.*), and as
    ppo.py's without a cell: those scripts' checkpoints load into it as teachers, and it starts them with
    --init-from. The hidden state of a batch of envs is one tensor [k * rnn_layers, batch, rnn_hidden_size] (k = 2
    for an LSTM: the h rows, then the c rows; common.nets.rnn_step's layout), the batch at dim 1, as ppo_lstm.py's;
    without a cell it has no rows."""

    def __init__(
        self,
        obs_dim: int,
        action_space: gym.Space,
        cell: str,
        rnn_hidden_size: int,
        rnn_layers: int,
        hidden_sizes: tuple[int, ...],
        activation: str,
        obs_norm: bool,
        obs_clip: float,
    ):
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        act_dim = nets.action_size(action_space)
        self.rnn = None if cell == "none" else recurrent_cell(cell, obs_dim, rnn_hidden_size, rnn_layers)
        self.state_shape = state_shape_of(self.rnn)  # one env's (rows, hidden)
        head_in = obs_dim if self.rnn is None else rnn_hidden_size
        self.actor = nets.mlp(head_in, act_dim, hidden_sizes, activation, out_gain=0.01)
        nets.register_action_bounds(self, action_space)  # the mean is clipped to them on its way to the env
        self.obs_rms = observation_normalizer((obs_dim,), obs_norm, obs_clip)

    def initial_state(self, batch: int) -> torch.Tensor:  # of `batch` envs at the start of an episode
        return torch.zeros(self.state_shape[0], batch, self.state_shape[1], device=self.actor[0].weight.device)

    def memory(self, obs_n: torch.Tensor, state: torch.Tensor):
        """One step: normalized observations [B, obs_dim] and the state -> (the head's input [B, H], next state).
        The module's step as matmuls and pointwise ops on its own weights (common.nets.rnn_step, as ppo_lstm.py
        acts: no fused RNN kernel, which would dispatch to another kernel on each device)."""
        return (obs_n, state) if self.rnn is None else nets.rnn_step(self.rnn, obs_n, state)

    def replay(self, obs_n: torch.Tensor, state: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        """The cell over sequences [T, B, obs_dim] from `state`, zeroed where an episode starts (starts [T, B]),
        the same step as acting: the head's inputs [T, B, H] the rollout acted on, to float rounding."""
        if self.rnn is None:
            return obs_n
        keep, outputs = (~starts).unsqueeze(-1), []
        for t in range(obs_n.shape[0]):
            out, state = nets.rnn_step(self.rnn, obs_n[t], state * keep[t])
            outputs.append(out)
        return torch.stack(outputs)

    to_env = nets.clip_to_bounds  # a Box's actions clipped to its bounds on their way to the env

    def action(self, head: torch.Tensor) -> torch.Tensor:  # the deterministic action of the head's output
        return head.argmax(-1) if self.discrete else self.to_env(head)

    def step(self, policy_obs: torch.Tensor, state: torch.Tensor):
        """Raw observations and the state -> (the head's output: logits or mean; the next state)."""
        out, state = self.memory(self.obs_rms(policy_obs), state)
        return self.actor(out).float(), state

    def deterministic(self, policy_obs: torch.Tensor) -> torch.Tensor:  # evaluated and exported without a cell
        return self.action(self.actor(self.obs_rms(policy_obs)).float())

    def _recurrent_step(self, policy_obs: torch.Tensor, state: torch.Tensor):
        head, state = self.step(policy_obs, state)
        return self.action(head), state

    @property
    def recurrent_step(self):
        """(obs, state) -> (action, next state): what common/export.py exports, for a student with a cell only."""
        if self.rnn is None:
            raise AttributeError("a policy without a cell has no recurrent_step")
        return self._recurrent_step


def load_teacher(path: str, obs_dim: int, group: str, space: gym.Space, env_id: str, device) -> tuple[Policy, str]:
    """The teacher of checkpoint `path` as a frozen Policy on `device`, rebuilt from the flags it was trained with,
    and the file's sha256; a checkpoint that is not a teacher of the task stops in one line (common/teacher.py)."""
    ckpt, digest = teacher_checkpoint(path, obs_dim, group, space, env_id, TEACHERS)
    a = ckpt["args"]
    sizes = a.get("rnn_hidden_size", 1), a.get("rnn_layers", 1), tuple(a["hidden_sizes"])
    teacher = Policy(obs_dim, space, a.get("cell", "none"), *sizes, a["activation"], a["obs_norm"], a["obs_clip"])
    actor = {k: v for k, v in ckpt["model"].items() if k in teacher.state_dict()}
    teacher.load_state_dict(actor)  # strict: all of the actor
    return teacher.to(device).eval().requires_grad_(False), digest


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


# --- The loss of a minibatch of sequences ---
def distill_loss(student: Policy, mb: TensorDict, state: torch.Tensor, args: Args):
    """The student replays the minibatch's sequences from their initial hidden states; Discrete: KL(teacher ||
    student) of the action distributions; Box: mse or huber of the student's mean to the teacher's action.
    Returns the loss and what is logged of it, by name (losses/<name>)."""
    head = student.actor(student.replay(mb["obs_n"], state, mb["starts"])).float()
    if student.discrete:
        kl = F.kl_div(head.log_softmax(-1), mb["teacher"].log_softmax(-1), log_target=True, reduction="none")
        loss = kl.sum(-1).mean()
        agreement = (head.argmax(-1) == mb["teacher"].argmax(-1)).float().mean()
    else:
        loss = (F.mse_loss if args.loss == "mse" else F.huber_loss)(head, mb["teacher"])
        tolerance = 0.05 * (student.action_high - student.action_low) if student.action_low.numel() else 0.05
        agreement = ((student.to_env(head) - mb["teacher"]).abs() <= tolerance).all(-1).float().mean()
    return loss, {"distill_loss": loss.detach(), "agreement": agreement.detach()}


# --- One iteration: rollout (train's rollout_fn) -> targets -> update ---
# Functions of tensors that live as long as the run (the hidden states included), so that on CUDA each is compiled
# and captured whole.
@torch.no_grad()
def targets(student: Policy, data: TensorDict, ep_stats: torch.Tensor, episodes: torch.Tensor, args: Args):
    """The episode statistics of a rollout, its observations normalized as the student acted on them, then
    the observation statistics for the next one. Returns the [T, N] batch of sequences the update reads
    and the rollout's counts of non-finite values, by name."""
    loop.rollout_episodes(data, data["dones"], ep_stats, episodes)  # the logged returns: the game's score if reported
    nonfinite = {
        name: (~torch.isfinite(data[key])).sum()
        for name, key in (("observations", "obs"), ("rewards", "rewards"), ("teacher", "teacher"))
    }
    obs_n = student.obs_rms(data["obs"])  # the statistics the student acted with
    # the next rollout's statistics from this one only (never eval data; off: no-op)
    student.obs_rms.update(data["obs"])
    starts = episode_starts(data["dones"])  # where the replay zeroes the state, as the rollout did
    return TensorDict(
        {"obs_n": obs_n, "starts": starts, "teacher": data["teacher"]}, batch_size=starts.shape, device=starts.device
    ), nonfinite


# --- main and train ---
def main(args: Args) -> dict:
    with closing(start_run(args, ALGO, {"log_interval": (10, 1)})) as run, allow_rnn():  # dynamo traces the cell
        return train(run, args)  # on any exit, an error included: graphs released, then the process group left


def train(run, args: Args) -> dict:
    open_run(run)  # the run directory and the checkpoint to resume (whose flags, --teacher among them, it takes)
    device = run.device
    envs_per_minibatch = env_minibatches(args)  # or a one-line error: the envs must divide
    global_batch = args.num_envs * args.num_steps * run.world_size
    total_steps = max(args.total_timesteps, global_batch)  # at least one iteration
    envs, eval_envs = make_envs(run)

    next_obs, _ = envs.reset()  # the seeds make_envs gave them
    space, discrete = envs.single_action_space, isinstance(envs.single_action_space, gym.spaces.Discrete)
    sizes = args.rnn_hidden_size, args.rnn_layers, args.hidden_sizes
    student_args = (args.cell, *sizes, args.activation, args.obs_norm, args.obs_clip)
    obs_dim = nets.vector_size(next_obs, "policy", "distill.py")  # the student's input
    # rank 0's initial weights on every rank, and a grad-free twin for acting that shares the student's storage
    student, student_inference = nets.agent_and_twin(lambda: Policy(obs_dim, space, *student_args), device)
    # one hidden state per eval env
    eval_policy = EvalPolicy(student_inference, args.num_eval_envs) if args.cell != "none" else student_inference
    lr = torch.tensor(args.learning_rate, device=device)  # a tensor: the schedule updates it in place
    optimizer = torch.optim.Adam(student.parameters(), lr=lr, eps=1e-5, capturable=device.type == "cuda")
    ep_stats = torch.zeros(2, args.num_envs, device=device, dtype=torch.float64)  # running return, length
    rnn_state = student.initial_state(args.num_envs)  # live: every write is in place
    initial_state = torch.zeros_like(rnn_state)  # each env's state at the start of the rollout
    teacher_info = {"path": str(args.teacher), "sha256": None}  # of the teacher file, in the checkpoints and summary
    teacher_state = torch.zeros(0, args.num_envs, 1, device=device)  # a recurrent teacher's memory (no rows: an MLP's)
    if not args.eval_only:  # --eval-only evaluates the student alone: no teacher needed
        teacher_key = teacher_group(args, next_obs)  # the group it reads, or a clear error
        teacher_dim = next_obs[teacher_key].shape[-1]
        teacher, digest = load_teacher(args.teacher, teacher_dim, teacher_key, space, args.env_id, device)
        teacher_state = teacher.initial_state(args.num_envs)

    # what the checkpoints hold besides the counters, restored in place
    state = TrainingState(
        student,
        {"adam": optimizer},
        envs,
        replicated={"learning_rate": lr, "teacher": teacher_info},
        per_rank={"ep_stats": ep_stats, "rnn_state": rnn_state, "teacher_state": teacher_state},
    )
    next_obs = restore(run, state, next_obs)  # envs that start fresh episodes start from zero states
    if args.eval_only:
        return eval_only(run, eval_envs, eval_policy)
    note_teacher(run, teacher_info, args.teacher, digest)  # a notice where a resumed run's teacher file changed
    teacher_prob = torch.tensor(args.teacher_action_prob, device=device)  # annealed in place

    storage = RolloutStorage(args.num_steps, args.num_envs, device)
    stats = loop.iteration_stats(device)  # what the log reads, gathered on the device: episodes, losses, non-finite

    # --- the iteration's functions: acting, the end of a step, the env step, the rollout, the targets, a minibatch's
    # update, the update; the compile-and-capture block below rebinds their names in place ---
    @torch.no_grad()
    def policy_step(obs: TensorDict):
        """The student's action (or, with --teacher-action-prob, the teacher's), the teacher's target (its logits,
        or its action), and both next hidden states."""
        head, student_next = student_inference.step(obs["policy"], rnn_state)
        teacher_head, teacher_next = teacher.step(obs[teacher_key], teacher_state)
        sampled = discrete and args.student_sample  # validate_args=False: its checks read the host
        action = (
            torch.distributions.Categorical(logits=head, validate_args=False).sample()
            if sampled
            else student_inference.action(head)
        )
        teacher_action = teacher.action(teacher_head)
        if args.teacher_action_prob > 0:
            use_teacher = torch.rand(action.shape[0], device=device) < teacher_prob
            action = torch.where(use_teacher if discrete else use_teacher.unsqueeze(-1), teacher_action, action)
        return action, teacher_head if discrete else teacher_action, student_next, teacher_next

    def end_step(student_next: torch.Tensor, teacher_next: torch.Tensor, done: torch.Tensor) -> None:
        """The hidden states move on, zeroed in place for the envs whose episode ended."""
        carry_over(rnn_state, student_next, done)
        carry_over(teacher_state, teacher_next, done)

    def env_step(obs: TensorDict):
        """Act and step every env once: (next observation, the transition to store, the env's info)."""
        action, target, student_next, teacher_next = policy_step(obs)
        next_obs, reward, terminated, truncated, info = envs.step(action)
        end_step(student_next, teacher_next, terminated | truncated)
        transition = {
            "obs": obs["policy"],
            "teacher": target,
            "rewards": reward.float(),
            "dones": terminated | truncated,
        }
        transition = loop.with_game_score(transition, info)  # Atari: the game's score is what is logged
        return next_obs, TensorDict(transition, batch_size=[envs.num_envs]), info

    def update_minibatch(mb: TensorDict, state: torch.Tensor):
        """One gradient step on a minibatch of sequences (gradients averaged over ranks); returns its losses."""
        loss, losses = distill_loss(student, mb, state, args)
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        distributed.all_reduce_gradients(student.parameters())
        nn.utils.clip_grad_norm_(student.parameters(), args.max_grad_norm)
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

    def targets_fn():
        """The targets of the rollout in the storage (targets, above), from the run's state."""
        return targets(student, storage.data, ep_stats, stats["episodes"], args)

    def update_fn() -> None:
        """The targets of the rollout, then the epochs of the update; their statistics into `stats`."""
        batch, nonfinite = targets_fn()
        add_to(stats["nonfinite"], nonfinite)
        # epochs of minibatches of shuffled envs, each with its whole sequence and its initial hidden state
        num_envs, loss_sums, num_updates = batch.shape[1], {}, 0
        envs_per_minibatch = num_envs // args.num_minibatches
        for epoch in range(args.update_epochs):
            perm = torch.randperm(num_envs, device=batch.device)
            for start in range(0, num_envs, envs_per_minibatch):
                mb_envs = perm[start : start + envs_per_minibatch]  # the minibatch's envs
                add_to(loss_sums, update_minibatch(batch[:, mb_envs], initial_state[:, mb_envs]))
                num_updates += 1
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
    # the start line: the teacher, the student, the batch as minibatches of envs
    teacher_said = f"teacher {args.teacher} ({'MLP' if teacher.rnn is None else 'recurrent'}, reads {teacher_key!r})"
    cell_said = "MLP" if args.cell == "none" else f"{args.cell} {args.rnn_layers}x{args.rnn_hidden_size}"
    batch_said = (
        f"batch {global_batch} per iteration ({args.num_minibatches} minibatches of {envs_per_minibatch} envs x "
        f"{args.num_steps} steps per process)"
    )
    begin_training(run, f"{teacher_said}; student {cell_said} reads 'policy'; {batch_said}", global_batch)
    while run.global_step + global_batch <= total_steps:
        run.iteration += 1
        if args.lr_schedule == "linear":
            lr.fill_(args.learning_rate * (1.0 - run.global_step / total_steps))
        teacher_prob.fill_(
            args.teacher_action_prob * max(0.0, 1.0 - run.global_step / (args.teacher_action_fraction * total_steps))
        )

        with timed(run, "rollout"), torch.no_grad():
            next_obs = rollout_fn(next_obs)
        run.global_step += global_batch
        with timed(run, "update"):
            update_fn()
        # the log when due (every --log-interval iterations, and before an evaluation or a save: one host read) of the
        # iterations since the last log, then the evaluation and checkpoints due; a stop, the same on every rank
        due = what_is_due(run, final_iteration=run.global_step >= run.final_step)  # begin_training set final_step
        if due.log:
            iterations_since_last_log = (run.global_step - run.reduced_step) // run.steps_per_iteration
            local = {"charts/learning_rate": lr, "charts/teacher_action_prob": teacher_prob}
            loop.log_iteration(run, stats, iterations_since_last_log, local)
        if loop.evaluate_and_save(run, due, eval_envs, eval_policy, state, next_obs):
            break
    return finish(run, student, {"teacher": dict(teacher_info)})


if __name__ == "__main__":
    main(parse_args(Args))
