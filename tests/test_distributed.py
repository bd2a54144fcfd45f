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


def test_the_first_ctrl_c_is_answered_at_once_in_one_line(capsys):
    """The iteration under way may take seconds: the first SIGINT says at once what happens, and that a second
    one ends the run without saving (a second one within a second is a launcher's repeat, and is not)."""
    import os
    import signal

    from common.distributed import PreemptionGuard

    guard = PreemptionGuard()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # the same request, forwarded
    finally:
        guard.restore()
    assert guard.received == "SIGINT"
    assert capsys.readouterr().out == (
        "SIGINT: stopping after this iteration: saving last.pt; a second Ctrl-C ends without saving\n"
    )
