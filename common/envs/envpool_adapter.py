"""Adapter: an envpool task behind the torch env contract (`make_env("envpool:<task>", ...)`).

    envs = make_env("envpool:Pong-v5", num_envs=64, device="cuda", seed=1, preset="atari")
    envs = make_env("envpool:HalfCheetah-v5", num_envs=64, seed=1)

envpool (Weng et al., 2022) steps a batch of envs in C++ threads: Atari, MuJoCo, DeepMind Control,
MuJoCo Playground and classic control tasks all come through this one adapter. What it adds:

- same-step autoreset: envpool restarts a finished env at its *next* step call, whatever the action;
  here the finished envs get that call within the step that ends them (a step of those envs alone), so
  `obs` holds the first observation of their next episode and `info["final_obs"]` their true last one,
  as the contract asks. (Not envpool's `reset(env_ids)`: that starts a new Atari game where the
  training preset's lost life ended the episode, so no game would get past its first life);
- image observations (Atari: uint8 [N, 4, 84, 84], channel-first already) stay uint8 images in the
  `policy` group; vector ones (a Box, or a Dict of Boxes as DeepMind Control's, flattened in key
  order) become float32 [N, D]; MuJoCo Playground's Dict of `state` and `privileged_state` becomes
  the groups `policy` and `critic` (the privileged inputs of an asymmetric critic, not the actor's);
- tensors on `device`: a step's results cross in one copy (common.envs.staging: one host buffer, pinned
  and non-blocking on CUDA), the actions come to the host in one.

Atari (`preset`): envpool's Atari defaults already are the standard preprocessing (up to 30 no-op
starts, action repeat 4 with the max of the last two frames, grayscale 84x84, 4 frames stacked, FIRE
at reset where the game needs it, no sticky actions, episodes cut at 108,000 frames).
`preset="atari"` adds what training uses (episodic lives, rewards clipped to their sign) and
`preset="atari-eval"` turns both off, for evaluation (a run trained with "atari" evaluates with it unless
`--eval-env-kwargs` names another preset). With either, info has the game's own reward and end
("game_reward": envpool's unclipped info["reward"], "game_over": its info["terminated"] or the time limit),
which the scripts log as the returns: game scores, as CleanRL's envpool scripts log them.
Other keyword arguments go to `envpool.make` (e.g. `num_threads`, `repeat_action_probability`).

Seeding: env i is seeded `seed + i` by envpool (int32 seeds: `seed` is taken modulo 2**31 - num_envs);
`reset(seed=s)` with a new `s` rebuilds the pool with it.
Checkpoints: envpool cannot snapshot its envs, so `state_dict()` is empty (as for `gym:`).
Video: envpool has no renderer; frames of image tasks are drawn from the observation (common.video).
Mirror symmetry: envpool's tasks declare no mirror, so the adapter has no `data_augmentation` (common/symmetry.py's
contract, every env kind's) and `--symmetry` stops the run in one line.
"""

from __future__ import annotations

import difflib

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict

from common.envs.gym_adapter import _batch_flattenable, _flat_box, _flatten_batch, _image_layout, _to_chw
from common.envs.staging import StepStaging

EXTRA = 'pip install -e ".[envpool]"'
PLAYGROUND_GROUPS = {"policy": "state", "critic": "privileged_state"}  # MuJoCo Playground's observation keys
ATARI_PRESETS = {
    "atari": dict(episodic_life=True, reward_clip=True),
    "atari-eval": dict(episodic_life=False, reward_clip=False),
}


def make_envpool_env(
    task: str,
    num_envs: int,
    device: str | torch.device = "cpu",
    seed: int = 0,
    render_mode: str | None = None,
    preset: str | None = None,
    **envpool_kwargs,
) -> EnvpoolVecEnv:
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

    return EnvpoolVecEnv(task, make_pool, num_envs, device, seed, render_mode, game=preset is not None)


def _in_env_order(obs, reward, terminated, truncated, info):
    """A step's results sorted by env id (envpool returns them in the order the envs finished)."""
    order = np.argsort(info["env_id"])
    if np.array_equal(order, np.arange(len(order))):
        return obs, reward, terminated, truncated, info
    obs = {k: v[order] for k, v in obs.items()} if isinstance(obs, dict) else obs[order]
    info = {k: v[order] if isinstance(v, np.ndarray) and len(v) == len(order) else v for k, v in info.items()}
    return obs, reward[order], terminated[order], truncated[order], info


class EnvpoolVecEnv:
    """An envpool pool (same-step autoreset added) with the torch env contract's interface."""

    def __init__(
        self,
        task: str,
        make_pool,
        num_envs: int,
        device: str | torch.device,
        seed: int,
        render_mode: str | None = None,
        game: bool = False,
    ):
        self.env_id = f"envpool:{task}"
        self.num_envs = num_envs
        self.device = torch.device(device)
        self._make_pool, self._seed = make_pool, seed
        self.envs = make_pool(seed)
        self.max_episode_steps = getattr(self.envs.spec.config, "max_episode_steps", None)
        self.render_fps = 30
        self._needs_reset = True
        self._last_obs: dict[str, np.ndarray] | None = None  # for render(): the observations of now
        self._game = game  # an Atari preset: info gets the game's reward and end

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
        self.single_critic_observation_space = (
            _flat_box(self._groups["critic"][1]) if "critic" in self._groups else None
        )
        if render_mode is not None and self._image is None:
            raise ValueError(
                f"{self.env_id}: this adapter draws frames from image observations only; this task has "
                f"vectors; run without --capture-video"
            )

        act_space = self.envs.action_space
        if isinstance(act_space, spaces.Discrete):
            self.single_action_space = spaces.Discrete(int(act_space.n))
            self._action_dtype = np.int32
        elif isinstance(act_space, spaces.Box) and len(act_space.shape) == 1:
            self.single_action_space = spaces.Box(
                act_space.low.astype(np.float32), act_space.high.astype(np.float32), dtype=np.float32
            )
            self._action_dtype = act_space.dtype
        else:
            raise ValueError(
                f"{self.env_id}: action space {act_space} is not supported; the scripts handle Box and Discrete"
            )
        self._noop = np.zeros(
            (num_envs, *self.single_action_space.shape), dtype=self._action_dtype
        )  # restarts' actions

        # One staging buffer for a step's results: one copy to the device per step.
        n, fields = num_envs, {}
        for group in self._groups:
            space = self.single_observation_space if group == "policy" else self.single_critic_observation_space
            dtype = torch.uint8 if group == "policy" and self._image is not None else torch.float32
            fields[f"obs/{group}"] = fields[f"final_obs/{group}"] = ((n, *space.shape), dtype)
        fields.update(reward=((n,), torch.float32), terminated=((n,), torch.bool), truncated=((n,), torch.bool))
        if game:
            fields.update(game_reward=((n,), torch.float32), game_over=((n,), torch.bool))
        self._staging = StepStaging(fields, self.device)

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

    def _wrap(self, dev: dict[str, torch.Tensor], part: str) -> TensorDict:
        """The groups of `part` ("obs" or "final_obs") of the staged tensors as a TensorDict."""
        groups = {group: dev[f"{part}/{group}"] for group in self._groups}
        return TensorDict(groups, batch_size=[self.num_envs], device=self.device)

    def _actions_to_numpy(self, action) -> np.ndarray:
        n = self.num_envs
        if isinstance(action, torch.Tensor):
            action = self._staging.actions_to_host(action)
        action = np.asarray(action)
        if isinstance(self.single_action_space, spaces.Discrete):
            action = action.reshape(n) if action.shape == (n, 1) else action
            if action.shape != (n,):
                raise ValueError(
                    f"{self.env_id}: expected a Discrete action batch of shape [{n}] or [{n}, 1], "
                    f"got {list(action.shape)}"
                )
        else:
            act_dim = int(self.single_action_space.shape[0])
            action = action.reshape(n, 1) if act_dim == 1 and action.shape == (n,) else action
            if action.shape != (n, act_dim):
                raise ValueError(
                    f"{self.env_id}: expected a Box action batch of shape [{n}, {act_dim}], got {list(action.shape)}"
                )
        return action.astype(self._action_dtype, copy=False)

    # -- the contract -------------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> tuple[TensorDict, dict]:
        """Reset every env; a new `seed` rebuilds the pool with env i seeded `seed + i`."""
        if seed is not None and seed != self._seed:
            self.envs.close()
            self.envs, self._seed = self._make_pool(seed), seed
        obs, _ = self.envs.reset()
        host = self._staging.host()
        for group, value in self._obs(obs).items():
            host[f"obs/{group}"][:] = value
        self._last_obs = {group: host[f"obs/{group}"] for group in self._groups}
        self._needs_reset = False
        return self._wrap(self._staging.to_device(), "obs"), {}

    def step(self, action) -> tuple[TensorDict, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """Step every env; finished envs restart in the same call (see the module docstring)."""
        if self._needs_reset:
            raise RuntimeError(f"{self.env_id}: call reset() before step()")
        obs, reward, terminated, truncated, info = self.envs.step(self._actions_to_numpy(action))
        obs, reward, terminated, truncated, info = _in_env_order(obs, reward, terminated, truncated, info)
        host = self._staging.host()
        for group, value in self._obs(obs).items():
            host[f"final_obs/{group}"][:] = value
            host[f"obs/{group}"][:] = value
        host["reward"][:] = reward
        host["terminated"][:] = terminated
        host["truncated"][:] = truncated
        if self._game:  # envpool's info: the unclipped reward, and whether the game (not only a life) is over
            host["game_reward"][:] = info["reward"]
            host["game_over"][:] = np.asarray(info["terminated"], dtype=bool) | host["truncated"]
        done = host["terminated"] | host["truncated"]
        if done.any():  # envpool restarts a finished env at its next step, whatever the action: that step, now
            ids = np.flatnonzero(done).astype(np.int32)
            first = _in_env_order(*self.envs.step(self._noop[: len(ids)], ids))[0]
            for group, value in self._obs(first).items():
                host[f"obs/{group}"][ids] = value
        self._last_obs = {group: host[f"obs/{group}"] for group in self._groups}
        dev = self._staging.to_device()
        out = {"final_obs": self._wrap(dev, "final_obs"), "log": {}}
        if self._game:
            out["game_reward"], out["game_over"] = dev["game_reward"], dev["game_over"]
        return self._wrap(dev, "obs"), dev["reward"], dev["terminated"], dev["truncated"], out

    def render(self, env_ids: list[int]) -> list[np.ndarray]:
        """Frames of the envs `env_ids` drawn from their current observations (the newest stacked frame)."""
        from common.envs.frames import frames_from_image

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
        return (
            f"EnvpoolVecEnv({self.env_id}, num_envs={self.num_envs}, device={self.device}, "
            f"max_episode_steps={self.max_episode_steps})"
        )
