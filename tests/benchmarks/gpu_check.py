"""Does the GPU path work, and how fast is it? One command for a person with one GPU, in parts that
each fit a short reservation:

    python -m tests.benchmarks.gpu_check --sections tests torchrun     # part 1, about 4.5 min on one H100
    python -m tests.benchmarks.gpu_check --sections checks parity      # part 2, about 7 min
    python -m tests.benchmarks.gpu_check --sections speed              # part 3, about 6.5 min
    python -m tests.benchmarks.gpu_check --sections speed-pendulum     # part 4, about 4 min
    python -m tests.benchmarks.gpu_check --quick                       # first in a short lease, about 8 min

--quick: the checks of every script (10 iterations, without the eager seeds), the parity rows and the acting
step, then the captured speed rows of ppo, ppo_lstm and pqn on CartPole-v1 at 4096 envs (speed-quick); it leaves
out the CUDA tests, torchrun, the comparison with eager seeds, the eager speed rows, ppo at 65536 envs and the
Pendulum-v1 rows, which the parts run.

Without --sections it runs them all (about 19 minutes; the parts one after another, about 22). Each run prints
its plan first (the sections with their expected minutes), writes DIR/gpu_check.md and DIR/gpu_check.json (DIR:
--out, default runs/gpu_check), prints the markdown, and exits non-zero if anything it ran failed.
Parts run one after another into the same DIR add up to one report (sections of the same commit
and device are kept; a section run again replaces its earlier result). The expected minutes are
estimates (the last measured H100 figure, ppo CartPole-v1 at 4096 envs with compile and CUDA
graphs at 1.22M SPS, and 30-90 s of compiling per script process), not measurements: the report
gives each section's measured minutes beside them.

Sections (on a GPU the correctness sections, tests to torchrun, run side by side, as their time is
mostly compiling on the CPU's cores; the speed sections after them, each run alone on the GPU):

tests     the CUDA tests (`pytest -m cuda`: tests/test_cuda.py and the CUDA cases elsewhere).
checks    every script in algos/ for 20 iterations at its CUDA defaults, compiled and captured,
          with inductor's own random numbers (the production path; --log-interval 5 and an
          evaluation every 10 so that the host-read points come round):
          - torch.cuda's sync debug mode set to "error" from the start of each iteration's rollout
            to its first host read (the log, evaluation or save): zero syncs, or where one was;
          - dynamo's counters while each captured function warms up (its compile, warm-up and
            capture calls): graph breaks (must be 0, with their reasons) and frames compiled;
            once the function is ready, every call runs under dynamo's error_on_recompile, and a
            frame compiled then (a new one, not a recompile) fails it too;
          - the Python state (closure cells, `run` attributes, module attributes) that a captured
            function changes in any call after its first: none, since a replay runs no Python;
          - judged by distribution against eager runs of seeds 1-6 (one process): the mean over
            the run's log points of the episodic return and of every logged loss lies within
            [min - 3R, max + 3R] of the eager seeds' means (R their range).
parity    every script: the same plan eager and compiled and captured (the same --total-timesteps,
          iterations and flags), with inductor drawing its random numbers as eager does
          (fallback_random), a numbered checkpoint every iteration, every entry either run has
          (model, optimizers, normalizers, each rank's state and env state; not the RNG states):
          at every iteration, counters and schedules (plain values, integer 0-d tensors, an
          optimizer's step, a normalizer's count, a scheduled learning rate) and the entries
          themselves judged exactly; the rest judged at the first checkpoint after an update
          (iteration 1; td3, sac: the first past learning_starts), floats to a tolerance, and
          later compared and reported, not judged (the iteration at which the runs part: a
          rounding difference that flips a discrete action changes what follows).
          And ppo's Gaussian acting step as a script acts, in three parts: compiled against eager,
          compiled and captured against eager (both with fallback_random), and with inductor's own
          random numbers, judged by distribution (the standardised noise of 6 replays of 4 steps:
          mean 0, variance 1, no correlation between steps or replays). Every script's row and
          every part of the acting step is a result of its own, run in a process of its own: one
          that fails (a CUDA error in a capture included) is reported with its error, the others
          still are.
torchrun  ppo under `torchrun --nproc-per-node 1`, whose one rank joins an NCCL group and so runs
          every distributed path (the all-reduces inside the captured update, gather_object at
          save, the parameter check at the end); then the NaN guard under the same launcher,
          which must end the rank with the error within seconds (graphs released before the group).
speed     CartPole-v1: ppo, ppo_lstm and pqn at 4096 envs, ppo at 65536; eager and
          compile+cudagraphs, each run alone in its own process (tests/benchmarks/bench.py: steady
          state over 3 log intervals after one of warm-up), next to the env-only SPS. A run below
          its floor (FLOORS: 90% of the last figure measured on the same GPU, H100 or H200; a row
          without one is measured and its figure printed) fails, naming the floor.
speed-pendulum   the same for ppo, td3 and sac on Pendulum-v1 at 4096 envs.
speed-quick      --quick's: ppo, ppo_lstm and pqn on CartPole-v1 at 4096 envs, compile+cudagraphs only.

On a machine without a GPU, and no --device, it runs its CPU part, what needs no GPU (CI runs
it): the checks' iterations eager, with a host-sync recorder (tests/host_sync.py) in place of the
sync debug mode and the Python-state check; the compiled acting step against eager and its own
random numbers by distribution; torchrun with gloo; and it lists the rest as skipped. With
`--device cpu` it runs the GPU plan itself on the CPU, every run eager (a dry run of the plan: the
checks against eager seeds, the parity of the two plans, which compares like with like when its
difference is 0.0; the speed sections are listed, not run). A GPU never runs the CPU part.
--algos takes script names or paths (a copy of a script elsewhere).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tests.benchmarks import bench  # noqa: E402
from tests.helpers import free_port, load_script, subprocess_env, untrained_teacher  # noqa: E402

SECTIONS = ("tests", "checks", "parity", "torchrun", "speed", "speed-pendulum")
CORRECTNESS = ("tests", "checks", "parity", "torchrun")  # side by side on a GPU
# Expected minutes on one H100 with 16 cores (estimates, see the docstring): the CUDA tests are
# mostly their two compiled learning runs (3M and 8M steps); checks and parity compile every
# script once each, five processes side by side; a speed process is about 55 s compiled (90 s for
# ppo_lstm) and 20-40 s eager, one at a time.
EXPECTED_MINUTES = {"tests": 4.0, "checks": 6.0, "parity": 4.8, "torchrun": 1.5, "speed": 6.5, "speed-pendulum": 4.0}
PARTS = (("tests", "torchrun"), ("checks", "parity"), ("speed",), ("speed-pendulum",))
# --quick: what runs first in a short reservation, within 8 minutes by these estimates (one H100's figures; an H200
# is at least as fast): the checks of every script at QUICK_ITERATIONS without the eager seeds (each a process that
# is mostly compiling: about 3 min side by side), the parity rows and the acting step (each process compiles once
# more after its eager run: 3.5), then speed-quick alone (one env-only measurement and three compiled processes of
# about 55, 90 and 55 s: 3.5). Left out: QUICK_LEAVES_OUT.
QUICK = ("checks", "parity", "speed-quick")
QUICK_MINUTES = {"checks": 3.0, "parity": 3.5, "speed-quick": 3.5}
QUICK_ITERATIONS = 10  # two log intervals and one evaluation
QUICK_LEAVES_OUT = (
    "the CUDA tests (tests)",
    "torchrun with NCCL and the NaN guard's exit (torchrun)",
    "the checks' comparison with six eager seeds",
    "the eager speed rows",
    "ppo at 65536 envs",
    "the Pendulum-v1 speed rows (speed-pendulum)",
)
WHAT = {
    "tests": "the CUDA tests (pytest -m cuda)",
    "checks": "every script compiled and captured: syncs, graph breaks, recompiles, Python state; against eager seeds",
    "parity": "every script's compiled and eager plans: counters and schedules at every iteration, the rest after "
    "their first update; ppo's captured acting step and its RNG",
    "torchrun": "ppo under torchrun with one NCCL rank; the NaN guard's exit",
    "speed": "CartPole-v1 at 4096 (ppo, ppo_lstm, pqn) and 65536 envs (ppo), eager and captured",
    "speed-pendulum": "Pendulum-v1 at 4096 envs (ppo, td3, sac), eager and captured",
    "speed-quick": "CartPole-v1 at 4096 envs (ppo, ppo_lstm, pqn), captured only (--quick)",
}
ALL_SECTIONS = (*SECTIONS, "speed-quick")
SPEED_SECTIONS = ("speed", "speed-pendulum", "speed-quick")
MARKER = "GPU_CHECK_RESULT "
HOST_READS = ("reduce_iteration", "log", "evaluate", "checkpoints_to_write", "save", "finish", "eval_only")
HOST_READS += ("log_eval_save",)  # td3.py's and sac.py's log, evaluation and save (common/offpolicy.py)
HOST_READS += ("log_iteration", "evaluate_and_save")  # the PPO family's, as its loops call them (`loop.log_iteration`)
SPEED_ROWS = [
    ("speed", "CartPole-v1", 4096, ("ppo", "ppo_lstm", "pqn")),
    ("speed", "CartPole-v1", 65536, ("ppo",)),
    ("speed-pendulum", "Pendulum-v1", 4096, ("ppo", "td3", "sac")),
    ("speed-quick", "CartPole-v1", 4096, ("ppo", "ppo_lstm", "pqn")),
]
SPEED_MODES = ("eager", "compile+cudagraphs")
SECTION_MODES = {"speed-quick": ("compile+cudagraphs",)}  # the modes of a speed section, when not SPEED_MODES
# The training SPS last measured for a row on a GPU, by the GPU's name (matched in torch.cuda's device name): a
# run's floor is FLOOR_SHARE of it (run-to-run noise), on that GPU only. A GPU or row without a figure has no floor
# yet: the report prints the figures it measured, to add here. H200: `python -m tests.benchmarks.bench --device cuda
# --env-id ENV --num-envs N --algos ALGO --modes MODE`, each run alone, steady state (torch 2.11.0+cu130, tensordict
# 0.15.3, commit b3e1853; ppo_lstm: gpu_check --quick's speed row, commit 5f38111). H100: none measured since the
# current layout (its old 1.22M for ppo is gone with it).
FLOORS = {
    "H200": {
        ("ppo", "CartPole-v1", 4096, "compile+cudagraphs"): 9_112_420,
        ("ppo", "CartPole-v1", 4096, "eager"): 554_530,
        ("pqn", "CartPole-v1", 4096, "compile+cudagraphs"): 12_552_176,
        ("ppo_lstm", "CartPole-v1", 4096, "compile+cudagraphs"): 3_206_883,  # at 5f38111 (--quick)
        ("ppo", "CartPole-v1", 65536, "compile+cudagraphs"): 29_305_583,
        ("td3", "Pendulum-v1", 4096, "compile+cudagraphs"): 375_009,
        ("sac", "Pendulum-v1", 4096, "compile+cudagraphs"): 373_168,
    },
    "H100": {},
}
FLOOR_SHARE = 0.9
DISTRIBUTION_SEEDS = (1, 2, 3, 4, 5, 6)
OUTSIDE = "(outside captured functions)"
STATISTICS = re.compile(r"^(charts/episodic_return|losses/.*)$")


# ----------------------------------------------------------------------------------------------
# The worker: one process, one script, one job (check, eager seeds or parity)
# ----------------------------------------------------------------------------------------------
class SyncWindow:
    """Host syncs are errors while `open`: CUDA's sync debug mode, or on CPU a recorder of the reads
    that would sync (tests/host_sync.py; the optimizers' own step reads left out, as in the contract
    test)."""

    def __init__(self, cuda: bool, files: set[str]):
        self.cuda, self.open, self.syncs = cuda, False, []
        if not cuda:
            from tests.host_sync import SyncsOutsideTheOptimizer

            window = self

            class Recorder(SyncsOutsideTheOptimizer):
                def record(self, name: str) -> None:
                    before = len(self.syncs)
                    super().record(name)
                    if window.open and len(self.syncs) > before:
                        window.syncs.append(f"{name} in {where(files)}")

            self.recorder = Recorder()

    def set(self, is_open: bool) -> None:
        self.open = is_open
        if self.cuda:
            torch.cuda.set_sync_debug_mode("error" if is_open else 0)

    @contextmanager
    def closed(self):
        was = self.open
        self.set(False)
        try:
            yield
        finally:
            self.set(was)


def where(files: set[str], tb=None) -> str:
    """The innermost frame of the checked script or of common/ in a stack or traceback."""
    frames = traceback.extract_tb(tb) if tb is not None else traceback.extract_stack()
    ours = [f for f in frames if f.filename in files or "/common/" in f.filename]
    f = (ours or frames)[-1]
    return f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno} {f.name}"


def dynamo_counts() -> tuple[int, int]:
    """(frames dynamo compiled, graph breaks) so far in this process."""
    from torch._dynamo.utils import counters

    return counters["frames"].get("total", 0), sum(counters["graph_break"].values())


def accepted_break(reason) -> str | None:
    """Why a graph break (dynamo's GraphCompileReason) is there by design, or None. compiled() takes a
    minibatch's whole update step, and dynamo traces neither backward() nor the optimizer's zero_grad,
    and torch's optimizer breaks its own step around its gradient mode: the forward, the backward and
    the optimizer step compile as graphs of their own, and the CUDA graph captures them all. The
    normalizer updates are kept out of torch.compile on purpose (torch.compiler.disable: inductor
    drops in-place writes to 0-d float64 tensors). Any other break (an nn.LSTM that dynamo will not
    trace, data-dependent control flow, a graph_break() of a script's own) is not."""
    text, frame = reason.reason, (reason.user_stack[-1] if reason.user_stack else None)
    if "Tensor.backward()" in text:
        return "backward()"
    if "Optimizer.zero_grad" in text:
        return "the optimizer's zero_grad"
    if frame is not None and "/torch/optim/" in frame.filename:
        return "the optimizer's step"
    if "torch.compiler.disable" in text:
        return "a torch.compiler.disable'd function"
    return None


def break_text(reason) -> str:
    frame = reason.user_stack[-1] if reason.user_stack else None
    at = f" at {Path(frame.filename).name}:{frame.lineno} {frame.name}" if frame is not None else ""
    return reason.reason.splitlines()[0] + at


def statistics(run_dir: Path) -> dict[str, list[float]]:
    """The logged episodic returns and losses of a run, {tag: [value at each log point]}."""
    return {
        tag: [v for _, _, v in events] for tag, events in bench.read_scalars(run_dir).items() if STATISTICS.match(tag)
    }


def check_run(module, args: dict, cuda: bool, files: set[str]) -> dict:
    """One run with the sync window, the dynamo counters of each captured function's warm-up,
    error_on_recompile once it is ready, and the Python state its calls after the first change."""
    import common.capture
    import common.evaluation
    import common.loop
    from tests.replay import changes, python_state

    window = SyncWindow(cuda, files)
    warmup, after_warmup, state_changes, breaks, accepted = {}, {}, [], [], set()
    real_captured = common.capture.captured

    def watched(name, fn, run):
        """fn, with the Python state of its calls 2-4 compared before and after (a warm-up or capture
        call on CUDA; the replays after run no Python, so a change there would stop happening)."""
        calls = [0]

        def call(*a, **k):
            calls[0] += 1
            if not 2 <= calls[0] <= 4:
                return fn(*a, **k)
            before = python_state(fn, run)
            out = fn(*a, **k)
            changed = changes(before, python_state(fn, run))
            if changed:  # the first call that changed it, and what it changed
                state_changes.append(f"{name}: call {calls[0]} changes {'; '.join(changed[:3])}")
                calls[0] = 4
            return out

        return call

    def captured(run, name, fn, capture=True):  # capture=False: run step by step, Python state allowed
        wrapped = real_captured(run, name, watched(name, fn, run) if capture else fn, capture)
        ready = getattr(wrapped, "ready", lambda: True)

        def call(*a, **k):
            frames, graph_breaks = dynamo_counts()
            if not ready():  # compile, warm-up and capture may sync and compile
                from torch._dynamo.utils import graph_break_reasons

                first = len(graph_break_reasons)
                with window.closed():
                    out = wrapped(*a, **k)
                counts = warmup.setdefault(name, {"frames": 0, "graph_breaks": 0, "accepted": 0})
                frames_now, breaks_now = dynamo_counts()
                counts["frames"] += frames_now - frames
                counts["graph_breaks"] += breaks_now - graph_breaks
                for reason in graph_break_reasons[first:]:
                    why = accepted_break(reason)
                    if reason.graph_break and why is None:
                        breaks.append(f"{name}: {break_text(reason)}")
                    elif reason.graph_break:
                        counts["accepted"] += 1
                        accepted.add(f"{name}: {why}")
                return out
            with torch._dynamo.config.patch(error_on_recompile=True):
                out = wrapped(*a, **k)
            if dynamo_counts()[0] > frames:
                after_warmup[name] = after_warmup.get(name, 0) + dynamo_counts()[0] - frames
            return out

        return call

    def closing_window(fn):
        def call(*a, **k):
            window.set(False)
            return fn(*a, **k)

        return call

    real_timed = module.timed

    @contextmanager
    def timed(run, phase):
        if phase == "rollout":
            window.set(True)  # an iteration starts: no host read until its first host-read point
        with real_timed(run, phase):
            yield

    originals = {}  # what the check patched, put back after the run (the next script's check starts from them)

    def patch(owner, name, value):
        originals.setdefault((owner, name), getattr(owner, name))
        setattr(owner, name, value)

    # where a script's functions are captured: its own compile-and-capture block, and the evaluation's chunk
    for owner in (module, common.capture, common.evaluation):
        if hasattr(owner, "captured"):
            patch(owner, "captured", captured)
    patch(module, "timed", timed)
    # a host-read point as the script calls it: by its own name, or as common.loop's (`loop.log_iteration`)
    for owner, name in ((owner, name) for owner in (module, common.loop) for name in HOST_READS):
        if hasattr(owner, name):
            patch(owner, name, closing_window(getattr(owner, name)))
    torch._dynamo.config.fail_on_recompile_limit_hit = True  # never fall back to eager without a word
    start = dynamo_counts()
    result = {"status": "ok"}
    try:
        if cuda or args.get("compile"):  # (on a CPU a dispatch mode would keep dynamo from compiling)
            summary = module.main(module.Args(**args))
        else:
            with window.recorder:
                summary = module.main(module.Args(**args))
        result["summary"] = {
            k: summary.get(k)
            for k in (
                "global_step",
                "iteration",
                "compile",
                "cudagraphs",
                "compile_seconds",
                "wall_seconds",
                "params_in_sync",
            )
        }
        result["statistics"] = statistics(Path(args["output_dir"]) / args["run_name"])
    except BaseException as e:  # noqa: BLE001 -- reported, with where it happened
        window.set(False)
        result.update(
            status="failed",
            error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
            at=where(files, e.__traceback__),
        )
    finally:
        for (owner, name), value in originals.items():
            setattr(owner, name, value)
    end = dynamo_counts()
    elsewhere = {
        "frames": end[0] - start[0] - sum(c["frames"] for c in warmup.values()) - sum(after_warmup.values()),
        "graph_breaks": end[1] - start[1] - sum(c["graph_breaks"] for c in warmup.values()),
    }
    if any(elsewhere.values()):  # compiled code called outside the captured functions
        warmup[OUTSIDE] = elsewhere
    result.update(
        syncs=window.syncs,
        warmup=warmup,
        graph_breaks=sorted(set(breaks), key=breaks.index),
        accepted_breaks=sorted(accepted),
        frames_after_warmup=after_warmup,
        python_state=state_changes,
    )
    return result


# What parity compares of a checkpoint: the model, optimizers, the script's state and each rank's (the RNG
# states left out: inductor's draws leave other generator states); the counters beside them are judged apart.
PARITY_PARTS = ("model", "optimizers", "state", "ranks")


def parity(eager: Path, compiled: Path) -> dict:
    """The numbered checkpoints of two runs of one plan, compared at every iteration either run wrote one, every
    entry either run has (the RNG states left out: inductor's draws leave other generator states).

    Judged at every iteration (exact): a checkpoint, an entry or a dtype/shape that one run has and the other not;
    the counters and schedules, the same function of the iteration in both runs whatever the data: plain Python
    values (host counters, hyperparameters), integer and bool 0-d tensors, and the float ones that count or schedule
    (an optimizer's `step`, a normalizer's `count`, a learning rate `lr` / `learning_rate`, but for
    --lr-schedule adaptive, which follows the data's KL).

    Judged at the first checkpoint after an update (an optimizer with state: iteration 1 for the on-policy scripts,
    the first iteration past learning_starts for td3 and sac), everything else: floats to rtol 1e-3 and atol 1e-4,
    the rest (an env's step counts, stored discrete actions) exactly: the same update of the same data, up to float
    rounding. Later, those are reported, not judged: `parted_at`, the first iteration at which the two runs differ in
    them (None: never). A rounding difference that flips one discrete action changes that env's episode and what
    follows, and Adam's normalized step carries a rounding difference in a near-zero gradient to a whole step, so
    two correct runs may part; a counter or a schedule never may."""

    def numbered(run_dir):
        files = sorted((run_dir / "checkpoints").glob("step_*.pt"), key=lambda p: int(p.stem[5:]))
        return {int(p.stem[5:]): torch.load(p, weights_only=True) for p in files}

    a_ckpts, b_ckpts = numbered(eager), numbered(compiled)
    steps = sorted(set(a_ckpts) & set(b_ckpts))
    if not steps:
        return {"status": "failed", "error": "no step checkpoint"}
    alone = [
        f"step_{step}.pt: only in the {'eager' if step in a_ckpts else 'compiled'} run"
        for step in sorted(set(a_ckpts) ^ set(b_ckpts))
    ]
    updated = [s for s in steps if any(opt.get("state") for opt in a_ckpts[s].get("optimizers", {}).values())]
    if not updated:
        return {
            "status": "failed",
            "error": f"no update by iteration {a_ckpts[steps[-1]]['iteration']} (the last checkpoint)",
        }
    compared = {step: compare(a_ckpts[step], b_ckpts[step]) for step in steps}
    first = compared[updated[0]]
    later = [compared[step] for step in steps if step > updated[0]]
    parted_at = next((c["iteration"] for c in later if c["status"] != "ok"), None)
    last = later[-1] if later else first
    result = {
        **first,
        "parted_at": parted_at,
        "last": {k: last.get(k) for k in ("iteration", "status", "max_abs_diff", "worst_tensor", "differing", "error")},
    }
    exact = next((c for c in compared.values() if c["exact_differing"]), None)
    if alone or exact is not None:  # a counter, a schedule or an entry of one run only: judged at every iteration
        return {
            **result,
            "status": "differs",
            "iteration": exact["iteration"] if exact is not None else first["iteration"],
            "differing": (alone + (exact["exact_differing"] if exact is not None else []))[:5],
        }
    return result


def compare(a: dict, b: dict) -> dict:
    """Two checkpoints of the same iteration, every entry either has (see parity). `differing`: what differs, floats
    beyond the tolerance; `exact_differing`: of those, what parity judges at every iteration."""
    if a["iteration"] != b["iteration"] or a["global_step"] != b["global_step"]:
        line = f"/iteration, /global_step: {a['iteration']}, {a['global_step']} vs {b['iteration']}, {b['global_step']}"
        return {
            "status": "differs",
            "iteration": a["iteration"],
            "error": f"checkpoints of iterations {a['iteration']} and {b['iteration']}",
            "differing": [line],
            "exact_differing": [line],
        }
    adaptive = a.get("args", {}).get("lr_schedule") == "adaptive"
    worst, worst_name, bad, exact_bad, compared, parts = 0.0, None, [], [], 0, set()
    missing = object()

    def counts_or_schedules(path, x):  # a float tensor that is the same function of the iteration in both runs
        name = re.split(r"[/.\[]", path)[-1]
        return x.dim() == 0 and (
            (name == "step" and path.startswith("/optimizers/"))
            or name == "count"
            or (name in ("lr", "learning_rate") and not adaptive)
        )

    def differs(path, why, exact):
        bad.append(f"{path}: {why}" if why else path)
        if exact:
            exact_bad.append(bad[-1])

    def walk(x, y, path):
        nonlocal worst, worst_name, compared
        if x is missing or y is missing:
            differs(path, f"only in the {'eager' if y is missing else 'compiled'} run", True)
        elif isinstance(x, dict) and isinstance(y, dict):
            for k in list(x) + [k for k in y if k not in x]:
                if k != "rng":
                    walk(x.get(k, missing), y.get(k, missing), f"{path}/{k}")
        elif isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            for i in range(max(len(x), len(y))):
                walk(x[i] if i < len(x) else missing, y[i] if i < len(y) else missing, f"{path}[{i}]")
        elif torch.is_tensor(x) and torch.is_tensor(y):
            compared += 1
            parts.add(path.split("/")[1].split("[")[0])
            if y.shape != x.shape or y.dtype != x.dtype:
                differs(path, f"{x.dtype} {list(x.shape)} vs {y.dtype} {list(y.shape)}", True)
            elif x.is_floating_point() and not counts_or_schedules(path, x):
                diff = (x.double() - y.double()).abs().max().item() if x.numel() else 0.0
                if diff > worst or math.isnan(diff):
                    worst, worst_name = diff, path
                if not torch.allclose(y.double(), x.double(), rtol=1e-3, atol=1e-4, equal_nan=True):
                    differs(path, "", False)
            elif not torch.equal(x, y):
                scalar = x.dim() == 0
                differs(path, f"{x.item()} vs {y.item()}" if scalar else "", scalar)
        elif torch.is_tensor(x) or torch.is_tensor(y) or type(x) is not type(y):
            differs(path, f"{type(x).__name__} vs {type(y).__name__}", True)
        elif x != y and not (x != x and y != y):  # a plain value (NaN equals NaN)
            differs(path, f"{x!r} vs {y!r}", True)

    walk({k: a.get(k, {}) for k in PARITY_PARTS}, {k: b.get(k, {}) for k in PARITY_PARTS}, "")
    return {
        "status": "ok" if not bad else "differs",
        "iteration": a["iteration"],
        "max_abs_diff": worst,
        "worst_tensor": worst_name,
        "tensors": compared,
        "parts": sorted(parts),
        "differing": bad[:5],
        "exact_differing": exact_bad[:5],
    }


def parity_plan(algo: str, device: str, iterations: int, num_envs: int | None, out: Path) -> dict:
    """The parity section's plan: the checks' (plan), with a numbered checkpoint every iteration, to compare them."""
    return {**plan(algo, device, True, iterations, num_envs, out), "checkpoint_interval": 1}


def worker(cfg: dict) -> dict:
    """cfg["job"] of cfg["script"] (a name in algos/ or a path) with cfg["args"]:
    check: one checked run; seeds: eager runs of cfg["seeds"]; parity: the plan eager, then compiled
    (cfg["compile"]) with fallback_random, their checkpoints compared."""
    import common.buffer

    module = load(cfg["script"])
    files = {str(Path(module.__file__).resolve()), module.__file__}
    real_init = common.buffer.ReplayBuffer.__init__  # sampled against the device fill level in every run
    common.buffer.ReplayBuffer.__init__ = lambda self, *a, **k: real_init(self, *a, **{**k, "capturable": True})
    args = cfg["args"]
    cuda = args["device"].startswith("cuda")
    result = {"algo": cfg["algo"], "job": cfg["job"]}
    if cfg["job"] == "check":
        return {**result, **check_run(module, args, cuda, files)}
    if cfg["job"] == "acting":
        return {**result, "status": "ok", "parts": acting_step(args["device"])}
    try:
        if cfg["job"] == "seeds":
            result["statistics"] = {}
            for seed in cfg["seeds"]:
                module.main(module.Args(**{**args, "seed": seed, "run_name": f"seed{seed}"}))
                result["statistics"][seed] = statistics(Path(args["output_dir"]) / f"seed{seed}")
        else:  # parity
            out = Path(args["output_dir"])
            module.main(module.Args(**{**args, "run_name": "eager", "compile": False, "cudagraphs": False}))
            with torch._inductor.config.patch(fallback_random=True):
                module.main(
                    module.Args(
                        **{
                            **args,
                            "run_name": "compiled",
                            "compile": cfg["compile"],
                            "cudagraphs": cfg["compile"] and cuda,
                        }
                    )
                )
            result["parity"] = parity(out / "eager", out / "compiled")
        result["status"] = "ok"
    except BaseException as e:  # noqa: BLE001 -- reported, with where it happened
        result.update(
            status="failed",
            error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
            at=where(files, e.__traceback__),
        )
    return result


def say(msg: str) -> None:
    print(f"[gpu_check] {msg}", file=sys.stderr, flush=True)


def run_worker(cfg: dict, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "tests.benchmarks.gpu_check", "--worker", json.dumps(cfg)]
    t0 = time.time()
    rc, output = bench.run_command(cmd, timeout, subprocess_env())
    lines = [line for line in output.splitlines() if line.startswith(MARKER)]
    if lines:
        result = {**json.loads(lines[-1][len(MARKER) :]), "seconds": time.time() - t0}
    else:
        result = {
            "algo": cfg["algo"],
            "job": cfg["job"],
            "status": "failed",
            "error": bench.failure_reason(output),
            "returncode": rc,
            "seconds": time.time() - t0,
        }
    say(f"{cfg['job']} of {cfg['algo']}: {result['status']} in {result['seconds']:.0f} s")
    return result


# ----------------------------------------------------------------------------------------------
# The plan of a script's runs
# ----------------------------------------------------------------------------------------------
def script_name(algo: str) -> str:
    return Path(algo).stem if algo.endswith(".py") else algo


def load(algo: str):
    """A script by its name in algos/, or by its path (a copy elsewhere)."""
    return load_script(script_name(algo), Path(algo) if algo.endswith(".py") else None)


def plan(algo: str, device: str, gpu_sizes: bool, iterations: int, num_envs: int | None, out: Path) -> dict:
    """The flags of a planned run: the script's defaults (on a GPU's sizes with `gpu_sizes`, also on a
    CPU for a dry run), and the schedule of host reads. Every run of a script (checked, eager seeds,
    both sides of the parity) takes these flags, so the same --total-timesteps and schedules."""
    module = load(algo)
    fields = {f.name: f.default for f in dataclasses.fields(module.Args)}
    if num_envs is None:
        num_envs = fields["num_envs"]
        if num_envs is None:  # a device default of the script's (td3/sac: DEVICE_DEFAULTS)
            num_envs = module.DEVICE_DEFAULTS["num_envs"][0 if gpu_sizes else 1]
    steps = num_envs * fields.get("num_steps", 1)
    args = dict(
        device=device,
        num_envs=num_envs,
        total_timesteps=iterations * steps,
        output_dir=str(out),
        run_name="run",
        progress=False,
        log_interval=5,
        eval_interval=10,
        checkpoint_interval=5,
        save_interval=10**9,
        num_eval_envs=min(fields["num_eval_envs"], num_envs),
    )
    if "learning_starts" in fields:  # off-policy: updates from the third iteration on
        args["learning_starts"] = 2 * steps
    if "teacher" in fields:  # distill.py: an untrained ppo.py teacher of the task (what it acts does not matter here)
        out.mkdir(parents=True, exist_ok=True)
        args["teacher"] = str(untrained_teacher(out / "teacher.pt", fields["env_id"]))
    return args


def distribution(checked: dict, eager: dict) -> dict:
    """Each statistic's mean over the log points of the checked run against the eager seeds' means:
    within [min - 3R, max + 3R], R the seeds' range (at least 1e-3 of their mean's size, so seeds
    that agree to the bit still allow rounding). With 6 seeds a draw of the same distribution falls
    outside with a probability of about 4e-4 (normal draws)."""
    rows, bad = [], []
    for tag, values in sorted(checked.items()):
        means = [sum(v) / len(v) for v in (s.get(tag) for s in eager.values()) if v]
        if len(means) < len(eager) or not values:
            continue  # a statistic some run never logged (no episode finished): nothing to compare
        value = sum(values) / len(values)
        lo, hi = min(means), max(means)
        r = max(hi - lo, 1e-3 * abs(sum(means) / len(means)))
        inside = math.isfinite(value) and lo - 3 * r <= value <= hi + 3 * r
        rows.append({"tag": tag, "value": value, "band": [lo - 3 * r, hi + 3 * r], "eager": [min(means), max(means)]})
        if not inside:
            bad.append(f"{tag} {value:.4g} outside [{lo - 3 * r:.4g}, {hi + 3 * r:.4g}]")
    return {
        "status": "ok" if rows and not bad else "differs" if bad else "failed",
        "statistics": rows,
        "outside": bad,
        "seeds": sorted(eager),
        **({} if rows else {"error": "no statistic logged by every run"}),
    }


# ----------------------------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------------------------
def section_tests(gpu: bool, timeout: float) -> dict:
    if not gpu:
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "cuda", "-p", "no:cacheprovider"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env=subprocess_env(),
        )
        return {
            "status": "skipped",
            "error": "needs CUDA",
            "tests": [ln for ln in out.stdout.splitlines() if "::" in ln],
        }
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        rc, output = bench.run_command(
            [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", f"--junitxml={xml}"],
            timeout,
            subprocess_env(),
        )
        counts = (
            {k: int(v) for k, v in re.findall(r'(tests|failures|errors|skipped)="(\d+)"', xml.read_text())[:4]}
            if xml.exists()
            else {}
        )
        failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.M)
    return {
        "status": "ok" if rc == 0 else "failed",
        "returncode": rc,
        "counts": counts,
        "failed": failed,
        "tail": output.splitlines()[-1] if output else "",
    }


def section_checks(mode: str, device: str, algos: list[str], cfg: argparse.Namespace) -> dict:
    """mode "gpu": each script's checked run (compiled and captured) and its eager seeds, side by side;
    "dry": the same plan on a CPU, every run eager; "cpu": the checked runs only, eager (the CPU part)."""
    cuda = device.startswith("cuda")
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:

        def job(algo: str, kind: str) -> dict:
            out = Path(tmp) / script_name(algo) / kind
            args = plan(algo, device, mode != "cpu", cfg.iterations, cfg.num_envs, out)
            spec = {"algo": script_name(algo), "script": algo, "job": kind}
            if kind == "check":
                return run_worker({**spec, "args": {**args, "compile": cuda, "cudagraphs": cuda}}, cfg.timeout)
            return run_worker(
                {**spec, "seeds": list(DISTRIBUTION_SEEDS), "args": {**args, "compile": False, "cudagraphs": False}},
                cfg.timeout,
            )

        seeds = mode != "cpu" and not getattr(cfg, "quick", False)  # --quick leaves the eager seeds out
        kinds = ("check", "seeds") if seeds else ("check",)
        jobs = [(algo, kind) for algo in algos for kind in kinds]
        t0 = time.time()
        with ThreadPoolExecutor(max_workers=len(jobs) if cuda else 1) as pool:
            done = dict(zip(jobs, pool.map(lambda j: job(*j), jobs)))
    rows = []
    for algo in algos:
        row = done[(algo, "check")]
        if mode == "cpu":
            row["distribution"] = {"status": "skipped", "error": "needs CUDA: here the checked run is eager"}
        elif not seeds:
            row["distribution"] = {"status": "skipped", "error": "--quick leaves out the eager seeds"}
        else:
            seeds = done[(algo, "seeds")]
            row["distribution"] = (
                distribution(row["statistics"], seeds["statistics"])
                if row["status"] == seeds["status"] == "ok"
                else {"status": "skipped", "error": seeds.get("error") or "the checked run failed"}
            )
        row.pop("statistics", None)
        if seeds:
            row["seconds"] = max(row["seconds"], done[(algo, "seeds")]["seconds"])  # side by side on a GPU
        rows.append(row)
    return {"scripts": rows, "seconds": time.time() - t0, "compiled": cuda, "mode": mode, "iterations": cfg.iterations}


def section_parity(mode: str, device: str, algos: list[str], cfg: argparse.Namespace) -> dict:
    """Each script's plan eager and compiled (captured on CUDA) with fallback_random, and ppo's acting step, each in
    a process of its own, side by side on a GPU: every row is a result of its own (a row whose process fails, a
    CUDA capture error included, is that row's failure, named, with its error; the others are reported). The CPU
    part runs the acting step only."""
    cuda = device.startswith("cuda")
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:

        def job(algo: str | None) -> dict:
            if algo is None:  # the acting step
                return run_worker(
                    {"algo": "ppo", "script": "ppo", "job": "acting", "args": {"device": device}}, cfg.timeout
                )
            try:
                args = parity_plan(algo, device, cfg.iterations, cfg.num_envs, Path(tmp) / script_name(algo))
                return run_worker(
                    {"algo": script_name(algo), "script": algo, "job": "parity", "compile": cuda, "args": args},
                    cfg.timeout,
                )
            except Exception as e:  # noqa: BLE001 -- the row's failure, not the section's end
                return {
                    "algo": script_name(algo),
                    "job": "parity",
                    "status": "failed",
                    "seconds": 0.0,
                    "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                }

        jobs = ([] if mode == "cpu" else list(algos)) + [None]
        with ThreadPoolExecutor(max_workers=len(jobs) if cuda else 1) as pool:
            *rows, acting = list(pool.map(job, jobs))
    acting_rows = acting.get("parts") or [
        {"part": "its process", "status": "failed", "error": acting.get("error"), "at": acting.get("at")}
    ]
    return {
        "scripts": rows,
        "acting": acting_rows,
        "seconds": time.time() - t0,
        "compiled": cuda,
        **({"skipped": "needs CUDA; --device cpu runs both eager, a dry run"} if mode == "cpu" else {}),
    }


ACTING_PARTS = ("compiled against eager", "captured against eager", "own random numbers")


def acting_step(device: str) -> list[dict]:
    """ppo's Gaussian acting step as a script acts (its grad-free twin of the agent, under no_grad), in three parts,
    each a row of its own (one that raises is that part's failure, with its error and where; the others still run):
    - compiled against eager: common.capture.compiled (the scripts' torch.compile) against eager, the same actions
      and log-probs from the same generator state, with fallback_random;
    - captured against eager (CUDA only): compiled and captured as common.capture.captured does for a script's
      acting step (tensordict's CudaGraphModule, the scripts' warm-up), against eager the same way;
    - own random numbers: with inductor's own random numbers, four steps per call as in a rollout, compiled (and
      captured on CUDA), replayed six times on one observation: the noise (action - mean) / std judged by
      distribution, each bound 5 standard errors (a broken draw under capture, such as the same numbers at every
      replay or every step, fails it).
    Run in a worker process of its own, on its main thread (as a script captures), so that a CUDA error in a
    capture, which can leave the process's CUDA context unusable, ends that process alone.

    At b3e1853 on an H200 (torch 2.11) this check's capture failed with cudaErrorStreamCaptureInvalidated: with
    fallback_random, inductor calls aten's normal for the Gaussian draw, which checks std >= 0 with a host read
    before its kernel, refused inside a capture. The scripts now draw a Normal with common.nets.sample (rsample: the
    same numbers, no read); all three parts passed on an H200 since."""
    import types

    import torch._inductor.config
    from tensordict import from_module

    from common.capture import captured, compiled
    from common.envs import make_env

    cuda = device.startswith("cuda")
    files = {str(ROOT / "algos" / "ppo.py")}
    rows = []

    def part(name: str, fn) -> None:
        t0 = time.time()
        try:
            rows.append({"part": name, **fn()})
        except BaseException as e:  # noqa: BLE001 -- reported as this part's failure
            rows.append(
                {
                    "part": name,
                    "status": "failed",
                    "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                    "at": where(files, e.__traceback__),
                }
            )
        rows[-1]["seconds"] = time.time() - t0

    ppo = load_script("ppo")
    envs = make_env("Pendulum-v1", 256, device=device, seed=1)
    obs, _ = envs.reset()
    agent = ppo.Agent(obs["policy"].shape[-1], None, envs.single_action_space, ppo.Args()).to(device)
    twin = ppo.Agent(obs["policy"].shape[-1], None, envs.single_action_space, ppo.Args()).to(device)
    from_module(agent).data.to_module(twin)  # the scripts act with such a twin: no autograd in the rollout

    def run_like(capture: bool):  # what common.capture reads of a script's run
        return types.SimpleNamespace(
            args=types.SimpleNamespace(compile=True, cudagraphs=capture),
            device=torch.device(device),
            graphs=[],
            compile_seconds={},
            say=lambda message: None,
        )

    def against_eager(capture: bool) -> dict:
        def act(o):
            return twin.act(o)

        run = run_like(capture)
        fast = captured(run, "acting", compiled(run, act), capture=capture)
        results = []
        with torch.no_grad(), torch._inductor.config.patch(fallback_random=True):
            for fn in (act, fast):
                torch.manual_seed(0)
                results.append([tuple(t.clone() for t in fn(obs)) for _ in range(5)])
        diffs = [max((x - y).abs().max().item() for x, y in zip(a, b)) for a, b in zip(*results)]
        return {"status": "ok" if max(diffs) < 1e-5 else "differs", "max_abs_diff": max(diffs), "captured": capture}

    def own_random_numbers() -> dict:
        steps = 4

        def rollout(o):
            return torch.stack([twin.act(o)[0] for _ in range(steps)])

        run = run_like(cuda)
        rollout = captured(run, "rollout", compiled(run, rollout), capture=cuda)
        with torch.no_grad():
            d = twin.distribution(twin.actor(twin.obs_rms(obs["policy"])).float())
            for _ in range(3):  # compiled, warmed up and captured: every later call a replay
                rollout(obs)
            z = torch.stack([((rollout(obs) - d.mean) / d.stddev).clone() for _ in range(6)])  # [6, 4, N, A]
        return {**judge_noise(z), "captured": cuda}

    part(ACTING_PARTS[0], lambda: against_eager(False))
    if cuda:
        part(ACTING_PARTS[1], lambda: against_eager(True))
    else:
        rows.append({"part": ACTING_PARTS[1], "status": "skipped", "error": "needs CUDA"})
    part(ACTING_PARTS[2], own_random_numbers)
    return rows


def judge_noise(z: torch.Tensor) -> dict:
    """Standardised noise z [replays, steps, ...] of a captured function, judged as independent
    standard normal draws, each bound 5 standard errors: mean 0, variance 1, and no correlation
    between one replay and the next nor between one step and the next."""
    replays, steps = z.shape[:2]
    flat = z.double().reshape(replays, steps, -1)
    n, per = flat.numel(), flat.shape[-1]

    def corr(a, b):
        a, b = a - a.mean(), b - b.mean()
        return ((a * b).sum() / (a.norm() * b.norm())).item()

    found = {
        "mean": flat.mean().item(),
        "var": flat.var().item(),
        "across_replays": max(abs(corr(flat[r], flat[r + 1])) for r in range(replays - 1)),
        "across_steps": max(abs(corr(flat[:, s], flat[:, s + 1])) for s in range(steps - 1)),
    }
    bounds = {
        "mean": 5 / math.sqrt(n),
        "var": 5 * math.sqrt(2 / n),
        "across_replays": 5 / math.sqrt(steps * per),
        "across_steps": 5 / math.sqrt(replays * per),
    }
    off = {
        "mean": abs(found["mean"]),
        "var": abs(found["var"] - 1),
        "across_replays": found["across_replays"],
        "across_steps": found["across_steps"],
    }
    failed = [name for name in bounds if not off[name] <= bounds[name]]
    return {"status": "ok" if not failed else "differs", **found, "bounds": bounds, "draws": n, "failed": failed}


def section_torchrun(device: str, num_envs: int, timeout: float) -> dict:
    """ppo under torchrun with one rank: the distributed paths, then the NaN guard's exit."""
    cuda = device.startswith("cuda")
    out = {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1", "--master-addr=127.0.0.1"]
        flags = [
            "--device",
            device,
            "--num-envs",
            str(num_envs),
            "--num-steps",
            "16",
            "--output-dir",
            tmp,
            "--no-progress",
            "--log-interval",
            "2",
            "--eval-interval",
            "4",
            "--save-interval",
            "4",
            "--num-eval-envs",
            "16",
        ]
        cmd = [
            *launch,
            f"--master-port={free_port()}",
            "algos/ppo.py",
            *flags,
            "--run-name",
            "sync",
            "--total-timesteps",
            str(12 * 16 * num_envs),
        ]
        t0 = time.time()
        rc, output = bench.run_command(cmd, timeout, subprocess_env())
        summary_path = Path(tmp) / "sync" / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        ok = rc == 0 and summary.get("params_in_sync") is True and summary.get("world_size") == 1
        out["distributed_paths"] = {
            "status": "ok" if ok else "failed",
            "seconds": time.time() - t0,
            "backend": "nccl" if cuda else "gloo",
            "compile": summary.get("compile"),
            "cudagraphs": summary.get("cudagraphs"),
            **({} if ok else {"error": bench.failure_reason(output), "returncode": rc}),
        }
        # graphs on, compile off (its time buys nothing here): the update graph holds the all-reduces
        nan = [
            *launch,
            f"--master-port={free_port()}",
            "tests/nan_launch.py",
            str(3 * 16 + 1),
            "algos/ppo.py",
            *flags,
            "--run-name",
            "nan",
            "--total-timesteps",
            str(12 * 16 * num_envs),
            "--compile",
            "False",
            "--cudagraphs",
            str(cuda),
        ]
        t0 = time.time()
        rc, output = bench.run_command(nan, min(timeout, 300), subprocess_env())
        seconds = time.time() - t0
        guarded = (
            rc not in (0, None)
            and "FloatingPointError: non-finite" in output
            and "warning: closing the run" not in output
        )
        out["nan_guard_exit"] = {
            "status": "ok" if guarded else "failed",
            "seconds": seconds,
            "returncode": rc,
            **({} if guarded else {"error": bench.failure_reason(output)}),
        }
    return out


def floor_of(algo: str, env_id: str, num_envs: int, mode: str, gpu: str | None) -> dict | None:
    """The floor of a speed row on the GPU named `gpu` (torch.cuda's device name), or None where that GPU has no
    figure for the row."""
    name = next((name for name in FLOORS if gpu and name in gpu), None)
    figure = FLOORS[name].get((algo, env_id, num_envs, mode)) if name else None
    if figure is None:
        return None
    return {
        "sps": FLOOR_SHARE * figure,
        "measured": figure,
        "gpu": name,
        "text": f"{FLOOR_SHARE * figure:,.0f} SPS ({FLOOR_SHARE:.0%} of {figure:,.0f}, the last measured on an {name})",
    }


def section_speed(section: str, device: str, timeout: float, iterations: int, gpu: str | None) -> dict:
    rows = []
    t0 = time.time()
    for _, env_id, num_envs, algos in (r for r in SPEED_ROWS if r[0] == section):
        row = {
            "env_id": env_id,
            "num_envs": num_envs,
            "env_only_sps": bench.measure_env_only(env_id, num_envs, torch.device(device))["sps"],
            "runs": [],
        }
        for algo in algos:
            args_cls = load_script(algo).Args
            for mode in SECTION_MODES.get(section, SPEED_MODES):
                try:
                    record = bench.run_training(
                        algo, args_cls, env_id, num_envs, device, mode, iterations, 1, timeout=timeout
                    )
                except Exception as e:  # noqa: BLE001 -- this row's failure, the section goes on
                    record = {"algo": algo, "mode": mode, "status": "failed", "error": f"{type(e).__name__}: {e}"}
                run = {
                    k: record.get(k)
                    for k in (
                        "algo",
                        "mode",
                        "status",
                        "sps",
                        "rollout_seconds",
                        "update_seconds",
                        "peak_memory_mb",
                        "process_seconds",
                        "error",
                        "command",
                    )
                }
                floor = floor_of(algo, env_id, num_envs, mode, gpu)
                if floor is not None:
                    run["floor"] = floor
                    if run["status"] == "ok" and not run.get("sps", 0) >= floor["sps"]:
                        run["status"] = "below floor"
                        run["error"] = f"{run['sps']:,.0f} SPS is below its floor of {floor['text']}"
                row["runs"].append(run)
        rows.append(row)
    return {"rows": rows, "seconds": time.time() - t0}


def speed_commands(section: str) -> list[str]:
    return [
        f"python -m tests.benchmarks.bench --device cuda --env-id {env_id} --num-envs {n} --algos {' '.join(algos)} "
        f"--modes {' '.join(SECTION_MODES.get(section, SPEED_MODES))}"
        for s, env_id, n, algos in SPEED_ROWS
        if s == section
    ]


# ----------------------------------------------------------------------------------------------
# Verdict and report
# ----------------------------------------------------------------------------------------------
def failures(name: str, result: dict) -> list[str]:
    """What failed in a section's result, each naming the script and the function or run."""
    bad = []
    if "crashed" in result:  # the section's own code raised (its rows are not there to report)
        return [f"{name}: {result['crashed']}"]
    if name == "tests" and result.get("status") == "failed":
        bad.append("CUDA tests: " + (", ".join(result.get("failed", [])) or result.get("tail", "")))
    if name == "checks":
        for r in result["scripts"]:
            algo = r["algo"]
            if r["status"] != "ok":
                bad.append(f"{algo}: {r.get('error')} at {r.get('at')}")
            syncs = r.get("syncs", [])
            bad += [
                f"{algo}: sync {s}" + (f" ({syncs.count(s)} times)" if syncs.count(s) > 1 else "")
                for s in sorted(set(syncs), key=syncs.index)[:3]
            ]
            bad += [f"{algo}: graph break in {b}" for b in r.get("graph_breaks", [])[:5]]
            bad += [
                f"{algo}: {n} graph break(s) in compiled code outside the captured functions"
                for n in [r.get("warmup", {}).get(OUTSIDE, {}).get("graph_breaks", 0)]
                if n
            ]
            bad += [
                f"{algo}: {n} frame(s) compiled in {fn} after its warm-up"
                for fn, n in r.get("frames_after_warmup", {}).items()
            ]
            bad += [f"{algo}: {s}" for s in r.get("python_state", [])[:3]]
            d = r.get("distribution", {})
            if d.get("status") not in ("ok", "skipped"):
                bad.append(f"{algo}: against eager seeds: " + ("; ".join(d.get("outside", [])) or d.get("error", "")))
    if name == "parity":
        for r in result["scripts"]:
            p = r.get("parity", {})
            if r["status"] != "ok" or p.get("status") != "ok":
                bad.append(
                    f"{r['algo']}: " + (r.get("error") or f"{p.get('status')} ({', '.join(p.get('differing', []))})")
                )
        for a in result["acting"]:
            if a["status"] not in ("ok", "skipped"):
                what = (
                    a["error"] + (f" at {a['at']}" if a.get("at") else "")
                    if a["status"] == "failed"
                    else f"{', '.join(a['failed'])} out of bounds"
                    if "failed" in a
                    else f"max abs diff {a['max_abs_diff']:.2g}"
                )
                bad.append(f"acting step, {a['part']}: {what}")
    if name == "torchrun":
        bad += [f"{k}: {r.get('error')}" for k, r in result.items() if isinstance(r, dict) and r.get("status") != "ok"]
    if name.startswith("speed"):
        bad += [
            f"{r['algo']} {r['mode']} {row['env_id']} {row['num_envs']}: {r.get('error')}"
            for row in result.get("rows", [])
            for r in row["runs"]
            if r["status"] != "ok"
        ]
    return bad


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        f"# GPU check, {report['date']}",
        "",
        f"{bench.machine_label(m)}; torch {m['torch']}, tensordict {report['tensordict']}; commit {report['commit']}; "
        f"{report['mode_text']}. Verdict: **{report['verdict']}**",
        "",
        "| section | what | expected on one H100 | measured | result |",
        "|---|---|---|---|---|",
    ]
    for name in (s for s in ALL_SECTIONS if s in SECTIONS or s in report["sections"]):
        s = report["sections"].get(name)
        result = "not run" if s is None else s["status"] + (" (--quick)" if s.get("quick") else "")
        measured = (
            "-" if s is None else f"{s['seconds'] / 60:.1f} min" + ("" if report["mode"] == "gpu" else " on this CPU")
        )
        expected = (s or {}).get("expected_minutes", EXPECTED_MINUTES.get(name))
        lines.append(f"| {name} | {WHAT[name]} | {expected:.1f} min | {measured} | {result} |")
    lines.append("")
    if report["skipped"]:
        lines += ["Skipped: " + "; ".join(report["skipped"]), ""]
    sections = report["sections"]
    for name in ALL_SECTIONS:
        if name in sections and sections[name]["failures"]:
            lines += [f"Failed in {name}:", *[f"- {b}" for b in sections[name]["failures"]], ""]
    shown = {name: sections[name]["result"] for name in sections if "crashed" not in sections[name].get("result", {})}
    tests = shown.get("tests")
    if tests:
        lines += ["## CUDA tests", ""]
        if tests["status"] == "skipped":
            lines += [f"skipped ({tests['error']}): {len(tests['tests'])} tests: " + ", ".join(tests["tests"]), ""]
        else:
            lines += [f"{tests['status']}: {tests['tail']}", *[f"- failed: {t}" for t in tests["failed"]], ""]
    checks = shown.get("checks")
    if checks:
        how = "compiled and captured" if checks["compiled"] else "eager"
        sizes = "its CUDA defaults" if checks.get("mode") != "cpu" else "small sizes"
        lines += [
            f"## checks: every script {how}, {checks.get('iterations')} iterations at {sizes}",
            "",
            "| script | run | syncs between log points | graph breaks in warm-up: not by design (by design), frames "
            "compiled | frames after warm-up "
            "| Python state changed after the first call | against eager seeds | seconds |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in checks["scripts"]:
            run = r["status"] if r["status"] == "ok" else f"failed: {r.get('error')} at {r.get('at')}"
            warm = (
                ", ".join(
                    f"{fn}: {c['graph_breaks'] - c.get('accepted', 0)} ({c.get('accepted', 0)}), {c['frames']}"
                    for fn, c in r.get("warmup", {}).items()
                )
                or "-"
            )
            after = ", ".join(f"{fn}: {n}" for fn, n in r.get("frames_after_warmup", {}).items()) or "0"
            d = r.get("distribution", {})
            dist = d.get("status", "-") + (
                f" ({len(d['statistics'])} statistics)"
                if d.get("statistics")
                else f" ({d['error']})"
                if d.get("error")
                else ""
            )
            lines.append(
                f"| {r['algo']} | {run} | {len(r.get('syncs', []))} {'; '.join(r.get('syncs', [])[:3])} | {warm} "
                f"| {after} | {len(r.get('python_state', []))} {'; '.join(r.get('python_state', [])[:2])} | {dist} | "
                f"{r['seconds']:.0f} |"
            )
        reasons = [f"- {r['algo']}: {b}" for r in checks["scripts"] for b in r.get("graph_breaks", [])[:5]]
        by_design = sorted({b.split(": ", 1)[1] for r in checks["scripts"] for b in r.get("accepted_breaks", [])})
        lines += [
            "",
            *(["Graph breaks not by design:", *reasons, ""] if reasons else []),
            *([f"Graph breaks by design (gpu_check.accepted_break): {', '.join(by_design)}", ""] if by_design else []),
        ]
    parity_result = shown.get("parity")
    if parity_result:
        other = (
            "compiled and captured (fallback_random)"
            if parity_result["compiled"] or parity_result.get("skipped")
            else "eager again (a dry run)"
        )
        lines += [
            "## parity",
            "",
            f"Each script's plan eager and {other}, their numbered checkpoints (judged at the first): "
            + (f"skipped ({parity_result['skipped']})" if parity_result.get("skipped") else "compared"),
            "",
        ]
        if parity_result["scripts"]:
            lines += [
                "| script | result | iteration | tensors compared (parts) | max abs diff | the runs part at "
                "(not judged) | last compared |",
                "|---|---|---|---|---|---|---|",
            ]

            def diff(p):
                if p.get("error"):
                    return p["error"]
                if p.get("max_abs_diff") is None:
                    return "-"
                if p.get("worst_tensor"):
                    return f"{p['max_abs_diff']:.3g} in {p['worst_tensor']}"
                return (
                    "0.0 (every tensor equal)"
                    if p.get("status") == "ok"
                    else f"0.0 in floats; differ: {', '.join(p.get('differing') or [])}"
                )

            for r in parity_result["scripts"]:
                p = r.get("parity", {})
                res = (
                    p.get("status", r["status"])
                    if r["status"] == "ok"
                    else f"failed: {r.get('error')} at {r.get('at')}"
                )
                last = p.get("last") or {}
                parted = (
                    "-" if "last" not in p else "never" if p["parted_at"] is None else f"iteration {p['parted_at']}"
                )
                lines.append(
                    f"| {r['algo']} | {res} | {p.get('iteration', '-')} | {p.get('tensors', '-')} "
                    f"({', '.join(p.get('parts', []))}) | {diff(p)} | {parted} | "
                    + (f"iteration {last['iteration']}: {diff(last)} |" if last else "- |")
                )
            lines.append("")
        lines += ["ppo's acting step, as a script acts (a process of its own):", ""]
        for a in parity_result["acting"]:
            if a["status"] in ("failed", "skipped"):
                text = f"{a['status']}: {a.get('error')}" + (f" at {a['at']}" if a.get("at") else "")
            elif "draws" in a:  # judged by distribution
                text = (
                    f"{a['status']} ({a['draws']} draws{', captured' if a.get('captured') else ''}: mean "
                    f"{a['mean']:.3f}, "
                    f"variance {a['var']:.3f}, correlation across replays {a['across_replays']:.3f}, across steps "
                    f"{a['across_steps']:.3f})"
                )
            else:
                text = f"{a['status']} (max abs diff {a['max_abs_diff']:.2g})"
            lines.append(f"- {a['part']}: {text}")
        lines.append("")
    torchrun = shown.get("torchrun")
    if torchrun:
        lines += ["## torchrun, one rank", ""]
        for name, r in torchrun.items():
            lines.append(
                f"- {name}: {r['status']} in {r['seconds']:.0f} s" + (f" ({r['error']})" if r.get("error") else "")
            )
        lines.append("")
    speed = [row for name in SPEED_SECTIONS for row in shown.get(name, {}).get("rows", [])]
    if speed:
        lines += [
            "## Speed (steady state, each run alone in its own process)",
            "",
            "| env | num_envs | env only SPS | script | mode | SPS | x env only | floor | rollout s | update s | peak "
            "MB |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        new_floors = []
        for row in speed:
            for r in row["runs"]:
                sps = r.get("sps")
                x = f"{sps / row['env_only_sps']:.2f}" if sps else "-"
                floor = r["floor"]["text"] if r.get("floor") else "none yet"
                if sps and r["status"] == "ok" and not r.get("floor"):
                    new_floors.append(
                        f'("{r["algo"]}", "{row["env_id"]}", {row["num_envs"]}, "{r["mode"]}"): {sps:.3g}'
                    )
                lines.append(
                    f"| {row['env_id']} | {row['num_envs']} | {row['env_only_sps']:,.0f} | {r['algo']} | {r['mode']} | "
                    + (
                        f"{sps:,.0f} | {x} | {floor} | {bench.fmt(r.get('rollout_seconds'), '.4f')} | "
                        f"{bench.fmt(r.get('update_seconds'), '.4f')} | {bench.fmt(r.get('peak_memory_mb'))} |"
                        if sps
                        else f"{r['status']}: {r.get('error')} | | {floor} | | | |"
                    )
                )
        if new_floors:
            lines += [
                "",
                "Figures for FLOORS in tests/benchmarks/gpu_check.py (rows measured here for the first time): "
                + ", ".join(new_floors),
            ]
        lines.append("")
    return "\n".join(lines)


def git_commit() -> str | None:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        return head.stdout.strip() + (" (modified)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


MODE_TEXT = {
    "gpu": "the GPU plan",
    "dry": "a dry run of the GPU plan on the CPU, every run eager",
    "cpu": "the CPU part",
}


def expected_minutes(sections, quick: bool = False) -> float:
    """Expected minutes of a run of `sections` on one H100 (QUICK_MINUTES with --quick): the correctness sections
    side by side (they share the CPU's cores while compiling: the longest, plus a quarter of the others), then the
    speed sections one after another."""
    minutes = QUICK_MINUTES if quick else EXPECTED_MINUTES
    side = [minutes[s] for s in sections if s in CORRECTNESS]
    alone = sum(minutes[s] for s in sections if s not in CORRECTNESS)
    return (max(side) + 0.25 * (sum(side) - max(side)) if side else 0.0) + alone


def print_plan(sections: list[str], mode: str, device: str, quick: bool = False) -> None:
    """The sections this run takes, each with its expected minutes on one H100, and the parts (with --quick: what
    it leaves out)."""
    minutes = QUICK_MINUTES if quick else EXPECTED_MINUTES
    say(f"plan on {device} ({MODE_TEXT[mode]}{', --quick' if quick else ''}):")
    for s in sections:
        say(
            f"  {s:15s} {minutes[s]:4.1f} min on one H100   {WHAT[s]}"
            + (f" ({QUICK_ITERATIONS} iterations, no eager seeds)" if quick and s == "checks" else "")
        )
    total = expected_minutes(sections, quick)
    say(f"  in all about {total:.1f} min on one H100")
    if quick:
        say(f"  left out by --quick: {'; '.join(QUICK_LEAVES_OUT)}; the parts below run them")
    if total > 9 or quick:
        say("  for reservations of under ten minutes, run the parts one after another (the report adds them up):")
        for part in PARTS:
            say(
                f"    python -m tests.benchmarks.gpu_check --sections {' '.join(part)}   # about "
                f"{expected_minutes(part):.1f} min"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/gpu_check", help="directory of gpu_check.md and gpu_check.json")
    parser.add_argument(
        "--sections",
        nargs="+",
        choices=ALL_SECTIONS,
        default=list(SECTIONS),
        help="the parts to run (default: all but speed-quick); see the parts above for reservations "
        "of under ten minutes",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"what runs first in a short reservation, about {expected_minutes(QUICK, True):.0f} min: "
        f"{', '.join(QUICK)} (checks at {QUICK_ITERATIONS} iterations); leaves out " + "; ".join(QUICK_LEAVES_OUT),
    )
    parser.add_argument(
        "--device",
        default=None,
        help="default: cuda if there is one (the GPU plan), else the CPU part; --device cpu: a dry run "
        "of the GPU plan on the CPU, every run eager",
    )
    parser.add_argument(
        "--algos",
        nargs="+",
        default=None,
        help="scripts of checks and parity: names in algos/ or paths to copies (default: all in algos/)",
    )
    parser.add_argument(
        "--iterations",
        type=int,
        default=None,
        help=f"iterations of each planned run (default: 20; {QUICK_ITERATIONS} with --quick)",
    )
    parser.add_argument("--num-envs", type=int, default=None, help="envs of the planned runs (default: each script's)")
    parser.add_argument(
        "--speed-iterations",
        type=int,
        default=3,
        help="timed log intervals of each speed run, after one of warm-up (compile and capture)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one process may take")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        print(MARKER + json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    import tensordict

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device.startswith("cuda")
    mode = "gpu" if gpu else "dry" if args.device else "cpu"
    algos = args.algos or sorted(bench.discover_algos(None)[0])
    if args.iterations is None:
        args.iterations = QUICK_ITERATIONS if args.quick else 20
    sections = list(QUICK) if args.quick else [s for s in ALL_SECTIONS if s in args.sections]
    print_plan(sections, mode, device, args.quick)
    machine = bench.machine_info(torch.device(device))
    commit = git_commit()
    out = Path(args.out)
    previous = json.loads((out / "gpu_check.json").read_text()) if (out / "gpu_check.json").exists() else {}
    same = (
        previous.get("commit") == commit
        and previous.get("machine_label") == bench.machine_label(machine)
        and previous.get("mode") == mode
    )
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine,
        "machine_label": bench.machine_label(machine),
        "tensordict": tensordict.__version__,
        "device": device,
        "mode": mode,
        "commit": commit,
        "mode_text": MODE_TEXT[mode],
        "skipped": [],
        "sections": dict(previous.get("sections", {})) if same else {},
        "commands": (previous.get("commands", []) if same else [])
        + [" ".join(["python -m tests.benchmarks.gpu_check", *(argv if argv is not None else sys.argv[1:])])],
    }
    # The correctness sections side by side on a GPU (their time is mostly compiling, on the CPU's
    # cores); the speed sections after them, each of their runs alone on the GPU.
    jobs = {
        "tests": lambda: section_tests(gpu, 3 * args.timeout),
        "checks": lambda: section_checks(mode, device, algos, args),
        "parity": lambda: section_parity(mode, device, algos, args),
        "torchrun": lambda: section_torchrun(device, 4096 if gpu else 64, args.timeout),
    }
    jobs = {name: job for name, job in jobs.items() if name in sections}

    def timed_job(name):
        t0 = time.time()
        try:
            result = jobs[name]()
        except Exception as e:  # noqa: BLE001 -- this section's failure; the others are still reported
            result = {
                "crashed": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} at "
                f"{where(set(), e.__traceback__)}"
            }
        return result, time.time() - t0

    with ThreadPoolExecutor(max_workers=max(len(jobs), 1) if gpu else 1) as pool:
        futures = {name: pool.submit(timed_job, name) for name in jobs}
        done = {name: f.result() for name, f in futures.items()}
    minutes = QUICK_MINUTES if args.quick else EXPECTED_MINUTES
    for name, (result, seconds) in done.items():
        bad = failures(name, result)
        skipped = name == "tests" and result.get("status") == "skipped"
        report["sections"][name] = {
            "status": "failed" if bad else "skipped" if skipped else "ok",
            "seconds": seconds,
            "failures": bad,
            "result": result,
            "expected_minutes": minutes[name],
            **({"quick": True} if args.quick else {}),
        }
    for name in SPEED_SECTIONS:
        if name not in sections:
            continue
        if gpu:
            say(f"{name}: one run at a time")
            t0 = time.time()
            result = section_speed(name, device, args.timeout, args.speed_iterations, machine.get("gpu"))
            bad = failures(name, result)
            report["sections"][name] = {
                "status": "failed" if bad else "ok",
                "seconds": time.time() - t0,
                "failures": bad,
                "result": result,
                "expected_minutes": minutes[name],
            }
        else:
            report["skipped"].append(f"{name} (needs CUDA; its commands: {'; '.join(speed_commands(name))})")
    if not gpu:
        if "tests" in sections:
            report["skipped"].append(f"the {len(report['sections']['tests']['result'].get('tests', []))} CUDA tests")
        if "checks" in sections:
            report["skipped"].append(
                "sync debug mode, graph breaks and recompiles of the compiled and captured runs "
                "(here: the runs eager, with the host-sync recorder and the Python-state check)"
            )
        if "torchrun" in sections:
            report["skipped"].append("NCCL and captured all-reduces (here: gloo, eager)")
    this_run = [b for name in sections if name in report["sections"] for b in report["sections"][name]["failures"]]
    all_bad = [name for name, s in report["sections"].items() if s["failures"]]
    missing = [s for s in SECTIONS if s not in report["sections"] and (gpu or not s.startswith("speed"))]
    if args.quick:
        report["skipped"].append("left out by --quick: " + "; ".join(QUICK_LEAVES_OUT))
    report["verdict"] = ("failed: " + ", ".join(all_bad) if all_bad else "all passed") + (
        f" (not yet run: {', '.join(missing)})" if missing else ""
    )
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(report)
    (out / "gpu_check.md").write_text(text + "\n")
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    print(text)
    print(f"report: {out / 'gpu_check.md'} and {out / 'gpu_check.json'}")
    return 1 if this_run else 0


if __name__ == "__main__":
    sys.exit(main())
