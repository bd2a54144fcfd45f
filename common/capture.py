"""Speed switches and clocks: torch.compile, CUDA graphs, and the seconds of each phase.

    fn = compiled(run, fn)                 # torch.compile with --compile, else fn
    fn = captured(run, "update", fn)       # one CUDA graph with --cudagraphs, else fn
    with timed(run, "rollout"): ...        # charts/rollout_seconds, without a host sync on CUDA

`release_graphs` frees the graphs before the process group goes (common.run.close).
"""

from __future__ import annotations

import functools
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from common.run import Run


@contextmanager
def timed(run: Run, phase: str):
    """Seconds of a phase, summed in run.seconds and logged as charts/<phase>_seconds (the mean
    over the iterations since the last log that ran the phase: td3/sac's updates start late). On
    CUDA they are the device's seconds between two events recorded around the phase, read at the
    next log: timing makes no sync, so the host queues the next phase while the device runs this
    one, as it would untimed. Elsewhere, wall seconds. Once or twice per iteration, never inside
    a step's function."""
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


def compiled(run: Run, fn: Callable) -> Callable:
    """`fn` under `torch.compile` with --compile, else `fn`: for the per-step functions (acting and
    the env step, a minibatch's update) whose loops `captured` then takes whole.

    What a compiled function may change: tensors in place (parameters, optimizer state, normalizer
    statistics, a running statistic of a copy's own, storage), of any shape and dtype; and dicts
    of tensors it only reads from or adds into in place (a new key in a dict makes dynamo trace
    again: create the sums before, as common.stats.add_to does in a captured function's eager
    warm-up). Python values (counters, attributes) it changes are traced as constants: keep them
    outside. One case torch.compile gets wrong is handled here: an in-place write to a 0-d float64
    tensor on the CPU (`ema.mul_(0.9).add_(x)`) is dropped from the compiled graph (torch 2.13;
    dynamo takes such tensors for Python floats); a graph with one runs uncompiled, whole and
    correct, and the run says which tensor it was (a [1]-shaped or float32 one compiles).
    """
    if not run.args.compile:
        return fn
    return torch.compile(fn, backend=functools.partial(_inductor_keeping_writes, run, getattr(fn, "__name__", "fn")))


def _inductor_keeping_writes(run: Run, name: str, gm: torch.fx.GraphModule, example_inputs):
    """torch.compile's backend for `compiled`: inductor, unless the graph writes in place to a 0-d
    float64 CPU tensor, which inductor's path would drop; such a graph runs as dynamo traced it."""
    dropped = zero_d_float64_writes(gm)
    if dropped:
        run.say(f"notice: {name} writes in place to 0-d float64 tensor(s) {', '.join(dropped)}, which torch.compile "
                f"drops on the CPU: that graph runs uncompiled")
        return gm.forward
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs)


def zero_d_float64_writes(gm: torch.fx.GraphModule) -> list[str]:
    """The inputs of a dynamo graph that it writes to in place and that are 0-d float64 CPU tensors."""
    import operator

    inplace_operators = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ipow}
    found = []
    for node in gm.graph.nodes:
        target = node.target
        op_name = target if isinstance(target, str) else getattr(target, "__name__", "")
        inplace = (node.op in ("call_method", "call_function") and op_name.endswith("_") and not op_name.endswith("__")) \
            or target in inplace_operators
        if not inplace or not node.args or not isinstance(node.args[0], torch.fx.Node):
            continue
        written = node.args[0]
        value = written.meta.get("example_value")
        if (written.op == "placeholder" and isinstance(value, torch.Tensor) and value.dim() == 0
                and value.dtype == torch.float64 and value.device.type == "cpu"):
            source = written.meta.get("grapharg")
            found.append(source.source.name if source is not None else written.name)
    return sorted(set(found))


def captured(run: Run, name: str, fn: Callable, capture: bool = True) -> Callable:
    """`fn` captured in one CUDA graph with --cudagraphs (tensordict's CudaGraphModule: eager warm-up
    calls, one capture, then one replay per call); `capture=False` for a function that cannot be.

    What a captured `fn` may do: take and return tensors and TensorDicts (copied into and out of
    the graph's own buffers at every call) and change tensors that live as long as the graph
    (parameters, optimizer state, normalizers, an env's state, preallocated storage) in place;
    never read a tensor on the host, rebind an attribute to a new tensor, or keep Python state
    that must change between calls (a replay runs the kernels of the capture call, nothing else).
    The warm-up and capture calls do their work like any other, so no step is wasted.

    With --compile or --cudagraphs, the wall time of the calls until `fn` runs at full speed
    (compiling what it calls, warm-up, capture, the work of those calls included) goes to
    run.compile_seconds[name], summary.json and one printed line.
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
    """Free the CUDA graphs of the run before its process group goes: destroying an NCCL
    communicator that live graphs still hold collectives of can hang the process at exit."""
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
