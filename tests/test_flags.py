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
import math
import subprocess
import sys
import typing
from dataclasses import fields, replace
from typing import Annotated, Literal

import pytest

from common.args import RunArgs, check_numbers, declared_bounds, parse_args
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
