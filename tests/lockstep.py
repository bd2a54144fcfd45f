"""Compiled against eager in lockstep: each call of each function a script compiles runs once eagerly and once
compiled from the same state; what the two return and every tensor they leave behind are compared at float32
rounding, and then eager's state goes on for both.

Comparing two whole runs instead lets float32 reorderings compound through every update (a correct BatchNorm critic
drifts past any fixed bound in a few iterations); in lockstep each call starts from eager's state, so the bound is one
call's rounding, while what the comparison exists to catch (a dropped in-place write, a lost schedule step, a stale
buffer row, a NaN eager did not make) shows at the call that makes it, named by the tensor's path and the function.

`lockstep_compiled(monkeypatch)` installs the hook (common.capture.LOCKSTEP): every function that common.capture's
`compiled` wraps, in the script and in common/ (the evaluation's step), however the script wires it. What a call can
change is found by walking from the function (its closure cells and the module globals its code names, through the
project's functions, the instances of its classes, nn.Modules, optimizers, dicts, lists and TensorDicts) and its
arguments: tensors in place (a parameter's .grad included), dicts (an optimizer's lazily made state), and torch's
random generators.
"""

from __future__ import annotations

import functools
import types
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tests.replay import _class_file, _code_names, _project_file

# One call's float32 rounding at a tensor's scale: inductor fuses and reorders reductions (a batch-norm's or a layer
# norm's mean and variance, a matmul's sum), each a few ulps (float32's is 1.2e-7) of the values summed. An element's
# error is then a share of its tensor's scale, not of itself: a weight near 0 in a layer of weights near 0.5 moves as
# much as its neighbours. RTOL, about 840 ulps, is that share with room for an optimizer's step of it (Adam divides a
# gradient by its own magnitude). What the comparison exists to catch moves far more: a dropped in-place write leaves
# a statistic at its old value, a lost schedule update an lr off by a whole step, a stale buffer other transitions.
RTOL, ATOL = 1e-4, 1e-5
# The state a call leaves (parameters, optimizer moments, a schedule's lr, a statistic, storage) is held to a smaller
# absolute floor than ATOL, which is made for rounding that a whole run compounds (assert_runs_alike): a schedule's step
# is small in absolute terms (an lr of 3e-4 over 256 iterations moves 1.2e-6 a step) and ATOL would let a lost one
# through. What a call returns (the statistics it logs) keeps ATOL: a loss that cancels to about 0 (PPO's policy loss
# at the first minibatch, the mean of normalized advantages) has no scale of its own, only its terms' rounding.
STATE_ATOL = 1e-7


def assert_close_at_scale(y, x, what: str, rtol: float = RTOL, atol: float = ATOL) -> None:
    """y is x up to rtol of each element and of x's scale (its largest magnitude), and atol; NaN and infinities at the
    same entries."""
    x, y = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)
    assert x.shape == y.shape, f"{what}: shape {tuple(y.shape)} != {tuple(x.shape)}"
    assert torch.equal(x.isnan(), y.isnan()), (
        f"{what}: NaN at other entries ({int(y.isnan().sum())} compiled, {int(x.isnan().sum())} eager)"
    )
    finite = x.isfinite()
    assert torch.equal(x[~finite & ~x.isnan()], y[~finite & ~x.isnan()]), f"{what}: infinities differ"
    if not finite.any():
        return
    x, y = x[finite], y[finite]
    scale = x.abs().max()
    error, bound = (y - x).abs(), atol + rtol * (x.abs() + scale)
    worst = int((error - bound).argmax())
    assert (error <= bound).all(), (
        f"{what}: {int((error > bound).sum())} of {error.numel()} differ beyond rounding at its scale "
        f"{float(scale):.3g} (worst: {float(y[worst]):.8g} vs eager {float(x[worst]):.8g}, "
        f"bound {float(bound[worst]):.3g})"
    )


def assert_alike(y: torch.Tensor, x: torch.Tensor, what: str, atol: float = ATOL) -> None:
    """A compiled value y against eager's x: the same dtype and shape, floats at float32 rounding, the rest equal."""
    assert y.dtype == x.dtype, f"{what}: dtype {y.dtype} != eager's {x.dtype}"
    assert y.shape == x.shape, f"{what}: shape {tuple(y.shape)} != eager's {tuple(x.shape)}"
    if torch.equal(x, y) and not x.is_floating_point():
        return
    if x.is_floating_point() or x.is_complex():
        assert_close_at_scale(y.detach().cpu(), x.detach().cpu(), what, atol=atol)
    else:
        differ = int((x != y).sum())
        assert differ == 0, f"{what}: {differ} of {x.numel()} entries differ"


# ----------------------------------------------------------------------------------------------
# what a call can change: found by walking from the function and its arguments
# ----------------------------------------------------------------------------------------------
@dataclass
class Reach:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # path: tensor (each tensor once, its first path)
    leaves: dict[str, torch.Tensor] = field(default_factory=dict)  # path: a leaf that requires grad (its .grad slot)
    generators: dict[str, torch.Generator] = field(default_factory=dict)
    dicts: dict[str, dict] = field(default_factory=dict)  # path: a dict (its keys may change: an optimizer's state)
    optimizers: list = field(default_factory=list)


def reach(roots: dict[str, object], own_files: set[str], depth: int = 12) -> Reach:
    """Everything a call could change, breadth first from `roots` (so each tensor is named by its shortest path)."""
    from tensordict import TensorDictBase

    found, seen = Reach(), set()
    queue = deque((obj, path, 0) for path, obj in roots.items())
    ours = lambda filename: filename in own_files or _project_file(filename) or _test_file(filename)  # noqa: E731

    def key_name(k, i: int) -> str:
        # an optimizer's state is keyed by parameter: by its place (the same in two runs that made it alike)
        return f"param {i}" if isinstance(k, torch.Tensor) else repr(k)

    def unique(path: str, taken: dict) -> str:  # two closures' `obs`: the second is `obs#2`
        n, named = 1, path
        while named in taken:
            n, named = n + 1, f"{path}#{n + 1}"
        return named

    while queue:
        x, path, level = queue.popleft()
        if x is None or isinstance(x, (bool, int, float, str, bytes, type, types.ModuleType)) or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            path = unique(path, found.tensors)
            found.tensors[path] = x
            if x.is_leaf and x.requires_grad:
                found.leaves[path] = x
            continue
        if isinstance(x, torch.Generator):
            found.generators[unique(path, found.generators)] = x
            continue
        if level >= depth:
            continue
        step = level + 1
        if isinstance(x, TensorDictBase):
            queue.extend((v, f"{path}[{k!r}]", step) for k, v in x.items(include_nested=True, leaves_only=True))
        elif isinstance(x, dict):
            path = unique(path, found.dicts)
            found.dicts[path] = x
            queue.extend((v, f"{path}[{key_name(k, i)}]", step) for i, (k, v) in enumerate(x.items()))
        elif isinstance(x, (list, tuple)):
            queue.extend((v, f"{path}[{i}]", step) for i, v in enumerate(x))
        elif isinstance(x, types.FunctionType):
            if ours(x.__code__.co_filename):
                code = x.__code__
                for name, cell in zip(code.co_freevars, x.__closure__ or ()):
                    try:
                        queue.append((cell.cell_contents, name, step))
                    except ValueError:  # a cell not yet bound
                        pass
                queue.extend((x.__globals__[name], name, step) for name in _code_names(code) if name in x.__globals__)
        elif isinstance(x, types.MethodType):
            queue.extend(((x.__self__, path, step), (x.__func__, f"{path}.<method>", step)))
        elif isinstance(x, functools.partial):
            queue.extend(((x.func, f"{path}.func", step), (x.args, f"{path}.args", step)))
            queue.append((x.keywords, f"{path}.keywords", step))
        elif isinstance(x, torch.nn.Module):
            for group in ("_parameters", "_buffers", "_modules"):
                queue.extend((v, f"{path}.{k}", step) for k, v in vars(x)[group].items())
            queue.extend(
                (v, f"{path}.{k}", step)
                for k, v in vars(x).items()
                if k not in ("_parameters", "_buffers", "_modules") and "hook" not in k
            )
        elif isinstance(x, torch.optim.Optimizer):
            found.optimizers.append(x)
            queue.extend(((x.param_groups, f"{path}.param_groups", step), (x.state, f"{path}.state", step)))
        elif hasattr(x, "__dict__") and ours(_class_file(type(x))):
            queue.extend((v, f"{path}.{k}", step) for k, v in vars(x).items())
    return found


@functools.lru_cache(maxsize=None)
def _test_file(filename) -> bool:
    """A file of tests/ (its envs, as tests/pixel_env.py's Catch, keep state a call changes)."""
    return bool(filename) and Path(filename).resolve().is_relative_to(Path(__file__).resolve().parent)


@dataclass
class Snapshot:
    values: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor | None]
    rng: dict[str, torch.Tensor]
    items: dict[str, list]  # each dict's (key, value) pairs, the values themselves (not copies)


def snapshot(found: Reach) -> Snapshot:
    grads = {p: None if t.grad is None else t.grad.detach().clone() for p, t in found.leaves.items()}
    rng = {p: g.get_state() for p, g in found.generators.items()}
    rng["torch.default_generator"] = torch.get_rng_state()
    return Snapshot(
        {p: t.detach().clone() for p, t in found.tensors.items()},
        grads,
        rng,
        {p: list(d.items()) for p, d in found.dicts.items()},
    )


def _write(t: torch.Tensor, value: torch.Tensor) -> None:
    with torch.no_grad():
        if t.is_inference():
            with torch.inference_mode():
                t.copy_(value)
        else:
            t.copy_(value)


def restore(found: Reach, snap: Snapshot) -> None:
    """Put `snap` back into the objects of `found`: each dict's entries, then the tensors' values, the grads and the
    random generators."""
    for path, d in found.dicts.items():
        if path in snap.items and [(k, id(v)) for k, v in d.items()] != [(k, id(v)) for k, v in snap.items[path]]:
            d.clear()
            d.update(snap.items[path])
    for path, t in found.tensors.items():
        if path in snap.values:
            _write(t, snap.values[path])
    for path, leaf in found.leaves.items():
        grad = snap.grads.get(path)
        if grad is None:
            leaf.grad = None
        elif leaf.grad is None:
            leaf.grad = grad.clone()
        else:
            _write(leaf.grad, grad)
    for path, g in found.generators.items():
        if path in snap.rng:
            g.set_state(snap.rng[path])
    torch.set_rng_state(snap.rng["torch.default_generator"])


# ----------------------------------------------------------------------------------------------
# the hook
# ----------------------------------------------------------------------------------------------
def describe(fn) -> str:
    """A compiled function by name and place: a lambda by the functions it calls."""
    if isinstance(fn, functools.partial):
        return f"partial of {describe(fn.func)}"
    code = getattr(fn, "__code__", None)
    if code is None:
        return type(fn).__qualname__
    where = f"{Path(code.co_filename).name}:{code.co_firstlineno}"
    if code.co_name != "<lambda>":
        return f"{code.co_name} ({where})"
    calls = [n for n in (*code.co_names, *code.co_freevars) if isinstance(_lookup(fn, n), types.FunctionType)]
    return f"lambda calling {', '.join(calls[:2]) or '?'} ({where})"


def _lookup(fn, name: str):
    code = fn.__code__
    if name in code.co_freevars:
        try:
            return fn.__closure__[code.co_freevars.index(name)].cell_contents
        except ValueError:
            return None
    return fn.__globals__.get(name)


class Lockstep:
    """common.capture.LOCKSTEP: each compiled function's calls in lockstep; `calls` counts them by function."""

    def __init__(self):
        self.calls: dict[str, int] = {}
        self.phase: list[str] = []  # "eager" or "compiled" while a call in lockstep runs

    def __call__(self, run, fn, compiled_fn):
        label = describe(fn)
        own_files = {fn.__code__.co_filename} if isinstance(fn, types.FunctionType) else set()

        def call(*args, **kwargs):
            if torch.compiler.is_compiling():  # traced into from another compiled function: its body, inlined
                return fn(*args, **kwargs)
            if self.phase:  # called from another's call in lockstep: as that call's phase runs
                return (fn if self.phase[-1] == "eager" else compiled_fn)(*args, **kwargs)
            self.calls[label] = self.calls.get(label, 0) + 1
            return self.step(f"{label}, call {self.calls[label]}", fn, compiled_fn, args, kwargs, own_files)

        return call

    def step(self, label, fn, compiled_fn, args, kwargs, own_files):
        roots = {"<function>": fn, **arguments(fn, args, kwargs)}
        before = reach(roots, own_files)
        start = snapshot(before)
        self.phase.append("eager")
        try:
            out_eager = fn(*args, **kwargs)
        finally:
            self.phase.pop()
        outputs = reach({"<returned>": out_eager}, own_files)
        returned = {p: t.detach().clone() for p, t in outputs.tensors.items()}
        after_eager = reach(roots, own_files)
        eager = snapshot(after_eager)
        restore(after_eager, start)
        restore(before, start)
        self.phase.append("compiled")
        try:
            out_compiled = compiled_fn(*args, **kwargs)
        finally:
            self.phase.pop()
        after = reach(roots, own_files)
        try:
            compare(label, reach({"<returned>": out_compiled}, own_files), returned, after, eager, start)
        finally:
            restore(after, eager)  # eager's state goes on, in the objects the compiled graph holds
        return out_eager


def arguments(fn, args: tuple, kwargs: dict) -> dict:
    """A call's arguments by the names of `fn`'s parameters: a tensor passed in is named as the function names it."""
    import inspect

    try:
        return dict(inspect.signature(fn).bind(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        return {"<args>": args, "<kwargs>": kwargs}


def rounding_steps(after: Reach, eager: Snapshot, start: Snapshot) -> dict[str, torch.Tensor]:
    """{path: the largest difference a gradient that is 0 but for rounding lets an optimizer step make, per element}
    of the parameters and their optimizer's moments.

    A gradient the two calls agree on only at its tensor's scale, not at its own magnitude (a bias before a BatchNorm,
    whose exact gradient is 0), is rounding: Adam divides it by its own magnitude and steps by up to the learning rate
    either way. Where the two gradients of an element part by more than a thousandth of eager's, the element (and its
    moments) may end anywhere within the two steps taken from where it started; elsewhere the bound holds as for any
    tensor, so a dropped write or a lost step of a parameter with a gradient still fails."""
    paths = {id(t): p for p, t in after.tensors.items()}
    ambiguous = {}
    for path, leaf in after.leaves.items():
        grad = eager.grads.get(path)
        if grad is not None and leaf.grad is not None and leaf.grad.shape == grad.shape:
            ambiguous[path] = ((leaf.grad.detach() - grad).abs() > 1e-3 * grad.abs()).cpu()
    follows = {path: path for path in ambiguous}
    for optimizer in after.optimizers:
        for param, moments in optimizer.state.items():
            for moment in moments.values():
                if isinstance(moment, torch.Tensor) and moment.shape == param.shape and id(param) in paths:
                    follows[paths.get(id(moment), "")] = paths[id(param)]
    steps = {}
    for path, param_path in follows.items():
        if path not in after.tensors or param_path not in ambiguous or not ambiguous[param_path].any():
            continue
        x0 = start.values.get(path)
        x0 = torch.zeros_like(eager.values[path]) if x0 is None else x0
        taken = (eager.values[path] - x0).abs() + (after.tensors[path].detach().cpu() - x0).abs()
        steps[path] = torch.where(ambiguous[param_path], taken, torch.zeros_like(taken))
    return steps


def compare(label: str, outputs: Reach, returned: dict, after: Reach, eager: Snapshot, start: Snapshot) -> None:
    """What the compiled call returned and left against eager's, naming the function, the call and the tensor."""
    where = f"{label}: compiled differs from eager in"
    assert outputs.tensors.keys() == returned.keys(), (
        f"{where} what it returns: {sorted(outputs.tensors)} vs eager's {sorted(returned)}"
    )
    for path, t in outputs.tensors.items():
        assert_alike(t, returned[path], f"{where} {path}")
    made = set(after.tensors) - set(eager.values)
    lost = set(eager.values) - set(after.tensors)
    assert not made and not lost, (
        f"{where} the tensors it leaves: {sorted(made)} only compiled, {sorted(lost)} only eager"
    )
    for path, leaf in after.leaves.items():  # a gradient: made again at each call, so held as a result is (ATOL)
        grad = eager.grads.get(path)
        assert (leaf.grad is None) == (grad is None), f"{where} {path}.grad: set by one of the two only"
        if grad is not None:
            assert_alike(leaf.grad, grad, f"{where} {path}.grad")
    steps = rounding_steps(after, eager, start)
    for path, t in after.tensors.items():
        x = eager.values[path]
        if path in steps and t.dtype == x.dtype and t.shape == x.shape:  # what lies beyond a rounding gradient's steps
            off = t.detach().cpu() - x
            t = x + off.sign() * (off.abs() - steps[path]).clamp(min=0)
        assert_alike(t, x, f"{where} {path}", STATE_ATOL)
    states = {p: g.get_state() for p, g in after.generators.items()}
    states["torch.default_generator"] = torch.get_rng_state()
    for path, state in states.items():
        assert torch.equal(state, eager.rng[path]), f"{where} the random numbers it draws ({path})"


def lockstep_compiled(monkeypatch) -> Lockstep:
    """Every function common.capture.compiled wraps from now on, in lockstep (for the test's duration)."""
    import common.capture

    hook = Lockstep()
    monkeypatch.setattr(common.capture, "LOCKSTEP", hook)
    return hook


def inductor_settings(*, kernels: bool):
    """The inductor configuration a run compiled in lockstep compiles under: random numbers drawn as eager draws them
    (fallback_random), and with `kernels=False` no kernel of inductor's own: each op of its graph runs ATen's kernel
    (fallback_by_default, inductor's "lite" mode), while dynamo's tracing, AOT autograd, the decompositions and
    inductor's graph (its mutations written back, its buffers, its wrapper) stay as they are.

    On a CPU, inductor's kernels are C++ built by g++ (1 to 2 s each, most of a cold compiled test's time), and they are
    not the kernels a GPU run gets (Triton's). What a script's compiled run can get wrong, a write dropped from the
    graph, a lost schedule step, a graph break, state read stale, is in the graph, which the lite mode keeps: the 0-d
    float64 writes that torch 2.12 and 2.13 drop are dropped in either mode, and 2.14.1 and 2.15.0 drop none in
    either (`common.capture.lost_writes("cpu")` under each setting). So the contract's compiled runs, in every capture
    layout and torch lane, and the copies' compile in the lite mode; the tests about what inductor's kernels compute
    build them (the CrossQ copy's fused batch statistics at float32 rounding, tests/test_copies.py; ppo's CartPole run
    compiled at 4,096 envs, tests/test_ppo.py). A torch without the option compiles kernels everywhere."""
    import torch._inductor.config as config

    patch = {"fallback_random": True}
    if not kernels and hasattr(config, "fallback_by_default"):
        patch["fallback_by_default"] = True
    return config.patch(**patch)
