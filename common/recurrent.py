"""The recurrent cell's plumbing that ppo_lstm.py and distill.py share. The hidden state of a batch of envs is one
tensor [k * rnn_layers, batch, rnn_hidden_size] (k = 2 for an LSTM: the h rows, then the c rows; the layout of
common.nets.rnn_step), the batch at dim 1, as the exported policy takes it."""

from __future__ import annotations

import torch
import torch.nn as nn


def recurrent_cell(cell: str, input_size: int, hidden_size: int, layers: int) -> nn.LSTM | nn.GRU:
    """An nn.LSTM (`cell` "lstm") or nn.GRU of `layers` layers with orthogonal weights and zero biases (CleanRL). The
    scripts step it with common.nets.rnn_step, never through the module's fused kernels."""
    rnn = (nn.LSTM if cell == "lstm" else nn.GRU)(input_size, hidden_size, num_layers=layers)
    for name, p in rnn.named_parameters():
        nn.init.orthogonal_(p) if "weight" in name else nn.init.zeros_(p)
    return rnn


def state_shape_of(rnn: nn.LSTM | nn.GRU | None) -> tuple[int, int]:
    """(rows, hidden) of one env's hidden state (the layout above); without a cell (None) no rows, of size 1."""
    if rnn is None:
        return 0, 1
    return (2 if isinstance(rnn, nn.LSTM) else 1) * rnn.num_layers, rnn.hidden_size


def allow_rnn():
    """A context in which dynamo traces a function that reads an nn.LSTM/nn.GRU: without allow_rnn it stops at the
    module (a graph break) even where only its weights are read (rnn_step)."""
    return torch._dynamo.config.patch(allow_rnn=True)


class EvalPolicy(nn.Module):
    """A recurrent policy as common/evaluation.py evaluates it: `deterministic(obs)` reads and writes one hidden state
    per eval env in place; `reset_state(done)` zeroes those whose episode ended. `policy` is held under `name`, by
    which the exported programs name its weights (model.<name>.rnn.weight_ih_l0, ...)."""

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
