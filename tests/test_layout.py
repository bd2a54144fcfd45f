"""The project's shape, as the design states it: `common/` imports in one direction (no circle, counting the imports
made for type hints and inside functions), the run record at its bottom, and every algorithm in its own file: mostly
the algorithm, with its acting, env step, rollout loop, targets, update, checkpointed state and compile-and-capture
block in view; `common/` runs none of a script's steps and decides none of its captures. No size budget: a script is
as long as its algorithm needs."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
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


def test_checkpoint_and_evaluation_import_nothing_above_them():
    """The checkpoint reads the lock handle the run carries (not common.lock), and the evaluation holds its own chunk
    and budget (not common.run's): the run lifecycle calls both, neither calls back into it."""
    graph = common_imports()
    assert "common.lock" not in graph["common.checkpoint"]
    assert "common.run" not in graph["common.evaluation"]
    assert "common.evaluation" in graph["common.run"]


def original_scripts(algos: Path) -> list[str]:
    """Each original script in `algos`: a file whose stem is the `ALGO = "..."` it declares. A copy
    (`cp algos/ppo.py algos/ppo_myidea.py` keeps `ALGO = "ppo"`) is left out: it is a researcher's file, held to the
    contract tests and to nothing else."""
    scripts = []
    for path in sorted(algos.glob("*.py")):
        declared = re.search(r'^ALGO = "(\w+)"', path.read_text(), re.M)
        if declared and declared.group(1) == path.stem:
            scripts.append(path.stem)
    return scripts


def algorithm_share(text: str) -> float:
    """The share of a script's characters that is its algorithm (design.md, "What lives in a script"): its
    hyperparameters (the Args dataclass) and its networks, losses, targets, rollout and update (every top-level class
    and function but main and train); in train, the functions and lambdas it defines (the acting policy, the env step,
    the rollout loop, the gradient steps), its compile-and-capture block (each statement that compiles or captures)
    and its loop (rollout -> targets -> update -> log -> eval/save). The rest is the module's docstring and imports,
    the named settings, and train's setup (the envs, the networks' construction, the optimizers, the checkpointed
    state), which wires these together."""
    lines = text.splitlines(keepends=True)

    def characters(node) -> int:
        first = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
        return len("".join(lines[first - 1 : node.end_lineno]))

    def captures(node) -> bool:
        return bool(called_names(node) & {"compiled", "captured"})

    algorithm = 0
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name not in ("main", "train"):
            algorithm += characters(node)
        elif isinstance(node, ast.FunctionDef) and node.name == "train":
            algorithm += sum(
                characters(n)
                for n in node.body
                if isinstance(n, (ast.FunctionDef, ast.While, ast.For))
                or (isinstance(n, ast.Assign) and isinstance(n.value, ast.Lambda))
                or captures(n)
            )
    return algorithm / len(text)


ALGORITHM_SHARE = 0.58  # just under the least of the originals with their algorithm back in them (pqn.py: 0.59)


def test_every_original_script_is_mostly_algorithm():
    """What a script holds is mostly its algorithm: wiring that returns to a script shows here (as a copy of ppo.py
    with a long block of plumbing in it does)."""
    shares = {
        script: algorithm_share((ROOT / "algos" / f"{script}.py").read_text())
        for script in original_scripts(ROOT / "algos")
    }
    assert len(shares) == 7, shares
    assert min(shares.values()) >= ALGORITHM_SHARE, {script: f"{share:.0%}" for script, share in shares.items()}
    ppo = (ROOT / "algos" / "ppo.py").read_text()
    assert algorithm_share(ppo + "".join(f"# plumbing, line {i}\n" for i in range(1_000))) < ALGORITHM_SHARE


# What a researcher changes, by the script that holds it (design.md, "What lives in a script"): each name is defined
# in every script listed and nowhere in common/.
IN_THE_SCRIPTS = {
    "td3": ("random_act", "act_and_step", "store", "actor_schedule", "replay_ready", "n_step_batch"),
    "sac": ("random_act", "act_and_step", "store", "actor_schedule", "replay_ready", "n_step_batch"),
    "ppo_lstm": ("carry_over", "episode_starts", "env_minibatches"),
    "distill": ("carry_over", "episode_starts", "env_minibatches"),
}
# what common/ held before: a helper that ran a script's steps or decided its captures, or the recurrent state
MOVED_OUT_OF_COMMON = {name for names in IN_THE_SCRIPTS.values() for name in names} | {
    "rollout",
    "fold_and_ready",
    "compile_and_capture",
    "recurrent_sizes",
    "recurrent_ppo_state",
    "begin_recurrent",
    "begin_iterations",
    "end_iteration",
}
# the common modules that compile or capture a function of their own (the primitives, the evaluation's chunk)
CAPTURING_MODULES = {"common.capture", "common.evaluation"}


def defined_names(path: Path) -> set[str]:
    """Every function defined in a module, at any depth (a lambda bound to a name counts)."""
    tree = ast.parse(path.read_text())
    names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return names | {
        t.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Lambda)
        for t in n.targets
        if isinstance(t, ast.Name)
    }


def called_names(tree: ast.AST) -> set[str]:
    """The names a piece of code calls: `f(...)` and `module.f(...)` both give `f`."""
    calls = {n.func for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {f.id if isinstance(f, ast.Name) else f.attr for f in calls if isinstance(f, (ast.Name, ast.Attribute))}


def capture_outside_the_scripts(common: Path) -> dict[str, set[str]]:
    """The common modules, other than CAPTURING_MODULES, that call compiled() or captured(), with what they call."""
    found = {}
    for path in common.rglob("*.py"):
        calls = called_names(ast.parse(path.read_text())) & {"compiled", "captured"}
        if calls and module_name(path, common.parent) not in CAPTURING_MODULES:
            found[module_name(path, common.parent)] = calls
    return found


def test_each_script_holds_its_algorithm_and_common_runs_none_of_it():
    """td3's warm-up and replay write, its delayed actor and when learning starts, ppo_lstm's carry-over, resets and
    minibatch rule, every rollout loop and every compile-and-capture decision live in the scripts: each original
    script calls compiled() and captured() itself, in train, and no module of common/ but the primitives and the
    evaluation's own chunk does."""
    for script in original_scripts(ROOT / "algos"):
        text = (ROOT / "algos" / f"{script}.py").read_text()
        train = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "train")
        assert {"compiled", "captured"} <= called_names(train), f"{script}.py compiles and captures in its train"
        missing = set(IN_THE_SCRIPTS.get(script, ())) - defined_names(ROOT / "algos" / f"{script}.py")
        assert not missing, f"{script}.py defines {sorted(missing)}"
    in_common = {
        module_name(path): found
        for path in (ROOT / "common").rglob("*.py")
        if (found := defined_names(path) & MOVED_OUT_OF_COMMON)
    }
    assert in_common == {}, f"the algorithm in common/: {in_common}"
    assert capture_outside_the_scripts(ROOT / "common") == {}


def test_the_check_finds_a_common_helper_that_captures_for_a_script(tmp_path):
    """The check above can fail: a helper in common/ that captures the script's functions (as common/loop.py's
    compile_and_capture did) is named."""
    common = tmp_path / "common"
    common.mkdir()
    (common / "loop.py").write_text(
        "from common.capture import captured\n\n\ndef wrap(run, update_fn):\n"
        '    return captured(run, "update", update_fn)\n'
    )
    assert capture_outside_the_scripts(common) == {"common.loop": {"captured"}}


def test_no_line_runs_past_the_line_length():
    """No line of the Python sources past pyproject.toml's line-length, pragma comments included: ruff's E501 does
    not count a trailing `# noqa: ...`, so a line can pass it and still run past the column a reader sees."""
    limit = int(re.search(r"^line-length = (\d+)$", (ROOT / "pyproject.toml").read_text(), re.M).group(1))
    long = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("algos", "common", "tests")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if len(line) > limit
    ]
    assert long == [], f"lines past {limit} columns: {long}"


def test_the_readme_reads_in_minutes_in_its_order_and_links_what_exists():
    """A newcomer's README: at most ~350 lines, the copy recipe within its first 150, its sections in the order
    a first reading takes them, and every page it links to there (the rest of the reference lives in docs/)."""
    import re

    readme = (ROOT / "README.md").read_text()
    lines = readme.splitlines()
    assert len(lines) <= 350, len(lines)
    headings = [line for line in lines if line.startswith("## ")]
    order = ["## Quick start", "## Copying a script", "## Algorithms", "## Environments", "## Running", "## Results"]
    found = [next(i for i, h in enumerate(headings) if h.startswith(name)) for name in order]
    assert found == sorted(found), headings
    assert next(i for i, line in enumerate(lines) if line.startswith("## Copying a script")) < 150
    for target in re.findall(r"\]\(([^)#]+)", readme):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target
    for page in (ROOT / "docs").glob("*.md"):
        for target in re.findall(r"\]\(([^)#]+)", page.read_text()):
            if not target.startswith("http"):
                assert (page.parent / target).exists(), (page.name, target)
