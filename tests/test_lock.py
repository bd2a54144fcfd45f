"""The run directory's lock under races: processes that start at one moment, released together from a barrier (a
file they wait for), and the reproductions of the ways two processes once both wrote one run.

The racing processes import common.lock alone (no torch, no script): a pair starts in a few tens of milliseconds,
so each race runs 25 times. What a whole run does with the lock (a second process stops in one line, a dead one's
lock is taken over, --overwrite takes the lock before it clears) is tried with real runs at the end.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import common.checkpoint
import common.lock
import common.run
from common.lock import LOCK, LockRefused, acquire, release
from tests.helpers import ROOT, Job, subprocess_env
from tests.test_scripts import train, units

ROUNDS = 25

# One contender: waits for the barrier file, takes the lock, says "won" or "lost <the line>", and holds a won lock
# until the release file appears. argv: run_dir barrier release delay (seconds slept between judging a lock and
# acting on it: the window of the stale-lock race, widened as the reproduction of the race did).
CONTENDER = r"""
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[5])
import common.lock as lock
assert "torch" not in sys.modules
run_dir, barrier, release, delay = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4])
if delay:
    judge = lock._judge
    def slow(*args, **kwargs):
        verdict = judge(*args, **kwargs)
        time.sleep(delay)
        return verdict
    lock._judge = slow
print("ready", flush=True)
while not barrier.exists():
    time.sleep(0.0002)
try:
    held = lock.acquire(run_dir, say=lambda line: None)
except lock.LockRefused as e:
    print("lost", e, flush=True)
    sys.exit(3)
print("won", flush=True)
while not release.exists():
    time.sleep(0.005)
lock.release(held)
"""


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped) on this host."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def stale_lock(run_dir: Path, kind: str, job: str | None) -> None:
    """A lock whose holder is gone: a dead process of this host, or a node silent past LOCK_STALE_SECONDS."""
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"host": socket.gethostname(), "pid": dead_pid(), "started": None, "job": job, "since": "then"}
    if kind == "lost node":
        record.update(host="node-7", pid=4242)
    (run_dir / LOCK).write_text(json.dumps(record))
    if kind == "lost node":
        then = time.time() - common.lock.LOCK_STALE_SECONDS - 60
        os.utime(run_dir / LOCK, (then, then))


def race(tmp: Path, job: str | None, delay: float = 0.0, stale: str | None = None) -> tuple[list[str], dict]:
    """Two contenders released from one barrier on `tmp`/run (fresh, or with a `stale` lock); returns what each said
    and the lock's record while the winner holds it."""
    run_dir, barrier, done = tmp / "run", tmp / "go", tmp / "done"
    run_dir.mkdir(parents=True)
    if stale:
        stale_lock(run_dir, stale, f"{job}/0" if job else "another-job/0")
    env = subprocess_env()
    env.pop("TORCHELASTIC_RUN_ID", None)
    env.pop("SLURM_RESTART_COUNT", None)
    if job:
        env["TORCHELASTIC_RUN_ID"] = job
    argv = [sys.executable, "-S", "-c", CONTENDER, str(run_dir), str(barrier), str(done), str(delay), str(ROOT)]
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        assert [p.stdout.readline().strip() for p in procs] == ["ready", "ready"]
        barrier.touch()
        said = [p.stdout.readline().strip() for p in procs]
        record = json.loads((run_dir / LOCK).read_text())
        done.touch()
        codes = [p.wait(timeout=30) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    winners = [p.pid for p, s in zip(procs, said) if s == "won"]
    assert sorted(codes) == [0, 3], (codes, said)
    assert winners == [record["pid"]], (said, record)
    assert os.listdir(run_dir) == [], f"left behind: {os.listdir(run_dir)}"  # no marker, no temporary file, no lock
    return said, record


@pytest.mark.parametrize("job", [None, "myjob"], ids=["other jobs", "one job"])
def test_two_processes_that_start_at_once_on_a_fresh_run_directory_one_wins(tmp_path, job):
    """25 times: two processes released from one barrier on a fresh run directory; exactly one holds the lock and
    the other stops with the one line that names it. With one job id (two launches that share --rdzv-id, the
    reproduction of a live holder whose lock was taken over) the line says so."""
    for i in range(ROUNDS):
        said, record = race(tmp_path / str(i), job)
        (lost,) = [s for s in said if s.startswith("lost")]
        assert lost.startswith(f"lost error: another process trains {tmp_path / str(i) / 'run'}: pid {record['pid']} ")
        assert ("It has this process's job id (myjob/0)" in lost) == (job is not None), lost


@pytest.mark.parametrize("stale", ["dead holder", "lost node"])
@pytest.mark.parametrize("job", [None, "myjob"], ids=["other jobs", "one job"])
def test_two_processes_that_take_one_stale_lock_over_at_once_one_wins(tmp_path, job, stale):
    """25 times: a lock whose holder is gone (a dead process on this host, a node silent past the limit), of another
    job or of the contenders' own (an earlier worker group), and two processes released from one barrier to take it
    over: exactly one does; the other stops in one line naming the winner."""
    for i in range(ROUNDS):
        said, record = race(tmp_path / str(i), job, stale=stale)
        assert record["job"] == (f"{job}/0" if job else None) and record["host"] == socket.gethostname()
        (lost,) = [s for s in said if s.startswith("lost")]
        assert f": pid {record['pid']} on host {socket.gethostname()} since " in lost


@pytest.mark.parametrize("job", [None, "myjob"], ids=["other jobs", "one job"])
def test_the_stale_lock_race_widened_by_a_delay_still_has_one_winner(tmp_path, job):
    """The reproduction of two processes that both took one stale lock over: each sleeps 0.3 s between judging the
    lock stale and acting on it, so both judge it before either acts. One wins; the other, when it acts, finds the
    record it judged gone and stops at the winner's live lock."""
    for i in range(5):
        said, _ = race(tmp_path / str(i), job, delay=0.3, stale="dead holder")
        assert sorted(s.split()[0] for s in said) == ["lost", "won"]


# --------------------------------------------------------------------------------------------
# the lock in one process: a job's own holder on another host, a lost lock, what is left behind
# --------------------------------------------------------------------------------------------
def write_record(run_dir: Path, age: float, **fields) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"host": socket.gethostname(), "pid": os.getpid(), "started": None, "job": None, "since": "then"}
    (run_dir / LOCK).write_text(json.dumps({**record, **fields}))
    os.utime(run_dir / LOCK, (time.time() - age, time.time() - age))


@pytest.fixture
def short_lock(monkeypatch):
    """The lock's times in seconds instead of minutes; this process a worker of torchrun's job "myjob"."""
    monkeypatch.setattr(common.lock, "LOCK_STALE_SECONDS", 1.5)
    monkeypatch.setattr(common.lock, "LOCK_HEARTBEAT_SECONDS", 0.2)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "myjob")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)


def test_this_jobs_lock_on_another_host_is_taken_once_its_heartbeat_stops(tmp_path, short_lock):
    """Rank 0 restarted on another host cannot see the earlier holder's pid: it waits until the holder's heartbeat
    is LOCK_STALE_SECONDS old, then takes the lock over. A holder whose heartbeat goes on lives: refused."""
    said = []
    write_record(tmp_path / "a", age=0.5, host="node-7", pid=4242, job="myjob/0")
    t0 = time.monotonic()
    held = acquire(tmp_path / "a", said.append)
    waited = time.monotonic() - t0
    release(held)
    assert 0.8 < waited < 5, waited
    assert said[0].startswith(f"notice: {tmp_path / 'a'} is locked by pid 4242 on host node-7, of this job")
    assert said[1].startswith(f"notice: {tmp_path / 'a'} was locked by pid 4242 on host node-7, silent for ")

    write_record(tmp_path / "b", age=0, host="node-7", pid=4242, job="myjob/0")
    beating = threading.Event()

    def beat():
        while not beating.wait(0.1):
            os.utime(tmp_path / "b" / LOCK)

    thread = threading.Thread(target=beat)
    thread.start()
    try:
        with pytest.raises(LockRefused, match=r"^error: another process trains .*: pid 4242 on host node-7 since "):
            acquire(tmp_path / "b", said.append)
    finally:
        beating.set()
        thread.join()


def test_a_process_whose_lock_was_taken_writes_no_checkpoint(tmp_path, short_lock, capsys):
    """Another process holds the lock now (it judged this one gone, e.g. after a long stall of its heartbeat): the
    heartbeat finds out, warns, and the run's next checkpoint stops it with one line instead of a second writer."""
    held = acquire(tmp_path, print)
    write_record(tmp_path, age=0, host="node-7", pid=4242)
    deadline = time.time() + 5
    while held.lost is None and time.time() < deadline:
        time.sleep(0.05)
    assert held.lost is not None and held.lost.startswith(
        f"error: {tmp_path / LOCK} is held by pid 4242 on host node-7"
    )
    assert "warning: " in capsys.readouterr().err
    run = common.run.Run(args=None, algo="ppo", rank=0, world_size=1, device=None, is_main=True, lock=held)
    assert common.lock.lock_lost(run) == held.lost
    with pytest.raises(SystemExit, match="writes no more checkpoints"):
        common.checkpoint.save(run, ["last.pt"], _NoState(), None)
    release(held)
    assert (tmp_path / LOCK).is_file()  # the other's, left in place


class _NoState:
    """Enough of a TrainingState for save() to reach its first write."""

    class envs:
        @staticmethod
        def state_dict():
            return {}

    per_rank: dict = {}
    save_buffer = False


def test_an_abandoned_takeover_is_no_obstacle(tmp_path):
    """A taker that died between creating its takeover marker and removing it (a few milliseconds) leaves the marker:
    the next taker of the same stale lock clears it (its taker's pid is dead) and takes the lock."""
    stale_lock(tmp_path, "dead holder", None)
    seen = common.lock._read(tmp_path / LOCK)
    digest = __import__("hashlib").sha256(repr(seen.identity).encode()).hexdigest()[:16]
    marker = tmp_path / f"{LOCK}.takeover.{digest}"
    marker.write_text(json.dumps({"host": socket.gethostname(), "pid": dead_pid(), "started": None}))
    said = []
    held = acquire(tmp_path, said.append)
    assert said == [
        f"notice: {tmp_path} was locked by pid {json.loads(seen.data)['pid']} on host "
        f"{socket.gethostname()}, which no longer runs: lock taken over"
    ]
    release(held)
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------------------------
# whole runs: a live holder of the same job id, and --overwrite against a run that starts in its window
# --------------------------------------------------------------------------------------------
@pytest.fixture
def jobs():
    started = []
    yield lambda cmd, log, env=None: started.append(Job(cmd, log, env=env)) or started[-1]
    for job in started:
        job.kill()


def test_a_second_launch_with_the_same_job_id_stops_while_the_first_trains(tmp_path, jobs, monkeypatch):
    """The reproduction: two processes started with TORCHELASTIC_RUN_ID=myjob on one run directory. The second one
    once took the first's lock over as an earlier worker group's while the first still trained; now it stops in one
    line and writes nothing."""
    from tests.test_scripts import cli_args

    env = {**subprocess_env(), "TORCHELASTIC_RUN_ID": "myjob"}
    args = cli_args("ppo", tmp_path, total_timesteps=units("ppo", 100_000), save_interval=1)
    first = jobs([sys.executable, *args], tmp_path / "first.log", env)
    run_dir = tmp_path / "run"
    first.wait_for((run_dir / "checkpoints" / "last.pt").is_file, what="the first checkpoint")
    # what the second launch could write: a file of its own, or one of the run's but the lock and the event file the
    # first one goes on writing (its flushes move that file's time; they are the first's, not the second's)
    files = lambda: {
        p: None if ".tfevents." in p.name else p.stat().st_mtime_ns
        for p in run_dir.iterdir()
        if p.is_file() and p.name != LOCK
    }
    before = files()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "myjob")
    with pytest.raises(SystemExit, match=rf"^error: another process trains {run_dir}: pid {first.proc.pid} on host "):
        train("ppo", tmp_path, total_timesteps=units("ppo", 100_000))  # a later launch of the job: --resume auto
    assert json.loads((run_dir / LOCK).read_text())["pid"] == first.proc.pid
    assert files() == before
    assert first.proc.poll() is None, "the first process stopped"


def test_overwrite_takes_the_lock_before_it_clears_and_spares_a_run_that_starts_in_its_window(
    tmp_path, jobs, monkeypatch
):
    """--overwrite clears the run directory only once it holds the lock itself. A run that starts while the
    --overwrite is on its way to the lock (here: a resume of the run, started from inside that window) takes the lock
    first: the --overwrite stops in one line and that run loses no file; it trains on and finishes. An --overwrite
    that holds the lock clears everything of the old run but the lock."""
    from tests.test_scripts import cli_args

    run_dir = tmp_path / "run"
    train("ppo", tmp_path, total_timesteps=units("ppo", 2), save_interval=1)
    (run_dir / "notes.txt").write_text("an old file")
    real_take_lock, window = common.run.take_lock, {}

    def take_lock_late(run):  # the window: the start's way to its lock (open_run takes it first thing)
        args = cli_args("ppo", tmp_path, total_timesteps=units("ppo", 40), save_interval=1, resume="auto")
        window["job"] = jobs([sys.executable, *args], tmp_path / "resumed.log")
        window["job"].wait_for(
            lambda: (
                (run_dir / LOCK).is_file() and json.loads((run_dir / LOCK).read_text())["pid"] == window["job"].proc.pid
            ),
            what="the resumed run's lock",
        )
        return real_take_lock(run)

    monkeypatch.setattr(common.run, "take_lock", take_lock_late)
    with pytest.raises(SystemExit, match=rf"^error: another process trains {run_dir}: pid \d+ "):
        train("ppo", tmp_path, total_timesteps=units("ppo", 4), overwrite=True)
    resumed = window["job"]
    assert resumed.finish(timeout=240) == 0, resumed.output()[-3000:]
    assert "resumed from" in resumed.output()
    assert (run_dir / "notes.txt").read_text() == "an old file"
    assert json.loads((run_dir / "summary.json").read_text())["global_step"] == units("ppo", 40)

    monkeypatch.setattr(common.run, "take_lock", real_take_lock)
    summary = train("ppo", tmp_path, total_timesteps=units("ppo", 1), overwrite=True)
    assert summary["global_step"] == units("ppo", 1) and not (run_dir / "notes.txt").exists()
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1  # the old run's event files went too


def test_a_heartbeat_dated_in_the_future_is_judged_by_its_change(tmp_path, short_lock):
    """Another host's clock an hour ahead: its heartbeat's age is negative, never stale by age. A record whose mtime
    does not move for LOCK_STALE_SECONDS is taken over; one that moves lives (refused)."""
    said = []
    write_record(tmp_path / "a", age=-3600, host="node-7", pid=4242, job="other/0")
    t0 = time.monotonic()
    held = acquire(tmp_path / "a", said.append)
    waited = time.monotonic() - t0
    release(held)
    assert 1.4 < waited < 5, waited
    assert "dated 3600 s ahead of this host's clock" in said[0]
    assert said[-1].startswith(f"notice: {tmp_path / 'a'} was locked by pid 4242 on host node-7, whose heartbeat")

    write_record(tmp_path / "b", age=-3600, host="node-7", pid=4242, job="other/0")
    beating = threading.Event()

    def beat():  # the holder lives: its own clock, an hour ahead, moves the mtime
        while not beating.wait(0.1):
            ahead = time.time() + 3600
            os.utime(tmp_path / "b" / LOCK, (ahead, ahead))

    thread = threading.Thread(target=beat)
    thread.start()
    try:
        with pytest.raises(LockRefused, match=r"its heartbeat moves .*: it lives"):
            acquire(tmp_path / "b", said.append)
    finally:
        beating.set()
        thread.join()


def test_the_refusal_of_a_live_holder_on_another_host_says_when_to_run_again(tmp_path, monkeypatch):
    write_record(tmp_path / "a", age=20, host="node-7", pid=4242, job="other/0")
    with pytest.raises(LockRefused) as refused:
        acquire(tmp_path / "a", print)
    assert str(refused.value).endswith(f"run this command again in {common.lock.LOCK_STALE_SECONDS - 20 + 1:.0f} s")


def test_a_lock_file_deleted_by_hand_is_written_again_and_one_taken_meanwhile_is_said_so(tmp_path, short_lock, capsys):
    """`.lock` deleted by hand while its process trains: the heartbeat writes it again (exclusively) and warns that it
    was deleted; this process keeps the run. Deleted and created by another process before the heartbeat looks: the
    warning names that process and says what happened to the file, not that the other judged this one gone."""
    held = acquire(tmp_path, print)
    (tmp_path / LOCK).unlink()
    deadline = time.time() + 5
    while not (tmp_path / LOCK).exists() and time.time() < deadline:
        time.sleep(0.05)
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid() and held.lost is None
    err = capsys.readouterr().err
    assert f"warning: {tmp_path / LOCK} was deleted while this process held it (by hand?): written again" in err, err
    release(held)
    assert not (tmp_path / LOCK).exists()

    held = acquire(tmp_path, print)
    (tmp_path / LOCK).unlink()
    write_record(tmp_path, age=0, host="node-7", pid=4242)
    deadline = time.time() + 5
    while held.lost is None and time.time() < deadline:
        time.sleep(0.05)
    assert held.lost == (
        f"error: {tmp_path / LOCK} is held by pid 4242 on host node-7 now, not by this process (its file was deleted "
        f"or taken over since this process took it): this process writes no more checkpoints to {tmp_path}, so that "
        "the run keeps one writer"
    )
    release(held)
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == 4242  # the other's, left in place


def test_a_same_host_heartbeat_dated_in_the_future_is_not_a_negative_age(tmp_path):
    """A live holder on this host whose heartbeat is dated an hour ahead (a clock set back, a file touched by hand):
    the refusal says so, not "heartbeat -3600 s ago"."""
    write_record(tmp_path / "a", age=-3600)  # this process: alive
    error = common.lock.lock_error(tmp_path / "a")
    assert "(its heartbeat dated 3600 s ahead of this host's clock); one run has one writer" in error, error
    assert "heartbeat -" not in error
    write_record(tmp_path / "b", age=7)
    assert "(its heartbeat 7 s ago); one run has one writer" in common.lock.lock_error(tmp_path / "b")
