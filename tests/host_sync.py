"""A CPU stand-in for CUDA's sync debug mode: record the ops that make the host wait for values."""

import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class RecordHostSyncs(TorchDispatchMode):
    """Records, at the dispatcher level, every op that reads tensor values back to the host.

    `.item()`, `.tolist()`, `bool(t)`, `int(t)` end in `_local_scalar_dense`; `nonzero`, masked
    selects and boolean-mask indexing size their output from the data. On CUDA each one is a
    device-host synchronisation; recording them on CPU checks the no-sync rule on any machine.
    """

    SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "equal", "unique", "_unique2"}

    def __init__(self):
        super().__init__()
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        indices = args[1] if name in ("index", "index_put", "index_put_") and len(args) > 1 else ()
        bool_index = any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in (indices or ()))
        if name in self.SYNC_OPS or bool_index:
            self.syncs.append(name)
        return func(*args, **(kwargs or {}))


class SyncsOutsideTheOptimizer(RecordHostSyncs):
    """Leaves out the reads of the optimizers' own step counters: Adam keeps them on the host unless
    capturable=True, which the scripts set on CUDA (CPU does not support it), so those reads are
    host-only on CPU and absent on CUDA. Every other sync is recorded."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = len(self.syncs)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if len(self.syncs) > before and any("torch/optim/" in f.filename for f in traceback.extract_stack()):
            self.syncs.pop()
        return out


class RecordHostSyncsByOwner(RecordHostSyncs):
    """Also charges every recorded sync to the code that made it: walking the Python stack from the
    innermost frame outwards, the first frame whose file one of `owners` claims (name -> predicate on
    the file name) is the owner; "other" when none does. So syncs that a simulator makes inside its
    own step are told apart from those of the adapter around it (or of a hook it calls back)."""

    def __init__(self, owners: dict):
        super().__init__()
        self.owners = owners
        self.charged: list[tuple[str, str]] = []  # (op, owner), in order

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = len(self.syncs)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if len(self.syncs) > before:
            self.charged.append((self.syncs[-1], self._owner()))
        return out

    def _owner(self) -> str:
        import sys

        frame = sys._getframe(2)
        while frame is not None:
            for name, claims in self.owners.items():
                if claims(frame.f_code.co_filename):
                    return name
            frame = frame.f_back
        return "other"

    def of(self, owner: str) -> list[str]:
        return [op for op, who in self.charged if who == owner]
