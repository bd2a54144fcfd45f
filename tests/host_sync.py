"""A CPU stand-in for CUDA's sync debug mode: record the ops that make the host wait for values."""

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
