"""Adapter: mjlab tasks behind the torch env contract (`make_env("mjlab:<task>", ...)`).

    envs = make_env("mjlab:Mjlab-Velocity-Flat-Unitree-G1", num_envs=4096, device="cuda", seed=1)
    envs = make_env("mjlab:Mjlab-Cartpole-Balance", 64, configure=lambda cfg: setattr(cfg, "episode_length_s", 10.0))

mjlab (https://github.com/mujocolab/mjlab) is Isaac Lab's manager-based API on MuJoCo Warp:
all envs of a task live in one batched simulator on the device, like the built-in envs here.
Its `ManagerBasedRlEnv` has Isaac Lab's shape, which is all `ManagerBasedEnvAdapter` below
relies on:

    obs_dict, extras = env.reset(seed=...)
    obs_dict, reward, terminated, truncated, extras = env.step(action)   # torch tensors
    obs_dict[group] -> [N, ...] tensor, or a dict of per-term tensors
    extras["log"]   -> episode statistics of the envs reset in this step (tensors or numbers)
    env.num_envs, env.max_episode_length, env.single_action_space.shape, env.cfg.is_finite_horizon

so an Isaac Lab env (ManagerBasedRLEnv, DirectRLEnv) can be wrapped by the same class, with
`final_obs="pre_step"` (Isaac Lab always resets inside `step`).

Observation groups map to the contract's keys: "policy" <- the task's "policy" group (Isaac
Lab's name) or "actor" (mjlab's); "critic" <- "critic" when the task has privileged critic
inputs. Groups whose terms are not concatenated are flattened and concatenated in term order.
Other groups (cameras, ...) are not passed on; `obs_groups` picks them explicitly.

Final observations (`final_obs`):
- "terminal" (default, mjlab only): the env runs with `cfg.auto_reset = False`, so `step`
  returns the true last observation of finished envs; the adapter then resets those envs
  with `env.reset(env_ids=...)`, which is the same sequence mjlab's own auto-reset runs.
  Cost: one extra forward/sense/observation pass of the simulator on steps where an episode
  ends, and a host sync to list the finished envs (mjlab's step already syncs for the same
  reason).
- "pre_step": mjlab's auto-reset; `info["final_obs"]` of a finished env is its observation
  *before* the final step, the approximation rsl_rl makes when it bootstraps time-outs with
  V(s_{T-1}) in place of V(s_T). Fastest, slightly biased on truncation.

Episodes that hit the time limit are `truncated` (bootstrapped) unless the task declares a
finite horizon (`cfg.is_finite_horizon`), in which case the time limit is terminal and the
adapter reports them as `terminated`, as mjlab's rsl_rl wrapper does.

Seeding and checkpoints: mjlab draws its randomness (resets, domain randomisation, noise)
from the process-wide torch/numpy/warp generators, so `seed` (at construction and in
`reset(seed=...)`) re-seeds those global generators, exactly as mjlab does. The simulator
and manager state cannot be snapshotted through mjlab's API, so `state_dict()` is empty and
a resumed run starts from freshly reset envs (resume is exact only for the built-in envs).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any, Callable

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict

FINAL_OBS_MODES = ("terminal", "pre_step")
POLICY_GROUPS = ("policy", "actor")  # Isaac Lab's name, then mjlab's
CRITIC_GROUPS = ("critic",)


def make_mjlab_env(
    task: str,
    num_envs: int,
    device: str | torch.device = "cpu",
    seed: int = 0,
    *,
    play: bool = False,
    configure: Callable[[Any], None] | None = None,
    final_obs: str = "terminal",
    obs_groups: dict[str, str] | None = None,
    clip_actions: float | None = None,
) -> ManagerBasedEnvAdapter:
    """Build mjlab's registered `task` with `num_envs` envs on `device`, wrapped in the contract.

    Keyword arguments:
        play: use the task's "play" config (for viewing a policy: typically no observation noise
            and practically endless episodes, so not for training or `ppo.py`'s evaluation)
        configure: called with the task's env config before the env is built, to change it
            (episode length, terrain, rewards, ...); num_envs, seed and auto_reset are set after it
        final_obs: "terminal" (true last observation, default) or "pre_step" (see the module doc)
        obs_groups: contract key -> task group, e.g. {"policy": "actor", "critic": "critic"};
            default: found by name (see POLICY_GROUPS, CRITIC_GROUPS)
        clip_actions: bound of the action space, so scripts clip actions to [-c, c]; default:
            the task's own rsl_rl setting (`clip_actions` of its registered runner config)
    """
    if final_obs not in FINAL_OBS_MODES:
        raise ValueError(f"mjlab:{task}: final_obs must be one of {', '.join(FINAL_OBS_MODES)}, got {final_obs!r}")
    if not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"mjlab:{task}: num_envs must be a positive int, got {num_envs!r}")
    try:
        import mjlab.tasks  # noqa: F401  (importing the package registers the tasks)
        from mjlab.envs import ManagerBasedRlEnv
        from mjlab.tasks.registry import list_tasks, load_env_cfg, load_rl_cfg
    except ImportError as e:
        raise ModuleNotFoundError(
            f"mjlab:{task} needs mjlab ({e}); install it with: pip install mjlab (see the README for a CPU-only torch)"
        ) from None

    try:
        from importlib.metadata import version

        installed = version("mjlab")
    except Exception:  # not installed as a distribution (a source checkout)
        installed = None
    if final_obs == "terminal" and installed is not None and not installed.startswith(CHECKED_MJLAB + "."):
        print(f"notice: mjlab {installed}: the true final observations were checked with mjlab {CHECKED_MJLAB}.x "
              f"(its reset(env_ids) must leave the other envs' observations alone); run tests/test_mjlab_adapter.py",
              flush=True)
    tasks = list_tasks()
    if task not in tasks:
        close = difflib.get_close_matches(task, tasks, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown mjlab task {task!r}{hint}; registered tasks: {', '.join(tasks)}")

    cfg = load_env_cfg(task, play=play)
    if configure is not None:
        configure(cfg)
    cfg.scene.num_envs = num_envs
    cfg.seed = int(seed)
    set_auto_reset(cfg, final_obs == "pre_step", task)
    if clip_actions is None:
        clip_actions = getattr(load_rl_cfg(task), "clip_actions", None)
    env = ManagerBasedRlEnv(cfg, device=str(torch.device(device)))
    return ManagerBasedEnvAdapter(
        env, f"mjlab:{task}", final_obs=final_obs, obs_groups=obs_groups, clip_actions=clip_actions
    )


def _flat_dim(space) -> int:
    """Size of one env's observation of a group: a box, or a dict of per-term boxes."""
    if hasattr(space, "spaces"):
        return sum(_flat_dim(s) for s in space.spaces.values())
    return int(math.prod(space.shape))


def _flat_box(space) -> spaces.Box:
    return spaces.Box(-math.inf, math.inf, shape=(_flat_dim(space),), dtype=np.float32)


def _find_group(available: list[str], names: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in available), None)


# mjlab releases whose behaviour "terminal" relies on, checked by tests/test_mjlab_adapter.py: the
# env config has an `auto_reset` field, and `reset(env_ids)` leaves the other envs' observations
# (and observation history) alone.
CHECKED_MJLAB = "1.6"


def set_auto_reset(cfg, auto_reset: bool, task: str) -> None:
    """Set mjlab's `cfg.auto_reset`, refusing a config that has no such field.

    The config is a plain dataclass: assigning an unknown field would create an attribute that
    mjlab never reads, its auto-reset would stay on, and "terminal" final observations would
    silently be the next episode's first ones.
    """
    names = {f.name for f in dataclasses.fields(cfg)} if dataclasses.is_dataclass(cfg) else set(vars(cfg))
    if "auto_reset" not in names:
        try:
            from importlib.metadata import version

            installed = f"mjlab {version('mjlab')}"
        except Exception:  # not installed as a distribution (a source checkout, a stand-in)
            installed = "this mjlab"
        if not auto_reset:
            raise ValueError(
                f"mjlab:{task}: {installed} has no cfg.auto_reset, so the true final observations cannot be taken; "
                f"install mjlab {CHECKED_MJLAB}.x (pip install 'mjlab=={CHECKED_MJLAB}.*') or pass "
                f"--env-kwargs '{{\"final_obs\": \"pre_step\"}}'"
            )
        return  # no field: mjlab always auto-resets, which is what "pre_step" asks for
    cfg.auto_reset = auto_reset


class ManagerBasedEnvAdapter:
    """Wraps an Isaac Lab-shaped manager-based env (mjlab's ManagerBasedRlEnv) in the torch env contract."""

    def __init__(
        self,
        env,
        env_id: str,
        final_obs: str = "terminal",
        obs_groups: dict[str, str] | None = None,
        clip_actions: float | None = None,
    ):
        if final_obs not in FINAL_OBS_MODES:
            raise ValueError(f"{env_id}: final_obs must be one of {', '.join(FINAL_OBS_MODES)}, got {final_obs!r}")
        if final_obs == "terminal" and getattr(env.cfg, "auto_reset", True):
            raise ValueError(
                f"{env_id}: final_obs='terminal' needs an env built with cfg.auto_reset=False "
                f"(only mjlab has it); use final_obs='pre_step'"
            )
        self.env = env
        self.env_id = env_id
        self.final_obs_mode = final_obs
        self.num_envs = int(env.num_envs)
        self.device = torch.device(env.device)
        self.max_episode_steps: int | None = int(env.max_episode_length)
        self._finite_horizon = bool(getattr(env.cfg, "is_finite_horizon", False))
        self._needs_reset = True
        self._last_obs: TensorDict | None = None

        # Which task groups feed "policy" and "critic".
        available = list(env.single_observation_space.spaces.keys())
        if obs_groups is None:
            obs_groups = {}
            if (g := _find_group(available, POLICY_GROUPS)) is not None:
                obs_groups["policy"] = g
            if (g := _find_group(available, CRITIC_GROUPS)) is not None:
                obs_groups["critic"] = g
        if "policy" not in obs_groups:
            raise ValueError(
                f"{env_id}: no policy observation group among {available}; pass obs_groups={{'policy': <group>}}"
            )
        missing = sorted(set(obs_groups.values()) - set(available))
        if missing:
            raise ValueError(f"{env_id}: observation group(s) {missing} not in the task's groups {available}")
        self.obs_groups = dict(obs_groups)

        group_spaces = env.single_observation_space.spaces
        self.single_observation_space = _flat_box(group_spaces[self.obs_groups["policy"]])
        self.single_critic_observation_space = (
            _flat_box(group_spaces[self.obs_groups["critic"]]) if "critic" in self.obs_groups else None
        )
        act_dim = int(math.prod(env.single_action_space.shape))
        bound = math.inf if clip_actions is None else float(clip_actions)
        self.single_action_space = spaces.Box(-bound, bound, shape=(act_dim,), dtype=np.float32)

    # -- conversions ---------------------------------------------------------------------

    def _group_tensor(self, value) -> torch.Tensor:
        n = self.num_envs
        if isinstance(value, dict):  # a group whose terms are not concatenated: flatten each, in term order
            return torch.cat([v.reshape(n, -1) for v in value.values()], dim=-1).float()
        return value.reshape(n, -1).float()

    def _convert_obs(self, obs: dict) -> TensorDict:
        return TensorDict(
            {key: self._group_tensor(obs[group]) for key, group in self.obs_groups.items()},
            batch_size=[self.num_envs], device=self.device,
        )

    def _log(self, extras: dict) -> dict[str, torch.Tensor]:
        """Scalar episode statistics from extras["log"], as 0-d float32 tensors on the device."""
        out = {}
        for key, value in (extras.get("log") or {}).items():
            if isinstance(value, torch.Tensor):
                if value.numel() == 1:
                    out[key] = value.detach().reshape(()).to(self.device, torch.float32)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                out[key] = torch.tensor(float(value), device=self.device)
        return out

    def _check_action(self, action) -> torch.Tensor:
        n, act_dim = self.num_envs, int(self.single_action_space.shape[0])
        action = torch.as_tensor(action, device=self.device, dtype=torch.float32)
        if act_dim == 1 and action.shape == (n,):
            action = action.reshape(n, 1)
        if action.shape != (n, act_dim):
            raise ValueError(f"{self.env_id}: expected an action batch of shape [{n}, {act_dim}], got {list(action.shape)}")
        return action

    # -- the contract -----------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> tuple[TensorDict, dict]:
        """Reset every env; `seed` re-seeds the simulator's (process-wide) generators first."""
        obs, _ = self.env.reset(seed=seed) if seed is not None else self.env.reset()
        self._last_obs = self._convert_obs(obs)
        self._needs_reset = False
        return self._last_obs, {}

    def step(self, action) -> tuple[TensorDict, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """Step every env; finished envs restart in the same call, `info["final_obs"]` as chosen by final_obs."""
        if self._needs_reset:
            raise RuntimeError(f"{self.env_id}: call reset() before step()")
        obs, reward, terminated, truncated, extras = self.env.step(self._check_action(action))
        # Copies: the simulator reuses its reward and done buffers in place on the next step.
        reward = reward.to(torch.float32, copy=True)
        terminated, truncated = terminated.to(torch.bool, copy=True), truncated.to(torch.bool, copy=True)
        if self._finite_horizon:  # the time limit ends the task: no bootstrap
            terminated = terminated | truncated
        done = terminated | truncated
        step_obs = self._convert_obs(obs)
        log = self._log(extras)

        if self.final_obs_mode == "terminal":
            final_obs = step_obs  # true last observations; the rows of running envs are their current ones
            env_ids = done.nonzero().squeeze(-1)
            if env_ids.numel() > 0:
                reset_obs, reset_extras = self.env.reset(env_ids=env_ids)
                log.update(self._log(reset_extras))  # episode statistics come from the reset
                fresh = self._convert_obs(reset_obs)
                next_obs = TensorDict(
                    {k: torch.where(done[:, None], fresh[k], step_obs[k]) for k in step_obs.keys()},
                    batch_size=[self.num_envs], device=self.device,
                )
            else:
                next_obs = step_obs
        else:  # mjlab already reset the finished envs; fall back on their pre-step observations
            next_obs = step_obs
            final_obs = TensorDict(
                {k: torch.where(done[:, None], self._last_obs[k], step_obs[k]) for k in step_obs.keys()},
                batch_size=[self.num_envs], device=self.device,
            )
        self._last_obs = next_obs
        return next_obs, reward, terminated, truncated, {"final_obs": final_obs, "log": log}

    def state_dict(self) -> dict:
        """Empty: the simulator and manager state cannot be snapshotted; a resumed run starts from reset envs."""
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        """Accepts only the empty dict that `state_dict()` returns (nothing to restore)."""
        if state_dict:
            raise ValueError(f"{self.env_id}: this env has no restorable state; got keys {sorted(state_dict)}")

    def close(self) -> None:
        self.env.close()

    def __repr__(self) -> str:
        critic = self.single_critic_observation_space
        return (
            f"ManagerBasedEnvAdapter({self.env_id}, num_envs={self.num_envs}, device={self.device}, "
            f"obs={self.single_observation_space.shape[0]}, critic_obs={critic.shape[0] if critic else None}, "
            f"act={self.single_action_space.shape[0]}, final_obs={self.final_obs_mode!r})"
        )
