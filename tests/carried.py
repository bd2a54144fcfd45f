"""What an iteration carries to the next: the tensors a run writes in place in one iteration and reads in a later one.

A resumed run starts from what its checkpoint holds; a tensor that one iteration leaves for the next and that
`TrainingState` does not hold starts over at a resume, and the resumed run parts from the uninterrupted one. The exact
resume test sees that as some value drifting later on; `CarriedTensors` names the tensor and the line that writes it.

It records every aten op of a run on the CPU (a TorchDispatchMode, as tests/host_sync.py's recorder), by storage:
- an in-place write (any op whose schema writes an argument, `out=` included) in iteration i >= 1 is remembered with
  the line of the project's code (algos/, common/ or the script's own file) that made it;
- a read of that storage in a later iteration, before the storage is written again, is a carry;
- a tensor an op returns starts a new history (its storage may be a freed one's memory); so does a storage of
  another size at the same address (a tensor made where no op shows, `torch.tensor(...)`), and a storage that no name
  reaches at the end of the run is a temporary's, not carried state.
A value reset to a constant (`fill_`, `zero_`) is carried as a fresh start would make it: not counted. Storages are
named by the paths of `tests/lockstep.reach` from the functions the script compiles and captures.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.replay import _project_file

# Writes that do not read what they overwrite (the rest, `add_`, `mul_`, `lerp_`, read it as well)
OVERWRITES = {
    "copy_",
    "_foreach_copy_",
    "_foreach_zero_",
    "fill_",
    "zero_",
    "normal_",
    "uniform_",
    "random_",
    "bernoulli_",
    "exponential_",
    "index_put_",
    "index_copy_",
    "index_fill_",
    "masked_fill_",
    "masked_scatter_",
    "scatter_",
    "set_",
    "resize_",
}
CONSTANT = {"fill_", "zero_", "_foreach_zero_"}  # a reset: what a fresh start holds too


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _tensors(x) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


class CarriedTensors(TorchDispatchMode):
    """`carried`: {storage: (writing line, iteration written, iteration read)} over a run; `iteration()` says which
    iteration runs (0 before the loop)."""

    def __init__(self, iteration, own_files: set[str]):
        super().__init__()
        self.iteration = iteration
        self.own_files = own_files
        self.last_write: dict[int, tuple[int, str, str, int]] = {}  # storage: (iteration, line, op, its bytes)
        self.carried: dict[int, tuple[str, int, int]] = {}

    def _line(self) -> str:
        frame = sys._getframe(2)
        while frame is not None:
            name = frame.f_code.co_filename
            if (name in self.own_files or _project_file(name)) and not name.endswith("tests/carried.py"):
                return f"{Path(name).name}:{frame.f_lineno} ({frame.f_code.co_name})"
            frame = frame.f_back
        return "?"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        written = []
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                written += _tensors(args[i] if i < len(args) else kwargs.get(arg.name))
        only_written = {_storage(t) for t in written} if (name in OVERWRITES or "out" in kwargs) else set()
        now = self.iteration()
        for t in [] if func.is_view else _tensors((args, kwargs)):  # a view (t[i], t.detach()) reads no value
            ptr = _storage(t)
            if ptr in only_written or ptr not in self.last_write:
                continue
            when, line, op, size = self.last_write[ptr]
            reused = size != t.untyped_storage().nbytes()  # another tensor in the memory of a freed one
            if when < now and op not in CONSTANT and not reused and ptr not in self.carried:
                self.carried[ptr] = (line, when, now)
        inputs = {_storage(t) for t in _tensors((args, kwargs))}
        out = func(*args, **kwargs)
        for t in _tensors(out):  # a new tensor: a new history, whatever memory it reuses
            if _storage(t) not in inputs:
                self.last_write.pop(_storage(t), None)
        if now >= 1:
            for t in written:
                self.last_write[_storage(t)] = (now, self._line(), name, t.untyped_storage().nbytes())
        return out


def storage_names(found) -> dict[int, str]:
    """{storage: the shortest path of a tensor on it} of a tests.lockstep.Reach."""
    names: dict[int, str] = {}
    for path, t in sorted(found.tensors.items(), key=lambda item: len(item[0])):
        names.setdefault(_storage(t), path)
    return names


def carried_outside_the_checkpoint(module, run_training) -> list[str]:
    """The tensors a run of `module` (an imported script) carries from one iteration to the next that its
    TrainingState does not hold and it does not declare in `SCRATCH` (a dict of name: why, at module level), each as
    `name (written at file:line (function) in iteration i, read in iteration j)`. `run_training()` runs it eagerly."""
    from common.checkpoint import TrainingState
    from tests.lockstep import reach

    held, functions, runs = [], [], []

    class Recorded(TrainingState):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            held.append(self)

    real_captured, real_compiled = module.captured, module.compiled

    def captured(run, name, fn, capture=True):
        runs.append(run)
        functions.append(fn)
        return real_captured(run, name, fn, capture)

    def compiled(run, fn):
        functions.append(fn)
        return real_compiled(run, fn)

    own = {module.__file__}
    recorder = CarriedTensors(lambda: runs[0].iteration if runs else 0, own)
    patched = {"TrainingState": Recorded, "captured": captured, "compiled": compiled}
    saved = {name: getattr(module, name) for name in patched}
    try:
        for name, value in patched.items():
            setattr(module, name, value)
        with recorder:
            run_training()
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
    assert len(held) == 1 and runs, f"the script declared {len(held)} TrainingState(s) and captured {len(runs)}"
    in_state = storage_names(reach({"state": vars(held[0])}, own))
    names = storage_names(reach({**{f"<function {i}>": f for i, f in enumerate(functions)}, "run": runs[0]}, own))
    scratch = set(getattr(module, "SCRATCH", {}))
    missing = []
    for ptr, (line, written, read) in recorder.carried.items():
        if ptr not in names:  # a temporary's memory, read again through a tensor made where no op shows
            continue
        name = names[ptr]
        root = name.replace("[", ".").split(".")[0]
        if ptr not in in_state and root not in scratch:
            missing.append(f"{name} (written at {line} in iteration {written}, read in iteration {read})")
    return missing
