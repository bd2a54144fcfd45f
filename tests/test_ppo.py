"""algos/ppo.py: learning, exact resume, checkpoints, truncation bootstrapping, logging, errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.envs import make_env
from tests.helpers import inject_nan_rewards, load_script, run, subprocess_env, torchrun_cmd

ppo = load_script("ppo")


def train(tmp_path, **overrides) -> dict:
    """Run ppo.main in this process (no interpreter start-up: most of a small run's cost)."""
    kwargs = dict(output_dir=str(tmp_path), run_name="run", progress=False, num_envs=64, num_steps=16,
                  total_timesteps=64 * 16 * 4, eval_interval=0, num_eval_envs=8)
    kwargs.update(overrides)
    return ppo.main(ppo.Args(**kwargs))


def script(*args, env=None, timeout=300):
    return run([sys.executable, "algos/ppo.py", *args], timeout=timeout, env=env)


# --------------------------------------------------------------------------------------------
# learning
# --------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cartpole_learns_with_default_settings(tmp_path, seed):
    """Default hyperparameters, 4096 envs: eval return >= 475 within 3M env steps."""
    summary = train(tmp_path, seed=seed, num_envs=4096, num_steps=24, total_timesteps=3_000_000,
                    eval_interval=2, num_eval_envs=64, target_return=475.0)
    assert summary["best_eval_return"] >= 475.0, summary
    assert summary["global_step"] <= 3_000_000


# --------------------------------------------------------------------------------------------
# GAE and truncation
# --------------------------------------------------------------------------------------------
def gae_reference(rewards, values, next_value, final_values, terminated, truncated, gamma, lam):
    """Textbook GAE, one env at a time, with episodes split at every end."""
    T, N = rewards.shape
    adv = torch.zeros(T, N, dtype=torch.float64)
    for n in range(N):
        gae = 0.0
        for t in reversed(range(T)):
            if terminated[t, n]:
                delta, gae = rewards[t, n] - values[t, n], 0.0
            elif truncated[t, n]:
                delta, gae = rewards[t, n] + gamma * final_values[t, n] - values[t, n], 0.0
            else:
                nv = next_value[n] if t == T - 1 else values[t + 1, n]
                delta = rewards[t, n] + gamma * nv - values[t, n]
            gae = delta + gamma * lam * gae
            adv[t, n] = gae
    return adv


def test_gae_matches_reference_with_terminations_and_truncations():
    g = torch.Generator().manual_seed(0)
    T, N = 12, 6
    r, v, fv = (torch.randn(T, N, generator=g, dtype=torch.float64) for _ in range(3))
    nv = torch.randn(N, generator=g, dtype=torch.float64)
    term = torch.rand(T, N, generator=g) < 0.15
    trunc = torch.rand(T, N, generator=g) < 0.15
    adv, ret = ppo.compute_advantages(r, v, nv, fv, term, trunc, 0.97, 0.9)
    expected = gae_reference(r, v, nv, fv, term, trunc, 0.97, 0.9)
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected + v)


def test_pendulum_truncation_is_bootstrapped_not_terminal():
    """Pendulum never terminates: every episode ends by truncation at the time limit. Its value
    target there must be r + gamma * V(final_obs), not r, or the critic learns that the time
    limit is an absorbing state with zero future cost."""
    envs = make_env("Pendulum-v1", 8, "cpu", seed=0, max_episode_steps=10)
    obs, _ = envs.reset(seed=0)
    rows = {"r": [], "term": [], "trunc": [], "final": []}
    for _ in range(25):
        obs, r, term, trunc, info = envs.step(torch.rand(8, 1) * 4 - 2)
        rows["r"].append(r)
        rows["term"].append(term)
        rows["trunc"].append(trunc)
        rows["final"].append(info["final_obs"]["policy"])
    rewards, term, trunc = torch.stack(rows["r"]).double(), torch.stack(rows["term"]), torch.stack(rows["trunc"])
    assert not term.any() and trunc[9].all() and trunc[19].all()
    value = lambda o: o[..., 0].double() * 3.0 + 1.0  # any critic that is not zero at the final obs
    final_values = value(torch.stack(rows["final"]))
    values = torch.zeros(25, 8, dtype=torch.float64)
    _, returns = ppo.compute_advantages(rewards, values, torch.zeros(8, dtype=torch.float64), final_values, term, trunc, 0.99, 1.0)
    _, returns_as_terminal = ppo.compute_advantages(rewards, values, torch.zeros(8, dtype=torch.float64), final_values, trunc, trunc, 0.99, 1.0)
    # at the truncation step the two differ by exactly gamma * V(final_obs) ...
    torch.testing.assert_close(returns[9] - returns_as_terminal[9], 0.99 * final_values[9])
    # ... and that future value flows back through the whole episode with gamma^k
    torch.testing.assert_close(returns[0] - returns_as_terminal[0], 0.99**10 * final_values[9])


# --------------------------------------------------------------------------------------------
# checkpoints and exact resume
# --------------------------------------------------------------------------------------------
def _final_model(run_dir: Path):
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)


@pytest.mark.parametrize(
    "env_id,extra",
    [
        ("Pendulum-v1", dict(lr_schedule="linear", reward_norm=True)),
        ("CartPole-v1", dict(lr_schedule="adaptive", eval_interval=2)),
    ],
)
def test_resume_is_bit_identical_to_uninterrupted_run(tmp_path, env_id, extra):
    common = dict(env_id=env_id, num_envs=32, num_steps=8, total_timesteps=32 * 8 * 6, save_interval=100, **extra)
    full = train(tmp_path / "a", **common)
    # the same run stopped after iterations 1 and 2 (wall-clock budget of 0 s), then resumed to the end
    first = train(tmp_path / "b", max_wall_seconds=0.0, **common)
    assert first["iteration"] == 1 and first["stop_reason"] == "max_wall_seconds"
    second = train(tmp_path / "b", resume="auto", max_wall_seconds=0.0, **common)
    assert second["iteration"] == 2
    last = train(tmp_path / "b", resume="auto", **common)
    assert last["global_step"] == full["global_step"] == 32 * 8 * 6
    a, b = _final_model(Path(full["run_dir"])), _final_model(Path(last["run_dir"]))
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert a["learning_rate"] == b["learning_rate"]
    assert a["optimizer"]["state"][0]["exp_avg"].equal(b["optimizer"]["state"][0]["exp_avg"])


def test_checkpoint_loads_with_weights_only_and_eval_only(tmp_path):
    summary = train(tmp_path, env_id="Pendulum-v1", eval_interval=2)
    state = torch.load(Path(summary["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    assert state["algo"] == "ppo" and state["env_id"] == "Pendulum-v1" and state["iteration"] == 4
    assert {"obs_rms.mean", "obs_rms.count", "log_std"} <= set(state["model"])
    assert (Path(summary["run_dir"]) / "checkpoints" / "best.pt").is_file()
    saved = json.loads((Path(summary["run_dir"]) / "summary.json").read_text())
    assert saved["global_step"] == 64 * 16 * 4 and saved["best_eval_return"] is not None
    result = train(tmp_path, env_id="Pendulum-v1", eval_only=True, resume=str(Path(summary["run_dir"]) / "checkpoints" / "best.pt"))
    assert result["eval_return"] == pytest.approx(saved["best_eval_return"], abs=1e-9) or result["eval_return"] < 0


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1", "MountainCar-v0", "Pendulum-v1", "MountainCarContinuous-v0"])
def test_smoke_every_builtin_env(tmp_path, env_id):
    summary = train(tmp_path, env_id=env_id, total_timesteps=64 * 16 * 2, eval_interval=2, hidden_sizes=(32, 32))
    assert summary["global_step"] == 64 * 16 * 2 and summary["iteration"] == 2


# --------------------------------------------------------------------------------------------
# logging
# --------------------------------------------------------------------------------------------
def test_tensorboard_tags_are_written(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    summary = train(tmp_path, env_id="CartPole-v1", eval_interval=2, total_timesteps=64 * 16 * 6)
    acc = EventAccumulator(summary["run_dir"])
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    expected = {
        "charts/episodic_return", "charts/episodic_length", "charts/SPS", "charts/learning_rate",
        "losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl", "losses/clipfrac",
        "losses/explained_variance", "eval/episodic_return", "eval/episodic_length",
    }
    assert expected <= tags, expected - tags
    steps = [e.step for e in acc.Scalars("charts/SPS")]
    assert steps == [64 * 16 * i for i in range(1, 7)]  # x-axis is the global step
    assert "hyperparameters/text_summary" in acc.Tags()["tensors"]


def test_track_mirrors_to_wandb_offline(tmp_path):
    pytest.importorskip("wandb")
    env = subprocess_env()
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(tmp_path))
    out = script("--track", "--num-envs", "16", "--num-steps", "8", "--total-timesteps", "256", "--eval-interval", "0",
                 "--output-dir", str(tmp_path), "--run-name", "tracked", env=env)
    assert out.returncode == 0, out.stdout[-3000:]
    assert list((tmp_path / "tracked").rglob("offline-run-*")), "no offline wandb run was written"


# --------------------------------------------------------------------------------------------
# torchrun
# --------------------------------------------------------------------------------------------
@pytest.mark.distributed
def test_two_process_torchrun_keeps_ranks_in_sync(tmp_path):
    iterations, num_envs, num_steps = 3, 32, 8
    cmd = torchrun_cmd(2, ["algos/ppo.py", "--env-id", "Pendulum-v1", "--num-envs", str(num_envs), "--num-steps",
                           str(num_steps), "--total-timesteps", str(2 * num_envs * num_steps * iterations),
                           "--eval-interval", "2", "--reward-norm", "--output-dir", str(tmp_path), "--run-name", "ddp"])
    out = run(cmd, timeout=240)
    assert out.returncode == 0, out.stdout[-4000:]
    summary = json.loads((tmp_path / "ddp" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["params_in_sync"] is True
    assert summary["global_step"] == num_envs * 2 * num_steps * iterations
    state = torch.load(tmp_path / "ddp" / "checkpoints" / "last.pt", weights_only=True)
    assert len(state["rng"]) == 2 and len(state["env"]) == 2


# --------------------------------------------------------------------------------------------
# bad input: a clear one-line cause, before training
# --------------------------------------------------------------------------------------------
def test_unknown_env_lists_known_ids(tmp_path):
    out = script("--env-id", "CartPole-v9", "--output-dir", str(tmp_path))
    assert out.returncode != 0 and "CartPole-v1" in out.stdout and "Pendulum-v1" in out.stdout


def test_batch_that_does_not_divide(tmp_path):
    out = script("--num-envs", "10", "--num-steps", "3", "--num-minibatches", "4", "--output-dir", str(tmp_path))
    assert out.returncode != 0 and "does not divide" in out.stdout and "Traceback" not in out.stdout


def test_unwritable_output_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = script("--output-dir", str(blocker / "sub"), "--num-envs", "8")
    assert out.returncode != 0 and "cannot write the run directory" in out.stdout and "Traceback" not in out.stdout


def test_corrupt_and_foreign_checkpoints(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x00" * 100)
    out = script("--resume", str(bad), "--output-dir", str(tmp_path), "--num-envs", "8")
    assert out.returncode != 0 and "truncated or corrupt" in out.stdout and "Traceback" not in out.stdout
    summary = train(tmp_path, env_id="Pendulum-v1", total_timesteps=64 * 16)
    last = Path(summary["run_dir"]) / "checkpoints" / "last.pt"
    out = script("--resume", str(last), "--env-id", "CartPole-v1", "--output-dir", str(tmp_path), "--num-envs", "8")
    assert out.returncode != 0 and "--env-id Pendulum-v1" in out.stdout and "Traceback" not in out.stdout


def test_track_without_wandb(tmp_path):
    fake = tmp_path / "nowandb" / "wandb"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('wandb is not installed')\n")
    env = subprocess_env()
    env["PYTHONPATH"] = str(fake.parent) + os.pathsep + env["PYTHONPATH"]
    out = script("--track", "--output-dir", str(tmp_path), "--num-envs", "8", env=env)
    assert out.returncode != 0 and "--track needs wandb" in out.stdout and "Traceback" not in out.stdout


def test_nan_guard_stops_with_name_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    inject_nan_rewards(ppo, monkeypatch, after=40)  # from iteration 3 on
    with pytest.raises(FloatingPointError, match="non-finite rewards.* at iteration 3"):
        train(tmp_path, save_interval=1, total_timesteps=64 * 16 * 6)
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert state["iteration"] == 2 and all(torch.isfinite(v).all() for v in state["model"].values())


def test_checkpoint_of_another_network_shape(tmp_path):
    summary = train(tmp_path, env_id="Pendulum-v1", total_timesteps=64 * 16, hidden_sizes=(32, 32))
    last = Path(summary["run_dir"]) / "checkpoints" / "last.pt"
    out = script("--resume", str(last), "--env-id", "Pendulum-v1", "--hidden-sizes", "64", "64",
                 "--output-dir", str(tmp_path), "--num-envs", "8")
    assert out.returncode != 0 and "--hidden-sizes 32 32" in out.stdout and "Traceback" not in out.stdout


def test_rollout_makes_no_per_step_host_sync(tmp_path):
    """Host syncs per iteration must not grow with the rollout length: none happens per env step."""
    from tests.host_sync import RecordHostSyncs

    counts = {}
    for num_steps in (4, 16):
        recorder = RecordHostSyncs()
        with recorder:
            train(tmp_path / str(num_steps), env_id="Pendulum-v1", num_envs=32, num_steps=num_steps,
                  num_minibatches=2, total_timesteps=32 * num_steps * 3, save_interval=1000, reward_norm=True)
        counts[num_steps] = len(recorder.syncs)
    assert counts[4] == counts[16], counts


def test_bf16_autocast_runs_and_keeps_float32_storage(tmp_path):
    summary = train(tmp_path, env_id="Pendulum-v1", bf16=True, total_timesteps=64 * 16 * 2)
    state = torch.load(Path(summary["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    assert all(v.dtype in (torch.float32, torch.float64) for k, v in state["model"].items() if v.is_floating_point())
    assert all(torch.isfinite(v).all() for v in state["model"].values())


@pytest.mark.slow
def test_compiled_run_learns_cartpole_like_eager(tmp_path):
    """--compile changes how the steps run, not what they compute: the CartPole target is met too."""
    summary = train(tmp_path, seed=1, num_envs=4096, num_steps=24, total_timesteps=3_000_000, compile=True,
                    eval_interval=2, num_eval_envs=64, target_return=475.0)
    assert summary["best_eval_return"] >= 475.0, summary
