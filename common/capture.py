"""Speed switches and clocks: torch.compile (`compiled`), CUDA graphs (`captured`), each phase's seconds (`timed`)."""

from __future__ import annotations

import functools
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from common.record import Run


@contextmanager
def timed(run: Run, phase: str):
    """Seconds of a phase (charts/<phase>_seconds); on CUDA, events read at the next log, so timing makes no sync.
    Never inside a step's function."""
    if run.device.type != "cuda":
        t0 = time.time()
        yield
        _add_seconds(run, phase, time.time() - t0)
        return
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    yield
    end = torch.cuda.Event(enable_timing=True)
    end.record()
    run.pending_timings.append((phase, start, end))


def acting_autocast(device: torch.device, bf16: bool) -> torch.autocast:
    """An acting step's autocast: bf16 with --bf16, no cache of cast weights (a captured step casts at every replay)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16, cache_enabled=False)


def _add_seconds(run: Run, phase: str, seconds: float) -> None:
    run.seconds[phase] = run.seconds.get(phase, 0.0) + seconds
    acc = run.interval_seconds.setdefault(phase, [0.0, 0])
    acc[0] += seconds
    acc[1] += 1


def read_timings(run: Run) -> None:
    """The CUDA phase times recorded since the last read, added to the sums (waits for the last event)."""
    for phase, start, end in run.pending_timings:
        end.synchronize()
        _add_seconds(run, phase, start.elapsed_time(end) / 1e3)
    run.pending_timings.clear()


# The torch releases CI runs: the oldest supported (pyproject.toml's floor, torch>=2.12) and the newest release, on
# which the contract tests pass. pyproject.toml sets no upper cap, so no install downgrades a user's newer torch; a
# torch past the newest is probed like any other and gets one notice at start. A test keeps the three in agreement.
# 2.12 is the oldest: on 2.11 inductor's fallback_random does not draw torch.randint as eager does (pqn's compile
# parity fails).
TORCH_RANGE = ("2.12", "2.15")


def check_torch(version: str | None = None) -> None:
    """A notice from rank 0 where torch is outside TORCH_RANGE; the run goes on (GPU path checked on 2.11.0+cu130)."""
    import os
    import re

    version = str(version or torch.__version__)
    lo, hi = TORCH_RANGE
    major_minor = lambda v: tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", v).groups())  # noqa: E731
    release = major_minor(version)  # 2.12.0a0+git... (a build of 2.12) counts as 2.12
    if major_minor(lo) <= release <= major_minor(hi) or os.environ.get("RANK", "0") != "0":
        return
    if release < major_minor(lo):
        print(
            f"notice: torch {version} is older than the oldest release this project supports (torch>={lo}); "
            f'if something fails, pip install "torch>={lo}"',
            flush=True,
        )
    else:
        major, minor = major_minor(hi)
        print(
            f"notice: torch {version} is newer than the newest release this project's CI runs ({hi}): what the "
            f"compiler does is probed and the run goes on; if something fails, "
            f'pip install "torch>={lo},<{major}.{minor + 1}"',
            flush=True,
        )


def compiled(run: Run, fn: Callable) -> Callable:
    """`fn` under `torch.compile` with --compile, else `fn`.

    What a compiled function may change: tensors in place (parameters, optimizer state, normalizer statistics, a
    running statistic of a copy's own, storage), of any shape and dtype; and dicts of tensors it only reads from or
    adds into in place (a new key in a dict makes dynamo trace again: create the sums before, as common.stats.add_to
    does in a captured function's eager warm-up). Python values (counters, attributes) it changes are traced as
    constants: keep them outside.

    Some torch releases' inductor drops in-place writes to 0-d float64 CPU tensors (2.11, 2.13). `lost_writes`
    probes which writes the torch at hand loses; a graph making such a write (on any device: the guard errs toward
    eager) runs uncompiled, and the run says so.
    """
    if not run.args.compile:
        return fn
    lost = lost_writes(run.device)
    if not lost:
        out = torch.compile(fn)
    else:
        out = torch.compile(
            fn, backend=functools.partial(_inductor_keeping_writes, run, getattr(fn, "__name__", "fn"), lost)
        )
    return out if LOCKSTEP is None else LOCKSTEP(run, fn, out)


# A test's hook, None in every run: `LOCKSTEP(run, fn, compiled_fn)` is what `compiled` returns instead of the
# compiled function. The contract's compiled-vs-eager test (tests/lockstep.py) sets it to call each compiled function
# once eagerly and once compiled from the same state, compare what the two return and write, and carry eager's state
# on, so the comparison holds every call of every compiled function however a script wires them.
LOCKSTEP: Callable[[Run, Callable, Callable], Callable] | None = None


# The forms of an in-place write the probe makes, to a tensor of every kind below: each turns 1 into 1 * 2 + 3 = 5.
def _method(t, y):  # any Tensor method ending in `_`, here mul_ and add_
    t.mul_(2).add_(y)


def _copy(t, y):  # a method too, as copy_ writes a value computed apart
    t.copy_(t * 2 + y)


def _operator(t, y):  # an augmented assignment: operator.imul and operator.iadd in the graph
    t *= 2
    t += y


def _out(t, y):
    torch.add(torch.mul(t, 2, out=t), y, out=t)


def _setitem(t, y):
    t[...] = t * 2 + y


def _foreach(t, y):  # a multi-tensor op writing each tensor of its first list (inductor lowers them apart)
    torch._foreach_mul_([t], 2)
    torch._foreach_add_([t], [y])


PROBED_FORMS = {
    "method": _method,
    "copy": _copy,
    "operator": _operator,
    "out": _out,
    "setitem": _setitem,
    "foreach": _foreach,
}
PROBED_KINDS = {  # (dtype, shape); a kind is its (dtype, whether 0-d)
    "0-d float64": (torch.float64, ()),
    "0-d float32": (torch.float32, ()),
    "0-d int64": (torch.int64, ()),
    "float64 [1]": (torch.float64, (1,)),
}


def _probe(tensors: list[torch.Tensor], ys: list[torch.Tensor]) -> None:
    for i, form in enumerate(PROBED_FORMS.values()):
        for j in range(len(PROBED_KINDS)):
            form(tensors[i * len(PROBED_KINDS) + j], ys[j])


@functools.cache
def _lost_writes(device: str) -> frozenset[tuple[str, torch.dtype, bool]]:
    ys = [torch.full(shape, 3, dtype=dtype, device=device) for dtype, shape in PROBED_KINDS.values()]
    tensors = [
        torch.ones(shape, dtype=dtype, device=device) for _ in PROBED_FORMS for dtype, shape in PROBED_KINDS.values()
    ]
    torch.compile(_probe, backend="inductor", fullgraph=True)(tensors, ys)
    lost = set()
    for i, form in enumerate(PROBED_FORMS):
        for j, (dtype, shape) in enumerate(PROBED_KINDS.values()):
            if tensors[i * len(PROBED_KINDS) + j].flatten()[0].item() != 5:
                lost.add(("method" if form == "copy" else form, dtype, len(shape) == 0))
    return frozenset(lost)


def lost_writes(device: torch.device | str) -> frozenset[tuple[str, torch.dtype, bool]]:
    """The in-place writes inductor loses on `device`, as (form, dtype, whether 0-d); probed once per device."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _lost_writes(str(device))


def _inductor_keeping_writes(run: Run, name: str, lost, gm: torch.fx.GraphModule, example_inputs):
    """`compiled`'s backend where writes are lost: inductor, unless the graph makes such a write (then eager)."""
    dropped = sorted({tensor for tensor, form, kind in graph_writes(gm) if (form, *kind) in lost})
    if dropped:
        run.say(
            f"notice: {name} writes in place to {', '.join(dropped)}, a write that torch {torch.__version__} "
            f"drops from a compiled graph on {run.device}: that graph runs uncompiled"
        )
        return gm.forward
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs)


def graph_writes(gm: torch.fx.GraphModule) -> list[tuple[str, str, tuple[torch.dtype, bool]]]:
    """The in-place writes of a dynamo graph to its inputs, as (input name, form, (dtype, whether 0-d)). A write
    through another in-place op's result (`t.mul_(2).add_(y)`) is a write to the tensor that op wrote."""
    import operator

    inplace_operators = {
        operator.iadd,
        operator.isub,
        operator.imul,
        operator.itruediv,
        operator.ifloordiv,
        operator.imod,
        operator.ipow,
        operator.iand,
        operator.ior,
        operator.ixor,
        operator.ilshift,
        operator.irshift,
        operator.imatmul,
    }

    def form_and_targets(node):
        """The form of the in-place write `node` makes and the nodes it writes."""
        if node.op not in ("call_method", "call_function"):
            return None, []
        out = node.kwargs.get("out")
        if isinstance(out, torch.fx.Node):
            return "out", [out]
        if isinstance(out, (list, tuple)) and any(isinstance(n, torch.fx.Node) for n in out):
            return "out", [n for n in out if isinstance(n, torch.fx.Node)]
        if not node.args:
            return None, []
        target, first = node.target, node.args[0]
        op_name = target if isinstance(target, str) else getattr(target, "__name__", "")
        in_place = op_name.endswith("_") and not op_name.endswith("__")
        if isinstance(first, (list, tuple)):
            written = [n for n in first if isinstance(n, torch.fx.Node)]
            return ("foreach", written) if in_place and written else (None, [])
        if not isinstance(first, torch.fx.Node):
            return None, []
        if target in inplace_operators:
            return "operator", [first]
        if target is operator.setitem:
            return "setitem", [first]
        if in_place:
            return "method", [first]
        return None, []

    def written_input(node):  # follow the result of an in-place op on one tensor back to the tensor it wrote
        while True:
            _, targets = form_and_targets(node)
            if len(targets) != 1:
                return node
            node = targets[0]

    found = []
    for node in gm.graph.nodes:
        form, targets = form_and_targets(node)
        for target in targets:
            written = written_input(target)
            value = written.meta.get("example_value")
            if written.op in ("placeholder", "get_attr") and isinstance(value, torch.Tensor):
                source = written.meta.get("grapharg")
                name = source.source.name if source is not None else written.name
                found.append((name() if callable(name) else name, form, (value.dtype, value.dim() == 0)))
    return found


def captured(run: Run, name: str, fn: Callable, capture: bool = True) -> Callable:
    """`fn` captured in one CUDA graph with --cudagraphs (tensordict's CudaGraphModule: eager warm-up calls, one
    capture, then one replay per call); `capture=False` for a function that cannot be.

    What a captured `fn` may do: take and return tensors and TensorDicts (copied into and out of the graph's own
    buffers at every call) and change tensors that live as long as the graph (parameters, optimizer state,
    normalizers, an env's state, preallocated storage) in place; never read a tensor on the host, rebind an attribute
    to a new tensor, or keep Python state that must change between calls (a replay runs the kernels of the capture
    call, nothing else). The warm-up and capture calls do their work like any other, so no step is wasted. The wall
    time of the calls until `fn` runs at full speed, their work included, goes to run.compile_seconds[name].
    """
    args = run.args
    do_capture = bool(args.cudagraphs) and capture
    if not (args.compile or do_capture):
        return fn
    calls = 2  # a compiled function traces on its first call and may specialise once more on its second
    if do_capture:
        from tensordict.nn import CudaGraphModule

        warmup = 3 if args.compile else 2  # eager calls before the capture
        fn, calls = CudaGraphModule(fn, warmup=warmup), warmup  # the last of the warm-up calls captures
        run.graphs.append(fn)
    left = [calls]

    def timed_until_ready(*a, **k):
        if not left[0]:
            return fn(*a, **k)
        t0 = time.perf_counter()
        out = fn(*a, **k)
        if run.device.type == "cuda":
            torch.cuda.synchronize(run.device)
        run.compile_seconds[name] = run.compile_seconds.get(name, 0.0) + time.perf_counter() - t0
        left[0] -= 1
        if not left[0]:
            how = " and ".join(w for w, on in (("compiled", args.compile), ("captured", do_capture)) if on)
            run.say(f"{name}: {how} in {run.compile_seconds[name]:.1f} s (its first {calls} calls, work included)")
        return out

    timed_until_ready.ready = lambda: not left[0]  # compiled and captured: every later call is a replay
    return timed_until_ready


def release_graphs(run: Run) -> None:
    """Free the run's CUDA graphs before its process group goes: destroying an NCCL communicator that live graphs
    hold collectives of can hang the process at exit."""
    if run.graphs and run.device.type == "cuda":
        torch.cuda.synchronize(run.device)
        for module in run.graphs:
            graph = getattr(module, "graph", None)  # absent where the capture call never came
            if graph is not None:
                graph.reset()
    run.graphs.clear()


def peak_memory_mb(device: torch.device) -> float:
    """Peak GPU memory allocated by torch on CUDA; peak resident set size of the process on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def unwrapped_calls(run: Run, names: dict) -> list[str]:
    """After a script's compile-and-capture block, `unwrapped_calls(run, locals())`: the script's functions (those
    defined in the caller's file) that still hold a function the block wrapped in its unwrapped form, in a closure
    cell, a default argument or a functools.partial, each said as a warning and returned. The block rebinds each name
    in place (`act = captured(run, "acting", act)`), so a closure that reads the name sees the wrapped one through its
    cell; one that kept the function from before (an alias, a default, a partial) would run it eagerly, or inside a
    CUDA graph, uncompiled. What was wrapped is read from what compiled() and captured() returned among `names` (a
    dict or list of them counts); where they return the function itself (no --compile, no --cudagraphs) nothing is
    wrapped. A walk over a few closures: no tensor is touched."""
    import sys
    import types

    own_file = sys._getframe(1).f_code.co_filename

    def own(x) -> bool:
        return isinstance(x, types.FunctionType) and x.__code__.co_filename == own_file

    def key(x):  # a bound method is made anew at each attribute read: its function and its object name it
        return (x.__func__, id(x.__self__)) if isinstance(x, types.MethodType) else id(x)

    def function(x) -> bool:  # what may run a script's function: not a class, not a module (their calls are theirs)
        return callable(x) and not isinstance(x, (type, torch.nn.Module))

    def held(x) -> list:
        """What a function holds: its closure cells and defaults; a partial's function and arguments."""
        if isinstance(x, functools.partial):
            return [("a partial", x.func), *(("a partial", a) for a in (*x.args, *x.keywords.values()))]
        if not isinstance(x, types.FunctionType):
            return []
        cells = [
            (f"cell {n}", c.cell_contents) for n, c in zip(x.__code__.co_freevars, x.__closure__ or ()) if _bound(c)
        ]
        defaults = (*(x.__defaults__ or ()), *(x.__kwdefaults__ or {}).values())
        return cells + [("a default argument", d) for d in defaults]

    def originals(wrapper, depth: int = 0) -> list:
        """The script's functions a wrapper (compiled's, captured's, torch.compile's, a CUDA graph module) runs."""
        if own(wrapper) or (isinstance(wrapper, types.MethodType) and own(wrapper.__func__)):
            return [wrapper]
        if depth > 6:
            return []
        if (inner := getattr(wrapper, "_torchdynamo_orig_callable", None)) is not None:  # torch.compile's wrapper
            return originals(inner, depth + 1)
        if type(wrapper).__name__ == "CudaGraphModule":
            return originals(wrapper.module, depth + 1)
        return [o for _, x in held(wrapper) if function(x) for o in originals(x, depth + 1)]

    values = [
        v for x in names.values() for v in (x.values() if isinstance(x, dict) else x if isinstance(x, list) else [x])
    ]
    roots = [v for v in values if own(v)]
    wrapped = {}  # the key of a function a wrapper runs -> the name the wrapper is bound to
    for name, x in names.items():
        for value in x.values() if isinstance(x, dict) else x if isinstance(x, list) else [x]:
            # a wrapper: not the script's function itself, nor a method of its own class bound to an object (the
            # agent's `act` named before the block runs as it is: a name the block did not rebind wraps nothing)
            is_method = isinstance(value, types.MethodType) and own(value.__func__)
            if function(value) and not own(value) and not is_method and not isinstance(value, functools.partial):
                for original in originals(value):
                    wrapped[key(original)] = name
                    roots.append(original)
    found, seen = [], set()

    def walk(fn, holder: str, depth: int = 0) -> None:
        if id(fn) in seen or depth > 8:
            return
        seen.add(id(fn))
        holder = fn.__name__ if own(fn) else holder
        for what, x in held(fn):
            for item in x if isinstance(x, (list, tuple)) else (x,):
                if function(item) and key(item) in wrapped:
                    found.append(f"{holder} holds {wrapped[key(item)]} unwrapped ({what})")
                elif own(item) or isinstance(item, functools.partial):
                    walk(item, holder, depth + 1)

    for root in roots:
        walk(root.__func__ if isinstance(root, types.MethodType) else root, "")
    for line in dict.fromkeys(found):
        run.say(f"warning: {line}: it runs the function from before the compile-and-capture block, not what wraps it")
    return list(dict.fromkeys(found))


def _bound(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a cell not yet bound
        return False
    return True
