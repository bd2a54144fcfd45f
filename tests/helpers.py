"""Helpers of the test suite: launching scripts (also under torchrun), importing them, faulty envs."""

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_cmd(nproc: int, script_args: list[str], restarts: int = 0) -> list[str]:
    """torchrun on this machine. Elastic restarts need c10d rendezvous: the static one keeps the
    dead workers' addresses in its store, and the restarted group cannot connect."""
    port = free_port()
    rendezvous = (
        ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=test-{port}", f"--max-restarts={restarts}"]
        if restarts
        else ["--master-addr=127.0.0.1", f"--master-port={port}"]
    )
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", *rendezvous, *script_args]


def subprocess_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"  # two ranks on two cores: no oversubscription
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run(cmd: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `cmd` in its own process group; kill the whole group on timeout."""
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env or subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s: {' '.join(cmd)}\n{out[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def load_script(name: str):
    """Import algos/<name>.py as a module (the scripts are files, not a package)."""
    import importlib.util

    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "algos" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


class NaNRewardsAfter:
    """Wraps an env so that its rewards turn NaN from its `after`-th step on: a run's NaN guard must
    stop it with the tensor's name and keep the last good checkpoint. Its step counter is Python
    state: not capturable in a CUDA graph."""

    capturable = False

    def __init__(self, env, after: int):
        self.env, self.after, self.steps = env, after, 0

    def __getattr__(self, name):
        return getattr(self.env, name)

    def step(self, action):
        out = list(self.env.step(action))
        self.steps += 1
        if self.steps >= self.after:
            out[1] = out[1] * float("nan")
        return tuple(out)


def inject_nan_rewards(monkeypatch, after: int) -> None:
    """Make every env that a script builds (through common.run) turn its rewards NaN from step `after` on."""
    import common.run

    real_make_env = common.run.make_env
    monkeypatch.setattr(common.run, "make_env", lambda *a, **k: NaNRewardsAfter(real_make_env(*a, **k), after))
