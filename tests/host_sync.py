"""A CPU stand-in for CUDA's sync debug mode: record what makes the host wait for tensor values."""

import sys
import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Tensor methods that hand a tensor's values to Python. On CUDA each one copies to the host and
# waits; on CPU some of them dispatch no aten op at all (.cpu() and .to("cpu") of a CPU tensor
# return it, .tolist(), .numpy() and repr() read its memory directly), so only their call shows.
TO_HOST = {
    "cpu",
    "tolist",
    "numpy",
    "item",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "__complex__",
    "__repr__",
    "__format__",
    "__array__",
}


class RecordHostSyncs(TorchDispatchMode):
    """Records every read of tensor values back to the host, in `syncs` (a name per read, in order).

    It catches, on any device:
    - the Tensor methods in TO_HOST, wherever they are called from: `.cpu()`, `.tolist()`,
      `.numpy()`, `.item()`, `bool(t)`, `int(t)`, `float(t)`, `operator.index(t)`, `complex(t)`,
      `repr(t)` and `print(t)`, `f"{t}"`, `numpy.asarray(t)`; and `.to(...)` to the host, recorded
      as "to(cpu)": `.to("cpu")` (the device as a string) on any device, and on a GPU any `.to`
      whose target is the CPU (on a CPU run `.to(torch.device("cpu"))` is `.to(device)` of the run's
      own device, a no-op that is not recorded). These are recorded by a TorchFunctionMode, by the
      method's name, once per call (the ops the method runs inside are not recorded again);
    - the aten ops that read values whoever calls them (a C++ path, torch's own Python):
      `_local_scalar_dense` (what `.item()` ends in), `is_nonzero`, `equal`, and the ops that size
      their output from the data: `nonzero`, `masked_select`, `unique`, and indexing with a boolean
      mask; and `normal` with a tensor std (Normal.sample), which checks std >= 0 with an `.item()`
      before its kernel runs (multinomial, Categorical.sample's, checks on the device on CUDA: not
      recorded). These are recorded by a TorchDispatchMode, by the op's name.

    It does not catch host reads that bypass both (a tensor's memory read through `data_ptr()` or
    the buffer protocol, `torch.save`), nor a synchronisation without a read
    (`torch.cuda.synchronize`, an event's wait). On CUDA each recorded read is a device-host
    synchronisation; recording them on CPU checks the no-sync rule on any machine.

    Subclasses decide what to keep by overriding `record(name)`.
    """

    SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "equal", "unique", "_unique2"}

    def __init__(self):
        super().__init__()
        self.syncs: list[str] = []
        self._in_method = False  # inside a recorded Tensor method: its own ops are not recorded again
        self._methods = _ToHostMethods(self)

    def __enter__(self):
        out = super().__enter__()
        self._methods.__enter__()
        return out

    def __exit__(self, *exc):
        self._methods.__exit__(*exc)
        return super().__exit__(*exc)

    def record(self, name: str) -> None:
        self.syncs.append(name)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        indices = args[1] if name in ("index", "index_put", "index_put_") and len(args) > 1 else ()
        bool_index = any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in (indices or ()))
        std_checked = name == "normal" and isinstance(
            args[1] if len(args) > 1 else (kwargs or {}).get("std"), torch.Tensor
        )  # std >= 0, read on the host
        if (name in self.SYNC_OPS or bool_index or std_checked) and not self._in_method:
            self.record(name)
        return func(*args, **(kwargs or {}))


def _to_cpu(args, kwargs) -> bool:
    """Whether a Tensor.to(...) call copies to the host: the CPU named as a string ("cpu"), or any
    CPU device for a tensor that is not on the CPU. A torch.device("cpu") on a CPU tensor is left
    out: that is `.to(device)` of a run on the CPU (torch's own clip_grad_norm_ calls it), a no-op
    that on CUDA names the GPU."""
    on_cpu = args[0].device.type == "cpu"
    for x in (*args[1:], kwargs.get("device")):
        if isinstance(x, str) and torch.device(x).type == "cpu":
            return True
        if isinstance(x, torch.device) and x.type == "cpu" and not on_cpu:
            return True
    return False


class _ToHostMethods(TorchFunctionMode):
    """The TorchFunctionMode half of RecordHostSyncs: the Tensor methods in TO_HOST, and .to(cpu)."""

    def __init__(self, recorder: RecordHostSyncs):
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "to" and args and isinstance(args[0], torch.Tensor) and _to_cpu(args, kwargs):
            name = "to(cpu)"
        elif name not in TO_HOST or not args or not isinstance(args[0], torch.Tensor):
            return func(*args, **kwargs)
        recorder = self.recorder
        if recorder._in_method:  # a recorded method calling another (repr's tolist): one read
            return func(*args, **kwargs)
        recorder.record(name)
        recorder._in_method = True
        try:
            return func(*args, **kwargs)
        finally:
            recorder._in_method = False


class SyncsOutsideTheOptimizer(RecordHostSyncs):
    """Leaves out the reads of the optimizers' own step counters: Adam keeps them on the host unless
    capturable=True, which the scripts set on CUDA (CPU does not support it), so those reads are
    host-only on CPU and absent on CUDA. Every other sync is recorded."""

    def record(self, name: str) -> None:
        if not any("torch/optim/" in f.filename for f in traceback.extract_stack()):
            super().record(name)


class RecordHostSyncsByOwner(RecordHostSyncs):
    """Also charges every recorded sync to the code that made it: walking the Python stack from the
    innermost frame outwards, the first frame whose file one of `owners` claims (name -> predicate on
    the file name) is the owner; "other" when none does. So syncs that a simulator makes inside its
    own step are told apart from those of the adapter around it (or of a hook it calls back)."""

    def __init__(self, owners: dict):
        super().__init__()
        self.owners = owners
        self.charged: list[tuple[str, str]] = []  # (op, owner), in order

    def record(self, name: str) -> None:
        super().record(name)
        self.charged.append((name, self._owner()))

    def _owner(self) -> str:
        frame = sys._getframe(1)
        while frame is not None:
            for name, claims in self.owners.items():
                if claims(frame.f_code.co_filename):
                    return name
            frame = frame.f_back
        return "other"

    def of(self, owner: str) -> list[str]:
        return [op for op, who in self.charged if who == owner]
