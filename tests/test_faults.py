"""Faults that end a run, or would let two runs spoil one: each ends in one clear line and loses nothing.

One run, one writer (a second process on a run that trains, a lock left by a dead process or a lost node, a
torchrun restart of the same job); a file of the run that cannot be written (a full disk, for real on a small
tmpfs where the machine allows it, else a write that raises ENOSPC); checkpoints mirrored to wandb as artifacts
with --track; and what the end lines say of the budget, the evaluations and a resumed run.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import common.checkpoint
import common.lock
import common.run
from common.checkpoint import load_checkpoint
from common.lock import LOCK, LOCK_STALE_SECONDS, lock_error
from tests.helpers import ROOT, Job, run, subprocess_env
from common.checkpoint import EXPORT
from tests.test_scripts import cli_args, mp4_frames, scalars, train, units

ITERATION = units("ppo", 1)  # env steps of one iteration of the tiny ppo runs


def run_dir_of(out: Path) -> Path:
    return out / "run"


def files_of(directory: Path) -> dict:
    """Every file under `directory`: (mtime, bytes)."""
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in directory.rglob("*") if p.is_file()}


# --------------------------------------------------------------------------------------------
# one run, one writer
# --------------------------------------------------------------------------------------------
@pytest.fixture
def jobs():
    started = []
    yield lambda cmd, log: started.append(Job(cmd, log)) or started[-1]
    for job in started:
        job.kill()


def test_a_second_process_on_a_training_run_stops_and_a_dead_ones_lock_is_taken_over(tmp_path, jobs, capsys):
    """A run trains in one process; a second --resume auto of it stops with one line naming the live process, and
    writes nothing (--eval-only of its checkpoint still runs). After a kill -9 of the first, a resume takes its lock
    over with a notice, finishes, and leaves no lock behind."""
    run_dir = run_dir_of(tmp_path)
    first = jobs(
        [sys.executable, *cli_args("ppo", tmp_path, total_timesteps=units("ppo", 100_000), save_interval=1)],
        tmp_path / "first.log",
    )
    last = run_dir / "checkpoints" / "last.pt"
    first.wait_for(last.is_file, what="the first checkpoint")
    assert json.loads((run_dir / LOCK).read_text())["pid"] == first.proc.pid
    config = (run_dir / "config.json").stat().st_mtime_ns
    with pytest.raises(
        SystemExit,
        match=rf"^error: another process trains {run_dir}: pid {first.proc.pid} on host {socket.gethostname()} since "
        r".*one run has one writer\. Stop it \(kill -TERM \d+: it saves last\.pt and exits\) or let it end, then "
        r"continue with --resume auto; or start another run with --run-name NAME$",
    ):
        train("ppo", tmp_path, resume="auto", total_timesteps=units("ppo", 100_001))
    with pytest.raises(SystemExit, match="^error: another process trains"):  # --overwrite removes no live run
        train("ppo", tmp_path, overwrite=True)
    assert (run_dir / "config.json").stat().st_mtime_ns == config
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1, "the second process wrote an event file"
    assert "eval_return" in train("ppo", tmp_path, eval_only=True, resume=str(last))  # reads, writes no run

    first.kill()  # kill -9: the lock stays behind, its pid gone
    assert (run_dir / LOCK).is_file()
    capsys.readouterr()
    resumed = train("ppo", tmp_path, resume="auto", total_timesteps=load_checkpoint(last)["global_step"] + ITERATION)
    said = capsys.readouterr().out
    assert f"notice: {run_dir} was locked by pid {first.proc.pid} on host {socket.gethostname()}, which no longer " in (
        said
    )
    assert resumed["stop_reason"] == "total_timesteps" and not (run_dir / LOCK).exists()


def write_lock(run_dir: Path, age: float, **record) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"host": socket.gethostname(), "pid": os.getpid(), "started": None, "job": None, "since": "then", **record}
    (run_dir / LOCK).write_text(json.dumps(record))
    os.utime(run_dir / LOCK, (time.time() - age, time.time() - age))


def test_a_lock_is_live_while_its_process_runs_or_its_other_hosts_heartbeat_is_fresh(tmp_path, monkeypatch):
    """Who holds a lock, as a second process judges it: on this host by the pid (and its start time, so that a
    reused pid is not the holder), on another host by the heartbeat's age; the same job's too (a torchrun restart
    takes over its earlier worker group's lock once that has ended, a second launch with the same job id stops)."""
    for var in ("TORCHELASTIC_RUN_ID", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(var, raising=False)
    run_dir = tmp_path / "run"
    write_lock(run_dir, age=5, host="node-7", pid=4242)
    assert lock_error(run_dir).endswith(
        f"on node-7: it saves last.pt and exits) or let it end, then continue with --resume auto; or start another run "
        f"with --run-name NAME. If node-7 is lost, its lock is taken over {LOCK_STALE_SECONDS:.0f} s after its last "
        f"heartbeat: run this command again in {LOCK_STALE_SECONDS - 5 + 1:.0f} s"
    )
    write_lock(run_dir, age=LOCK_STALE_SECONDS + 5, host="node-7", pid=4242)
    assert lock_error(run_dir) is None  # a lost node: silent past the limit
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = common.lock._process(live.pid)[1]
        write_lock(run_dir, age=LOCK_STALE_SECONDS + 5, pid=live.pid, started=started)
        assert lock_error(run_dir).startswith(f"error: another process trains {run_dir}: pid {live.pid} on host ")
        if started is not None:  # /proc tells the start time: the same pid started at another time is another process
            write_lock(run_dir, age=0, pid=live.pid, started=started - 1)
            assert lock_error(run_dir) is None
    finally:
        live.kill()
        live.wait()
    write_lock(run_dir, age=0, pid=live.pid)  # reaped: no such process
    assert lock_error(run_dir) is None
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-1")
    write_lock(run_dir, age=0, pid=live.pid, job="job-1/0")  # an earlier worker group of this job, ended: taken over
    assert lock_error(run_dir) is None
    write_lock(run_dir, age=0, job="job-1/0")  # this job's holder runs: a second launch with the same job id
    assert lock_error(run_dir).startswith("error: another process trains") and lock_error(run_dir).endswith(
        "It has this process's job id (job-1/0): two launches share one --rdzv-id (TORCHELASTIC_RUN_ID); give each "
        "its own"
    )
    write_lock(run_dir, age=5, host="node-7", pid=4242, job="job-1/0")  # this job's, on another host: waited for
    assert lock_error(run_dir) is None  # (take_lock waits until its heartbeat is stale: tests/test_lock.py)
    write_lock(run_dir, age=0, job="job-1/1")  # a requeued SLURM job of the same id whose old instance still runs
    assert lock_error(run_dir).startswith("error: another process trains")


# --------------------------------------------------------------------------------------------
# files that cannot be written: one line, the last good checkpoint, nothing earlier lost
# --------------------------------------------------------------------------------------------
@pytest.fixture
def small_filesystem(tmp_path):
    """A 200 KiB tmpfs: a real full disk. Needs root (mount); skipped where the machine does not allow it."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (the ENOSPC test below covers the same path by a raised error)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"mount -t tmpfs failed here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_ends_the_run_with_one_line_and_loses_nothing(small_filesystem):
    """The issue's run on a 200 KiB filesystem: its second checkpoint does not fit. The run ends with one line
    (what failed, the cause, the last good checkpoint and its step, the command that continues), a non-zero exit,
    last.pt whole at its step, no temporary file, and a summary.json that says why; that command, once there is
    room, continues the run."""
    out = small_filesystem
    flags = ["--env-id", "CartPole-v1", "--num-envs", "32", "--num-steps", "16", "--eval-interval", "0"]
    flags += ["--save-interval", "5", "--output-dir", str(out), "--run-name", "run", "--device", "cpu"]
    flags += ["--total-timesteps", "1000000", "--no-progress"]
    result = run([sys.executable, "algos/ppo.py", *flags], timeout=300)
    assert result.returncode == 1, result.stdout[-3000:]
    assert "Traceback" not in result.stdout and result.stdout.count("error") == 1, result.stdout[-3000:]
    last = out / "run" / "checkpoints" / "last.pt"
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith(
        f"error: cannot write {last} (No space left on device [errno 28]); the last good checkpoint is {last} "
        f"(global step 2,560), nothing earlier lost. Free space (or move the run directory and give its new "
        f"--output-dir), then continue with: python algos/ppo.py "
    ), line
    assert load_checkpoint(last)["global_step"] == 2560
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    summary = json.loads((out / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "error" and summary["error"].startswith(f"cannot write {last}: No space left")

    for big in (out / "run" / "checkpoints").iterdir():  # make room: a checkpoint, then the run goes on from it
        if big.name != "last.pt":
            big.unlink()
    subprocess.run(["mount", "-o", "remount,size=4m", str(out)], check=True)
    command = line.partition("then continue with: ")[2].split()
    resumed = run([sys.executable, *command[1:], "--total-timesteps", str(2560 + 2 * 512)], timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "resumed from" in resumed.stdout and load_checkpoint(last)["global_step"] == 2560 + 2 * 512


def fail_when(monkeypatch, fault: str, run_dir: Path):
    """Make one write of the run fail with ENOSPC: the second checkpoint, the TensorBoard event file once the first
    checkpoint is written, or summary.json."""
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    if fault == "checkpoint":
        calls, real_save = [], torch.save

        def save(obj, f, *a, **k):
            calls.append(1)
            if len(calls) == 2:
                f.write(b"partial")
                raise full
            return real_save(obj, f, *a, **k)

        monkeypatch.setattr(torch, "save", save)
    elif fault == "event file":
        from tensorboard.summary.writer.record_writer import RecordWriter

        real_write = RecordWriter.write

        def write(self, data):
            if (run_dir / "checkpoints" / "last.pt").is_file():
                raise full
            return real_write(self, data)

        monkeypatch.setattr(RecordWriter, "write", write)
    else:
        real_replace = common.checkpoint.os.replace

        def replace(src, dst):
            if Path(dst).name == "summary.json":
                raise full
            return real_replace(src, dst)

        monkeypatch.setattr(common.checkpoint.os, "replace", replace)


@pytest.mark.parametrize("fault", ["checkpoint", "event file", "summary"])
def test_a_write_that_fails_ends_the_run_with_one_line(fault, tmp_path, monkeypatch, capsys):
    """ENOSPC from a checkpoint, the TensorBoard event file or summary.json (where no small filesystem can be
    mounted, this is the proof): one line that names the file, the cause, the last good checkpoint with its step,
    and the command that continues; no traceback (not even the writer thread's); last.pt whole; no temporary file."""
    run_dir = run_dir_of(tmp_path)
    fail_when(monkeypatch, fault, run_dir)
    with pytest.raises(SystemExit) as ended:
        train("ppo", tmp_path, total_timesteps=units("ppo", 40), save_interval=2)
    line = str(ended.value.code)
    what = {
        "checkpoint": run_dir / "checkpoints" / "last.pt",
        "event file": f"the TensorBoard event file in {run_dir}",
        "summary": run_dir / "summary.json",
    }[fault]
    last = run_dir / "checkpoints" / "last.pt"
    saved = load_checkpoint(last)["global_step"]
    assert line.startswith(
        f"error: cannot write {what} (No space left on device [errno 28]); the last good checkpoint is {last} "
        f"(global step {saved:,}), nothing earlier lost. Free space"
    ), line
    assert line.endswith(f"--output-dir {tmp_path} --run-name run --resume auto") and "\n" not in line
    err = capsys.readouterr().err
    assert "Traceback" not in err and "warning" not in err, err
    assert not [p for p in run_dir.rglob("*") if p.name.endswith(".tmp")] and not (run_dir / LOCK).exists()
    assert saved == (40 if fault == "summary" else 2) * ITERATION  # the last save before the fault
    if fault != "summary":
        assert json.loads((run_dir / "summary.json").read_text())["stop_reason"] == "error"


# --------------------------------------------------------------------------------------------
# every other writer of a run: config.json, the eval video (mp4, TensorBoard, wandb), the exported policy, wandb's
# staging copies of the artifacts; each one's ENOSPC is the same one line
# --------------------------------------------------------------------------------------------
def full() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a new one each time: a raised error keeps its frames


def fail_fsync_of(monkeypatch, name: str) -> None:
    """ENOSPC from the fsync of a file whose name holds `name` (where a write's data meets the disk, a full one or an
    NFS quota: the atomic writes of config.json, the export and the video sync their temporary file there)."""
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc to tell a file descriptor's name")
    real = os.fsync

    def fsync(fd):
        if name in os.readlink(f"/proc/self/fd/{fd}"):
            raise full()
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def fail_ffmpeg_after(monkeypatch, tmp_path: Path, videos: int) -> None:
    """ffmpeg that writes `videos` videos, then fails as it does on a full disk (its error line, a non-zero exit)."""
    import imageio_ffmpeg

    real, mark = imageio_ffmpeg.get_ffmpeg_exe(), tmp_path / "ffmpeg-calls"
    fake = tmp_path / "ffmpeg"
    fake.write_text(
        f"#!/bin/sh\necho >> {mark}\nif [ $(wc -l < {mark}) -gt {videos} ]; then cat > /dev/null; "
        'echo "[out#0/mp4 @ 0x1] Error writing trailer: No space left on device" >&2; exit 228; fi\n'
        f'exec {real} "$@"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setattr(imageio_ffmpeg, "get_ffmpeg_exe", lambda: str(fake))


def fail_tensorboard_video_after(monkeypatch, videos: int) -> None:
    from tensorboard.summary.writer.record_writer import RecordWriter

    real_write, written = RecordWriter.write, []

    def write(self, data):
        if b"videos/eval" in data:
            written.append(1)
            if len(written) > videos:
                raise full()
        return real_write(self, data)

    monkeypatch.setattr(RecordWriter, "write", write)


def offline_wandb(monkeypatch, tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    for var, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}.items():
        monkeypatch.setenv(var, value)
    for var in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))


def fail_calls(monkeypatch, owner, name: str, where: str, calls: int = 0) -> None:
    """ENOSPC from `owner.name` (a function of wandb's or shutil's that writes) where an argument names a path that
    holds `where`, after `calls` such calls that succeed."""
    real, made = getattr(owner, name), []

    def call(*args, **kwargs):
        if any(where in str(arg) for arg in args):
            made.append(1)
            if len(made) > calls:
                raise full()
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, call)


def wandb_media_dirs():
    from wandb.sdk.lib import filesystem

    return filesystem


VIDEO = dict(capture_video=True, num_eval_envs=1, eval_interval=1)
WRITERS = {
    # writer: (the flags of its run, how its write fails, the file the line names)
    "eval video mp4": (VIDEO, lambda m, tmp: fail_ffmpeg_after(m, tmp, 1), f"videos/step_{2 * ITERATION}.mp4"),
    "eval video in TensorBoard": (
        VIDEO,
        lambda m, tmp: fail_tensorboard_video_after(m, 1),
        "the TensorBoard event file in {run_dir}",
    ),
    "eval video in wandb": (
        {**VIDEO, "track": True},
        # wandb makes the folder of its copy of the video (then copies or links it): a full disk fails there
        lambda m, tmp: (offline_wandb(m, tmp), fail_calls(m, wandb_media_dirs(), "mkdir_exists_ok", "media", 1)),
        "wandb's files of {run_dir}",
    ),
    "exported policy": (
        dict(eval_interval=1, export_best=True),
        lambda m, tmp: fail_fsync_of(m, "policy."),
        "{run_dir}/export",
    ),
    "wandb artifact staging": (
        dict(track=True),
        lambda m, tmp: (offline_wandb(m, tmp), fail_calls(m, shutil, "copyfile", "staging")),
        "wandb's staging copy of {run_dir}/checkpoints/last.pt",
    ),
}


@pytest.mark.parametrize("writer", list(WRITERS))
def test_every_writer_that_fails_ends_the_run_with_one_line(writer, tmp_path, monkeypatch, capsys):
    """ENOSPC from each other writer of a training run: the eval video (its mp4, written by ffmpeg; its TensorBoard
    GIF; wandb's copy of it), the policy exported with best.pt, wandb's staging copy of a checkpoint for its
    artifact. The same one line as a checkpoint's (the file, the cause, the last good checkpoint and its step, the
    command that continues), no traceback, last.pt whole, no temporary file, the lock released; the writer's own
    earlier files whole (the first video)."""
    flags, fail, what = WRITERS[writer]
    run_dir = run_dir_of(tmp_path)
    what = what.format(run_dir=run_dir) if "{" in what else run_dir / what
    fail(monkeypatch, tmp_path)
    with pytest.raises(SystemExit) as ended:
        train("ppo", tmp_path, total_timesteps=units("ppo", 4), save_interval=1, **flags)
    line, last = str(ended.value.code), run_dir / "checkpoints" / "last.pt"
    saved = load_checkpoint(last)["global_step"]
    assert line.startswith(
        f"error: cannot write {what} (No space left on device [errno 28]); the last good checkpoint is {last} "
        f"(global step {saved:,}), nothing earlier lost. Free space"
    ), line
    assert line.endswith(f"--output-dir {tmp_path} --run-name run --resume auto") and "\n" not in line
    assert saved == ITERATION  # the fault comes at iteration 2's evaluation (a video), or after iteration 1's save
    err = capsys.readouterr().err
    assert "Traceback" not in err and "warning" not in err, err
    assert not (run_dir / LOCK).exists()
    assert not [p for p in run_dir.rglob("*") if ".tmp" in p.name and "wandb" not in p.parts]
    if writer == "eval video mp4":
        assert mp4_frames(run_dir / "videos" / f"step_{ITERATION}.mp4")  # the first video whole
        assert [p.name for p in (run_dir / "videos").iterdir()] == [f"step_{ITERATION}.mp4"]
    if writer == "exported policy":
        assert not (run_dir / EXPORT).exists() or not list((run_dir / EXPORT).iterdir())
    assert json.loads((run_dir / "summary.json").read_text())["stop_reason"] == "error"


def test_config_json_that_cannot_be_written_ends_the_run_in_one_line_and_keeps_the_earlier_one(
    tmp_path, monkeypatch, capsys
):
    """A resumed run whose config.json cannot be rewritten (its flags changed: a larger --total-timesteps): one line
    before the training, the earlier config.json whole, last.pt as it was, the lock released."""
    run_dir = run_dir_of(tmp_path)
    train("ppo", tmp_path, total_timesteps=units("ppo", 2), save_interval=1)
    config, last = (run_dir / "config.json").read_bytes(), run_dir / "checkpoints" / "last.pt"
    fail_fsync_of(monkeypatch, "config.json")
    with pytest.raises(SystemExit) as ended:
        train("ppo", tmp_path, total_timesteps=units("ppo", 4), resume="auto", save_interval=1)
    line = str(ended.value.code)
    assert line.startswith(
        f"error: cannot write {run_dir / 'config.json'} (No space left on device [errno 28]); the last good checkpoint "
        f"is {last} (global step {2 * ITERATION:,}), nothing earlier lost. Free space"
    ), line
    assert line.endswith("--resume auto") and "\n" not in line
    assert (run_dir / "config.json").read_bytes() == config and load_checkpoint(last)["global_step"] == 2 * ITERATION
    assert not (run_dir / LOCK).exists() and not [p for p in run_dir.rglob("*") if ".tmp" in p.name]
    assert "Traceback" not in capsys.readouterr().err


def test_an_export_that_cannot_be_written_leaves_the_earlier_one_whole(tmp_path, monkeypatch):
    """The exported policy's three files are written together: a failed write (ENOSPC) raises, and the files of the
    earlier export stay as they were, with no temporary file beside them. --eval-only --export to a full disk ends in
    one line of its own (it writes no run: nothing to continue)."""
    run_dir = run_dir_of(tmp_path)
    train("ppo", tmp_path, total_timesteps=units("ppo", 1), eval_interval=1, export_best=True)
    export = run_dir / EXPORT
    before = {p.name: p.read_bytes() for p in export.iterdir()}
    assert set(before) == {"policy.pt2", "policy.onnx", "policy.json"}
    last = run_dir / "checkpoints" / "last.pt"
    fail_fsync_of(monkeypatch, "policy.json")  # the last of the three
    with pytest.raises(SystemExit) as ended:
        train("ppo", tmp_path, eval_only=True, resume=str(last), export=str(export))
    assert str(ended.value.code) == (
        f"error: cannot write {export} (No space left on device [errno 28]); {last} is untouched. Free space, then "
        "run it again"
    )
    assert {p.name: p.read_bytes() for p in export.iterdir()} == before


def test_write_mp4_on_a_full_disk_raises_and_leaves_no_file(small_filesystem):
    """A real full disk (a 200 KiB tmpfs, as root): ffmpeg fails; write_mp4 says so (OutputError, ENOSPC, the
    file) instead of leaving a truncated mp4, and leaves no file."""
    import numpy as np

    from common.checkpoint import OutputError
    from common.video import write_mp4

    pytest.importorskip("imageio_ffmpeg")
    frames = [np.random.default_rng(i).integers(0, 255, (200, 200, 3), dtype=np.uint8) for i in range(60)]
    with pytest.raises(OutputError) as raised:
        write_mp4(small_filesystem / "videos" / "step_1.mp4", frames, 30)
    assert (raised.value.errno, raised.value.filename) == (
        errno.ENOSPC,
        str(small_filesystem / "videos" / "step_1.mp4"),
    )
    assert list((small_filesystem / "videos").iterdir()) == []


# --------------------------------------------------------------------------------------------
# checkpoints that outlive the machine: wandb artifacts with --track
# --------------------------------------------------------------------------------------------
def wandb_records(run_dir: Path) -> list:
    """The records of the offline wandb run in `run_dir` (its run-<id>.wandb: wandb's LevelDB-style log of
    protobuf records, blocks of 32 KiB after a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, block, pos, part, records = path.read_bytes(), 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header: padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        part, pos = part + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(part)
            records.append(record)
            part = b""
    return records


def md5_digest(path: Path) -> str:
    return base64.b64encode(hashlib.md5(path.read_bytes()).digest()).decode()


def test_track_logs_the_last_and_best_checkpoints_and_the_policy_as_artifacts(tmp_path, monkeypatch):
    """With --track (offline), each last.pt write at the save interval logs last.pt, best.pt (when a new best was
    written since) and the exported policy as wandb artifacts: the newest ones' files are the files on disk, and a
    new best between two saves is not uploaded on its own."""
    pytest.importorskip("wandb")
    for var, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}.items():
        monkeypatch.setenv(var, value)
    for var in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))
    run_dir = run_dir_of(tmp_path)
    train(
        "ppo", tmp_path, track=True, total_timesteps=units("ppo", 6), eval_interval=1, save_interval=3, export_best=True
    )
    records, deadline = [], time.time() + 60
    while not any(r.WhichOneof("record_type") == "exit" for r in records) and time.time() < deadline:
        time.sleep(0.1)  # wandb's service writes the run's records out after finish() has returned
        records = wandb_records(run_dir)
    artifacts = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"]
    by_name = {}
    for artifact in artifacts:
        by_name.setdefault(artifact.name, []).append(artifact)
    assert set(by_name) <= {"run-last", "run-best", "run-policy"} and len(by_name["run-last"]) == 2  # iterations 3, 6
    assert len(by_name["run-best"]) <= 2 and len(by_name["run-policy"]) == len(by_name["run-best"])
    on_disk = {
        "run-last": {"last.pt": run_dir / "checkpoints" / "last.pt"},
        "run-best": {"best.pt": run_dir / "checkpoints" / "best.pt"},
        "run-policy": {p.name: p for p in (run_dir / "export").iterdir()},
    }
    for name, files in on_disk.items():
        newest = by_name[name][-1]
        assert newest.type == "model" and "latest" in newest.aliases
        entries = {e.path: e for e in newest.manifest.contents}
        assert set(entries) == set(files), name
        for file, path in files.items():
            assert entries[file].digest == md5_digest(path), f"{name}/{file} is not the file on disk"
            if Path(entries[file].local_path).is_file():  # the staged copy that `wandb sync` uploads
                assert Path(entries[file].local_path).read_bytes() == path.read_bytes()
    assert json.loads(by_name["run-last"][-1].metadata)["global_step"] == units("ppo", 6)


# --------------------------------------------------------------------------------------------
# the end lines: what ran of the budget, the final evaluation, a resumed run's iterations
# --------------------------------------------------------------------------------------------
def test_the_end_lines_say_what_ran_the_last_eval_return_and_a_sittings_share(tmp_path, capsys):
    first = train("ppo", tmp_path, total_timesteps=2 * ITERATION + 5, eval_interval=1)
    said = capsys.readouterr().out
    assert (
        f"ppo on Pendulum-v1: {2 * ITERATION} steps (2 iterations) in " in said
        and f"; --total-timesteps {2 * ITERATION + 5} rounded down to whole iterations of {ITERATION} steps "
        "(5 steps not run)\n"
        in said
    ), said
    evals = scalars(run_dir_of(tmp_path))["eval/episodic_return"]
    assert first["last_eval_return"] == pytest.approx(evals[-1][1]) and evals[-1][0] == 2 * ITERATION
    assert first["best_eval_return"] == pytest.approx(max(v for _, v in evals))
    assert f"eval return: best {first['best_eval_return']:.2f}, last {first['last_eval_return']:.2f}; " in said

    resumed = train("ppo", tmp_path, resume="auto", total_timesteps=5 * ITERATION, eval_interval=0)
    said = capsys.readouterr().out
    assert f"; 3 iterations this sitting, 5 in all, to step {5 * ITERATION:,}; " in said, said
    assert f": {5 * ITERATION} steps (5 iterations, 3 this sitting) in " in said
    assert f"; --total-timesteps {5 * ITERATION} reached\n" in said
    assert resumed["last_eval_return"] == first["last_eval_return"]  # no evaluation in this sitting: the run's last


def test_exported_policies_are_not_tracked_by_git():
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "exported/policy.onnx"], cwd=ROOT, env=subprocess_env(), capture_output=True
    )
    assert ignored.returncode == 0, "exported/ is not in .gitignore"


# --------------------------------------------------------------------------------------------
# a checkpoint dict without its model, a signal during teardown, a rank lost under torchrun
# --------------------------------------------------------------------------------------------
def test_a_checkpoint_without_its_model_or_state_is_one_line(tmp_path):
    """A format-4 dict without "model" and "state" (written by hand, or by another tool): resuming it, starting from
    it (--init-from) and evaluating it each stop in one line naming what it lacks, not a KeyError's traceback."""
    train("ppo", tmp_path, total_timesteps=ITERATION)
    whole = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    partial = tmp_path / "partial.pt"
    torch.save({k: v for k, v in whole.items() if k not in ("model", "state")}, partial)
    for flags in (dict(resume=str(partial), run_name="r"), dict(init_from=str(partial), run_name="i")):
        with pytest.raises(SystemExit) as ended:
            train("ppo", tmp_path / "again", total_timesteps=2 * ITERATION, **flags)
        assert str(ended.value).startswith(
            f"error: {'--init-from: ' if 'init_from' in flags else ''}{partial} is not a whole checkpoint: its format "
            "4 dict has no model, state; "
        ), ended.value
    with pytest.raises(SystemExit, match=f"^error: {partial} is not a whole checkpoint"):
        train("ppo", tmp_path, eval_only=True, resume=str(partial))
    assert not (tmp_path / "again").exists()


# One run of algos/ppo.py as a program that signals itself: SIGTERM at its 3rd env step (a saved stop), SIGTERM again
# while it closes (in the lock's release, once the loop is over) and SIGINT after the script returned.
SIGNALLED = r"""
import os, runpy, signal, sys, time
sys.path.insert(0, sys.argv[1])
import common.run

real_make_env, real_release_lock = common.run.make_env, common.run.release_lock

class Signalling:
    def __init__(self, env):
        self.env, self.steps = env, 0
    def __getattr__(self, name):
        return getattr(self.env, name)
    def step(self, action):
        self.steps += 1
        if self.steps == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return self.env.step(action)

def release_lock(run):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.3)
    real_release_lock(run)

common.run.make_env = lambda *a, **k: Signalling(real_make_env(*a, **k))
common.run.release_lock = release_lock
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
os.kill(os.getpid(), signal.SIGINT)
time.sleep(0.3)
"""


def test_a_signal_repeated_while_the_run_closes_keeps_the_first_ones_exit_status(tmp_path):
    """A SIGTERM stops the run after its iteration and last.pt is saved; a second SIGTERM during the teardown and a
    SIGINT after it (a scheduler that signals again, a second Ctrl-C) are said and change nothing: exit status 0."""
    args = cli_args("ppo", tmp_path, total_timesteps=units("ppo", 100))
    result = run([sys.executable, "-c", SIGNALLED, str(ROOT), *args], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "SIGTERM: stopping after this iteration" in result.stdout
    assert "SIGTERM: the run is closing already; it ends as it was ending" in result.stdout
    assert "SIGINT: the run is closing already" in result.stdout and "Traceback" not in result.stdout
    assert load_checkpoint(run_dir_of(tmp_path) / "checkpoints" / "last.pt")["global_step"] == ITERATION


# Two ranks of a gloo group, each in `closing` as a script is; rank 1 ends (os._exit, as a kill would) once both
# are in the group, and rank 0's next collective finds it gone.
SURVIVOR = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
import torch
from types import SimpleNamespace
from common import distributed
from common.record import Run
from common.run import closing

info = distributed.setup("cpu", timeout_seconds=30)
run = Run(args=SimpleNamespace(eval_only=False), algo="ppo", rank=info.rank, world_size=info.world_size,
          device=info.device, is_main=info.is_main)
with closing(run):
    distributed.barrier()
    if info.rank == 1:
        os._exit(9)
    time.sleep(0.5)
    distributed.all_reduce(torch.ones(1))
"""


def test_the_survivor_of_a_lost_rank_says_so_in_one_line(tmp_path):
    """A two-rank group loses a rank: the survivor ends with one line (which rank, the transport's own cause, what
    to look at), exit status 1, not the gloo error's multi-line traceback."""
    from tests.helpers import free_port

    port = free_port()
    procs = []
    for rank in (0, 1):
        env = {**subprocess_env(), "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank)}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", SURVIVOR, str(ROOT)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    said = [p.communicate(timeout=120)[0] for p in procs]
    assert procs[1].returncode == 9
    lines = [line for line in said[0].splitlines() if line.strip()]
    assert procs[0].returncode == 1 and len(lines) == 1, said[0]
    # the cause is the transport's own words ("Connection closed by peer [127.0.0.1]:port" from gloo here)
    assert lines[0].startswith("error: rank 0 of 2 lost another rank of the job in a collective (Connection ")
    assert lines[0].endswith(
        "): that rank ended (killed, failed or its node lost; its own output or the launcher's says why)"
    ), lines[0]
