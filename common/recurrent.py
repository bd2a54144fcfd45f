"""What ppo_lstm.py and distill.py share around their algorithm: the recurrent cell's plumbing and the rollout's
bookkeeping (the cell's step, the replay of the update, the losses and the loop stay in the scripts):

    rnn = recurrent_cell(args.cell, in_dim, args.rnn_hidden_size, args.rnn_layers)  # orthogonal weights, zero biases
    state_shape = state_shape_of(rnn)          # (rows, hidden) of one env's hidden state
    envs_per_minibatch = env_minibatches(args)  # or a one-line error where --num-minibatches does not divide --num-envs
    carry_over(rnn_state, next_state, done)    # the live state moves on, zeroed for the episodes that ended
    transition = with_game_score(transition, info)  # Atari: the game's reward and end beside a life's
    rollout_episodes(data, dones, ep_stats, episodes)  # the finished episodes' sums, the game's score where reported
    starts = episode_starts(dones)             # where the update's replay zeroes the state, as the rollout did
    add_update_means(stats, loss_sums, num_updates)  # an update's mean losses and their NaN guard
    eval_policy = EvalPolicy(policy, num_eval_envs)  # one hidden state per eval env (common/evaluation.py)
    begin_training(run, f"...; {batch_said(args, global_batch, envs_per_minibatch)}; {cell_said(args)}", ...)
    with closing(start_run(...)) as run, allow_rnn(): ...

and the wiring of ppo_lstm.py's train around its algorithm (the iteration's functions and the loop's algorithm lines
stay in the script):

    envs_per_minibatch, global_batch, total_steps = recurrent_sizes(run)  # or the one-line error of env_minibatches
    envs, eval_envs, next_obs, (obs_shape, critic_shape, pixel_highs) = recurrent_envs(run)  # reset, group_shapes
    (encoder, width), (critic_encoder, critic_width) = group_encoders(shapes, args.encoder, pixel_highs)
    state, ep_stats, rnn_state, initial_state = recurrent_ppo_state(agent, optimizer, envs, lr, reward_normalizer)
    with torch.no_grad(), acting_autocast(device, args.bf16): ...  # bf16 without a cache of cast weights
    nonfinite_counts = rollout_checks(data, dones, ep_stats, episodes)  # rollout_episodes, the NaN guard's counts
    policy_step, ..., update_fn = compiled_and_captured(run, envs, policy_step, ..., update_fn)  # by the env
    begin_recurrent(run, global_batch, envs_per_minibatch)  # begin_training with batch_said and cell_said
    say_storage(run, storage)                  # the storage's line, after the first rollout
    if end_iteration(run, stats, local, eval_envs, eval_policy, state, next_obs): break  # log, evaluate, save

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
from tensordict import TensorDict

from common.capture import captured, compiled
from common.checkpoint import TrainingState
from common.loop import evaluate_and_save, log_iteration
from common.nets import group_encoder, group_shapes
from common.run import begin_training, make_envs, what_is_due
from common.stats import add_to, episode_sums, nonfinite


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
    agent lacks by nn.Identity, of width 0."""
    out = []
    for shape, high in zip(shapes, pixel_highs):
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


def with_game_score(transition: dict, info: dict) -> dict:
    """Atari: a life is the learner's episode, the game's score is what is logged. Where the env's info has the game's
    reward and end (Atari's presets), the transition keeps them beside the learner's reward and done."""
    if "game_over" in info:
        transition.update(game_rewards=info["game_reward"].float(), game_over=info["game_over"])
    return transition


def rollout_episodes(data: TensorDict, dones: torch.Tensor, ep_stats: torch.Tensor, episodes: torch.Tensor) -> None:
    """The sums of the episodes that ended in a [T, N] rollout into `episodes` (common.stats.episode_sums, the running
    return and length of each env in `ep_stats`): the game's score where the env reports one apart from the learner's
    rewards (with_game_score), the learner's own returns otherwise."""
    episode_sums(ep_stats, data.get("game_rewards", data["rewards"]), data.get("game_over", dones), sums=episodes)


def rollout_checks(data: TensorDict, dones: torch.Tensor, ep_stats: torch.Tensor, episodes: torch.Tensor) -> dict:
    """What the log takes from a [T, N] rollout before its targets: the sums of the episodes that ended into `episodes`
    (rollout_episodes: the game's score where the env reports one), and the NaN guard's non-finite counts of its policy
    observations and rewards, by name."""
    rollout_episodes(data, dones, ep_stats, episodes)
    return {"observations": nonfinite(data["obs", "policy"]), "rewards": nonfinite(data["rewards"])}


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


def add_update_means(stats: dict, loss_sums: dict, num_updates: int) -> None:
    """The mean over an update's `num_updates` minibatches of each loss summed in `loss_sums`, by name, into
    stats["losses"], and how many of them are non-finite into stats["nonfinite"] (the NaN guard's "losses")."""
    means = {name: total / num_updates for name, total in loss_sums.items()}
    add_to(stats["losses"], means)
    add_to(stats["nonfinite"], {"losses": (~torch.isfinite(torch.stack(list(means.values())))).sum()})


def say_storage(run, storage) -> None:
    """The rollout storage's line (its bytes per transition, each field's dtype and shape), once: after this process's
    first rollout, which has laid the storage out (images: uint8)."""
    if run.iteration == run.iteration_at_start + 1:
        run.say(storage.describe())


def end_iteration(run, stats: dict, local: dict, eval_envs, eval_policy, state, next_obs) -> bool:
    """The end of an iteration (after run.global_step counted it), the same decisions on every rank
    (common.run.what_is_due; the final iteration is the one at run.final_step): the log every --log-interval
    iterations and before an evaluation or a save (one host read; common.loop.log_iteration of the iterations in
    `stats` since the last log, the steps since it over the steps of one, with `local`, rank 0's, e.g. the learning
    rate), then the evaluation and the checkpoints that are due (common.loop.evaluate_and_save). True when the run
    stops here. A collective."""
    due = what_is_due(run, run.global_step >= run.final_step)
    if due.log:
        iterations = (run.global_step - run.reduced_step) // run.steps_per_iteration  # reduced_step: the last log's
        log_iteration(run, stats, iterations, local=local)
    return evaluate_and_save(run, due, eval_envs, eval_policy, state, next_obs)


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


def compiled_and_captured(
    run, envs, policy_step, end_step, env_step, update_minibatch, targets_fn, rollout_fn, update_fn
):
    """A recurrent script's iteration functions compiled and captured (--compile / --cudagraphs: common.capture), in
    the order given, each the function to call in its place (the script rebinds its names to them, so the functions
    that call the others by name call these). A built-in env steps inside the graph: the env step is compiled and the
    whole rollout is one graph. An adapter's simulator cannot be captured: its step runs eagerly between the captured
    acting step and end of step, and the rollout is left out of the graphs. The minibatch update and the targets are
    compiled; the targets and every epoch of the update are one graph, the batch never leaving it."""
    if whole_rollout := getattr(envs, "capturable", False):
        env_step = compiled(run, env_step)
    else:
        policy_step = captured(run, "acting", compiled(run, policy_step))
        end_step = captured(run, "end of step", compiled(run, end_step))
    update_minibatch, targets_fn = compiled(run, update_minibatch), compiled(run, targets_fn)
    rollout_fn = captured(run, "rollout", rollout_fn, capture=whole_rollout)
    update_fn = captured(run, "update", update_fn)
    return policy_step, end_step, env_step, update_minibatch, targets_fn, rollout_fn, update_fn


def acting_autocast(device: torch.device, bf16: bool) -> torch.autocast:
    """An acting step's autocast: bfloat16 with --bf16, and no cache of the weights it casts (a captured step must
    cast them itself at every replay)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16, cache_enabled=False)


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
