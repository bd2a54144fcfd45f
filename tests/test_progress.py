"""What a run says while it runs: the start's lines (plurals, the cadence in env steps), the progress lines between the
logged iterations, and nothing said before a usage error."""

import re

import pytest

import common.run
import common.settings
import common.stats
from common.args import parse_args
from tests.helpers import load_script

pqn = load_script("pqn")
ppo = load_script("ppo")

TINY = dict(
    device="cpu",
    run_name="run",
    num_envs=16,
    num_steps=8,
    num_minibatches=2,
    total_timesteps=16 * 8 * 4,
    num_eval_envs=4,
    hidden_sizes=(16,),
)


def test_the_start_says_its_cadence_in_env_steps_and_its_plurals(tmp_path, capsys):
    """One process of one env: singular nouns; the evaluation, checkpoint and log intervals in env steps beside the
    iterations they are counted in, whose size (--num-envs x --num-steps) the line names."""
    flags = dict(TINY, num_envs=1, num_steps=128, num_minibatches=1, total_timesteps=128, eval_interval=2)
    pqn.main(pqn.Args(output_dir=str(tmp_path), progress=False, save_interval=3, checkpoint_interval=4, **flags))
    said = capsys.readouterr().out.splitlines()
    assert (
        said[0].startswith("pqn on CartPole-v1: 1 process x 1 env on cpu;") and "; 1 iteration to step 128;" in said[0]
    )
    assert said[1] == (
        "eval every 256 steps (2 iterations of 128; 4 envs x 1 episode, at most 1,024 steps each), last.pt every "
        "384 steps (3 iterations), step_<step>.pt every 512 steps (4 iterations), a log every 128 steps (1 iteration)"
    ), said[1]
    assert any(line.startswith("pqn on CartPole-v1: 128 steps (1 iteration) in ") for line in said), said

    # --num-envs scales the iterations, and with them every interval: the line follows
    ppo.main(ppo.Args(output_dir=str(tmp_path / "wide"), progress=True, **dict(TINY, num_envs=64, eval_interval=0)))
    said = capsys.readouterr().out.splitlines()
    assert said[0].startswith("ppo on CartPole-v1: 1 process x 64 envs on cpu;")
    assert said[1] == (
        "no evaluation (--eval-interval 0), last.pt every 25,600 steps (50 iterations), a log every 512 steps "
        "(1 iteration), a progress line at one of them at least every 30 s"
    ), said[1]


def test_progress_lines_come_at_the_log_points_once_their_time_has_passed(tmp_path, capsys, monkeypatch):
    """A line with the step, the speed, the last training return and the time left at the first log point after
    PROGRESS_SECONDS (here 0: every log point), plain lines that a file keeps as they are; where the log points are
    further apart than twice that, one notice says how to get more. None with --no-progress."""
    monkeypatch.setattr(common.stats, "PROGRESS_SECONDS", 0.0)
    pqn.main(pqn.Args(output_dir=str(tmp_path), progress=True, eval_interval=0, **TINY))
    out = capsys.readouterr().out
    assert "\r" not in out
    lines = [line for line in out.splitlines() if line.startswith("iteration ")]
    assert len(lines) == 4, out
    for i, line in enumerate(lines, 1):
        pattern = (
            rf"iteration {i} step {128 * i} of 512: train return (no episode finished yet|-?\d+\.\d\d), SPS [\d,]+, "
        )
        assert re.fullmatch(pattern + r"(\d+ s|\d+ min|\d+ h \d\d min|\d+ d \d\d h|\?) left", line), line
    assert out.count("notice: the log points are ") == 1, out  # the first interval (the start-up's) is not judged

    pqn.main(pqn.Args(output_dir=str(tmp_path / "quiet"), progress=False, eval_interval=0, **TINY))
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith(("iteration ", "notice"))]


def test_progress_lines_come_before_30_s_pass_and_an_evaluation_line_counts_as_one(tmp_path, capsys, monkeypatch):
    """A progress line comes at the last log point before 30 s pass (the next expected as far off as the last one
    was): log points 10 s apart give one every other log point. The evaluation's line says what a progress line
    says: the time until the next one starts over from it."""
    clock = iter(range(0, 10_000, 10))  # one log point every 10 s (the start line at 0)
    monkeypatch.setattr(common.stats.Progress, "clock", staticmethod(lambda: next(clock)))
    pqn.main(pqn.Args(output_dir=str(tmp_path), progress=True, eval_interval=0, **TINY))
    lines = [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("iteration")]
    assert lines == ["iteration 2 step 256 of 512", "iteration 4 step 512 of 512"], lines

    # log points at 10, 30, 50, 70 s, each followed by an evaluation's line 15 s later
    clock = iter([0, *(t for i in range(4) for t in (10 + 20 * i, 25 + 20 * i))])
    monkeypatch.setattr(common.stats.Progress, "clock", staticmethod(lambda: next(clock)))
    pqn.main(pqn.Args(output_dir=str(tmp_path / "evaluated"), progress=True, eval_interval=1, **TINY))
    out = capsys.readouterr().out
    assert out.count(": eval return ") == 4 and not re.search(r"^iteration \d+ step \d+ of ", out, re.M), out


def test_durations_read_as_words():
    duration = common.stats.duration
    assert [duration(s) for s in (0, 59.4, 60, 3599, 3600 + 5 * 60, 2 * 86400 + 4 * 3600)] == [
        "0 s",
        "59 s",
        "1 min",
        "59 min",
        "1 h 05 min",
        "2 d 04 h",
    ]
    assert common.stats.plural(1, "process", "processes") == "1 process" and common.stats.plural(2048, "step") == (
        "2,048 steps"
    )


def test_nothing_is_said_before_a_usage_error(monkeypatch, capsys):
    """The threads line (and any other note on the run) comes once the flags have passed their checks."""
    monkeypatch.setattr(common.settings, "choose_threads", lambda: "threads: torch uses 1 of 2 cores")
    args = parse_args(pqn.Args, ["--eval-epsilon", "2", "--device", "cpu"])
    with pytest.raises(SystemExit) as exit:
        common.run.start_run(args, "pqn")
    assert exit.value.code == 2
    captured = capsys.readouterr()
    assert "threads:" not in captured.out + captured.err
    assert captured.err.strip() == "error: --eval-epsilon must be in [0, 1], got 2.0", captured.err


def test_the_settings_help_says_where_the_sets_are(capsys):
    with pytest.raises(SystemExit):
        parse_args(pqn.Args, ["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "listed at the top of --help" in out and out.index("named settings (--settings NAME") < out.index(
        "--settings"
    )


# An evaluation of 3 Pendulum episodes (200 steps each) on 4 envs: 10 chunks of 64 steps, at iteration 2 of 4
LONG_EVAL = dict(TINY, env_id="Pendulum-v1", eval_interval=2, eval_episodes=3, hidden_sizes=(16,))


def test_a_long_evaluation_says_it_is_alive_at_least_every_30_s(tmp_path, capsys, monkeypatch):
    """Between two chunks of an evaluation, a line once PROGRESS_SECONDS have passed since the run's last one: the
    episodes done, the time so far and the most that is left (its budget at the pace so far); the evaluation's own line
    follows as before. A clock 20 s further on at each reading: a line every other chunk. None with --no-progress."""
    import itertools

    import common.evaluation

    clock = itertools.count(0, 20)
    monkeypatch.setattr(common.stats.Progress, "clock", staticmethod(lambda: next(clock)))
    chunks = []
    after = common.evaluation.Watch.after
    monkeypatch.setattr(common.evaluation.Watch, "after", lambda self, *a: chunks.append(a[0]) or after(self, *a))
    summary = ppo.main(ppo.Args(output_dir=str(tmp_path), progress=True, **LONG_EVAL))
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("evaluation at step 256: ")]
    assert chunks.count(64) == 2 and len(lines) >= 4, (chunks, out)  # 9 chunks per evaluation, every other says
    pattern = (
        r"evaluation at step 256: \d+ of 12 episodes done after \d+ (s|min) \([\d,]+ of at most 640 steps each\), "
        r"at most \d+ (s|min) left"
    )
    assert all(re.fullmatch(pattern, line) for line in lines), lines
    done = [int(line.split(": ")[1].split(" of ")[0]) for line in lines]
    assert done == sorted(done) and done[0] < 12, done  # episodes end as the evaluation goes on
    assert out.index(lines[-1]) < out.index("iteration 2 step 256: eval return ")  # then the evaluation's own line
    assert summary["stop_reason"] == "total_timesteps" and summary["global_step"] == 512

    chunks.clear()
    ppo.main(ppo.Args(output_dir=str(tmp_path / "quiet"), progress=False, **LONG_EVAL))
    assert chunks and "evaluation at step" not in capsys.readouterr().out


def test_ctrl_c_during_an_evaluation_cuts_it_short_then_the_run_saves_and_stops(tmp_path, capsys, monkeypatch):
    """A SIGINT during an evaluation is answered at its next chunk: the evaluation ends there and says so, is not
    logged (its episodes are partly played), and the run saves last.pt and stops at once, with the command that
    continues it, as a SIGINT during an iteration does; the continued run ends as planned."""
    import os
    import signal

    import common.evaluation

    chunks = []
    after = common.evaluation.Watch.after

    def interrupting(self, steps, *rest):
        chunks.append(steps)
        if len(chunks) == 2:  # Ctrl-C while the second chunk ran
            os.kill(os.getpid(), signal.SIGINT)
        return after(self, steps, *rest)

    monkeypatch.setattr(common.evaluation.Watch, "after", interrupting)
    flags = dict(LONG_EVAL, output_dir=str(tmp_path), progress=False)
    summary = ppo.main(ppo.Args(**flags))
    out = capsys.readouterr().out
    assert chunks == [64, 128], chunks  # 2 of its 10 chunks
    assert summary["stop_reason"] == "signal:SIGINT" and summary["global_step"] == 256, summary
    assert re.search(
        r"^SIGINT: the evaluation at step 256 cut short after \d+ s \(\d+ of its episodes finished\): "
        r"not logged; saving last.pt and stopping$",
        out,
        re.M,
    ), out
    assert ": eval return " not in out and summary["best_eval_return"] is None, out
    assert (tmp_path / "run" / "checkpoints" / "last.pt").is_file()
    assert "--resume auto" in out.splitlines()[-1], out

    monkeypatch.setattr(common.evaluation.Watch, "after", after)
    resumed = ppo.main(ppo.Args(**flags, resume="auto"))
    assert resumed["stop_reason"] == "total_timesteps" and resumed["global_step"] == 512, resumed
