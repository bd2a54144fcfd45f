"""The `gym:` adapter returns what gymnasium's own vector env returns, as torch tensors.

Reference: `gymnasium.make_vec(..., vectorization_mode="sync")` in same-step autoreset
mode, reset with the same seed and stepped with the same actions. The adapter must give
the same observations, rewards, terminated/truncated flags and final observations (cast
to float32, the contract's dtype).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from common.envs import make_env
from common.envs.gym_adapter import GymVecEnv
from tests.helpers import printed_summary

ROOT = Path(__file__).resolve().parents[1]


def reference_vec_env(env_id: str, num_envs: int, **env_kwargs) -> gym.vector.VectorEnv:
    return gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        **env_kwargs,
    )


def flat(single_space: spaces.Space, obs, n: int) -> np.ndarray:
    """Batched gymnasium observations -> [n, D] float32, env by env with gymnasium's own flatten."""
    batched = gym.vector.utils.batch_space(single_space, n)
    return np.stack([spaces.flatten(single_space, o) for o in gym.vector.utils.iterate(batched, obs)]).astype(
        np.float32
    )


def random_actions(space: spaces.Space, n: int, rng: np.random.Generator) -> np.ndarray:
    """Actions the adapter takes (0-based for Discrete), drawn in numpy."""
    if isinstance(space, spaces.Discrete):
        return rng.integers(0, space.n, size=n)
    return rng.uniform(space.low, space.high, size=(n, *space.shape)).astype(space.dtype)


def assert_same_as_gymnasium(env_id: str, num_envs: int, steps: int, seed: int, **env_kwargs) -> dict[str, int]:
    """Step the adapter and the reference side by side; return counts of the done flags seen."""
    envs = make_env(f"gym:{env_id}", num_envs, seed=seed, env_kwargs=env_kwargs)
    ref = reference_vec_env(env_id, num_envs, **env_kwargs)
    single_obs = ref.single_observation_space
    start = int(getattr(ref.single_action_space, "start", 0))
    rng = np.random.default_rng(0)
    counts = {"terminated": 0, "truncated": 0}
    try:
        obs, _ = envs.reset()  # the constructor's seed
        ref_obs, _ = ref.reset(seed=seed)
        np.testing.assert_array_equal(obs["policy"].numpy(), flat(single_obs, ref_obs, num_envs))
        for _ in range(steps):
            action = random_actions(envs.single_action_space, num_envs, rng)
            obs, reward, terminated, truncated, info = envs.step(torch.as_tensor(action))
            ref_action = action + start if isinstance(ref.single_action_space, spaces.Discrete) else action
            ref_obs, ref_reward, ref_term, ref_trunc, ref_info = ref.step(ref_action)
            expected_obs = flat(single_obs, ref_obs, num_envs)
            np.testing.assert_array_equal(obs["policy"].numpy(), expected_obs)
            np.testing.assert_array_equal(reward.numpy(), ref_reward.astype(np.float32))
            np.testing.assert_array_equal(terminated.numpy(), ref_term)
            np.testing.assert_array_equal(truncated.numpy(), ref_trunc)
            expected_final = expected_obs.copy()
            for i in np.flatnonzero(ref_info.get("_final_obs", np.zeros(num_envs, bool))):
                expected_final[i] = spaces.flatten(single_obs, ref_info["final_obs"][i])
            np.testing.assert_array_equal(info["final_obs"]["policy"].numpy(), expected_final)
            assert info["log"] == {}
            counts["terminated"] += int(ref_term.sum())
            counts["truncated"] += int(ref_trunc.sum())
    finally:
        envs.close()
        ref.close()
    return counts


# ---------------------------------------------------------------------------------------
# Step-by-step equality with gymnasium
# ---------------------------------------------------------------------------------------


def test_cartpole_matches_gymnasium():
    counts = assert_same_as_gymnasium("CartPole-v1", num_envs=4, steps=120, seed=3, max_episode_steps=15)
    assert counts["terminated"] > 0 and counts["truncated"] > 0  # both kinds of episode end were exercised


def test_pendulum_matches_gymnasium():
    counts = assert_same_as_gymnasium("Pendulum-v1", num_envs=3, steps=40, seed=7, max_episode_steps=9)
    assert counts["truncated"] > 0


class DictObsEnv(gym.Env):
    """A toy env with a Dict observation (Box + Discrete) and a Discrete action with start=-1."""

    def __init__(self):
        self.observation_space = spaces.Dict(
            {
                "pos": spaces.Box(-10.0, 10.0, shape=(2,), dtype=np.float64),
                "mode": spaces.Discrete(3, start=1),
            }
        )
        self.action_space = spaces.Discrete(3, start=-1)

    def _obs(self):
        return {"pos": self.pos.copy(), "mode": int(self.mode)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.normal(size=2)
        self.mode = int(self.np_random.integers(1, 4))
        return self._obs(), {}

    def step(self, action):
        assert action in (-1, 0, 1), action
        self.pos = self.pos + action + 0.1 * self.np_random.normal(size=2)
        self.mode = 1 + (self.mode + int(action)) % 3
        terminated = bool(np.abs(self.pos).max() > 3.0)
        return self._obs(), float(self.pos.sum()), terminated, False, {}


class MultiDiscreteActionEnv(DictObsEnv):
    def __init__(self):
        super().__init__()
        self.action_space = spaces.MultiDiscrete([2, 2])


gym.register(id="TestDictObs-v0", entry_point=DictObsEnv, max_episode_steps=6)
gym.register(id="TestMultiDiscreteAction-v0", entry_point=MultiDiscreteActionEnv)


def test_dict_observations_and_discrete_start_match_gymnasium():
    envs = make_env("gym:TestDictObs-v0", 2, seed=0)
    # flattened like gymnasium: one-hot "mode" (3) then "pos" (2), keys in sorted order
    assert envs.single_observation_space.shape == (5,) and envs.single_observation_space.dtype == np.float32
    assert envs.single_action_space == spaces.Discrete(3)  # 0-based for the scripts; the adapter adds start
    envs.close()
    counts = assert_same_as_gymnasium("TestDictObs-v0", num_envs=5, steps=40, seed=11)
    assert counts["terminated"] > 0 and counts["truncated"] > 0


def test_tuple_observations_match_gymnasium():
    counts = assert_same_as_gymnasium("Blackjack-v1", num_envs=4, steps=30, seed=2)  # Tuple of Discrete
    assert counts["terminated"] > 0


def test_async_matches_sync():
    n, seed = 3, 5
    sync_env = make_env("gym:CartPole-v1", n, seed=seed, env_kwargs={"max_episode_steps": 10})
    async_env = make_env("gym:CartPole-v1", n, seed=seed, vectorization="async", env_kwargs={"max_episode_steps": 10})
    try:
        a_obs, _ = async_env.reset()
        s_obs, _ = sync_env.reset()
        assert torch.equal(a_obs["policy"], s_obs["policy"])
        gen = torch.Generator().manual_seed(0)
        for _ in range(25):
            action = torch.randint(0, 2, (n,), generator=gen)
            a = async_env.step(action)
            s = sync_env.step(action)
            for x, y in zip(a[1:4], s[1:4]):
                assert torch.equal(x, y)
            assert torch.equal(a[0]["policy"], s[0]["policy"])
            assert torch.equal(a[4]["final_obs"]["policy"], s[4]["final_obs"]["policy"])
    finally:
        sync_env.close()
        async_env.close()


# ---------------------------------------------------------------------------------------
# Contract: types, spaces, seeding, errors
# ---------------------------------------------------------------------------------------


def test_contract_types_and_spaces():
    envs = make_env("gym:Pendulum-v1", 4, device="cpu", seed=1)
    assert isinstance(envs, GymVecEnv)
    assert envs.num_envs == 4 and envs.device == torch.device("cpu") and envs.max_episode_steps == 200
    assert envs.single_observation_space.dtype == np.float32 and envs.single_observation_space.shape == (3,)
    assert isinstance(envs.single_action_space, spaces.Box) and envs.single_action_space.shape == (1,)
    obs, info = envs.reset()
    assert obs.batch_size == torch.Size([4]) and obs["policy"].dtype == torch.float32 and obs["policy"].shape == (4, 3)
    obs, reward, terminated, truncated, info = envs.step(torch.zeros(4))  # [N] accepted for a 1-D Box
    assert reward.dtype == torch.float32 and reward.shape == (4,)
    assert terminated.dtype == torch.bool and truncated.dtype == torch.bool and terminated.shape == (4,)
    assert set(info) == {"final_obs", "log"} and info["final_obs"]["policy"].shape == (4, 3)
    assert envs.state_dict() == {}
    envs.load_state_dict({})
    envs.close()
    assert make_env("gym:CartPole-v1", 2, env_kwargs={"max_episode_steps": 7}).max_episode_steps == 7


def test_seeding_is_reproducible_and_reset_seed_reseeds():
    a = make_env("gym:CartPole-v1", 3, seed=42)
    b = make_env("gym:CartPole-v1", 3, seed=42)
    c = make_env("gym:CartPole-v1", 3, seed=0)
    oa, ob, oc = a.reset()[0]["policy"], b.reset()[0]["policy"], c.reset(seed=42)[0]["policy"]
    assert torch.equal(oa, ob) and torch.equal(oa, oc)
    assert not torch.equal(a.reset(seed=1)[0]["policy"], oa)
    for e in (a, b, c):
        e.close()


def test_errors_are_clear():
    with pytest.raises(ValueError, match="gym:NoSuchEnv-v0"):
        make_env("gym:NoSuchEnv-v0", 2)
    with pytest.raises(TypeError, match="env_kwargs"):
        make_env("gym:CartPole-v1", 2, max_episode_steps=5)
    with pytest.raises(ValueError, match="vectorization"):
        make_env("gym:CartPole-v1", 2, vectorization="threads")
    with pytest.raises(ValueError, match="action space"):
        make_env("gym:TestMultiDiscreteAction-v0", 2)
    envs = make_env("gym:CartPole-v1", 2)
    with pytest.raises(RuntimeError, match="reset"):
        envs.step(torch.zeros(2, dtype=torch.long))
    envs.reset()
    with pytest.raises(ValueError, match="shape"):
        envs.step(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="no restorable state"):
        envs.load_state_dict({"state": torch.zeros(1)})
    envs.close()


def test_returned_tensors_are_never_rewritten_by_later_steps():
    """One host buffer per step is copied to the device (or, on CPU, returned): what a step returned
    keeps its values while later steps run, episode ends and final observations included."""
    envs = make_env("gym:CartPole-v1", 3, seed=0, env_kwargs={"max_episode_steps": 4})
    envs.reset()
    kept, ended = [], 0
    for t in range(10):
        obs, reward, terminated, truncated, info = envs.step(torch.tensor([t % 2, 1, 0]))
        tensors = [obs["policy"], info["final_obs"]["policy"], reward, terminated, truncated]
        kept.append([(x, x.clone()) for x in tensors])
        ended += int((terminated | truncated).sum())
    assert ended > 0
    for pairs in kept:
        for x, copy in pairs:
            assert torch.equal(x, copy)
    envs.close()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    cpu = make_env("gym:Pendulum-v1", 4, seed=2, env_kwargs={"max_episode_steps": 5})
    gpu = make_env("gym:Pendulum-v1", 4, device="cuda", seed=2, env_kwargs={"max_episode_steps": 5})
    assert torch.equal(cpu.reset()[0]["policy"], gpu.reset()[0]["policy"].cpu())
    for t in range(12):
        action = torch.full((4, 1), 0.5 * (t % 3 - 1))
        c = cpu.step(action)
        g = gpu.step(action.cuda())
        assert g[0]["policy"].device.type == "cuda" and g[1].device.type == "cuda"
        assert torch.equal(c[0]["policy"], g[0]["policy"].cpu())
        assert torch.equal(c[4]["final_obs"]["policy"], g[4]["final_obs"]["policy"].cpu())
        for x, y in zip(c[1:4], g[1:4]):
            assert torch.equal(x, y.cpu())


# ---------------------------------------------------------------------------------------
# PPO end to end through the adapter
# ---------------------------------------------------------------------------------------


def run_script(
    tmp_path: Path, *args: str, timeout: int = 300, script: str = "ppo", printed: list | None = None
) -> dict:
    """The summary of a run of algos/`script`.py (ppo.py unless said) with these flags, which must end well, run in
    `tmp_path` (where a simulator's own log files land); what it printed is appended to `printed` where given."""
    # One intra-op thread: faster for these small networks, and immune to a busy machine's oversubscription.
    env = {"OMP_NUM_THREADS": "1", **os.environ, "CI": "1"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "algos" / f"{script}.py"), "--output-dir", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    if printed is not None:
        printed += [proc.stdout, proc.stderr]
    return printed_summary(proc.stdout)


@pytest.mark.slow
def test_ppo_learns_gym_cartpole(tmp_path):
    summary = run_script(
        tmp_path,
        "--env-id",
        "gym:CartPole-v1",
        "--num-envs",
        "16",
        "--num-steps",
        "64",
        "--seed",
        "1",
        "--total-timesteps",
        "100000",
        "--num-eval-envs",
        "8",
        "--eval-interval",
        "5",
        "--target-return",
        "475",
    )
    assert summary["best_eval_return"] >= 475, summary


def test_ppo_runs_gym_halfcheetah(tmp_path):
    """A MuJoCo run's start line comes within its first lines: whatever MuJoCo warns while each env's model compiles
    (MuJoCo 4.0: once per env) is shown once, and no MUJOCO_LOG.TXT is left behind."""
    pytest.importorskip("mujoco")
    printed = []
    summary = run_script(
        tmp_path,
        "--env-id",
        "gym:HalfCheetah-v5",
        "--num-envs",
        "4",
        "--num-steps",
        "16",
        "--num-minibatches",
        "2",
        "--update-epochs",
        "2",
        "--total-timesteps",
        "192",
        "--num-eval-envs",
        "2",
        "--eval-interval",
        "0",
        "--reward-norm",
        printed=printed,
    )
    assert summary["global_step"] == 192 and summary["iteration"] == 3
    assert Path(summary["checkpoints"]["last"]).is_file()
    stdout, stderr = printed
    assert stdout.splitlines()[0].startswith("ppo on gym:HalfCheetah-v5: "), stdout[:2000]
    assert len(stderr.splitlines()) <= 3, stderr[:3000]  # the threads line, a warning or two: no flood
    assert not list(tmp_path.rglob("MUJOCO_LOG.TXT"))


def test_a_mujoco_warning_while_envs_are_made_is_shown_once_and_logged_nowhere(tmp_path, monkeypatch, capsys):
    """The same warning from every env's model, once on the screen, no MUJOCO_LOG.TXT; MuJoCo's own handler after."""
    mujoco = pytest.importorskip("mujoco")
    from common.envs import gym_adapter

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gym_adapter, "MUJOCO_WARNINGS_SHOWN", set())
    model = mujoco.MjModel.from_xml_string(
        "<mujoco><worldbody><body><freejoint/><geom size='1'/></body></worldbody></mujoco>"
    )
    with gym_adapter.mujoco_warnings_once():
        for _ in range(4):  # four envs' models, each warning alike (a NaN position, at time 0)
            data = mujoco.MjData(model)
            data.qpos[0] = float("nan")
            mujoco.mj_step(model, data)
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("MuJoCo warning")]
    assert len(warned) == 1 and "QPOS" in warned[0].upper(), warned
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()
    assert mujoco.get_mju_user_warning() is None  # MuJoCo's own handler (the screen and its log) is back


def test_render_returns_the_frames_of_the_chosen_envs():
    pytest.importorskip("pygame")
    envs = make_env("gym:CartPole-v1", 3, seed=4, render_mode="rgb_array")
    envs.reset()
    frames = envs.render([2])
    reference = gym.make("CartPole-v1", render_mode="rgb_array")
    reference.reset(seed=4 + 2)  # env i is seeded seed + i
    assert len(frames) == 1 and np.array_equal(frames[0], reference.render())
    assert envs.render_fps == reference.metadata["render_fps"]
    envs.close()
    with pytest.raises(ValueError, match="render_mode"):
        make_env("gym:CartPole-v1", 1, render_mode="human")


class _ReportsSuccess(gym.Env):
    """Episodes of 3 steps; at the end, info["is_success"] says whether the last action was 1."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        done = self.t >= 3
        return np.zeros(2, np.float32), 1.0, done, False, ({"is_success": bool(action == 1)} if done else {})


def test_success_at_episode_end_reaches_the_eval_success_rate():
    from common.evaluation import run_episodes

    gym.register("ReportsSuccess-v0", entry_point=_ReportsSuccess)
    envs = make_env("gym:ReportsSuccess-v0", 4, seed=0)
    envs.reset()
    for _ in range(2):
        assert "success" not in envs.step(torch.ones(4, dtype=torch.long))[4]
    info = envs.step(torch.tensor([1, 0, 1, 1]))[4]
    assert info["success"].tolist() == [True, False, True, True]

    class EvenEnvsSucceed(torch.nn.Module):
        def deterministic(self, obs):
            return (torch.arange(obs.shape[0]) % 2 == 0).long()

    result = run_episodes(envs, EvenEnvsSucceed(), episodes=2, seed=1)
    assert result["success_rate"] == 0.5 and result["length"] == 3


# ---------------------------------------------------------------------------------------
# Mirror symmetry: the env's own data_augmentation
# ---------------------------------------------------------------------------------------


class MirroredPoint(gym.Env):
    """A point pushed along a line and kept near 0: symmetric under x -> -x, which it declares with
    `data_augmentation` on the adapter's batched torch tensors (rsl_rl's contract less the env)."""

    observation_space = spaces.Box(-np.inf, np.inf, shape=(3,), dtype=np.float32)  # x, v, step
    action_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.v, self.t = float(self.np_random.uniform(-1.0, 1.0)), 0.0, 0
        return self._obs(), {}

    def step(self, action):
        self.v += 0.1 * float(np.clip(action[0], -1.0, 1.0))
        self.x += 0.1 * self.v
        self.t += 1
        return self._obs(), -(self.x**2), abs(self.x) > 2.0, False, {}

    def _obs(self):
        return np.array([self.x, self.v, self.t], dtype=np.float32)

    def data_augmentation(self, obs=None, actions=None):  # written as rsl_rl's tasks write theirs, indexing rows
        if obs is not None:
            image = obs.clone()
            image["policy"][:, :2] = -image["policy"][:, :2]
            obs = torch.cat([obs, image], dim=0)
        if actions is not None:
            image = actions.clone()
            image[:, 0] = -image[:, 0]
            actions = torch.cat([actions, image], dim=0)
        return obs, actions


gym.register(id="TestMirroredPoint-v0", entry_point=MirroredPoint, max_episode_steps=20)


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_the_envs_own_mirror_is_passed_on_as_is(vectorization):
    """data_augmentation is the unwrapped env's own (sync: the first sub-env's; async: that of an instance built in
    this process), with its contract: originals first, then mirror images; mirroring twice gives the originals.
    An env without one gives the adapter none."""
    n = 4
    envs = make_env("gym:TestMirroredPoint-v0", n, seed=1, vectorization=vectorization)
    try:
        if vectorization == "sync":
            assert envs.data_augmentation == envs.envs.envs[0].unwrapped.data_augmentation
        obs, _ = envs.reset()
        for _ in range(3):
            obs = envs.step(torch.ones(n, 1))[0]
        actions = torch.linspace(-1.0, 1.0, n)[:, None]
        aug_obs, aug_actions = envs.data_augmentation(obs=obs, actions=actions)
        assert aug_obs.batch_size == (2 * n,) and aug_actions.shape == (2 * n, 1)
        assert torch.equal(aug_obs["policy"][:n], obs["policy"]) and torch.equal(aug_actions[:n], actions)
        assert torch.equal(aug_obs["policy"][n:], obs["policy"] * torch.tensor([-1.0, -1.0, 1.0]))
        assert torch.equal(aug_actions[n:], -actions)
        twice, twice_actions = envs.data_augmentation(obs=aug_obs[n:], actions=aug_actions[n:])
        assert torch.equal(twice["policy"][n:], obs["policy"]) and torch.equal(twice_actions[n:], actions)
    finally:
        envs.close()
    for env_id in ("gym:Pendulum-v1", "gym:TestDictObs-v0"):
        plain = make_env(env_id, 2, vectorization=vectorization)
        assert getattr(plain, "data_augmentation", None) is None
        plain.close()


def test_ppo_symmetry_augmentation_runs_on_a_gym_env_with_a_mirror(tmp_path):
    from tests.helpers import load_script, run_main
    from tests.test_scripts import scalars

    summary = run_main(
        load_script("ppo"),
        env_id="gym:TestMirroredPoint-v0",
        symmetry="augmentation",
        num_envs=4,
        num_steps=8,
        num_minibatches=2,
        total_timesteps=96,
        num_eval_envs=2,
        eval_interval=0,
        hidden_sizes=(16,),
        device="cpu",
        progress=False,
        output_dir=str(tmp_path),
        run_name="run",
    )
    assert summary["global_step"] == 96
    assert scalars(tmp_path / "run")["losses/mirror_loss"]


# ---------------------------------------------------------------------------------------
# Atari: image observations and the preset
# ---------------------------------------------------------------------------------------


def _atari_reference(env_id: str, seed: int, preprocess: bool) -> gym.Env:
    import ale_py

    gym.register_envs(ale_py)
    if not preprocess:
        return gym.make(env_id)
    env = gym.wrappers.AtariPreprocessing(gym.make(env_id, frameskip=1), noop_max=30, frame_skip=4, screen_size=84)

    class PressFireAndUp(gym.Wrapper):  # Pong's action 1 is FIRE: the preset presses 1, 2 after a reset
        def reset(self, **kwargs):
            self.env.reset(**kwargs)
            self.env.step(1)
            return self.env.step(2)[0], {}

    return gym.wrappers.FrameStackObservation(PressFireAndUp(env), 4)


@pytest.mark.sims
@pytest.mark.parametrize("preset", [None, "atari-eval"])
def test_atari_frames_are_gymnasiums_as_uint8_images(preset):
    """Without a preset, ALE's [210, 160, 3] frames come channel-first; with "atari-eval", the frames of
    AtariPreprocessing + 4 stacked frames made by hand: uint8 [N, 4, 84, 84]; same rewards."""
    pytest.importorskip("ale_py")
    if preset:
        pytest.importorskip("cv2")
    n, seed = 2, 5
    envs = make_env("gym:ALE/Pong-v5", n, seed=seed, **({"preset": preset} if preset else {}))
    refs = [_atari_reference("ALE/Pong-v5", seed + i, preset is not None) for i in range(n)]
    obs, _ = envs.reset()
    expected = np.stack([r.reset(seed=seed + i)[0] for i, r in enumerate(refs)])
    layout = (lambda x: x) if preset else (lambda x: x.transpose(0, 3, 1, 2))
    assert obs["policy"].dtype == torch.uint8 and envs.single_observation_space.dtype == np.uint8
    assert (
        tuple(obs["policy"].shape[1:])
        == envs.single_observation_space.shape
        == ((4, 84, 84) if preset else (3, 210, 160))
    )
    np.testing.assert_array_equal(obs["policy"].numpy(), layout(expected))
    rng = np.random.default_rng(0)
    for _ in range(30):
        action = rng.integers(0, 6, n)
        obs, reward, terminated, truncated, info = envs.step(torch.as_tensor(action))
        steps = [r.step(a) for r, a in zip(refs, action)]
        np.testing.assert_array_equal(obs["policy"].numpy(), layout(np.stack([s[0] for s in steps])))
        np.testing.assert_array_equal(reward.numpy(), np.array([s[1] for s in steps], dtype=np.float32))
    envs.close()


@pytest.mark.sims
def test_one_channel_frames_get_a_channel_axis():
    pytest.importorskip("ale_py")
    envs = make_env("gym:ALE/Pong-v5", 2, seed=1, env_kwargs={"obs_type": "grayscale"})
    ref = gym.make("ALE/Pong-v5", obs_type="grayscale")  # registered by make_env
    obs, _ = envs.reset()
    assert envs.single_observation_space.shape == (1, 210, 160) and tuple(obs["policy"].shape) == (2, 1, 210, 160)
    np.testing.assert_array_equal(obs["policy"][0, 0].numpy(), ref.reset(seed=1)[0])
    envs.close()


@pytest.mark.sims
def test_atari_preset_ends_an_episode_at_a_lost_life_and_clips_rewards():
    """ "atari": a lost life ends the episode while the game goes on (the next episode starts with a
    life less, not with a new game); "atari-eval": the episode is the whole game."""
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    lives_after_end = {}
    for preset in ("atari", "atari-eval"):
        envs = make_env("gym:ALE/Breakout-v5", 1, seed=2, preset=preset)
        envs.reset()
        ale = envs.envs.envs[0].unwrapped.ale
        for _ in range(3000):
            _, reward, terminated, truncated, _ = envs.step(torch.tensor([1]))  # FIRE: the paddle stays, lives go
            assert reward.item() in (-1.0, 0.0, 1.0) or preset == "atari-eval"
            if terminated.item():
                lives_after_end[preset] = ale.lives()  # after the same-step restart
                break
        envs.close()
    assert lives_after_end == {"atari": 4, "atari-eval": 5}, lives_after_end


@pytest.mark.sims
def test_fire_reset_presses_fire_then_up_after_every_reset_of_a_fire_game():
    """Breakout waits for FIRE: the preset's resets (a new game, or the next life) press FIRE then UP
    (actions 1, 2), a game ending in those presses is reset again; the game is then in play."""
    from common.envs.gym_adapter import FireReset

    class Recorder(gym.Env):
        observation_space, action_space = gym.spaces.Discrete(10), gym.spaces.Discrete(4)

        def __init__(self, end_at=()):
            self.actions, self.resets, self.end_at = [], 0, set(end_at)

        def reset(self, seed=None, options=None):
            self.resets += 1
            return 0, {}

        def step(self, action):
            self.actions.append(int(action))
            return len(self.actions), 0.0, len(self.actions) in self.end_at, False, {}

    env = FireReset(Recorder())
    assert env.reset()[0] == 2 and env.unwrapped.actions == [1, 2] and env.unwrapped.resets == 1
    env = FireReset(Recorder(end_at={1}))  # the game ended at FIRE: reset again, then UP
    assert env.reset()[0] == 2 and env.unwrapped.actions == [1, 2] and env.unwrapped.resets == 2
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    envs = make_env("gym:ALE/Breakout-v5", 1, seed=3, preset="atari")
    envs.reset()
    ale = envs.envs.envs[0].unwrapped.ale
    for _ in range(200):  # NOOPs only: the ball was launched by the reset's FIRE, so a life is lost
        _, _, terminated, _, _ = envs.step(torch.tensor([0]))
        if terminated.item():
            break
    assert terminated.item() and ale.lives() == 4
    envs.close()


@pytest.mark.sims
def test_atari_errors_are_clear(monkeypatch):
    pytest.importorskip("ale_py")
    with pytest.raises(ValueError, match="preset"):
        make_env("gym:ALE/Pong-v5", 1, preset="atari-train")
    with pytest.raises(ValueError, match="ALE"):
        make_env("gym:CartPole-v1", 1, preset="atari")
    monkeypatch.setitem(sys.modules, "cv2", None)
    with pytest.raises(ValueError, match=r"\[atari\]"):
        make_env("gym:ALE/Pong-v5", 1, preset="atari")


# ---------------------------------------------------------------------------------------
# Game scores: what the presets' runs log as returns
# ---------------------------------------------------------------------------------------
class ScoreRecorder(gym.Env):
    """A stand-in for an ALE game, with what the preset's wrappers use of one (ale.lives(), the screen,
    the action meanings, frameskip=1): 3 lives, one lost every 64 frames, 2 points every 16th frame from
    frame 32 (after the no-op starts) and 5 at each lost life. A game is 192 frames and scores 37 whatever
    the actions; per life, clipped, it is a few points."""

    GAME_SCORE = 2 * len(range(32, 193, 16)) + 5 * 3
    metadata = {"render_modes": []}
    observation_space, action_space = spaces.Box(0, 255, (210, 160, 3), np.uint8), spaces.Discrete(3)

    def __init__(self, frameskip: int = 1, **kwargs):
        self._frameskip, self.frame, self.ale = frameskip, 0, self  # the ALE interface's few calls, here

    def get_action_meanings(self):  # FIRE as action 1: the preset presses FIRE, UP after every reset (steps of its own)
        return ["NOOP", "FIRE", "UP"]

    def lives(self) -> int:
        return 3 - self.frame // 64

    def getScreenGrayscale(self, out):
        out[:] = self.frame % 251

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.frame = 0
        return np.zeros((210, 160, 3), np.uint8), {}

    def step(self, action):
        self.frame += 1
        reward = 2.0 * (self.frame % 16 == 0 and self.frame >= 32) + 5.0 * (self.frame % 64 == 0)
        return np.zeros((210, 160, 3), np.uint8), reward, self.frame >= 192, False, {}


@pytest.fixture
def score_recorder(monkeypatch):
    """ALE/ScoreRecorder-v5 registered; OpenCV's resize stood in for where the [atari] extra is not installed."""
    try:
        import cv2  # noqa: F401
    except ImportError:

        def resize(image, size, interpolation=None):  # nearest pixels: the recorder's frames are flat anyway
            rows, cols = (np.linspace(0, n - 1, m).astype(int) for n, m in zip(image.shape, size[::-1]))
            return image[rows][:, cols]

        import types

        monkeypatch.setitem(sys.modules, "cv2", types.SimpleNamespace(resize=resize, INTER_AREA=3))
    gym.register("ALE/ScoreRecorder-v5", entry_point=ScoreRecorder)
    yield "gym:ALE/ScoreRecorder-v5"
    gym.registry.pop("ALE/ScoreRecorder-v5")


def test_the_presets_report_the_games_reward_and_end_beside_the_learners(score_recorder):
    """ "atari": a lost life ends the learner's episode and its rewards are clipped, while info's game_reward
    and game_over add up to the game's score over the whole game (the steps the wrappers take inside a
    reset included); "atari-eval": the episode is the game."""
    for preset, lives_per_game in (("atari", 3), ("atari-eval", 1)):
        envs = make_env(score_recorder, 2, seed=1, preset=preset)
        envs.reset()
        games, score, episodes = [], torch.zeros(2), 0
        for _ in range(400):
            _, reward, terminated, truncated, info = envs.step(torch.randint(0, 3, (2,)))
            assert preset == "atari-eval" or set(reward.tolist()) <= {0.0, 1.0}
            score += info["game_reward"]
            episodes += int((terminated | truncated).sum())
            for i in torch.nonzero(info["game_over"]).flatten().tolist():
                games.append(score[i].item())
                score[i] = 0.0
        envs.close()
        assert len(games) >= 4 and games == [ScoreRecorder.GAME_SCORE] * len(games), (preset, games)
        assert episodes in range(lives_per_game * len(games), lives_per_game * (len(games) + 2)), (preset, episodes)


@pytest.mark.parametrize("algo", ["ppo", "pqn", "ppo_lstm"])
def test_a_run_with_the_training_preset_alone_logs_game_scores_in_training_and_evaluation(
    algo, score_recorder, tmp_path, capsys
):
    """Only --env-kwargs '{"preset": "atari"}': the eval envs take "atari-eval" (a printed line says so), and
    both charts/episodic_return and eval/episodic_return are the game's score, not a life's clipped sum."""
    from tests.helpers import load_script, run_main

    summary = run_main(
        load_script(algo),
        env_id=score_recorder,
        env_kwargs='{"preset": "atari"}',
        encoder="nature",
        num_envs=2,
        num_steps=32,
        num_minibatches=2,
        update_epochs=1,
        total_timesteps=512,
        num_eval_envs=1,
        eval_episodes=1,
        eval_interval=4,
        hidden_sizes=(16,),
        output_dir=str(tmp_path),
        seed=1,
    )
    assert 'eval envs: preset "atari-eval"' in capsys.readouterr().out
    assert summary["last_train_return"] == ScoreRecorder.GAME_SCORE
    assert summary["best_eval_return"] == ScoreRecorder.GAME_SCORE
