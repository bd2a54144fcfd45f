"""--resume auto of a run directory without last.pt: a run it cannot continue is never written over; a run without a
checkpoint starts again with its earlier files moved aside; a run that does not exist is said to start. And the
temporary files of processes killed during a save, removed by the next holder of the lock."""

import os
import sys

import torch

from common.checkpoint import load_checkpoint
from tests.helpers import ROOT, run

FLAGS = ["--env-id", "CartPole-v1", "--num-envs", "8", "--num-steps", "16", "--eval-interval", "0", "--no-progress"]


def _ppo(tmp_path, *extra):
    cmd = [sys.executable, str(ROOT / "algos" / "ppo.py"), *FLAGS, "--output-dir", str(tmp_path), "--run-name", "r"]
    return run([*cmd, *extra], timeout=300)


def test_resume_auto_without_last_refuses_and_writes_nothing(tmp_path):
    first = _ppo(tmp_path, "--total-timesteps", "256", "--seed", "5")
    assert first.returncode == 0, first.stdout[-3000:]
    ckpts = tmp_path / "r" / "checkpoints"
    (ckpts / "last.pt").rename(ckpts / "step_256.pt")  # a numbered checkpoint, and no last.pt
    torch.save(load_checkpoint(ckpts / "step_256.pt"), ckpts / "best.pt")
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in (tmp_path / "r").rglob("*") if p.is_file()}

    result = _ppo(tmp_path, "--total-timesteps", "512", "--resume", "auto")
    assert result.returncode != 0
    error = [line for line in result.stdout.splitlines() if line.startswith("error:")]
    assert len(error) == 1, result.stdout[-3000:]
    assert "best.pt (global step 256)" in error[0] and "step_256.pt (global step 256)" in error[0]
    assert f"--resume {ckpts / 'best.pt'}" in error[0] and "--overwrite" in error[0]
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in (tmp_path / "r").rglob("*") if p.is_file()}
    assert after == before  # nothing written, nothing removed

    # the command it names continues the run
    resumed = _ppo(tmp_path, "--total-timesteps", "512", "--resume", str(ckpts / "best.pt"))
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert load_checkpoint(ckpts / "last.pt")["args"]["seed"] == 5


def test_resume_auto_of_a_run_without_checkpoint_starts_it_again_apart(tmp_path):
    run_dir = tmp_path / "r"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "events.out.tfevents.1.host").write_bytes(b"earlier events")
    (run_dir / "config.json").write_text('{"seed": 5}')
    result = _ppo(tmp_path, "--total-timesteps", "128", "--resume", "auto")
    assert result.returncode == 0, result.stdout[-3000:]
    assert f"{run_dir} has no checkpoint" in result.stdout and "starting it again" in result.stdout
    earlier = tmp_path / "r.earlier-1"
    assert (earlier / "events.out.tfevents.1.host").read_bytes() == b"earlier events"
    assert (earlier / "config.json").read_text() == '{"seed": 5}'
    assert not (run_dir / "events.out.tfevents.1.host").exists()
    assert '"seed": 1' in (run_dir / "config.json").read_text()


def test_resume_auto_of_no_run_says_it_starts_it(tmp_path):
    result = _ppo(tmp_path, "--total-timesteps", "128", "--resume", "auto")
    assert result.returncode == 0, result.stdout[-3000:]
    assert f"--resume auto: no run in {tmp_path / 'r'} yet: starting it" in result.stdout


def test_dead_processes_temporary_checkpoints_are_removed(tmp_path):
    first = _ppo(tmp_path, "--total-timesteps", "128")
    assert first.returncode == 0, first.stdout[-3000:]
    ckpts = tmp_path / "r" / "checkpoints"
    dead = run([sys.executable, "-c", "import os; print(os.getpid())"], timeout=60).stdout.strip()
    stale = ckpts / f".last.pt.{dead}.tmp"
    stale.write_bytes(b"x" * 300_000)
    live = ckpts / f".last.pt.{os.getpid()}.tmp"  # a running process's (this test's): kept
    live.write_bytes(b"y")
    result = _ppo(tmp_path, "--total-timesteps", "256", "--resume", "auto")
    assert result.returncode == 0, result.stdout[-3000:]
    assert not stale.exists() and live.exists()
    assert "removed 1 temporary file(s) (0.3 MB)" in result.stdout
