"""One run, one writer: the run directory's lock, taken by rank 0 of a training run for the process's life (`acquire`,
a heartbeat thread, `release`; a live holder: LockRefused). No torch import: the race tests start hundreds of
processes that import this module alone."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from common.record import Run

# The lock is a JSON record of its holder (host, pid, the pid's start time, the torchrun job) whose mtime is a heartbeat
# that a thread refreshes. Not flock(): on a cluster's shared filesystem flock is node-local or refused (Lustre
# without -o flock, some NFS mounts), so two nodes could both hold it. A reader judges the holder by what it can know:
# on the same host, whether that pid still runs with the same start time (not a reused pid), which sees a kill -9 at
# once; on another host, whether the heartbeat is fresh (a lost node stops beating; a cluster's clocks agree to
# seconds, far below LOCK_STALE_SECONDS).
#
# Every change of hands is one atomic system call (NFS too), so of processes that try at once exactly one wins:
# - a lock is created by link(2) of a complete temporary record onto .lock, which fails where .lock exists (an
#   exclusive open(O_CREAT|O_EXCL) where the filesystem has no hard links);
# - a stale lock is taken over in three steps, each exclusive: the takers of one stale record create its marker
#   (.lock.takeover.<digest of the record>, O_EXCL: one taker at a time); the one that holds it checks that the
#   record is still there, renames it to a unique name (the renamed file is checked to be the judged one, and put
#   back if it is not) and creates .lock exclusively, which a process that starts at that moment may win instead.
#
# A lock file deleted while its holder lives (by hand) is written again by the holder's heartbeat, exclusively: a
# process that created one in between keeps it, and the holder writes no more checkpoints (Lock.lost).
#
# A torchrun restart (new pids, the same job: --rdzv-id with SLURM's restart count) proves its earlier holder gone as
# anyone does: torchrun stops the earlier workers first, so on the same host their pids are dead; on another host
# rank 0 waits until the heartbeat is LOCK_STALE_SECONDS old. Two launches sharing a job id (one --rdzv-id for two
# SLURM job steps) are two writers: the second stops. A requeued SLURM job has another restart count: another job.
LOCK = ".lock"
LOCK_HEARTBEAT_SECONDS = 15.0
LOCK_STALE_SECONDS = 120.0  # eight missed heartbeats: the holder on another host is gone
WRITING_SECONDS = 5.0  # an empty lock younger than this is being written (the exclusive create without hard links)
TAKEOVER_SECONDS = 30.0  # a takeover's marker this old on another host was left by a taker that died in its window
_names = itertools.count()


class LockRefused(RuntimeError):
    """A live process holds the run directory's lock: the message is the one line that names it and what to do."""


@dataclass
class Lock:
    """A lock this process holds: its file, its record as written, and the heartbeat's thread."""

    path: Path
    data: bytes
    stop: threading.Event
    beating: threading.Thread | None = None
    lost: str | None = None  # set by the heartbeat when another process holds the file now: the one-line error
    vanished: bool = False  # the heartbeat found the run directory itself gone (common.run saves what it holds)


@dataclass(frozen=True)
class _Seen:
    """A lock file as read once: its bytes, what tells it from any other file (device, inode, bytes), its mtime."""

    data: bytes
    identity: tuple
    mtime: float


@dataclass(frozen=True)
class _Verdict:
    error: str | None = None  # a live holder: the one line
    notice: str | None = None  # a holder that is gone: whose lock is taken over
    wait: str | None = None  # not known yet (a record being written, this job's holder on another host): look again


def _job() -> str | None:
    """The torchrun job this process is a worker of (the same across its restarts), or None outside torchrun."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None:
        return None
    if run_id in ("", "none"):  # static rendezvous: one launcher, the workers' parent, restarts them
        run_id = f"{socket.gethostname()}-{os.getppid()}"
    return f"{run_id}/{os.environ.get('SLURM_RESTART_COUNT', '0')}"


def _process(pid: int) -> tuple[bool, int | None]:
    """Whether process `pid` runs on this host (a zombie does not), and its start time (clock ticks since boot,
    field 22 of /proc/<pid>/stat; None where /proc cannot tell)."""
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


def _gone(record: dict) -> bool:
    """Whether the process of `record`, on this host, has ended (or its pid now belongs to another process)."""
    runs, started = _process(record["pid"])
    return not runs or None not in (started, record.get("started")) and started != record.get("started")


def _lock_record() -> dict:
    """This process as a lock's holder."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": _process(os.getpid())[1],
        "job": _job(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }


def _read(path: Path) -> _Seen | None:
    """The file at `path` as read once (its stat and bytes from the same open file), or None when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        st, chunks = os.fstat(fd), []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    return _Seen(data, (st.st_dev, st.st_ino, data), st.st_mtime)


def _parse(data: bytes) -> dict:
    try:
        record = json.loads(data)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _judge(run_dir: Path, seen: _Seen, patient: bool = True, still: tuple[float, float] | None = None) -> _Verdict:
    """Whether the holder of the lock `seen` is gone (notice), lives (error), or cannot be told yet (wait: a record
    being written; this job's holder on another host, while `patient` and its heartbeat is not yet stale; a heartbeat
    dated in the future, until it moves or stays put).

    `still` (the mtime this process first saw, how many seconds ago on its own monotonic clock) judges a heartbeat
    that another host's clock dates ahead of this one's: its age says nothing, its change does. It moves: the holder
    lives; it stays put for LOCK_STALE_SECONDS: the holder is gone, whatever the clocks say."""
    record, age, mine = _parse(seen.data), time.time() - seen.mtime, _lock_record()
    host, pid = record.get("host"), record.get("pid")
    who = f"pid {pid} on host {host}"
    if not record or not isinstance(pid, int) or pid <= 0:
        if not seen.data and age < WRITING_SECONDS:
            return _Verdict(wait="a lock being written")
        return _Verdict(notice=f"notice: {run_dir / LOCK} is not a lock this code wrote: taken over")
    same_job = record.get("job") is not None and record.get("job") == mine["job"]
    here = host == mine["host"]
    if here and _gone(record):
        if same_job:
            return _Verdict(
                notice=f"notice: the lock of {run_dir} taken over from an earlier worker group of this job ({who}, "
                "which no longer runs)"
            )
        return _Verdict(notice=f"notice: {run_dir} was locked by {who}, which no longer runs: lock taken over")
    ahead = not here and age < -WRITING_SECONDS  # the other host's clock is ahead: its heartbeat's age is negative
    moved = still is not None and still[0] != seen.mtime
    if ahead and not moved:
        if still is not None and still[1] > LOCK_STALE_SECONDS:
            return _Verdict(
                notice=f"notice: {run_dir} was locked by {who}, whose heartbeat (dated {-age:.0f} s ahead of this "
                f"host's clock) has not moved for {still[1]:.0f} s (a lost node): lock taken over"
            )
        return _Verdict(
            wait=f"notice: {run_dir} is locked by {who}, whose heartbeat is dated {-age:.0f} s ahead of this host's "
            f"clock: watching it for up to {LOCK_STALE_SECONDS:.0f} s (a holder that moves it lives)"
        )
    if not here and age > LOCK_STALE_SECONDS:
        return _Verdict(
            notice=f"notice: {run_dir} was locked by {who}, silent for {age:.0f} s (a lost node): lock taken over"
        )
    if not here and same_job and patient:
        return _Verdict(
            wait=f"notice: {run_dir} is locked by {who}, of this job (an earlier worker group on another host): "
            f"waiting until its heartbeat stops for {LOCK_STALE_SECONDS:.0f} s (now {age:.0f} s)"
        )
    shared = (
        f". It has this process's job id ({record['job']}): two launches share one --rdzv-id "
        "(TORCHELASTIC_RUN_ID); give each its own"
        if same_job
        else ""
    )
    return _Verdict(
        error=f"error: another process trains {run_dir}: {who} since {record.get('since')} ({_heartbeat_age(age)}); "
        f"one run has one writer. Stop it (kill -TERM {pid}{'' if here else ' on ' + str(host)}: it saves "
        f"last.pt and exits) or let it end, then continue with --resume auto; or start another run with "
        f"--run-name NAME"
        + (
            ""
            if here
            else f". If {host} is lost, its lock is taken over {LOCK_STALE_SECONDS:.0f} s after its last heartbeat: "
            + (
                f"run this command again in {max(LOCK_STALE_SECONDS - age, 0) + 1:.0f} s"
                if not ahead and not moved
                else "its heartbeat moves (its host's clock is ahead of this one's): it lives"
            )
        )
        + shared
    )


def _heartbeat_age(age: float) -> str:
    """The heartbeat's age in words. A negative one (a clock set back since the holder's last beat, or a file touched
    by hand) is said as what it is, not as a time ago."""
    if age >= -WRITING_SECONDS / 5:
        return f"its heartbeat {max(age, 0):.0f} s ago"
    return f"its heartbeat dated {-age:.0f} s ahead of this host's clock"


def lock_error(run_dir: Path) -> str | None:
    """The one-line error when a live process holds `run_dir`'s lock, else None. Writes nothing."""
    try:
        seen = _read(Path(run_dir) / LOCK)
    except OSError:
        return None  # not a directory, not readable: the run's first write says so
    return None if seen is None else _judge(Path(run_dir), seen).error


def _unique(path: Path, kind: str) -> Path:
    """A name beside `path` that no other process (nor another call of this one) uses."""
    return path.with_name(f"{path.name}.{socket.gethostname()}.{os.getpid()}.{next(_names)}.{kind}")


def _write_new(path: Path, data: bytes) -> None:
    """Create `path` holding `data`, or raise FileExistsError."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    except OSError:
        path.unlink(missing_ok=True)  # a full disk: no half record left to judge
        raise


def _create_from(tmp: Path, path: Path, data: bytes) -> bool:
    """Create `path` with the record `tmp` holds (`data`): True, or False where it exists. A hard link (atomic, NFS
    included), or an exclusive create where the filesystem has no hard links (some FUSE and SMB mounts)."""
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:
        try:
            _write_new(path, data)
            return True
        except FileExistsError:
            return False


def _put_back(aside: Path, path: Path) -> None:
    """Return a file moved aside by mistake to `path`, unless another took its place meanwhile."""
    try:
        os.link(aside, path)
    except FileExistsError:
        pass
    except OSError:
        if not path.exists():
            os.rename(aside, path)
    aside.unlink(missing_ok=True)


def _move_aside(path: Path, seen: _Seen) -> bool:
    """Remove the file `seen` from `path` by renaming it to a unique name: True when it was that file."""
    aside = _unique(path, "stale")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    moved = _read(aside)
    if moved is None or moved.identity != seen.identity:  # another file took its place since it was read
        _put_back(aside, path)
        return False
    aside.unlink(missing_ok=True)
    return True


def _take_over(path: Path, tmp: Path, data: bytes, seen: _Seen) -> bool:
    """Replace the stale lock `seen` by this process's (`tmp`, `data`): True when this process holds the lock now;
    False when another process took it, released it or is taking it over at this moment (look again)."""
    marker = path.with_name(f"{LOCK}.takeover.{hashlib.sha256(repr(seen.identity).encode()).hexdigest()[:16]}")
    try:
        _write_new(marker, data)
    except FileExistsError:
        _clear_abandoned(marker)
        return False
    try:
        now = _read(path)
        if now is None or now.identity != seen.identity or not _move_aside(path, seen):
            return False  # taken over or released since it was judged
        return _create_from(tmp, path, data)  # a process that starts at this moment may create it first
    finally:
        marker.unlink(missing_ok=True)


def _clear_abandoned(marker: Path) -> None:
    """Remove a takeover marker whose taker died between creating it and removing it (a few milliseconds)."""
    seen = _read(marker)
    if seen is None:
        return
    record = _parse(seen.data)
    if record.get("host") == socket.gethostname() and isinstance(record.get("pid"), int) and record["pid"] > 0:
        abandoned = _gone(record)
    else:
        abandoned = time.time() - seen.mtime > TAKEOVER_SECONDS
    if abandoned:
        _move_aside(marker, seen)


def acquire(run_dir: Path, say: Callable[[str], None] = print) -> Lock:
    """Take `run_dir`'s lock (a stale one with a notice through `say`) and start its heartbeat. Raises LockRefused
    with the one-line error when a live process holds it."""
    run_dir = Path(run_dir)
    path, mine = run_dir / LOCK, _lock_record()
    data = json.dumps(mine).encode()
    tmp = _unique(path, "tmp")
    _write_new(tmp, data)
    start, waited, first_seen = time.monotonic(), False, {}
    try:
        while not _create_from(tmp, path, data):
            seen = _read(path)
            if seen is None:
                continue  # released, or moved aside by a taker, this moment: create it again
            elapsed = time.monotonic() - start
            mtime, since = first_seen.setdefault(seen.identity, (seen.mtime, time.monotonic()))
            verdict = _judge(
                run_dir,
                seen,
                patient=elapsed < LOCK_STALE_SECONDS + LOCK_HEARTBEAT_SECONDS,
                still=(mtime, time.monotonic() - since),
            )
            if verdict.error:
                raise LockRefused(verdict.error)
            if verdict.notice and _take_over(path, tmp, data, seen):
                say(verdict.notice)
                break
            if elapsed > LOCK_STALE_SECONDS + 2 * LOCK_HEARTBEAT_SECONDS:
                raise LockRefused(
                    f"error: the lock {path} did not come free in {elapsed:.0f} s: other processes keep taking it or "
                    "writing it; try again"
                )
            if verdict.wait and verdict.wait.startswith("notice"):  # this job's holder on another host: seconds
                if not waited:
                    say(verdict.wait)
                waited = True
                time.sleep(min(1.0, LOCK_HEARTBEAT_SECONDS))
            else:  # a record being written, or another process taking this one over: a moment
                time.sleep(random.uniform(0.001, 0.02))
    finally:
        tmp.unlink(missing_ok=True)
    lock = Lock(path, data, threading.Event())
    lock.beating = threading.Thread(target=_heartbeat, args=(lock, run_dir), name="run directory lock", daemon=True)
    lock.beating.start()
    return lock


def _holds(lock: Lock) -> bool:
    """Whether `lock`'s file still holds this process's record. Read again after a moment before saying no: a taker
    of another record may have moved it aside by mistake, and puts it back at once."""
    for attempt in range(3):
        seen = _read(lock.path)
        if seen is not None and seen.data == lock.data:
            return True
        if lock.stop.wait(0.2):
            return True  # released meanwhile: nothing to say
    return False


def _heartbeat(lock: Lock, run_dir: Path) -> None:
    while not lock.stop.wait(LOCK_HEARTBEAT_SECONDS):
        try:
            if not _holds(lock):
                seen = _read(lock.path)
                if seen is None and _write_again(lock, run_dir):
                    continue
                lock.lost = _lost(lock, run_dir)
                print(f"warning: {lock.lost.removeprefix('error: ')}", file=sys.stderr, flush=True)
                return
            os.utime(lock.path)
        except OSError:
            pass  # a full or flaky disk: the next beat tries again


def _write_again(lock: Lock, run_dir: Path) -> bool:
    """The lock file is gone while this process holds the lock (deleted by hand): write it again, exclusively, so
    that a process that starts now still finds the run taken. True when this process holds it again."""
    if not run_dir.is_dir():
        return False  # the whole run directory went: the run's next write says so (common.run)
    try:
        _write_new(lock.path, lock.data)
    except FileExistsError:
        return False  # another process created it since: it holds the run now
    print(
        f"warning: {lock.path} was deleted while this process held it (by hand?): written again; this process "
        f"still trains {run_dir}",
        file=sys.stderr,
        flush=True,
    )
    return True


def _lost(lock: Lock, run_dir: Path) -> str:
    """The one line of a lock that is not this process's any more: what happened to its file, as far as it can tell."""
    if not run_dir.is_dir():
        lock.vanished = True
        return f"error: the run directory {run_dir} was removed while this process trained it"
    seen = _read(lock.path)
    held = _parse(seen.data) if seen is not None else {}
    who = f"pid {held.get('pid')} on host {held.get('host')}" if held else "another process"
    return (
        f"error: {lock.path} is held by {who} now, not by this process (its file was deleted or taken over since "
        f"this process took it): this process writes no more checkpoints to {run_dir}, so that the run keeps one "
        "writer"
    )


def release(lock: Lock) -> None:
    """Stop the heartbeat and remove the lock, if it still holds this process's record."""
    lock.stop.set()
    if lock.beating is not None:
        # joined, not left to the interpreter's exit: a daemon thread still waking up while the process finalizes can
        # abort it ("terminate called without an active exception") after everything was written
        lock.beating.join(timeout=LOCK_HEARTBEAT_SECONDS)
    seen = _read(lock.path)
    if seen is not None and seen.data == lock.data:
        lock.path.unlink(missing_ok=True)


def take_lock(run: Run) -> str | None:
    """Rank 0: `acquire` with its notices through run.say; the error line when a live process holds it, else None."""
    try:
        run.lock = acquire(run.run_dir, run.say)
    except LockRefused as e:
        return str(e)
    return None


def lock_lost(run: Run) -> str | None:
    """The one-line error when another process holds the lock this run took (its heartbeat found out), else None."""
    return run.lock.lost if run.lock is not None else None


def release_lock(run: Run) -> None:
    """Stop the heartbeat and remove the lock, if it is still this process's."""
    if run.lock is not None:
        lock, run.lock = run.lock, None
        release(lock)
