"""A small CPU stand-in for mjlab 1.6's `ManagerBasedRlEnv`, for the adapter's tests without mjlab.

It keeps what the `mjlab:` adapter's final observations depend on, in mjlab's order: a step that
runs the physics, terminations and rewards, reads the finished envs back (`nonzero`, the
simulator's own host sync), resets them through `_reset_idx` when `cfg.auto_reset` is on, then
runs one forward pass, the command update (a per-env dt, zero for the reset envs), sensing and
the observation pass; `reset(env_ids)` runs the same pass scoped to `env_ids`. The rest is a toy:

- physics: a point on a line (`qpos`, `qvel`) pushed by the action; `derived` (the stand-in for
  MuJoCo's kinematics) is computed from the state only by `sim.forward()`, and each physics
  substep runs a forward pass *before* integrating (as `mj_step` does), so after the substeps
  it lags the state until the next forward; `sim.sense()` copies it into `sensor`;
- an episode ends by time limit (`episode_steps`) or when |qpos| exceeds `fall_at`; a reset
  draws the initial state from torch's global generator;
- a command per env with a timer (resampled when it runs out, from a counter, not a generator,
  so that envs stepped alike keep equal commands) and a state-dependent body-frame part;
- observation groups: "actor" (concatenated: derived + optional uniform noise from the global
  generator, the command, the episode step counter, the last action, and a history of the
  last 3 `derived` values), "critic" (terms not concatenated) and "camera" (not mapped);
- extras["log"] at resets: a 0-d tensor per reward term, an int from termination counts and a
  float from the command metrics (both read back with `.item()`, as mjlab's managers do).

Below the env: mjlab's task registry (`list_tasks`, `load_env_cfg`, `load_rl_cfg`) over "Fake-Point"
and two tasks whose rsl_rl runner config declares a mirror (`algorithm.symmetry_cfg.
data_augmentation_func`, as an Isaac Lab config does): "Fake-Point-Symmetric" (rsl_rl >= 3's form)
and "Fake-Point-Symmetric-By-Group" (rsl_rl 2's, named by a "module:name" string); and `install`,
which puts the stand-in in `sys.modules` as `mjlab` so that `make_env("mjlab:<task>")` builds it.
"""

from __future__ import annotations

import copy
import math
import sys
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
from gymnasium import spaces
from tensordict import TensorDict


@dataclass
class FakeEnvCfg:
    num_envs: int = 6
    episode_steps: int = 7
    fall_at: float = 0.25
    decimation: int = 2
    physics_dt: float = 0.05
    noise: float = 0.1  # amplitude of the actor's uniform observation noise (0: none)
    command_period: float = 0.25  # seconds between command resamples
    auto_reset: bool = True
    is_finite_horizon: bool = False
    seed: int | None = 0
    reuse_obs_buffers: bool = False  # write the actor group into one persistent tensor (as some simulators do)
    skip_post_reset_observations: bool = False  # a broken step: no observation pass after a reset
    scene: SimpleNamespace = field(default_factory=SimpleNamespace)


class FakeSim:
    def __init__(self, n: int, dt: float):
        self.dt = dt
        self.qpos, self.qvel = torch.zeros(n), torch.zeros(n)
        self.derived, self.sensor = torch.zeros(n), torch.zeros(n)
        self.forward_calls = 0

    def forward(self) -> None:
        self.forward_calls += 1
        self.derived.copy_(10.0 * self.qpos + self.qvel)

    def step(self, ctrl: torch.Tensor) -> None:
        self.forward()  # kinematics of the state before integration, as mj_step computes them
        self.qvel += ctrl * self.dt
        self.qpos += self.qvel * self.dt

    def sense(self) -> None:
        self.sensor.copy_(self.derived.abs())

    def reset(self, env_ids: torch.Tensor) -> None:
        self.qpos[env_ids] = (torch.rand(len(env_ids)) - 0.5) * 0.2
        self.qvel[env_ids] = 0.0


class History:
    """Last `length` frames per env, oldest first; a reset row is backfilled with its next frame."""

    def __init__(self, n: int, length: int):
        self.buf = torch.zeros(n, length)
        self.pushes = torch.zeros(n, dtype=torch.long)

    def append(self, frame: torch.Tensor) -> None:
        shifted = torch.cat([self.buf[:, 1:], frame[:, None]], dim=1)
        first = (self.pushes == 0)[:, None]
        self.buf = torch.where(first, frame[:, None].expand_as(self.buf), shifted)
        self.pushes += 1

    def backfill(self, frame: torch.Tensor, env_ids: torch.Tensor) -> None:
        self.buf[env_ids] = frame[env_ids, None]
        self.pushes[env_ids] = 1

    def reset(self, env_ids: torch.Tensor) -> None:
        self.buf[env_ids] = 0.0
        self.pushes[env_ids] = 0


class FakeObservationManager:
    def __init__(self, env: FakeManagerBasedRlEnv):
        self.env = env
        self.history = History(env.num_envs, 3)
        self._cache: dict | None = None
        self._actor_buffer = torch.zeros(env.num_envs, 7)

    def compute(self, update_history: bool = False, env_ids: torch.Tensor | None = None) -> dict:
        if not update_history and self._cache is not None:
            return self._cache
        env, n = self.env, self.env.num_envs
        derived = env.sim.derived.clone()
        noisy = derived + (torch.rand(n) * 2 - 1) * env.cfg.noise if env.cfg.noise else derived
        if env_ids is None:
            if update_history:
                self.history.append(derived)
        else:
            self.history.backfill(derived, env_ids)
        hist = self.history.buf.clone()
        command = env.command_manager.command_b.clone()
        steps = env.episode_length_buf.float()
        actor = torch.cat([noisy[:, None], command[:, None], steps[:, None], env.action_manager.action, hist], dim=1)
        if env.cfg.reuse_obs_buffers:
            actor = self._actor_buffer.copy_(actor)
        self._cache = {
            "actor": actor,
            "critic": {
                "derived": derived[:, None],
                "sensor": env.sim.sensor.clone()[:, None],
                "command": command[:, None],
                "history": hist,
            },
            "camera": torch.zeros(n, 2, 2),
        }
        return self._cache

    def reset(self, env_ids: torch.Tensor) -> dict:
        self._cache = None
        self.history.reset(env_ids)
        return {}


class FakeCommandManager:
    def __init__(self, env: FakeManagerBasedRlEnv):
        self.env = env
        n = env.num_envs
        self.time_left = torch.full((n,), env.cfg.command_period)
        self.resamples = torch.zeros(n)
        self.command = torch.zeros(n)
        self.command_b = torch.zeros(n)
        self.error = torch.zeros(n)
        self._ids = torch.arange(n, dtype=torch.float32)

    def _resample(self, mask: torch.Tensor) -> None:
        self.resamples += mask
        fresh = torch.sin(self._ids * 1.3 + self.resamples * 0.7)
        self.command = torch.where(mask, fresh, self.command)
        self.time_left = torch.where(mask, torch.full_like(self.time_left, self.env.cfg.command_period), self.time_left)

    def compute(self, dt, env_ids: torch.Tensor | None = None) -> None:
        self.error += (self.command_b - self.env.sim.derived).abs()  # metrics: always refreshed, as mjlab's
        if env_ids is None:
            self.time_left = self.time_left - dt
            self._resample(self.time_left <= 0)
        else:
            mask = torch.zeros_like(self.time_left, dtype=torch.bool)
            mask[env_ids] = True
            self.time_left = torch.where(mask, self.time_left - dt, self.time_left)
            self._resample(mask & (self.time_left <= 0))
        self.command_b = self.command - 0.01 * self.env.sim.derived  # a pure function of the state

    def reset(self, env_ids: torch.Tensor) -> dict:
        error = self.error[env_ids].mean().item()
        self.error[env_ids] = 0.0
        mask = torch.zeros_like(self.time_left, dtype=torch.bool)
        mask[env_ids] = True
        self._resample(mask)
        return {"Metrics/command/error": error}


class FakeRewardManager:
    def __init__(self, env: FakeManagerBasedRlEnv):
        self.env = env
        self.buf = torch.zeros(env.num_envs)  # rewritten in place every step, as mjlab's
        self.sums = torch.zeros(2, env.num_envs)

    def compute(self) -> torch.Tensor:
        alive, effort = torch.ones(self.env.num_envs), -(self.env.action_manager.action[:, 0] ** 2)
        self.buf.copy_(alive - self.env.sim.qpos**2 + 0.1 * effort)
        self.sums += torch.stack([alive, effort])
        return self.buf

    def reset(self, env_ids: torch.Tensor) -> dict:
        means = self.sums[:, env_ids].mean(dim=1)
        self.sums[:, env_ids] = 0.0
        return {"Episode_Reward/alive": means[0], "Episode_Reward/effort": means[1]}


class FakeTerminationManager:
    def __init__(self, env: FakeManagerBasedRlEnv):
        self.env = env
        self.terminated = torch.zeros(env.num_envs, dtype=torch.bool)  # rewritten in place
        self.time_outs = torch.zeros(env.num_envs, dtype=torch.bool)

    def compute(self) -> torch.Tensor:
        self.terminated.copy_(self.env.sim.qpos.abs() > self.env.cfg.fall_at)
        self.time_outs.copy_(self.env.episode_length_buf >= self.env.max_episode_length)
        return self.terminated | self.time_outs

    def reset(self, env_ids: torch.Tensor) -> dict:
        return {"Episode_Termination/time_out": int(self.time_outs[env_ids].sum().item())}


class FakeActionManager:
    def __init__(self, env: FakeManagerBasedRlEnv):
        self.action = torch.zeros(env.num_envs, 1)

    def process_action(self, action: torch.Tensor) -> None:
        self.action = action.clone()

    def reset(self, env_ids: torch.Tensor) -> dict:
        self.action[env_ids] = 0.0
        return {}


class FakeManagerBasedRlEnv:
    """mjlab 1.6's step/reset structure over the toy managers above (see the module docstring)."""

    def __init__(self, cfg: FakeEnvCfg, device: str = "cpu"):
        assert torch.device(device).type == "cpu"
        # mjlab's builder sets cfg.scene.num_envs; a config made here says cfg.num_envs
        cfg.num_envs = cfg.scene.num_envs = getattr(cfg.scene, "num_envs", cfg.num_envs)
        self.cfg = cfg
        self.device = "cpu"
        if cfg.seed is not None:
            torch.manual_seed(cfg.seed)
        n = cfg.num_envs
        self.sim = FakeSim(n, cfg.physics_dt)
        self.episode_length_buf = torch.zeros(n, dtype=torch.long)
        self.extras: dict = {}
        self._manual_reset_pending = torch.zeros(n, dtype=torch.bool)
        self._command_dt = torch.zeros(n)
        self.action_manager = FakeActionManager(self)
        self.command_manager = FakeCommandManager(self)
        self.observation_manager = FakeObservationManager(self)
        self.reward_manager = FakeRewardManager(self)
        self.termination_manager = FakeTerminationManager(self)
        box = lambda *shape: spaces.Box(-math.inf, math.inf, shape=shape)  # noqa: E731
        self.single_observation_space = spaces.Dict(
            {
                "actor": box(7),
                "critic": spaces.Dict({"derived": box(1), "sensor": box(1), "command": box(1), "history": box(3)}),
                "camera": box(2, 2),
            }
        )
        self.single_action_space = box(1)
        self.closed = False

    @property
    def num_envs(self) -> int:
        return self.cfg.num_envs

    @property
    def unwrapped(self) -> FakeManagerBasedRlEnv:
        return self  # as mjlab's env: the end of a wrapper chain

    @property
    def step_dt(self) -> float:
        return self.cfg.physics_dt * self.cfg.decimation

    @property
    def max_episode_length(self) -> int:
        return self.cfg.episode_steps

    def _reset_idx(self, env_ids: torch.Tensor) -> None:
        self.sim.reset(env_ids)
        log = self.extras["log"]
        for manager in (
            self.observation_manager,
            self.action_manager,
            self.reward_manager,
            self.command_manager,
            self.termination_manager,
        ):
            log.update(manager.reset(env_ids))
        self.episode_length_buf[env_ids] = 0
        self._manual_reset_pending[env_ids] = False

    def reset(self, *, seed: int | None = None, env_ids: torch.Tensor | None = None):
        if env_ids is None:
            env_ids = torch.arange(self.num_envs)
        if seed is not None:
            self.last_seed = seed
            torch.manual_seed(seed)
        self.extras["log"] = {}
        self._reset_idx(env_ids)
        self.sim.forward()
        self.command_manager.compute(dt=0.0, env_ids=env_ids)
        self.sim.sense()
        self.obs_buf = self.observation_manager.compute(update_history=True, env_ids=env_ids)
        return self.obs_buf, self.extras

    def step(self, action: torch.Tensor):
        if not self.cfg.auto_reset and bool(self._manual_reset_pending.any()):
            raise RuntimeError("reset the finished envs with reset(env_ids=...) before the next step")
        self.extras["log"] = {}
        self.action_manager.process_action(action)
        for _ in range(self.cfg.decimation):
            self.sim.step(self.action_manager.action[:, 0])
        self.episode_length_buf += 1
        self.reset_buf = self.termination_manager.compute()
        self.reward_buf = self.reward_manager.compute()
        reset_env_ids = self.reset_buf.nonzero().squeeze(-1)  # the simulator's own host sync, as in mjlab
        resets = len(reset_env_ids) > 0
        if self.cfg.auto_reset and resets:
            self._reset_idx(reset_env_ids)
        self.sim.forward()
        if self.cfg.auto_reset and resets:
            self._command_dt.fill_(self.step_dt)
            self._command_dt[reset_env_ids] = 0.0
            self.command_manager.compute(dt=self._command_dt)
        else:
            self.command_manager.compute(dt=self.step_dt)
        self.sim.sense()
        if not (self.cfg.skip_post_reset_observations and resets):
            self.obs_buf = self.observation_manager.compute(update_history=True)
        if not self.cfg.auto_reset and resets:
            self._manual_reset_pending[reset_env_ids] = True
        return (
            self.obs_buf,
            self.reward_buf,
            self.termination_manager.terminated,
            self.termination_manager.time_outs,
            self.extras,
        )

    def close(self) -> None:
        self.closed = True


# ---------------------------------------------------------------------------------------------
# The mirror of the toy and the task registry
# ---------------------------------------------------------------------------------------------
# The point's mirror x -> -x negates every odd quantity: the kinematics, command, action and history
# columns of "actor" (its step counter stays), and the critic's terms but |derived| ("sensor").
# Rewards, falls and the reset distribution are even in x; the commands, drawn from a counter, are
# not mirror images of each other: a mirror for the contract, not one that commutes with the toy.
ACTOR_SIGNS = (-1.0, -1.0, 1.0, -1.0, -1.0, -1.0, -1.0)
CRITIC_SIGNS = {"derived": -1.0, "sensor": 1.0, "command": -1.0, "history": -1.0}


def mirror_point(env, obs: TensorDict | None = None, actions: torch.Tensor | None = None):
    """rsl_rl >= 3's data_augmentation_func for the point: the task's groups ("actor" concatenated, "critic" a
    TensorDict of its terms), each batch followed by its mirror image. Keeps the env it was called with."""
    mirror_point.last_env = env
    assert env.unwrapped.single_observation_space["actor"].shape == (len(ACTOR_SIGNS),)
    obs_aug = actions_aug = None
    if obs is not None:
        assert obs.batch_dims == 1, "rsl_rl gives the function flat minibatches"
        image = obs.clone()
        if "actor" in obs.keys():
            image["actor"] = obs["actor"] * torch.tensor(ACTOR_SIGNS, dtype=obs["actor"].dtype)
        if "critic" in obs.keys():
            image["critic"] = TensorDict(
                {t: v * CRITIC_SIGNS[t] for t, v in obs["critic"].items()}, batch_size=obs.batch_size
            )
        obs_aug = torch.cat([obs, image], dim=0)
    if actions is not None:
        assert actions.dim() == 2
        actions_aug = torch.cat([actions, -actions], dim=0)
    return obs_aug, actions_aug


mirror_point.last_env = None


def mirror_point_by_group(
    env, obs: torch.Tensor | None = None, actions: torch.Tensor | None = None, obs_type: str = "policy"
):
    """The same mirror in rsl_rl 2's form (older Isaac Lab): one flat group tensor at a time, named by obs_type
    ("critic": the terms flattened in their order)."""
    signs = {
        "policy": torch.tensor(ACTOR_SIGNS),
        "critic": torch.tensor(
            [CRITIC_SIGNS["derived"], CRITIC_SIGNS["sensor"], CRITIC_SIGNS["command"]] + [CRITIC_SIGNS["history"]] * 3
        ),
    }[obs_type]
    obs_aug = None if obs is None else torch.cat([obs, obs * signs], dim=0)
    actions_aug = None if actions is None else torch.cat([actions, -actions], dim=0)
    return obs_aug, actions_aug


@dataclass
class FakeSymmetryCfg:
    """Isaac Lab's RslRlSymmetryCfg."""

    use_data_augmentation: bool = False
    use_mirror_loss: bool = False
    data_augmentation_func: Any = None
    mirror_loss_coeff: float = 0.0


@dataclass
class FakeAlgorithmCfg:
    """mjlab 1.6's RslRlPpoAlgorithmCfg, its fields None where a task's config leaves them out."""

    symmetry_cfg: FakeSymmetryCfg | None = None
    learning_rate: float | None = None
    schedule: str | None = None
    desired_kl: float | None = None
    num_learning_epochs: int | None = None
    num_mini_batches: int | None = None
    clip_param: float | None = None
    gamma: float | None = None
    lam: float | None = None
    value_loss_coef: float | None = None
    entropy_coef: float | None = None
    max_grad_norm: float | None = None
    use_clipped_value_loss: bool | None = None
    normalize_advantage_per_mini_batch: bool | None = None
    optimizer: str = "adam"
    rnd_cfg: dict | None = None  # Isaac Lab's RslRlRndCfg as rsl_rl takes it (mjlab 1.6's config has no such field)


@dataclass
class FakeModelCfg:
    """mjlab 1.6's RslRlModelCfg (rsl_rl 5: the actor and the critic each a model config)."""

    hidden_dims: tuple[int, ...] = (128, 128, 128)
    activation: str = "elu"
    obs_normalization: bool = False
    distribution_cfg: dict | None = None
    rnn_type: str | None = None
    cnn_cfg: dict | None = None
    rnn_hidden_dim: int = 256
    rnn_num_layers: int = 1
    class_name: str = "MLPModel"


@dataclass
class FakeRunnerCfg:
    """mjlab 1.6's RslRlOnPolicyRunnerCfg, its fields None where a task's config leaves them out."""

    clip_actions: float | None = None
    algorithm: FakeAlgorithmCfg = field(default_factory=FakeAlgorithmCfg)
    num_steps_per_env: int | None = None
    actor: FakeModelCfg | None = None
    critic: FakeModelCfg | None = None
    seed: int | None = None
    max_iterations: int | None = None
    obs_groups: dict | None = None
    save_interval: int | None = None


# A task's own PPO config, as mjlab 1.6 registers one (the G1 velocity task's shape): every field ppo.py has a flag
# for set away from ppo.py's defaults, critic dims that differ from the actor's and an optimizer ppo.py lacks (two
# fields it cannot take)
TUNED = FakeRunnerCfg(
    num_steps_per_env=12,
    actor=FakeModelCfg(
        hidden_dims=(32, 16),
        activation="elu",
        obs_normalization=True,
        distribution_cfg={"class_name": "GaussianDistribution", "init_std": 0.5, "std_type": "scalar"},
    ),
    critic=FakeModelCfg(hidden_dims=(64, 32), activation="elu", obs_normalization=True),
    algorithm=FakeAlgorithmCfg(
        learning_rate=5e-4,
        schedule="fixed",
        desired_kl=0.02,
        num_learning_epochs=3,
        num_mini_batches=2,
        clip_param=0.3,
        gamma=0.98,
        lam=0.9,
        value_loss_coef=0.7,
        entropy_coef=0.002,
        max_grad_norm=0.8,
        use_clipped_value_loss=False,
        normalize_advantage_per_mini_batch=False,
        optimizer="adamw",
    ),
)


TASKS = {
    "Fake-Point": (FakeEnvCfg(), FakeRunnerCfg()),
    "Fake-Point-Tuned": (FakeEnvCfg(), TUNED),
    "Fake-Point-Symmetric": (
        FakeEnvCfg(),
        FakeRunnerCfg(
            algorithm=FakeAlgorithmCfg(FakeSymmetryCfg(use_data_augmentation=True, data_augmentation_func=mirror_point))
        ),
    ),
    "Fake-Point-Symmetric-By-Group": (
        FakeEnvCfg(),
        FakeRunnerCfg(
            algorithm=FakeAlgorithmCfg(
                FakeSymmetryCfg(use_data_augmentation=True, data_augmentation_func=f"{__name__}:mirror_point_by_group")
            )
        ),
    ),
}


def list_tasks() -> list[str]:
    return sorted(TASKS)


def load_env_cfg(task: str, play: bool = False) -> FakeEnvCfg:
    return copy.deepcopy(TASKS[task][0])  # a copy, as mjlab's registry gives


def load_rl_cfg(task: str) -> FakeRunnerCfg:
    return copy.deepcopy(TASKS[task][1])


def install(monkeypatch) -> None:
    """This module as `mjlab` (its `tasks`, `tasks.registry` and `envs`) for the rest of the test."""
    names = {
        "mjlab": ModuleType("mjlab"),
        "mjlab.tasks": ModuleType("mjlab.tasks"),
        "mjlab.tasks.registry": ModuleType("mjlab.tasks.registry"),
        "mjlab.envs": ModuleType("mjlab.envs"),
    }
    registry = names["mjlab.tasks.registry"]
    registry.list_tasks, registry.load_env_cfg, registry.load_rl_cfg = list_tasks, load_env_cfg, load_rl_cfg
    names["mjlab.envs"].ManagerBasedRlEnv = FakeManagerBasedRlEnv
    names["mjlab"].tasks, names["mjlab"].envs, names["mjlab.tasks"].registry = (
        names["mjlab.tasks"],
        names["mjlab.envs"],
        registry,
    )
    for name, module in names.items():
        monkeypatch.setitem(sys.modules, name, module)
