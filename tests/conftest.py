"""Under pytest-xdist (`-n 2`, the README's test command) each worker takes one torch thread: the
workers already share the cores, and two threads each would only contend for them.

Tests marked `sims` need a real simulator (ale-py, envpool, mjlab) and skip without it. With
REQUIRE_SIMULATORS=1 (.ci/run's sims lane, where all three are installed) such a skip, or a test
module skipped at import, is a failure instead: a simulator that stopped installing or importing
must not pass CI as a row of skips. Tests marked `playground` (MuJoCo Playground, whose MuJoCo is not the one mjlab
pins: a lane of its own) are held so with REQUIRE_SIMULATORS=playground, the playground lane's."""

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    # and compiles in its own process, as do the runs it starts (they inherit the environment): inductor's pool of
    # compile processes, one per core, each importing torch (~9 CPU-s a process that compiles, measured on a cold
    # compiled-vs-eager test), would only build the C++ kernels on the core the other worker uses. Set before torch's
    # inductor reads it at import.
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

# REQUIRE_SIMULATORS=1: the sims lane's markers (and modules) may not skip; =playground: the playground lane's tests
REQUIRED_MARKERS = {"1": ("sims",), "playground": ("playground",)}.get(os.environ.get("REQUIRE_SIMULATORS", ""), ())
REQUIRE_SIMULATORS = "sims" in REQUIRED_MARKERS


def _as_failure(report, what: str) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"{what} skipped, but REQUIRE_SIMULATORS is set: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    required = any(item.get_closest_marker(m) is not None for m in REQUIRED_MARKERS)
    if required and report.skipped and not hasattr(report, "wasxfail"):
        _as_failure(report, item.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_SIMULATORS and report.skipped and isinstance(collector, pytest.Module):
        _as_failure(report, collector.nodeid)


def pytest_collection_modifyitems(config, items):
    """The long tests first (marked `slow`: learning runs and nested suites; `distributed`: torchrun launches), in
    their order, then the rest: with `-n 2` a long test collected last would leave one worker running it alone while
    the other has nothing left. An order of the run only (every worker collects it the same)."""
    items.sort(key=lambda item: 0 if item.get_closest_marker("slow") or item.get_closest_marker("distributed") else 1)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: without the plugin (-p no:xdist, a nested run) never called
def pytest_xdist_make_scheduler(config, log):
    """`-n 2` with its default `--dist load` schedules by work stealing: a worker whose queue runs out takes half of
    the other's. With `load`, the tests left at the end stayed queued on one worker, which ran its last minutes alone
    while the other had nothing (CPU idle 26 to 50% there, docs/tests.md). Another --dist given is kept."""
    if config.getoption("dist") == "load":
        from xdist.scheduler import WorkStealingScheduling

        return WorkStealingScheduling(config, log)
    return None
