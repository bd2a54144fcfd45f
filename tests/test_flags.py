"""Bad flag values, generated for every script in algos/ (found by glob) and every numeric or choice flag of its
Args (RunArgs' and its own), not listed by hand: a value outside a declared bound (common.args.declared_bounds:
Ge/Gt/Le/Lt; NaN for a float), a non-number for an int or float flag, a non-integer for an int flag, a word that is
not one of a Literal flag's choices. Each ends with one line on stderr naming the flag and the exit status of a
usage error, 2 (tyro's own), before anything is written.

Judged in this process through the functions a script calls (common.args.parse_args, then check_numbers, which
start_run calls before it creates the run directory), and once per script in a process of its own (the exit status,
the one line, no run directory). Not generated: the checks a script makes later, in its main (a batch that does not
divide into minibatches, flags that contradict each other), and string flags (an env id, JSON), which have tests
of their own in tests/test_scripts.py.
"""

from __future__ import annotations

import functools
import json
import math
import shlex
import subprocess
import sys
import typing
from dataclasses import asdict, fields, replace
from typing import Annotated, Literal

import pytest
import torch

from common.args import (
    SITTING_FLAGS,
    RunArgs,
    check_numbers,
    declared_bounds,
    given_flags,
    parse_args,
    take_flags_from,
)
from common.record import Run
from common.run import open_run
from tests import fake_mjlab
from tests.helpers import ROOT, load_script, subprocess_env

SCRIPTS = sorted(path.stem for path in (ROOT / "algos").glob("*.py"))


def flag_type(hint):
    """(int, float or the choices as words, how many words the flag takes: 1, 2, ... or None for any number), or
    None for a flag that is neither a number, numbers nor a choice."""
    if typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    members = [m for m in typing.get_args(hint) or (hint,) if m is not type(None)]
    if typing.get_origin(hint) not in (typing.Union, type(int | None)):
        members = [hint]
    count = 1
    if len(members) == 1 and typing.get_origin(members[0]) is tuple:
        items = typing.get_args(members[0])
        members, count = [items[0]], (None if items[-1] is Ellipsis else len(items))
    if members in ([int], [float]):
        return members[0], count
    if any(typing.get_origin(m) is Literal for m in members) and all(
        m is bool or typing.get_origin(m) is Literal for m in members
    ):
        return [str(c) for m in members for c in ((True, False) if m is bool else typing.get_args(m))], count
    return None


def outside(bound, kind) -> list:
    """Values just outside one declared bound, of the flag's type (an int flag gets ints)."""
    v = bound.value
    if kind is int:
        return [{">=": math.ceil(v) - 1, ">": math.floor(v), "<=": math.floor(v) + 1, "<": math.ceil(v)}[bound.op]]
    return [{">=": v - 1.0, ">": v, "<=": v + 1.0, "<": v}[bound.op]]


def generated_cases(args_class) -> list[tuple[str, list[str], object]]:
    """(--flag, the words after it, the value tyro reads from them where check_numbers must refuse it, else None:
    parse_args must refuse the words) for every numeric or choice flag of `args_class`."""
    hints = typing.get_type_hints(args_class, include_extras=True)
    bounds = declared_bounds(args_class)
    cases = []
    for f in fields(args_class):
        typed = flag_type(hints[f.name])
        if typed is None:
            continue
        kind, count = typed
        flag = "--" + f.name.replace("_", "-")
        if isinstance(kind, list):
            cases.append((flag, ["not-a-choice"], None))
            continue
        values = [x for bound in bounds.get(f.name, ()) for x in outside(bound, kind)]
        values += [math.nan] if kind is float and f.name in bounds else []
        for x in values:  # every number of a tuple flag out of range
            cases.append((flag, [repr(x)] * (count or 1), x if count == 1 else (x,) * (count or 1)))
        cases.append((flag, ["abc"] * (count or 1), None))
        if kind is int:
            cases.append((flag, ["1.5"] * (count or 1), None))
        if count is not None and count != 1:  # one number short (a flag of any number of them may have none)
            cases.append((flag, ["1"] * (count - 1), None))
    return cases


def one_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def same(a, b) -> bool:
    return a == b or (a != a and b != b) or (isinstance(a, tuple) and len(a) == len(b) and all(map(same, a, b)))


def test_every_bad_numeric_or_choice_flag_value_of_every_script_is_a_one_line_usage_error(capsys, monkeypatch):
    import common.args

    # the --help texts, read from each class's source: the same at every call, and most of a call's time
    monkeypatch.setattr(common.args, "field_docs", functools.cache(common.args.field_docs))
    tried = {}
    for script in SCRIPTS:
        args_class = load_script(script).Args
        defaults = parse_args(args_class, [])
        check_numbers(defaults)  # the defaults hold: what is refused below is the bad value
        cases = generated_cases(args_class)
        assert cases, f"{script}: no numeric or choice flag found"
        # the values tyro reads, in rounds of at most one per flag: one parse of each round (a value tyro refused
        # would stop it), then each flag's value checked on its own (check_numbers stops at the first out of range)
        ranged = [case for case in cases if case[2] is not None]
        while ranged:
            round_ = list({flag: (flag, words, value) for flag, words, value in reversed(ranged)}.values())
            ranged = [case for case in ranged if case not in round_]
            parsed = parse_args(args_class, [word for flag, words, _ in round_ for word in (flag, *words)])
            assert capsys.readouterr().err == ""
            for flag, words, value in round_:
                name = flag[2:].replace("-", "_")
                assert same(getattr(parsed, name), value), (script, flag, words, getattr(parsed, name))
                with pytest.raises(SystemExit) as exit_:
                    check_numbers(replace(defaults, **{name: value}))
                line = one_line(capsys)
                assert exit_.value.code == 2 and str(exit_.value) == line, (script, flag, words, exit_.value.code)
                assert line.startswith((f"error: {flag} must be ", f"error: each of {flag} must be ")), line
        for flag, words, _ in (case for case in cases if case[2] is None):
            with pytest.raises(SystemExit) as exit_:
                parse_args(args_class, [flag, *words])
            line = one_line(capsys)
            assert exit_.value.code == 2 and line.startswith(f"error: {flag} takes "), (script, flag, words, line)
        tried[script] = len(cases)
    print(f"bad flag values tried: {sum(tried.values())} over {len(tried)} scripts {tried}")
    assert set(tried) == set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_bad_flag_value_exits_with_a_usage_error_in_one_line_and_writes_nothing(script, tmp_path):
    """A script run as a program, one generated case each (of its own flags where it has one): a range that
    check_numbers refuses (at start_run) for every other script, a word that parse_args refuses for the rest. Exit
    status 2, the one line on stderr, and no run directory in --output-dir."""
    ranged = SCRIPTS.index(script) % 2 == 0
    cases = [case for case in generated_cases(load_script(script).Args) if (case[2] is not None) == ranged]
    own = [case for case in cases if case[0][2:].replace("-", "_") not in RunArgs.__dataclass_fields__]
    flag, words, _ = (own or cases)[0]
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, f"algos/{script}.py", flag, *words, "--output-dir", str(out), "--device", "cpu"],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith((f"error: {flag} ", f"error: each of {flag} ")), lines
    assert not out.exists(), list(out.iterdir())


# --------------------------------------------------------------------------------------------
# A resumed run's flags: every one it was started with, however the command line resumes it
# --------------------------------------------------------------------------------------------
def resolved(module, argv: list[str], monkeypatch) -> dict:
    """The Args of `argv` as the script resolves them (parse_args, start_run, open_run: a resumed run's flags taken
    from its checkpoint), without training or writing anything."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with monkeypatch.context() as patched:
        patched.setattr(module, "train", lambda run, args: (open_run(run), asdict(args))[1])
        return module.main(parse_args(module.Args, argv))


def run_parsed(module, argv: list[str], monkeypatch) -> dict:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # choose_threads keeps off
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return module.main(parse_args(module.Args, argv))
    finally:
        torch.set_num_threads(threads)


def test_a_resumed_run_keeps_every_flag_it_was_started_with_however_it_is_resumed(tmp_path, monkeypatch, capsys):
    """The issue's runs: a --settings builtin MinAtar run started with --eval-interval 5 --log-interval 5, stopped
    (--max-wall-seconds, a flag of its sitting), resumed with --resume auto alone and with --env-id given again. Both
    resolve to the same Args, those of its config.json (the sitting's flags aside): the builtin values (128 eval envs,
    not the minatar set's 16), the intervals; the "from the checkpoint" line is a shell fragment that parses back to
    them; a resume leaves the run's values in config.json as they were. A value given again differently is applied with
    a notice; another --settings is refused in one line."""
    ppo = load_script("ppo")
    where = ["--output-dir", str(tmp_path), "--run-name", "run", "--device", "cpu", "--no-progress"]
    sizes = ["--encoder", "minatar", "--num-envs", "4", "--num-steps", "8", "--num-minibatches", "2"]
    first = ["--env-id", "MinAtar/Breakout-v1", "--settings", "builtin", *sizes, "--total-timesteps", "320"]
    first += ["--eval-interval", "5", "--log-interval", "2", "--max-wall-seconds", "0", *where]
    stopped = run_parsed(ppo, first, monkeypatch)
    assert stopped["stop_reason"] == "max_wall_seconds" and stopped["iteration"] == 2
    config_path = tmp_path / "run" / "config.json"
    config = json.loads(config_path.read_text())
    assert (config["settings"], config["num_eval_envs"], config["eval_interval"]) == ("builtin", 128, 5)
    capsys.readouterr()

    plain = resolved(ppo, ["--resume", "auto", *where], monkeypatch)
    fragment = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("from the checkpoint: "))
    again = resolved(ppo, ["--env-id", "MinAtar/Breakout-v1", "--resume", "auto", *where], monkeypatch)
    assert plain == again
    assert (plain["settings"], plain["num_eval_envs"], plain["eval_interval"], plain["log_interval"]) == (
        "builtin",
        128,
        5,
        2,
    )
    as_json = json.loads(json.dumps(plain))  # tuples as the config's lists
    assert {k: v for k, v in as_json.items() if k not in SITTING_FLAGS} == {
        k: v for k, v in config.items() if k not in SITTING_FLAGS
    }
    pasted = parse_args(ppo.Args, shlex.split(fragment.removeprefix("from the checkpoint: ")))
    assert {k: v for k, v in asdict(pasted).items() if k not in SITTING_FLAGS} == {
        k: v for k, v in plain.items() if k not in SITTING_FLAGS
    }

    resumed = run_parsed(ppo, ["--resume", "auto", "--max-wall-seconds", "0", *where], monkeypatch)
    assert resumed["iteration"] == 4  # logged (and so stopped) every 2 iterations: the run's --log-interval
    after = json.loads(config_path.read_text())
    assert after["resume"] == "auto"  # the sitting's flags are the sitting's; the run's values are as they were
    assert {k: v for k, v in after.items() if k not in SITTING_FLAGS} == {
        k: v for k, v in config.items() if k not in SITTING_FLAGS
    }
    assert "notice: given again" not in capsys.readouterr().out

    changed = resolved(ppo, ["--resume", "auto", "--eval-interval", "3", *where], monkeypatch)
    assert changed == {**plain, "eval_interval": 3}
    assert "notice: given again with other values than the run's: --eval-interval 3 (the run's: --eval-interval 5)" in (
        capsys.readouterr().out
    )
    with pytest.raises(SystemExit, match=r"^error: .*last\.pt is a run of --settings builtin, not minatar: a resume"):
        resolved(ppo, ["--settings", "minatar", "--resume", "auto", *where], monkeypatch)


# a run of each family's set with flags of its own: (its env id, the flags it was started with, the module it needs)
FAMILY_RUNS = {
    "builtin-on-minatar": (
        "MinAtar/Breakout-v1",
        ["--settings", "builtin", "--encoder", "minatar", "--eval-interval", "5"],
        "minatar",
    ),
    "minatar": ("MinAtar/Breakout-v1", ["--learning-rate", "0.001", "--no-reward-norm"], "minatar"),
    "mujoco": ("gym:HalfCheetah-v5", ["--gamma", "0.98", "--lr-schedule", "constant"], "mujoco"),
    "atari": ("gym:ALE/Pong-v5", ["--reward-norm", "--clip-coef", "0.2"], "ale_py"),
    "task": ("mjlab:Fake-Point-Tuned", ["--gamma", "0.97", "--timeout-bootstrap", "unless-terminated"], None),
}
FAMILY_SIZES = ["--num-envs", "4", "--num-steps", "8", "--num-minibatches", "2", "--total-timesteps", "320"]
FAMILY_SIZES += ["--num-eval-envs", "2", "--device", "cpu", "--no-progress"]


def from_the_checkpoint(out: str) -> list[str]:
    (line,) = [line for line in out.splitlines() if line.startswith("from the checkpoint: ")]
    return shlex.split(line.removeprefix("from the checkpoint: "))


@pytest.mark.parametrize("family", FAMILY_RUNS)
def test_the_from_the_checkpoint_line_pasted_with_the_env_id_starts_the_same_run(family, tmp_path, monkeypatch, capsys):
    """A run of each family's set, stopped at its start, resumed with --resume auto --env-id (the env id alone would
    choose the family's set): its "from the checkpoint" line, pasted with the env id into a new run, starts the run
    the first one was, config.json for config.json (the sitting's flags aside). ale-py absent: the atari run skips
    (test_the_from_the_checkpoint_line_is_each_sets_run below checks its line without an env)."""
    env_id, flags, needs = FAMILY_RUNS[family]
    if needs is not None:
        pytest.importorskip(needs)
    else:
        fake_mjlab.install(monkeypatch)
    ppo = load_script("ppo")
    monkeypatch.setattr(sys, "argv", ["ppo.py"])  # the task set counts its iterations in the command line's envs
    where = lambda name: ["--output-dir", str(tmp_path), "--run-name", name, "--max-wall-seconds", "0"]  # noqa: E731
    run_parsed(ppo, ["--env-id", env_id, *flags, *FAMILY_SIZES, *where("first")], monkeypatch)
    first = json.loads((tmp_path / "first" / "config.json").read_text())
    capsys.readouterr()
    resolved(ppo, ["--resume", "auto", "--env-id", env_id, *where("first")], monkeypatch)
    line = from_the_checkpoint(capsys.readouterr().out)
    assert "--settings" in line or family != "builtin-on-minatar", line
    pasted = line if "--env-id" in line else ["--env-id", env_id, *line]
    run_parsed(ppo, [*pasted, *where("pasted")], monkeypatch)
    again = json.loads((tmp_path / "pasted" / "config.json").read_text())
    assert {k: v for k, v in again.items() if k not in SITTING_FLAGS} == {
        k: v for k, v in first.items() if k not in SITTING_FLAGS
    }


@pytest.mark.parametrize("family", FAMILY_RUNS)
def test_the_from_the_checkpoint_line_is_each_sets_run(family, monkeypatch, capsys):
    """Without an env (the atari set where ale-py is absent): the line a resume with --env-id says for the values of a
    run of each set, pasted with the env id, parses to those values."""
    env_id, flags, _ = FAMILY_RUNS[family]
    fake_mjlab.install(monkeypatch)
    monkeypatch.setattr(sys, "argv", ["ppo.py"])
    ppo = load_script("ppo")
    saved = json.loads(json.dumps(asdict(parse_args(ppo.Args, ["--env-id", env_id, *flags, *FAMILY_SIZES]))))
    args = parse_args(ppo.Args, ["--resume", "auto", "--env-id", env_id, "--gamma", "0.9"])
    run = Run(args=args, algo="ppo", rank=0, world_size=1, device=torch.device("cpu"), is_main=True)
    run.given, run.resume_path = given_flags(args), "last.pt"
    take_flags_from(run, {"args": saved})
    line = from_the_checkpoint(capsys.readouterr().out)
    line = line if "--env-id" in line else ["--env-id", env_id, *line]
    pasted = json.loads(json.dumps(asdict(parse_args(ppo.Args, line))))
    assert {k: v for k, v in pasted.items() if k not in SITTING_FLAGS} == {
        k: v for k, v in saved.items() if k not in SITTING_FLAGS
    }


def test_the_from_the_checkpoint_line_is_a_shell_fragment(capsys):
    """JSON quoted, a tuple flag with its values (alone when it has none), booleans as switches, a string with a
    space or a quote quoted: pasted into a command line, it parses back to the run's values."""
    ppo = load_script("ppo")
    saved = asdict(
        ppo.Args(
            env_id="envpool:Pong-v5",
            settings="builtin",  # named, as the line must: the env id alone would choose the atari set
            env_kwargs='{"preset": "atari"}',
            eval_env_kwargs='{"note": "it\'s"}',
            hidden_sizes=(),
            shared_encoder=True,
            reward_norm=False,
            wandb_entity="my team",
            target_return=21.0,
        )
    )
    args = parse_args(ppo.Args, ["--resume", "auto"])
    run = Run(args=args, algo="ppo", rank=0, world_size=1, device=torch.device("cpu"), is_main=True)
    run.given, run.resume_path = given_flags(args), "last.pt"
    take_flags_from(run, {"args": saved})
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("from the checkpoint: ")]
    assert "--hidden-sizes --" in line and "--shared-encoder" in line and "--no-reward-norm" in line, line
    pasted = parse_args(ppo.Args, shlex.split(line.removeprefix("from the checkpoint: ")))
    taken = {k: v for k, v in saved.items() if k not in SITTING_FLAGS}
    assert {k: v for k, v in asdict(pasted).items() if k in taken} == taken


def test_every_bad_input_exits_2_as_a_bad_flag_does(tmp_path):
    from tests.helpers import run

    """A bad env id is found once the envs are made, a bad flag by the parser: both are usage errors, one line, 2."""
    common = [sys.executable, "algos/ppo.py", "--output-dir", str(tmp_path), "--no-progress"]
    for flags in (["--env-id", "NoSuchEnv-v0"], ["--num-envs", "0"]):
        result = run([*common, *flags], timeout=120)
        assert result.returncode == 2, (flags, result.stdout[-2000:], result.stderr[-2000:])
        said = (result.stdout + (result.stderr or "")).strip().splitlines()
        assert said[-1].startswith("error:") and "Traceback" not in result.stdout, said[-5:]
    assert not any(tmp_path.iterdir())
