import pytest

from tests.helpers import run, torchrun_cmd

pytestmark = pytest.mark.distributed


def test_distributed_helpers_under_torchrun_gloo():
    result = run(torchrun_cmd(2, ["tests/dist_worker.py"]), timeout=180)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "rank 0: ok" in result.stdout and "rank 1: ok" in result.stdout


def test_setup_is_a_noop_without_torchrun(monkeypatch):
    import torch.distributed as dist

    from common import distributed

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    info = distributed.setup("cpu")
    assert (info.rank, info.world_size, info.is_main, info.distributed) == (0, 1, True, False)
    assert not dist.is_initialized()
