"""algos/pqn.py: learning, Q(lambda) targets, exact resume after SIGTERM, checkpoints, logging, errors."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from common.checkpoint import FORMAT_VERSION, save_checkpoint
from tests.helpers import ROOT, inject_nan_rewards, load_script, run, torchrun_cmd

pqn = load_script("pqn")


def script_env(threads: int = 2) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = str(threads)  # one process on the CI machine's two cores; 1 per rank under torchrun
    env["PYTHONUNBUFFERED"] = "1"
    return env


def script(*args, timeout=300) -> subprocess.CompletedProcess:
    return run([sys.executable, "algos/pqn.py", *map(str, args)], timeout=timeout, env=script_env())


def train(tmp_path, **overrides) -> dict:
    """Run pqn.main in this process, for the tests that need to reach inside (tiny runs only)."""
    kwargs = dict(output_dir=str(tmp_path), run_name="run", progress=False, num_envs=16, num_steps=8,
                  total_timesteps=16 * 8 * 4, eval_interval=0, num_eval_envs=4, hidden_sizes=(32, 32))
    kwargs.update(overrides)
    return pqn.main(pqn.Args(**kwargs))


# --------------------------------------------------------------------------------------------
# learning
# --------------------------------------------------------------------------------------------
# Tuned for a 2-core CPU: few envs, a small network, rewards scaled by 0.1 (Q-values near 10, not 100).
# Seeds 1-8 reach eval return >= 475 within 20k-120k env steps.
CARTPOLE_FAST = ["--num-envs", 64, "--num-steps", 16, "--num-minibatches", 4, "--update-epochs", 2,
                 "--hidden-sizes", 64, 64, "--learning-rate", 2.5e-3, "--reward-scale", 0.1, "--total-timesteps", 300_000,
                 "--num-eval-envs", 8, "--eval-interval", 5, "--target-return", 475]


@pytest.mark.slow
def test_cartpole_learns(tmp_path):
    """Greedy eval return >= 475 on CartPole-v1 (seed 1: about 50k env steps)."""
    out = script(*CARTPOLE_FAST, "--seed", 1, "--output-dir", tmp_path, "--run-name", "cartpole", timeout=240)
    assert out.returncode == 0, out.stdout[-3000:]
    summary = json.loads((tmp_path / "cartpole" / "summary.json").read_text())
    assert summary["best_eval_return"] >= 475.0, summary
    assert summary["stop_reason"] == "target_return"


# --------------------------------------------------------------------------------------------
# Q(lambda) targets
# --------------------------------------------------------------------------------------------
def q_lambda_reference(rewards, next_q_max, final_q_max, terminated, truncated, gamma, lam):
    """Forward view, one env and one step at a time: the lambda-weighted mix of the n-step returns
    G^(1..K), where K runs to the end of the episode or of the rollout and G^(K) takes the rest of
    the weight. An n-step return bootstraps from max Q of the next observation; at an episode end
    from nothing (terminated) or from max Q of the true final observation (truncated)."""
    T, N = rewards.shape
    out = torch.zeros(T, N, dtype=torch.float64)
    for n in range(N):
        for t in range(T):
            returns, discounted = [], 0.0
            for k in range(1, T - t + 1):
                i = t + k - 1
                discounted += gamma ** (k - 1) * float(rewards[i, n])
                if terminated[i, n]:
                    returns.append(discounted)
                    break
                if truncated[i, n]:
                    returns.append(discounted + gamma**k * float(final_q_max[i, n]))
                    break
                returns.append(discounted + gamma**k * float(next_q_max[i, n]))
            K = len(returns)
            out[t, n] = sum((1 - lam) * lam ** (k - 1) * returns[k - 1] for k in range(1, K)) + lam ** (K - 1) * returns[-1]
    return out


@pytest.mark.parametrize("lam", [0.0, 0.65, 1.0])
def test_q_lambda_targets_match_brute_force_reference(lam):
    g = torch.Generator().manual_seed(0)
    T, N, gamma = 11, 7, 0.97
    rewards, next_q_max, final_q_max = (torch.randn(T, N, generator=g, dtype=torch.float64) for _ in range(3))
    terminated = torch.rand(T, N, generator=g) < 0.15
    truncated = torch.rand(T, N, generator=g) < 0.15
    terminated[3, 0] = truncated[3, 0] = True  # both at once: termination wins, no bootstrap
    terminated[:, 1] = truncated[:, 1] = False  # one env with no episode end in the rollout
    assert terminated.any() and (truncated & ~terminated).any()

    targets = pqn.q_lambda_targets(rewards, next_q_max, final_q_max, terminated, truncated, gamma, lam)
    torch.testing.assert_close(targets, q_lambda_reference(rewards, next_q_max, final_q_max, terminated, truncated, gamma, lam))
    # the cut at episode ends, read directly
    torch.testing.assert_close(targets[terminated], rewards[terminated])
    only_trunc = truncated & ~terminated
    torch.testing.assert_close(targets[only_trunc], rewards[only_trunc] + gamma * final_q_max[only_trunc])
    torch.testing.assert_close(targets[-1, 1], rewards[-1, 1] + gamma * next_q_max[-1, 1])


# --------------------------------------------------------------------------------------------
# checkpoints and exact resume
# --------------------------------------------------------------------------------------------
ITERS = 16
RESUME_ARGS = ["--num-envs", 16, "--num-steps", 8, "--total-timesteps", 16 * 8 * ITERS, "--hidden-sizes", 32, 32,
               "--eval-interval", 3, "--num-eval-envs", 4, "--save-interval", 1, "--anneal-lr", "--obs-norm",
               "--epsilon-spread", 0.5, "--exploration-fraction", 0.5, "--loss", "huber", "--run-name", "run"]


def test_resume_after_sigterm_is_bit_identical_to_uninterrupted_run(tmp_path):
    """SIGTERM stops the run at the end of an iteration with last.pt written; `--resume auto` then
    finishes it with the same parameters, optimizer state and schedules as a run never stopped."""
    full = script(*RESUME_ARGS, "--output-dir", tmp_path / "a")
    assert full.returncode == 0, full.stdout[-3000:]

    cmd = [sys.executable, "algos/pqn.py", *map(str, RESUME_ARGS), "--output-dir", str(tmp_path / "b")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        while not (tmp_path / "b" / "run" / "checkpoints" / "last.pt").exists():  # iteration 1 is done: training runs
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-3000:]
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-3000:]
    stopped = json.loads((tmp_path / "b" / "run" / "summary.json").read_text())
    assert stopped["stop_reason"] == "signal:SIGTERM" and stopped["iteration"] < ITERS, stopped

    resumed = script(*RESUME_ARGS, "--output-dir", tmp_path / "b", "--resume", "auto")
    assert resumed.returncode == 0 and f"at iteration {stopped['iteration']}" in resumed.stdout, resumed.stdout[-3000:]
    a = torch.load(tmp_path / "a" / "run" / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert a["iteration"] == b["iteration"] == ITERS and a["global_step"] == b["global_step"] == 16 * 8 * ITERS
    assert set(a["model"]) == set(b["model"]) and "obs_rms.mean" in a["model"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
    assert a["learning_rate"] == b["learning_rate"] and a["epsilon"] == b["epsilon"]
    assert a["best_eval_return"] == b["best_eval_return"]


def test_checkpoint_loads_with_weights_only_and_eval_only(tmp_path):
    summary = train(tmp_path, eval_interval=2, obs_norm=True)
    ckpt_dir = Path(summary["run_dir"]) / "checkpoints"
    state = torch.load(ckpt_dir / "last.pt", weights_only=True)
    assert state["algo"] == "pqn" and state["env_id"] == "CartPole-v1" and state["iteration"] == 4
    expected = {"format_version", "algo", "env_id", "args", "world_size", "global_step", "iteration", "model",
                "optimizer", "learning_rate", "best_eval_return", "rng", "env"}
    assert expected <= set(state)
    assert {"obs_rms.mean", "obs_rms.count", "q.0.weight", "q.1.weight"} <= set(state["model"])  # q.1: LayerNorm
    saved = json.loads((Path(summary["run_dir"]) / "summary.json").read_text())
    assert saved["global_step"] == 16 * 8 * 4 and saved["best_eval_return"] is not None
    result = train(tmp_path, eval_only=True, obs_norm=True, resume=str(ckpt_dir / "best.pt"))
    assert result["eval_return"] > 0


def test_tensorboard_tags_are_written(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    summary = train(tmp_path, eval_interval=2, total_timesteps=16 * 8 * 6)
    acc = EventAccumulator(summary["run_dir"])
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    expected = {
        "losses/td_loss", "losses/q_values", "charts/epsilon", "charts/episodic_return", "charts/episodic_length",
        "charts/SPS", "charts/learning_rate", "eval/episodic_return", "eval/episodic_length",
    }
    assert expected <= tags, expected - tags
    assert [e.step for e in acc.Scalars("charts/SPS")] == [16 * 8 * i for i in range(1, 7)]
    eps = [e.value for e in acc.Scalars("charts/epsilon")]
    assert eps[0] == pytest.approx(1.0) and all(a >= b for a, b in zip(eps, eps[1:]))


def test_rollout_makes_no_per_step_host_sync(tmp_path):
    """Host syncs per iteration must not grow with the rollout length: none happens per env step."""
    from tests.host_sync import RecordHostSyncs

    counts = {}
    for num_steps in (4, 16):
        recorder = RecordHostSyncs()
        with recorder:
            train(tmp_path / str(num_steps), num_steps=num_steps, num_minibatches=2, total_timesteps=16 * num_steps * 3,
                  save_interval=1000, obs_norm=True, epsilon_spread=0.5)
        counts[num_steps] = len(recorder.syncs)
    assert counts[4] == counts[16], counts


# --------------------------------------------------------------------------------------------
# torchrun
# --------------------------------------------------------------------------------------------
@pytest.mark.distributed
def test_two_process_torchrun_keeps_ranks_in_sync(tmp_path):
    iterations, num_envs, num_steps = 3, 16, 8
    cmd = torchrun_cmd(2, ["algos/pqn.py", "--num-envs", str(num_envs), "--num-steps", str(num_steps),
                           "--total-timesteps", str(2 * num_envs * num_steps * iterations), "--hidden-sizes", "32", "32",
                           "--eval-interval", "2", "--num-eval-envs", "4", "--obs-norm", "--epsilon-spread", "0.5",
                           "--output-dir", str(tmp_path), "--run-name", "ddp"])
    out = run(cmd, timeout=240, env=script_env(threads=1))
    assert out.returncode == 0, out.stdout[-4000:]
    summary = json.loads((tmp_path / "ddp" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["params_in_sync"] is True
    assert summary["global_step"] == 2 * num_envs * num_steps * iterations
    state = torch.load(tmp_path / "ddp" / "checkpoints" / "last.pt", weights_only=True)
    assert len(state["rng"]) == 2 and len(state["env"]) == 2


# --------------------------------------------------------------------------------------------
# bad input: a clear one-line cause, before training
# --------------------------------------------------------------------------------------------
def test_continuous_env_points_to_the_continuous_scripts(tmp_path):
    out = script("--env-id", "Pendulum-v1", "--output-dir", tmp_path)
    assert out.returncode != 0 and "Traceback" not in out.stdout, out.stdout[-3000:]
    assert "discrete action space" in out.stdout
    assert all(name in out.stdout for name in ("ppo.py", "td3.py", "sac.py"))
    assert not any(tmp_path.iterdir()), "nothing may be written for a run that cannot start"


def test_bad_inputs_fail_with_a_clear_cause_before_training(tmp_path):
    with pytest.raises(SystemExit, match="does not divide into --num-minibatches 4"):
        train(tmp_path, num_envs=10, num_steps=3, num_minibatches=4)
    with pytest.raises(SystemExit, match="unknown env id 'CartPole-v9'.*CartPole-v1"):
        train(tmp_path, env_id="CartPole-v9")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit, match="cannot write the run directory"):
        train(tmp_path, output_dir=str(blocker / "sub"))
    foreign = tmp_path / "ppo.pt"
    save_checkpoint({"format_version": FORMAT_VERSION, "algo": "ppo", "env_id": "CartPole-v1"}, foreign)
    with pytest.raises(pqn.CheckpointError, match="written by 'ppo', not 'pqn'"):
        train(tmp_path, resume=str(foreign))
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"\x00" * 100)
    with pytest.raises(pqn.CheckpointError, match="truncated or corrupt"):
        train(tmp_path, resume=str(corrupt))


def test_checkpoint_of_another_network_shape(tmp_path):
    summary = train(tmp_path)
    with pytest.raises(pqn.CheckpointError, match=r"another shape: trained with .*\(32, 32\).*\(16,\)"):
        train(tmp_path, run_name="other", hidden_sizes=(16,), resume=summary["checkpoints"]["last"])


def test_nan_guard_stops_with_name_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    inject_nan_rewards(pqn, monkeypatch, after=20)  # from iteration 3 on
    with pytest.raises(FloatingPointError, match="non-finite rewards.* at iteration 3"):
        train(tmp_path, save_interval=1, total_timesteps=16 * 8 * 6)
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert state["iteration"] == 2 and all(torch.isfinite(v).all() for v in state["model"].values())
