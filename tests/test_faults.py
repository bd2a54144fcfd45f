"""Faults under torchrun (CPU, gloo, 2 processes): killed workers, preemption signals, resumes.

Every test bounds its processes in time and kills their whole process group on the way out.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT, run, subprocess_env, torchrun_cmd

pytestmark = pytest.mark.distributed

PPO_ARGS = ["--num-envs", "128", "--num-steps", "16", "--eval-interval", "0", "--hidden-sizes", "32", "32"]


class Job:
    """A launched command in its own process group, killed with the group when the test ends."""

    def __init__(self, cmd, log: Path):
        self.log = log
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=subprocess_env(), stdout=open(log, "w"),
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def wait_for(self, predicate, timeout=120.0, what="condition"):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if predicate():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"exited ({self.proc.returncode}) before {what}:\n{self.output()[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}:\n{self.output()[-3000:]}")

    def workers(self) -> list[int]:
        """PIDs of the processes torchrun started (its children)."""
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def finish(self, timeout=180.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"did not finish in {timeout}s:\n{self.output()[-3000:]}")

    def output(self) -> str:
        return self.log.read_text()

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def jobs():
    started = []
    yield lambda cmd, log: started.append(Job(cmd, log)) or started[-1]
    for job in started:
        job.kill()


def _logged_steps(run_dir: Path) -> list[int]:
    """Steps of charts/SPS as TensorBoard reads them (it honours the purge marker of a resume)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return [e.step for e in acc.Scalars("charts/SPS")] if "charts/SPS" in acc.Tags()["scalars"] else []


def _state(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_sigkill_of_one_worker_is_survived_by_elastic_restart(tmp_path, jobs):
    total = 2 * 128 * 16 * 40
    cmd = torchrun_cmd(2, ["algos/ppo.py", *PPO_ARGS, "--total-timesteps", str(total), "--save-interval", "4",
                           "--output-dir", str(tmp_path), "--run-name", "run"], restarts=1)
    job = jobs(cmd, tmp_path / "log")
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    job.wait_for(last.is_file, what="the first checkpoint")
    killed_at = _state(tmp_path / "run")["iteration"]
    # let rank 0 log iterations past the checkpoint (work that the fault will make it redo)
    job.wait_for(lambda: _logged_steps(tmp_path / "run") and max(_logged_steps(tmp_path / "run")) > killed_at * 2 * 128 * 16,
                 what="iterations logged after the checkpoint")
    os.kill(job.workers()[-1], signal.SIGKILL)
    assert job.finish() == 0, job.output()[-4000:]
    out = job.output()
    assert "resumed from" in out, "the restarted workers did not resume"
    summary = _summary(tmp_path / "run")
    assert summary["global_step"] == total and summary["params_in_sync"]
    assert _state(tmp_path / "run")["global_step"] == total
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["log", "run"]  # one run dir
    # one continuous TensorBoard curve: the steps logged after the checkpoint and redone are purged
    steps = _logged_steps(tmp_path / "run")
    assert steps == [2 * 128 * 16 * i for i in range(1, 41)], steps
    print(f"killed after checkpoint of iteration {killed_at}; {out.count('resumed from')} resume(s)")


def test_run_name_is_stable_across_restarts_without_run_name(tmp_path, jobs):
    total = 2 * 128 * 16 * 30
    cmd = torchrun_cmd(2, ["algos/ppo.py", *PPO_ARGS, "--total-timesteps", str(total), "--save-interval", "2",
                           "--output-dir", str(tmp_path)], restarts=1)
    job = jobs(cmd, tmp_path / "log")
    job.wait_for(lambda: list(tmp_path.glob("*/checkpoints/last.pt")), what="the first checkpoint")
    os.kill(job.workers()[0], signal.SIGKILL)
    assert job.finish() == 0, job.output()[-4000:]
    runs = [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert len(runs) == 1, runs
    assert _summary(runs[0])["global_step"] == total


def test_sigterm_stops_after_the_iteration_saves_and_resumes(tmp_path, jobs):
    total = 2 * 128 * 16 * 40
    args = ["algos/ppo.py", *PPO_ARGS, "--total-timesteps", str(total), "--save-interval", "1000",
            "--output-dir", str(tmp_path), "--run-name", "run"]
    job = jobs(torchrun_cmd(2, args), tmp_path / "log")
    events = lambda: list((tmp_path / "run").glob("events.out.tfevents.*"))
    job.wait_for(lambda: events() and len(job.workers()) == 2, what="training to start")
    time.sleep(1.0)
    for pid in job.workers():  # what a scheduler's signal reaches: every worker
        os.kill(pid, signal.SIGTERM)
    assert job.finish() == 0, job.output()[-4000:]
    assert "Traceback" not in job.output()
    stopped = _summary(tmp_path / "run")
    assert stopped["stop_reason"].startswith("signal") and stopped["global_step"] < total
    assert _state(tmp_path / "run")["global_step"] == stopped["global_step"]

    resumed = run(torchrun_cmd(2, [*args, "--resume", "auto"]), timeout=240)
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert f"global step {stopped['global_step']}" in resumed.stdout
    assert _summary(tmp_path / "run")["global_step"] == total


def test_sigterm_of_a_plain_python_run_exits_zero(tmp_path, jobs):
    cmd = [sys.executable, "algos/ppo.py", *PPO_ARGS, "--total-timesteps", str(10**8), "--save-interval", "1000",
           "--output-dir", str(tmp_path), "--run-name", "run"]
    job = jobs(cmd, tmp_path / "log")
    job.wait_for(lambda: list((tmp_path / "run").glob("events.out.tfevents.*")), what="training to start")
    time.sleep(1.0)
    job.proc.send_signal(signal.SIGTERM)
    assert job.finish(timeout=60) == 0, job.output()[-3000:]
    assert _summary(tmp_path / "run")["stop_reason"] == "signal:SIGTERM"
    assert _state(tmp_path / "run")["global_step"] > 0


def _ppo_cmd(nproc, tmp_path, name, *extra):
    args = ["algos/ppo.py", "--env-id", "Pendulum-v1", "--num-envs", "32", "--num-steps", "8", "--eval-interval", "0",
            "--total-timesteps", str(2 * 32 * 8 * 6), "--lr-schedule", "linear", "--reward-norm",
            "--output-dir", str(tmp_path), "--run-name", name, *extra]
    return torchrun_cmd(nproc, args) if nproc > 1 else [sys.executable, *args]


def test_two_process_resume_is_bit_identical(tmp_path):
    full = run(_ppo_cmd(2, tmp_path, "full"), timeout=240)
    assert full.returncode == 0, full.stdout[-4000:]
    stopped = run(_ppo_cmd(2, tmp_path, "cut", "--max-wall-seconds", "0"), timeout=240)  # stops after iteration 1
    assert stopped.returncode == 0 and _state(tmp_path / "cut")["iteration"] == 1, stopped.stdout[-4000:]
    resumed = run(_ppo_cmd(2, tmp_path, "cut", "--resume", "auto"), timeout=240)
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    a, b = _state(tmp_path / "full"), _state(tmp_path / "cut")
    assert a["global_step"] == b["global_step"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k


def test_two_process_checkpoint_resumes_in_one_process(tmp_path):
    stopped = run(_ppo_cmd(2, tmp_path, "run", "--max-wall-seconds", "0"), timeout=240)
    assert stopped.returncode == 0, stopped.stdout[-4000:]
    step_at_stop = _state(tmp_path / "run")["global_step"]
    resumed = run(_ppo_cmd(1, tmp_path, "run", "--resume", "auto"), timeout=240)
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert "notice: checkpoint from 2 process(es)" in resumed.stdout
    summary = _summary(tmp_path / "run")
    # 1 process x 32 envs continues from the 2-process global step to the same total
    assert summary["global_step"] == 2 * 32 * 8 * 6 and summary["world_size"] == 1
    assert (summary["global_step"] - step_at_stop) % (32 * 8) == 0
