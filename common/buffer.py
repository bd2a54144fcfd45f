"""Preallocated TensorDict storage on the device: the on-policy rollout and the off-policy replay buffer. The first
write fixes keys, shapes and dtypes (uint8 frames stay uint8); every later one is an in-place copy, no host sync."""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

__all__ = ["RolloutStorage", "ReplayBuffer", "bytes_per_transition"]


def _leaf_keys(td: TensorDictBase) -> frozenset:
    return frozenset(td.keys(include_nested=True, leaves_only=True))


def _allocate_like(td: TensorDictBase, batch_size: tuple[int, ...], device: torch.device) -> TensorDict:
    """Zeros with ``td``'s keys and dtypes, its leading (env) dim replaced by ``batch_size``."""
    return td.apply(
        lambda x: torch.zeros(batch_size + x.shape[1:], dtype=x.dtype, device=device),
        batch_size=batch_size,
        device=device,
    )


def bytes_per_transition(td: TensorDictBase) -> int:
    """Bytes one env's transition takes in a storage laid out like ``td`` (its leading dims are batch dims)."""
    return sum(x[(0,) * td.batch_dims].nbytes for x in td.values(include_nested=True, leaves_only=True))


def describe_storage(td: TensorDictBase, rows: int) -> str:
    """A line saying what ``rows`` transitions laid out like ``td`` take."""
    per = bytes_per_transition(td)
    obs = ", ".join(
        f"{'.'.join(k) if isinstance(k, tuple) else k} {str(x.dtype).replace('torch.', '')} "
        f"{list(x.shape[td.batch_dims :])}"
        for k, x in td.items(include_nested=True, leaves_only=True)
        if x.ndim > td.batch_dims
    )
    total = per * rows
    size = next(
        f"{total / 2**p:,.1f} {unit}"
        for p, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB"), (0, "B"))
        if total >= 2**p or not p
    )
    return f"{per:,} bytes per transition x {rows:,} = {size} ({obs})"


def _check_same_keys(expected: frozenset, td: TensorDictBase, what: str) -> None:
    # TensorDict's in-place update ignores unknown keys and leaves missing ones stale: a changed structure would
    # corrupt data silently. Comparing key sets is host-only work.
    got = _leaf_keys(td)
    if got != expected:
        raise KeyError(
            f"{what}: keys differ from the first write; missing {sorted(map(str, expected - got))}, "
            f"unexpected {sorted(map(str, got - expected))}. Write the same keys every step."
        )


class RolloutStorage:
    """On-policy rollout, ``data`` of batch shape ``[num_steps, num_envs]``; used within one iteration, never saved."""

    def __init__(self, num_steps: int, num_envs: int, device: torch.device | str):
        self.num_steps = num_steps
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.data: TensorDict | None = None  # allocated by the first write
        self._keys: frozenset = frozenset()

    def write(self, step: int, td: TensorDictBase) -> None:
        """Store one step for all envs; ``td`` has batch size ``[num_envs]``."""
        if tuple(td.batch_size) != (self.num_envs,):
            raise ValueError(f"RolloutStorage.write: expected batch size [{self.num_envs}], got {list(td.batch_size)}")
        if self.data is None:
            self.data = _allocate_like(td, (self.num_steps, self.num_envs), self.device)
            self._keys = _leaf_keys(self.data)
        else:
            _check_same_keys(self._keys, td, "RolloutStorage.write")
        self.data[step].update_(td)

    def describe(self) -> str:
        """What the allocated storage takes (a line to print)."""
        if self.data is None:
            raise RuntimeError("RolloutStorage.describe: nothing written yet")
        return "rollout storage: " + describe_storage(self.data, self.num_steps * self.num_envs)

    def flatten(self) -> TensorDict:
        """View of the storage with batch shape ``[num_steps * num_envs]`` (step-major)."""
        if self.data is None:
            raise RuntimeError("RolloutStorage.flatten: nothing written yet")
        return self.data.reshape(-1)


class ReplayBuffer:
    """Circular off-policy buffer, one ring per env: ``data`` has batch shape ``[num_envs, capacity]``; ``next_obs``
    must be the TRUE next observation (``info["final_obs"]`` where an env just auto-reset). ``sample`` draws n-step
    windows as stored; the script computes its TD target from them.

    The pointer and fill level live twice: on the device (``device_ptr``, ``device_size``, advanced in place, so a
    write and a sample can run in a CUDA graph) and on the host (``ptr``, ``size``) for the host's decisions, which
    thus never read the device. A captured function calls ``write(td)``, its caller ``advance_host()`` outside.
    ``capturable=True`` draws slots against the device fill level, so a graph captured while the buffer fills samples
    every written slot at each replay; the default draws against the host's, the random stream of earlier versions."""

    # Keys read at every transition of an n-step window ([B, n]); next_obs is read after the last one, every other
    # stored key at the first one.
    WINDOW_KEYS = ("rewards", "terminated", "truncated")

    def __init__(self, num_envs: int, capacity_per_env: int, device: torch.device | str, capturable: bool = False):
        if capacity_per_env < 1:
            raise ValueError(f"ReplayBuffer: capacity_per_env must be >= 1, got {capacity_per_env}")
        self.num_envs = num_envs
        self.capacity = capacity_per_env
        self.device = torch.device(device)
        self.capturable = capturable
        self.data: TensorDict | None = None  # allocated by the first write
        self._keys: frozenset = frozenset()
        # Written in place, never rebound (captured graphs hold them).
        self.device_ptr = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.device_size = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.ptr = 0  # slot the next write goes to
        self.size = 0  # written slots per env, at most capacity

    def __len__(self) -> int:
        return self.size

    def add(self, td: TensorDictBase) -> None:
        """Write one transition for every env at the current slot (overwrites the oldest once full)."""
        self.write(td)
        self.advance_host()

    def write(self, td: TensorDictBase) -> None:
        """The device half of `add`, all in place (capturable); call `advance_host()` after it."""
        if tuple(td.batch_size) != (self.num_envs,):
            raise ValueError(f"ReplayBuffer.add: expected batch size [{self.num_envs}], got {list(td.batch_size)}")
        if self.data is None:
            self._check_layout(td)
            self.data = _allocate_like(td, (self.num_envs, self.capacity), self.device)
            self._keys = _leaf_keys(self.data)
        else:
            _check_same_keys(self._keys, td, "ReplayBuffer.add")
        for key in self._keys:  # one copy per leaf into the slot; no allocation, no host read
            leaf = self.data.get(key)
            leaf.index_copy_(1, self.device_ptr, td.get(key).unsqueeze(1).to(leaf.dtype))
        self.device_ptr.add_(1).remainder_(self.capacity)
        self.device_size.add_(1).clamp_(max=self.capacity)

    def advance_host(self) -> None:
        """The host half of `add`: the host pointer and fill level follow one `write`."""
        self.ptr = (self.ptr + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def _check_layout(self, td: TensorDictBase) -> None:
        for key in ("rewards", "terminated", "truncated"):
            if key not in td.keys():
                raise KeyError(f"ReplayBuffer.add: missing key {key!r} (needed for sampling), got {sorted(td.keys())}")
            if td[key].shape != (self.num_envs,):
                raise ValueError(
                    f"ReplayBuffer.add: {key!r} must have shape [{self.num_envs}], got {list(td[key].shape)}"
                )
        for key in ("terminated", "truncated"):
            if td[key].dtype != torch.bool:
                raise TypeError(f"ReplayBuffer.add: {key!r} must be bool, got {td[key].dtype}")
        for key in _leaf_keys(td):
            parts = key if isinstance(key, tuple) else (key,)
            if any("." in part for part in parts):
                # state_dict() flattens nested keys with "." as separator.
                raise ValueError(f"ReplayBuffer.add: key {key!r} contains '.', which state_dict() reserves")

    def sample(self, batch_size: int, n_step: int = 1, generator: torch.Generator | None = None) -> TensorDict:
        """Uniformly sample ``batch_size`` windows of ``n_step`` consecutive transitions of one env, as stored; no
        host-device sync. The ``n_step - 1`` newest slots of each ring are never starts, so a window never runs into
        unwritten slots or across the wrap. Each key is read at the window's first transition (``obs``, ``actions``,
        what else a script stores), but for ``rewards``, ``terminated`` and ``truncated``: ``[B, n]``, the window's
        own, and ``next_obs``: the observation after the window's last ``included`` transition. ``included``
        (``[B, n]`` bool) is the window cut after its first episode end: transition k counts iff none before it ended
        the episode. The discounting, the bootstrap and any normalization are the script's (its TD target).
        ``generator`` must live on the buffer's device."""
        if self.data is None:
            raise RuntimeError("ReplayBuffer.sample: the buffer is empty; add transitions first")
        num_starts = self.size - n_step + 1  # valid start slots per env
        if n_step < 1 or num_starts < 1:
            raise ValueError(
                f"ReplayBuffer.sample: n_step={n_step} needs 1 <= n_step <= written steps per env "
                f"({self.size} of capacity {self.capacity}); add more steps or lower n_step"
            )
        device = self.device
        env = torch.randint(self.num_envs, (batch_size,), generator=generator, device=device)
        # `start` counts from the oldest written slot; the modulo maps chronological positions to physical slots.
        if self.capturable:  # bounds from the device: the same kernels whatever the fill level
            start = torch.randint(1 << 62, (batch_size,), generator=generator, device=device) % (
                self.device_size - n_step + 1
            )
            oldest = (self.device_ptr - self.device_size) % self.capacity
        else:  # Python-int bounds, also free of device reads
            start = torch.randint(num_starts, (batch_size,), generator=generator, device=device)
            oldest = (self.ptr - self.size) % self.capacity
        offsets = torch.arange(n_step, device=device)
        slots = (oldest + start.unsqueeze(1) + offsets) % self.capacity  # [B, n]
        rows = env.unsqueeze(1)  # [B, 1], broadcasts against slots

        terminated, truncated = self.data["terminated"][rows, slots], self.data["truncated"][rows, slots]  # [B, n]
        done = (terminated | truncated).long()
        included = (done.cumsum(dim=1) - done) == 0  # [B, n]; column 0 is always True
        last = slots.gather(1, (included.sum(dim=1) - 1).unsqueeze(1)).squeeze(1)  # the last included slot

        # Gather each key once, at the slot it is read from (exclude/select are shallow views).
        out = self.data.exclude(*self.WINDOW_KEYS, "next_obs")[env, slots[:, 0]]
        out.update(self.data.select("next_obs", strict=False)[env, last])
        out["rewards"] = self.data["rewards"][rows, slots]
        out["terminated"], out["truncated"], out["included"] = terminated, truncated, included
        return out

    def newest(self, k: int) -> TensorDict:
        """The newest ``k`` transitions of every env, oldest first: ``[num_envs, k]`` (a copy; no device read)."""
        if not 0 < k <= self.size:
            raise ValueError(f"ReplayBuffer.newest: k={k} needs 0 < k <= written steps per env ({self.size})")
        slots = (self.ptr - k + torch.arange(k, device=self.device)) % self.capacity  # chronological, across the wrap
        return self.data[:, slots]

    def fold_into(self, k: int, obs_normalizers: dict, reward_normalizer=None) -> None:
        """Fold the newest ``k`` transitions of every env into the normalizers (a collective: every rank calls it)."""
        if k == 0 or not (obs_normalizers or reward_normalizer is not None):
            return
        window = self.newest(k)
        for group, normalizer in obs_normalizers.items():
            normalizer.update(window["obs", group])
        if reward_normalizer is not None:  # [T, N]: the discounted returns run along each env's steps
            reward_normalizer.update(window["rewards"].T, (window["terminated"] | window["truncated"]).T)

    def end_episodes(self) -> None:
        """Mark the newest transition of every env truncated, so no n-step window joins it to the fresh episode that
        follows (a resume of an env that cannot be snapshotted)."""
        if self.data is not None and self.size > 0:
            self.data["truncated"][:, (self.ptr - 1) % self.capacity] = True

    def state_dict(self) -> dict:
        """Plain tensors and ints (``torch.load(weights_only=True)``), nested keys as ``"obs.policy"``. The tensors
        are the live storage, not copies, as with ``nn.Module.state_dict()``: save them before adding more."""
        data = {} if self.data is None else dict(self.data.flatten_keys(".").items())
        return {"num_envs": self.num_envs, "capacity": self.capacity, "ptr": self.ptr, "size": self.size, "data": data}

    def load_state_dict(self, state: dict) -> None:
        """Restore a buffer saved by ``state_dict()``; its num_envs and capacity must match."""
        if state["num_envs"] != self.num_envs or state["capacity"] != self.capacity:
            raise ValueError(
                f"ReplayBuffer.load_state_dict: checkpoint buffer is {state['num_envs']} envs x "
                f"{state['capacity']} slots, this run has {self.num_envs} x {self.capacity}; "
                "resume with the same number of envs and buffer size"
            )
        if state["data"]:
            flat = TensorDict(
                {key: value.to(self.device) for key, value in state["data"].items()},
                batch_size=(self.num_envs, self.capacity),
                device=self.device,
            )
            self.data = flat.unflatten_keys(".")
            self._keys = _leaf_keys(self.data)
        else:
            self.data, self._keys = None, frozenset()
        self.ptr, self.size = int(state["ptr"]), int(state["size"])
        self.device_ptr.fill_(self.ptr)
        self.device_size.fill_(self.size)
