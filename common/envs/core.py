"""Base class of the built-in batched torch envs and their counter-based random numbers.

A `TorchEnv` holds the physical state of `num_envs` copies of one task in a tensor
`state` [N, state_dim] and steps all of them with elementwise tensor ops. A subclass
only describes the physics of ONE env, written over batches:

    _initial_state(u)            uniforms in [0, 1) [N, num_reset_uniforms] -> state [N, state_dim]
    _dynamics(state, action)     -> (next_state, reward, terminated)
    _observe(state)              -> observation [N, obs_dim]

and this class adds what every env needs: action checks, the time limit, the same-step
autoreset, the observation TensorDicts, seeding, and state_dict/load_state_dict.

Nothing in `step` reads a tensor value on the host (no .item(), nonzero(), boolean-mask
indexing, Python `if` on tensors): finished envs are reset with `torch.where`, so a step
is the same fixed sequence of kernels whatever happens, which is what lets a GPU run
ahead of the Python loop and lets the step be compiled or captured in a CUDA graph.

The env's tensors (`state`, `episode_steps`, the RNG keys and counters) are allocated once
and only ever written in place (`reset`, `step` and `load_state_dict` copy into them): a CUDA
graph replays its kernels on the addresses it was captured with, so a captured rollout keeps
stepping the env's live state, and a reset or a resume between replays is seen by the next.
"""

from __future__ import annotations

import numbers

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict

# ---------------------------------------------------------------------------------------
# Counter-based random numbers
#
# Each env i owns a 64-bit key (derived from its seed) and a counter of the resets it has
# drawn. Uniform number k of reset number c of env i is a pure function
# hash(key_i, c * num_reset_uniforms + k). Consequences:
# - no generator state is shared between envs, so env i's stream does not depend on how
#   many envs run beside it or which of them finished (batch-composition independent);
# - finished envs can take fresh initial states without a host sync: we hash for every env
#   and keep the rows that finished with `torch.where`;
# - the whole RNG state is two int64 tensors, which makes a resume exact.
#
# The hash is the SplitMix64 output function (a bijective 64-bit mixer) applied to
# key + index * golden_ratio, i.e. a SplitMix64 stream per env, jumped to any position in
# O(1). torch int64 arithmetic wraps modulo 2**64 like the unsigned arithmetic the mixer is
# defined with, except that `>>` is an arithmetic shift on negative values; `_shr` masks
# the sign-extended bits to get the logical shift the mixer needs.
# ---------------------------------------------------------------------------------------


def _as_int64(value: int) -> int:
    """Reinterpret an unsigned 64-bit constant as the signed int64 torch stores."""
    return value - (1 << 64) if value >= (1 << 63) else value


_GOLDEN_U64 = 0x9E3779B97F4A7C15  # 2**64 / golden ratio, SplitMix64's stream increment
_GOLDEN = _as_int64(_GOLDEN_U64)
_MIX1 = _as_int64(0xBF58476D1CE4E5B9)
_MIX2 = _as_int64(0x94D049BB133111EB)


def _shr(x: torch.Tensor, shift: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's `>>` is arithmetic on negatives)."""
    return (x >> shift).bitwise_and_((1 << (64 - shift)) - 1)


def _mix64_(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64 finaliser, in place: a bijection of int64 whose output bits look random.

    In-place ops keep the temporaries down to one per line, which matters on CPU where
    every new [N, k] int64 tensor is a fresh allocation.
    """
    z ^= _shr(z, 30)
    z *= _MIX1
    z ^= _shr(z, 27)
    z *= _MIX2
    z ^= _shr(z, 31)
    return z


def mix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64 finaliser (out of place)."""
    return _mix64_(z.clone())


def seed_to_key(seeds: torch.Tensor) -> torch.Tensor:
    """Per-env stream key from per-env int64 seeds (consecutive seeds -> unrelated keys)."""
    return _mix64_(seeds + _GOLDEN)


def _uniform_(position: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Uniforms in [0, 1) at SplitMix64 stream positions (`key + index * golden`).

    Overwrites `position` (callers pass a temporary). Only as many random bits are kept
    as the dtype's significand holds (53 for float64, 24 for float32), so the integer
    converts exactly and the result never rounds up to 1.
    """
    bits = 53 if dtype == torch.float64 else 24
    z = _mix64_(position)
    return _shr(z, 64 - bits).to(dtype).mul_(2.0**-bits)


def hash_uniform(key: torch.Tensor, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Uniform number `index` of the stream `key`, for each element of the broadcast pair."""
    return _uniform_(key + index * _GOLDEN, dtype)


# ---------------------------------------------------------------------------------------
# Base class
# ---------------------------------------------------------------------------------------


class TorchEnv:
    """Batch of `num_envs` independent copies of a task, stepped together on `device`.

    `capturable`: `step` is a fixed sequence of kernels on tensors that stay where they are, so
    a rollout of many steps can be captured whole in one CUDA graph (the scripts check this
    attribute to pick that path; adapters to other simulators do not have it).

    Subclasses set the class attributes below and `single_observation_space` /
    `single_action_space` (gymnasium spaces) in their `__init__`, then call ours.
    """

    env_id: str = ""
    state_dim: int = 0
    num_reset_uniforms: int = 0  # uniforms an initial state is drawn from
    default_max_episode_steps: int = 0  # gymnasium's registered time limit
    capturable: bool = True

    single_observation_space: spaces.Box
    single_action_space: spaces.Box | spaces.Discrete

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        max_episode_steps: int | None = None,
    ):
        if not isinstance(num_envs, numbers.Integral) or num_envs < 1:
            raise ValueError(f"{self.env_id}: num_envs must be a positive int, got {num_envs!r}")
        if dtype not in (torch.float32, torch.float64):
            raise TypeError(f"{self.env_id}: dtype must be torch.float32 or torch.float64, got {dtype!r}")
        if max_episode_steps is None:
            max_episode_steps = self.default_max_episode_steps
        if not isinstance(max_episode_steps, numbers.Integral) or max_episode_steps < 1:
            raise ValueError(f"{self.env_id}: max_episode_steps must be a positive int, got {max_episode_steps!r}")
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self._batch_size = torch.Size([self.num_envs])
        self.dtype = dtype
        self.max_episode_steps = int(max_episode_steps)

        # Uniform k of env i's reset number c is number c * num_reset_uniforms + k of env i's
        # stream, at position key_i + (c * num_reset_uniforms + k) * golden (mod 2**64).
        # Computed as (key_i + c * stride) + k * golden, it costs a single op on [N, k].
        self._rng_stride = _as_int64(self.num_reset_uniforms * _GOLDEN_U64 % (1 << 64))
        self._rng_lane_offsets = torch.arange(self.num_reset_uniforms, device=self.device) * _GOLDEN
        # Allocated once, written in place from here on (see the module docstring).
        n, i64 = self.num_envs, dict(dtype=torch.int64, device=self.device)
        self._seeds, self._rng_key, self._rng_counter = (torch.zeros(n, **i64) for _ in range(3))
        self._set_seeds(seed)
        # Valid placeholders until reset() draws the first episode's states.
        self.state = torch.zeros(n, self.state_dim, dtype=dtype, device=self.device)
        self.episode_steps = torch.zeros(n, **i64)
        self._needs_reset = True

    # -- subclass hooks -------------------------------------------------------------------

    def _initial_state(self, u: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _dynamics(self, state: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _observe(self, state: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # -- seeding --------------------------------------------------------------------------

    def _set_seeds(self, seed: int | torch.Tensor) -> None:
        """Env i gets seed `seed + i` (or `seed[i]` for a tensor) and a fresh counter."""
        n = self.num_envs
        if isinstance(seed, torch.Tensor):
            if seed.shape != (n,) or seed.is_floating_point() or seed.is_complex():
                raise ValueError(
                    f"{self.env_id}: a seed tensor must hold {n} integers (shape [{n}]), "
                    f"got dtype {seed.dtype} shape {list(seed.shape)}"
                )
            seeds = seed.to(device=self.device, dtype=torch.int64)
        elif isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
            seeds = int(seed) + torch.arange(n, dtype=torch.int64, device=self.device)
        else:
            raise TypeError(f"{self.env_id}: seed must be an int or an int tensor, got {seed!r}")
        self._seeds.copy_(seeds)
        self._rng_key.copy_(seed_to_key(seeds))
        self._rng_counter.zero_()

    def _draw_initial_state(self) -> torch.Tensor:
        """Initial state of every env's next episode, from its current reset counter."""
        start = self._rng_key + self._rng_counter * self._rng_stride
        u = _uniform_(start[:, None] + self._rng_lane_offsets, self.dtype)
        return self._initial_state(u)

    # -- gym-like API ---------------------------------------------------------------------

    def _wrap_obs(self, obs: torch.Tensor) -> TensorDict:
        return TensorDict({"policy": obs}, batch_size=self._batch_size, device=self.device)

    def reset(self, seed: int | torch.Tensor | None = None) -> tuple[TensorDict, dict]:
        """Start a new episode in every env.

        `seed` (int) re-seeds env i with `seed + i`, a tensor of N ints gives each env its
        seed; without `seed` every env continues its own random stream.
        """
        if seed is not None:
            self._set_seeds(seed)
        self.state.copy_(self._draw_initial_state())
        self._rng_counter.add_(1)
        self.episode_steps.zero_()
        self._needs_reset = False
        return self._wrap_obs(self._observe(self.state)), {}

    def _check_action(self, action) -> torch.Tensor:
        """Bring an action batch to [N] int64 (Discrete) or [N, act_dim] env dtype (Box).

        Only shapes are checked: checking values would need a host sync. Discrete values
        outside {0, ..., n-1} give meaningless (but finite) dynamics.
        """
        n = self.num_envs
        action = torch.as_tensor(action, device=self.device)
        space = self.single_action_space
        if isinstance(space, spaces.Discrete):
            if action.shape == (n, 1):
                action = action.reshape(n)
            if action.shape != (n,):
                raise ValueError(
                    f"{self.env_id}: expected a Discrete action batch of shape [{n}] or [{n}, 1], "
                    f"got {list(action.shape)}"
                )
            return action.long()
        act_dim = space.shape[0]
        if act_dim == 1 and action.shape == (n,):
            action = action.reshape(n, 1)
        if action.shape != (n, act_dim):
            raise ValueError(
                f"{self.env_id}: expected a Box action batch of shape [{n}, {act_dim}], got {list(action.shape)}"
            )
        return action.to(self.dtype)

    def step(self, action) -> tuple[TensorDict, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """Advance every env one step; finished envs restart within the same call.

        Returns (obs, reward, terminated, truncated, info) like a gymnasium vector env in
        same-step autoreset mode: `obs` rows of finished envs are the first observation of
        their next episode and `info["final_obs"]` holds their true last observation.
        """
        if self._needs_reset:
            raise RuntimeError(f"{self.env_id}: call reset() before step()")
        action = self._check_action(action)
        next_state, reward, terminated = self._dynamics(self.state, action)
        # Time limit as gymnasium's TimeLimit wrapper: truncated whenever the step count
        # reaches the limit, even on a step that also terminates.
        steps = self.episode_steps + 1
        truncated = steps >= self.max_episode_steps
        done = terminated | truncated
        final_obs = self._observe(next_state)

        # Sync-free autoreset: draw an initial state for every env and keep it only where
        # the episode ended. Only finished envs advance their reset counter, so an env's
        # random stream depends on its own history alone.
        fresh = self._draw_initial_state()
        self._rng_counter.add_(done)
        self.state.copy_(torch.where(done[:, None], fresh, next_state))
        self.episode_steps.copy_(steps.masked_fill(done, 0))
        obs = self._observe(self.state)

        info = {"final_obs": self._wrap_obs(final_obs), "log": {}}
        return self._wrap_obs(obs), reward, terminated, truncated, info

    def render(self, env_ids: list[int]) -> list[np.ndarray]:
        """Frames (uint8 [H, W, 3]) of the envs `env_ids` as they are now, drawn by gymnasium's own
        renderer of this env id from `state` (same layout as gymnasium's), so a video looks exactly
        like gymnasium's. Reads those envs' states to the host: for recorded evaluation only.
        Needs pygame (the `[video]` extra)."""
        renderers = self.__dict__.setdefault("_renderers", {})
        states = self.state[env_ids].detach().to("cpu", torch.float64).numpy()
        frames = []
        for i, state in zip(env_ids, states):
            if i not in renderers:
                import gymnasium

                renderers[i] = gymnasium.make(self.env_id, render_mode="rgb_array").unwrapped
            renderer = renderers[i]
            renderer.state = state.copy()
            renderer.last_u = None  # Pendulum draws the last torque when it has one
            frames.append(renderer.render())
            self.render_fps = renderer.metadata.get("render_fps", 30)
        return frames

    def close(self) -> None:
        """Closes the renderers, if any frames were drawn."""
        for renderer in self.__dict__.pop("_renderers", {}).values():
            renderer.close()

    # -- checkpointing --------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything that determines future steps, as plain tensors (exact resume)."""
        return {
            "state": self.state.clone(),
            "episode_steps": self.episode_steps.clone(),
            "rng_seed": self._seeds.clone(),
            "rng_counter": self._rng_counter.clone(),
        }

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        n = self.num_envs
        expected = {
            "state": (n, self.state_dim),
            "episode_steps": (n,),
            "rng_seed": (n,),
            "rng_counter": (n,),
        }
        for name, shape in expected.items():
            if name not in sd:
                raise KeyError(f"{self.env_id}: env state_dict lacks {name!r}")
            if tuple(sd[name].shape) != shape:
                raise ValueError(
                    f"{self.env_id}: env state_dict entry {name!r} has shape {list(sd[name].shape)}, "
                    f"expected {list(shape)} (was it saved with another num_envs?)"
                )
        self.state.copy_(sd["state"])
        self.episode_steps.copy_(sd["episode_steps"])
        self._set_seeds(sd["rng_seed"])
        self._rng_counter.copy_(sd["rng_counter"])
        self._needs_reset = False

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.env_id}, num_envs={self.num_envs}, "
            f"device={self.device}, dtype={self.dtype}, max_episode_steps={self.max_episode_steps})"
        )
