"""What ppo_lstm.py and distill.py share around their algorithm: the recurrent cell's plumbing and the rollout's
bookkeeping (the cell's step, the replay of the update, the losses and the loop stay in the scripts):

    rnn = recurrent_cell(args.cell, in_dim, args.rnn_hidden_size, args.rnn_layers)  # orthogonal weights, zero biases
    state_shape = state_shape_of(rnn)          # (rows, hidden) of one env's hidden state
    envs_per_minibatch = env_minibatches(args)  # or a one-line error where --num-minibatches does not divide --num-envs
    carry_over(rnn_state, next_state, done)    # the live state moves on, zeroed for the episodes that ended
    starts = episode_starts(dones)             # where the update's replay zeroes the state, as the rollout did
    eval_policy = EvalPolicy(policy, num_eval_envs)  # one hidden state per eval env (common/evaluation.py)
    begin_training(run, f"...; {batch_said(args, global_batch, envs_per_minibatch)}; {cell_said(args)}", ...)
    with closing(start_run(...)) as run, allow_rnn(): ...

and the wiring of ppo_lstm.py's train around its algorithm (the iteration's functions and the loop's algorithm lines
stay in the script; what it shares with ppo.py, from the game's score to the end of an iteration, is common/loop.py's):

    envs_per_minibatch, global_batch, total_steps = recurrent_sizes(run)  # or the one-line error of env_minibatches
    envs, eval_envs, next_obs, (obs_shape, critic_shape, pixel_highs) = recurrent_envs(run)  # reset, group_shapes
    (encoder, width), (critic_encoder, critic_width) = group_encoders(shapes, args.encoder, pixel_highs)
    state, ep_stats, rnn_state, initial_state = recurrent_ppo_state(agent, optimizer, envs, lr, reward_normalizer)
    begin_recurrent(run, global_batch, envs_per_minibatch)  # begin_training with batch_said and cell_said

The hidden state of a batch of envs is one tensor [k * rnn_layers, batch, rnn_hidden_size] (k = 2 for an LSTM: the h
rows, then the c rows; the layout of common.nets.rnn_step), the batch at dim 1: a minibatch of envs is `state[:, envs]`,
and the exported policy takes it so (common/export.py). The rollout writes the live state in place (a built-in env's
rollout stays one CUDA graph), copies it at the rollout's start and zeroes the rows of every env whose episode ended
before the next step reads them; the update replays each env's rollout as one sequence from that copy (truncated BPTT
over --num-steps), zeroing it at the episode starts as the rollout did. Minibatches are sets of envs with all their
steps. Checkpoints hold each rank's hidden states: a resume is exact.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from common.checkpoint import TrainingState
from common.nets import group_encoder, group_shapes
from common.run import begin_training, make_envs


def recurrent_cell(cell: str, input_size: int, hidden_size: int, layers: int) -> nn.LSTM | nn.GRU:
    """An nn.LSTM (`cell` "lstm") or nn.GRU of `layers` layers with orthogonal weights and zero biases (CleanRL). The
    scripts step it with common.nets.rnn_step, never through the module's fused kernels."""
    rnn = (nn.LSTM if cell == "lstm" else nn.GRU)(input_size, hidden_size, num_layers=layers)
    for name, p in rnn.named_parameters():
        nn.init.orthogonal_(p) if "weight" in name else nn.init.zeros_(p)
    return rnn


def group_encoders(shapes: tuple, kind: str, pixel_highs: tuple) -> tuple[tuple[nn.Module, int], ...]:
    """(encoder, width of what it gives) of each of an agent's groups, in order (`shapes`: one env's, a tuple or a dict
    of terms; None for a group it lacks): an image group or a group of terms is read by an --encoder `kind` of its own
    (common.nets.group_encoder), as wide as its features; a vector group by nn.Identity, as wide as itself; a group the
    agent lacks by nn.Identity, of width 0. An int D is the vector group [D]."""
    out = []
    for shape, high in zip(shapes, pixel_highs):
        shape = (shape,) if isinstance(shape, int) else shape
        encoder = group_encoder(shape, kind, high) or nn.Identity()
        out.append((encoder, 0 if not shape else getattr(encoder, "out_dim", None) or shape[0]))
    return tuple(out)


def state_shape_of(rnn: nn.LSTM | nn.GRU | None) -> tuple[int, int]:
    """(rows, hidden) of one env's hidden state: k * layers rows (k = 2 for an LSTM: h, then c) of the cell's hidden
    size; without a cell (None) no rows, of size 1."""
    if rnn is None:
        return 0, 1
    return (2 if isinstance(rnn, nn.LSTM) else 1) * rnn.num_layers, rnn.hidden_size


def env_minibatches(args) -> int:
    """Envs per minibatch: a minibatch is a set of envs with their whole sequences, so --num-minibatches divides
    --num-envs, or a one-line error before anything runs."""
    if args.num_envs % args.num_minibatches != 0:
        raise SystemExit(
            f"error: --num-envs {args.num_envs} does not divide into --num-minibatches {args.num_minibatches} "
            f"(a minibatch is a set of envs with their whole sequences); pick a divisor of {args.num_envs}"
        )
    return args.num_envs // args.num_minibatches


def recurrent_sizes(run) -> tuple[int, int, int]:
    """(envs per minibatch, global batch, total env steps) of a recurrent run: a minibatch is a set of envs with their
    whole sequences (env_minibatches: a one-line error when they do not divide), an iteration is num_envs * num_steps
    env steps per process and the global batch is over all ranks; the run goes on to --total-timesteps, counted in env
    steps over all ranks, at least one iteration."""
    args = run.args
    envs_per_minibatch = env_minibatches(args)
    global_batch = args.num_envs * args.num_steps * run.world_size
    return envs_per_minibatch, global_batch, max(args.total_timesteps, global_batch)


def recurrent_envs(run) -> tuple:
    """(training envs, eval envs, the first observations, the groups' shapes) of this rank (common.run.make_envs;
    the envs reset with the seeds make_envs gave them). The shapes are common.nets.group_shapes' (policy shape,
    critic shape or None, each group's pixel high); a policy group of terms is refused where --export or
    --export-best would export the recurrent policy."""
    args = run.args
    envs, eval_envs = make_envs(run)
    next_obs, _ = envs.reset()
    refused = "--export of a recurrent policy" if args.export or args.export_best else None
    return envs, eval_envs, next_obs, group_shapes(envs, next_obs, args, refused)


def hidden_states(state_shape: tuple[int, int], num_envs: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The rollout's two hidden states of `num_envs` envs, zero (an episode's start), laid out as this module says:
    the live state, which the rollout writes in place (a captured graph reads it where it is), and each env's state at
    the start of the rollout, which the update replays from."""
    live = torch.zeros(state_shape[0], num_envs, state_shape[1], device=device)
    return live, torch.zeros_like(live)


def carry_over(live: torch.Tensor, next_state: torch.Tensor, done: torch.Tensor) -> None:
    """The live hidden states [rows, N, H] move on to `next_state` in place, zeroed for the envs whose episode ended
    (done [N]) before the next step reads them."""
    live.copy_(next_state * ~done.unsqueeze(-1))


def episode_starts(dones: torch.Tensor) -> torch.Tensor:
    """Where an episode starts in a [T, N] rollout of `dones`: the step after each done, where the update's replay
    zeroes the state as the rollout did (never step 0: the rollout's copy of the state was zeroed already)."""
    return torch.cat([torch.zeros_like(dones[:1]), dones[:-1]])


def recurrent_ppo_state(agent, optimizer, envs, lr, reward_normalizer) -> tuple[TrainingState, torch.Tensor, ...]:
    """(what a recurrent PPO's checkpoints hold besides the run's counters, each env's running return and length
    [2, N] (float64), the live hidden states, the hidden states at the start of the rollout: hidden_states). The
    checkpoints (common.checkpoint.TrainingState, restored in place) hold the agent and its Adam; the learning rate and
    the reward normalizer, the same on every rank; each rank's own envs' running returns and lengths, partial
    discounted returns (the reward normalizer's) and live hidden states, so that a resume is exact."""
    num_envs, device = envs.num_envs, lr.device  # this rank's envs, on the learning rate's device
    ep_stats = torch.zeros(2, num_envs, device=device, dtype=torch.float64)
    rnn_state, initial_state = hidden_states(agent.state_shape, num_envs, device)
    state = TrainingState(
        agent,
        {"adam": optimizer},
        envs,
        replicated={"learning_rate": lr, "reward_normalizer": reward_normalizer},
        per_rank={"ep_stats": ep_stats, "reward_returns": reward_normalizer.returns, "rnn_state": rnn_state},
    )
    return state, ep_stats, rnn_state, initial_state


def batch_said(args, global_batch: int, envs_per_minibatch: int) -> str:
    """The batch of an iteration as the start line says it: over all ranks, then as minibatches of envs per process."""
    return (
        f"batch {global_batch} per iteration ({args.num_minibatches} minibatches of {envs_per_minibatch} envs x "
        f"{args.num_steps} steps per process)"
    )


def cell_said(args) -> str:
    """The cell as the start line says it: its kind, layers x hidden units ("lstm 1x64")."""
    return f"{args.cell} {args.rnn_layers}x{args.rnn_hidden_size}"


def begin_recurrent(run, global_batch: int, envs_per_minibatch: int) -> None:
    """common.run.begin_training with a recurrent run's start line: the batch as minibatches of envs (batch_said),
    then the cell (cell_said)."""
    begin_training(
        run, f"{batch_said(run.args, global_batch, envs_per_minibatch)}; {cell_said(run.args)}", global_batch
    )


def allow_rnn():
    """A context in which dynamo traces a function that reads an nn.LSTM/nn.GRU: without allow_rnn it stops at the
    module (a graph break) even where only its weights are read (rnn_step)."""
    return torch._dynamo.config.patch(allow_rnn=True)


class EvalPolicy(nn.Module):
    """A recurrent policy as common/evaluation.py evaluates it: `deterministic(obs)` reads and writes, in place, one
    hidden state per eval env; `reset_state(done)` zeroes those whose episode ended (after every step). `policy` has
    `recurrent_step(obs, state) -> (action, next state)`, which is exported, and `state_shape`; it is held under
    `name`, by which the exported programs name its weights (model.<name>.rnn.weight_ih_l0, ...)."""

    def __init__(self, policy: nn.Module, num_envs: int, name: str = "policy"):
        super().__init__()
        self.name, self.state_shape = name, policy.state_shape
        self.add_module(name, policy)
        device = next(policy.parameters()).device
        state = torch.zeros(self.state_shape[0], num_envs, self.state_shape[1], device=device)
        self.register_buffer("state", state, persistent=False)

    @property
    def recurrent_step(self):
        return getattr(self, self.name).recurrent_step

    def deterministic(self, policy_obs: torch.Tensor) -> torch.Tensor:
        action, state = self.recurrent_step(policy_obs, self.state)
        self.state.copy_(state)
        return action

    def reset_state(self, done: torch.Tensor) -> None:
        self.state.mul_(~done.unsqueeze(-1))
