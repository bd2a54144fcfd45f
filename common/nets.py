"""Network pieces the scripts share: MLPs, an ensemble layer, observation encoders, action bounds, the acting twin."""

from __future__ import annotations

import math

from typing import Callable

import gymnasium as gym
import torch
import torch.nn as nn
from tensordict import TensorDictBase, from_module

from common import distributed


ACTIVATIONS = {"tanh": nn.Tanh, "elu": nn.ELU, "relu": nn.ReLU, "silu": nn.SiLU}


def layer_init(layer: nn.Linear, gain: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights with `gain`, constant biases (CleanRL's PPO initialisation)."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(
    in_dim: int,
    out_dim: int,
    hidden: tuple[int, ...],
    activation: str = "relu",
    linear=nn.Linear,
    out_gain: float | None = None,
    norm=None,
) -> nn.Sequential:
    """An MLP of `linear(in, out)` layers; with `out_gain`, `layer_init` on each (the last with `out_gain`); with
    `norm`, `norm(width)` after each hidden layer, before its activation (brax's `layer_norm`)."""
    layers, last = [], in_dim
    for h in hidden:
        layer = linear(last, h)
        layers += [layer_init(layer) if out_gain is not None else layer, *([norm(h)] if norm else [])]
        layers.append(ACTIVATIONS[activation]())
        last = h
    layer = linear(last, out_dim)
    layers.append(layer_init(layer, gain=out_gain) if out_gain is not None else layer)
    return nn.Sequential(*layers)


class EnsembleLinear(nn.Module):
    """`num` independent linear layers as one batched matmul: [B, in] or [E, B, in] -> [E, B, out]. Not torch.vmap:
    plain stacked Parameters need no functional_call plumbing in the optimizer, state_dict, all_reduce_gradients, the
    target lerp_ or CUDA graphs. Members start from nn.Linear's initialisation."""

    def __init__(self, num: int, in_dim: int, out_dim: int):
        super().__init__()
        members = [nn.Linear(in_dim, out_dim) for _ in range(num)]
        self.weight = nn.Parameter(torch.stack([m.weight.detach().T for m in members]))  # [E, in, out]
        self.bias = nn.Parameter(torch.stack([m.bias.detach() for m in members]).unsqueeze(1))  # [E, 1, out]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.matmul(x, self.weight)  # broadcasts [B, in] over the members
        return out + self.bias.to(out.dtype)  # keeps bfloat16 under autocast


class EnsembleLayerNorm(nn.Module):
    """LayerNorm over the last dim of [E, B, dim] with each member's own scale and shift ([E, 1, dim], starting at 1
    and 0, as nn.LayerNorm's): what `num` nn.LayerNorms, one per member of an EnsembleLinear stack, compute."""

    def __init__(self, num: int, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num, 1, dim))
        self.bias = nn.Parameter(torch.zeros(num, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = nn.functional.layer_norm(x, x.shape[-1:], eps=self.eps)
        return out * self.weight.to(out.dtype) + self.bias.to(out.dtype)


# ----------------------------------------------------------------------------------------------
# Encoders of image observation groups: uint8 [..., C, H, W] -> float features [..., out_dim]
# ----------------------------------------------------------------------------------------------
class ChannelLayerNorm(nn.LayerNorm):
    """LayerNorm over the channels of each pixel of [B, C, H, W] maps, as PQN's networks (Gallici et al. 2024)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)  # explicit perms: ONNX refuses negative ones


def _conv_stack(convs: list[tuple], layer_norm: bool) -> nn.Sequential:
    """conv -> (ChannelLayerNorm) -> ReLU per (in, out, kernel, stride), each made and initialised in turn (a seed's
    weights are those of the stack without LayerNorms)."""
    layers = []
    for in_channels, out_channels, kernel, stride in convs:
        layers += [
            layer_init(nn.Conv2d(in_channels, out_channels, kernel, stride=stride)),
            *([ChannelLayerNorm(out_channels)] if layer_norm else []),
            nn.ReLU(),
        ]
    return nn.Sequential(*layers)


def nature_convs(channels: int, layer_norm: bool = False) -> nn.Sequential:
    """The Atari DQN's three conv layers (Mnih et al. 2015); needs frames of 36x36 or more."""
    return _conv_stack([(channels, 32, 8, 4), (32, 64, 4, 2), (64, 64, 3, 1)], layer_norm)


class ResidualBlock(nn.Module):
    """x + conv(relu(conv(relu(x)))), 3x3 convs that keep the shape (IMPALA's block)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = layer_init(nn.Conv2d(channels, channels, 3, padding=1))
        self.conv1 = layer_init(nn.Conv2d(channels, channels, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


def impala_convs(channels: int, layer_norm: bool = False, depths: tuple[int, ...] = (16, 32, 32)) -> nn.Sequential:
    """IMPALA's ResNet (Espeholt et al. 2018); `layer_norm` leaves it as published (only the Linear after it)."""
    layers = []
    for depth in depths:
        layers += [
            layer_init(nn.Conv2d(channels, depth, 3, padding=1)),
            nn.MaxPool2d(3, stride=2, padding=1),
            ResidualBlock(depth),
            ResidualBlock(depth),
        ]
        channels = depth
    return nn.Sequential(*layers, nn.ReLU())


def minatar_convs(channels: int, layer_norm: bool = False) -> nn.Sequential:
    """MinAtar's network (Young & Tian 2019); with `layer_norm`, PQN's (purejaxql)."""
    return _conv_stack([(channels, 16, 3, 1)], layer_norm)


# encoder name -> (its conv layers, the width of the Linear after them; 0: flattened frames, no Linear)
ENCODERS = {
    "nature": (nature_convs, 512),
    "impala": (impala_convs, 256),
    "minatar": (minatar_convs, 128),
    "mlp": (lambda channels, layer_norm=False: nn.Identity(), 0),
}


class ImageEncoder(nn.Module):
    """An image group's features: uint8 frames [..., C, H, W] scaled to [0, 1] here (the observation normalizer
    leaves image groups alone), through `kind`'s convs, then Linear (+ LayerNorm) and ReLU. Leading dims are batch."""

    def __init__(self, kind: str, shape: tuple[int, int, int], max_value: float = 255.0, layer_norm: bool = False):
        super().__init__()
        make_convs, width = ENCODERS[kind]
        self.shape, self.scale = tuple(shape), 1.0 / max_value
        self.convs = make_convs(shape[0], layer_norm)
        try:
            with torch.no_grad():
                flat = self.convs(torch.zeros(1, *shape)).numel()
        except RuntimeError:  # a kernel larger than the frame
            raise SystemExit(
                f"error: --encoder {kind} cannot take {shape[1]}x{shape[2]} frames (too small for its "
                f"kernels); use --encoder minatar or impala"
            ) from None
        norm = [nn.LayerNorm(width)] if layer_norm else []
        self.head = nn.Sequential(layer_init(nn.Linear(flat, width)), *norm, nn.ReLU()) if width else nn.Identity()
        self.out_dim = width or flat

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        lead = frames.shape[:-3]
        x = self.convs(frames.reshape(-1, *self.shape).float() * self.scale)
        return self.head(x.flatten(1)).reshape(*lead, -1)


class TermsEncoder(nn.Module):
    """A term group's features: image terms through ImageEncoders, vector terms as they are, in sorted key order."""

    def __init__(
        self, shapes: dict[str, tuple[int, ...]], kind: str, max_value: float = 255.0, layer_norm: bool = False
    ):
        super().__init__()
        self.names = sorted(shapes)
        self.encoders = nn.ModuleDict(
            {k: ImageEncoder(kind, shapes[k], max_value, layer_norm) for k in self.names if len(shapes[k]) == 3}
        )
        self.out_dim = sum(self.encoders[k].out_dim if k in self.encoders else shapes[k][0] for k in self.names)

    def forward(self, terms) -> torch.Tensor:
        return torch.cat([self.encoders[k](terms[k]) if k in self.encoders else terms[k] for k in self.names], dim=-1)


def group_encoder(shape, kind: str, max_value: float = 255.0, layer_norm: bool = False) -> nn.Module | None:
    """What reads one group before the MLP (or cell): an Image- or TermsEncoder; None for a vector or absent group."""
    if isinstance(shape, dict):
        return TermsEncoder(shape, kind, max_value, layer_norm)
    return ImageEncoder(kind, shape, max_value, layer_norm) if shape is not None and len(shape) == 3 else None


def pixel_high(space) -> float:
    """The highest pixel value of one group's images, which its encoder divides by (255 for an absent group). Per
    group: a vector group's high (often inf) says nothing of another group's frames."""
    if space is None:
        return 255.0
    if hasattr(space, "spaces"):
        return max(
            (pixel_high(s) for s in space.spaces.values() if str(s.dtype) == "uint8" and len(s.shape) == 3),
            default=255.0,
        )
    return float(space.high.max())


def _term_shape(x, name: str) -> tuple[int, ...]:
    if x.ndim == 4 and x.dtype != torch.uint8:
        raise SystemExit(
            f"error: observation {name} is an image [N, C, H, W] of {x.dtype}; image groups "
            "must be uint8 (channel-first), as the env contract says"
        )
    if x.ndim not in (2, 4):
        raise SystemExit(
            f"error: observation {name} has shape {list(x.shape)}: expected vectors [N, D] or uint8 images [N, C, H, W]"
        )
    return tuple(x.shape[1:])


def observation_shape(obs, group: str, terms_refused_by: str | None = None):
    """The shape of one env's observations of `group` (term -> shape for a term group), or a clear error."""
    x = obs[group]
    if isinstance(x, TensorDictBase) and terms_refused_by:
        raise SystemExit(f"error: {terms_refused_by} on a group of terms ({group!r}) is not supported yet")
    if isinstance(x, TensorDictBase):
        nested = [term for term in x.keys() if isinstance(x[term], TensorDictBase)]
        if nested:
            raise SystemExit(
                f"error: observation group {group!r} has terms that are groups of terms ({nested[0]!r}): "
                "a term is vectors [N, D] or uint8 images [N, C, H, W]"
            )
        return {term: _term_shape(x[term], f"term {group}.{term}") for term in sorted(x.keys())}
    return _term_shape(x, f"group {group!r}")


def chosen_group_shape(obs, group: str, flag: str, env_id: str):
    """observation_shape of the group a flag chooses (`flag group`), or a one-line error naming the env's groups."""
    if group not in obs.keys():
        raise SystemExit(f"error: {flag} {group}: {env_id} has only {', '.join(obs.keys())}")
    return observation_shape(obs, group)


def vector_size(obs, group: str, script: str) -> int:
    """D of a vector group [N, D]; any other group stops with a clear error naming `script`."""
    shape = observation_shape(obs, group)
    if isinstance(shape, dict) or len(shape) != 1:
        kind = "a group of terms" if isinstance(shape, dict) else f"an image group {list(shape)}"
        raise SystemExit(
            f"error: {script} takes vector observations [N, D] only, and {group!r} is {kind}; "
            "image observations and groups of terms: algos/ppo.py, algos/ppo_lstm.py or algos/pqn.py (--encoder)"
        )
    return shape[0]


def group_mlp(
    shape,
    out_dim: int,
    hidden: tuple[int, ...],
    activation: str,
    encoder: str,
    max_value: float = 255.0,
    out_gain: float | None = None,
) -> nn.Module:
    """`mlp` on one observation group, behind its encoder (group_encoder) if it has one: nn.Sequential(encoder, mlp)."""
    shape = (shape,) if isinstance(shape, int) else shape
    encoder = group_encoder(shape, encoder, max_value)
    if encoder is None:
        return mlp(shape[0], out_dim, hidden, activation, out_gain=out_gain)
    return nn.Sequential(encoder, mlp(encoder.out_dim, out_dim, hidden, activation, out_gain=out_gain))


def share_encoder(actor: nn.Module, critic: nn.Module, critic_obs_shape) -> None:
    """--shared-encoder: the critic's head on the actor's encoder, in place; an error where there is none to share."""
    if critic_obs_shape is not None or not isinstance(actor[-1], nn.Sequential):
        raise SystemExit("error: --shared-encoder needs an image (or terms) policy group that the critic reads too")
    critic[0] = actor[0]


def action_size(action_space: gym.Space) -> int:
    """The width of a policy's output: a Discrete space's n, a Box's dimension."""
    return int(action_space.n) if isinstance(action_space, gym.spaces.Discrete) else int(action_space.shape[0])


def register_action_bounds(agent: nn.Module, action_space: gym.Space) -> None:
    """`agent.action_low` / `action_high`: a bounded Box's bounds (empty otherwise), as non-persistent buffers (not
    in checkpoints). Samples are clipped to them on the way to the env; the rollout stores them raw."""
    bounded = isinstance(action_space, gym.spaces.Box) and action_space.is_bounded()
    for end in ("low", "high"):
        bound = torch.as_tensor(getattr(action_space, end)) if bounded else torch.zeros(0)
        agent.register_buffer(f"action_{end}", bound, persistent=False)


def clip_to_bounds(agent: nn.Module, action: torch.Tensor) -> torch.Tensor:
    """`action` clipped to the agent's bounds (register_action_bounds), unchanged where they are empty."""
    low, high = agent.action_low, agent.action_high
    if low.numel() == 0:
        return action
    return torch.maximum(torch.minimum(action, high), low)


def agent_and_twin(make: Callable[[], nn.Module], device: torch.device) -> tuple[nn.Module, nn.Module]:
    """`make()` with rank 0's weights on every rank, and a grad-free acting twin sharing its storage (no copies)."""
    agent = make().to(device)
    distributed.broadcast_module(agent)
    twin = make().to(device)
    from_module(agent).data.to_module(twin)
    return agent, twin


def rnn_step(rnn: nn.LSTM | nn.GRU, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One time step of an nn.LSTM or nn.GRU, all its layers, on the module's own weights: x [B, in], state
    [k * layers, B, H] (k = 2 for an LSTM: h rows, then c rows) -> (last layer's output [B, H], next state).
    Matmuls and pointwise ops, not the fused RNN ops: those dispatch to a different kernel per device, so a graph
    that compiles on a CPU can fail on a GPU. nn.RNN, proj_size, bidirectional and dropout stop with one line."""
    refused = _rnn_step_refuses(rnn)
    if refused:
        raise SystemExit(f"error: common.nets.rnn_step steps a unidirectional nn.LSTM or nn.GRU, not {refused}")
    layers, lstm, linear = rnn.num_layers, isinstance(rnn, nn.LSTM), nn.functional.linear
    hs, cs = [], []
    for i in range(layers):
        h = state[i]
        w_ih, w_hh, b_ih, b_hh = (
            getattr(rnn, f"{w}_l{i}", None) for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        )
        hidden = h.shape[-1]
        if lstm:  # one sigmoid over all the gates, contiguous (faster in eager than three over strided chunks)
            gates = linear(x, w_ih, b_ih) + linear(h, w_hh, b_hh)
            in_gate, forget, _, out_gate = torch.sigmoid(gates).chunk(4, -1)
            c = forget * state[layers + i] + in_gate * torch.tanh(gates[..., 2 * hidden : 3 * hidden])
            x = out_gate * torch.tanh(c)
            cs.append(c)
        else:
            gates_x, gates_h = linear(x, w_ih, b_ih), linear(h, w_hh, b_hh)
            reset, update = torch.sigmoid(gates_x[..., : 2 * hidden] + gates_h[..., : 2 * hidden]).chunk(2, -1)
            n = torch.tanh(gates_x[..., 2 * hidden :] + reset * gates_h[..., 2 * hidden :])
            x = (1 - update) * n + update * h
        hs.append(x)
    return x, torch.stack(hs + cs)


def _rnn_step_refuses(rnn) -> str | None:
    """What of `rnn` rnn_step would get wrong (a cryptic shape error, or weights silently left out), or None."""
    if type(rnn) not in (nn.LSTM, nn.GRU):
        return f"a {type(rnn).__name__}"
    if getattr(rnn, "proj_size", 0):
        return f"an LSTM with proj_size={rnn.proj_size} (its h is projected: build it without proj_size)"
    if rnn.bidirectional:
        return f"a bidirectional {type(rnn).__name__} (its reverse direction needs the whole sequence)"
    if rnn.dropout and rnn.num_layers > 1:
        return f"a {type(rnn).__name__} with dropout={rnn.dropout} between its layers (apply dropout in the script)"
    return None


def sample(d: torch.distributions.Categorical | torch.distributions.Normal) -> torch.Tensor:
    """`d.sample()` without a host read, so it captures in a CUDA graph. Normal: torch.normal checks std >= 0 with an
    `.item()`; rsample draws the same numbers without it (a non-finite std reaches the NaN guard instead)."""
    with torch.no_grad():
        return d.rsample() if isinstance(d, torch.distributions.Normal) else d.sample()


def group_shapes(envs, obs, args, terms_refused_by: str | None = None) -> tuple:
    """(policy shape, critic shape or None, each group's pixel high); the critic's group with --asymmetric-critic."""
    critic = args.asymmetric_critic and "critic" in obs.keys()
    spaces = (envs.single_observation_space, getattr(envs, "single_critic_observation_space", None))
    return (
        observation_shape(obs, "policy", terms_refused_by),
        observation_shape(obs, "critic") if critic else None,
        tuple(pixel_high(space) for space in spaces),
    )
