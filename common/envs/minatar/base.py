"""The base of the MinAtar games (common.envs.minatar): MinAtarEnv, what every game shares (sticky actions,
the step's block of uniforms, the time limit, the same-step autoreset, frame stacking, state columns, drawing),
as the `minatar` package's environment.py wraps its games."""

from __future__ import annotations

import numbers

import numpy as np
import torch
from gymnasium import spaces

from common.envs.core import TorchEnv, _uniform_

FULL_ACTIONS = ("n", "l", "u", "r", "d", "f")  # the package's action names, in its full action set's order


class MinAtarEnv(TorchEnv):
    """A MinAtar game over a batch of envs. A subclass sets the class attributes and writes

    _new_game(u, n)               reset lanes [n, reset_lanes] (None without) -> state [n, state_dim]
    _game_step(state, a, u)       full-set action [N], the step's game lanes -> (new state, reward, terminated),
                                  or with a 4th: entities [N] the game had no slot for (Seaquest); it must not
                                  write into `state` (the env's live state)
    _observe(state)               -> uint8 [N, C, 10, 10]
    """

    channels: tuple[str, ...] = ()
    minimal_actions: tuple[str, ...] = ()
    fields: tuple[tuple[str, int], ...] = ()  # state columns: (name, width), `last_action` added first
    tables: dict[str, tuple[int, ...]] = {}  # lookup tables of the game's rules (see `lookup`)
    game_lanes = 0  # uniforms the game's `act` may draw in one step
    reset_lanes = 0  # uniforms a reset draws
    default_max_episode_steps = 10_000

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        max_episode_steps: int | None = None,
        sticky_action_prob: float = 0.1,
        difficulty_ramping: bool = True,
        frame_stack: int = 1,
    ):
        if not isinstance(sticky_action_prob, numbers.Real) or not 0.0 <= sticky_action_prob <= 1.0:
            raise ValueError(f"{self.env_id}: sticky_action_prob must be in [0, 1], got {sticky_action_prob!r}")
        if not isinstance(frame_stack, numbers.Integral) or frame_stack < 1:
            raise ValueError(f"{self.env_id}: frame_stack must be a positive int, got {frame_stack!r}")
        self.sticky_action_prob = float(sticky_action_prob)
        self.difficulty_ramping = bool(difficulty_ramping)
        self.frame_stack = int(frame_stack)
        shape = (len(self.channels) * self.frame_stack, 10, 10)
        self.single_observation_space = spaces.Box(0, 255, shape, dtype=np.uint8)
        self.single_action_space = spaces.Discrete(len(self.minimal_actions))
        # Column slices of `state`, by name.
        self.columns: dict[str, slice] = {}
        start = 0
        for name, width in (("last_action", 1),) + self.fields:
            self.columns[name] = slice(start, start + width)
            start += width
        self.state_dim = start
        self.num_reset_uniforms = 1 + self.game_lanes + self.reset_lanes  # one block per step
        super().__init__(num_envs, device, seed, dtype, max_episode_steps)
        self.state = torch.zeros(self.num_envs, self.state_dim, dtype=torch.int64, device=self.device)
        self._action_set = torch.tensor([FULL_ACTIONS.index(a) for a in self.minimal_actions], device=self.device)
        # On the device once: a tensor made from Python values inside a step would be a host-to-device
        # copy in every step, which a CUDA graph cannot replay.
        self._tables = {name: torch.tensor(values, device=self.device) for name, values in self.tables.items()}
        # The last `frame_stack` frames, oldest first (allocated once, written in place: capturable).
        self._frames = torch.zeros(self.num_envs, *shape, dtype=torch.uint8, device=self.device)
        # A game that starts without random draws starts from one state, made once (broadcast over the envs).
        self._start_state = self._new_game(None, 1) if self.reset_lanes == 0 else None
        self._setup()

    def lookup(self, table: str, index: torch.Tensor) -> torch.Tensor:
        """tables[table][index], elementwise."""
        return self._tables[table][index]

    # -- state columns ----------------------------------------------------------------------

    def col(self, state: torch.Tensor, name: str) -> torch.Tensor:
        """Column `name` of `state`: [N] for a scalar field, [N, width] for a wider one (a view)."""
        s = self.columns[name]
        return state[:, s.start] if s.stop - s.start == 1 else state[:, s]

    def pack(self, n: int, **values) -> torch.Tensor:
        """A state [n, state_dim] from its fields (each [n], [n, width] or [n, 10, 10], or a number; 0 where
        not given), in one concatenation."""
        pieces = []
        for name, s in self.columns.items():
            value = values.get(name, 0)
            if isinstance(value, numbers.Number):  # a fill: a tensor made from a number would be a copy from the host
                pieces.append(torch.full((n, s.stop - s.start), value, dtype=torch.int64, device=self.device))
            else:
                pieces.append(value.long().reshape(n, s.stop - s.start))
        return torch.cat(pieces, 1)

    def _setup(self) -> None:
        """What a game prepares once, at the end of __init__ (e.g. start states)."""

    # -- random draws -----------------------------------------------------------------------

    def _draw_block(self) -> torch.Tensor:
        """This step's uniforms [N, num_reset_uniforms] (float64, like numpy's `rand()`)."""
        start = self._rng_key + self._rng_counter * self._rng_stride
        return _uniform_(start[:, None] + self._rng_lane_offsets, torch.float64)

    def _draw_initial_state(self) -> torch.Tensor:
        return self._new_game(self._draw_block()[:, -self.reset_lanes :] if self.reset_lanes else None, self.num_envs)

    # -- the step ---------------------------------------------------------------------------

    def step(self, action):
        """Sticky action, the game's step, the time limit, and a same-step autoreset (see TorchEnv.step)."""
        if self._needs_reset:
            raise RuntimeError(f"{self.env_id}: call reset() before step()")
        action = self._action_set[self._check_action(action)]
        u = self._draw_block()
        self._rng_counter.add_(1)  # every env draws one block per step, finished or not
        action = torch.where(u[:, 0] < self.sticky_action_prob, self.col(self.state, "last_action"), action)
        # The game reads the state and makes a new one (its last-action column left 0: set below).
        next_state, reward, terminated, *dropped = self._game_step(self.state, action, u[:, 1 : 1 + self.game_lanes])

        steps = self.episode_steps + 1
        truncated = steps >= self.max_episode_steps
        done = terminated | truncated
        final_obs = self._observe(next_state)
        if self._start_state is not None:
            fresh = self._start_state
        else:
            fresh = self._new_game(u[:, self.num_reset_uniforms - self.reset_lanes :], self.num_envs)
        self.state.copy_(torch.where(done[:, None], fresh, next_state))
        self.state[:, self.columns["last_action"].start].copy_(action)  # the package keeps it across episodes
        self.episode_steps.copy_(steps.masked_fill(done, 0))
        obs = self._observe(self.state)
        if self.frame_stack > 1:  # a new episode's stack is its first frame, repeated
            older = self._frames[:, len(self.channels) :]
            final_obs = torch.cat([older, final_obs], 1)
            obs = torch.where(
                done[:, None, None, None], obs.repeat(1, self.frame_stack, 1, 1), torch.cat([older, obs], 1)
            )
            self._frames.copy_(obs)
        info = {"final_obs": self._wrap_obs(final_obs), "log": {}}
        if dropped:  # entities a fixed number of slots could not hold: counted on the device, never silently lost
            dropped = dropped[0].sum()
            self.entities_dropped.add_(dropped)
            if (
                self.device.type != "cuda"
            ):  # on CUDA the rollout is one graph that runs no Python: read entities_dropped
                info["log"]["entities_dropped"] = dropped.float()
        return self._wrap_obs(obs), reward.to(self.dtype), terminated, truncated, info

    def reset(self, seed=None):
        """Start a new episode in every env (see TorchEnv.reset); a stack starts as the first frame, repeated."""
        obs, info = super().reset(seed)
        self._frames.copy_(obs["policy"].repeat(1, self.frame_stack, 1, 1))
        return self._wrap_obs(self._frames.clone()), info

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**super().state_dict(), "frames": self._frames.clone()}

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        sd = dict(sd)
        frames = sd.pop("frames", None)
        if frames is None or tuple(frames.shape) != tuple(self._frames.shape):
            raise ValueError(
                f"{self.env_id}: env state_dict entry 'frames' is missing or has shape "
                f"{None if frames is None else list(frames.shape)}, expected {list(self._frames.shape)} "
                f"(was it saved with another num_envs or frame_stack?)"
            )
        super().load_state_dict(sd)
        self._frames.copy_(frames)

    # -- drawing ----------------------------------------------------------------------------

    def _image(self, n: int) -> torch.Tensor:
        """An empty observation [n, C * 100] (uint8), filled by `_put` and reshaped by `_frame`."""
        return torch.zeros(n, len(self.channels) * 100, dtype=torch.uint8, device=self.device)

    def _put(self, image: torch.Tensor, channel, y: torch.Tensor, x: torch.Tensor, on=None) -> None:
        """Set pixel (y, x) of `channel` (a name, or channel numbers like y) in each row of `image` ([N] or
        [N, k] coordinates), only where `on` when given (an off pixel leaves its cell as it was: the
        writes are maxima)."""
        n = len(image)
        channel = self.channels.index(channel) if isinstance(channel, str) else channel
        index = (channel * 100 + y * 10 + x).reshape(n, -1)
        value = torch.full_like(index, 255, dtype=torch.uint8)
        if on is not None:
            value = value * on.reshape(n, -1)
        image.scatter_reduce_(1, index, value, "amax")

    def _frame(self, image: torch.Tensor) -> torch.Tensor:
        return image.view(len(image), len(self.channels), 10, 10)

    def render(self, env_ids: list[int]) -> list[np.ndarray]:
        """Frames of the envs `env_ids`, drawn from their observations (the newest frame; see
        common.envs.frames)."""
        from common.envs.frames import frames_from_image

        return frames_from_image(self._observe(self.state[env_ids]), kind="objects")

    def close(self) -> None:
        pass
