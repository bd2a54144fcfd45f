"""The lock before the look: a start takes the run directory's lock before it reads anything of the run, so a start
that arrives late (held up anywhere on its way: a slow import, a busy node, a scheduler) sees what the run became and
never writes over it or rolls it back; a start that cannot go on leaves the directory as it found it. And what a run
says on its way out: the command that continues it, whatever was or was not written; a full disk while the run
directory is made; a run directory removed while the run trains.

A start "held up before its lock" is a start whose take_lock first runs another whole start of the same run: every
moment of a real delay is before that point, since nothing of the run is read before the lock.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import common.lock
import common.run
from common.args import SITTING_FLAGS, parse_args
from common.checkpoint import load_checkpoint
from common.lock import LOCK
from tests.helpers import ROOT, run, subprocess_env
from tests.test_scripts import cli_args, load_script, train, units


def files_of(directory: Path) -> dict:
    """Every file under `directory`: (mtime, bytes)."""
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in directory.rglob("*") if p.is_file()}


def start(out: Path, **overrides) -> subprocess.CompletedProcess:
    """A whole start of the tiny ppo run in its own process (as a second user or a requeued job would start it)."""
    return run([sys.executable, *cli_args("ppo", out, **overrides)], timeout=300)


def held_up(monkeypatch, meanwhile) -> None:
    """This process's next start reaches its lock only after `meanwhile()` has run."""
    real = common.run.take_lock

    def take_lock_late(run):
        meanwhile()
        return real(run)

    monkeypatch.setattr(common.run, "take_lock", take_lock_late)


# --------------------------------------------------------------------------------------------
# the lock first
# --------------------------------------------------------------------------------------------
def test_the_lock_is_held_before_anything_of_the_run_is_read(tmp_path, monkeypatch):
    """Every look at the run directory a start makes (is it a run, which last.pt, what checkpoints are there, the
    checkpoint itself) happens while this process holds the lock."""
    run_dir, looks = tmp_path / "run", []

    def watched(name):
        real = getattr(common.run, name)

        def look(*args, **kwargs):
            try:
                holder = json.loads((run_dir / LOCK).read_text())["pid"]
            except (OSError, ValueError):
                holder = None
            looks.append((name, holder == os.getpid()))
            return real(*args, **kwargs)

        monkeypatch.setattr(common.run, name, look)

    for name in ("_existing_run_dir", "resolve_resume", "checkpoints_without_last", "load_checkpoint"):
        watched(name)
    train("ppo", tmp_path, total_timesteps=units("ppo", 1))
    train("ppo", tmp_path, total_timesteps=units("ppo", 2), resume="auto")
    assert {name for name, _ in looks} == {"_existing_run_dir", "resolve_resume", "load_checkpoint"}, looks
    assert all(held for _, held in looks), looks
    assert not (run_dir / LOCK).exists()


def test_a_start_held_up_before_its_lock_refuses_the_run_that_finished_meanwhile(tmp_path, monkeypatch):
    """The issue's reproduction, made deterministic: a new run (seed 9) is held up on its way while another start of
    the same run name (seed 5) trains and finishes. It refuses in one line that names the run that finished (exit
    status 2), and every file of that run is as it was: nothing replaced, no second event file, no lock left."""
    run_dir, finished = tmp_path / "run", {}

    def other_start():
        first = start(tmp_path, seed=5, total_timesteps=units("ppo", 2))
        assert first.returncode == 0, first.stdout[-3000:]
        finished.update(files_of(run_dir))

    held_up(monkeypatch, other_start)
    with pytest.raises(SystemExit) as refused:
        train("ppo", tmp_path, seed=9, total_timesteps=units("ppo", 2))
    assert refused.value.code == 2
    assert str(refused.value) == (
        f"error: the run directory {run_dir} exists; continue it with --resume auto, start another with --run-name "
        f"NAME, or remove it with --overwrite (it holds ppo.py on Pendulum-v1, seed 5, at global step "
        f"{units('ppo', 2):,}, finished; nothing was written)"
    )
    assert files_of(run_dir) == finished and not (run_dir / LOCK).exists()
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["args"]["seed"] == 5


def test_a_resume_held_up_before_its_lock_continues_from_the_newer_last_pt(tmp_path, monkeypatch, capsys):
    """The resume variant: a --resume auto held up on its way while another resume trains the run from iteration 2
    to 5 continues from iteration 5 (the newer last.pt), not from the 2 it would have read before: nothing of the
    run is rolled back, and the run's totals count all three processes."""
    run_dir = tmp_path / "run"
    train("ppo", tmp_path, total_timesteps=units("ppo", 2))

    def other_resume():
        other = start(tmp_path, total_timesteps=units("ppo", 5), resume="auto")
        assert other.returncode == 0, other.stdout[-3000:]

    held_up(monkeypatch, other_resume)
    capsys.readouterr()
    summary = train("ppo", tmp_path, total_timesteps=units("ppo", 8), resume="auto")
    assert f"resumed from {run_dir / 'checkpoints' / 'last.pt'} at iteration 5," in capsys.readouterr().out
    assert summary["global_step"] == units("ppo", 8) and summary["processes"] == 3


def test_two_starts_of_one_run_name_at_once_leave_one_whole_run(tmp_path):
    """The issue's first reproduction as it was found: two starts of one run name at once, another seed and another
    --num-envs each. One trains; the other stops in one line (the live holder, or the run that finished) with exit
    status 2; the run directory holds one run whole: its config.json, last.pt and summary.json agree, one event
    file."""
    env = subprocess_env()
    procs = [
        subprocess.Popen(
            [sys.executable, *cli_args("ppo", tmp_path, seed=seed, num_envs=envs, total_timesteps=units("ppo", 2))],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for seed, envs in ((5, 16), (9, 8))
    ]
    said = [p.communicate(timeout=300)[0] for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 2], (codes, said)
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    errors = [line for line in said[loser].splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in said[loser], said[loser]
    assert errors[0].startswith(
        (f"error: another process trains {tmp_path / 'run'}: ", f"error: the run directory {tmp_path / 'run'} exists")
    ), errors[0]
    run_dir, seed = tmp_path / "run", (5, 9)[winner]
    assert json.loads((run_dir / "config.json").read_text())["seed"] == seed
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["args"]["seed"] == seed
    assert json.loads((run_dir / "summary.json").read_text())["global_step"] == units("ppo", 2)
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1 and not (run_dir / LOCK).exists()


def test_a_start_that_cannot_go_on_leaves_the_directory_as_it_found_it(tmp_path):
    """A start that fails after it took the lock (an unknown env id, a bad checkpoint) releases the lock and removes
    the directories it made; a run directory that was there keeps every file."""
    out = tmp_path / "a" / "b"
    with pytest.raises(SystemExit, match="error: "):
        train("ppo", out, env_id="NoSuchEnv-v0")
    with pytest.raises(SystemExit, match="no such checkpoint file"):
        train("ppo", out, resume=str(tmp_path / "missing.pt"))
    assert os.listdir(tmp_path) == []

    train("ppo", tmp_path, total_timesteps=units("ppo", 1))
    before = files_of(tmp_path / "run")
    with pytest.raises(SystemExit, match="error: "):
        train("ppo", tmp_path, env_id="NoSuchEnv-v0", resume="auto")
    assert files_of(tmp_path / "run") == before and not (tmp_path / "run" / LOCK).exists()


# --------------------------------------------------------------------------------------------
# a full disk while the run directory is made; the command that continues, whatever was written
# --------------------------------------------------------------------------------------------
def test_a_full_disk_while_the_run_directory_is_made_exits_1_in_one_line(tmp_path, monkeypatch):
    """The lock's record cannot be written (ENOSPC): one line that says nothing was written and gives the command
    that starts the run, exit status 1 (an output that cannot be written, not a usage error), no directory left."""
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(common.lock, "_write_new", lambda path, data: (_ for _ in ()).throw(full))
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as ended:
        train("ppo", out, total_timesteps=units("ppo", 1), seed=7)
    line = ended.value.code
    assert isinstance(line, str), "a string exits with status 1"
    assert line.startswith(
        f"error: cannot write the run directory {out / 'run'} (No space left on device [errno 28]); nothing of the "
        "run was written. Free space or choose --output-dir, then start it with: python algos/ppo.py "
    ), line
    assert "--seed 7" in line and "--num-envs 16" in line and line.endswith("--run-name run --resume auto")
    assert not out.exists()


def test_a_full_disk_while_the_run_directory_is_made_exits_1_for_real(tmp_path):
    """The same on a full 200 KiB tmpfs (as root): the process's exit status is 1."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (the test above covers the same path by a raised error)")
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("mount -t tmpfs failed here")
    try:
        subprocess.run(["dd", "if=/dev/zero", f"of={mount / 'filler'}", "bs=4k"], capture_output=True)
        result = start(mount, total_timesteps=units("ppo", 1))
        assert result.returncode == 1, result.stdout[-3000:]
        errors = [line for line in result.stdout.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in result.stdout, result.stdout[-3000:]
        assert errors[0].startswith(f"error: cannot write the run directory {mount / 'run'} (No space left on device")
        assert sorted(os.listdir(mount)) == ["filler"]
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def failing_saves(monkeypatch, which) -> None:
    """torch.save raises ENOSPC where `which(file name)` says so, after writing a few bytes."""
    import torch

    real = torch.save

    def save(obj, f, *args, **kwargs):
        if which(Path(getattr(f, "name", str(f))).name):
            f.write(b"partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


def continued_args(line: str) -> tuple[object, list[str]]:
    """The Args that the command at the end of `line` gives ppo.py, and its words."""
    words = shlex.split(line.partition("continue with: ")[2])
    assert words[:2] == ["python", "algos/ppo.py"], words
    return parse_args(load_script("ppo").Args, words[2:]), words


def test_the_continue_line_before_the_first_checkpoint_carries_the_runs_command(tmp_path, monkeypatch):
    """A full disk at the run's first last.pt: nothing is there to take the run's flags from, so the command itself
    carries them. Parsed, it gives the run's own values (those of its config.json, the sitting's flags aside)."""
    failing_saves(monkeypatch, lambda name: name.startswith(".last.pt"))
    with pytest.raises(SystemExit) as ended:
        train("ppo", tmp_path, total_timesteps=units("ppo", 4), save_interval=2, seed=3, num_envs=8)
    line = str(ended.value.code)
    assert "; no checkpoint was written yet, nothing earlier lost." in line, line
    args, words = continued_args(line)
    assert words[-2:] == ["--resume", "auto"]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    as_json = lambda v: list(v) if isinstance(v, tuple) else v  # noqa: E731
    # (a run built in code names no set; on a command line its env id chooses the builtin one, of the same values)
    compared = {k for k in config if k not in SITTING_FLAGS | {"settings"}}
    assert {k: as_json(getattr(args, k)) for k in compared} == {k: config[k] for k in compared}
    assert args.num_envs == 8 and args.seed == 3 and args.env_id == "Pendulum-v1"


def test_the_continue_line_without_last_pt_names_the_numbered_checkpoints_and_resumes_the_newest(
    tmp_path, monkeypatch, capsys
):
    """last.pt never fits, the numbered checkpoints do: the line names them with their steps, and its command resumes
    the newest (a --resume auto would refuse without last.pt); run, it continues the run from there."""
    failing_saves(monkeypatch, lambda name: name.startswith(".last.pt"))
    with pytest.raises(SystemExit) as ended:
        train("ppo", tmp_path, total_timesteps=units("ppo", 4), checkpoint_interval=1, save_interval=3)
    line = str(ended.value.code)
    ckpts = tmp_path / "run" / "checkpoints"
    steps = [units("ppo", i) for i in (1, 2)]  # iteration 3 writes last.pt first: it fails there
    assert (
        f"no last.pt was written yet; the run's checkpoints in {ckpts}: "
        + ", ".join(f"step_{s}.pt (global step {s:,})" for s in steps)
    ) in line, line
    args, words = continued_args(line)
    assert words[-2:] == ["--resume", str(ckpts / f"step_{steps[-1]}.pt")]
    monkeypatch.undo()
    capsys.readouterr()
    load_script("ppo").main(args)
    assert f"resumed from {ckpts / f'step_{steps[-1]}.pt'} at iteration 2" in capsys.readouterr().out
    assert load_checkpoint(ckpts / "last.pt")["global_step"] == units("ppo", 4)


# --------------------------------------------------------------------------------------------
# a run directory removed while the run trains
# --------------------------------------------------------------------------------------------
def removed_at_iteration(monkeypatch, n: int, then=None) -> None:
    """The run directory is removed (rm -rf) just before iteration `n` decides what it writes; `then(run_dir)` after."""
    module = load_script("ppo")
    real, done = module.what_is_due, []

    def what_is_due(run, final_iteration):
        if run.iteration == n and not done:
            done.append(n)
            shutil.rmtree(run.run_dir)
            if then is not None:
                then(run.run_dir)
        return real(run, final_iteration)

    monkeypatch.setattr(module, "what_is_due", what_is_due)


def test_a_removed_run_directory_is_made_again_with_what_the_process_holds(tmp_path, monkeypatch, capsys):
    """rm -rf of the run directory while the run trains: the run makes it again under its lock, saves last.pt of the
    step it is at, config.json and a new event file, stops, and says so in one line with the command that continues;
    exit status 1. The command continues the run from that last.pt."""
    run_dir = tmp_path / "run"
    removed_at_iteration(monkeypatch, 3)
    with pytest.raises(SystemExit) as ended:
        train("ppo", tmp_path, total_timesteps=units("ppo", 6), save_interval=2)
    line = ended.value.code
    last = run_dir / "checkpoints" / "last.pt"
    assert isinstance(line, str) and line.startswith(
        f"error: the run directory {run_dir} was removed while the run trained (at global step {units('ppo', 3):,}): "
        f"made it again with what this process held: {last} (global step {units('ppo', 3):,}), config.json, a new "
        "event file and summary.json. Continue with: python algos/ppo.py "
    ), line
    assert load_checkpoint(last)["global_step"] == units("ppo", 3)
    assert (run_dir / "config.json").is_file() and len(list(run_dir.glob("events.out.tfevents.*"))) == 1
    assert not (run_dir / LOCK).exists()
    monkeypatch.undo()
    capsys.readouterr()
    summary = train("ppo", tmp_path, total_timesteps=units("ppo", 6), resume="auto")
    assert f"resumed from {last} at iteration 3" in capsys.readouterr().out and summary["global_step"] == units(
        "ppo", 6
    )


def test_a_removed_run_directory_that_cannot_be_made_again_says_nothing_was_saved(tmp_path, monkeypatch):
    """The run directory removed and a file in its place: it cannot be made again. The line says that nothing was
    saved and names no checkpoint path (none exists)."""
    run_dir = tmp_path / "run"
    removed_at_iteration(monkeypatch, 3, then=lambda path: path.write_text("in the way"))
    with pytest.raises(SystemExit) as ended:
        train("ppo", tmp_path, total_timesteps=units("ppo", 6), save_interval=2)
    line = str(ended.value.code)
    assert line.startswith(
        f"error: the run directory {run_dir} was removed while the run trained (at global step "
        f"{units('ppo', 3):,}), and cannot be made again (File exists): nothing was saved; "
    ), line
    assert ".pt" not in line


def test_a_run_directory_removed_during_a_write_is_saved_from_memory(tmp_path, monkeypatch, capsys):
    """Removed while the iteration writes (here: its log, whose event file is gone at once): the run's error is the
    write's, and the run saves what it holds then: last.pt of the model, optimizers and state at its step (its envs
    start new episodes when resumed: their last observation is the script's), config.json, a new event file. The
    line names only what exists; the command continues the run."""
    import common.loop

    run_dir, real, done = tmp_path / "run", common.loop.log_iteration, []

    def log_iteration(run, *args, **kwargs):
        if run.iteration == 3 and not done:
            done.append(3)
            shutil.rmtree(run.run_dir)
            real(run, *args, **kwargs)
            run.writer.flush()  # the event file's write fails now, not at some later call
        return real(run, *args, **kwargs)

    monkeypatch.setattr(common.loop, "log_iteration", log_iteration)
    with pytest.raises(SystemExit) as ended:
        train("ppo", tmp_path, total_timesteps=units("ppo", 6), save_interval=2)
    line = ended.value.code
    assert isinstance(line, str) and line.startswith(
        f"error: the run directory {run_dir} was removed while the run trained (at global step {units('ppo', 3):,}): "
        "made it again with what this process held: checkpoints/last.pt (global step "
        f"{units('ppo', 3):,}; its envs start new episodes when resumed), config.json, a new event file, "
        "summary.json. Continue with: python algos/ppo.py "
    ), line
    last = run_dir / "checkpoints" / "last.pt"
    assert load_checkpoint(last)["global_step"] == units("ppo", 3) and not (run_dir / LOCK).exists()
    monkeypatch.undo()
    capsys.readouterr()
    summary = train("ppo", tmp_path, total_timesteps=units("ppo", 6), resume="auto")
    assert f"resumed from {last} at iteration 3" in capsys.readouterr().out
    assert summary["global_step"] == units("ppo", 6)
