"""Gymnasium's classic-control tasks as batched torch envs.

Each class reproduces gymnasium 1.x's env of the same id: dynamics, reward, termination,
observation, initial-state ranges, spaces and registered time limit. `env.state` uses
gymnasium's state layout, so a row can be copied from / compared with
`gymnasium.make(id).unwrapped.state`.

The arithmetic deliberately mirrors gymnasium's expressions term by term (including
constants folded in the same order, and the odd multiplication by 1.0), so that in
float64 the two agree to the last bit up to differences in the sin/cos implementations;
please keep that property when editing.

Partial observability: CartPole-v1 and Pendulum-v1 take `mask_velocity=True` (not a gymnasium
option), which leaves the velocities out of the observation: CartPole observes the cart
position and the pole angle, Pendulum the cosine and sine of the angle. The dynamics, rewards
and `env.state` are unchanged; a policy must infer the velocities from its observation history.
The full observation (the unmasked task's) is the privileged `critic` group
(`single_critic_observation_space`): for an asymmetric critic, and for a teacher trained on the
unmasked task (algos/distill.py).

Mirror symmetry: CartPole-v1, Pendulum-v1 and Acrobot-v1 (masked or not) look the same in a mirror, left
and right swapped, and say so with `data_augmentation` (see MirrorSymmetric). MountainCar-v0 and
MountainCarContinuous-v0 do not: their slope is symmetric about the valley floor (x = -pi/6: cos(3x) changes
sign under x -> -pi/3 - x), but the wall at -1.2 and the goal at 0.45 (0.5) are not mirror images of each
other, so a mirrored state would not have the original's future.

Known, intended differences from gymnasium:
- everything is computed in the env dtype (float32 by default). Gymnasium mixes: most
  states are float64 while observations are cast to float32; MountainCarContinuous
  rounds its state to float32 after every step; Acrobot rounds its initial state to
  float32; Pendulum multiplies the float32 action in float32.
- initial states come from a per-env counter-based hash (see core.py), not from numpy.
- actions are not validated by value (that would need a host sync); see TorchEnv.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from gymnasium import spaces

from tensordict import TensorDict

from common.envs.core import TorchEnv


def _uniform(u: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Map uniforms in [0, 1) to [low, high) the way numpy's Generator.uniform does."""
    return low + (high - low) * u


def _masked_groups(env: TorchEnv, full: torch.Tensor, observed: slice) -> TensorDict:
    """mask_velocity's observation groups: the `observed` entries of the full observation as "policy", the
    full observation as "critic" (copies: a caller editing one in place cannot edit the other)."""
    return TensorDict(
        {"policy": full[:, observed].clone(), "critic": full}, batch_size=[env.num_envs], device=env.device
    )


class MirrorSymmetric:
    """A task that looks the same in a mirror. `mirror_state`, `mirror_obs` (a TensorDict of the env's groups,
    any batch shape) and `mirror_action` map a batch to its mirror image; each is its own inverse, and stepping
    the mirror image of a state with the mirror image of an action gives the mirror image of the next state and
    observation, with the same reward and termination (tests/test_symmetry.py).

    `data_augmentation(obs=None, actions=None) -> (obs, actions)` is rsl_rl's data_augmentation_func
    (RslRlSymmetryCfg) on this env: flat [B] rows in, each batch followed by its mirror image along dim 0 out, None
    left None, the contract of every env kind (common/symmetry.py, which applies it to a script's batches). An
    adapter sets the same attribute from the task's own function (an mjlab or Isaac Lab task's
    data_augmentation_func, given the env).

    A subclass declares `state_signs` and `obs_signs` (the mirror negates the entries marked -1; the full
    observation's, of which a masked "policy" group keeps the `masked_obs` entries) and either
    `action_permutation` (Discrete: action i's mirror image) or `action_signs` (Box).
    """

    state_signs: tuple[float, ...] = ()
    obs_signs: tuple[float, ...] = ()
    action_permutation: tuple[int, ...] | None = None
    action_signs: tuple[float, ...] | None = None
    masked_obs: slice = slice(None)
    mask_velocity: bool = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # made once on the env's device: no host-to-device copy where a step is captured
        self._state_signs = torch.tensor(self.state_signs, dtype=self.dtype, device=self.device)
        self._obs_signs = torch.tensor(self.obs_signs, dtype=self.dtype, device=self.device)
        mirror = self.action_permutation if self.action_signs is None else self.action_signs
        self._action_mirror = torch.tensor(mirror, device=self.device)

    def mirror_state(self, state: torch.Tensor) -> torch.Tensor:
        return state * self._state_signs.to(state.dtype)

    def mirror_obs(self, obs: TensorDict) -> TensorDict:
        signs = self._obs_signs
        out = obs.clone(recurse=False)  # the same groups and batch shape, each replaced below
        out["policy"] = obs["policy"] * signs[self.masked_obs if self.mask_velocity else slice(None)].to(
            obs["policy"].dtype
        )
        if "critic" in obs.keys():
            out["critic"] = obs["critic"] * signs.to(obs["critic"].dtype)
        return out

    def mirror_action(self, action: torch.Tensor) -> torch.Tensor:
        if self.action_signs is None:  # Discrete: a permutation of the actions, looked up on the device
            return self._action_mirror[action]
        return action * self._action_mirror.to(action.dtype)

    def data_augmentation(self, obs: TensorDict | None = None, actions: torch.Tensor | None = None):
        obs = None if obs is None else torch.cat([obs, self.mirror_obs(obs)], dim=0)
        actions = None if actions is None else torch.cat([actions, self.mirror_action(actions)], dim=0)
        return obs, actions


class CartPole(MirrorSymmetric, TorchEnv):
    """CartPole-v1: push a cart left/right to keep a pole upright (Barto, Sutton, Anderson)."""

    env_id = "CartPole-v1"
    state_dim = 4  # x, x_dot, theta, theta_dot
    num_reset_uniforms = 4
    default_max_episode_steps = 500

    gravity = 9.8
    masscart = 1.0
    masspole = 0.1
    total_mass = masspole + masscart
    length = 0.5  # half the pole's length
    polemass_length = masspole * length
    force_mag = 10.0
    tau = 0.02  # seconds between state updates (explicit Euler)
    theta_threshold_radians = 12 * 2 * math.pi / 360
    x_threshold = 2.4
    # the mirror: the cart's position and the pole's angle, and their rates, change sign; push left <-> right
    state_signs = obs_signs = (-1.0, -1.0, -1.0, -1.0)
    action_permutation = (1, 0)
    masked_obs = slice(0, None, 2)  # mask_velocity observes x and theta

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        max_episode_steps: int | None = None,
        sutton_barto_reward: bool = False,
        mask_velocity: bool = False,
    ):
        high = np.array(
            [self.x_threshold * 2, np.inf, self.theta_threshold_radians * 2, np.inf],
            dtype=np.float32,
        )
        # mask_velocity: observe x and theta only (the even entries of the state); the critic the full state
        self.mask_velocity = mask_velocity
        if mask_velocity:
            self.single_critic_observation_space = spaces.Box(-high, high, dtype=np.float32)
        high = high[0::2] if mask_velocity else high
        self.single_observation_space = spaces.Box(-high, high, dtype=np.float32)
        self.single_action_space = spaces.Discrete(2)
        # Reward 0 per step and -1 on failure instead of +1 per step (gymnasium's option).
        self.sutton_barto_reward = sutton_barto_reward
        super().__init__(num_envs, device, seed, dtype, max_episode_steps)

    def _initial_state(self, u):
        return _uniform(u, -0.05, 0.05)

    def _dynamics(self, state, action):
        x, x_dot, theta, theta_dot = state.unbind(1)
        force = torch.where(action == 1, self.force_mag, -self.force_mag).to(self.dtype)
        costheta = torch.cos(theta)
        sintheta = torch.sin(theta)
        temp = (force + self.polemass_length * theta_dot.square() * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * costheta.square() / self.total_mass)
        )
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        x = x + self.tau * x_dot
        x_dot = x_dot + self.tau * xacc
        theta = theta + self.tau * theta_dot
        theta_dot = theta_dot + self.tau * thetaacc

        terminated = (
            (x < -self.x_threshold)
            | (x > self.x_threshold)
            | (theta < -self.theta_threshold_radians)
            | (theta > self.theta_threshold_radians)
        )
        # The autoreset means every terminal step is the first one, which is all the
        # rewards need to handle (gymnasium's steps_beyond_terminated never triggers).
        if self.sutton_barto_reward:
            reward = -terminated.to(self.dtype)
        else:
            reward = torch.ones_like(x)
        return torch.stack((x, x_dot, theta, theta_dot), dim=1), reward, terminated

    def _observe(self, state):  # the full observation; mask_velocity keeps part of it in _wrap_obs
        # A copy, so that a caller editing an observation in place cannot edit env.state.
        return state.clone()

    def _wrap_obs(self, obs):
        return _masked_groups(self, obs, self.masked_obs) if self.mask_velocity else super()._wrap_obs(obs)


class Pendulum(MirrorSymmetric, TorchEnv):
    """Pendulum-v1: swing a torque-limited pendulum up and hold it (no termination)."""

    env_id = "Pendulum-v1"
    state_dim = 2  # th, thdot
    num_reset_uniforms = 2
    default_max_episode_steps = 200

    max_speed = 8
    max_torque = 2.0
    dt = 0.05
    m = 1.0
    l = 1.0  # noqa: E741 (gymnasium's name)
    # the mirror: the angle from upright, its rate and the torque change sign (cos th stays, sin th flips)
    state_signs = (-1.0, -1.0)
    obs_signs = (1.0, -1.0, -1.0)
    action_signs = (-1.0,)
    masked_obs = slice(0, 2)  # mask_velocity observes cos th and sin th

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        max_episode_steps: int | None = None,
        g: float = 10.0,
        mask_velocity: bool = False,
    ):
        # mask_velocity: observe cos(th) and sin(th) only, not thdot; the critic all three
        self.mask_velocity = mask_velocity
        high = np.array([1.0, 1.0, self.max_speed], dtype=np.float32)
        if mask_velocity:
            self.single_critic_observation_space = spaces.Box(low=-high, high=high, dtype=np.float32)
        high = high[:2] if mask_velocity else high
        self.single_observation_space = spaces.Box(low=-high, high=high, dtype=np.float32)
        self.single_action_space = spaces.Box(low=-self.max_torque, high=self.max_torque, shape=(1,), dtype=np.float32)
        self.g = g
        super().__init__(num_envs, device, seed, dtype, max_episode_steps)

    def _initial_state(self, u):
        th = _uniform(u[:, 0], -math.pi, math.pi)
        thdot = _uniform(u[:, 1], -1.0, 1.0)
        return torch.stack((th, thdot), dim=1)

    def _dynamics(self, state, action):
        th, thdot = state.unbind(1)
        g, m, l, dt = self.g, self.m, self.l, self.dt
        u = action[:, 0].clamp(-self.max_torque, self.max_torque)
        # angle_normalize: wrap to [-pi, pi); torch.remainder takes the divisor's sign
        # like numpy's %, so negative angles wrap the same way.
        th_normalized = torch.remainder(th + math.pi, 2 * math.pi) - math.pi
        costs = th_normalized**2 + 0.1 * thdot**2 + 0.001 * (u**2)
        newthdot = thdot + (3 * g / (2 * l) * torch.sin(th) + 3.0 / (m * l**2) * u) * dt
        newthdot = newthdot.clamp(-self.max_speed, self.max_speed)
        newth = th + newthdot * dt
        terminated = torch.zeros_like(th, dtype=torch.bool)
        return torch.stack((newth, newthdot), dim=1), -costs, terminated

    def _observe(self, state):  # the full observation; mask_velocity keeps part of it in _wrap_obs
        th, thdot = state.unbind(1)
        return torch.stack((torch.cos(th), torch.sin(th), thdot), dim=1)

    def _wrap_obs(self, obs):
        return _masked_groups(self, obs, self.masked_obs) if self.mask_velocity else super()._wrap_obs(obs)


class MountainCarContinuous(TorchEnv):
    """MountainCarContinuous-v0: drive an underpowered car up a hill with a continuous force."""

    env_id = "MountainCarContinuous-v0"
    state_dim = 2  # position, velocity
    num_reset_uniforms = 1
    default_max_episode_steps = 999

    min_action = -1.0
    max_action = 1.0
    min_position = -1.2
    max_position = 0.6
    max_speed = 0.07
    goal_position = 0.45
    power = 0.0015

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        max_episode_steps: int | None = None,
        goal_velocity: float = 0,
    ):
        low = np.array([self.min_position, -self.max_speed], dtype=np.float32)
        high = np.array([self.max_position, self.max_speed], dtype=np.float32)
        self.single_observation_space = spaces.Box(low=low, high=high, dtype=np.float32)
        self.single_action_space = spaces.Box(low=self.min_action, high=self.max_action, shape=(1,), dtype=np.float32)
        self.goal_velocity = goal_velocity
        super().__init__(num_envs, device, seed, dtype, max_episode_steps)

    def _initial_state(self, u):
        position = _uniform(u[:, 0], -0.6, -0.4)
        return torch.stack((position, torch.zeros_like(position)), dim=1)

    def _dynamics(self, state, action):
        position, velocity = state.unbind(1)
        a = action[:, 0]
        force = a.clamp(self.min_action, self.max_action)
        velocity = velocity + (force * self.power - 0.0025 * torch.cos(3 * position))
        velocity = velocity.clamp(-self.max_speed, self.max_speed)
        position = position + velocity
        position = position.clamp(self.min_position, self.max_position)
        # Inelastic collision with the left wall.
        velocity = velocity.masked_fill((position == self.min_position) & (velocity < 0), 0.0)
        terminated = (position >= self.goal_position) & (velocity >= self.goal_velocity)
        # The action cost uses the raw action, not the clipped force, as in gymnasium.
        reward = terminated.to(self.dtype) * 100.0 - a * a * 0.1
        return torch.stack((position, velocity), dim=1), reward, terminated

    def _observe(self, state):
        return state.clone()


class Acrobot(MirrorSymmetric, TorchEnv):
    """Acrobot-v1: swing the tip of a two-link chain above a line by torquing the elbow."""

    env_id = "Acrobot-v1"
    state_dim = 4  # theta1, theta2, dtheta1, dtheta2
    num_reset_uniforms = 4
    default_max_episode_steps = 500

    dt = 0.2
    LINK_LENGTH_1 = 1.0
    LINK_MASS_1 = 1.0
    LINK_MASS_2 = 1.0
    LINK_COM_POS_1 = 0.5
    LINK_COM_POS_2 = 0.5
    LINK_MOI = 1.0
    MAX_VEL_1 = 4 * math.pi
    MAX_VEL_2 = 9 * math.pi
    # the mirror: both joint angles and rates change sign (their cosines stay); torque -1 <-> +1
    state_signs = (-1.0, -1.0, -1.0, -1.0)
    obs_signs = (1.0, -1.0, 1.0, -1.0, -1.0, -1.0)
    action_permutation = (2, 1, 0)

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        max_episode_steps: int | None = None,
    ):
        high = np.array([1.0, 1.0, 1.0, 1.0, self.MAX_VEL_1, self.MAX_VEL_2], dtype=np.float32)
        self.single_observation_space = spaces.Box(low=-high, high=high, dtype=np.float32)
        self.single_action_space = spaces.Discrete(3)
        super().__init__(num_envs, device, seed, dtype, max_episode_steps)

    def _initial_state(self, u):
        return _uniform(u, -0.1, 0.1)

    def _dsdt(self, s: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Time derivative of the state under torque `a` ("book" dynamics, Sutton & Barto)."""
        m1 = self.LINK_MASS_1
        m2 = self.LINK_MASS_2
        l1 = self.LINK_LENGTH_1
        lc1 = self.LINK_COM_POS_1
        lc2 = self.LINK_COM_POS_2
        I1 = self.LINK_MOI
        I2 = self.LINK_MOI
        g = 9.8
        theta1, theta2, dtheta1, dtheta2 = s.unbind(1)
        cos2 = torch.cos(theta2)
        sin2 = torch.sin(theta2)
        d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * cos2) + I1 + I2
        d2 = m2 * (lc2**2 + l1 * lc2 * cos2) + I2
        phi2 = m2 * lc2 * g * torch.cos(theta1 + theta2 - math.pi / 2.0)
        phi1 = (
            -m2 * l1 * lc2 * dtheta2**2 * sin2
            - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * sin2
            + (m1 * lc1 + m2 * l1) * g * torch.cos(theta1 - math.pi / 2)
            + phi2
        )
        ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1**2 * sin2 - phi2) / (m2 * lc2**2 + I2 - d2**2 / d1)
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return torch.stack((dtheta1, dtheta2, ddtheta1, ddtheta2), dim=1)

    @staticmethod
    def _wrap(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
        """Wrap into [low, high] like gymnasium's loop that adds/subtracts the period.

        One addition/subtraction (the loop's first pass, bit-identical to it) covers every
        normal step. After a violent step an angle can be more than one period out; a modulo
        finishes those, equal to further loop passes up to rounding.
        """
        period = high - low
        x = torch.where(x > high, x - period, torch.where(x < low, x + period, x))
        return torch.where((x > high) | (x < low), torch.remainder(x - low, period) + low, x)

    def _dynamics(self, state, action):
        # Actions 0, 1, 2 -> torque -1, 0, +1, held constant over the integration step.
        a = (action - 1).to(self.dtype)
        # One classical Runge-Kutta step over [0, dt], as gymnasium's rk4().
        dt = self.dt
        dt2 = dt / 2.0
        k1 = self._dsdt(state, a)
        k2 = self._dsdt(state + dt2 * k1, a)
        k3 = self._dsdt(state + dt2 * k2, a)
        k4 = self._dsdt(state + dt * k3, a)
        ns = state + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)

        theta1, theta2, dtheta1, dtheta2 = ns.unbind(1)
        theta1 = self._wrap(theta1, -math.pi, math.pi)
        theta2 = self._wrap(theta2, -math.pi, math.pi)
        dtheta1 = dtheta1.clamp(-self.MAX_VEL_1, self.MAX_VEL_1)
        dtheta2 = dtheta2.clamp(-self.MAX_VEL_2, self.MAX_VEL_2)
        # Tip above the bar: -cos(theta1) - cos(theta1 + theta2) > 1 (link lengths 1).
        terminated = -torch.cos(theta1) - torch.cos(theta2 + theta1) > 1.0
        reward = terminated.to(self.dtype) - 1.0  # -1 per step, 0 on the terminal step
        return torch.stack((theta1, theta2, dtheta1, dtheta2), dim=1), reward, terminated

    def _observe(self, state):
        theta1, theta2, dtheta1, dtheta2 = state.unbind(1)
        return torch.stack(
            (torch.cos(theta1), torch.sin(theta1), torch.cos(theta2), torch.sin(theta2), dtheta1, dtheta2),
            dim=1,
        )


class MountainCar(TorchEnv):
    """MountainCar-v0: drive an underpowered car up a hill with push left / none / right."""

    env_id = "MountainCar-v0"
    state_dim = 2  # position, velocity
    num_reset_uniforms = 1
    default_max_episode_steps = 200

    min_position = -1.2
    max_position = 0.6
    max_speed = 0.07
    goal_position = 0.5
    force = 0.001
    gravity = 0.0025

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        max_episode_steps: int | None = None,
        goal_velocity: float = 0,
    ):
        low = np.array([self.min_position, -self.max_speed], dtype=np.float32)
        high = np.array([self.max_position, self.max_speed], dtype=np.float32)
        self.single_observation_space = spaces.Box(low, high, dtype=np.float32)
        self.single_action_space = spaces.Discrete(3)
        self.goal_velocity = goal_velocity
        super().__init__(num_envs, device, seed, dtype, max_episode_steps)

    def _initial_state(self, u):
        position = _uniform(u[:, 0], -0.6, -0.4)
        return torch.stack((position, torch.zeros_like(position)), dim=1)

    def _dynamics(self, state, action):
        position, velocity = state.unbind(1)
        push = (action - 1).to(self.dtype)  # actions 0, 1, 2 -> push -1, 0, +1
        velocity = velocity + (push * self.force + torch.cos(3 * position) * (-self.gravity))
        velocity = velocity.clamp(-self.max_speed, self.max_speed)
        position = position + velocity
        position = position.clamp(self.min_position, self.max_position)
        # Inelastic collision with the left wall.
        velocity = velocity.masked_fill((position == self.min_position) & (velocity < 0), 0.0)
        terminated = (position >= self.goal_position) & (velocity >= self.goal_velocity)
        reward = torch.full_like(position, -1.0)
        return torch.stack((position, velocity), dim=1), reward, terminated

    def _observe(self, state):
        return state.clone()
