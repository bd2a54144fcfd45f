"""Network pieces the scripts share: an MLP (with PPO's orthogonal initialisation, or the layers' own)
and the ensemble layer of td3.py's and sac.py's critics."""

from __future__ import annotations

import math

import torch
import torch.nn as nn


ACTIVATIONS = {"tanh": nn.Tanh, "elu": nn.ELU, "relu": nn.ReLU, "silu": nn.SiLU}


def layer_init(layer: nn.Linear, gain: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights with `gain`, constant biases (CleanRL's PPO initialisation)."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, out_dim: int, hidden: tuple[int, ...], activation: str = "relu", linear=nn.Linear,
        out_gain: float | None = None) -> nn.Sequential:
    """An MLP with `activation` between its layers; `linear(in, out)` builds each layer (nn.Linear, or an
    ensemble of them). With `out_gain`, every layer gets `layer_init` (gain sqrt(2), the last layer
    `out_gain`: PPO's small policy head); without, the layers keep their own initialisation."""
    layers, last = [], in_dim
    for h in hidden:
        layer = linear(last, h)
        layers += [layer_init(layer) if out_gain is not None else layer, ACTIVATIONS[activation]()]
        last = h
    layer = linear(last, out_dim)
    layers.append(layer_init(layer, gain=out_gain) if out_gain is not None else layer)
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
