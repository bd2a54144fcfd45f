"""Running normalizers for observations and rewards, exact under torchrun.

Both keep their statistics in float64 buffers, so they are saved with `state_dict()` and
merged without the precision loss that float32 sums show after ~1e8 samples. When a process
group is up, every `update()` merges the moments of all ranks, so every rank normalizes with
the same statistics and a checkpoint written by rank 0 holds the global moments.
"""

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
    """Exact moments of the union of every rank's batch.

    Two sums: first the global count and mean, then each rank's M2 re-centred on the global
    mean (M2_r + n_r * (mean_r - mean)^2). That is the parallel-axis form of Chan et al.'s
    merge; centring on the global mean before summing keeps it as stable as the pairwise merge.
    """
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
    """Running mean and variance of a stream of batches (Chan et al.'s parallel merge).

    `update(x)` folds a batch in (all leading dims are batch dims, the trailing `shape` are
    features); `normalize(x)` returns (x - mean) / max(std, min_std), clipped to [-clip, clip],
    in x's dtype. The two are separate so a script decides which data feeds the statistics
    (rollout data only, never evaluation data).

    `min_std` (1e-2, rsl_rl's constant): a feature that is (nearly) constant in the first data
    (a velocity at rest, a flag that has not fired yet) would otherwise be scaled by up to 1e4
    (with the usual 1e-8 in the square root) and sit at +-clip long after it starts to move;
    with the floor its gain stays at most 100, and every feature whose std exceeds 1e-2 is
    standardized exactly as before.
    """

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

    # Kept out of torch.compile (a graph break in a compiled caller; captured in CUDA graphs all the
    # same): inductor drops in-place writes to 0-d float64 tensors such as `count` (torch 2.13 on
    # CPU: `c.add_(1)` leaves c at 0), so a compiled update would never count a sample.
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
    """Scales rewards by the running std of the discounted return (as gymnasium's NormalizeReward).

    Per env, the return G_t = gamma * G_{t-1} + r_t restarts after every episode end. The script
    feeds a whole rollout at once: `update(rewards, dones)` with [T, N] tensors walks the T steps
    (cheap vector ops, no host sync), then merges the T*N returns into the moments (one
    collective per iteration under torchrun, not one per step); `normalize(rewards)` divides by
    max(std, min_std) and clips. The mean is not subtracted: that would change the optimal policy.
    """

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
    """Stands where a RunningMeanStd would, for a group that is not normalized: an image group (uint8
    frames, which the network scales to [0, 1] itself; per-pixel running moments would cost a float64
    copy of every frame and turn the batch the update reads into float32, 4x the bytes), or
    --no-obs-norm. Passes observations through unchanged (an image stays uint8) and learns nothing."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def update(self, x: torch.Tensor) -> None:
        pass


class TermsNormalizer(nn.Module):
    """The normalizer of a term group (a TensorDict of terms): each vector term [D] with a RunningMeanStd of its
    own, each image term passed through (uint8). `update(terms)` folds the rollout's terms in (a collective per
    vector term under torchrun); the statistics are in state_dict() under terms.<name>."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], clip: float | None):
        super().__init__()
        self.terms = nn.ModuleDict({k: observation_normalizer(shapes[k], True, clip) for k in sorted(shapes)})

    def forward(self, terms) -> dict[str, torch.Tensor]:
        return {k: norm(terms[k]) for k, norm in self.terms.items()}

    def update(self, terms) -> None:
        for k, norm in self.terms.items():
            norm.update(terms[k])


def observation_normalizer(shape, enabled: bool, clip: float | None) -> nn.Module:
    """The normalizer of one observation group of one env's `shape`: a RunningMeanStd for a vector group
    [D] (or an int D) when `enabled`, a TermsNormalizer for a term group (a dict term -> shape) when
    `enabled`; for an image group [C, H, W], an absent group (None) or when not enabled, Unnormalized."""
    shape = (shape,) if isinstance(shape, int) else shape
    if enabled and isinstance(shape, dict):
        return TermsNormalizer(shape, clip)
    return RunningMeanStd(shape, clip=clip) if enabled and shape is not None and len(shape) == 1 else Unnormalized()


def normalize_groups(net: nn.Module, obs):
    """`obs` (a TensorDict of groups) as the network reads it: "policy" through net.obs_rms and, when the critic reads a
    group of its own (net.critic_key == "critic"), "critic" through net.critic_obs_rms. The actor-critics bind it as
    their `normalize` method."""
    out = {"policy": net.obs_rms(obs["policy"])}
    if net.critic_key == "critic":
        out["critic"] = net.critic_obs_rms(obs["critic"])
    return TensorDict(out, batch_size=obs.batch_size)


def update_group_statistics(net: nn.Module, obs) -> None:
    """Fold a rollout's observations (never eval data) into the running statistics normalize_groups reads: the next
    rollout's. An Unnormalized group (an image, or any with --no-obs-norm) learns nothing."""
    net.obs_rms.update(obs["policy"])
    if net.critic_key == "critic":
        net.critic_obs_rms.update(obs["critic"])
