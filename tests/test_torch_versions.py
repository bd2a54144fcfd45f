"""What the scripts rely on from the torch at hand is probed, not read from its version: the guard of
common.capture.compiled against writes that inductor drops, and the supported range said at start.

These run on every torch CI runs (the newest the index serves and the oldest supported): each asserts
what is true of the torch at hand, whichever answer its probe gives.
"""

from __future__ import annotations

import re
import sys
from types import SimpleNamespace

import pytest
import torch

import common.capture
from common.capture import PROBED_FORMS, TORCH_RANGE, check_torch, compiled, lost_writes
from tests.helpers import ROOT, run

FORMS = [form for form in PROBED_FORMS if form != "copy"]  # copy is a method write to the guard


def cpu_run():
    said = []
    return SimpleNamespace(args=SimpleNamespace(compile=True), device=torch.device("cpu"), say=said.append), said


def write(form: str):
    """A function that makes one write of `form` to its 0-d float64 argument `ema`, as a copy's statistic would."""

    def ema_write(ema, x):
        m = x.abs().mean()
        if form == "method":
            ema.mul_(0.9).add_(0.1 * m)
        elif form == "operator":
            ema *= 0.9
            ema += 0.1 * m
        elif form == "out":
            torch.add(torch.mul(ema, 0.9, out=ema), 0.1 * m, out=ema)
        elif form == "setitem":
            ema[...] = ema * 0.9 + 0.1 * m
        elif form == "foreach":
            torch._foreach_mul_([ema], 0.9)
            torch._foreach_add_([ema], [0.1 * m])
        return m

    return ema_write


@pytest.mark.parametrize("form", FORMS)
def test_the_guard_is_on_only_for_a_write_the_probe_finds_lost_and_the_result_is_eagers(form, monkeypatch):
    lost = (form, torch.float64, True) in lost_writes("cpu")
    compiled_graphs = []
    real_compile_fx = torch._inductor.compile_fx.compile_fx
    monkeypatch.setattr(
        torch._inductor.compile_fx, "compile_fx", lambda *a, **k: compiled_graphs.append(1) or real_compile_fx(*a, **k)
    )
    torch._dynamo.reset()
    run, said = cpu_run()
    x = torch.randn(64, dtype=torch.float64)  # float64 throughout: inductor's reduction order moves the last bit only
    eager, ema = torch.ones((), dtype=torch.float64), torch.ones((), dtype=torch.float64)
    write(form)(eager, x)
    compiled(run, write(form))(ema, x)
    assert ema.item() == pytest.approx(eager.item(), rel=1e-9) and ema.item() != 1.0  # whether guarded or kept
    if lost:  # torch drops it: the graph runs as dynamo traced it, and the run names the tensor
        assert not compiled_graphs
        assert len(said) == 1 and re.fullmatch(
            rf"notice: ema_write writes in place to .*ema.*, a write that torch "
            rf"{re.escape(torch.__version__)} drops from a compiled graph on cpu: "
            r"that graph runs uncompiled",
            said[0],
        ), said
    else:  # torch keeps it: inductor compiles the graph, and nothing is said
        assert compiled_graphs and not said


def test_the_probe_reports_a_write_it_finds_lost(monkeypatch):
    """The probe reads its answer from the tensors: a compiler that loses the out= writes to 0-d float64
    tensors (stood in for by an inductor whose graphs skip every out= call) is reported as exactly that."""
    import torch._inductor.compile_fx

    real_compile_fx = torch._inductor.compile_fx.compile_fx

    def losing_out_writes(gm, example_inputs, **kwargs):
        for node in list(gm.graph.nodes):
            out = node.kwargs.get("out")
            value = getattr(out, "meta", {}).get("example_value")
            if isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype == torch.float64:
                node.replace_all_uses_with(node.args[0])
                gm.graph.erase_node(node)
        gm.recompile()
        return real_compile_fx(gm, example_inputs, **kwargs)

    monkeypatch.setattr(torch._inductor.compile_fx, "compile_fx", losing_out_writes)
    common.capture._lost_writes.cache_clear()
    torch._dynamo.reset()
    try:
        found = lost_writes("cpu")
    finally:
        common.capture._lost_writes.cache_clear()
    assert ("out", torch.float64, True) in found
    assert ("out", torch.float32, True) not in found and ("out", torch.float64, False) not in found


def test_a_torch_outside_the_supported_range_is_named_in_one_line(capsys, monkeypatch):
    lo, hi = TORCH_RANGE
    major, minor = (int(x) for x in hi.split("."))
    check_torch()  # the torch at hand is one CI runs, so nothing is said
    check_torch(f"{lo}.0a0+git1234")  # a pre-release build of the oldest counts as it
    check_torch(f"{hi}.0+cu132")  # the newest release CI runs, a CUDA build of it
    assert capsys.readouterr().out == ""
    older = f"{lo.split('.')[0]}.{int(lo.split('.')[1]) - 1}.0+cu130"
    check_torch(older)
    assert capsys.readouterr().out == (
        f"notice: torch {older} is older than the oldest release this project supports (torch>={lo}); "
        f'if something fails, pip install "torch>={lo}"\n'
    )
    newer = f"{major}.{minor + 1}.0"
    check_torch(newer)
    assert capsys.readouterr().out == (
        f"notice: torch {newer} is newer than the newest release this project's CI runs ({hi}): what the "
        f'compiler does is probed and the run goes on; if something fails, pip install "torch>={lo},<{newer[:-2]}"\n'
    )
    monkeypatch.setenv("RANK", "1")  # said once, by rank 0
    check_torch(older)
    check_torch(newer)
    assert capsys.readouterr().out == ""


def test_a_script_says_so_at_start_on_a_torch_outside_the_range():
    """The check runs at the start of every script, before anything else is said."""
    lo, _ = TORCH_RANGE
    older = f"{lo.split('.')[0]}.{int(lo.split('.')[1]) - 1}.0"
    code = (
        f"import sys, torch; torch.__version__ = {older!r}; sys.argv = ['ppo.py', '--num-envs', '0']; "
        f"import runpy; runpy.run_path('algos/ppo.py', run_name='__main__')"
    )
    result = run([sys.executable, "-c", code], timeout=120)
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith(f"notice: torch {older} is older than the oldest release this project supports"), lines
    assert result.returncode != 0 and "--num-envs" in lines[-1]  # and the run went on to its own checks


def test_pyproject_and_ci_state_the_range_the_code_checks():
    lo, hi = TORCH_RANGE
    pyproject = (ROOT / "pyproject.toml").read_text()
    # a floor and no cap: an install never downgrades a newer torch, nor tensordict
    assert re.findall(r'"torch[^"]*"', pyproject) == [f'"torch>={lo}"']
    assert re.findall(r'"tensordict[^"]*"', pyproject) == ['"tensordict>=0.15"']
    ci = (ROOT / ".ci" / "run").read_text()
    # CI's oldest lane installs the floor, its latest lane the newest release
    assert re.search(rf"^OLDEST_TORCH={re.escape(lo)}\.0 ", ci, re.M)
    assert re.search(rf"^NEWEST_TORCH={re.escape(hi)}\.0 ", ci, re.M)
    readme = (ROOT / "README.md").read_text()
    # the README's CPU install takes a torch of the range, which the project's install then keeps
    assert f'pip install "torch>={lo}" --index-url https://download.pytorch.org/whl/cpu' in readme
    # and it names the releases CI runs, and what a newer torch says
    assert f"torch {lo}.0 and {hi}.0" in readme and "is newer than the newest release this project's CI runs" in readme
