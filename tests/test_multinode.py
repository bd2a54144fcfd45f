"""Several torchrun agents on this machine, each one "node": rendezvous, a node that dies, a node
that joins, preemption of one node, a fault on one rank, and the steps of the SLURM script in docs/cluster.md.

Every agent runs `--nproc-per-node 1` with c10d rendezvous on a loopback port (gloo, CPU); the
first one started hosts the rendezvous store (`is_host=1`), as the first node of a cluster does.
Workers go through tests/fault_worker.py, which paces the env steps (so that a kill, a join or a
signal lands mid-run on any machine without a long run) and injects faults on one rank. Each
agent and each of its workers is killed by its id when a test ends, also when it fails.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import Job, free_port, subprocess_env
from tests.contract import CONTRACT
from tests.test_scripts import checkpoint, cli_args, logged_steps, scalars, summary_of

pytestmark = pytest.mark.distributed

OFF_POLICY = "td3"
# Rendezvous timings of the tests (torchrun's defaults: keep-alive 5 s x 3, last call 30 s): a dead
# node is dropped from the rendezvous after 5 s without a heartbeat (shorter ones drop live nodes of a
# busy machine), and a round closes 2 s after it has its minimum of nodes.
RDZV_CONF = "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=5"


def node_env() -> dict:
    env = subprocess_env()
    env["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's connections on loopback, whatever the host name resolves to
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # as the README asks of elastic multi-node runs (see there)
    return env


class Cluster:
    """Agents of one rendezvous (one torchrun job), started as separate nodes on this machine."""

    def __init__(
        self,
        tmp: Path,
        script_args: list[str],
        nnodes: str,
        restarts: int = 0,
        rdzv_id: str | None = None,
        step_seconds: float = 0.0,
        fault: list[str] | None = None,
    ):
        self.tmp, self.nnodes, self.restarts = tmp, nnodes, restarts
        self.port = free_port()
        self.rdzv_id = rdzv_id or f"job-{self.port}"
        self.worker_args = ["tests/fault_worker.py", "--step-seconds", str(step_seconds), *(fault or []), *script_args]
        self.nodes: list[Job] = []

    def start(self, name: str) -> Job:
        host = not self.nodes  # the first node hosts the rendezvous store
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={self.nnodes}",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{self.port}",
            f"--rdzv-id={self.rdzv_id}",
            f"--rdzv-conf=is_host={int(host)},{RDZV_CONF}",
            "--local-addr=127.0.0.1",
            f"--max-restarts={self.restarts}",
            *self.worker_args,
        ]
        job = Job(cmd, self.tmp / f"{name}.log", env=node_env())
        job.name = name
        self.nodes.append(job)
        return job

    def kill(self):
        for job in self.nodes:
            job.kill()


@pytest.fixture
def clusters():
    started: list[Cluster] = []
    yield lambda *a, **k: started.append(Cluster(*a, **k)) or started[-1]
    for cluster in started:
        cluster.kill()


def rank_of(pid: int) -> int:
    """The RANK torchrun gave a worker."""
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(v for v in env if v.startswith(b"RANK=")).split(b"=", 1)[1])


def wait_until(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def alive(pid: int) -> bool:
    """Running and not a zombie. The process may end between any two reads: each one that fails
    (ESRCH, ENOENT) says it is gone."""
    try:
        os.kill(pid, 0)
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]
    except (ProcessLookupError, FileNotFoundError):
        return False


def steps_per_iteration(algo: str) -> int:
    """Env steps of one process in one iteration."""
    return CONTRACT[algo]["steps"]


def last_step(run_dir: Path) -> int:
    return max(logged_steps(run_dir) or [0])


def assert_one_curve(run_dir: Path, end: int):
    """Each TensorBoard step once, in order, up to the end: no step repeated by redone work."""
    steps = logged_steps(run_dir)
    assert steps == sorted(set(steps)), f"repeated or unordered steps: {steps}"
    assert steps[-1] == end, steps[-5:]


# --------------------------------------------------------------------------------------------
# 1. two nodes
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["ppo", OFF_POLICY])
def test_two_nodes_run_one_job(algo, tmp_path, clusters):
    """Two agents that rendezvous run one script as one world: one run directory, world size 2,
    global_step counting both ranks' env steps, parameters bit-identical at the end."""
    sync = CONTRACT[algo]["sync"]
    total = 2 * steps_per_iteration(algo) * 6 * sync
    cluster = clusters(tmp_path, cli_args(algo, tmp_path, total_timesteps=total, save_interval=2 * sync), nnodes="2")
    a, b = cluster.start("a"), cluster.start("b")
    assert a.finish(timeout=120) == 0, a.output()[-4000:]
    assert b.finish(timeout=30) == 0, b.output()[-4000:]
    summary = summary_of(tmp_path)
    assert summary["world_size"] == 2 and summary["params_in_sync"] is True, summary
    assert summary["global_step"] == total and summary["iteration"] == total // (2 * steps_per_iteration(algo))
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["a.log", "b.log", "run"]
    state = checkpoint(tmp_path)
    assert state["world_size"] == 2 and len(state["ranks"]) == 2 and state["global_step"] == total
    assert logged_steps(tmp_path / "run") == [2 * steps_per_iteration(algo) * sync * i for i in range(1, 7)]


# --------------------------------------------------------------------------------------------
# 2. a node dies, 3. a node joins
# --------------------------------------------------------------------------------------------
# On ppo alone: the elastic agents' re-rendezvous, resume and restart are common/'s. What a world-size change does to an
# off-policy script's replay buffers (they stay behind, the updates wait for --learning-starts steps again) is held for
# td3 and sac by tests/test_scripts.py's two-process resume, which resumes a two-process checkpoint in one process.
@pytest.mark.parametrize("algo", ["ppo"])
def test_a_node_dies_and_a_new_one_joins(algo, tmp_path, clusters):
    """`--nnodes 1:2 --max-restarts 3`: kill -9 of one node (agent and worker) mid-run. The
    survivor's worker leaves the broken collective in seconds (its peer's sockets close; the
    600 s --dist-timeout is not what ends it), its agent re-rendezvous alone, and the run resumes
    from last.pt at world size 1, having lost only the steps since that save. Then a new node
    joins: the group restarts at world size 2 from last.pt and finishes at --total-timesteps,
    with one TensorBoard curve."""
    sync, per_rank = CONTRACT[algo]["sync"], steps_per_iteration(algo)
    save_every = 4 * sync
    total = 2 * per_rank * sync * 40
    cluster = clusters(
        tmp_path,
        cli_args(algo, tmp_path, total_timesteps=total, save_interval=save_every, dist_timeout=600.0),
        nnodes="1:2",
        restarts=3,
        step_seconds=0.01 if algo == "ppo" else 0.04,
    )
    a, b = cluster.start("a"), cluster.start("b")
    run_dir, last = tmp_path / "run", tmp_path / "run" / "checkpoints" / "last.pt"
    a.wait_for(
        lambda: last.is_file() and last_step(run_dir) > checkpoint(tmp_path)["global_step"],
        timeout=120,
        what="steps logged after the first checkpoint",
    )
    assert checkpoint(tmp_path)["world_size"] == 2
    survivor = a.workers()[0]
    t_kill = time.time()
    b.kill()  # the whole node: its agent and its worker
    wait_until(lambda: not alive(survivor), timeout=60, what="the survivor's worker to leave the broken collective")
    left_after = time.time() - t_kill
    saved, reached = checkpoint(tmp_path)["global_step"], last_step(run_dir)

    # the survivor's agent re-rendezvous with itself alone and resumes at world size 1
    a.wait_for(
        lambda: "notice: checkpoint from 2 process(es)" in a.output(), timeout=60, what="the resume at world size 1"
    )
    resumed_after = time.time() - t_kill
    assert f"resumed from {last} at iteration" in a.output() and f"global step {saved}" in a.output()
    if algo == OFF_POLICY:  # each rank's replay buffer holds its own envs' transitions: none fits a world of 1
        assert "notice: the checkpoint's replay buffers belong to 2 process(es) x 8 envs" in a.output()
    a.wait_for(lambda: checkpoint(tmp_path)["world_size"] == 1, timeout=60, what="a checkpoint at world size 1")

    # a new node joins: the group restarts at world size 2 from last.pt (saved when the agent stops its workers)
    c = cluster.start("c")
    assert a.finish(timeout=180) == 0, a.output()[-4000:]
    assert c.finish(timeout=30) == 0, c.output()[-4000:]
    assert "notice: checkpoint from 1 process(es)" in a.output() + c.output()
    summary = summary_of(tmp_path)
    assert (
        summary["world_size"] == 2 and summary["params_in_sync"] is True and summary["stop_reason"] == "total_timesteps"
    )
    # at the end no whole iteration of the world of 2 fits: after steps of a world of 1 that can leave one of 1 undone
    assert total - 2 * per_rank * sync < summary["global_step"] <= total, summary["global_step"]
    assert_one_curve(run_dir, summary["global_step"])
    if algo == OFF_POLICY:  # updates resumed once the refilled buffers held --learning-starts steps again
        losses = [step for step, _ in scalars(run_dir)["losses/q_loss"]]
        assert losses[-1] == summary["global_step"] and max(losses) > saved
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "a.log",
        "b.log",
        "c.log",
        "run",
    ]
    # what the dead node cost: the steps since the last save, at most one save interval of the world of 2
    assert 0 <= reached - saved <= save_every * 2 * per_rank, (saved, reached)
    assert left_after < 30, f"the survivor's worker took {left_after:.1f}s to leave the collective"
    print(
        f"\nsurvivor's worker exited {left_after:.1f}s after the kill, resumed at world size 1 after "
        f"{resumed_after:.1f}s; lost {reached - saved} steps"
    )


# The torchrun agents' own log lines (glog format: "E1127 18:56:42.145000 PID file:line] ..."). When the agent that
# hosts the rendezvous store leaves first, the other agent's exit barrier logs a DistNetworkError with its traceback
# there and still exits 0: torch elastic's teardown, not the run's. The scripts never write such lines.
AGENT_LOG = re.compile(r"^[EWI]\d{4} \d\d:\d\d:\d\d\.\d+ .*$", re.MULTILINE)


def without_agent_log(text: str) -> str:
    return AGENT_LOG.sub("", text)


# --------------------------------------------------------------------------------------------
# 4. preemption of one node
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["ppo"])
def test_sigusr1_to_one_node_stops_every_rank_and_a_relaunch_resumes(algo, tmp_path, clusters):
    """SIGUSR1 to the worker of one node only (not rank 0): the ranks agree to stop after the same
    iteration, rank 0 writes last.pt with both ranks' state, every process exits 0. A relaunch of
    both agents with --resume auto (as a requeued SLURM job does) finishes the run."""
    sync, per_rank = CONTRACT[algo]["sync"], steps_per_iteration(algo)
    total = 2 * per_rank * sync * 40
    args = cli_args(algo, tmp_path, total_timesteps=total, save_interval=10_000, resume="auto")
    first = clusters(tmp_path / "1", args, nnodes="2", rdzv_id="slurm-job-7", step_seconds=0.01)
    (tmp_path / "1").mkdir()
    a, b = first.start("a"), first.start("b")
    a.wait_for(lambda: last_step(tmp_path / "run") > 0, timeout=120, what="training to start")
    workers = a.workers() + b.workers()
    not_main = next(pid for pid in workers if rank_of(pid) != 0)
    os.kill(not_main, signal.SIGUSR1)
    assert a.finish(timeout=60) == 0, a.output()[-4000:]
    assert b.finish(timeout=30) == 0, b.output()[-4000:]
    stopped = summary_of(tmp_path)
    assert stopped["stop_reason"].startswith("signal:") and stopped["global_step"] < total, stopped
    assert stopped["world_size"] == 2 and stopped["params_in_sync"] is True  # finish() is a collective: same iteration
    state = checkpoint(tmp_path)
    assert state["global_step"] == stopped["global_step"] and len(state["ranks"]) == 2
    assert "Traceback" not in without_agent_log(a.output() + b.output())

    second = clusters(tmp_path / "2", args, nnodes="2", rdzv_id="slurm-job-7", step_seconds=0.01)
    (tmp_path / "2").mkdir()
    a, b = second.start("a"), second.start("b")
    assert a.finish(timeout=120) == 0, a.output()[-4000:]
    assert b.finish(timeout=30) == 0, b.output()[-4000:]
    assert f"global step {stopped['global_step']}" in a.output() + b.output()
    summary = summary_of(tmp_path)
    assert summary["global_step"] == total and summary["stop_reason"] == "total_timesteps" and summary["params_in_sync"]
    assert_one_curve(tmp_path / "run", total)


# --------------------------------------------------------------------------------------------
# 6. an error on one rank
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo,fault", [("ppo", "raise"), ("ppo", "nan"), (OFF_POLICY, "raise")])
def test_an_error_on_one_rank_ends_every_rank_and_keeps_last_pt(algo, fault, tmp_path, clusters):
    """An exception on one rank, or NaN rewards on one rank only: every rank exits non-zero within
    seconds (the exception: the peer's collective fails as the sockets close; NaN: the guard's
    reduced check fails on every rank at once), and last.pt stays the last good checkpoint."""
    sync, per_rank = CONTRACT[algo]["sync"], steps_per_iteration(algo)
    save_every = 2 * sync
    env_steps_per_iteration = 8 if algo == "ppo" else 1  # env.step calls of one iteration
    after = env_steps_per_iteration * sync * 5 + 1  # the fault comes in the 6th unit, after the save of the 4th
    total = 2 * per_rank * sync * 1000
    cluster = clusters(
        tmp_path,
        cli_args(algo, tmp_path, total_timesteps=total, save_interval=save_every),
        nnodes="2",
        fault=["--fault", fault, "--fault-rank", "1", "--fault-after", str(after)],
    )
    a, b = cluster.start("a"), cluster.start("b")
    codes = [a.finish(timeout=120), b.finish(timeout=60)]
    ended = time.time()
    out = a.output() + b.output()
    assert all(c != 0 for c in codes), (codes, out[-4000:])
    faulted = float(re.search(rf"fault: {fault} on rank 1 at ([0-9.]+)", out).group(1))
    assert ended - faulted < 30, f"the ranks took {ended - faulted:.1f}s to end after the fault"
    if fault == "nan":  # every rank stops on the reduced check, naming the tensor
        assert all("FloatingPointError: non-finite rewards" in n.output() for n in (a, b)), out[-4000:]
    else:
        assert "RuntimeError: injected fault on rank 1" in out
    state = checkpoint(tmp_path)  # loads: intact
    assert state["global_step"] == 2 * per_rank * save_every * 2, state["global_step"]
    assert not (tmp_path / "run" / "summary.json").exists()


# --------------------------------------------------------------------------------------------
# 5. the SLURM script of docs/cluster.md, step by step
# --------------------------------------------------------------------------------------------
PKILL_SHIM = '''#!{python}
"""pkill -SIG -f PATTERN, confined to the processes of this test (they carry SBATCH_TEST in their environment)."""
import os, re, signal, sys
args = sys.argv[1:]
sig = signal.Signals["SIG" + args.pop(0).lstrip("-")]
assert args.pop(0) == "-f"
if args[0] == "--":
    args.pop(0)
pattern, mark, hit = re.compile(args[0]), ("SBATCH_TEST=" + os.environ["SBATCH_TEST"]).encode(), 1
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        env = open(f"/proc/{{pid}}/environ", "rb").read().split(b"\\0")
        cmd = open(f"/proc/{{pid}}/cmdline", "rb").read().rstrip(b"\\0").replace(b"\\0", b" ").decode()
    except OSError:
        continue
    if mark in env and int(pid) != os.getpid() and pattern.search(cmd):
        os.kill(int(pid), sig)
        print(f"pkill: {{sig.name}} to {{pid}}: {{cmd[:80]}}", file=sys.stderr)
        hit = 0
sys.exit(hit)
'''


def sbatch_script() -> str:
    readme = (Path(__file__).resolve().parents[1] / "docs" / "cluster.md").read_text()
    start = readme.index("#!/bin/bash\n#SBATCH")
    return readme[start : readme.index("```", start)]


def test_the_sbatch_script_forwards_usr1_requeues_and_resumes(tmp_path):
    """The sbatch script of docs/cluster.md, run by bash as SLURM would run it on the batch node (one node
    here), with scontrol and srun stubbed: SIGUSR1 to the batch shell (--signal=B:USR1) goes
    through the trap to the training workers, which save and exit 0; torchrun survives it; the
    summary's stop reason makes the script requeue the job; the requeued run (the same script,
    --resume auto) resumes from last.pt, finishes, and does not requeue again.

    Not a real SLURM: its daemons (munge, slurmctld, slurmd) are root services of the machine,
    time limits are whole minutes and --signal is delivered with up to a minute's delay, so one
    preempt-and-requeue cycle would take minutes. What the script itself does is run here."""
    port = free_port()
    script = sbatch_script()
    tiny = (
        "--num-envs 16 --num-steps 8 --num-minibatches 2 --device cpu --no-progress --num-eval-envs 4 "
        "--eval-interval 0 --hidden-sizes 32 32 --total-timesteps 25600"
    )
    for old, new in [
        ("--nproc-per-node 8", "--nproc-per-node 1"),
        ('"$head:29400"', f'"$head:{port}"'),
        ("--save-interval-seconds 900", f"--save-interval-seconds 900 {tiny}"),
    ]:
        assert old in script, f"the sbatch script of docs/cluster.md changed: {old!r} not found"
        script = script.replace(old, new)
    (tmp_path / "train.sbatch").write_text(script)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shims = {
        "scontrol": 'if [ "$1 $2" = "show hostnames" ]; then echo 127.0.0.1; '
        'else echo "$@" >> "$SBATCH_DIR/scontrol"; fi',
        "srun": 'exec "$@"',
        "torchrun": f'exec {sys.executable} -m torch.distributed.run --local-addr 127.0.0.1 "$@"',
    }
    for name, body in shims.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
    (bin_dir / "pkill").write_text(PKILL_SHIM.format(python=sys.executable))
    for shim in bin_dir.iterdir():
        shim.chmod(0o755)
    (tmp_path / "algos").symlink_to(Path(__file__).resolve().parents[1] / "algos")
    env = {
        **node_env(),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SBATCH_TEST": str(port),
        "SBATCH_DIR": str(tmp_path),
        "SLURM_JOB_NODELIST": "node0",
        "SLURM_NNODES": "1",
        "SLURM_JOB_ID": "4242",
    }
    run_dir = tmp_path / "runs" / "ppo-4242"

    def sbatch(log: str) -> Job:
        return Job(["bash", str(tmp_path / "train.sbatch")], tmp_path / log, env=env, cwd=tmp_path)

    try:
        run_sbatch_twice(sbatch, tmp_path, run_dir)
    finally:  # the script's processes, also those a dead torchrun would leave behind
        kill_marked(f"SBATCH_TEST={port}")


def kill_marked(marker: str):
    """SIGKILL every process that carries `marker` in its environment (the test's own, by id)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                os.kill(int(pid), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def run_sbatch_twice(sbatch, tmp_path: Path, run_dir: Path):
    first = sbatch("slurm-1.out")
    first.wait_for(lambda: last_step(run_dir) > 0, timeout=120, what="training to start")
    os.kill(first.proc.pid, signal.SIGUSR1)  # --signal=B:USR1@120: to the batch shell only
    assert first.finish(timeout=60) == 0, first.output()[-4000:]
    out = first.output()
    assert "preempt: saving" in out and "Traceback" not in without_agent_log(out), out[-4000:]
    stopped = summary_of(tmp_path / "runs", "ppo-4242")
    assert stopped["stop_reason"] == "signal:SIGUSR1" and stopped["global_step"] < 25600, stopped
    assert checkpoint(tmp_path / "runs", run_name="ppo-4242")["global_step"] == stopped["global_step"]
    assert (tmp_path / "scontrol").read_text().split("\n")[0] == "requeue 4242"

    second = sbatch("slurm-2.out")  # the requeued job: the same script
    assert second.finish(timeout=120) == 0, second.output()[-4000:]
    assert f"global step {stopped['global_step']}" in second.output()
    summary = summary_of(tmp_path / "runs", "ppo-4242")
    assert summary["stop_reason"] == "total_timesteps" and summary["global_step"] == 25600
    assert (tmp_path / "scontrol").read_text().split() == ["requeue", "4242"], "requeued a finished run"
    assert_one_curve(run_dir, 25600)
