"""Launching scripts under torchrun from the tests: bounded in time, never leaving processes behind."""

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
