"""Running normalizers for observations and rewards, exact under torchrun: float64 statistics (float32 sums lose
precision after ~1e8 samples), and every `update()` merges all ranks' moments (a collective), so ranks agree."""

from __future__ import annotations

import torch
import torch.distributed as dist
from tensordict import TensorDict
from torch import nn

from common import distributed


def _batch_moments(x: torch.Tensor, feature_ndim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """count, mean and M2 (sum of squared deviations) of `x` over its leading batch dims, in float64."""
    x = x.reshape(-1, *x.shape[x.ndim - feature_ndim :]).to(torch.float64)
    count = torch.full((), float(x.shape[0]), dtype=torch.float64, device=x.device)  # a fill, not a host copy
    mean = x.mean(dim=0)
    m2 = ((x - mean) ** 2).sum(dim=0)
    return count, mean, m2


def _all_reduce_moments(count, mean, m2):
    """Exact moments of the union of every rank's batch (each M2 re-centred on the global mean before summing)."""
    if not distributed.is_distributed():
        return count, mean, m2
    packed = torch.cat([count.reshape(1), mean.reshape(-1) * count])
    dist.all_reduce(packed)
    total = packed[0]
    global_mean = (packed[1:] / total).reshape(mean.shape)
    m2 = m2 + count * (mean - global_mean) ** 2
    dist.all_reduce(m2)
    return total, global_mean, m2


class RunningMeanStd(nn.Module):
    """Running mean and variance of a stream of batches; `normalize(x)` is (x - mean) / max(std, min_std), clipped.
    `min_std` (rsl_rl's 1e-2): a feature (nearly) constant in the first data would otherwise get a gain up to 1e4
    and sit at +-clip long after it starts to move."""

    def __init__(self, shape: tuple[int, ...] | int = (), min_std: float = 1e-2, clip: float | None = 5.0):
        super().__init__()
        self.shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.min_std = min_std
        self.clip = clip
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(self.shape, dtype=torch.float64))
        self.register_buffer("m2", torch.zeros(self.shape, dtype=torch.float64))
        # float32 copies for the per-step normalize(): no float64 math in the rollout loop.
        self.register_buffer("_mean32", torch.zeros(self.shape), persistent=False)
        self.register_buffer("_inv_std32", torch.ones(self.shape), persistent=False)

    @property
    def var(self) -> torch.Tensor:
        return self.m2 / self.count.clamp(min=1.0)

    @property
    def std(self) -> torch.Tensor:
        return torch.sqrt(self.var).clamp(min=self.min_std)

    # Kept out of torch.compile (captured all the same): inductor drops in-place writes to 0-d float64 tensors such
    # as `count` (torch 2.13 on CPU), so a compiled update would never count a sample.
    @torch.compiler.disable
    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Fold a batch into the moments; under torchrun, the batches of all ranks together."""
        count, mean, m2 = _all_reduce_moments(*_batch_moments(x, len(self.shape)))
        total = self.count + count
        delta = mean - self.mean
        self.mean.add_(delta * (count / total))
        self.m2.add_(m2 + delta**2 * (self.count * count / total))
        self.count.copy_(total)
        self._refresh()

    def _refresh(self) -> None:
        self._mean32.copy_(self.mean)
        # Before any data the scale stays 1 (not 1/min_std), on a fresh module and after a load.
        self._inv_std32.copy_(torch.where(self.count > 0, 1.0 / self.std, torch.ones_like(self.std)))

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._refresh()

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        out = (x - self._mean32.to(x.dtype)) * self._inv_std32.to(x.dtype)
        if self.clip is not None:
            out = out.clamp(-self.clip, self.clip)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.normalize(x)

    def extra_repr(self) -> str:
        return f"shape={self.shape}, clip={self.clip}"


class RewardNormalizer(nn.Module):
    """Scales rewards by the running std of the discounted return (gymnasium's NormalizeReward), a rollout per
    `update` (one collective per iteration). The mean is not subtracted: that would change the optimal policy."""

    def __init__(self, num_envs: int, gamma: float, min_std: float = 1e-2, clip: float | None = 10.0):
        super().__init__()
        self.gamma = gamma
        self.clip = clip
        self.return_rms = RunningMeanStd((), min_std=min_std, clip=None)
        # Each env's partial return belongs to its rank and its episodes, not to the shared statistics:
        # not in state_dict(), so a resume starts it at zero unless the script restores its rank's own.
        self.register_buffer("returns", torch.zeros(num_envs, dtype=torch.float64), persistent=False)

    @torch.compiler.disable  # see RunningMeanStd.update
    @torch.no_grad()
    def update(self, rewards: torch.Tensor, dones: torch.Tensor) -> None:
        """rewards, dones: [T, N] (or [N] for one step); dones[t] ends the episode after step t."""
        if rewards.ndim == 1:
            rewards, dones = rewards.unsqueeze(0), dones.unsqueeze(0)
        discounted = torch.empty_like(rewards, dtype=torch.float64)
        g = self.returns
        for t in range(rewards.shape[0]):
            g = g * self.gamma + rewards[t].to(torch.float64)
            discounted[t] = g
            g = g * (~dones[t].bool()).to(torch.float64)
        self.returns.copy_(g)
        self.return_rms.update(discounted)

    def normalize(self, rewards: torch.Tensor) -> torch.Tensor:
        out = rewards * self.return_rms._inv_std32.to(rewards.dtype)
        if self.clip is not None:
            out = out.clamp(-self.clip, self.clip)
        return out

    def forward(self, rewards: torch.Tensor) -> torch.Tensor:
        return self.normalize(rewards)


class Unnormalized(nn.Module):
    """Stands where a RunningMeanStd would for a group not normalized: an image group (per-pixel float64 moments
    would cost 4x the bytes; the network scales frames itself) or --no-obs-norm."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def update(self, x: torch.Tensor) -> None:
        pass


class TermsNormalizer(nn.Module):
    """A term group's normalizer: a RunningMeanStd per vector term (a collective each), image terms passed through."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], clip: float | None):
        super().__init__()
        self.terms = nn.ModuleDict({k: observation_normalizer(shapes[k], True, clip) for k in sorted(shapes)})

    def forward(self, terms) -> dict[str, torch.Tensor]:
        return {k: norm(terms[k]) for k, norm in self.terms.items()}

    def update(self, terms) -> None:
        for k, norm in self.terms.items():
            norm.update(terms[k])


def observation_normalizer(shape, enabled: bool, clip: float | None) -> nn.Module:
    """The normalizer of one observation group; Unnormalized for an image or absent group, or when not `enabled`."""
    shape = (shape,) if isinstance(shape, int) else shape
    if enabled and isinstance(shape, dict):
        return TermsNormalizer(shape, clip)
    return RunningMeanStd(shape, clip=clip) if enabled and shape is not None and len(shape) == 1 else Unnormalized()


def normalize_groups(net: nn.Module, obs):
    """`obs` (a TensorDict of groups) as the network reads it, each group through its own statistics."""
    out = {"policy": net.obs_rms(obs["policy"])}
    if net.critic_key == "critic":
        out["critic"] = net.critic_obs_rms(obs["critic"])
    return TensorDict(out, batch_size=obs.batch_size)


def update_group_statistics(net: nn.Module, obs) -> None:
    """Fold a rollout's observations (never eval data) into the statistics normalize_groups reads."""
    net.obs_rms.update(obs["policy"])
    if net.critic_key == "critic":
        net.critic_obs_rms.update(obs["critic"])
