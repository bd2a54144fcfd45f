"""Adapter: an envpool task behind the torch env contract (`make_env("envpool:<task>", ...)`).

    envs = make_env("envpool:Pong-v5", num_envs=64, device="cuda", seed=1, preset="atari")
    envs = make_env("envpool:HalfCheetah-v5", num_envs=64, seed=1)

envpool (Weng et al., 2022) steps a batch of envs in C++ threads: Atari, MuJoCo, DeepMind Control,
MuJoCo Playground and classic control tasks all come through this one adapter. What it adds:

- same-step autoreset: envpool resets a finished env at the *next* step call; here the finished envs
  are reset within the step that ends them (envpool's `reset(env_ids)`), so `obs` holds the first
  observation of their next episode and `info["final_obs"]` their true last one, as the contract asks;
- image observations (Atari: uint8 [N, 4, 84, 84], channel-first already) stay uint8 images in the
  `policy` group; vector ones (a Box, or a Dict of Boxes as DeepMind Control's, flattened in key
  order) become float32 [N, D]; MuJoCo Playground's Dict of `state` and `privileged_state` becomes
  the groups `policy` and `critic` (the privileged inputs of an asymmetric critic, not the actor's);
- tensors on `device`, one copy each way per step; actions from the device in one copy.

Atari (`preset`): envpool's Atari defaults already are the standard preprocessing (up to 30 no-op
starts, action repeat 4 with the max of the last two frames, grayscale 84x84, 4 frames stacked, FIRE
at reset where the game needs it, no sticky actions, episodes cut at 108,000 frames).
`preset="atari"` adds what training uses (episodic lives, rewards clipped to their sign) and
`preset="atari-eval"` turns both off, for evaluation (`--eval-env-kwargs '{"preset": "atari-eval"}'`).
Other keyword arguments go to `envpool.make` (e.g. `num_threads`, `repeat_action_probability`).

Seeding: env i is seeded `seed + i` by envpool (int32 seeds: `seed` is taken modulo 2**31 - num_envs);
`reset(seed=s)` with a new `s` rebuilds the pool with it.
Checkpoints: envpool cannot snapshot its envs, so `state_dict()` is empty (as for `gym:`).
Video: envpool has no renderer; frames of image tasks are drawn from the observation (common.video).
"""

from __future__ import annotations

import difflib

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict

from common.envs.gym_adapter import _batch_flattenable, _flat_box, _flatten_batch, _image_layout, _to_chw

EXTRA = 'pip install -e ".[envpool]"'
PLAYGROUND_GROUPS = {"policy": "state", "critic": "privileged_state"}  # MuJoCo Playground's observation keys
ATARI_PRESETS = {"atari": dict(episodic_life=True, reward_clip=True),
                 "atari-eval": dict(episodic_life=False, reward_clip=False)}


def make_envpool_env(task: str, num_envs: int, device: str | torch.device = "cpu", seed: int = 0,
                     render_mode: str | None = None, preset: str | None = None, **envpool_kwargs) -> EnvpoolVecEnv:
    """`num_envs` envs of envpool's `task`, stepped in envpool's C++ threads, with tensors on `device`."""
    try:
        import envpool
    except ImportError:
        raise ValueError(f"envpool:{task} needs envpool: {EXTRA}") from None
    known = envpool.list_all_envs()
    if task not in known:
        close = difflib.get_close_matches(task, known, n=3)
        hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
        raise ValueError(f"envpool:{task}: envpool has no task {task!r}{hint}; envpool.list_all_envs() lists them")
    if preset is not None:
        if preset not in ATARI_PRESETS:
            raise ValueError(f"envpool:{task}: unknown preset {preset!r}; presets: {', '.join(ATARI_PRESETS)}")
        envpool_kwargs = {**ATARI_PRESETS[preset], **envpool_kwargs}
    if not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"envpool:{task}: num_envs must be a positive int, got {num_envs!r}")

    def make_pool(pool_seed: int):
        # envpool's seeds are int32 and env i gets seed + i: the run's 64-bit seeds are folded into that range.
        pool_seed = int(pool_seed) % (2**31 - num_envs)
        try:
            return envpool.make(task, env_type="gymnasium", num_envs=num_envs, seed=pool_seed, **envpool_kwargs)
        except (TypeError, KeyError, ValueError) as e:  # an option this task does not have
            raise ValueError(f"envpool:{task}: {e}") from None

    return EnvpoolVecEnv(task, make_pool, num_envs, device, seed, render_mode)


class EnvpoolVecEnv:
    """An envpool pool (same-step autoreset added) with the torch env contract's interface."""

    def __init__(self, task: str, make_pool, num_envs: int, device: str | torch.device, seed: int,
                 render_mode: str | None = None):
        self.env_id = f"envpool:{task}"
        self.num_envs = num_envs
        self.device = torch.device(device)
        self._make_pool, self._seed = make_pool, seed
        self.envs = make_pool(seed)
        self.max_episode_steps = getattr(self.envs.spec.config, "max_episode_steps", None)
        self.render_fps = 30
        self._needs_reset = True
        self._last_obs: dict[str, np.ndarray] | None = None  # for render(): the observations of now

        # Observation groups: {group: (key of envpool's Dict, or None for the whole observation, its space)}.
        space = self.envs.observation_space
        if isinstance(space, spaces.Dict) and set(PLAYGROUND_GROUPS.values()) <= set(space.spaces):
            self._groups = {group: (key, space[key]) for group, key in PLAYGROUND_GROUPS.items()}
        else:
            self._groups = {"policy": (None, space)}
        for group, (key, group_space) in self._groups.items():
            if _image_layout(group_space) is None and not _batch_flattenable(group_space):
                raise ValueError(f"{self.env_id}: observation space {group_space} cannot be flattened to a vector")
        self._image = _image_layout(space) if not isinstance(space, spaces.Dict) else None
        if self._image is not None:
            chw = _to_chw(self._image, np.zeros((1, *space.shape), np.uint8)).shape[1:]
            self.single_observation_space = spaces.Box(0, 255, chw, dtype=np.uint8)
        else:
            self.single_observation_space = _flat_box(self._groups["policy"][1])
        self.single_critic_observation_space = _flat_box(self._groups["critic"][1]) if "critic" in self._groups else None
        if render_mode is not None and self._image is None:
            raise ValueError(f"{self.env_id}: this adapter draws frames from image observations only; this task has "
                             f"vectors; run without --capture-video")

        act_space = self.envs.action_space
        if isinstance(act_space, spaces.Discrete):
            self.single_action_space = spaces.Discrete(int(act_space.n))
            self._action_dtype = np.int32
        elif isinstance(act_space, spaces.Box) and len(act_space.shape) == 1:
            self.single_action_space = spaces.Box(act_space.low.astype(np.float32), act_space.high.astype(np.float32),
                                                  dtype=np.float32)
            self._action_dtype = act_space.dtype
        else:
            raise ValueError(f"{self.env_id}: action space {act_space} is not supported; the scripts handle Box and Discrete")

    # -- numpy <-> torch ----------------------------------------------------------------------

    def _obs(self, obs) -> dict[str, np.ndarray]:
        """envpool's batch of observations -> {group: [n, C, H, W] uint8 or [n, D] float32} (numpy)."""
        if self._image is not None:
            return {"policy": _to_chw(self._image, np.asarray(obs))}
        out = {}
        for group, (key, space) in self._groups.items():
            part = obs if key is None else obs[key]
            n = len(next(iter(part.values()))) if isinstance(part, dict) else len(part)
            out[group] = _flatten_batch(space, part, n).astype(np.float32, copy=False)
        return out

    def _tensor(self, x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(x)).to(self.device)

    def _wrap(self, groups: dict[str, np.ndarray]) -> TensorDict:
        return TensorDict({k: self._tensor(v) for k, v in groups.items()}, batch_size=[self.num_envs], device=self.device)

    def _actions_to_numpy(self, action) -> np.ndarray:
        n = self.num_envs
        if isinstance(action, torch.Tensor):
            action = action.detach().cpu().numpy()
        action = np.asarray(action)
        if isinstance(self.single_action_space, spaces.Discrete):
            action = action.reshape(n) if action.shape == (n, 1) else action
            if action.shape != (n,):
                raise ValueError(f"{self.env_id}: expected a Discrete action batch of shape [{n}] or [{n}, 1], "
                                 f"got {list(action.shape)}")
        else:
            act_dim = int(self.single_action_space.shape[0])
            action = action.reshape(n, 1) if act_dim == 1 and action.shape == (n,) else action
            if action.shape != (n, act_dim):
                raise ValueError(f"{self.env_id}: expected a Box action batch of shape [{n}, {act_dim}], "
                                 f"got {list(action.shape)}")
        return action.astype(self._action_dtype, copy=False)

    # -- the contract -------------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> tuple[TensorDict, dict]:
        """Reset every env; a new `seed` rebuilds the pool with env i seeded `seed + i`."""
        if seed is not None and seed != self._seed:
            self.envs.close()
            self.envs, self._seed = self._make_pool(seed), seed
        obs, _ = self.envs.reset()
        self._last_obs = self._obs(obs)
        self._needs_reset = False
        return self._wrap(self._last_obs), {}

    def step(self, action) -> tuple[TensorDict, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """Step every env; finished envs restart in the same call (see the module docstring)."""
        if self._needs_reset:
            raise RuntimeError(f"{self.env_id}: call reset() before step()")
        obs, reward, terminated, truncated, info = self.envs.step(self._actions_to_numpy(action))
        if not np.array_equal(info["env_id"], np.arange(self.num_envs)):  # results in env order
            order = np.argsort(info["env_id"])
            obs = {k: v[order] for k, v in obs.items()} if isinstance(obs, dict) else obs[order]
            reward, terminated, truncated = reward[order], terminated[order], truncated[order]
        final_obs = self._obs(obs)
        done = np.asarray(terminated, dtype=bool) | np.asarray(truncated, dtype=bool)
        next_obs = final_obs
        if done.any():
            ids = np.flatnonzero(done)
            first_obs = self._obs(self.envs.reset(ids)[0])
            next_obs = {group: value.copy() for group, value in final_obs.items()}
            for group, value in next_obs.items():
                value[ids] = first_obs[group]
        self._last_obs = next_obs
        out = {"final_obs": self._wrap(final_obs), "log": {}}
        return (self._wrap(next_obs), self._tensor(np.asarray(reward, dtype=np.float32)),
                self._tensor(np.asarray(terminated, dtype=bool)), self._tensor(np.asarray(truncated, dtype=bool)), out)

    def render(self, env_ids: list[int]) -> list[np.ndarray]:
        """Frames of the envs `env_ids` drawn from their current observations (the newest stacked frame)."""
        from common.video import frames_from_image

        if self._last_obs is None:
            raise RuntimeError(f"{self.env_id}: call reset() before render()")
        kind = "rgb" if self._image == "hwc" else "stack"
        return frames_from_image(self._last_obs["policy"][env_ids], kind=kind)

    def state_dict(self) -> dict:
        """Empty: envpool cannot snapshot its envs, so a resumed run starts from freshly reset envs."""
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        if state_dict:
            raise ValueError(f"{self.env_id}: envpool envs have no restorable state; got keys {sorted(state_dict)}")

    def close(self) -> None:
        self.envs.close()

    def __repr__(self) -> str:
        return (f"EnvpoolVecEnv({self.env_id}, num_envs={self.num_envs}, device={self.device}, "
                f"max_episode_steps={self.max_episode_steps})")
