"""A CPU check of what a CUDA graph needs: record what each captured function would put in its graph.

`record_captured(monkeypatch, script)` makes `captured()` (in the script and in common.evaluation) record the
ReplaySignature, the host syncs and the changes of Python state of the first calls of every function it would
capture; `assert_replays_alike` then checks that two calls after the warm-up
recorded the same signature, `assert_no_host_sync` that no call after the first read a value back
to the host (on CUDA a sync inside a capture stops it: "operation not permitted when stream is
capturing"), and `assert_keeps_python_state` that no call after the first changed Python state
(a replay runs no Python: a counter kept in a closure would stop counting after the capture), and
`assert_runs_compiled` that no captured call ran the body of a function the script compiled outside its compiled
form (a caller that kept the function from before the wrapping: a default argument, a functools.partial).
The same calls are watched at torch's Python surface for DEVICE_KERNELS, ops that go to another fused kernel on each
device (`Recorded.device_kernels`, `assert_no_device_kernels`).
"""

from __future__ import annotations

import functools
import re
import sys
import types
from pathlib import Path

import tensordict
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from tests.host_sync import SyncsOutsideTheOptimizer

ROOT = Path(__file__).resolve().parents[1]


class ReplaySignature(TorchDispatchMode):
    """What a CUDA graph of a call would hold, recorded on any device: the ops in order with their
    non-tensor arguments, and the storages the call reads that it did not allocate itself (nor got
    as arguments, which a captured function copies into its own buffers).

    A graph replays exactly these kernels on exactly these addresses. So a function is safe to
    capture only if two calls after warm-up record the same signature: a Python branch or counter
    that changes between calls changes the ops or their arguments, and state rebound to a new
    tensor (instead of written in place) changes the storages read. The non-tensor arguments of
    the optimizer's own ops are left out: Adam keeps its step count on the host unless
    `capturable=True`, which the scripts set on CUDA (where those arguments are device tensors)."""

    def __init__(self, args):
        super().__init__()
        self.given = {t.untyped_storage().data_ptr() for t in _tensor_leaves(args)}
        self.made: set[int] = set()
        self.ops: list[tuple] = []
        self.external: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        flat = torch.utils._pytree.tree_leaves((args, kwargs or {}))
        for t in flat:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self.made | self.given:
                self.external.add(t.untyped_storage().data_ptr())
        frame, in_optimizer = sys._getframe(), False
        while frame is not None and not in_optimizer:
            in_optimizer, frame = "torch/optim/" in frame.f_code.co_filename, frame.f_back
        scalars = () if in_optimizer else tuple(repr(x) for x in flat if not isinstance(x, torch.Tensor))
        self.ops.append((func.overloadpacket.__name__, scalars))
        out = func(*args, **(kwargs or {}))
        self.made |= {t.untyped_storage().data_ptr() for t in _tensor_leaves(out)}
        return out


# The ops that go to another fused kernel on each device: the fused RNNs and their cells (torch.lstm, gru, rnn_tanh,
# rnn_relu, lstm_cell, ...; nn.LSTM / nn.GRU call them), the CUDA cells they decompose to (_thnn_fused_*), and anything
# named for cuDNN, oneDNN (mkldnn) or MIOpen. Such an op compiles and passes every parity test on a CPU and can fail
# on a GPU, where the same call goes to another kernel: ppo_lstm's acting step through `torch.lstm` did (dynamo's
# fake-tensor trace of it stopped on CUDA, torch 2.11, while the CPU suite passed). That failure cannot be reproduced on
# a CPU (a fake CUDA `torch.lstm` on a CPU build gives the right shapes), so the captured functions' calls are checked
# for the ops by name instead (tests/test_device_kernels.py).
DEVICE_KERNELS = re.compile(r"^_?(quantized_)?(lstm|gru|rnn_tanh|rnn_relu)(_cell)?$|^_thnn_fused_|cudnn|mkldnn|miopen")


# the frames a DEVICE_KERNELS call is not charged to: torch's, tensordict's (their folders) and this file's
_LIBRARIES = tuple(str(Path(m.__file__).parent) + "/" for m in (torch, tensordict)) + (__file__,)


class DeviceKernelCalls(TorchFunctionMode):
    """The calls of DEVICE_KERNELS ops a call makes, each as `op (file:line)` of the first caller outside torch: seen at
    torch's Python surface, where dynamo puts them in a compiled function's graph (nn.LSTM's forward calls
    torch._VF.lstm there; torch.lstm, torch.lstm_cell and the vendors' functions are such calls themselves)."""

    def __init__(self):
        super().__init__()
        self.found: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if DEVICE_KERNELS.search(name):
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith(_LIBRARIES):
                frame = frame.f_back
            where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}" if frame is not None else "?"
            self.found.add(f"{name} ({where})")
        return func(*args, **(kwargs or {}))


def _tensor_leaves(tree) -> list[torch.Tensor]:
    from tensordict import TensorDictBase

    leaves = []
    for x in torch.utils._pytree.tree_leaves(tree):
        leaves += list(x.values(include_nested=True, leaves_only=True)) if isinstance(x, TensorDictBase) else [x]
    return [t for t in leaves if isinstance(t, torch.Tensor)]


# ----------------------------------------------------------------------------------------------
# Python state: what a replay would not change
# ----------------------------------------------------------------------------------------------
SCALARS = (type(None), bool, int, float, complex, str, bytes, torch.device, torch.dtype, torch.Size)


def python_state(fn, run=None, depth: int = 8) -> dict[str, str]:
    """{path: value} of the Python state a call of `fn` can change and a CUDA graph's replay would
    not: Python values (numbers, strings, the keys and lengths of containers) and which object
    every name holds (a tensor by its identity: rebinding a name to a new tensor shows).

    Walked from `fn` and `run` (the run's attributes), `depth` levels deep, through what the
    project's own code holds (algos/, common/ and the file of `fn`, so a copy of a script anywhere):
    its functions' closure cells (`<name>`; through torch.compile's wrapper to the function it
    compiles) and the module attributes their code names (`module.name`; of a project module, also
    those used as `module.attr`); bound methods and functools.partial; dicts, lists, tuples and
    sets; TensorDicts by their leaves; and the attributes of instances of the project's classes,
    nn.Modules and optimizers. Anything else (torch's and other packages' functions, classes,
    writers, spaces) counts by its identity only, and tensor values are not Python state
    (ReplaySignature checks the tensors a call reads)."""
    from tensordict import TensorDictBase

    root = getattr(fn, "_torchdynamo_orig_callable", fn)
    own_files = {root.__code__.co_filename} if isinstance(root, types.FunctionType) else set()
    ours = lambda filename: filename in own_files or _project_file(filename)  # noqa: E731
    state: dict[str, str] = {}
    seen: set[int] = set()

    def walk(x, path: str, level: int, names=()) -> None:
        if isinstance(x, SCALARS):
            state[path] = repr(x)
            return
        if isinstance(x, torch.Tensor):
            state[path] = f"tensor@{id(x):x}"
            return
        state[path] = f"{type(x).__qualname__}@{id(x):x}"
        if id(x) in seen or level >= depth:
            return
        seen.add(id(x))
        if isinstance(x, TensorDictBase):
            for key, leaf in x.items(include_nested=True, leaves_only=True):
                walk(leaf, f"{path}[{key!r}]", level + 1)
        elif isinstance(x, dict):
            state[path] += f" keys {[_key(k) for k in x]}"
            for k, v in x.items():
                walk(v, f"{path}[{_key(k)}]", level + 1)
        elif isinstance(x, (list, tuple)):
            state[path] += f" len {len(x)}"
            for i, v in enumerate(x):
                walk(v, f"{path}[{i}]", level + 1)
        elif isinstance(x, (set, frozenset)):
            state[path] += f" {sorted(_key(v) for v in x)}"
        elif isinstance(x, types.FunctionType):
            if ours(x.__code__.co_filename):
                walk_function(x, path, level)
            elif hasattr(x, "_torchdynamo_orig_callable"):  # torch.compile's wrapper: the function it compiles
                walk(x._torchdynamo_orig_callable, f"{path}.<compiled>", level + 1)
        elif isinstance(x, types.MethodType):
            walk(x.__self__, f"{path}.__self__", level + 1)
            walk(x.__func__, f"{path}.__func__", level + 1)
        elif isinstance(x, functools.partial):
            walk(x.func, f"{path}.func", level + 1)
            walk(x.args, f"{path}.args", level + 1)
            walk(x.keywords, f"{path}.keywords", level + 1)
        elif isinstance(x, types.ModuleType):
            if ours(getattr(x, "__file__", None)):  # the attributes the code uses as module.attr
                for name in names:
                    if name in vars(x):
                        walk(vars(x)[name], f"{x.__name__}.{name}", level + 1)
        elif (
            not isinstance(x, type)
            and hasattr(x, "__dict__")
            and (isinstance(x, (torch.nn.Module, torch.optim.Optimizer)) or ours(_class_file(type(x))))
        ):
            for k, v in vars(x).items():
                walk(v, f"{path}.{k}", level + 1)

    def walk_function(f, path: str, level: int) -> None:
        code = f.__code__
        for name, cell in zip(code.co_freevars, f.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:  # a cell not yet bound
                value = "<unbound>"
            walk(value, f"{path}.<{name}>", level + 1)
        names = _code_names(code)
        module = f.__globals__.get("__name__", "?")
        for name in names:
            if name in f.__globals__:
                walk(f.__globals__[name], f"{module}.{name}", level + 1, names)

    walk(fn, getattr(fn, "__name__", "fn"), 0)
    if run is not None:
        walk(run, "run", 0)
    return state


def _key(k) -> str:
    return repr(k) if isinstance(k, SCALARS) else f"<{type(k).__name__}@{id(k):x}>"


@functools.lru_cache(maxsize=None)
def _project_file(filename) -> bool:
    """A file of the project's algos/ or common/."""
    if not filename:
        return False
    path = Path(filename).resolve()
    return any(path.is_relative_to(ROOT / part) for part in ("algos", "common"))


def _class_file(cls) -> str | None:
    module = sys.modules.get(cls.__module__)
    return getattr(module, "__file__", None)


@functools.lru_cache(maxsize=None)
def _code_names(code: types.CodeType) -> tuple[str, ...]:
    """The global and attribute names a code object and the functions defined in it use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(_code_names(const))
    return tuple(sorted(names))


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The paths whose value a call changed, as `path: before -> after`."""
    paths = sorted(set(before) | set(after))
    return [
        f"{p}: {before.get(p, '(absent)')} -> {after.get(p, '(absent)')}"
        for p in paths
        if before.get(p) != after.get(p)
    ]


class Recorded(dict):
    """{captured function's name: its calls}, `eager`: {captured function's name: the names of the compiled
    functions whose bodies ran outside their compiled form during its calls}, and `device_kernels`: {captured
    function's name: the DEVICE_KERNELS calls its recorded calls made}."""

    def __init__(self):
        super().__init__()
        self.eager: dict[str, set[str]] = {}
        self.device_kernels: dict[str, set[str]] = {}


def _code_of(fn) -> types.CodeType | None:
    """The code a call of `fn` runs: a function's, a bound method's, a functools.partial's function's."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    fn = getattr(fn, "__func__", fn)
    return getattr(fn, "__code__", None)


def record_captured(monkeypatch, script, before_call=None) -> Recorded:
    """{function name: [(ops, external storages, host syncs, Python state changes) of its first 4 calls]}
    of every function `script` (an imported algos/ module) and common.evaluation capture;
    `before_call(name, fn)` runs before every call. The script's compiled() is watched too: `.eager` names the
    compiled functions whose bodies a captured call ran other than through what compiled() returned."""
    import common.evaluation

    signatures = Recorded()
    compiled_code: dict[types.CodeType, str] = {}  # the code of every function the script compiled, by name
    in_compiled = [0]  # calls of what compiled() returned now running
    real_compiled = script.compiled

    def watched_compiled(run, fn):
        wrapped = real_compiled(run, fn)
        if (code := _code_of(fn)) is not None:
            compiled_code[code] = f"{code.co_name} (line {code.co_firstlineno})"

        def call(*args, **kwargs):
            in_compiled[0] += 1
            try:
                return wrapped(*args, **kwargs)
            finally:
                in_compiled[0] -= 1

        return call

    def eager_bodies(name):
        """A profile hook that notes a compiled function's body entered while no compiled form runs."""

        def hook(frame, event, arg):
            if event == "call" and not in_compiled[0] and frame.f_code in compiled_code:
                signatures.eager.setdefault(name, set()).add(compiled_code[frame.f_code])

        return hook

    def recording(run, name, fn, capture=True):
        if not capture:  # the script keeps it out of the graph (an adapter's env step, a host-side loop)
            return fn

        def call(*args, **kwargs):
            calls = signatures.setdefault(name, [])
            if before_call is not None:
                before_call(name, fn)
            if len(calls) >= 4:
                return fn(*args, **kwargs)
            before, profile = python_state(fn, run), sys.getprofile()
            sys.setprofile(eager_bodies(name))
            try:
                with ReplaySignature((args, kwargs)) as sig, SyncsOutsideTheOptimizer() as syncs:
                    with DeviceKernelCalls() as kernels:
                        out = fn(*args, **kwargs)
            finally:
                sys.setprofile(profile)
            if kernels.found:
                signatures.device_kernels.setdefault(name, set()).update(kernels.found)
            calls.append((sig.ops, sig.external, syncs.syncs, changes(before, python_state(fn, run))))
            return out

        return call

    # where the capture happens: the script's own compile-and-capture block, and the evaluation's chunk of steps
    # (4 steps here, not 64: the chunk repeats one step, so its replay holds or fails at any length, and recording four
    # chunks of 64 steps op by op was most of a replay check's time)
    monkeypatch.setattr(common.evaluation, "EVAL_CHUNK", 4)
    monkeypatch.setattr(script, "captured", recording)
    monkeypatch.setattr(script, "compiled", watched_compiled)
    monkeypatch.setattr(common.evaluation, "captured", recording)
    return signatures


def assert_no_device_kernels(signatures: Recorded) -> None:
    """No captured function called an op of DEVICE_KERNELS: on CUDA it would go to another kernel than the one the CPU
    suite ran (the call is what dynamo traces into the function's graph under --compile)."""
    assert not signatures.device_kernels, "device-dispatched kernels in captured functions: " + "; ".join(
        f"{name}: {', '.join(sorted(calls))}" for name, calls in sorted(signatures.device_kernels.items())
    )


def assert_runs_compiled(signatures: Recorded) -> None:
    """No captured function ran a compiled function's body uncompiled: under --compile and --cudagraphs, its graph
    would hold the eager kernels (or, captured apart, stale ones)."""
    assert not signatures.eager, "captured functions ran compiled functions' bodies uncompiled: " + "; ".join(
        f"{name}: {', '.join(sorted(bodies))}" for name, bodies in signatures.eager.items()
    )


def assert_replays_alike(name: str, calls: list) -> None:
    """The second and third calls (after the first allocated what lives on) ran the same ops on the same tensors."""
    assert len(calls) >= 3, (name, len(calls))
    (ops_a, ext_a, *_), (ops_b, ext_b, *_) = calls[1], calls[2]
    first = next((i for i, (a, b) in enumerate(zip(ops_a, ops_b)) if a != b), None)
    assert ops_a == ops_b, (
        f"{name}: the calls run other ops (from op {first}: {ops_a[first : first + 3]} vs {ops_b[first : first + 3]})"
    )
    assert ext_a == ext_b, f"{name}: the calls read other tensors: a captured graph would read stale state"


def assert_no_host_sync(name: str, calls: list) -> None:
    """No call after the first (which may allocate, as a warm-up call does) read a tensor on the host."""
    assert len(calls) >= 2, (name, len(calls))
    for i, (_, _, syncs, _) in enumerate(calls[1:], start=2):
        assert not syncs, f"{name}: call {i} reads tensors on the host ({', '.join(syncs)}): it cannot be captured"


def assert_keeps_python_state(name: str, calls: list) -> None:
    """No call after the first (which may create what lives on: sums, storage) changed Python state:
    after the capture, calls are replays that run no Python, so such a change would stop happening."""
    assert len(calls) >= 2, (name, len(calls))
    for i, (*_, changed) in enumerate(calls[1:], start=2):
        assert not changed, f"{name}: call {i} changes Python state, which a graph replay would not: " + "; ".join(
            changed[:5]
        )
