"""Mirror symmetry of the built-in envs (common/envs/classic.py, MirrorSymmetric): the mirror is its own
inverse, the dynamics commute with it over random states, and `data_augmentation` keeps rsl_rl's contract."""

from __future__ import annotations

import math

import pytest
import torch

from common.envs import make_env

MASKED = {"mask_velocity": True}
# env id, constructor options, and the ranges random states are drawn from (wider than the initial states: the
# symmetry has to hold wherever an episode can go, up to the termination bounds and the speed limits)
SYMMETRIC = [
    ("CartPole-v1", {}, [(-2.4, 2.4), (-3.0, 3.0), (-0.21, 0.21), (-3.0, 3.0)]),
    ("CartPole-v1", MASKED, [(-2.4, 2.4), (-3.0, 3.0), (-0.21, 0.21), (-3.0, 3.0)]),
    ("Pendulum-v1", {}, [(-3 * math.pi, 3 * math.pi), (-8.0, 8.0)]),
    ("Pendulum-v1", MASKED, [(-3 * math.pi, 3 * math.pi), (-8.0, 8.0)]),
    ("Acrobot-v1", {}, [(-math.pi, math.pi), (-math.pi, math.pi), (-4 * math.pi, 4 * math.pi), (-9 * math.pi, 9 * math.pi)]),
]
IDS = [f"{env_id}{'-masked' if kwargs else ''}" for env_id, kwargs, _ in SYMMETRIC]
N = 4096


def random_states(ranges, generator) -> torch.Tensor:
    low, high = (torch.tensor(r, dtype=torch.float64) for r in zip(*ranges))
    return low + (high - low) * torch.rand(N, len(ranges), dtype=torch.float64, generator=generator)


def random_actions(env, generator) -> torch.Tensor:
    space = env.single_action_space
    if hasattr(space, "n"):
        return torch.randint(int(space.n), (N,), generator=generator)
    low, high = float(space.low[0]), float(space.high[0])
    # beyond the bounds too: the env clips a torque, and the mirror must commute with the clip
    return 1.5 * (low + (high - low) * torch.rand(N, 1, dtype=torch.float64, generator=generator))


def step_from(env, state: torch.Tensor, action: torch.Tensor):
    """One step of `env` from `state` (fresh episodes: no time limit in the way); the true next observation
    (info["final_obs"], valid on every row), the reward, termination and the next physical state."""
    env.reset()
    env.state.copy_(state)
    _, reward, terminated, truncated, info = env.step(action)
    assert not truncated.any()
    return info["final_obs"], reward, terminated


def assert_commutes(env, mirror_env, state, action, mirror_state, mirror_obs, mirror_action):
    obs, reward, terminated = step_from(env, state, action)
    m_obs, m_reward, m_terminated = step_from(mirror_env, mirror_state(state), mirror_action(action))
    assert torch.equal(terminated, m_terminated)
    torch.testing.assert_close(m_reward, reward, rtol=1e-12, atol=1e-12)
    for group in obs.keys():
        torch.testing.assert_close(m_obs[group], mirror_obs(obs)[group], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(("env_id", "kwargs", "ranges"), SYMMETRIC, ids=IDS)
def test_mirror_is_its_own_inverse(env_id, kwargs, ranges):
    env = make_env(env_id, N, seed=1, dtype=torch.float64, **kwargs)
    g = torch.Generator().manual_seed(0)
    state, action = random_states(ranges, g), random_actions(env, g)
    env.reset()
    env.state.copy_(state)
    obs = env.step(action)[4]["final_obs"]
    assert not torch.equal(env.mirror_state(state), state)  # a mirror that moves the states it is tested on
    assert torch.equal(env.mirror_state(env.mirror_state(state)), state)
    assert torch.equal(env.mirror_action(env.mirror_action(action)), action)
    twice = env.mirror_obs(env.mirror_obs(obs))
    assert twice.keys() == obs.keys() == ({"policy", "critic"} if kwargs else {"policy"})
    for group in obs.keys():
        assert torch.equal(twice[group], obs[group])


@pytest.mark.parametrize(("env_id", "kwargs", "ranges"), SYMMETRIC, ids=IDS)
def test_dynamics_commute_with_the_mirror(env_id, kwargs, ranges):
    """step(mirror(s), mirror(a)) = mirror(step(s, a)): next observation (every group), reward and termination, in
    float64 over random states and actions."""
    env, mirror_env = (make_env(env_id, N, seed=1, dtype=torch.float64, **kwargs) for _ in range(2))
    g = torch.Generator().manual_seed(1)
    state, action = random_states(ranges, g), random_actions(env, g)
    assert_commutes(env, mirror_env, state, action, env.mirror_state, env.mirror_obs, env.mirror_action)
    if env_id == "CartPole-v1":  # the states reach the failure bounds: both sides of termination were compared
        terminated = step_from(env, state, action)[2]
        assert terminated.any() and not terminated.all()


def test_a_wrong_mirror_is_caught():
    """The commutation check fails for a mirror that is almost right: CartPole with the pole's angular rate
    left unflipped, and with push left and right not swapped."""
    env, mirror_env = (make_env("CartPole-v1", N, seed=1, dtype=torch.float64) for _ in range(2))
    g = torch.Generator().manual_seed(2)
    state, action = random_states(SYMMETRIC[0][2], g), random_actions(env, g)
    signs = torch.tensor([-1.0, -1.0, -1.0, 1.0], dtype=torch.float64)

    def wrong_obs(obs):
        return obs.apply(lambda x: x * signs)

    with pytest.raises(AssertionError):
        assert_commutes(env, mirror_env, state, action, lambda s: s * signs, wrong_obs, env.mirror_action)
    with pytest.raises(AssertionError):
        assert_commutes(env, mirror_env, state, action, env.mirror_state, env.mirror_obs, lambda a: a)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_data_augmentation_is_rsl_rls_contract(env_id):
    """Originals first, then their mirror images along dim 0, for a [B] or [T, N] batch; None stays None."""
    env = make_env(env_id, 8, seed=3, **MASKED)
    obs, _ = env.reset()
    action = torch.stack([torch.as_tensor(env.single_action_space.sample()) for _ in range(8)])
    aug_obs, aug_action = env.data_augmentation(obs=obs, actions=action)
    assert aug_obs.batch_size == (16,) and aug_action.shape[0] == 16
    for group in ("policy", "critic"):
        assert torch.equal(aug_obs[group][:8], obs[group])
        assert torch.equal(aug_obs[group][8:], env.mirror_obs(obs)[group])
    assert torch.equal(aug_action[8:], env.mirror_action(action))
    assert env.data_augmentation(obs=None, actions=action)[0] is None
    assert env.data_augmentation(obs=obs, actions=None)[1] is None
    rollout = torch.stack([obs, obs], dim=0)  # [T, N]: dim 0 is T, as rsl_rl's flat minibatches have it
    assert env.data_augmentation(obs=rollout)[0].batch_size == (4, 8)


def test_discrete_mirror_swaps_the_actions():
    assert make_env("CartPole-v1", 1).mirror_action(torch.tensor([0, 1])).tolist() == [1, 0]
    assert make_env("Acrobot-v1", 1).mirror_action(torch.tensor([0, 1, 2])).tolist() == [2, 1, 0]


@pytest.mark.parametrize("env_id", ["MountainCar-v0", "MountainCarContinuous-v0"])
def test_mountain_cars_declare_no_mirror(env_id):
    """Their wall and goal are not mirror images (classic.py's docstring): a script must find no mirror there."""
    assert getattr(make_env(env_id, 1), "data_augmentation", None) is None
