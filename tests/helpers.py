"""Helpers of the test suite: launching scripts (also under torchrun), importing them, faulty envs."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
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
        [
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id=test-{port}",
            f"--max-restarts={restarts}",
        ]
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


def run(cmd: list[str], timeout: float, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run `cmd` in its own process group; kill the whole group on timeout."""
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env or subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s: {' '.join(cmd)}\n{out[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


class Job:
    """A launched command in its own process group, with what it prints in `log`.

    Under torchrun the launcher starts every worker in a session of its own, so killing the
    launcher's group leaves them running: kill() ends each worker it has seen by its id too."""

    def __init__(self, cmd, log: Path, env: dict | None = None, cwd: Path = ROOT):
        self.log = log
        self.seen_workers: set[int] = set()
        self.proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env or subprocess_env(),
            stdout=open(log, "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

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
        pids = [int(p) for p in out.split()]
        self.seen_workers.update(pids)
        return pids

    def finish(self, timeout=180.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"did not finish in {timeout}s:\n{self.output()[-3000:]}")

    def output(self) -> str:
        return self.log.read_text()

    def kill(self):
        """SIGKILL to the launcher's group and to the group of each of its workers."""
        if self.proc.poll() is None:
            self.workers()
        for pid in sorted(self.seen_workers):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # gone already
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


_LOADING = threading.RLock()


def load_script(name: str, path: Path | None = None):
    """Import algos/<name>.py (or the script at `path`) as the module `name` (the scripts are files, not a package).
    Under a lock: the module is in sys.modules before it has run (dataclasses look it up there), and another
    thread must not take it half-made (gpu_check plans its sections on threads side by side)."""
    import importlib.util

    with _LOADING:
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path or ROOT / "algos" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up here
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]  # not a half-made module for the next caller
            raise
        return module


def run_main(module, **kwargs) -> dict:
    """`module.main(module.Args(**kwargs))` of an imported script, in this process, on one intra-op
    thread (as the subprocesses get with OMP_NUM_THREADS=1: tiny networks gain nothing from more,
    and on a busy machine spinning worker threads slow every op down by an order of magnitude)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return module.main(module.Args(**kwargs))
    finally:
        torch.set_num_threads(threads)


def untrained_teacher(path: Path, env_id: str = "Pendulum-v1", **flags) -> Path:
    """A checkpoint of an untrained ppo.py agent of `env_id` with ppo's `flags` at `path`: a teacher for
    algos/distill.py's contract runs (what it acts does not matter there; a trained one: tests/test_distill.py)."""
    from dataclasses import asdict

    import torch

    from common.checkpoint import FORMAT_VERSION, save_checkpoint
    from common.envs import make_env

    module, env = load_script("ppo"), make_env(env_id, 1)
    args = module.Args(env_id=env_id, **flags)
    torch.manual_seed(0)
    agent = module.Agent(env.single_observation_space.shape[0], None, env.single_action_space, args)
    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "algo": "ppo",
            "env_id": env_id,
            "args": asdict(args),
            "world_size": 1,
            "global_step": 0,
            "iteration": 0,
            "best_eval_return": float("-inf"),
            "model": agent.state_dict(),
            "optimizers": {},
            "state": {},
            "ranks": [],
        },
        path,
    )
    return path


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


def printed_summary(stdout: str) -> dict:
    """The summary.json of the run whose closing lines (`... summary: PATH`) are in `stdout`."""
    import json

    path = next(line.rpartition("summary: ")[2] for line in reversed(stdout.splitlines()) if "; summary: " in line)
    return json.loads(Path(path).read_text())


def load_exported_program(path):
    """torch.export.load(path).module() of an exported policy.pt2, as the README loads it; fails on
    any deprecation notice (DeprecationWarning, FutureWarning) while loading."""
    import warnings

    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = torch.export.load(str(path)).module()
    deprecations = [w for w in caught if issubclass(w.category, (DeprecationWarning, FutureWarning))]
    assert not deprecations, [f"{w.category.__name__}: {w.message}" for w in deprecations]
    return module


# Two one-line changes to a copy of algos/ppo.py that a GPU would not survive and that CPU runs do not
# notice by their results: each puts into the captured `update_fn` what a CUDA graph's replay would
# not do. The tests show the capture checks failing on them (the copies are written to a temporary
# directory; algos/ is never edited). name -> [(text of ppo.py, its replacement)].
MUTATIONS = {
    # a read to the host that dispatches no aten op on a CPU tensor (on CUDA: a sync inside the capture)
    "tolist": [
        (
            "        batch, rollout_stats, nonfinite_counts = targets_fn(obs)\n",
            "        batch, rollout_stats, nonfinite_counts = targets_fn(obs)\n"
            '        explained = rollout_stats["explained_variance"].tolist()  # noqa: F841\n',
        )
    ],
    # a Python counter of the iterations kept in the captured function (on CUDA it stops after the capture: a
    # copy that divided the logged sums by it would divide by the wrong count)
    "counter": [
        (
            "    stats = loop.iteration_stats(device)",
            "    iterations_in_stats = 0\n    stats = loop.iteration_stats(device)",
        ),
        (
            '        """The targets of the rollout, then the epochs of the update; their statistics into `stats`."""\n',
            '        """The targets of the rollout, then the epochs of the update; their statistics into `stats`."""\n'
            "        nonlocal iterations_in_stats\n        iterations_in_stats += 1\n",
        ),
    ],
}


def mutated_ppo(directory: Path, mutation: str) -> Path:
    """A copy of algos/ppo.py with MUTATIONS[mutation], written as directory/ppo_<mutation>.py."""
    text = (ROOT / "algos" / "ppo.py").read_text()
    for old, new in MUTATIONS[mutation]:
        assert text.count(old) == 1, f"algos/ppo.py changed: the {mutation} mutation no longer applies"
        text = text.replace(old, new)
    path = Path(directory) / f"ppo_{mutation}.py"
    path.write_text(text)
    return path
