"""How a script's functions reach each other (issue: the algorithm's math in view of its loop): each calls the next
by name, read from train's scope, and the compile-and-capture block rebinds those names in place. No function of a
script is handed another of its functions as an argument (so that a wrapped one could be swapped in), and train
keeps at most two lambdas. Read from the source alone, for every original script."""

from __future__ import annotations

import ast

import pytest

from tests.helpers import ROOT
from tests.test_layout import original_scripts

SCRIPTS = original_scripts(ROOT / "algos")


def passed_functions(tree: ast.Module) -> list[str]:
    """`f(g)` where both f and g are functions the script defines (at any depth), as "f(g) at line n"."""
    defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    found = []
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in defined:
            for arg in [*call.args, *(k.value for k in call.keywords)]:
                if isinstance(arg, ast.Name) and arg.id in defined:
                    found.append(f"{call.func.id}({arg.id}) at line {call.lineno}")
    return found


@pytest.mark.parametrize("script", SCRIPTS)
def test_no_function_of_a_script_is_handed_another_and_train_keeps_two_lambdas_at_most(script):
    tree = ast.parse((ROOT / "algos" / f"{script}.py").read_text())
    assert passed_functions(tree) == []
    train = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train")
    assert sum(isinstance(n, ast.Lambda) for n in ast.walk(train)) <= 2


def test_the_check_finds_a_function_handed_to_another():
    """What td3.py's train did before: update(critic_step, ...) and collect(act_and_step, obs)."""
    tree = ast.parse(
        "def train():\n"
        "    def critic_step(b): pass\n"
        "    def update(critic_step, at): critic_step(at)\n"
        "    def collect(f, obs): return f(obs)\n"
        "    def act_and_step(obs): return obs\n"
        "    update(critic_step, 1)\n"
        "    collect(act_and_step, obs=2)\n"
    )
    assert passed_functions(tree) == ["update(critic_step) at line 6", "collect(act_and_step) at line 7"]
