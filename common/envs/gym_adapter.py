"""Adapter: a gymnasium env id behind the torch env contract (`make_env("gym:<id>", ...)`).

    envs = make_env("gym:HalfCheetah-v5", num_envs=16, device="cuda", seed=1)
    envs = make_env("gym:CartPole-v1", 8, seed=1, vectorization="async", env_kwargs={"max_episode_steps": 200})

Gymnasium envs simulate on the CPU in numpy, one Python object per env, so this adapter is
for the long tail of tasks (MuJoCo, Box2D, third-party registrations), not for throughput:
`num_envs` in the tens, not thousands. It wraps `gymnasium.make_vec` in same-step autoreset
mode, so the true last observation of a finished episode comes back in the step that ends
it, as the contract asks. What it adds on top of gymnasium's vector env:

- all numpy <-> torch conversion happens in one place, one copy each way per step
  (common.envs.staging): the actions come to the host in one copy (into a pinned buffer reused
  every step when the device is CUDA); one host buffer holds the observations, final observations,
  rewards, done flags (and success flags) and crosses to the device in a single copy (on CUDA: a
  pinned buffer reused every step and a non-blocking copy; the flags are bytes of the same buffer,
  viewed as bool on the device, not converted there);
- observations are flattened to float32 vectors (`gymnasium.spaces.flatten`, so Dict, Tuple
  and Discrete observation spaces work too) and returned as `TensorDict({"policy": ...})`;
  an image observation (a uint8 Box of 2 or 3 dimensions) stays an image: uint8 [N, C, H, W],
  channel-first (a channel-last frame such as Atari's [210, 160, 3] is transposed once here);
- actions are torch tensors on the device (Discrete: [N] integers in 0..n-1, Box: [N, act_dim]);
- `info["final_obs"]` has the true last observation in the rows of finished envs and the
  returned observation in the others; `info["log"]` is empty.

Atari (`preset`): `make_env("gym:ALE/Pong-v5", n, preset="atari")` (or `--env-kwargs
'{"preset": "atari"}'`) builds every env with the standard preprocessing of Mnih et al. (2015) as
Machado et al. (2018) describe it: the emulator unskipped (`frameskip=1`), then gymnasium's
AtariPreprocessing (up to 30 no-op starts, the action repeated 4 frames, the max of the last two,
grayscale, resized to 84x84), an episodic life (a lost life ends the episode for the learner but not
the game, which goes on at the next reset), FIRE then UP pressed after every reset in games whose
action 1 is FIRE (Breakout waits for it), rewards clipped to their sign, and the last 4 frames
stacked: observations uint8 [N, 4, 84, 84]. `preset="atari-eval"` is the same without episodic lives
and clipping, for evaluation: a run trained with "atari" evaluates with it unless `--eval-env-kwargs`
names another preset. With either preset every step's info also has the game's own reward and end,
"game_reward" and "game_over" (GameScore, below the episodic life and the clipping, counts the steps
the wrappers take inside a reset too): the scripts log those as the returns, so training and
evaluation curves are game scores, as CleanRL's are. ALE's v5 ids keep their sticky actions
(repeat_action_probability 0.25); a game ends at ALE's 108,000 frames (`max_episode_steps` 27,000).
Needs the `[atari]` extra (ale-py, OpenCV for the resize).

Mirror symmetry (`ppo.py --symmetry`): a `data_augmentation(obs=None, actions=None)` callable of the
unwrapped env (rsl_rl's data_augmentation_func less the `env` argument, on this adapter's batched
torch tensors: a TensorDict of "policy" observations, the actions as the adapter takes them) becomes
the adapter's `data_augmentation`, as is. Its contract is every env kind's (common/symmetry.py): it
sees flat [B] rows, as rsl_rl gives them, and returns each batch followed by its mirror images.
It is the first sub-env's; with "async" the sub-envs live in other processes, so it is that of one
more instance built here, only when the first sub-env reports having one.

Seeding: env i is seeded `seed + i` at the first `reset()` (gymnasium's vector convention);
`reset(seed=s)` re-seeds env i with `s + i`.

Checkpoints: gymnasium envs cannot be snapshotted in general (their state lives in Python
objects, C simulators and numpy generators), so `state_dict()` is empty and a resumed run
continues from freshly reset envs. Resume is exact only for the built-in torch envs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector.utils import iterate
from tensordict import TensorDict

from common.envs.staging import StepStaging

VECTORIZATION_MODES = ("sync", "async")


MUJOCO_WARNINGS_SHOWN: set[str] = set()


@contextlib.contextmanager
def mujoco_warnings_once():
    """MuJoCo warns as it compiles each env's model (MuJoCo 4.0 about gymnasium's deprecated `settotalmass`): once per
    env, dozens of lines before the start line, each also appended to MUJOCO_LOG.TXT in the working directory. While
    the envs are made, each distinct warning is printed once per process (training and eval envs alike) and no log
    file is written; MuJoCo's own handler is back
    after (a warning while training, such as a NaN in the physics, is printed and logged as MuJoCo does)."""
    if importlib.util.find_spec("mujoco") is None:
        yield
        return
    import mujoco

    def warn(message: str) -> None:
        if message not in MUJOCO_WARNINGS_SHOWN:
            MUJOCO_WARNINGS_SHOWN.add(message)
            print(f"MuJoCo warning (once for all envs): {message.strip()}", file=sys.stderr)

    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(warn)
    try:
        yield
    finally:
        mujoco.set_mju_user_warning(previous)


def make_gym_env(
    env_id: str,
    num_envs: int,
    device: str | torch.device = "cpu",
    seed: int = 0,
    **kwargs,
) -> GymVecEnv:
    """`num_envs` copies of gymnasium's `env_id` stepped on the CPU, with tensors on `device`.

    Keyword arguments:
        vectorization: "sync" (default; all envs in this process, one after the other) or
            "async" (one subprocess per env; worth it when one step costs more than ~0.1 ms)
        env_kwargs: dict passed to the env constructor through `gymnasium.make_vec`,
            e.g. {"max_episode_steps": 200} or an env's own options
        vector_kwargs: dict passed to gymnasium's SyncVectorEnv/AsyncVectorEnv (e.g.
            {"context": "spawn"}); the autoreset mode is always same-step
        preset: "atari" (training) or "atari-eval" (evaluation): Atari's standard preprocessing
            (see the module docstring)
    """
    accepted = ("vectorization", "env_kwargs", "vector_kwargs", "render_mode", "preset")
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise TypeError(
            f"gym:{env_id}: unexpected keyword argument(s) {', '.join(unknown)}; accepted: {', '.join(accepted)} "
            f"(pass the env's own options in env_kwargs={{...}})"
        )
    return GymVecEnv(env_id, num_envs, device=device, seed=seed, **kwargs)


# ---------------------------------------------------------------------------------------
# Spaces
# ---------------------------------------------------------------------------------------


def _flat_box(space: spaces.Space) -> spaces.Box:
    """The float32 Box that `gymnasium.spaces.flatten` maps observations of `space` into."""
    flat = spaces.flatten_space(space)
    if not isinstance(flat, spaces.Box):  # e.g. Graph or Sequence spaces: no fixed size
        raise ValueError(f"observation space {space} cannot be flattened to a fixed-size vector")
    with np.errstate(over="ignore"):  # bounds beyond float32 (envpool's DeepMind Control says 1.8e308) become inf
        return spaces.Box(flat.low.astype(np.float32), flat.high.astype(np.float32), dtype=np.float32)


def _batch_flattenable(space: spaces.Space) -> bool:
    """Whether `_flatten_batch` handles `space` without going env by env."""
    if isinstance(space, (spaces.Box, spaces.Discrete, spaces.MultiBinary)):
        return True
    if isinstance(space, spaces.Dict):
        return all(_batch_flattenable(s) for s in space.spaces.values())
    if isinstance(space, spaces.Tuple):
        return all(_batch_flattenable(s) for s in space.spaces)
    return False


def _flatten_batch(space: spaces.Space, obs, n: int) -> np.ndarray:
    """A batch of `n` observations of `space` -> [n, flat_dim], in `gymnasium.spaces.flatten`'s layout."""
    if isinstance(space, (spaces.Box, spaces.MultiBinary)):
        return np.asarray(obs).reshape(n, -1)
    if isinstance(space, spaces.Discrete):  # one-hot, as gymnasium flattens a Discrete
        return np.eye(int(space.n), dtype=np.float32)[np.asarray(obs).reshape(n) - int(space.start)]
    if isinstance(space, spaces.Dict):  # gymnasium flattens a Dict in the order of its keys
        return np.concatenate([_flatten_batch(s, obs[k], n) for k, s in space.spaces.items()], axis=1)
    if isinstance(space, spaces.Tuple):
        return np.concatenate([_flatten_batch(s, o, n) for s, o in zip(space.spaces, obs)], axis=1)
    raise TypeError(f"no batched flatten for {space}")


def _image_layout(space: spaces.Space) -> str | None:
    """How an observation space is an image: "chw", "hwc" (channel-last), "hw" (one channel), or None."""
    if not (isinstance(space, spaces.Box) and space.dtype == np.uint8 and len(space.shape) in (2, 3)):
        return None
    if len(space.shape) == 2:
        return "hw"
    # Channel-last unless the first axis is the short one (a stack of frames, e.g. [4, 84, 84]).
    return "chw" if space.shape[0] <= 4 and space.shape[-1] > 4 else "hwc"


def _to_chw(layout: str, batch: np.ndarray) -> np.ndarray:
    """A batch of images [n, ...] in `layout` -> [n, C, H, W] (a view where it can be)."""
    if layout == "hw":
        return batch[:, None]
    return batch.transpose(0, 3, 1, 2) if layout == "hwc" else batch


# ---------------------------------------------------------------------------------------
# Atari preset
# ---------------------------------------------------------------------------------------
ATARI_PRESETS = {
    "atari": dict(episodic_life=True, clip_rewards=True),
    "atari-eval": dict(episodic_life=False, clip_rewards=False),
}
ATARI_EXTRA = 'pip install -e ".[atari]"'


class EpisodicLife(gym.Wrapper):
    """A lost life ends the episode (terminated) while the game goes on: the next reset continues the
    game with a no-op step instead of restarting it, unless the game is over."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        lost = 0 < lives < self.lives
        self.lives = lives
        return obs, reward, terminated or lost, truncated, info

    def reset(self, **kwargs):
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the no-op ended the game after all
                obs, info = self.env.reset(**kwargs)
        self.game_over = False
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE (then UP) after every reset, for games that stand still until FIRE (Breakout):
    else a policy that has not learnt to fire sees a frozen screen at each life (Mnih et al.'s
    preprocessing as in the baselines' wrappers). The presets wrap only games whose action 1 is FIRE."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


class GameScore(gym.Wrapper):
    """The game's own reward and end, seen below the wrappers that change them for the learner (a lost
    life ending the episode, clipped rewards), including the steps those wrappers take inside a reset
    (the no-op after a lost life, FIRE and UP): what `report()` gives since its last call, as CleanRL's
    episode statistics count under EpisodicLife and clipping."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.reward, self.over, self.after = 0.0, False, 0.0  # since the last report; `after`: reward of the next game

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.over:  # the game ended within a reset's steps and a new one is under way: its reward waits
            self.after += float(reward)
        else:
            self.reward += float(reward)
        self.over = self.over or terminated or truncated
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        # A new game: what the last one left unreported goes, unless it ended unreported (within a reset's steps).
        if not self.over:
            self.reward = 0.0
        self.after = 0.0
        return self.env.reset(**kwargs)

    def report(self) -> tuple[float, bool]:
        out = (self.reward, self.over)
        self.reward, self.over, self.after = self.after, False, 0.0
        return out


class ReportGame(gym.Wrapper):
    """Outermost: each step the agent takes puts the game's reward since the previous one and whether the
    game ended (from `score`, a GameScore below) in its info: "game_reward" and "game_over"."""

    def __init__(self, env: gym.Env, score: GameScore):
        super().__init__(env)
        self.score = score

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info["game_reward"], info["game_over"] = self.score.report()
        return obs, reward, terminated, truncated, info


def _atari_setup(env_id: str, preset: str, env_kwargs: dict) -> list:
    """The per-env wrappers of an Atari preset (the env itself is made with frameskip=1)."""
    if preset not in ATARI_PRESETS:
        raise ValueError(f"gym:{env_id}: unknown preset {preset!r}; presets: {', '.join(ATARI_PRESETS)}")
    if not env_id.startswith("ALE/"):
        raise ValueError(f"gym:{env_id}: preset {preset!r} is for ALE's Atari ids, e.g. gym:ALE/Pong-v5")
    try:  # (ale-py itself is registered by the caller, as for any ALE id)
        import cv2  # noqa: F401  (AtariPreprocessing resizes with OpenCV)
    except ImportError:
        raise ValueError(f"gym:{env_id}: preset {preset!r} needs OpenCV (cv2 is missing): {ATARI_EXTRA}") from None
    env_kwargs["frameskip"] = 1  # AtariPreprocessing repeats the action and max-pools the last two frames itself
    options = ATARI_PRESETS[preset]

    def preprocess(env: gym.Env) -> gym.Env:
        env = score = GameScore(
            gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True)
        )
        if options["episodic_life"]:
            env = EpisodicLife(env)
        meanings = env.unwrapped.get_action_meanings()
        if len(meanings) >= 3 and meanings[1] == "FIRE":
            env = FireReset(env)  # also after a lost life's no-op, as the game waits for FIRE again
        if options["clip_rewards"]:
            env = gym.wrappers.TransformReward(env, lambda r: float(np.sign(r)))
        return ReportGame(gym.wrappers.FrameStackObservation(env, 4), score)

    return [preprocess]


def _per_env(info: dict, key: str, n: int, default) -> np.ndarray:
    """A step's per-env value of `key` from a same-step-autoreset vector env's info: an env that finished has
    its step's info under "final_info" (its reset's info took the top level)."""
    out = np.full(n, default)
    for source in (info, info.get("final_info", {})):
        if key in source:
            out = np.where(source["_" + key], source[key], out)
    return out


# ---------------------------------------------------------------------------------------
# The adapter
# ---------------------------------------------------------------------------------------


class GymVecEnv:
    """A gymnasium vector env (same-step autoreset) with the torch env contract's interface."""

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        vectorization: str = "sync",
        env_kwargs: dict | None = None,
        vector_kwargs: dict | None = None,
        render_mode: str | None = None,
        preset: str | None = None,
    ):
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"gym:{env_id}: num_envs must be a positive int, got {num_envs!r}")
        if vectorization not in VECTORIZATION_MODES:
            raise ValueError(
                f"gym:{env_id}: vectorization must be one of {', '.join(VECTORIZATION_MODES)}, got {vectorization!r}"
            )
        env_kwargs = dict(env_kwargs or {})
        if render_mode is not None:
            env_kwargs["render_mode"] = render_mode
        vector_kwargs = dict(vector_kwargs or {})
        vector_kwargs["autoreset_mode"] = gym.vector.AutoresetMode.SAME_STEP
        vector_kwargs.setdefault("copy", False)  # observations are copied into our own buffer at once
        wrappers = _atari_setup(env_id, preset, env_kwargs) if preset is not None else None
        if (
            env_id.startswith("ALE/") and env_id not in gym.registry
        ):  # ale-py registers its ids with gymnasium when asked
            try:
                import ale_py

                gym.register_envs(ale_py)
                # each emulator prints ALE's banner at its creation, before the run's start line: errors only
                if hasattr(ale_py, "LoggerMode"):
                    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
            except ImportError:
                raise ValueError(f"gym:{env_id}: Atari needs ale-py: {ATARI_EXTRA}") from None
        try:
            with mujoco_warnings_once():
                self.envs = gym.make_vec(
                    env_id,
                    num_envs=num_envs,
                    vectorization_mode=vectorization,
                    vector_kwargs=vector_kwargs,
                    wrappers=wrappers,
                    **env_kwargs,
                )
        except gym.error.Error as e:  # unknown id, missing simulator (with gymnasium's install hint), ...
            raise ValueError(f"gym:{env_id}: {e}") from None

        self.env_id = f"gym:{env_id}"
        self.num_envs = num_envs
        self.device = torch.device(device)
        spec = self.envs.spec  # the registered spec (make_vec also resolves "module:Env-v0" ids)
        self.max_episode_steps: int | None = env_kwargs.get("max_episode_steps", spec.max_episode_steps)
        if preset is not None and self.max_episode_steps is None:  # ALE v5 ends a game at 108,000 frames: 4 a step
            self.max_episode_steps = env_kwargs.get("max_num_frames_per_episode", 108_000) // 4
        self._game = preset is not None  # the presets' steps report the game's reward and end (ReportGame)
        self._seed: int | None = seed  # used by the first reset() that gets no seed
        self.render_fps = self.envs.metadata.get("render_fps") or 30
        self._needs_reset = True

        # Observations: one float32 vector per env, or a uint8 image [C, H, W].
        self._obs_space = self.envs.single_observation_space
        self._image = _image_layout(self._obs_space)
        if self._image is not None:
            chw = _to_chw(self._image, np.zeros((1, *self._obs_space.shape), np.uint8)).shape[1:]
            self.single_observation_space = spaces.Box(0, 255, chw, dtype=np.uint8)
        else:
            self.single_observation_space = _flat_box(self._obs_space)
        self._obs_shape = tuple(self.single_observation_space.shape)
        self.obs_dim = int(np.prod(self._obs_shape))  # numbers per observation
        self._batch_flatten = _batch_flattenable(self._obs_space)

        # Actions: Discrete(n) (a `start` offset is added here) or a Box, flattened to 1-D.
        act_space = self.envs.single_action_space
        if isinstance(act_space, spaces.Discrete):
            self._action_start = int(act_space.start)
            self.single_action_space = spaces.Discrete(int(act_space.n))
        elif isinstance(act_space, spaces.Box):
            self._action_shape = act_space.shape
            self._action_dtype = act_space.dtype
            self.single_action_space = spaces.Box(
                act_space.low.reshape(-1), act_space.high.reshape(-1), dtype=act_space.dtype
            )
        else:
            self.envs.close()
            raise ValueError(
                f"{self.env_id}: action space {act_space} is not supported; the scripts handle Box and Discrete actions"
            )

        # One staging buffer for a step's results (common.envs.staging): one copy to the device per step.
        n, obs_dtype = num_envs, torch.uint8 if self._image is not None else torch.float32
        fields = {
            "obs": ((n, *self._obs_shape), obs_dtype),
            "final_obs": ((n, *self._obs_shape), obs_dtype),
            "reward": ((n,), torch.float32),
            "terminated": ((n,), torch.bool),
            "truncated": ((n,), torch.bool),
            "success": ((n,), torch.bool),
        }
        if self._game:
            fields.update(game_reward=((n,), torch.float32), game_over=((n,), torch.bool))
        self._staging = StepStaging(fields, self.device)

        # The env's own mirror, as is (see the module docstring); no attribute where it has none, so a
        # script's `getattr(envs, "data_augmentation", None)` tells.
        self._mirror_env: gym.Env | None = None  # "async": the instance whose mirror is used
        if isinstance(self.envs, gym.vector.SyncVectorEnv):
            mirror = getattr(self.envs.envs[0].unwrapped, "data_augmentation", None)
        elif self.envs.call("has_wrapper_attr", "data_augmentation")[0]:
            self._mirror_env = gym.make(env_id, **env_kwargs)
            mirror = getattr(self._mirror_env.unwrapped, "data_augmentation", None)
        else:
            mirror = None
        if callable(mirror):
            self.data_augmentation = mirror
        elif self._mirror_env is not None:  # a wrapper's attribute, not the env's own mirror
            self._mirror_env.close()
            self._mirror_env = None

    # -- numpy <-> torch, in one place -------------------------------------------------------

    def _flatten(self, obs) -> np.ndarray:
        """Batched observations from gymnasium -> [N, obs_dim], or images [N, C, H, W] (any dtype; cast on
        assignment)."""
        if self._image is not None:
            return _to_chw(self._image, np.asarray(obs))
        if self._batch_flatten:
            return _flatten_batch(self._obs_space, obs, self.num_envs)
        batched_space = self.envs.observation_space
        return np.stack([spaces.flatten(self._obs_space, o) for o in iterate(batched_space, obs)])

    def _actions_to_numpy(self, action) -> np.ndarray:
        n = self.num_envs
        if isinstance(action, torch.Tensor):  # a view of a reused buffer: gymnasium's envs copy actions within step
            action = self._staging.actions_to_host(action)
        action = np.asarray(action)
        if isinstance(self.single_action_space, spaces.Discrete):
            if action.shape == (n, 1):
                action = action.reshape(n)
            if action.shape != (n,):
                raise ValueError(
                    f"{self.env_id}: expected a Discrete action batch of shape [{n}] or [{n}, 1], got "
                    f"{list(action.shape)}"
                )
            action = action.astype(np.int64, copy=False)
            return action + self._action_start if self._action_start else action
        act_dim = int(self.single_action_space.shape[0])
        if act_dim == 1 and action.shape == (n,):
            action = action.reshape(n, 1)
        if action.shape != (n, act_dim):
            raise ValueError(
                f"{self.env_id}: expected a Box action batch of shape [{n}, {act_dim}], got {list(action.shape)}"
            )
        return action.astype(self._action_dtype, copy=False).reshape(n, *self._action_shape)

    def _wrap(self, x: torch.Tensor) -> TensorDict:
        return TensorDict({"policy": x}, batch_size=[self.num_envs], device=self.device)

    # -- the contract -----------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> tuple[TensorDict, dict]:
        """Reset every env; `seed` re-seeds env i with `seed + i` (the first reset uses the constructor's seed)."""
        if seed is None:
            seed, self._seed = self._seed, None
        obs, _ = self.envs.reset(seed=seed)
        host = self._staging.host()
        host["obs"][:] = self._flatten(obs)
        self._needs_reset = False
        return self._wrap(self._staging.to_device()["obs"]), {}

    def step(self, action) -> tuple[TensorDict, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """Step every env; finished envs restart in the same call (gymnasium's SAME_STEP autoreset).

        Returns (obs, reward float32 [N], terminated bool [N], truncated bool [N], info) on
        the device, with info["final_obs"] the true last observations of finished envs.
        """
        if self._needs_reset:
            raise RuntimeError(f"{self.env_id}: call reset() before step()")
        obs, reward, terminated, truncated, info = self.envs.step(self._actions_to_numpy(action))
        host = self._staging.host()
        h_obs, h_final, h_success = host["obs"], host["final_obs"], host["success"]
        h_obs[:] = self._flatten(obs)
        h_final[:] = h_obs  # the returned observation, then the true last one in the rows of finished envs
        done_mask = info.get("_final_obs")
        if done_mask is not None and done_mask.any():
            for i in np.flatnonzero(done_mask):
                last = info["final_obs"][i]
                h_final[i] = (
                    _to_chw(self._image, last[None])[0] if self._image else spaces.flatten(self._obs_space, last)
                )
        host["reward"][:] = reward
        host["terminated"][:] = terminated
        host["truncated"][:] = truncated
        # Per-env success at episode end (gymnasium's robotics envs say "is_success"): evaluation's success rate.
        final_info = info.get("final_info", {})
        success_key = next((key for key in ("success", "is_success") if key in final_info), None)
        if success_key is not None:
            reported = np.asarray(final_info.get("_" + success_key, True), dtype=bool)
            h_success[:] = np.asarray(final_info[success_key], dtype=bool) & reported
        else:
            h_success[:] = False
        if self._game:
            host["game_reward"][:] = _per_env(info, "game_reward", self.num_envs, 0.0)
            host["game_over"][:] = _per_env(info, "game_over", self.num_envs, False)
        dev = self._staging.to_device()
        out = {"final_obs": self._wrap(dev["final_obs"]), "log": {}}
        if success_key is not None:
            out["success"] = dev["success"]
        if self._game:  # the logged returns are the game's score: its reward, episodes that end with the game
            out["game_reward"], out["game_over"] = dev["game_reward"], dev["game_over"]
        return self._wrap(dev["obs"]), dev["reward"], dev["terminated"], dev["truncated"], out

    def render(self, env_ids: list[int]) -> list[np.ndarray]:
        """Frames of the envs `env_ids` (built with render_mode="rgb_array"), from gymnasium's renderers."""
        if isinstance(self.envs, gym.vector.SyncVectorEnv):
            return [self.envs.envs[i].render() for i in env_ids]
        frames = self.envs.call("render")  # async: every env renders
        return [frames[i] for i in env_ids]

    def state_dict(self) -> dict:
        """Empty: gymnasium envs cannot be snapshotted, so a resumed run starts from freshly reset envs."""
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        """Accepts only the empty dict that `state_dict()` returns (nothing to restore)."""
        if state_dict:
            raise ValueError(f"{self.env_id}: gymnasium envs have no restorable state; got keys {sorted(state_dict)}")

    def close(self) -> None:
        self.envs.close()
        if self._mirror_env is not None:
            self._mirror_env.close()

    def __repr__(self) -> str:
        return (
            f"GymVecEnv({self.env_id}, num_envs={self.num_envs}, device={self.device}, "
            f"max_episode_steps={self.max_episode_steps})"
        )
