"""The `mjlab:` adapter: contract shapes and dtypes, true final observations, PPO end to end.

Skipped when mjlab is not installed. The light task is Mjlab-Cartpole-Balance (5-dim actor and
critic observations, 1 action); on CPU, MuJoCo Warp compiles its kernels on first use (about a
minute, cached on disk afterwards), then a step of a few envs takes tens of milliseconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("mjlab")

from common.envs import make_env  # noqa: E402
from common.envs.mjlab_adapter import ManagerBasedEnvAdapter  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TASK = "mjlab:Mjlab-Cartpole-Balance"
STEP_DT = 0.05  # the task's control period (timestep 0.01 s, decimation 5)


def episode_steps(steps: int, finite_horizon: bool = False):
    """A `configure` hook giving episodes of `steps` control steps."""

    def configure(cfg):
        cfg.episode_length_s = (steps - 0.5) * STEP_DT  # mjlab rounds the length in steps up
        cfg.is_finite_horizon = finite_horizon

    return configure


def actions(num_envs: int, steps: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.rand(steps, num_envs, 1, generator=gen) * 2 - 1


def test_contract_shapes_and_dtypes():
    n = 3
    envs = make_env(TASK, n, seed=1, configure=episode_steps(4))
    try:
        assert isinstance(envs, ManagerBasedEnvAdapter)
        assert envs.num_envs == n and envs.device == torch.device("cpu") and envs.max_episode_steps == 4
        assert envs.single_observation_space.shape == (5,) and envs.single_observation_space.dtype == np.float32
        assert envs.single_critic_observation_space.shape == (5,)
        assert envs.single_action_space.shape == (1,)
        obs, info = envs.reset(seed=1)
        assert set(obs.keys()) == {"policy", "critic"} and obs.batch_size == torch.Size([n])
        assert obs["policy"].dtype == torch.float32 and obs["policy"].shape == (n, 5) and obs["critic"].shape == (n, 5)
        seen_log = {}
        for t in range(4):
            obs, reward, terminated, truncated, info = envs.step(torch.zeros(n))  # [N] accepted for one action
            assert reward.dtype == torch.float32 and reward.shape == (n,)
            assert terminated.dtype == torch.bool and truncated.dtype == torch.bool and truncated.shape == (n,)
            assert set(info) == {"final_obs", "log"}
            assert set(info["final_obs"].keys()) == {"policy", "critic"} and info["final_obs"]["critic"].shape == (n, 5)
            for key, value in info["log"].items():
                assert isinstance(value, torch.Tensor) and value.shape == () and value.dtype == torch.float32
            seen_log.update(info["log"])
        assert truncated.all() and not terminated.any()  # the time limit of 4 steps, bootstrapped
        assert "Episode_Reward/smooth_reward" in seen_log  # episode statistics forwarded at the reset
        assert envs.state_dict() == {}
        envs.load_state_dict({})
        with pytest.raises(ValueError, match="shape"):
            envs.step(torch.zeros(n, 2))
    finally:
        envs.close()


def rollout(envs, acts: torch.Tensor):
    envs.reset(seed=7)  # re-seeds the generators mjlab draws from: both runs see the same draws
    out = []
    for a in acts:
        obs, reward, terminated, truncated, info = envs.step(a)
        out.append((obs.clone(), info["final_obs"].clone(), truncated.clone()))
    return out


def test_terminal_final_obs_is_the_true_last_observation():
    """An env whose episodes end after 4 steps reports, as final_obs, exactly the observation an
    env without the time limit sees after step 4; its returned obs is the new episode's first."""
    n, steps = 3, 4
    acts = actions(n, steps)
    short = make_env(TASK, n, seed=1, configure=episode_steps(steps))
    short_run = rollout(short, acts)
    short.close()
    long = make_env(TASK, n, seed=1, configure=episode_steps(100))
    long_run = rollout(long, acts)
    long.close()
    for t in range(steps - 1):
        assert not short_run[t][2].any()
        for key in ("policy", "critic"):
            assert torch.equal(short_run[t][0][key], long_run[t][0][key])
    obs, final_obs, truncated = short_run[-1]
    assert truncated.all()
    for key in ("policy", "critic"):  # policy observations carry noise: equal draws, equal values
        assert torch.equal(final_obs[key], long_run[-1][0][key])
        assert not torch.allclose(obs[key], final_obs[key])  # reset: a new episode's first observation


def test_pre_step_final_obs_is_the_previous_observation():
    n = 2
    envs = make_env(TASK, n, seed=1, configure=episode_steps(3), final_obs="pre_step")
    try:
        prev, _ = envs.reset(seed=3)
        for a in actions(n, 3):
            obs, _, _, truncated, info = envs.step(a)
            expected = prev["critic"] if truncated.all() else obs["critic"]
            assert torch.equal(info["final_obs"]["critic"], expected)
            prev = obs
        assert truncated.all()
    finally:
        envs.close()


def test_finite_horizon_time_limit_is_terminal():
    envs = make_env(TASK, 2, seed=1, configure=episode_steps(2, finite_horizon=True))
    try:
        envs.reset()
        for a in actions(2, 2):
            _, _, terminated, truncated, _ = envs.step(a)
        assert terminated.all()  # no bootstrap at a finite horizon
    finally:
        envs.close()


def test_errors_are_clear():
    with pytest.raises(ValueError, match="Mjlab-Cartpole-Balance"):
        make_env("mjlab:Mjlab-Cartpole-Balanse", 2)
    with pytest.raises(ValueError, match="final_obs"):
        make_env(TASK, 2, final_obs="exact")


def test_ppo_runs_mjlab_with_asymmetric_critic(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "algos" / "ppo.py"), "--env-id", TASK, "--num-envs", "4", "--num-steps", "8",
         "--num-minibatches", "2", "--total-timesteps", "64", "--num-eval-envs", "2", "--eval-interval", "0",
         "--output-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={"OMP_NUM_THREADS": "1", **os.environ, "CI": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["global_step"] == 64 and summary["iteration"] == 2
    checkpoint = torch.load(summary["checkpoints"]["last"], weights_only=True)
    assert "critic_obs_rms.mean" in checkpoint["model"]  # the critic read the task's "critic" group
    assert checkpoint["model"]["critic.0.weight"].shape[1] == 5
