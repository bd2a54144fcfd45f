import os
import random
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from common.checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    capture_rng_state,
    load_checkpoint,
    load_optimizer_state,
    resolve_resume,
    restore_rng_state,
    save_checkpoint,
)


def _state(step=1):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    return {
        "format_version": FORMAT_VERSION,
        "algo": "ppo",
        "env_id": "CartPole-v1",
        "args": {"seed": 1, "hidden_sizes": [64, 64], "device": "cpu"},
        "global_step": step,
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "rng": [capture_rng_state()],
        "best_eval_return": float("-inf"),
    }


def test_round_trip_with_weights_only(tmp_path):
    state = _state(7)
    path = save_checkpoint(state, tmp_path / "checkpoints" / "last.pt")
    loaded = torch.load(path, weights_only=True)
    assert loaded["global_step"] == 7 and loaded["args"]["hidden_sizes"] == [64, 64]
    for k, v in state["model"].items():
        assert torch.equal(loaded["model"][k], v)
    assert load_checkpoint(path, algo="ppo", env_id="CartPole-v1")["global_step"] == 7
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temporary left behind


def test_rng_state_round_trip():
    saved = capture_rng_state()
    a = (torch.rand(3), np.random.rand(3), random.random())
    torch.rand(10), np.random.rand(5), random.random()
    restore_rng_state(saved)
    b = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


def test_missing_truncated_and_foreign_files_give_clear_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "nope.pt")

    good = save_checkpoint(_state(), tmp_path / "good.pt")
    data = good.read_bytes()
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(truncated)

    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="truncated or corrupt|not a checkpoint"):
        load_checkpoint(garbage)

    pickled = tmp_path / "pickled.pt"
    torch.save({"format_version": 1, "obj": _Opaque()}, pickled)
    with pytest.raises(CheckpointError, match="not a checkpoint of this project") as refused:
        load_checkpoint(pickled)
    # one line like every other bad checkpoint: none of torch's weights_only text, no terminal escapes
    assert (
        "\n" not in str(refused.value)
        and "\x1b" not in str(refused.value)
        and "WeightsUnpickler" not in str(refused.value)
    )
    assert f"--resume {tmp_path}{os.sep}" in str(refused.value)  # the command that uses another checkpoint

    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    with pytest.raises(CheckpointError, match="no format_version"):
        load_checkpoint(other)

    for version, word in ((FORMAT_VERSION - 2, "older"), (FORMAT_VERSION + 1, "newer")):
        path = save_checkpoint({**_state(), "format_version": version}, tmp_path / f"v{version}.pt")
        with pytest.raises(
            CheckpointError, match=f"format version {version}, {word} than this code's {FORMAT_VERSION}"
        ):
            load_checkpoint(path)

    # version 3 kept a script's own state beside the format's keys: it is read into the namespaces of 4
    v3 = {
        **_state(),
        "format_version": 3,
        "learning_rate": torch.tensor(0.5),
        "ranks": [{"rng": capture_rng_state(), "env": {}, "ep_stats": torch.ones(2)}],
    }
    upgraded = load_checkpoint(save_checkpoint(v3, tmp_path / "v3.pt"))
    assert upgraded["format_version"] == FORMAT_VERSION and upgraded["state"]["learning_rate"] == 0.5
    assert set(upgraded["ranks"][0]) == {"rng", "env", "state"} and upgraded["ranks"][0]["state"]["ep_stats"].sum() == 2

    with pytest.raises(CheckpointError, match="written by 'ppo', not 'sac'"):
        load_checkpoint(good, algo="sac")
    with pytest.raises(CheckpointError, match="--env-id CartPole-v1"):
        load_checkpoint(good, algo="ppo", env_id="Pendulum-v1")


class _Opaque:
    pass


def test_resolve_resume(tmp_path):
    run = tmp_path / "run"
    assert resolve_resume(None, run) is None
    assert resolve_resume("auto", run) is None  # fresh run: nothing to resume
    last = save_checkpoint(_state(), run / "checkpoints" / "last.pt")
    assert resolve_resume("auto", run) == last
    assert resolve_resume(str(run), tmp_path) == last
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        resolve_resume(str(tmp_path / "missing.pt"), run)


def test_save_killed_midway_keeps_previous_last(tmp_path):
    """SIGKILL a process while it writes a large checkpoint over last.pt: the old one still loads."""
    path = tmp_path / "last.pt"
    save_checkpoint(_state(step=1), path)
    code = textwrap.dedent(
        f"""
        import sys, torch
        from common.checkpoint import save_checkpoint
        big = {{"format_version": 1, "algo": "ppo", "env_id": "x", "global_step": 2,
                "blob": torch.zeros(400_000_000, dtype=torch.uint8)}}
        print("saving", flush=True)
        while True:
            save_checkpoint(big, {str(path)!r})
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=os.getcwd())
    assert proc.stdout.readline().strip() == b"saving"
    tmp_files = []
    for _ in range(200):  # wait until the temporary file exists, i.e. a write is under way
        tmp_files = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        if tmp_files:
            break
        import time

        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert tmp_files, "the writer never started a temporary file"
    state = load_checkpoint(path)
    assert state["global_step"] in (1, 2)  # the old file, or a complete new one, never a torn one


def _adam_state(**adam_kwargs):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), **adam_kwargs)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    return opt.state_dict()


def test_optimizer_state_keeps_this_runs_capturable_setting_and_lr_tensor():
    # A checkpoint written by a CUDA run (capturable Adam, as the scripts build it there) resumed on
    # CPU: plain load_state_dict would take capturable=True over, and step() then refuses CPU params.
    saved = _adam_state(lr=0.01)
    saved["param_groups"][0]["capturable"] = True
    saved["param_groups"][0]["lr"] = 0.003
    model = torch.nn.Linear(3, 2)
    lr = torch.tensor(0.01)
    opt = torch.optim.Adam(model.parameters(), lr=lr, capturable=False)
    load_optimizer_state(opt, saved)
    group = opt.param_groups[0]
    assert group["capturable"] is False
    assert group["lr"] is lr and lr.item() == pytest.approx(0.003)  # same tensor, the saved value
    for state in opt.state.values():
        assert state["step"].device.type == "cpu" and state["step"].item() == 1
        assert state["step"].dtype == torch.float32
    model(torch.randn(4, 3)).sum().backward()
    opt.step()  # raises with the checkpoint's capturable=True
    assert all(s["step"].item() == 2 for s in opt.state.values())

    # The other way (a CPU checkpoint resumed by a capturable optimizer): the flag stays on.
    opt2 = torch.optim.Adam(torch.nn.Linear(3, 2).parameters(), lr=0.5, capturable=True)
    load_optimizer_state(opt2, _adam_state(lr=0.02))
    assert opt2.param_groups[0]["capturable"] is True
    assert opt2.param_groups[0]["lr"] == 0.02  # a float lr: the checkpoint's value, as load_state_dict does
