"""Checks of common.distributed and the normalizers, run by torchrun from tests/test_distributed.py.

Each rank asserts; torchrun exits non-zero if any rank fails.
"""

import torch
import torch.distributed as dist

from common import distributed
from common.normalize import RewardNormalizer, RunningMeanStd


def main():
    info = distributed.setup("cpu")
    assert info.world_size == 2 and dist.is_initialized() and dist.get_backend() == "gloo"
    assert info.is_main == (info.rank == 0)

    # broadcast: different init per rank -> rank 0's parameters everywhere
    torch.manual_seed(100 + info.rank)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    model.register_buffer("counter", torch.tensor([info.rank], dtype=torch.int64))
    distributed.broadcast_module(model)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(2)]
    dist.all_gather(gathered, flat)
    assert torch.equal(gathered[0], gathered[1]), "parameters differ after broadcast"
    assert model.counter.item() == 0, "buffers were not broadcast"

    # gradient average: equals the mean of the ranks' gradients
    x = torch.randn(16, 5, generator=torch.Generator().manual_seed(info.rank))
    model(x).pow(2).mean().backward()
    local = [p.grad.clone() for p in model.parameters()]
    all_local = [[torch.empty_like(g) for _ in range(2)] for g in local]
    for g, out in zip(local, all_local):
        dist.all_gather(out, g)
    distributed.all_reduce_gradients(model.parameters())
    for p, out in zip(model.parameters(), all_local):
        torch.testing.assert_close(p.grad, (out[0] + out[1]) / 2, rtol=0, atol=1e-7)
        assert not torch.equal(out[0], out[1])  # the check would be vacuous otherwise

    # RunningMeanStd: merged moments equal the moments of both ranks' data together
    rms = RunningMeanStd(shape=(3,), clip=None)
    chunks = []
    for k, size in enumerate([5, 300, 1, 77]):
        g = torch.Generator().manual_seed(1000 * k + info.rank)
        n = size + 13 * info.rank  # uneven sizes across ranks
        data = torch.randn(n, 3, generator=g, dtype=torch.float64) * (1 + info.rank) + 10 * info.rank
        rms.update(data)
        chunks.extend(distributed.all_gather_object(data))  # uneven sizes: gather as objects
    everything = torch.cat(chunks)
    torch.testing.assert_close(rms.mean, everything.mean(0), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rms.var, everything.var(0, unbiased=False), rtol=1e-10, atol=1e-12)
    assert rms.count.item() == everything.shape[0]

    # RewardNormalizer: the same statistics on both ranks, from both ranks' returns
    rn = RewardNormalizer(4, gamma=0.9, clip=None)
    g = torch.Generator().manual_seed(7 + info.rank)
    rn.update(torch.randn(20, 4, generator=g) + info.rank, torch.rand(20, 4, generator=g) < 0.1)
    stats = torch.stack([rn.return_rms.mean, rn.return_rms.var])
    both = [torch.empty_like(stats) for _ in range(2)]
    dist.all_gather(both, stats)
    assert torch.equal(both[0], both[1])

    # statistics reductions
    t = torch.tensor([float(info.rank + 1)])
    assert distributed.all_reduce(t.clone(), "sum").item() == 3.0
    assert distributed.all_reduce(t.clone(), "mean").item() == 1.5
    assert distributed.all_reduce(t.clone(), "max").item() == 2.0
    assert distributed.broadcast_object({"rank": info.rank})["rank"] == 0

    distributed.cleanup()
    print(f"rank {info.rank}: ok", flush=True)


if __name__ == "__main__":
    main()
