"""The host side of the adapters to CPU simulators (gym:, envpool:): a step's results cross to the
device in one copy, and the actions come back in one.

    staging = StepStaging({"obs": ((n, 4, 84, 84), torch.uint8), "reward": ((n,), torch.float32)}, device)
    host = staging.host()          # numpy views of one byte buffer: fill them with the step's results
    dev = staging.to_device()      # the same fields as tensors on the device, after one copy
    action = staging.actions_to_host(action)   # a device tensor of actions -> numpy, in one copy

Every field is a typed view of one byte buffer (each field's start aligned to 8 bytes), so the flags
cross as bytes and are viewed as bool on the device: no conversion kernel after the copy. On CUDA
the buffer is pinned and reused every step, and the copy is non-blocking; `host()` waits only for
the previous step's copy to have read it. On the CPU the results are the buffer itself, a fresh
one per step, since the returned tensors are views of it and a caller may keep them.
"""

from __future__ import annotations

import math

import numpy as np
import torch

_ALIGN = 8  # bytes: every field starts at a multiple of the largest item size (int64, float64)


class StepStaging:
    """One byte buffer of named fields {name: (shape, torch dtype)}, filled on the host, copied to `device` whole."""

    def __init__(self, fields: dict[str, tuple[tuple[int, ...], torch.dtype]], device: str | torch.device):
        self.device = torch.device(device)
        self._layout, offset = {}, 0
        for name, (shape, dtype) in fields.items():
            nbytes = math.prod(shape) * dtype.itemsize
            self._layout[name] = (offset, nbytes, tuple(shape), dtype)
            offset += -(-nbytes // _ALIGN) * _ALIGN
        self.nbytes = max(offset, _ALIGN)
        self._copies = self.device.type != "cpu"
        self._cuda = self.device.type == "cuda"
        self._current: torch.Tensor | None = None
        self._action_host: torch.Tensor | None = None  # CUDA: the pinned buffer the actions are copied into
        if self._copies:  # one buffer for the run: pinned on CUDA, so that the copy can be non-blocking
            self._buffer = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=self._cuda)
            self._buffer_views = self._views(self._buffer, numpy=True)
            self._copy_done = torch.cuda.Event() if self._cuda else None
            self._copy_pending = False

    def _views(self, raw: torch.Tensor, numpy: bool) -> dict:
        out = {}
        for name, (offset, nbytes, shape, dtype) in self._layout.items():
            part = raw[offset : offset + nbytes]
            if numpy:
                out[name] = part.numpy().view(torch.empty(0, dtype=dtype).numpy().dtype).reshape(shape)
            else:
                out[name] = part.view(dtype).view(shape)
        return out

    def host(self) -> dict[str, np.ndarray]:
        """Numpy views of the host buffer that this step's results are written into."""
        if not self._copies:
            self._current = torch.empty(self.nbytes, dtype=torch.uint8)  # fresh: the returned tensors are views of it
            return self._views(self._current, numpy=True)
        if self._copy_pending:  # the previous non-blocking copy may still read the pinned buffer
            self._copy_done.synchronize()
            self._copy_pending = False
        self._current = self._buffer
        return self._buffer_views

    def to_device(self) -> dict[str, torch.Tensor]:
        """The filled host buffer on the device, in one copy, as typed tensors by field."""
        raw = self._current
        if self._copies:
            raw = raw.to(self.device, non_blocking=self._cuda)  # a new device tensor: the caller may keep the results
            if self._cuda:
                self._copy_done.record()
                self._copy_pending = True
        return self._views(raw, numpy=False)

    def actions_to_host(self, action: torch.Tensor) -> np.ndarray:
        """A tensor of actions as a numpy array: one copy from the device into a pinned buffer reused every
        step (it waits for the policy), none from the CPU. A view: the simulators copy the actions within
        their step, before the next call overwrites the buffer."""
        action = action.detach()
        if action.device.type != "cpu":
            if (
                self._action_host is None
                or self._action_host.shape != action.shape
                or self._action_host.dtype != action.dtype
            ):
                self._action_host = torch.empty(action.shape, dtype=action.dtype, pin_memory=self._cuda)
            action = self._action_host.copy_(action)
        return action.numpy()
