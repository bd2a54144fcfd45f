"""The project's shape, as the design states it: `common/` imports in one direction (no circle, counting the imports
made for type hints and inside functions), the run record at its bottom, and every algorithm one file a reader
takes in at once."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_SCRIPT_LINES = 500


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def common_imports() -> dict[str, set[str]]:
    """Each `common` module -> the `common` modules it imports anywhere in its source (top level, under
    TYPE_CHECKING, inside functions); `from common.envs import frames` names the submodule."""
    paths = {module_name(p): p for p in (ROOT / "common").rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{name}: relative import (the project imports by absolute name)"
                if node.module and node.module.split(".")[0] == "common":
                    deps |= {
                        f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in paths else node.module
                        for a in node.names
                    }
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.split(".")[0] == "common"}
        graph[name] = deps - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (its modules in order, the first repeated at the end), or None."""
    state = {}  # module -> "open" while on the path, "done" after

    def visit(node, path):
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                return path[path.index(dep) :] + [dep] if dep in path else [node, dep, node]
            if dep not in state and (cycle := visit(dep, path + [dep])):
                return cycle
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def test_common_has_no_import_circle():
    graph = common_imports()
    assert {"common.run", "common.record", "common.capture", "common.video", "common.envs.frames"} <= set(graph)
    assert find_cycle(graph) is None, f"import circle in common/: {' -> '.join(find_cycle(graph))}"


def test_the_cycle_finder_finds_what_a_type_hint_import_would_close():
    """The check above can fail: the import that `Run` lived behind (capture -> run, for a type hint) is a circle."""
    graph = common_imports()
    graph["common.capture"] = graph["common.capture"] | {"common.run"}
    assert find_cycle(graph) is not None and "common.run" in find_cycle(graph)


@pytest.mark.parametrize("leaf", ["common.record", "common.envs.frames", "common.args", "common.distributed"])
def test_leaf_modules_import_no_other_common_module(leaf):
    assert common_imports()[leaf] == set()


def test_video_imports_nothing_from_the_env_package():
    assert not {m for m in common_imports()["common.video"] if m.startswith("common.envs")}


def test_run_record_is_taken_from_below_run():
    """capture, checkpoint, stats and evaluation get `Run` from the leaf, and run.py still offers it to scripts."""
    graph = common_imports()
    for name in ("common.capture", "common.checkpoint", "common.stats"):
        assert "common.run" not in graph[name], name
    import common.record
    import common.run

    assert common.run.Run is common.record.Run


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "algos").glob("*.py")))
def test_every_script_fits_in_500_lines(script):
    lines = len((ROOT / "algos" / script).read_text().splitlines())
    assert lines <= MAX_SCRIPT_LINES, f"algos/{script} has {lines} lines (at most {MAX_SCRIPT_LINES})"
