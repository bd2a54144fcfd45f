"""Tests of make_env and the built-in batched torch envs against gymnasium's classic control.

Tolerances, and why:
- TIGHT (1e-9 absolute, float64): gymnasium computes CartPole, Pendulum, MountainCar and
  Acrobot states and rewards in float64, with the same expressions as our envs; the only
  differences are the last bits of sin/cos (numpy's vs torch's implementations), which
  stay below 1e-12 over the test's short episodes (time limits of tens of steps), even
  for the chaotic Acrobot.
- F32: gymnasium returns observations cast to float32, so our float64 observations are
  compared with those up to float32 rounding (relative 2**-23) plus TIGHT.
- MountainCarContinuous rounds its state to float32 after every step, and part of its
  arithmetic runs in float32, so there we copy gymnasium's state into our env before each
  step ("teacher forcing", no error accumulation) and compare at 1e-6 absolute (positions
  of order 1, float32 spacing 1.2e-7).
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict


from common.envs import BUILTIN_ENVS, list_envs, make_env
from common.envs.core import hash_uniform, mix64, seed_to_key
from tests.host_sync import RecordHostSyncs

ENV_IDS = [
    env_id for env_id, cls in BUILTIN_ENVS.items() if cls.__module__ == "common.envs.classic"
]  # MinAtar: test_minatar.py
TIGHT = 1e-9
MCC_ATOL = 1e-6
PI = math.pi

# gymnasium's initial-state ranges, in gymnasium's state layout.
INIT_RANGES = {
    "CartPole-v1": ([-0.05] * 4, [0.05] * 4),
    "Pendulum-v1": ([-PI, -1.0], [PI, 1.0]),
    "MountainCarContinuous-v0": ([-0.6, 0.0], [-0.4, 0.0]),
    "Acrobot-v1": ([-0.1] * 4, [0.1] * 4),
    "MountainCar-v0": ([-0.6, 0.0], [-0.4, 0.0]),
}
# Wider start states injected into half the episodes of the equivalence test, so that
# every branch (failure bounds, clipping, wall collision, goal, angle wrap) is exercised.
WIDE_STATES = {
    "CartPole-v1": ([-2.4, -2.0, -0.2, -2.0], [2.4, 2.0, 0.2, 2.0]),
    "Pendulum-v1": ([-3 * PI, -8.0], [3 * PI, 8.0]),
    "MountainCarContinuous-v0": ([-1.2, -0.07], [0.6, 0.07]),
    "Acrobot-v1": ([-PI, -PI, -4 * PI, -9 * PI], [PI, PI, 4 * PI, 9 * PI]),
    "MountainCar-v0": ([-1.2, -0.07], [0.6, 0.07]),
}
# Continuous actions are drawn beyond the action bounds to exercise the clipping.
BOX_ACTION_RANGE = {"Pendulum-v1": (-3.0, 3.0), "MountainCarContinuous-v0": (-1.5, 1.5)}
# Small time limits so that truncation happens often.
TEST_TIME_LIMIT = {
    "CartPole-v1": 25,
    "Pendulum-v1": 30,
    "MountainCarContinuous-v0": 50,
    "Acrobot-v1": 40,
    "MountainCar-v0": 50,
}


def reference_obs(env_id: str, s: np.ndarray) -> np.ndarray:
    """gymnasium's observation formula evaluated in float64 (gymnasium casts to float32)."""
    if env_id == "Pendulum-v1":
        return np.array([np.cos(s[0]), np.sin(s[0]), s[1]])
    if env_id == "Acrobot-v1":
        return np.array([np.cos(s[0]), np.sin(s[0]), np.cos(s[1]), np.sin(s[1]), s[2], s[3]])
    return np.asarray(s, dtype=np.float64)


def gym_state(genv: gym.Env) -> np.ndarray:
    return np.array(genv.unwrapped.state, dtype=np.float64)


def random_actions(env_id: str, space, rng: np.random.Generator, n: int) -> np.ndarray:
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(0, space.n, size=n)
    low, high = BOX_ACTION_RANGE[env_id]
    return rng.uniform(low, high, size=(n, space.shape[0]))


def in_init_range(env_id: str, states: torch.Tensor) -> bool:
    low, high = (torch.tensor(b, dtype=states.dtype) for b in INIT_RANGES[env_id])
    return bool(((states >= low) & (states <= high)).all())


# --------------------------------------------------------------------------------------
# Equivalence with gymnasium
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_matches_gymnasium_step_by_step(env_id):
    rows, num_steps = 4, 1500
    limit = TEST_TIME_LIMIT[env_id]
    teacher_forcing = env_id == "MountainCarContinuous-v0"
    state_atol = MCC_ATOL if teacher_forcing else TIGHT
    obs_tol = dict(rtol=MCC_ATOL, atol=MCC_ATOL) if teacher_forcing else dict(rtol=2**-23, atol=TIGHT)

    env = make_env(env_id, rows, seed=0, dtype=torch.float64, max_episode_steps=limit)
    env.reset()
    gyms = [gym.make(env_id, max_episode_steps=limit) for _ in range(rows)]
    rng = np.random.default_rng(123)
    wide_low, wide_high = (np.array(b) for b in WIDE_STATES[env_id])

    def start_episode(i: int) -> None:
        """Reset gymnasium's env i (sometimes to a wide random state); copy it into row i."""
        gyms[i].reset(seed=int(rng.integers(2**31)))
        if rng.random() < 0.5:
            gyms[i].unwrapped.state = rng.uniform(wide_low, wide_high)
        env.state[i] = torch.from_numpy(gym_state(gyms[i]))
        env.episode_steps[i] = 0

    for i in range(rows):
        start_episode(i)
    counts = {"terminated": 0, "truncated": 0}
    for _ in range(num_steps):
        if teacher_forcing:
            for i in range(rows):
                env.state[i] = torch.from_numpy(gym_state(gyms[i]))
        actions = random_actions(env_id, env.single_action_space, rng, rows)
        obs, reward, terminated, truncated, info = env.step(torch.from_numpy(actions))
        obs, reward = obs["policy"].numpy(), reward.numpy()
        final_obs = info["final_obs"]["policy"].numpy()
        state, steps = env.state.numpy(), env.episode_steps.numpy()
        for i, genv in enumerate(gyms):
            action = int(actions[i]) if actions.ndim == 1 else actions[i]
            g_obs, g_reward, g_terminated, g_truncated, _ = genv.step(action)
            assert bool(terminated[i]) == g_terminated
            assert bool(truncated[i]) == g_truncated
            np.testing.assert_allclose(reward[i], g_reward, rtol=0, atol=TIGHT)
            s_ref = gym_state(genv)
            if g_terminated or g_truncated:
                counts["terminated"] += g_terminated
                counts["truncated"] += g_truncated
                # The true last observation is in final_obs; obs already starts a new episode.
                np.testing.assert_allclose(final_obs[i], reference_obs(env_id, s_ref), rtol=0, atol=state_atol)
                np.testing.assert_allclose(final_obs[i], g_obs, **obs_tol)
                assert steps[i] == 0
                assert in_init_range(env_id, env.state[i])
                np.testing.assert_allclose(obs[i], reference_obs(env_id, state[i]), rtol=0, atol=TIGHT)
                start_episode(i)
            else:
                np.testing.assert_allclose(state[i], s_ref, rtol=0, atol=state_atol)
                np.testing.assert_allclose(obs[i], reference_obs(env_id, s_ref), rtol=0, atol=state_atol)
                np.testing.assert_allclose(obs[i], g_obs, **obs_tol)
                assert steps[i] == genv._elapsed_steps
    # The run must have exercised both ways an episode ends (Pendulum never terminates).
    assert counts["truncated"] > 10
    if env_id != "Pendulum-v1":
        assert counts["terminated"] > 10


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_spaces_and_time_limit_match_gymnasium(env_id):
    env = make_env(env_id, 2)
    genv = gym.make(env_id)
    for ours, theirs in (
        (env.single_observation_space, genv.observation_space),
        (env.single_action_space, genv.action_space),
    ):
        assert type(ours) is type(theirs)
        if isinstance(theirs, gym.spaces.Box):
            assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
            np.testing.assert_array_equal(ours.low, theirs.low)
            np.testing.assert_array_equal(ours.high, theirs.high)
        else:
            assert ours.n == theirs.n and ours.start == theirs.start
    assert env.max_episode_steps == gym.spec(env_id).max_episode_steps
    genv.reset(seed=0)
    assert env.state.shape == (2, len(genv.unwrapped.state))


# --------------------------------------------------------------------------------------
# Autoreset
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_autoreset_keeps_running_envs_and_restarts_finished_ones(env_id):
    n = 64
    env = make_env(env_id, n, seed=5, dtype=torch.float64, max_episode_steps=TEST_TIME_LIMIT[env_id])
    env.reset()
    rng = np.random.default_rng(0)
    wide_low, wide_high = (torch.tensor(b, dtype=torch.float64) for b in WIDE_STATES[env_id])
    # Start from wide states so that terminations happen quickly.
    env.state = wide_low + (wide_high - wide_low) * torch.rand(n, env.state_dim, dtype=torch.float64)
    finished = 0
    for _ in range(100):
        before_state, before_steps = env.state.clone(), env.episode_steps.clone()
        action = torch.from_numpy(random_actions(env_id, env.single_action_space, rng, n))
        expected_next, _, _ = env._dynamics(before_state, env._check_action(action))
        obs, _, terminated, truncated, info = env.step(action)
        done = terminated | truncated
        keep = ~done
        finished += int(done.sum())
        # Running envs: exactly one dynamics step, counter + 1, obs of the new state.
        torch.testing.assert_close(env.state[keep], expected_next[keep], rtol=0, atol=0)
        assert torch.equal(env.episode_steps[keep], before_steps[keep] + 1)
        # Finished envs: new episode in gymnasium's initial-state range, counter 0.
        assert in_init_range(env_id, env.state[done])
        assert (env.episode_steps[done] == 0).all()
        # Both: obs describes the current state; final_obs the state reached by the step.
        torch.testing.assert_close(obs["policy"], env._observe(env.state), rtol=0, atol=0)
        torch.testing.assert_close(info["final_obs"]["policy"], env._observe(expected_next), rtol=0, atol=0)
        assert torch.equal(truncated, before_steps + 1 >= env.max_episode_steps)
    assert finished > 20


def test_truncation_coexists_with_termination_like_time_limit():
    env = make_env("CartPole-v1", 2, dtype=torch.float64, max_episode_steps=10)
    env.reset(seed=0)
    env.state[:, 0] = 2.399  # pole cart at the edge: moving right fails now
    env.state[:, 1] = 5.0
    env.episode_steps[:] = torch.tensor([9, 3])  # env 0 also hits its time limit
    _, _, terminated, truncated, _ = env.step(torch.tensor([1, 1]))
    assert terminated.tolist() == [True, True]
    assert truncated.tolist() == [True, False]


# --------------------------------------------------------------------------------------
# Seeding and random numbers
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", ENV_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reset_ranges_and_seeding(env_id, dtype):
    n = 2000
    env = make_env(env_id, n, seed=0, dtype=dtype)
    obs, _ = env.reset(seed=11)
    first = env.state.clone()
    assert first.dtype == dtype and obs["policy"].dtype == dtype
    assert in_init_range(env_id, first)
    # The draws fill the range (uniform: min/max near the bounds) on the random coordinates.
    low, high = (torch.tensor(b, dtype=dtype) for b in INIT_RANGES[env_id])
    width = high - low
    random_coords = width > 0
    spread = (first.amax(0) - first.amin(0))[random_coords] / width[random_coords]
    assert (spread > 0.99).all()
    mean = ((first - low)[:, random_coords] / width[random_coords]).mean(0)
    assert ((mean - 0.5).abs() < 0.03).all()

    env.reset(seed=11)
    assert torch.equal(env.state, first), "same seed must give the same states"
    env.reset()
    assert not torch.equal(env.state, first), "a reset without seed continues the stream"
    env.reset(seed=12)
    assert not torch.equal(env.state, first)
    # make_env's seed and reset's seed are the same thing.
    other = make_env(env_id, n, seed=11, dtype=dtype)
    other.reset()
    assert torch.equal(other.state, first)
    # A tensor of per-env seeds: env i seeded 11 + i reproduces row i.
    other.reset(seed=torch.arange(11, 11 + n))
    assert torch.equal(other.state, first)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_env_trajectory_does_not_depend_on_batch_size(env_id):
    small = make_env(env_id, 4, seed=3, dtype=torch.float64, max_episode_steps=TEST_TIME_LIMIT[env_id])
    large = make_env(env_id, 16, seed=3, dtype=torch.float64, max_episode_steps=TEST_TIME_LIMIT[env_id])
    small_obs, _ = small.reset()
    large_obs, _ = large.reset()
    assert torch.equal(small_obs["policy"], large_obs["policy"][:4])
    rng = np.random.default_rng(1)
    resets = 0
    for _ in range(200):
        action = torch.from_numpy(random_actions(env_id, large.single_action_space, rng, 16))
        out_small = small.step(action[:4])
        out_large = large.step(action)
        # Same ops on a different number of elements may take other vectorised code paths
        # (last-bit differences in sin/cos), hence a tight tolerance rather than equality
        # for the floats; the discrete outcomes and the random draws must agree exactly.
        torch.testing.assert_close(out_small[0]["policy"], out_large[0]["policy"][:4], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(out_small[1], out_large[1][:4], rtol=1e-12, atol=1e-12)
        assert torch.equal(out_small[2], out_large[2][:4])
        assert torch.equal(out_small[3], out_large[3][:4])
        resets += int((out_small[2] | out_small[3]).sum())
    assert torch.equal(small._rng_counter, large._rng_counter[:4])
    assert resets > 0


def test_hash_matches_reference_splitmix64():
    """torch's int64 arithmetic must wrap like the unsigned 64-bit mixer is defined."""

    def mix64_reference(z: int) -> int:
        mask = (1 << 64) - 1
        z &= mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    values = [0, 1, 2, -1, -(2**63), 2**63 - 1, 123456789, -987654321012345]
    got = mix64(torch.tensor(values, dtype=torch.int64)).tolist()
    assert [g & ((1 << 64) - 1) for g in got] == [mix64_reference(v) for v in values]

    # An env's reset k draws numbers k * num_reset_uniforms ... of stream seed_to_key(seed + i).
    env = make_env("CartPole-v1", 8, dtype=torch.float64)
    env.reset(seed=100)
    env.reset()
    key = seed_to_key(torch.arange(100, 108))
    u = hash_uniform(key[:, None], torch.arange(4, 8), torch.float64)
    torch.testing.assert_close(env.state, -0.05 + 0.1 * u, rtol=0, atol=0)

    key = seed_to_key(torch.arange(64))
    for dtype in (torch.float32, torch.float64):
        u = hash_uniform(key[:, None], torch.arange(1000), dtype)
        assert u.dtype == dtype and (u >= 0).all() and (u < 1).all()
        assert abs(u.mean().item() - 0.5) < 0.005


# --------------------------------------------------------------------------------------
# Checkpointing
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_state_dict_round_trip_resumes_exactly(env_id, tmp_path):
    n = 32
    env = make_env(env_id, n, seed=9, max_episode_steps=TEST_TIME_LIMIT[env_id])
    env.reset()
    rng = np.random.default_rng(2)
    space = env.single_action_space
    for _ in range(30):
        env.step(torch.from_numpy(random_actions(env_id, space, rng, n)))
    path = tmp_path / "env.pt"
    torch.save(env.state_dict(), path)
    actions = [torch.from_numpy(random_actions(env_id, space, rng, n)) for _ in range(60)]
    expected = [env.step(a) for a in actions]

    resumed = make_env(env_id, n, seed=1234, max_episode_steps=TEST_TIME_LIMIT[env_id])
    resumed.load_state_dict(torch.load(path, weights_only=True))
    for a, (obs, reward, terminated, truncated, info) in zip(actions, expected):
        r_obs, r_reward, r_terminated, r_truncated, r_info = resumed.step(a)
        assert torch.equal(r_obs["policy"], obs["policy"])
        assert torch.equal(r_info["final_obs"]["policy"], info["final_obs"]["policy"])
        assert torch.equal(r_reward, reward)
        assert torch.equal(r_terminated, terminated) and torch.equal(r_truncated, truncated)

    with pytest.raises(ValueError, match="num_envs"):
        make_env(env_id, n + 1).load_state_dict(torch.load(path, weights_only=True))


# --------------------------------------------------------------------------------------
# API surface
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_step_outputs_follow_the_contract(env_id):
    n = 5
    env = make_env(env_id, n)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(torch.zeros(n))
    obs, info = env.reset()
    assert isinstance(obs, TensorDict) and obs.batch_size == torch.Size([n])
    assert obs["policy"].shape == (n, env.single_observation_space.shape[0])
    assert env.device == torch.device("cpu") and env.num_envs == n
    space = env.single_action_space
    if isinstance(space, gym.spaces.Discrete):
        good, bad = torch.zeros(n, 1, dtype=torch.int64), torch.zeros(n, 2, dtype=torch.int64)
    else:
        good, bad = torch.zeros(n, 1), torch.zeros(n + 1, 1)
    obs, reward, terminated, truncated, info = env.step(good)
    assert obs["policy"].dtype == torch.float32 and reward.dtype == torch.float32
    assert reward.shape == (n,)
    assert terminated.dtype == torch.bool and truncated.dtype == torch.bool
    assert terminated.shape == truncated.shape == (n,)
    assert isinstance(info["final_obs"], TensorDict)
    assert info["final_obs"]["policy"].shape == obs["policy"].shape
    assert isinstance(info["log"], dict)
    assert env.episode_steps.dtype == torch.int64
    with pytest.raises(ValueError, match="shape"):
        env.step(bad)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_step_makes_no_host_sync(env_id):
    n = 8
    env = make_env(env_id, n, max_episode_steps=3)
    env.reset()
    action = torch.from_numpy(random_actions(env_id, env.single_action_space, np.random.default_rng(0), n))
    recorder = RecordHostSyncs()
    with recorder:
        for _ in range(4):  # crosses a time limit, so the autoreset path runs
            env.step(action)
    assert recorder.syncs == []


def test_make_env_errors_are_clear():
    with pytest.raises(ValueError) as err:
        make_env("CartPol-v1", 2)
    for env_id in list_envs():
        assert env_id in str(err.value)
    assert "gym:" in str(err.value) and "mjlab:" in str(err.value)
    with pytest.raises(ValueError, match="prefix"):
        make_env("nosuchsim:Foo-v0", 2)
    with pytest.raises(ValueError, match="names no env"):
        make_env("gym:", 2)
    with pytest.raises(TypeError, match="max_episode_steps"):
        make_env("Pendulum-v1", 2, max_steps=10)
    with pytest.raises(ValueError, match="num_envs"):
        make_env("Pendulum-v1", 0)
    assert ENV_IDS == [
        "CartPole-v1",
        "Pendulum-v1",
        "MountainCarContinuous-v0",
        "Acrobot-v1",
        "MountainCar-v0",
    ]
    assert list_envs()[: len(ENV_IDS)] == ENV_IDS and "MinAtar/Breakout-v1" in list_envs()


def test_gymnasium_constructor_options_are_supported():
    env = make_env("Pendulum-v1", 3, dtype=torch.float64, g=9.81, max_episode_steps=7)
    genv = gym.make("Pendulum-v1", g=9.81)
    genv.reset(seed=0)
    env.reset()
    env.state[:] = torch.from_numpy(gym_state(genv))
    _, reward, *_ = env.step(torch.full((3, 1), 0.5, dtype=torch.float64))
    _, g_reward, *_ = genv.step(np.array([0.5]))
    np.testing.assert_allclose(env.state[0].numpy(), gym_state(genv), rtol=0, atol=TIGHT)
    np.testing.assert_allclose(reward[0].item(), g_reward, rtol=0, atol=TIGHT)
    assert env.max_episode_steps == 7

    sb = make_env("CartPole-v1", 1, sutton_barto_reward=True)
    sb.reset()
    _, reward, terminated, *_ = sb.step(torch.tensor([0]))
    assert reward.item() == 0.0 and not terminated.item()


def test_float32_tracks_float64():
    """The default float32 envs follow the float64 ones closely over a short horizon."""
    for env_id in ENV_IDS:
        e32 = make_env(env_id, 64, seed=4)
        e64 = make_env(env_id, 64, seed=4, dtype=torch.float64)
        e32.reset()
        e64.reset()
        e32.state = e64.state.float()
        rng = np.random.default_rng(0)
        for _ in range(10):
            a = torch.from_numpy(random_actions(env_id, e64.single_action_space, rng, 64))
            o32, r32, *_ = e32.step(a.float() if a.is_floating_point() else a)
            o64, r64, *_ = e64.step(a)
        torch.testing.assert_close(o32["policy"].double(), o64["policy"], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(r32.double(), r64, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------------------------
# the mjlab adapter's auto_reset switch (no mjlab needed)
# --------------------------------------------------------------------------------------------
def test_mjlab_auto_reset_is_switched_on_only_on_a_config_that_has_the_field():
    """Both final_obs modes let mjlab reset finished envs inside its step (the terminal mode takes the
    last observation there, see common/envs/mjlab_adapter.py): a config's auto_reset=False, e.g. from
    a configure hook, is switched back on; a config without the field (an mjlab that always resets)
    gets no new attribute that mjlab would never read."""
    from dataclasses import dataclass

    from common.envs.mjlab_adapter import enable_auto_reset

    @dataclass
    class WithField:
        auto_reset: bool = False

    @dataclass
    class WithoutField:
        episode_length_s: float = 10.0

    cfg = WithField()
    enable_auto_reset(cfg)
    assert cfg.auto_reset is True
    old = WithoutField()
    enable_auto_reset(old)
    assert not hasattr(old, "auto_reset")


# --------------------------------------------------------------------------------------------
# rendering (recorded evaluation)
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_render_draws_what_gymnasium_draws_for_the_same_state(env_id):
    pytest.importorskip("pygame")
    env = make_env(env_id, 3, seed=0, dtype=torch.float64, render_mode="rgb_array")
    env.reset()
    rng = np.random.default_rng(0)
    for _ in range(7):
        env.step(torch.from_numpy(random_actions(env_id, env.single_action_space, rng, 3)))
    frames = env.render([0, 2])
    for i, frame in zip((0, 2), frames):
        reference = gym.make(env_id, render_mode="rgb_array")
        reference.reset(seed=0)
        reference.unwrapped.state = env.state[i].numpy().copy()
        expected = reference.render()
        assert frame.dtype == np.uint8 and frame.shape == expected.shape and frame.shape[-1] == 3
        assert np.array_equal(frame, expected)
        reference.close()
    assert not np.array_equal(frames[0], frames[1])  # two envs in two states
    env.close()


@pytest.mark.parametrize("env_id, observed", [("CartPole-v1", [0, 2]), ("Pendulum-v1", [0, 1])])
def test_mask_velocity_observes_the_unmasked_entries_of_the_same_trajectory(env_id, observed):
    """mask_velocity=True drops the velocities from the observation (CartPole: x and theta;
    Pendulum: cos and sin of the angle) and changes nothing else: same spaces' bounds on the kept
    entries, same states, rewards and ends, and no host sync per step. The full observation is the
    "critic" group (for an asymmetric critic, or a teacher trained unmasked)."""
    full, masked = make_env(env_id, 16, seed=3), make_env(env_id, 16, seed=3, mask_velocity=True)
    assert masked.single_observation_space.shape == (len(observed),)
    np.testing.assert_array_equal(masked.single_observation_space.high, full.single_observation_space.high[observed])
    obs_full, obs_masked = full.reset()[0], masked.reset()[0]
    torch.testing.assert_close(obs_masked["policy"], obs_full["policy"][:, observed], rtol=0, atol=0)
    assert masked.single_critic_observation_space == full.single_observation_space and "critic" not in obs_full.keys()
    assert torch.equal(obs_masked["critic"], obs_full["policy"])
    g = torch.Generator().manual_seed(0)
    for _ in range(600):  # past the time limits: autoresets and final_obs included
        if isinstance(full.single_action_space, gym.spaces.Discrete):
            action = torch.randint(0, 2, (16,), generator=g)
        else:
            action = torch.rand(16, 1, generator=g) * 4 - 2
        with RecordHostSyncs() as recorder:
            o_m, r_m, term_m, trunc_m, info_m = masked.step(action)
        assert not recorder.syncs
        o_f, r_f, term_f, trunc_f, info_f = full.step(action)
        assert torch.equal(masked.state, full.state) and torch.equal(r_m, r_f)
        assert torch.equal(term_m, term_f) and torch.equal(trunc_m, trunc_f)
        assert torch.equal(o_m["policy"], o_f["policy"][:, observed])
        assert torch.equal(info_m["final_obs"]["policy"], info_f["final_obs"]["policy"][:, observed])
        assert torch.equal(o_m["critic"], o_f["policy"]) and torch.equal(
            info_m["final_obs"]["critic"], info_f["final_obs"]["policy"]
        )
