"""A CPU check of what a CUDA graph needs: record what each captured function would put in its graph.

`record_captured(monkeypatch, script)` makes `captured()` (in the script and in common.evaluation) record
the ReplaySignature and the host syncs of the first calls of every function it would capture;
`assert_replays_alike` then checks that two calls after the warm-up recorded the same signature,
and `assert_no_host_sync` that no call after the first read a value back to the host (on CUDA a
sync inside a capture stops it: "operation not permitted when stream is capturing").
"""

from __future__ import annotations

import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.host_sync import SyncsOutsideTheOptimizer


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


def _tensor_leaves(tree) -> list[torch.Tensor]:
    from tensordict import TensorDictBase

    leaves = []
    for x in torch.utils._pytree.tree_leaves(tree):
        leaves += list(x.values(include_nested=True, leaves_only=True)) if isinstance(x, TensorDictBase) else [x]
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def record_captured(monkeypatch, script, before_call=None) -> dict[str, list]:
    """{function name: [(ops, external storages, host syncs) of its first 4 calls]} of every function
    `script` (an imported algos/ module) and common.evaluation capture; `before_call(name, fn)` runs before
    every call."""
    import common.evaluation

    signatures: dict[str, list] = {}

    def recording(run, name, fn, capture=True):
        if not capture:  # the script keeps it out of the graph (an adapter's env step, a host-side loop)
            return fn

        def call(*args, **kwargs):
            calls = signatures.setdefault(name, [])
            if before_call is not None:
                before_call(name, fn)
            if len(calls) >= 4:
                return fn(*args, **kwargs)
            with ReplaySignature((args, kwargs)) as sig, SyncsOutsideTheOptimizer() as syncs:
                out = fn(*args, **kwargs)
            calls.append((sig.ops, sig.external, syncs.syncs))
            return out
        return call

    monkeypatch.setattr(script, "captured", recording)
    monkeypatch.setattr(common.evaluation, "captured", recording)
    return signatures


def assert_replays_alike(name: str, calls: list) -> None:
    """The second and third calls (after the first allocated what lives on) ran the same ops on the same tensors."""
    assert len(calls) >= 3, (name, len(calls))
    (ops_a, ext_a, _), (ops_b, ext_b, _) = calls[1], calls[2]
    first = next((i for i, (a, b) in enumerate(zip(ops_a, ops_b)) if a != b), None)
    assert ops_a == ops_b, f"{name}: the calls run other ops (from op {first}: {ops_a[first:first + 3]} vs {ops_b[first:first + 3]})"
    assert ext_a == ext_b, f"{name}: the calls read other tensors: a captured graph would read stale state"


def assert_no_host_sync(name: str, calls: list) -> None:
    """No call after the first (which may allocate, as a warm-up call does) read a tensor on the host."""
    assert len(calls) >= 2, (name, len(calls))
    for i, (_, _, syncs) in enumerate(calls[1:], start=2):
        assert not syncs, f"{name}: call {i} reads tensors on the host ({', '.join(syncs)}): it cannot be captured"
