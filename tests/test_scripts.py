"""The contract every script in algos/ keeps, checked on each of them.

Resume, checkpoints, logging, the NaN guard, the host-sync rule, torchrun and faults, bad input:
one test each, parametrized over the scripts, so that a script that drifts from the others
fails here. Most runs call the script's main() in this process (no interpreter start-up, which
is most of a tiny run's cost); torchrun, signals and the command line go through subprocesses.
The scripts' own algorithms (GAE, Q(lambda), projections, learning) are tested in their files.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from common.checkpoint import FORMAT_VERSION, save_checkpoint
from tests.helpers import (
    ROOT,
    Job,
    inject_nan_rewards,
    load_exported_program,
    load_script,
    run,
    run_main,
    torchrun_cmd,
)
from tests.host_sync import SyncsOutsideTheOptimizer
from tests.pixel_env import CATCH, Catch
from tests.contract import COPIES, CONTRACT, COMMON, SCRIPTS, algo_of
from tests.lockstep import ATOL, RTOL, assert_close_at_scale, inductor_settings, lockstep_compiled
from tests.replay import (
    assert_keeps_python_state,
    assert_no_device_kernels,
    assert_no_host_sync,
    assert_replays_alike,
    assert_runs_compiled,
    record_captured,
)

SUMMARY_FIELDS = {
    "algo",
    "algorithm",
    "processes",
    "env_id",
    "run_dir",
    "global_step",
    "iteration",
    "wall_seconds",
    "sps",
    "last_train_return",
    "last_eval_return",
    "best_eval_return",
    "stop_reason",
    "world_size",
    "params_in_sync",
    "rollout_seconds",
    "update_seconds",
    "peak_memory_mb",
    "checkpoints",
    "compile_seconds",
    "compile_seconds_by_function",
    "compile",
    "cudagraphs",
    "evaluation_seconds",
}
CHECKPOINT_FIELDS = {
    "format_version",
    "algo",
    "algorithm",
    "totals",
    "env_id",
    "args",
    "world_size",
    "global_step",
    "iteration",
    "best_eval_return",
    "model",
    "optimizers",
    "ranks",
}


@pytest.fixture(autouse=True)
def pixel_env(monkeypatch):
    """Catch among the built-in envs of this process, for the tests' runs on pixels."""
    import common.envs

    monkeypatch.setitem(common.envs.BUILTIN_ENVS, CATCH, Catch)


def units(algo: str, n: int) -> int:
    """total_timesteps of n units of one process."""
    return n * CONTRACT[algo]["sync"] * CONTRACT[algo]["steps"]


def train(algo: str, out: Path, **overrides) -> dict:
    """main() of algos/<algo>.py in this process with the tiny settings, on one intra-op thread
    (as the subprocesses get: tiny networks gain nothing from more)."""
    return run_main(load_script(algo), **{**COMMON, **CONTRACT[algo]["kwargs"], "output_dir": str(out), **overrides})


def checkpoint(out: Path, name: str = "last.pt", run_name: str = "run") -> dict:
    return torch.load(out / run_name / "checkpoints" / name, weights_only=True)


def cli_args(algo: str, out: Path, **overrides) -> list[str]:
    """The tiny settings as command-line flags."""
    kwargs = {**COMMON, **CONTRACT[algo]["kwargs"], "output_dir": str(out), **overrides}
    flags = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, (tuple, list)):
            flags += [flag, *map(str, value)]
        elif value is not None:
            flags += [flag, str(value)]
    return [f"algos/{algo}.py", *flags]


def assert_same(a, b, path="checkpoint"):
    """Recursive bit-equality of two checkpoints' values."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), f"{path}: {sorted(a)} != {sorted(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif torch.is_tensor(a):
        assert torch.equal(a, b), path
    else:
        assert a == b, f"{path}: {a} != {b}"


def next_second() -> None:
    """Wait for the next second of the clock. TensorBoard reads a run's event files in the order of
    their names (creation second, host, pid, a per-process counter): two writers of one process
    created within a second can sort out of creation order (counter 10 before 9), and then the
    purge of a resume applies to the wrong file. Separate processes, as real resumes are, do not
    meet this; runs in this test process do."""
    time.sleep(1.01 - time.time() % 1)


def scalars(run_dir: Path, clocks: bool = False) -> dict[str, list[tuple[int, float]]]:
    """(step, value) of every scalar, as TensorBoard reads them; the clocks (SPS, phase seconds) only if asked."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return {
        tag: [(e.step, e.value) for e in acc.Scalars(tag)]
        for tag in acc.Tags()["scalars"]
        if clocks or (tag != "charts/SPS" and not tag.endswith("_seconds"))
    }


def logged_steps(run_dir: Path, tag: str = "charts/SPS") -> list[int]:
    """Steps of a scalar as TensorBoard reads them (it honours the purge marker of a resume)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not list(run_dir.glob("events.out.tfevents.*")):
        return []
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


# --------------------------------------------------------------------------------------------
# checkpoints and exact resume
# --------------------------------------------------------------------------------------------
def test_every_script_in_algos_has_its_entry():
    """A script added to algos/ is found here; it joins every test below with one entry in CONTRACT (a copy of
    a script that keeps its ALGO, with the entry of that script)."""
    missing = [algo for algo in SCRIPTS if algo not in CONTRACT]
    assert not missing, f"add an entry to CONTRACT in tests/contract.py for {missing} (see the comment above it)"
    assert set(CONTRACT) <= set(SCRIPTS), set(CONTRACT) - set(SCRIPTS)


@pytest.mark.parametrize(
    "algo", COPIES or [pytest.param("", marks=pytest.mark.skip(reason="no copy of a script in algos/"))]
)
def test_every_flag_a_copy_adds_runs_at_a_value_of_its_own(algo):
    """A copy's check runs each flag the copy adds to its original's Args at a value other than its default at least
    once: in its settings or in one of its layouts (tests/contract.py's copy_entry turns a new bool flag; a number or a
    string needs a value in the copy's own CONTRACT)."""
    import dataclasses

    original = {f.name for f in dataclasses.fields(load_script(algo_of(algo)).Args)}
    added = {f.name: f.default for f in dataclasses.fields(load_script(algo).Args) if f.name not in original}
    kwargs = CONTRACT[algo]["kwargs"]
    layouts = [kwargs, *({**kwargs, **layout} for layout in CONTRACT[algo]["captures"])]
    unrun = [name for name, default in added.items() if all(layout.get(name, default) == default for layout in layouts)]
    assert not unrun, (
        f"algos/{algo}.py adds {', '.join('--' + name.replace('_', '-') for name in unrun)}, which its check never "
        f'runs at a value other than its default: give one in the copy, e.g. CONTRACT = {{"kwargs": {{{unrun[0]!r}: '
        "...}} at the top level of its file (tests/contract.py)"
    )


@pytest.mark.parametrize("algo", SCRIPTS)
def test_resume_is_bit_identical_to_an_uninterrupted_run(algo, tmp_path):
    """Stopped after the first and the second unit (a wall-time budget of 0 s) and resumed each
    time, a run ends with every checkpoint value bit-identical to a run never stopped: networks,
    optimizers, schedules, normalizers, RNG and env state, episode statistics, replay buffers."""
    sync = CONTRACT[algo]["sync"]
    common = dict(total_timesteps=units(algo, 6), eval_interval=2 * sync)
    full = train(algo, tmp_path / "a", **common)
    first = train(algo, tmp_path / "b", max_wall_seconds=0.0, **common)
    assert first["stop_reason"] == "max_wall_seconds" and first["iteration"] == sync, first
    assert checkpoint(tmp_path / "b")["iteration"] == sync
    next_second()
    assert train(algo, tmp_path / "b", resume="auto", max_wall_seconds=0.0, **common)["iteration"] == 2 * sync
    next_second()
    last = train(algo, tmp_path / "b", resume="auto", **common)
    assert last["global_step"] == full["global_step"] == units(algo, 6)
    a, b = checkpoint(tmp_path / "a"), checkpoint(tmp_path / "b")
    a, b = without_flags_and_clocks(a), without_flags_and_clocks(b)  # --resume and --max-wall-seconds differ
    assert_same(a, b)
    assert full["best_eval_return"] == last["best_eval_return"]
    # and the curves are one run's: the same values at the same steps (all but the clocks)
    curves_a, curves_b = scalars(tmp_path / "a" / "run"), scalars(tmp_path / "b" / "run")
    assert curves_a.keys() == curves_b.keys() and "charts/episodic_return" in curves_a
    for tag in curves_a:
        assert curves_a[tag] == curves_b[tag], tag


@pytest.mark.parametrize("algo", SCRIPTS)
def test_checkpoints_load_weights_only_and_eval_only_gives_back_the_best_return(algo, tmp_path):
    sync = CONTRACT[algo]["sync"]
    summary = train(algo, tmp_path, total_timesteps=units(algo, 4), eval_interval=2 * sync)
    assert SUMMARY_FIELDS | CONTRACT[algo].get("summary", set()) == set(summary), SUMMARY_FIELDS ^ set(summary)
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == json.loads(json.dumps(summary))
    for name in ("last.pt", "best.pt"):
        state = checkpoint(tmp_path, name)  # torch.load(weights_only=True): plain values and tensors only
        assert CHECKPOINT_FIELDS <= set(state), CHECKPOINT_FIELDS - set(state)
        # a copy is its own script (its file's name) of its original's algorithm (its ALGO)
        assert (state["algo"], state["algorithm"]) == (summary["algo"], summary["algorithm"]) == (algo, algo_of(algo))
        assert state["format_version"] == FORMAT_VERSION and len(state["ranks"]) == 1
        assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())
    assert checkpoint(tmp_path)["iteration"] == 4 * sync and checkpoint(tmp_path)["global_step"] == units(algo, 4)
    best = checkpoint(tmp_path, "best.pt")
    assert best["best_eval_return"] == summary["best_eval_return"]
    # --eval-only of best.pt replays the evaluation that made it the best: the same return
    result = train(algo, tmp_path, eval_only=True, resume=str(tmp_path / "run" / "checkpoints" / "best.pt"))
    assert result["eval_return"] == pytest.approx(best["best_eval_return"], abs=1e-9)
    if CONTRACT[algo]["kwargs"].get("save_buffer"):  # a replay buffer goes into last.pt only
        assert "buffer" in checkpoint(tmp_path)["ranks"][0] and "buffer" not in best["ranks"][0]


@pytest.mark.parametrize("algo", SCRIPTS)
def test_checkpoint_of_another_network_shape_is_a_clear_error(algo, tmp_path):
    train(algo, tmp_path, total_timesteps=units(algo, 1))
    with pytest.raises(SystemExit, match=r"another shape.*--hidden-sizes 32 32"):
        train(algo, tmp_path, hidden_sizes=(16,), resume="auto")


# --------------------------------------------------------------------------------------------
# seeds
# --------------------------------------------------------------------------------------------
def test_seeds_ranks_and_eval_envs_share_no_random_stream():
    """Every env stream and generator comes from a hash of (seed, rank, stream): the runs --seed 1
    and --seed 2, two ranks of a run, and its training and eval envs start no episode alike."""
    import common.run
    from common.envs import make_env

    def run_of(seed: int, rank: int):
        return common.run.Run(
            args=load_script("ppo").Args(seed=seed),
            algo="ppo",
            rank=rank,
            world_size=2,
            device=torch.device("cpu"),
            is_main=rank == 0,
        )

    def initial_states(seed: int, resets: int = 5) -> set:
        envs = make_env("CartPole-v1", 512, seed=seed)
        return {tuple(row) for _ in range(resets) for row in envs.reset()[0]["policy"].tolist()}

    streams = {
        "seed 1": initial_states(common.run.env_seed(run_of(1, 0))),
        "seed 2": initial_states(common.run.env_seed(run_of(2, 0))),
        "seed 1, rank 1": initial_states(common.run.env_seed(run_of(1, 1))),
        "seed 1, eval": initial_states(common.run.eval_seed(run_of(1, 0), 0)),
        "seed 1, eval at iteration 10": initial_states(common.run.eval_seed(run_of(1, 0), 10)),
    }
    names = list(streams)
    for i, a in enumerate(names):
        assert len(streams[a]) == 5 * 512
        for b in names[i + 1 :]:
            assert not streams[a] & streams[b], f"{a} and {b} share initial states"
    torch_seeds = {common.run.derive_seed(run_of(s, r), "torch") for s in (1, 2) for r in (0, 1)}
    assert len(torch_seeds) == 4


# --------------------------------------------------------------------------------------------
# logging and the NaN guard
# --------------------------------------------------------------------------------------------
EVERY_SCRIPTS_TAGS = {
    "charts/SPS",
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/rollout_seconds",
    "charts/update_seconds",
    "eval/episodic_return",
    "eval/episodic_length",
}


def readme_tags() -> dict[str, set[str]]:
    """The README's TensorBoard table: each script's own tags, by its path (none in a checkout without the README,
    as the copy tests make)."""
    if not (ROOT / "README.md").exists():
        return {}
    section = (ROOT / "README.md").read_text().split("## TensorBoard", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(algos/\w+\.py)` \| (.+) \|$", section, re.M)
    return {script: set(re.findall(r"`([\w/]+)`", tags)) for script, tags in rows}


README_TAGS = readme_tags()


def test_the_readme_has_a_tag_row_for_every_original_script():
    originals = {f"algos/{name}.py" for name in SCRIPTS if load_script(name).ALGO == name}
    assert set(README_TAGS) == originals and all(README_TAGS.values()), README_TAGS


@pytest.mark.parametrize("algo", SCRIPTS)
def test_tensorboard_tags_on_the_global_step(algo, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sync, steps = CONTRACT[algo]["sync"], CONTRACT[algo]["steps"]
    train(algo, tmp_path, total_timesteps=units(algo, 6), eval_interval=2 * sync)
    acc = EventAccumulator(str(tmp_path / "run"))
    acc.Reload()
    expected = {
        "charts/SPS",
        "charts/episodic_return",
        "charts/episodic_length",
        "eval/episodic_return",
        "eval/episodic_length",
    } | CONTRACT[algo]["tags"]
    assert expected <= set(acc.Tags()["scalars"]), expected - set(acc.Tags()["scalars"])
    if f"algos/{algo}.py" in README_TAGS:  # a copy has no row: it may log more than its original
        own = {tag for tag in acc.Tags()["scalars"] if not tag.startswith("env/")} - EVERY_SCRIPTS_TAGS
        assert own == README_TAGS[f"algos/{algo}.py"], "the README's TensorBoard table says otherwise"
    assert logged_steps(tmp_path / "run") == [sync * steps * i for i in range(1, 7)]  # x-axis: global env steps
    assert logged_steps(tmp_path / "run", "eval/episodic_return") == [sync * steps * i for i in (2, 4, 6)]
    assert "hyperparameters/text_summary" in acc.Tags()["tensors"]


@pytest.mark.parametrize("algo", SCRIPTS)
def test_nan_guard_names_the_tensor_and_keeps_the_last_good_checkpoint(algo, tmp_path, monkeypatch):
    sync = CONTRACT[algo]["sync"]
    env_steps_per_iteration = CONTRACT[algo]["kwargs"].get("num_steps", 1)
    inject_nan_rewards(monkeypatch, after=2 * sync * env_steps_per_iteration + 1)  # in unit 3
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(FloatingPointError, match=rf"non-finite .*rewards.* at iteration {3 * sync}\b"):
        train(algo, tmp_path, total_timesteps=units(algo, 6), save_interval=sync)
    assert signal.getsignal(signal.SIGTERM) is handler, "the failed run was not closed (its signal handler stayed)"
    state = checkpoint(tmp_path)
    assert state["iteration"] == 2 * sync
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())


# --------------------------------------------------------------------------------------------
# the performance rule: no host read per env step (nor per update)
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", SCRIPTS)
def test_no_host_sync_per_env_step(algo, tmp_path):
    """The host reads of a unit do not grow with its number of env steps: the rollout length of
    the on-policy scripts, the log interval of the off-policy ones."""
    load_script(algo)  # imported outside the recorder
    knob = CONTRACT[algo]["per_read"]
    counts = {}
    for value in (2, 6):  # three units of 2 and of 6 env steps per env
        recorder = SyncsOutsideTheOptimizer()
        with recorder:
            train(
                algo,
                tmp_path / str(value),
                **{knob: value},
                total_timesteps=3 * value * CONTRACT[algo]["kwargs"]["num_envs"],
            )
        counts[value] = len(recorder.syncs)
    assert counts[2] == counts[6], counts


@pytest.mark.parametrize("algo", SCRIPTS)
def test_log_interval_reads_less_often_and_logs_the_interval_means(algo, tmp_path):
    """--log-interval 4: the statistics of 4 iterations, gathered on the device, are read once; the training is
    untouched and the logged losses are the means of the iterations' (an off-policy script's first iterations, before
    learning starts, have none: the mean is over those that updated)."""
    every, k = tmp_path / "every", tmp_path / "k"
    steps = CONTRACT[algo]["steps"]
    train(algo, every, total_timesteps=8 * steps, log_interval=1)
    summary = train(algo, k, total_timesteps=8 * steps, log_interval=4)
    assert_same(checkpoint(every)["model"], checkpoint(k)["model"])
    curves_every, curves_k = scalars(every / "run"), scalars(k / "run")
    loss = min(tag for tag in CONTRACT[algo]["tags"] if tag.startswith("losses/"))
    assert [s for s, _ in curves_k[loss]] == [4 * steps, 8 * steps]
    intervals = [[v for s, v in curves_every[loss] if lo < s <= lo + 4 * steps] for lo in (0, 4 * steps)]
    assert all(intervals), f"{loss}: an interval without an update ({curves_every[loss]})"
    assert [v for _, v in curves_k[loss]] == pytest.approx([np.mean(v) for v in intervals], rel=1e-5)
    # the logged phase times are the means over an interval's timed calls: every iteration's rollout, the update of
    # each iteration that made one
    calls = {"rollout": [4, 4], "update": [len(v) for v in intervals]}
    for phase in ("rollout", "update"):
        means = scalars(k / "run", clocks=True)[f"charts/{phase}_seconds"]
        assert [s for s, _ in means] == [4 * steps, 8 * steps]
        total = sum(n * v for n, (_, v) in zip(calls[phase], means))
        assert total == pytest.approx(summary[f"{phase}_seconds"], rel=1e-5)


def without_flags_and_clocks(ckpt: dict) -> dict:
    """A checkpoint but for its flags and the clocks of its totals (seconds, processes), which two runs that
    computed the same may differ in; its last training return stays."""
    totals = ckpt.pop("totals")
    ckpt.pop("args")
    return {**ckpt, "last_train_return": totals["last_train_return"]}


# Two runs compared whole (assert_runs_alike; the contract's compiled-vs-eager test runs in lockstep instead, see
# tests/lockstep.py) part by float32 rounding that a few iterations of updates carry on, each element by a share of its
# tensor's scale: RTOL and ATOL of tests/lockstep.py.
def assert_runs_alike(eager_dir: Path, compiled_dir: Path, rtol: float = RTOL, atol: float = ATOL) -> None:
    """Two runs of one script computed the same, up to float32 rounding at each tensor's scale (assert_close_at_scale):
    every value of their last.pt (model, optimizers, the script's own replicated and per-rank state, RNG, env state,
    replay buffers, counters; all but the flags) and every logged scalar but the clocks (each curve at its own scale),
    at the same steps."""
    a, b = (torch.load(d / "checkpoints" / "last.pt", weights_only=True) for d in (eager_dir, compiled_dir))
    a, b = without_flags_and_clocks(a), without_flags_and_clocks(b)
    flat_a, spec_a = torch.utils._pytree.tree_flatten(a)
    flat_b, spec_b = torch.utils._pytree.tree_flatten(b)
    assert spec_a == spec_b, "the two checkpoints hold other entries"
    paths = [torch.utils._pytree.keystr(k) for k, _ in torch.utils._pytree.tree_flatten_with_path(a)[0]]
    for path, x, y in zip(paths, flat_a, flat_b):
        if torch.is_tensor(x) and x.is_floating_point():
            assert y.dtype == x.dtype, f"last.pt{path}: dtype {y.dtype} != {x.dtype}"
            assert_close_at_scale(y, x, f"last.pt{path}", rtol, atol)
        elif torch.is_tensor(x):
            assert torch.equal(x, y), f"last.pt{path}"
        elif isinstance(x, float):  # a statistic read from the device (the last training return)
            assert_close_at_scale(y, x, f"last.pt{path}", rtol, atol)
        else:
            assert x == y, f"last.pt{path}: {x} != {y}"
    curves_a, curves_b = scalars(eager_dir), scalars(compiled_dir)
    assert curves_a.keys() == curves_b.keys(), curves_a.keys() ^ curves_b.keys()
    for tag, points in curves_a.items():
        assert [s for s, _ in points] == [s for s, _ in curves_b[tag]], tag
        eager_values, compiled_values = [x for _, x in points], [y for _, y in curves_b[tag]]
        assert_close_at_scale(compiled_values, eager_values, f"{tag} (compiled vs eager)", rtol, atol)


def test_runs_alike_accepts_rounding_at_a_tensors_scale_and_not_a_lost_write_schedule_or_buffer():
    """The bound assert_runs_alike holds to: a reordered reduction's drift on a weight near 0 among weights near 0.5
    passes (a batch-norm critic's, 3.9e-5); one statistic left at its old value, an lr one linear-schedule step behind,
    a buffer row of another transition fail."""
    weights = torch.linspace(-0.5, 0.5, 96, dtype=torch.float32)
    weights[40] = 1e-3
    drifted = weights.clone()
    drifted[40] += 3.9e-5
    assert_close_at_scale(drifted, weights, "weights")  # elementwise rtol 1e-4 / atol 1e-5 rejects this
    with pytest.raises(AssertionError):
        torch.testing.assert_close(drifted, weights, rtol=RTOL, atol=ATOL)
    statistic = torch.tensor([0.8, 1.3, 0.02, 2.1])
    dropped = statistic.clone()
    dropped[2] = 0.0  # its update lost: the initial value
    with pytest.raises(AssertionError, match=r"ema: 1 of 4 differ beyond rounding"):
        assert_close_at_scale(dropped, statistic, "ema")
    lr = torch.tensor(3e-4 * (1 - 64 / 256))
    with pytest.raises(AssertionError, match="lr"):
        assert_close_at_scale(torch.tensor(3e-4 * (1 - 32 / 256)), lr, "lr")
    rows = torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
    stale = rows.clone()
    stale[5] = rows[4]
    with pytest.raises(AssertionError, match="buffer"):
        assert_close_at_scale(stale, rows, "buffer")
    with pytest.raises(AssertionError, match="NaN"):
        assert_close_at_scale(torch.tensor([float("nan"), 1.0]), torch.tensor([0.0, 1.0]), "curve")


def lockstep_pair(bug: str):
    """An update of a running statistic, a schedule, a replay row and a loss, written as a script writes them, and its
    'compiled' twin with `bug` (none: float32 rounding alone), in lockstep (tests/lockstep.py)."""
    from tests.lockstep import Lockstep

    net = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    ema = torch.zeros((), dtype=torch.float64)  # a copy's running 0-d float64 statistic
    lr = torch.tensor(3e-4)  # a linear schedule, stepped in place
    rows = torch.zeros(8, 3)  # storage, one row written per call
    at = torch.zeros((), dtype=torch.int64)

    def update(x: torch.Tensor):
        loss = net(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ema.mul_(0.9).add_(0.1 * x.abs().mean())
        lr.sub_(3e-4 / 256)
        rows[at] = x[0]
        at.add_(1)
        return {"loss": loss.detach()}

    def twin(x: torch.Tensor):
        out = update(x)
        if bug == "rounding":  # a reordered reduction: float32 ulps of each tensor's scale
            out["loss"].add_(out["loss"].abs() * 3e-7)
            with torch.no_grad():
                net.weight.add_(net.weight.abs().max() * 2e-7)
        elif bug == "dropped write":
            ema.sub_(0.1 * x.abs().mean()).div_(0.9)
        elif bug == "lost schedule step":
            lr.add_(3e-4 / 256)
        elif bug == "stale row":
            rows[at - 1] = rows[at - 2] if int(at) > 1 else 0.0
        elif bug == "dropped parameter step":
            with torch.no_grad():
                net.weight.add_(0.1 * net.weight.grad)
        elif bug == "NaN":
            out["loss"].fill_(float("nan"))
        return out

    class Run:
        pass

    return Lockstep()(Run(), update, twin), dict(ema=ema, lr=lr, rows=rows, net=net)


def test_lockstep_passes_rounding_and_names_a_dropped_write_a_lost_step_a_stale_row_and_a_nan():
    """tests/lockstep.py, the comparison the compiled-vs-eager test makes at every call: float32 rounding at a
    tensor's scale passes and eager's values go on (rounding cannot compound); a statistic's write dropped, a schedule
    step lost, a buffer row left stale, an optimizer's step of a parameter dropped, a NaN where eager had none fail at
    the call, naming the tensor."""
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    step, state = lockstep_pair("rounding")
    eager_step, eager_state = lockstep_pair("none")
    eager_state["net"].load_state_dict(state["net"].state_dict())
    for _ in range(3):
        step(x), eager_step(x)
    for name in ("ema", "lr", "rows"):
        assert torch.equal(state[name], eager_state[name]), name  # eager's values, bit for bit
    assert torch.equal(state["net"].weight, eager_state["net"].weight)
    for bug, named in (
        ("dropped write", r"ema: 1 of 1 differ"),
        ("lost schedule step", r"lr: 1 of 1 differ"),
        ("stale row", r"rows: 3 of 24 differ"),
        ("dropped parameter step", r"net.weight: \d of 3 differ"),
        ("NaN", r"<returned>\['loss'\]: NaN at other entries"),
    ):
        step, _ = lockstep_pair(bug)
        with pytest.raises(
            AssertionError, match=rf"^update \(test_scripts.py:\d+\), call 1: compiled differs .*{named}"
        ):
            step(x)


@pytest.mark.parametrize(
    "algo, variant", [(algo, i) for algo in SCRIPTS for i in range(len(CONTRACT[algo]["captures"]))]
)
def test_compiled_run_computes_what_eager_computes(algo, variant, tmp_path, monkeypatch):
    """--compile on CPU, in each of the script's layouts of compiled functions (CONTRACT[algo]["captures"]), in
    lockstep (tests/lockstep.py): every call of every compiled function (the evaluation's included) runs eagerly and
    compiled from the same state, with inductor drawing its random numbers as eager does (fallback_random), and
    returns and writes what eager does up to float32 rounding at each tensor's scale; eager's state goes on, so
    rounding does not compound over the run. A compiled in-place write that is silently dropped fails here at the
    call that drops it, by the tensor's name (tests/test_copies.py shows it). Inductor's graphs run on ATen's kernels,
    not C++ kernels of its own (tests/lockstep.py's inductor_settings says why)."""
    # the evaluation's compiled step (the same code in every layout: common.evaluation) in the first layout
    evaluates = variant == 0
    settings = dict(total_timesteps=units(algo, 2), eval_interval=2 * CONTRACT[algo]["sync"] if evaluates else 0)
    settings.update(CONTRACT[algo]["captures"][variant])
    checked = lockstep_compiled(monkeypatch)
    with inductor_settings(kernels=False):
        compiled = train(algo, tmp_path, compile=True, **settings)
    assert compiled["compile"] and compiled["compile_seconds_by_function"]
    assert len(checked.calls) >= 2, f"fewer compiled functions than a script's update and acting: {checked.calls}"
    if evaluates:
        assert any("evaluation.py" in name for name in checked.calls), f"no evaluation step compared: {checked.calls}"


def test_a_second_run_in_one_process_compiles_its_own_functions(tmp_path):
    """Dynamo caches compiled code per code object, and the functions of a script's main (and the
    eval step) are the same code objects in every run of a process: past the recompile limit (8; 1
    here) a later run would run them eagerly without a word. Each run starts from a clean dynamo
    state and compiles as many frames as the one before it (the first run of a process also
    compiles torch's own lazily initialised helpers, so the second and third are compared). The runs are pqn's first
    layout as the compiled-vs-eager test runs it (with inductor's fallback_random as there): the same graphs, which a
    worker that compiled one takes from inductor's disk cache."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    compiled, sync = [], CONTRACT["pqn"]["sync"]
    with torch._dynamo.config.patch(recompile_limit=1), inductor_settings(kernels=False):
        for name in ("first", "second", "third"):
            before = counters["frames"]["ok"]
            train("pqn", tmp_path / name, total_timesteps=units("pqn", 2), eval_interval=2 * sync, compile=True)
            compiled.append(counters["frames"]["ok"] - before)
    assert compiled[1] > 0 and compiled[2] == compiled[1], compiled


@pytest.mark.parametrize(
    "algo, variant", [(algo, i) for algo in SCRIPTS for i in range(len(CONTRACT[algo]["captures"]))]
)
def test_captured_functions_replay_the_same_kernels_on_the_same_tensors_without_host_sync(
    algo, variant, tmp_path, monkeypatch
):
    """Every function a script captures in a CUDA graph (with --cudagraphs on CUDA), in each of the
    script's capture layouts (CONTRACT[algo]["captures"]: a built-in env's whole rollout or step, an
    adapter's acting step, other update layouts), records on CPU the same ops on the same live
    tensors in two calls after its warm-up, no host sync in any call after the first, and no op that goes to another
    fused kernel on each device (a fused RNN, a cuDNN/oneDNN/MIOpen op: under --compile dynamo would trace it into the
    graph, and on CUDA it runs another kernel than the one checked here; see tests/replay.py). A replay buffer samples
    as under --cudagraphs (against its device fill level)."""
    import common.buffer

    real_init = common.buffer.ReplayBuffer.__init__
    monkeypatch.setattr(
        common.buffer.ReplayBuffer, "__init__", lambda self, *a, **k: real_init(self, *a, **{**k, "capturable": True})
    )
    signatures = record_captured(monkeypatch, load_script(algo))
    settings = CONTRACT[algo]["captures"][variant]
    train(algo, tmp_path, **{"total_timesteps": units(algo, 5), "eval_interval": CONTRACT[algo]["sync"], **settings})
    whole_step = ":" not in settings.get("env_id", CONTRACT[algo]["kwargs"]["env_id"])  # a built-in env
    assert ("evaluation" in signatures) == whole_step and len(signatures) >= 2, signatures.keys()
    for name, calls in signatures.items():
        assert_replays_alike(name, calls)
        assert_no_host_sync(name, calls)
        assert_keeps_python_state(name, calls)
    assert_runs_compiled(signatures)
    assert_no_device_kernels(signatures)


@pytest.mark.parametrize("algo", SCRIPTS)
def test_every_tensor_an_iteration_carries_is_in_the_checkpoint(algo, tmp_path):
    """Every tensor one iteration writes in place and a later one reads (tests/carried.py records them, op by op, in
    an eager run) is held by the script's TrainingState or declared in its SCRATCH: a resume starts from the
    checkpoint, and a carried tensor it lacks would start over. A miss is named with the line that writes it
    (tests/test_copies.py shows a copy's EMA left out). The run logs every iteration: a checkpoint is written at a
    log, and a logged statistic's sums, reset there, are carried no further."""
    from tests.carried import carried_outside_the_checkpoint

    missing = carried_outside_the_checkpoint(
        load_script(algo), lambda: train(algo, tmp_path, total_timesteps=units(algo, 3), log_interval=1)
    )
    assert not missing, (
        f"{algo}.py carries from one iteration to the next what its checkpoint does not hold (a resume would start it "
        f"over): {'; '.join(missing)}. Put it in TrainingState (replicated= or per_rank=), or name it in SCRATCH "
        "with why a fresh value is right"
    )


# --------------------------------------------------------------------------------------------
# bad input: a clear one-line cause before training, and nothing written
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", SCRIPTS)
def test_bad_inputs_fail_with_a_clear_cause(algo, tmp_path, monkeypatch):
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=r"^error: unknown env id 'Nope-v0'.*CartPole-v1"):
        train(algo, out, env_id="Nope-v0")
    with pytest.raises(SystemExit, match=r"^error: .*max_steps"):
        train(algo, out, env_kwargs='{"max_steps": 10}')
    if CONTRACT[algo]["wrong_actions"] is not None:
        env_id, pointer = CONTRACT[algo]["wrong_actions"]
        with pytest.raises(SystemExit, match=rf"^error: {algo}\.py needs .* actions.*{pointer}"):
            train(algo, out, env_id=env_id, env_kwargs=None)
    with pytest.raises(SystemExit, match=r"^error: --total-timesteps must be >= 1, got -5"):
        train(algo, out, total_timesteps=-5)
    flag, value, rule = CONTRACT[algo].get("bounded", ("gamma", 1.5, r"in \[0, 1\]"))
    with pytest.raises(SystemExit, match=rf"^error: --{flag.replace('_', '-')} must be {rule}, got {value}"):
        train(algo, out, **{flag: value})
    with pytest.raises(SystemExit, match=r"^error: --env-kwargs is not valid JSON .*max_episode_steps"):
        train(algo, out, env_kwargs="{max_episode_steps: 100}")
    assert not out.exists(), "nothing is written for a run that cannot start"

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit, match="cannot write the run directory"):
        train(algo, blocker / "sub")
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"\x00" * 100)
    with pytest.raises(SystemExit, match="truncated or corrupt"):
        train(algo, out, resume=str(corrupt))
    # a foreign algorithm: another than the one this script runs (a copy of pqn.py runs pqn's), so the script answers
    # with the foreign-algorithm error, not the copy-versus-original one
    other = "pqn" if algo_of(algo) != "pqn" else "ppo"
    foreign = tmp_path / "foreign.pt"
    save_checkpoint({"format_version": FORMAT_VERSION, "algo": other, "env_id": "CartPole-v1"}, foreign)
    with pytest.raises(SystemExit, match=f"written by '{other}', not '{algo}'"):
        train(algo, out, resume=str(foreign))
    with pytest.raises(SystemExit, match="--eval-only needs --resume"):
        train(algo, out, eval_only=True)
    monkeypatch.setitem(sys.modules, "wandb", None)  # an import of wandb fails
    with pytest.raises(SystemExit, match="--track needs wandb"):
        train(algo, out, track=True)
    assert not out.exists(), "a bad checkpoint or flag leaves no run directory behind"


@pytest.mark.parametrize("algo", SCRIPTS)
def test_command_line_error_is_one_line_without_traceback(algo, tmp_path):
    result = run(
        [sys.executable, f"algos/{algo}.py", "--env-id", "Nope-v0", "--output-dir", str(tmp_path)], timeout=120
    )
    assert result.returncode != 0 and "Traceback" not in result.stdout, result.stdout[-3000:]
    assert result.stdout.strip().splitlines()[-1].startswith("error: unknown env id 'Nope-v0'")


# --------------------------------------------------------------------------------------------
# torchrun: ranks in sync, signals, killed workers, another world size (2 processes, gloo)
# --------------------------------------------------------------------------------------------
@pytest.fixture
def jobs():
    started = []
    yield lambda cmd, log: started.append(Job(cmd, log)) or started[-1]
    for job in started:
        job.kill()


def summary_of(out: Path, run_name: str = "run") -> dict:
    return json.loads((out / run_name / "summary.json").read_text())


@pytest.mark.distributed
# one script of each loop: the signal, the stop and the save are common/'s
@pytest.mark.parametrize("algo", ["ppo", "td3"])
def test_sigterm_under_torchrun_saves_and_resumes_on_another_world_size(algo, tmp_path, jobs):
    """SIGTERM to every worker (what a scheduler does): the ranks agree to stop after the same
    iteration, save last.pt with both ranks' state and exit 0 with their parameters bit-identical.
    The checkpoint then resumes in one process, which re-derives the env streams and says so. The signal's flag rides
    on the statistics' one reduction with --max-wall-seconds' (common.stats), and the save is common/'s: one script of
    each loop here; each script's own state through a two-process checkpoint, and its resume in one process, are
    test_two_process_resume_is_bit_identical's, for every script."""
    total = 2 * units(algo, 2000)  # far more than runs before the signal
    job = jobs(
        torchrun_cmd(2, cli_args(algo, tmp_path, total_timesteps=total, eval_interval=4 * CONTRACT[algo]["sync"])),
        tmp_path / "log",
    )
    job.wait_for(lambda: logged_steps(tmp_path / "run") and len(job.workers()) == 2, what="training to start")
    for pid in job.workers():
        os.kill(pid, signal.SIGTERM)
    assert job.finish() == 0, job.output()[-4000:]
    assert "Traceback" not in job.output()
    stopped = summary_of(tmp_path)
    assert stopped["stop_reason"].startswith("signal:SIGTERM") and stopped["global_step"] < total, stopped
    assert stopped["world_size"] == 2 and stopped["params_in_sync"] is True
    state = checkpoint(tmp_path)
    assert state["global_step"] == stopped["global_step"] and len(state["ranks"]) == 2
    first_obs = [r["next_obs"]["policy"] for r in state["ranks"]]
    assert not torch.equal(*first_obs), "the ranks share their env streams"

    total = stopped["global_step"] + units(algo, 2)  # two more units in one process
    resumed = run([sys.executable, *cli_args(algo, tmp_path, total_timesteps=total, resume="auto")], timeout=240)
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert "notice: checkpoint from 2 process(es)" in resumed.stdout
    assert f"global step {stopped['global_step']}" in resumed.stdout
    assert summary_of(tmp_path)["global_step"] == total and summary_of(tmp_path)["world_size"] == 1


@pytest.mark.distributed
@pytest.mark.parametrize("algo", ["ppo", "td3"])  # one script of each loop: the restart, resume and purge are common/'s
def test_sigkill_of_a_worker_is_survived_by_an_elastic_restart(algo, tmp_path, jobs):
    """kill -9 of one worker under torchrun --max-restarts 1: the restarted group resumes from
    last.pt in the same run directory, finishes, and each TensorBoard step is logged once. What a restart does is
    common/'s (open_run's resume, the purge of the redone steps) and each script's own state through a two-process
    checkpoint is test_two_process_resume_is_bit_identical's, for every script: one script of each loop here. The env
    sleeps at each step (tests/fault_worker.py, as the multi-node tests' do), so that the run outlasts the kill by
    seconds of sleep, not of the cores' time, which the other tests of a parallel run need."""
    sync, per_unit = CONTRACT[algo]["sync"], 2 * units(algo, 1)
    units_run = 40
    total = units_run * per_unit
    step_seconds = 0.01 if algo == "ppo" else 0.04  # a unit asleep 0.08 s (ppo), 0.16 s (td3): 3 to 6 s a run at least
    script = ["tests/fault_worker.py", "--step-seconds", str(step_seconds)]
    args = cli_args(algo, tmp_path, total_timesteps=total, save_interval=4 * sync)
    job = jobs(torchrun_cmd(2, [*script, *args], restarts=1), tmp_path / "log")
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    job.wait_for(last.is_file, what="the first checkpoint")
    saved_step = checkpoint(tmp_path)["global_step"]
    # let rank 0 log past the checkpoint: work that the fault makes it redo
    job.wait_for(
        lambda: max(logged_steps(tmp_path / "run") or [0]) > saved_step, what="steps logged after the checkpoint"
    )
    os.kill(job.workers()[-1], signal.SIGKILL)
    assert job.finish() == 0, job.output()[-4000:]
    assert "resumed from" in job.output(), "the restarted workers did not resume"
    summary = summary_of(tmp_path)
    assert summary["global_step"] == total and summary["params_in_sync"] is True
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["log", "run"]  # one run dir
    assert logged_steps(tmp_path / "run") == [per_unit * i for i in range(1, units_run + 1)]  # redone steps purged


@pytest.mark.distributed
@pytest.mark.parametrize("algo", SCRIPTS)
def test_two_process_resume_is_bit_identical(algo, tmp_path):
    """Under torchrun too, a run resumed from its checkpoint after the first unit ends bit-identical to the run that
    went on (each rank's RNG, env, episode and buffer state goes through rank 0's checkpoint and back); and the same
    checkpoint resumes in one process, on another world size, which re-derives the env streams and says so. The run
    itself writes that checkpoint mid-way (step_<step>.pt, the save of a stop's last.pt, as an elastic restart resumes
    from), so that no stopped run is launched beside it; but where a replay buffer goes into last.pt alone
    (--save-buffer), a run stopped after its first unit (a wall-time budget of 0 s) writes it."""
    sync, total, first_unit = CONTRACT[algo]["sync"], 2 * units(algo, 4), units(algo, 2)  # a unit of 2 processes
    buffer_in_last = CONTRACT[algo]["kwargs"].get("save_buffer", False)
    numbered = dict(checkpoint_interval=0 if buffer_in_last else sync)
    full = run(torchrun_cmd(2, cli_args(algo, tmp_path, run_name="full", total_timesteps=total, **numbered)), 240)
    assert full.returncode == 0, full.stdout[-4000:]
    if buffer_in_last:
        cut = run(
            torchrun_cmd(2, cli_args(algo, tmp_path, run_name="cut", total_timesteps=total, max_wall_seconds=0.0)),
            timeout=240,
        )
        assert cut.returncode == 0, cut.stdout[-4000:]
        name, run_name = "last.pt", "cut"
    else:
        name, run_name = f"step_{first_unit}.pt", "full"
    mid_way = tmp_path / run_name / "checkpoints" / name
    state = checkpoint(tmp_path, name, run_name=run_name)
    assert state["iteration"] == sync and state["global_step"] == first_unit and len(state["ranks"]) == 2
    assert not torch.equal(*[r["next_obs"]["policy"] for r in state["ranks"]]), "the ranks share their env streams"

    one = units(algo, 4)  # from the first unit of two processes (2 of one), two more units in one process
    alone = run(
        [sys.executable, *cli_args(algo, tmp_path, run_name="one", total_timesteps=one, resume=str(mid_way))], 240
    )
    assert alone.returncode == 0, alone.stdout[-4000:]
    assert "notice: checkpoint from 2 process(es)" in alone.stdout and f"global step {first_unit}" in alone.stdout
    assert summary_of(tmp_path, "one")["global_step"] == one and summary_of(tmp_path, "one")["world_size"] == 1
    if buffer_in_last:  # each rank's replay buffer holds its own envs' transitions: none fits a world of 1, so the
        # buffer starts empty, and the updates resume once it holds --learning-starts steps again
        envs = CONTRACT[algo]["kwargs"]["num_envs"]
        assert f"notice: the checkpoint's replay buffers belong to 2 process(es) x {envs} envs" in alone.stdout
        updated = [step for step, _ in scalars(tmp_path / "one")["losses/q_loss"]]
        assert updated and updated[-1] == one and min(updated) > first_unit, updated

    resume = "auto" if buffer_in_last else str(mid_way)
    resumed = run(torchrun_cmd(2, cli_args(algo, tmp_path, run_name="cut", total_timesteps=total, resume=resume)), 240)
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    a, b = checkpoint(tmp_path, run_name="full"), checkpoint(tmp_path, run_name="cut")
    assert a["iteration"] == b["iteration"] == 4 * sync, (a["iteration"], b["iteration"])
    a, b = without_flags_and_clocks(a), without_flags_and_clocks(b)
    assert_same(a, b)
    assert summary_of(tmp_path, "full")["params_in_sync"] and summary_of(tmp_path, "cut")["params_in_sync"]


@pytest.mark.distributed
@pytest.mark.parametrize("algo", ["ppo", "td3"])
def test_nan_guard_under_torchrun_ends_every_rank_at_once(algo, tmp_path, jobs):
    """The NaN guard fires on both ranks in the same reduction: each rank closes its run (graphs,
    then the process group) and exits with the error, within seconds and without a hang in the
    teardown; the last good last.pt stays."""
    sync = CONTRACT[algo]["sync"]
    after = 2 * sync * CONTRACT[algo]["kwargs"].get("num_steps", 1) + 1  # in unit 3
    cmd = torchrun_cmd(
        2,
        [
            str(ROOT / "tests" / "nan_launch.py"),
            str(after),
            *cli_args(algo, tmp_path, total_timesteps=2 * units(algo, 6), save_interval=sync),
        ],
    )
    job = jobs(cmd, tmp_path / "log")
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    job.wait_for(last.is_file, what="the last good checkpoint")
    t0 = time.time()
    code = job.finish(timeout=60)
    assert code != 0 and time.time() - t0 < 30, (code, time.time() - t0)
    output = job.output()
    for rank in (0, 1):  # torchrun prefixes each worker's traceback with its rank
        assert re.search(
            rf"\[rank{rank}\]: FloatingPointError: non-finite .*rewards.* at iteration {3 * sync}\b", output
        ), output[-4000:]
    assert "warning: closing the run" not in output, output[-4000:]
    state = checkpoint(tmp_path)
    assert state["iteration"] == 2 * sync and len(state["ranks"]) == 2
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())


@pytest.mark.distributed
def test_run_name_is_stable_across_restarts_without_run_name(tmp_path, jobs):
    """The default run name carries a timestamp; restarted workers must find the same directory."""
    total = 2 * units("ppo", 30)
    cmd = torchrun_cmd(2, cli_args("ppo", tmp_path, run_name=None, total_timesteps=total, save_interval=2), restarts=1)
    job = jobs(cmd, tmp_path / "log")
    job.wait_for(lambda: list(tmp_path.glob("*/checkpoints/last.pt")), what="the first checkpoint")
    os.kill(job.workers()[0], signal.SIGKILL)
    assert job.finish() == 0, job.output()[-4000:]
    runs = [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert len(runs) == 1, runs
    assert summary_of(tmp_path, runs[0].name)["global_step"] == total


# --------------------------------------------------------------------------------------------
# outputs: videos, exported policies, numbered checkpoints, evaluation options
# --------------------------------------------------------------------------------------------
def mp4_frames(path: Path) -> list:
    import imageio.v3 as iio

    return list(iio.imiter(path))


@pytest.mark.parametrize("algo", SCRIPTS)
def test_capture_video_writes_the_episode_to_mp4_and_tensorboard(algo, tmp_path):
    pytest.importorskip("imageio_ffmpeg")
    pytest.importorskip("pygame")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sync = CONTRACT[algo]["sync"]
    summary = train(
        algo, tmp_path, total_timesteps=units(algo, 2), eval_interval=2 * sync, capture_video=True, num_eval_envs=1
    )
    step = summary["global_step"]
    path = tmp_path / "run" / "videos" / f"step_{step}.mp4"
    frames = mp4_frames(path)
    acc = EventAccumulator(str(tmp_path / "run"))
    acc.Reload()
    [length] = [e.value for e in acc.Scalars("eval/episodic_length")]
    assert len(frames) == length > 1  # one frame per step of the recorded episode
    assert any(not np_equal(frames[0], f) for f in frames[1:]), "the frames do not change"
    assert [e.step for e in acc.Images("videos/eval")] == [step]
    # --eval-only --capture-video records a checkpoint's policy into its run directory
    path.unlink()
    result = train(
        algo,
        tmp_path,
        eval_only=True,
        capture_video=True,
        num_eval_envs=1,
        resume=str(tmp_path / "run" / "checkpoints" / "last.pt"),
    )
    assert Path(result["video"]) == path and len(mp4_frames(path)) == length


def np_equal(a, b) -> bool:
    return bool(np.array_equal(a, b))


def test_capture_video_without_the_extra_stops_before_training(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "imageio", None)
    with pytest.raises(SystemExit, match=r'^error: --capture-video needs imageio: pip install -e "\.\[video\]"$'):
        train("ppo", tmp_path, capture_video=True)
    assert not (tmp_path / "run").exists()


def test_capture_video_of_an_env_that_cannot_render_stops_before_training(tmp_path, monkeypatch):
    """A renderer that fails (no GL, no display) is found at start, not at the first evaluation."""
    pytest.importorskip("imageio_ffmpeg")
    pytest.importorskip("pygame")
    import common.run

    class CannotRender(ReportsSuccess):
        def render(self, env_ids):
            raise RuntimeError("no OpenGL context\nmore detail")

    real_make_env = common.run.make_env
    monkeypatch.setattr(common.run, "make_env", lambda *a, **k: CannotRender(real_make_env(*a, **k)))
    with pytest.raises(
        SystemExit,
        match=r"^error: --capture-video: Pendulum-v1 cannot render frames here "
        r"\(RuntimeError: no OpenGL context\); MuJoCo envs",
    ):
        train("ppo", tmp_path, capture_video=True)
    assert not list((tmp_path / "run").glob("events.out.tfevents.*")), "nothing trained"


def build_model(algo: str, state: dict, env):
    """The script's own model with the checkpoint's weights (what the script evaluates)."""
    module = load_script(algo)
    args = module.Args(**{k: tuple(v) if isinstance(v, list) else v for k, v in state["args"].items()})
    model = CONTRACT[algo]["policy"](module, args, env.single_observation_space.shape[0], env.single_action_space)
    model.load_state_dict(state["model"])
    return model.eval()


def exported_actions(step, obs: torch.Tensor, state: torch.Tensor | None) -> torch.Tensor:
    """`step(obs, state) -> (action, next_state)` over the steps of obs [T, B, ...], fed back its own next state
    (state None: a policy without one, `step(obs) -> action`): the actions [T, B, ...]."""
    actions = []
    for o in obs:
        if state is None:
            actions.append(step(o))
        else:
            action, state = step(o, state)
            actions.append(action)
    return torch.stack(actions)


@pytest.mark.parametrize("algo", SCRIPTS)
def test_exported_policy_acts_as_the_script_with_its_normalizer(algo, tmp_path):
    """--export of a checkpoint: policy.pt2 and policy.onnx act as the script's evaluated model on a few steps'
    observations and some far outside the data, the normalizer inside; a recurrent policy takes (obs, state) and
    returns (action, next_state), its state fed back step after step."""
    onnxruntime = pytest.importorskip("onnxruntime")
    from common.envs import make_env

    train(algo, tmp_path, total_timesteps=units(algo, 4))
    result = train(
        algo,
        tmp_path,
        eval_only=True,
        export=str(tmp_path / "export"),
        resume=str(tmp_path / "run" / "checkpoints" / "last.pt"),
    )
    assert Path(result["export"]) == tmp_path / "export"
    state = checkpoint(tmp_path)
    env = make_env(CONTRACT[algo]["kwargs"]["env_id"], 64, seed=5)
    model = build_model(algo, state, env)
    assert model.obs_rms.count > 0, "the run had observation normalization"
    obs = [env.reset(seed=5)[0]["policy"]]
    for _ in range(3):  # observations of a few steps, and some far outside the data
        actions = np.stack([env.single_action_space.sample() for _ in range(64)])
        obs.append(env.step(torch.as_tensor(actions))[0]["policy"])
    obs = torch.stack([*obs, torch.randn(64, obs[0].shape[-1]) * 5])  # [T, B, obs_dim]
    recurrent = hasattr(model, "recurrent_step")
    hidden = torch.zeros(model.state_shape[0], 64, model.state_shape[1]) if recurrent else None
    program = load_exported_program(tmp_path / "export" / "policy.pt2")  # no deprecation notice
    session = onnxruntime.InferenceSession(str(tmp_path / "export" / "policy.onnx"))

    def onnx_step(o, s=None):
        out = session.run(None, {"obs": o.numpy()} if s is None else {"obs": o.numpy(), "state": s.numpy()})
        return torch.as_tensor(out[0]) if s is None else tuple(torch.as_tensor(x) for x in out)

    with torch.no_grad():
        expected = exported_actions(model.recurrent_step if recurrent else model.deterministic, obs, hidden)
        got_pt2 = exported_actions(program, obs, hidden)
        # the batch dimension is dynamic: not fixed to the example's
        one_row = exported_actions(program, obs[:, :1], None if hidden is None else hidden[:, :1])
    got_onnx = exported_actions(onnx_step, obs, hidden)
    assert got_pt2.dtype == got_onnx.dtype == expected.dtype
    torch.testing.assert_close(got_pt2, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(one_row, expected[:, :1], rtol=0, atol=1e-5)
    torch.testing.assert_close(got_onnx, expected, rtol=0, atol=1e-5)
    if recurrent:  # the state carries: the same policy with its state zeroed at every step acts otherwise
        with torch.no_grad():
            forgetful = exported_actions(lambda o, s: model.recurrent_step(o, torch.zeros_like(s)), obs, hidden)
        assert not torch.equal(forgetful[1:], expected[1:])
    # the normalizer is inside: its statistics are constants of the exported graph...
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(tmp_path / "export" / "policy.onnx")).graph
    constants = [numpy_helper.to_array(t) for t in graph.initializer] + [
        numpy_helper.to_array(a.t) for n in graph.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR
    ]
    for statistic in (model.obs_rms._mean32, model.obs_rms._inv_std32):
        assert any(c.shape == tuple(statistic.shape) and np.allclose(c, statistic.numpy()) for c in constants)
    # ...and continuous actions of the same weights without it differ on these observations
    if not isinstance(env.single_action_space, gym.spaces.Discrete):
        model.obs_rms = torch.nn.Identity()
        with torch.no_grad():
            unnormalized = exported_actions(model.recurrent_step if recurrent else model.deterministic, obs, hidden)
        assert not torch.equal(unnormalized, expected)
    meta = json.loads((tmp_path / "export" / "policy.json").read_text())
    assert meta["algo"] == algo and meta["global_step"] == state["global_step"]
    assert meta["files"] == {"torch_export": "policy.pt2", "onnx": "policy.onnx"}
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == ["policy.json", "policy.onnx", "policy.pt2"]
    assert meta["input"]["observation_space"]["shape"] == [obs.shape[-1]]
    if recurrent:
        assert meta["state"]["shape"] == [model.state_shape[0], "batch", model.state_shape[1]]
    kind = type(env.single_action_space).__name__
    assert meta["output"]["action_space"]["type"] == kind


@pytest.mark.parametrize("algo", SCRIPTS)
def test_numbered_checkpoints_on_a_schedule_keep_the_newest(algo, tmp_path):
    sync, steps = CONTRACT[algo]["sync"], CONTRACT[algo]["steps"]
    train(algo, tmp_path, total_timesteps=units(algo, 6), checkpoint_interval=sync, keep_checkpoints=2)
    kept = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*.pt"))
    assert kept == sorted(f"step_{sync * steps * i}.pt" for i in (5, 6)), kept
    assert checkpoint(tmp_path, f"step_{sync * steps * 5}.pt")["iteration"] == 5 * sync


class ReportsSuccess:
    """Wraps an env so that it reports info["success"]: true for the even-numbered envs."""

    def __init__(self, env):
        self.env = env

    def __getattr__(self, name):
        return getattr(self.env, name)

    def step(self, action):
        out = self.env.step(action)
        out[4]["success"] = torch.arange(self.env.num_envs) % 2 == 0
        return out


@pytest.mark.parametrize("algo", SCRIPTS)
def test_eval_env_kwargs_and_success_rate(algo, tmp_path, monkeypatch):
    """--eval-env-kwargs configures the eval envs alone; an env that reports per-env success gets
    eval/success_rate."""
    import common.run

    real_make_env = common.run.make_env
    monkeypatch.setattr(common.run, "make_env", lambda *a, **k: ReportsSuccess(real_make_env(*a, **k)))
    sync = CONTRACT[algo]["sync"]
    train(
        algo,
        tmp_path,
        total_timesteps=units(algo, 6),
        eval_interval=6 * sync,
        num_eval_envs=4,
        eval_env_kwargs='{"max_episode_steps": 5}',
    )
    curves = scalars(tmp_path / "run")
    [(_, length)] = curves["eval/episodic_length"]
    assert length <= 5 and max(v for _, v in curves["charts/episodic_length"]) > 5  # training envs: 16 steps
    [(_, rate)] = curves["eval/success_rate"]
    assert rate == 0.5


# --------------------------------------------------------------------------------------------
# a new user's first runs: no run written over, a checkpoint that knows its run, files that exist
# --------------------------------------------------------------------------------------------
def test_a_run_never_writes_over_another(tmp_path):
    first = train("ppo", tmp_path, total_timesteps=units("ppo", 2), checkpoint_interval=1)
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    before = last.read_bytes()
    with pytest.raises(
        SystemExit,
        match=rf"^error: the run directory {tmp_path / 'run'} exists; continue it with "
        r"--resume auto, start another with --run-name NAME, or remove it with --overwrite",
    ):
        train("ppo", tmp_path, total_timesteps=units("ppo", 1))
    assert last.read_bytes() == before and summary_of(tmp_path)["global_step"] == first["global_step"]
    resumed = train("ppo", tmp_path, total_timesteps=units("ppo", 3), resume="auto")  # continues it
    assert resumed["global_step"] == units("ppo", 3)
    with pytest.raises(SystemExit, match="--overwrite starts the run over and --resume continues it"):
        train("ppo", tmp_path, overwrite=True, resume="auto")
    again = train("ppo", tmp_path, total_timesteps=units("ppo", 1), overwrite=True)  # starts over, the old files gone
    assert again["global_step"] == units("ppo", 1)
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["last.pt"]
    assert len(list((tmp_path / "run").glob("events.out.tfevents.*"))) == 1


def test_a_checkpoint_supplies_its_env_and_network_flags(tmp_path):
    """--eval-only, --export and --resume of a run on another env with other network sizes, given no
    flag of either: the checkpoint's are taken; an --env-id that contradicts it is a clear error."""
    from tests.helpers import run_main

    module = load_script("ppo")
    trained = dict(env_id="Pendulum-v1", num_envs=16, num_steps=8, hidden_sizes=(16, 16), activation="elu")
    plain = dict(device="cpu", progress=False, num_eval_envs=4, output_dir=str(tmp_path))
    first = run_main(module, **plain, **trained, run_name="run", total_timesteps=16 * 8 * 2, eval_interval=1)
    best = str(tmp_path / "run" / "checkpoints" / "best.pt")
    result = run_main(module, **plain, eval_only=True, resume=best)  # the default env id and network flags
    assert result["eval_return"] == pytest.approx(first["best_eval_return"], rel=1e-9)  # its own evaluation, replayed
    with pytest.raises(SystemExit, match=r"trained on env 'Pendulum-v1', not 'Acrobot-v1': drop --env-id"):
        run_main(module, **plain, eval_only=True, resume=best, env_id="Acrobot-v1")
    resumed = run_main(module, **plain, run_name="run", resume="auto", num_envs=16, total_timesteps=16 * 8 * 3)
    assert resumed["env_id"] == "Pendulum-v1" and resumed["global_step"] == 16 * 8 * 3
    assert json.loads((tmp_path / "run" / "config.json").read_text())["hidden_sizes"] == [16, 16]


def test_summary_lists_only_the_checkpoints_that_exist(tmp_path):
    summary = train("ppo", tmp_path, total_timesteps=units("ppo", 2), eval_interval=0)
    assert set(summary["checkpoints"]) == {"last"} and Path(summary["checkpoints"]["last"]).is_file()
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())["checkpoints"]
    assert on_disk == summary["checkpoints"]
