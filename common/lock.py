"""One run, one writer: the run directory's lock, taken by rank 0 of a training run for the process's life."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

from common.record import Run

# Rank 0 of a training run holds {run_dir}/.lock for the process's life: a JSON record of its holder (host, pid,
# the pid's start time, the torchrun job) whose mtime is a heartbeat that a thread refreshes. Not flock(): the
# kernel would release it when its holder dies, as a lock should, but on a cluster's shared filesystem flock is
# node-local or refused (Lustre without -o flock, some NFS mounts), so two nodes could both hold it. The record
# works wherever the run directory is shared, and a reader judges its holder by what it can know: on the same host,
# whether that pid still runs with the same start time (not a reused pid), which sees a kill -9 at once; on
# another host, whether the heartbeat is fresh (a lost node stops beating; a cluster's clocks agree to seconds,
# far below LOCK_STALE_SECONDS). Workers that torchrun restarts (new pids, the same job) take over their own job's
# lock: the job is torchrun's run id (--rdzv-id) with SLURM's restart count, so a requeued SLURM job whose old
# instance still runs is a second process, not a restart.
LOCK = ".lock"
LOCK_HEARTBEAT_SECONDS = 15.0
LOCK_STALE_SECONDS = 120.0  # eight missed heartbeats: the holder on another host is gone


def _job() -> str | None:
    """The torchrun job this process is a worker of (the same across its restarts), or None outside torchrun."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None:
        return None
    if run_id in ("", "none"):  # static rendezvous: one launcher, the workers' parent, restarts them
        run_id = f"{socket.gethostname()}-{os.getppid()}"
    return f"{run_id}/{os.environ.get('SLURM_RESTART_COUNT', '0')}"


def _process(pid: int) -> tuple[bool, int | None]:
    """Whether process `pid` runs on this host (a zombie does not), and its start time (clock ticks since boot;
    None where /proc cannot tell)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False, None
    except PermissionError:
        pass  # another user's process: it runs
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0] != "Z", int(fields[19])
    except (OSError, ValueError, IndexError):
        return True, None


def _lock_record() -> dict:
    """This process as a lock's holder."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": _process(os.getpid())[1],
        "job": _job(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }


def _read_lock(path: Path) -> tuple[dict | None, float]:
    """The lock's record and the time of its last heartbeat; (None, 0) when there is no lock, ({}, time) when it
    cannot be read as one."""
    try:
        mtime = path.stat().st_mtime
        record = json.loads(path.read_text())
        return (record if isinstance(record, dict) else {}), mtime
    except FileNotFoundError:
        return None, 0.0
    except (OSError, ValueError):
        return {}, 0.0


def _judge_lock(run_dir: Path, record: dict | None, heartbeat: float) -> tuple[str | None, str | None]:
    """(error, notice) for a process that would train `run_dir`, whose lock holds `record`: the one-line error when a
    live process of another job holds it; else the notice that says whose lock it takes over (None: no lock)."""
    if record is None:
        return None, None
    mine = _lock_record()
    host, pid = record.get("host"), record.get("pid")
    who = f"pid {pid} on host {host}"
    if not record or not isinstance(pid, int):
        return None, f"notice: {run_dir / LOCK} is not a lock this code wrote: taken over"
    if record.get("job") is not None and record.get("job") == mine["job"]:
        return None, f"notice: the lock of {run_dir} taken over from an earlier worker group of this job ({who})"
    age = time.time() - heartbeat
    if host == mine["host"]:
        runs, started = _process(pid)
        reused = None not in (started, record.get("started")) and started != record.get("started")  # another process
        if not runs or reused:
            return None, f"notice: {run_dir} was locked by {who}, which no longer runs: lock taken over"
    elif age > LOCK_STALE_SECONDS:
        return None, f"notice: {run_dir} was locked by {who}, silent for {age:.0f} s (a lost node): lock taken over"
    here = host == mine["host"]
    return (
        f"error: another process trains {run_dir}: {who} since {record.get('since')} (its heartbeat {age:.0f} s "
        f"ago); one run has one writer. Stop it (kill -TERM {pid}{'' if here else ' on ' + str(host)}: it saves "
        f"last.pt and exits) or let it end, then continue with --resume auto; or start another run with "
        f"--run-name NAME"
        + (
            ""
            if here
            else f". If {host} is lost, its lock is taken over {LOCK_STALE_SECONDS:.0f} s after its last heartbeat"
        )
    ), None


def lock_error(run_dir: Path) -> str | None:
    """The one-line error when a live process of another job trains `run_dir`, else None. Writes nothing."""
    return _judge_lock(run_dir, *_read_lock(run_dir / LOCK))[0]


def take_lock(run: Run) -> str | None:
    """Rank 0: take the run directory's lock (a stale one, or this job's, with a notice) and start its heartbeat.
    Returns the error line when a live process of another job holds it, else None."""
    path, mine = run.run_dir / LOCK, _lock_record()
    tmp = path.with_name(f"{LOCK}.{mine['host']}.{mine['pid']}.tmp")
    try:
        tmp.write_text(json.dumps(mine))
        try:
            _create_from(tmp, path)
        except FileExistsError:
            error, notice = _judge_lock(run.run_dir, *_read_lock(path))
            if error:
                return error
            if notice:
                run.say(notice)
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    held, heartbeat = _read_lock(path)
    if held != mine:  # another process took a stale lock over at the same moment, and its rename came last
        return _judge_lock(run.run_dir, held, heartbeat)[0] or f"error: another process took the lock {path} over"
    stop = threading.Event()

    def heartbeat_loop():
        while not stop.wait(LOCK_HEARTBEAT_SECONDS):
            try:
                held = _read_lock(path)[0]
                if held != mine:
                    print(
                        f"warning: {path} is held by pid {(held or {}).get('pid')} on host {(held or {}).get('host')} "
                        f"now, not by this process: two processes may write {run.run_dir}",
                        file=sys.stderr,
                        flush=True,
                    )
                    return
                os.utime(path)
            except OSError:
                pass  # a full or flaky disk: the next beat tries again

    beating = threading.Thread(target=heartbeat_loop, name="run directory lock", daemon=True)
    beating.start()
    run.lock = (path, mine, stop, beating)
    return None


def _create_from(tmp: Path, path: Path) -> None:
    """Create `path` with the content of `tmp`, or raise FileExistsError: a hard link (atomic, NFS included), or
    an exclusive create where the filesystem has no hard links (some FUSE and SMB mounts)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:
        with open(path, "x") as f:
            f.write(tmp.read_text())


def release_lock(run: Run) -> None:
    """Stop the heartbeat and remove the lock, if it is still this process's."""
    if run.lock is None:
        return
    (path, mine, stop, beating), run.lock = run.lock, None
    stop.set()
    # joined, not left to the interpreter's exit: a daemon thread still waking up while the process finalizes can
    # abort it ("terminate called without an active exception") after everything was written
    beating.join(timeout=LOCK_HEARTBEAT_SECONDS)
    if _read_lock(path)[0] == mine:
        path.unlink(missing_ok=True)
