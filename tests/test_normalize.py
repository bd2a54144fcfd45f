import numpy as np
import pytest
import torch

from common.normalize import RewardNormalizer, RunningMeanStd


def test_running_mean_std_matches_numpy_over_uneven_batches():
    rng = np.random.default_rng(0)
    rms = RunningMeanStd(shape=(3,), clip=None)
    chunks = []
    for size in [1, 7, 1000, 3, 250, 1, 4096, 17]:
        # large offset and varied scales: a naive sum-of-squares would lose precision here
        x = rng.normal(loc=[1e4, -3.0, 0.5], scale=[1.0, 100.0, 1e-3], size=(size, 3))
        chunks.append(x)
        rms.update(torch.as_tensor(x))
    data = np.concatenate(chunks)
    np.testing.assert_allclose(rms.mean.numpy(), data.mean(0), rtol=1e-12)
    np.testing.assert_allclose(rms.var.numpy(), data.var(0), rtol=1e-9)
    assert rms.count.item() == len(data)


def test_running_mean_std_leading_dims_and_normalize_clip():
    rms = RunningMeanStd(shape=(2,), clip=1.5)
    x = torch.randn(8, 16, 2) * torch.tensor([2.0, 0.1]) + torch.tensor([5.0, -1.0])
    rms.update(x)  # [T, N, F]: all leading dims are batch
    flat = x.reshape(-1, 2).double()
    torch.testing.assert_close(rms.mean, flat.mean(0))
    torch.testing.assert_close(rms.var, flat.var(0, unbiased=False))
    out = rms.normalize(x)
    assert out.dtype == x.dtype
    assert out.abs().max() <= 1.5
    manual = ((x.double() - flat.mean(0)) / flat.var(0, unbiased=False).sqrt().clamp(min=1e-2)).clamp(-1.5, 1.5)
    torch.testing.assert_close(out.double(), manual, atol=1e-5, rtol=1e-5)


def test_running_mean_std_state_dict_round_trip_restores_normalize():
    a = RunningMeanStd(shape=(4,))
    a.update(torch.randn(100, 4) * 3 + 1)
    b = RunningMeanStd(shape=(4,))
    b.load_state_dict(a.state_dict())
    x = torch.randn(5, 4)
    torch.testing.assert_close(a.normalize(x), b.normalize(x))
    assert set(a.state_dict()) == {"count", "mean", "m2"}


def test_reward_normalizer_matches_direct_discounted_return_std():
    rng = np.random.default_rng(1)
    T, N, gamma = 300, 5, 0.9
    rewards = rng.normal(1.0, 2.0, size=(T, N))
    dones = rng.random((T, N)) < 0.05
    norm = RewardNormalizer(N, gamma=gamma, clip=None)
    # fed in three uneven rollouts: the per-env returns must carry across calls
    for lo, hi in [(0, 17), (17, 200), (200, T)]:
        norm.update(torch.as_tensor(rewards[lo:hi]), torch.as_tensor(dones[lo:hi]))
    # direct computation, env by env
    returns = []
    for n in range(N):
        g = 0.0
        for t in range(T):
            g = gamma * g + rewards[t, n]
            returns.append(g)
            if dones[t, n]:
                g = 0.0
    expected_std = max(np.sqrt(np.var(returns)), 1e-2)
    np.testing.assert_allclose(norm.return_rms.std.item(), expected_std, rtol=1e-10)
    r = torch.tensor([1.0, -2.0])
    torch.testing.assert_close(norm.normalize(r), r / float(expected_std))


def test_reward_normalizer_clip_and_resume_with_other_num_envs():
    norm = RewardNormalizer(4, gamma=0.99, clip=2.0)
    norm.update(torch.full((10, 4), 0.01), torch.zeros(10, 4, dtype=torch.bool))
    assert norm.normalize(torch.tensor([1e6])).item() == 2.0
    assert "returns" not in norm.state_dict()  # each rank's own envs' partial returns: not shared state
    for num_envs in (4, 8):  # the same or another number of envs: partial returns restart, moments carry over
        other = RewardNormalizer(num_envs, gamma=0.99, clip=2.0)
        other.load_state_dict(norm.state_dict())
        assert torch.equal(other.returns, torch.zeros(num_envs, dtype=torch.float64))
        torch.testing.assert_close(other.return_rms.mean, norm.return_rms.mean)


def test_unfitted_normalizer_is_identity_also_after_a_load():
    fresh = RunningMeanStd(shape=(2,), clip=None)
    loaded = RunningMeanStd(shape=(2,), clip=None)
    loaded.load_state_dict(fresh.state_dict())  # a checkpoint written before any update
    x = torch.tensor([[0.5, -3.0]])
    torch.testing.assert_close(fresh.normalize(x), x)
    torch.testing.assert_close(loaded.normalize(x), x)


def test_a_nearly_constant_feature_keeps_a_bounded_gain():
    """A feature constant in the first data (std 1e-6) must not be scaled by 1/sqrt(1e-8) = 1e4
    and pinned at the clip once it moves: the floor of the std (1e-2) caps the gain at 100."""
    rms = RunningMeanStd(shape=(2,), clip=10.0)
    x = torch.randn(4096, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x[:, 1] = x[:, 1] * 1e-6 + 3.0  # feature 1: nearly constant at 3.0
    rms.update(x)
    moved = torch.tensor([[0.0, 3.05]])  # feature 1 starts to move: 0.05 away from its mean
    out = rms.normalize(moved)
    assert out[0, 1] == pytest.approx(5.0, rel=1e-3)  # 0.05 / 1e-2, inside the clip
    wide = torch.tensor([[0.0, 3.0 + 1.0]])
    assert rms.normalize(wide)[0, 1] == 10.0  # far away: clipped as any feature would be
    # a feature with a real spread is standardized exactly as before
    torch.testing.assert_close(out[0, 0], ((0.0 - rms.mean[0]) / rms.var[0].sqrt()).float())
