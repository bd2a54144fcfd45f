"""The `envpool:` adapter: envpool's own envs, with the finished ones restarted in the same step.

Reference: for each env i of the adapter, a one-env pool of envpool seeded `seed + i` (the seed
envpool gives env i of a pool), stepped with the same actions in envpool's own mode: a finished env
restarts at its next step call, which returns the first observation of the next episode. The adapter
must give, in the step that ends an episode, that first observation as `obs` and the last one as
`info["final_obs"]`; and otherwise the same observations, rewards and flags.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from common.envs import make_env

pytestmark = pytest.mark.sims
envpool = pytest.importorskip("envpool", reason="the envpool extra is not installed")


def one_env_pools(task: str, num_envs: int, seed: int, **kwargs) -> list:
    return [envpool.make(task, env_type="gymnasium", num_envs=1, seed=seed + i, **kwargs) for i in range(num_envs)]


@pytest.mark.parametrize("task, steps", [("CartPole-v1", 150), ("Pendulum-v1", 230)])
def test_matches_envpool_step_by_step_with_same_step_autoreset(task, steps):
    n, seed = 3, 11
    envs = make_env(f"envpool:{task}", n, seed=seed, max_episode_steps=40 if task == "CartPole-v1" else 200)
    refs = one_env_pools(task, n, seed, max_episode_steps=40 if task == "CartPole-v1" else 200)
    obs, _ = envs.reset()
    np.testing.assert_array_equal(
        obs["policy"].numpy(), np.concatenate([r.reset()[0] for r in refs]).astype(np.float32)
    )
    rng = np.random.default_rng(0)
    space = envs.single_action_space
    ends = 0
    for _ in range(steps):
        if isinstance(space, spaces.Discrete):
            action = rng.integers(0, space.n, n)
        else:
            action = rng.uniform(space.low, space.high, (n, *space.shape)).astype(np.float32)
        obs, reward, terminated, truncated, info = envs.step(torch.as_tensor(action))
        for i, ref in enumerate(refs):
            r_obs, r_reward, r_term, r_trunc, _ = ref.step(action[i : i + 1].astype(ref.action_space.dtype))
            np.testing.assert_array_equal(info["final_obs"]["policy"][i].numpy(), r_obs[0].astype(np.float32))
            assert reward[i].item() == np.float32(r_reward[0]) and terminated[i].item() == r_term[0]
            assert truncated[i].item() == r_trunc[0]
            if r_term[0] or r_trunc[0]:  # envpool restarts it at the next call, whatever the action
                r_obs = ref.step(action[i : i + 1].astype(ref.action_space.dtype))[0]
                ends += 1
            np.testing.assert_array_equal(obs["policy"][i].numpy(), r_obs[0].astype(np.float32))
    assert ends >= 3
    envs.close()


def test_dict_observations_are_flattened_in_key_order():
    envs = make_env("envpool:CheetahRun-v1", 2, seed=1)
    ref = envpool.make("CheetahRun-v1", env_type="gymnasium", num_envs=2, seed=1)
    obs, _ = envs.reset()
    r_obs, _ = ref.reset()
    expected = np.concatenate([r_obs[k] for k in sorted(r_obs)], axis=1).astype(np.float32)
    np.testing.assert_array_equal(obs["policy"].numpy(), expected)
    assert envs.single_observation_space.shape == (expected.shape[1],)
    assert isinstance(envs.single_action_space, spaces.Box) and envs.single_action_space.shape == (6,)
    envs.close()


def test_atari_preset_gives_stacked_uint8_frames_clipped_rewards_and_episodic_lives():
    """Pong: uint8 [N, 4, 84, 84] frames, each step's stack the previous one shifted by a frame.
    Breakout: "atari" ends an episode at the first lost life, "atari-eval" only at the end of the game."""
    envs = make_env("envpool:Pong-v5", 2, seed=1, preset="atari")
    obs, _ = envs.reset()
    assert obs["policy"].dtype == torch.uint8 and tuple(obs["policy"].shape) == (2, 4, 84, 84)
    assert envs.single_observation_space.shape == (4, 84, 84) and envs.single_observation_space.dtype == np.uint8
    for _ in range(20):
        new, reward, terminated, truncated, _ = envs.step(torch.randint(0, 6, (2,)))
        assert torch.equal(new["policy"][:, :3], obs["policy"][:, 1:])
        assert set(reward.tolist()) <= {-1.0, 0.0, 1.0}
        obs = new
    assert obs["policy"].float().std() > 0  # frames, not blanks
    frames = envs.render([1])
    assert frames[0].shape == (168, 168, 3) and np.array_equal(frames[0][::2, ::2, 0], obs["policy"][1, -1].numpy())
    envs.close()

    steps = {}
    for preset in ("atari", "atari-eval"):
        envs = make_env("envpool:Breakout-v5", 1, seed=3, preset=preset)
        envs.reset()
        for t in range(1, 5000):
            _, _, terminated, truncated, _ = envs.step(torch.tensor([1]))  # FIRE: the ball comes, the paddle stays
            if terminated.item() or truncated.item():
                steps[preset] = t
                break
        envs.close()
    assert 0 < steps["atari"] < steps["atari-eval"] / 3, (
        steps
    )  # the first of five lives lost ends "atari"'s episode, not the game


def test_atari_preset_plays_the_whole_game_over_its_lives_and_reports_the_games_score():
    """ "atari": each of Breakout's five lives is an episode of the learner, and the game goes on through
    them (envpool's reset(env_ids) would start a new game at every lost life); info's game_reward is the
    unclipped reward and game_over marks the game's end: with "atari-eval" they are the reward and the end."""
    for preset, episodes_per_game in (("atari", 5), ("atari-eval", 1)):
        torch.manual_seed(0)  # the random actions: a fixed draw, whose games score
        envs = make_env("envpool:Breakout-v5", 2, seed=4, preset=preset)
        envs.reset()
        episodes, games, score = torch.zeros(2), [], torch.zeros(2)
        for _ in range(4000):
            _, reward, terminated, truncated, info = envs.step(torch.randint(0, 4, (2,)))
            episodes += terminated | truncated
            score += info["game_reward"]
            if preset == "atari-eval":
                assert torch.equal(info["game_reward"], reward) and torch.equal(
                    info["game_over"], terminated | truncated
                )
            for i in torch.nonzero(info["game_over"]).flatten().tolist():
                games.append((int(episodes[i]), score[i].item()))
                episodes[i], score[i] = 0, 0.0
            if len(games) >= 3:
                break
        envs.close()
        assert len(games) >= 3 and all(n == episodes_per_game for n, _ in games), (preset, games)
        assert sum(s for _, s in games) > 0, games


def test_errors_are_clear():
    with pytest.raises(ValueError, match="Pong-v5"):
        make_env("envpool:Pong-v4x", 2)
    with pytest.raises(ValueError, match="preset"):
        make_env("envpool:Pong-v5", 2, preset="atari2")
    with pytest.raises(ValueError, match="frames from image observations"):
        make_env("envpool:CartPole-v1", 2, render_mode="rgb_array")
    envs = make_env("envpool:CartPole-v1", 2)
    with pytest.raises(RuntimeError, match="reset"):
        envs.step(torch.zeros(2, dtype=torch.int64))
    envs.reset()
    with pytest.raises(ValueError, match="shape"):
        envs.step(torch.zeros(3, dtype=torch.int64))
    assert envs.state_dict() == {}
    envs.close()


def test_ppo_runs_on_envpool_cartpole(tmp_path):
    from tests.test_gym_adapter import run_script

    summary = run_script(
        tmp_path,
        "--env-id",
        "envpool:CartPole-v1",
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
    )
    assert summary["global_step"] == 192 and summary["iteration"] == 3


def test_ppo_runs_on_envpool_pong_from_pixels(tmp_path):
    """A few iterations of ppo.py on Atari frames on a CPU, with the training and evaluation presets."""
    from tests.test_gym_adapter import run_script

    summary = run_script(
        tmp_path,
        "--env-id",
        "envpool:Pong-v5",
        "--env-kwargs",
        '{"preset": "atari"}',
        "--eval-env-kwargs",
        '{"preset": "atari-eval"}',
        "--encoder",
        "nature",
        "--num-envs",
        "4",
        "--num-steps",
        "16",
        "--num-minibatches",
        "2",
        "--update-epochs",
        "1",
        "--total-timesteps",
        "192",
        "--num-eval-envs",
        "1",
        "--eval-interval",
        "0",
    )
    assert summary["global_step"] == 192 and summary["iteration"] == 3


@pytest.mark.parametrize("algo", ["ppo", "pqn"])
def test_the_atari_id_alone_brings_the_scripts_atari_set(algo, tmp_path):
    """`--env-id envpool:Pong-v5` is all a run needs: the script takes its atari set (the preset's frames, lives and
    clipped rewards, the nature CNN under its heads, its hyperparameters) from the id, which runs on real frames here,
    only its sizes made small for a CPU."""
    import json

    from tests.test_gym_adapter import run_script

    small = ["--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2", "--total-timesteps", "128"]
    summary = run_script(tmp_path, "--env-id", "envpool:Pong-v5", *small, "--eval-interval", "0", script=algo)
    assert summary["global_step"] == 128 and summary["iteration"] == 2
    config = json.loads((Path(summary["run_dir"]) / "config.json").read_text())
    assert config["settings"] == "atari" and config["env_kwargs"] == '{"preset": "atari"}', config
    assert config["encoder"] == "nature" and list(config["hidden_sizes"]) == [], config


def test_mujoco_playground_state_is_the_policy_group_and_privileged_state_the_critic_group():
    envs = make_env("envpool:MuJoCoPlayground/Go1JoystickFlatTerrain-v1", 2, seed=1)
    ref = envpool.make("MuJoCoPlayground/Go1JoystickFlatTerrain-v1", env_type="gymnasium", num_envs=2, seed=1)
    obs, _ = envs.reset()
    r_obs, _ = ref.reset()
    np.testing.assert_array_equal(obs["policy"].numpy(), r_obs["state"].astype(np.float32))
    np.testing.assert_array_equal(obs["critic"].numpy(), r_obs["privileged_state"].astype(np.float32))
    assert envs.single_observation_space.shape == (r_obs["state"].shape[1],)
    assert envs.single_critic_observation_space.shape == (r_obs["privileged_state"].shape[1],)
    action = np.zeros((2, envs.single_action_space.shape[0]), np.float32)
    obs, reward, terminated, truncated, info = envs.step(torch.from_numpy(action))
    r_obs, r_reward, *_ = ref.step(action.astype(ref.action_space.dtype))
    np.testing.assert_array_equal(info["final_obs"]["critic"].numpy(), r_obs["privileged_state"].astype(np.float32))
    np.testing.assert_array_equal(reward.numpy(), r_reward.astype(np.float32))
    envs.close()


def test_a_step_crosses_to_the_device_in_one_copy():
    """A step's results (observation groups, final observations, rewards, flags, the game's reward and end) reach
    the device in one host-to-device copy of one host buffer (pinned on CUDA), not one per tensor. The device
    here is "meta" (no data: the copies are counted, not made)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountCopies(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.to_device = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
                source = args[1] if func is torch.ops.aten.copy_.default else args[0]
                target = args[0] if func is torch.ops.aten.copy_.default else out
                self.to_device += source.device.type == "cpu" and target.device.type == "meta"
            return out

    for task, kwargs in (("Pong-v5", {"preset": "atari"}), ("MuJoCoPlayground/Go1JoystickFlatTerrain-v1", {})):
        envs = make_env(f"envpool:{task}", 2, device="meta", seed=1, **kwargs)
        envs.reset()
        action = torch.zeros(
            (2, *envs.single_action_space.shape),
            dtype=torch.int64 if not envs.single_action_space.shape else torch.float32,
        )
        for _ in range(3):
            with CountCopies() as counter:
                obs, *_, info = envs.step(action)
            assert counter.to_device == 1, (task, counter.to_device)
        assert obs["policy"].device.type == "meta" and info["final_obs"]["policy"].device.type == "meta"
        envs.close()
