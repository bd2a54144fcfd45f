"""algos/td3.py and algos/sac.py: learning, the pieces with closed-form references (SAC's squashed
log-prob, C51's projection), checkpoints and exact resume, no per-step host sync, errors.

Most runs call the script's main() in this process (no interpreter start-up, which is most of a
small run's cost); the learning run, the CLI errors and torchrun go through a subprocess.
"""

import json
import math
import sys

import pytest
import torch

from tests.helpers import inject_nan_rewards, load_script, run, torchrun_cmd


def script(algo: str, tmp_path, *args: str, timeout: float = 240):
    cmd = [sys.executable, f"algos/{algo}.py", "--device", "cpu", "--output-dir", str(tmp_path), "--no-progress", *args]
    return run(cmd, timeout=timeout)


def summary_of(result) -> dict:
    """The summary line the main process prints last."""
    assert result.returncode == 0, result.stdout[-4000:]
    return json.loads(next(line for line in reversed(result.stdout.splitlines()) if line.startswith('{"algo"')))


def train(algo: str, tmp_path, **overrides) -> dict:
    """Run algos/<algo>.py's main() in this process with tiny settings: 8 envs, a 30-slot ring per env that wraps."""
    module = load_script(algo)
    kwargs = dict(env_id="Pendulum-v1", device="cpu", output_dir=str(tmp_path), run_name="run", progress=False,
                  num_envs=8, batch_size=64, hidden_sizes=(32, 32), learning_starts=64, num_eval_envs=4,
                  buffer_size=240, n_step=2, log_interval=7, eval_interval=0, save_interval=10_000)
    kwargs.update(overrides)
    # One intra-op thread, as the subprocesses get (OMP_NUM_THREADS=1): tiny networks gain nothing from
    # more, and on a busy machine spinning worker threads slow every op down by an order of magnitude.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return module.main(module.Args(**kwargs))
    finally:
        torch.set_num_threads(threads)


def last_checkpoint(tmp_path, run: str = "run", name: str = "last.pt") -> dict:
    return torch.load(tmp_path / run / "checkpoints" / name, weights_only=True)


# --------------------------------------------------------------------------------------------
# pieces with closed-form references
# --------------------------------------------------------------------------------------------
def test_sac_squashed_log_prob_matches_change_of_variables():
    sac = load_script("sac")
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(512, 3, generator=g, dtype=torch.float64)
    log_std = torch.rand(512, 3, generator=g, dtype=torch.float64) * 3 - 2
    u = mean + log_std.exp() * torch.randn(512, 3, generator=g, dtype=torch.float64)
    reference = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.exp()), [torch.distributions.TanhTransform()]
    ).log_prob(torch.tanh(u)).sum(-1)
    torch.testing.assert_close(sac.squashed_log_prob(u, mean, log_std), reference, rtol=1e-9, atol=1e-9)

    # Far in the tails 1 - tanh(u)^2 rounds to 0 in float32; the script's form stays exact.
    u = torch.tensor([[-30.0, -12.0, -5.0, 0.0, 5.0, 12.0, 30.0]])
    zeros = torch.zeros_like(u)
    got = sac.squashed_log_prob(u, zeros, zeros)
    u64 = u.double()
    log_sech2 = -2 * (u64.abs() + torch.log1p(torch.exp(-2 * u64.abs())) - math.log(2))  # log(1 - tanh^2), exact
    expected = (-0.5 * u64**2 - 0.5 * math.log(2 * math.pi) - log_sech2).sum(-1)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-4)


def brute_force_projection(probs, rewards, bootstrap, v_min, v_max):
    """C51's projection written atom by atom (Bellemare et al. 2017, Algorithm 1)."""
    num_atoms = probs.shape[-1]
    delta = (v_max - v_min) / (num_atoms - 1)
    out = torch.zeros_like(probs)
    for i in range(probs.shape[0]):
        for j in range(num_atoms):
            tz = min(max(rewards[i].item() + bootstrap[i].item() * (v_min + j * delta), v_min), v_max)
            b = (tz - v_min) / delta
            lo, hi = math.floor(b), math.ceil(b)
            if lo == hi:
                out[i, lo] += probs[i, j]
            else:
                out[i, lo] += probs[i, j] * (hi - b)
                out[i, hi] += probs[i, j] * (b - lo)
    return out


def test_td3_categorical_projection_preserves_mass_and_matches_brute_force():
    td3 = load_script("td3")
    g = torch.Generator().manual_seed(0)
    v_min, v_max, num_atoms, batch = -10.0, 10.0, 21, 64
    probs = torch.softmax(torch.randn(2, batch, num_atoms, generator=g, dtype=torch.float64) * 2, -1)
    rewards = torch.randn(batch, generator=g, dtype=torch.float64) * 6  # some land outside the support
    rewards[:4] = torch.tensor([1.0, -3.0, 25.0, -25.0])  # exactly on atoms, and beyond both ends
    bootstrap = torch.full((batch,), 0.99**3, dtype=torch.float64)
    bootstrap[::5] = 0.0  # terminated: all mass on the reward's atoms
    bootstrap[1:4] = 1.0
    out = td3.categorical_projection(probs, rewards, bootstrap, v_min, v_max)
    assert out.shape == probs.shape and (out >= 0).all()
    torch.testing.assert_close(out.sum(-1), probs.sum(-1), rtol=0, atol=1e-12)
    for k in range(2):  # every critic of the ensemble
        expected = brute_force_projection(probs[k], rewards, bootstrap, v_min, v_max)
        torch.testing.assert_close(out[k], expected, rtol=1e-10, atol=1e-12)
    # Where no shifted atom leaves the support, the projection keeps the mean exactly.
    atoms = torch.linspace(v_min, v_max, num_atoms, dtype=torch.float64)
    inside = (rewards.abs() + bootstrap * v_max) <= v_max
    mean_in, mean_out = (probs * atoms).sum(-1), (out * atoms).sum(-1)
    torch.testing.assert_close(mean_out[:, inside], (rewards + bootstrap * mean_in)[:, inside], rtol=0, atol=1e-10)


# --------------------------------------------------------------------------------------------
# learning
# --------------------------------------------------------------------------------------------
# CPU settings that solve Pendulum-v1 (eval >= -200) in 200-325 iterations for seeds 1-3.
PENDULUM_FAST = ["--env-id", "Pendulum-v1", "--num-envs", "64", "--num-updates", "4", "--batch-size", "512",
                 "--hidden-sizes", "64", "64", "--q-lr", "3e-3", "--policy-lr", "3e-3", "--tau", "0.05",
                 "--learning-starts", "3200", "--eval-interval", "25", "--log-interval", "25"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_learns_pendulum(algo, tmp_path):
    summary = summary_of(script(
        algo, tmp_path, *PENDULUM_FAST, "--seed", "1", "--total-timesteps", "32000", "--target-return", "-200",
        "--run-name", "learn",
    ))
    assert summary["best_eval_return"] >= -200 and summary["stop_reason"] == "target_return", summary
    assert (tmp_path / "learn" / "checkpoints" / "best.pt").is_file()


# --------------------------------------------------------------------------------------------
# checkpoints, exact resume, logging
# --------------------------------------------------------------------------------------------
def test_sac_smoke_run_writes_weights_only_checkpoints_and_logs(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    summary = summary_of(script("sac", tmp_path, "--env-id", "Pendulum-v1", "--num-envs", "8", "--batch-size", "64",
                                "--hidden-sizes", "32", "32", "--learning-starts", "64", "--num-eval-envs", "4",
                                "--total-timesteps", "1680", "--eval-interval", "105", "--log-interval", "15",
                                "--run-name", "run"))  # 210 iterations: Pendulum's episodes end at 200 steps
    assert summary["global_step"] == 1680 and summary["best_eval_return"] is not None
    for name in ("last.pt", "best.pt"):
        state = last_checkpoint(tmp_path, name=name)
        assert state["algo"] == "sac" and state["env_id"] == "Pendulum-v1" and state["update_count"] > 0
        assert {"actor", "critic", "alpha"} <= set(state["optimizer"])
        assert {"log_alpha", "obs_rms.mean", "critic_target.0.weight"} <= set(state["model"])
        assert state["env"][0]["buffer"] is None  # only with --save-buffer
    acc = EventAccumulator(str(tmp_path / "run"))
    acc.Reload()
    expected = {"charts/episodic_return", "charts/episodic_length", "charts/SPS", "losses/q_loss", "losses/q_values",
                "losses/actor_loss", "losses/alpha", "eval/episodic_return", "eval/episodic_length"}
    assert expected <= set(acc.Tags()["scalars"]), expected - set(acc.Tags()["scalars"])
    result = train("sac", tmp_path, eval_only=True, resume=str(tmp_path / "run" / "checkpoints" / "best.pt"))
    assert -2000 < result["eval_return"] < 0  # Pendulum's returns


@pytest.mark.parametrize("algo,extra", [
    ("td3", dict(distributional=True, v_min=-100.0, v_max=0.0, reward_norm=True, eval_interval=15)),
    ("sac", dict(reward_norm=True)),
])
def test_resume_with_saved_buffer_is_bit_identical(algo, extra, tmp_path):
    common = dict(total_timesteps=8 * 50, save_buffer=True, **extra)
    full = train(algo, tmp_path / "a", **common)
    # the same run stopped at the first two syncs (a wall-clock budget of 0 s), resumed each time, then to the end
    first = train(algo, tmp_path / "b", max_wall_seconds=0.0, **common)
    assert first["stop_reason"] == "max_wall_seconds" and first["iteration"] == 7
    assert last_checkpoint(tmp_path / "b")["env"][0]["buffer"]["size"] == 7
    assert train(algo, tmp_path / "b", resume="auto", max_wall_seconds=0.0, **common)["iteration"] == 14
    assert train(algo, tmp_path / "b", resume="auto", **common)["global_step"] == full["global_step"] == 400
    a, b = last_checkpoint(tmp_path / "a"), last_checkpoint(tmp_path / "b")
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert a["update_count"] == b["update_count"] > 0
    for name in a["optimizer"]:
        for s_a, s_b in zip(a["optimizer"][name]["state"].values(), b["optimizer"][name]["state"].values()):
            assert all(torch.equal(s_a[k], s_b[k]) for k in s_a), name


def test_resume_without_saved_buffer_refills_it_with_a_notice(tmp_path, capsys):
    train("td3", tmp_path, total_timesteps=8 * 20, max_wall_seconds=0.0)
    summary = train("td3", tmp_path, total_timesteps=8 * 20, resume="auto")
    out = capsys.readouterr().out
    assert "notice: the checkpoint holds no replay buffer" in out and summary["global_step"] == 160
    assert last_checkpoint(tmp_path)["update_count"] > 0  # updates resumed once the buffer had refilled


def test_resume_with_another_network_shape_is_a_clear_error(tmp_path):
    train("td3", tmp_path, total_timesteps=8 * 4)
    with pytest.raises(SystemExit, match="--hidden-sizes 32 32"):
        train("td3", tmp_path, hidden_sizes=(64, 64), resume="auto")


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_bf16_autocast_runs_and_keeps_float32_storage(algo, tmp_path):
    extra = dict(distributional=True, v_min=-100.0, v_max=0.0) if algo == "td3" else {}
    train(algo, tmp_path, bf16=True, total_timesteps=8 * 12, learning_starts=8, **extra)
    state = last_checkpoint(tmp_path)
    assert state["update_count"] > 0
    assert all(v.dtype in (torch.float32, torch.float64) for v in state["model"].values() if v.is_floating_point())
    assert all(torch.isfinite(v).all() for v in state["model"].values())


# --------------------------------------------------------------------------------------------
# performance rule: no host sync per env step or per update
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_collection_and_updates_make_no_per_step_host_sync(algo, tmp_path):
    """Host syncs per log interval must not grow with its length: none happens per env step or update.

    Adam keeps its step counter on the host unless capturable=True, which the scripts set on CUDA
    (CPU does not support it): those reads are host-only on CPU and absent on CUDA, so they are
    left out of the count.
    """
    import traceback

    from tests.host_sync import RecordHostSyncs

    class OutsideOptimizer(RecordHostSyncs):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            before = len(self.syncs)
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if len(self.syncs) > before and any("torch/optim/" in f.filename for f in traceback.extract_stack()):
                self.syncs.pop()
            return out

    load_script(algo)  # imported outside the recorder
    counts = {}
    for log_interval in (2, 6):
        recorder = OutsideOptimizer()
        with recorder:
            train(algo, tmp_path / str(log_interval), log_interval=log_interval, reward_norm=True, num_updates=1,
                  total_timesteps=8 * log_interval * 3, learning_starts=8, hidden_sizes=(16, 16))
        counts[log_interval] = len(recorder.syncs)
    assert counts[2] == counts[6], counts


# --------------------------------------------------------------------------------------------
# bad input and bad numbers
# --------------------------------------------------------------------------------------------
def test_discrete_env_is_refused_with_a_pointer_to_ppo(tmp_path):
    result = script("td3", tmp_path, "--env-id", "CartPole-v1", timeout=120)
    assert result.returncode != 0 and "Traceback" not in result.stdout
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("error:") and "ppo.py" in last and "pqn.py" in last, result.stdout[-2000:]
    with pytest.raises(SystemExit, match=r"^error: .*continuous.*ppo\.py.*pqn\.py"):
        train("sac", tmp_path, env_id="Acrobot-v1")
    assert not any(tmp_path.iterdir()), "nothing is written before the check"


def test_env_kwargs_reach_make_env_and_bad_ones_are_a_clear_error(tmp_path):
    summary = train("sac", tmp_path, env_kwargs='{"max_episode_steps": 10}', total_timesteps=8 * 30)
    assert -16.3 * 10 <= summary["last_train_return"] < 0  # 10-step episodes; Pendulum's cost is at most 16.3 a step
    with pytest.raises(SystemExit, match="max_steps"):
        train("sac", tmp_path, env_kwargs='{"max_steps": 10}')


def test_nan_guard_names_the_tensor_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    td3 = load_script("td3")
    inject_nan_rewards(td3, monkeypatch, after=30)  # in the log interval ending at iteration 35
    with pytest.raises(FloatingPointError, match=r"non-finite .*rewards.*between global steps 224 and 280 \(iteration 35\)"):
        train("td3", tmp_path, save_interval=7, total_timesteps=8 * 50)
    state = last_checkpoint(tmp_path)
    assert state["iteration"] == 28 and all(torch.isfinite(v).all() for v in state["model"].values())


# --------------------------------------------------------------------------------------------
# torchrun
# --------------------------------------------------------------------------------------------
@pytest.mark.distributed
def test_td3_under_torchrun_keeps_ranks_in_sync_and_a_buffer_per_rank(tmp_path):
    cmd = torchrun_cmd(2, ["algos/td3.py", "--device", "cpu", "--output-dir", str(tmp_path), "--no-progress",
                           "--env-id", "Pendulum-v1", "--num-envs", "8", "--batch-size", "64", "--hidden-sizes", "32", "32",
                           "--learning-starts", "64", "--num-eval-envs", "4", "--buffer-size", "240", "--reward-norm",
                           "--total-timesteps", "320", "--eval-interval", "10", "--save-buffer", "--run-name", "ddp"])
    summary = summary_of(run(cmd, timeout=240))
    assert summary["world_size"] == 2 and summary["params_in_sync"] is True
    assert summary["global_step"] == 320  # 20 iterations x 8 envs x 2 ranks
    state = torch.load(tmp_path / "ddp" / "checkpoints" / "last.pt", weights_only=True)
    buffers = [env["buffer"] for env in state["env"]]
    assert len(state["rng"]) == 2 and len(buffers) == 2 and all(b["size"] == 20 for b in buffers)
    assert not torch.equal(buffers[0]["data"]["obs.policy"], buffers[1]["data"]["obs.policy"]), "ranks share env seeds"
