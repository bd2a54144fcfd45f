"""algos/ppo.py: learning, GAE with truncation bootstrapping, the learning-rate schedules, its flags.

The run contract (resume, checkpoints, logging, NaN guard, torchrun, faults, errors) is tested
for every script in tests/test_scripts.py."""

import sys
from pathlib import Path

import pytest
import torch

from common.args import parse_args
from common.envs import make_env
from tests.helpers import ROOT, load_script, run, subprocess_env

ppo = load_script("ppo")


def train(tmp_path, **overrides) -> dict:
    """Run ppo.main in this process (no interpreter start-up: most of a small run's cost)."""
    kwargs = dict(
        output_dir=str(tmp_path),
        run_name="run",
        progress=False,
        num_envs=64,
        num_steps=16,
        total_timesteps=64 * 16 * 4,
        eval_interval=0,
        num_eval_envs=8,
    )
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
    summary = train(
        tmp_path,
        seed=seed,
        num_envs=4096,
        num_steps=24,
        total_timesteps=3_000_000,
        eval_interval=2,
        num_eval_envs=64,
        target_return=475.0,
    )
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
    _, returns = ppo.compute_advantages(
        rewards, values, torch.zeros(8, dtype=torch.float64), final_values, term, trunc, 0.99, 1.0
    )
    _, returns_as_terminal = ppo.compute_advantages(
        rewards, values, torch.zeros(8, dtype=torch.float64), final_values, trunc, trunc, 0.99, 1.0
    )
    # at the truncation step the two differ by exactly gamma * V(final_obs) ...
    torch.testing.assert_close(returns[9] - returns_as_terminal[9], 0.99 * final_values[9])
    # ... and that future value flows back through the whole episode with gamma^k
    torch.testing.assert_close(returns[0] - returns_as_terminal[0], 0.99**10 * final_values[9])


@pytest.mark.parametrize(
    "env_id", ["CartPole-v1", "Acrobot-v1", "MountainCar-v0", "Pendulum-v1", "MountainCarContinuous-v0"]
)
def test_smoke_every_builtin_env(tmp_path, env_id):
    summary = train(tmp_path, env_id=env_id, total_timesteps=64 * 16 * 2, eval_interval=2, hidden_sizes=(32, 32))
    assert summary["global_step"] == 64 * 16 * 2 and summary["iteration"] == 2


# --------------------------------------------------------------------------------------------
# flags of the algorithm
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("script", ["ppo", "ppo_rnd", "ppo_lstm"])
def test_adaptive_learning_rate_follows_the_measured_kl(script):
    """lr / 1.5 above 2x --desired-kl, * 1.5 below half of it, in [1e-5, --lr-max] (each script's own cap); before the
    step (rsl_rl's --lr-adapt before-step) a KL of exactly 0, the policy not moved yet, leaves the rate."""
    module = load_script(script)
    args = module.Args(desired_kl=0.01)
    lr = torch.tensor(1e-3)
    for kl, expected in [(0.05, 1e-3 / 1.5), (0.001, 1e-3), (0.01, 1e-3)]:  # above 2x, below 0.5x, in the band
        module.adapt_learning_rate(lr, torch.tensor(kl), args)
        assert lr.item() == pytest.approx(expected)
    for _ in range(40):
        module.adapt_learning_rate(lr, torch.tensor(1.0), args)
    assert lr.item() == pytest.approx(1e-5)  # clamped at both ends
    for _ in range(40):
        module.adapt_learning_rate(lr, torch.tensor(0.0), args)
    assert lr.item() == pytest.approx({"ppo_lstm": 1e-2}.get(script, 5e-3)) == pytest.approx(args.lr_max)
    rsl_rl = module.Args(desired_kl=0.01, lr_adapt="before-step", lr_max=1e-2)
    lr.fill_(1e-3)
    module.adapt_learning_rate(lr, torch.tensor(0.0), rsl_rl)
    assert lr.item() == pytest.approx(1e-3)  # no move yet: the rate stays
    for _ in range(40):
        module.adapt_learning_rate(lr, torch.tensor(1e-4), rsl_rl)
    assert lr.item() == pytest.approx(1e-2)


def test_the_linear_schedule_anneals_to_zero_and_cleanrls_flag_names_it(tmp_path):
    """--lr-schedule linear: the rate falls linearly from --learning-rate towards 0 over --total-timesteps. CleanRL's
    --anneal-lr (a second flag for it) is refused with the one line that names it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for script in ("ppo", "ppo_rnd", "ppo_lstm"):
        for given, ours in (("--anneal-lr", "linear"), ("--no-anneal-lr", "constant")):
            with pytest.raises(
                SystemExit, match=rf"^error: {given} is CleanRL's flag; here it is --lr-schedule {ours}$"
            ):
                parse_args(load_script(script).Args, [given])
    assert parse_args(load_script("pqn").Args, ["--anneal-lr"]).anneal_lr  # pqn.py's own flag (CleanRL's DQN's name)
    train(tmp_path, lr_schedule="linear", total_timesteps=64 * 16 * 4)
    acc = EventAccumulator(str(tmp_path / "run"))
    acc.Reload()
    lrs = [e.value for e in acc.Scalars("charts/learning_rate")]
    assert lrs == pytest.approx([1e-3 * (1 - i / 4) for i in range(4)])


@pytest.mark.parametrize("adv_norm", ["none", "batch"])
def test_advantage_normalization_scopes_run(tmp_path, adv_norm):
    summary = train(tmp_path, env_id="Pendulum-v1", adv_norm=adv_norm, total_timesteps=64 * 16 * 2)
    assert summary["global_step"] == 64 * 16 * 2
    state = torch.load(Path(summary["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    assert state["args"]["adv_norm"] == adv_norm and all(torch.isfinite(v).all() for v in state["model"].values())


def test_batch_that_does_not_divide(tmp_path):
    with pytest.raises(SystemExit, match="does not divide into --num-minibatches 4"):
        train(tmp_path, num_envs=10, num_steps=3, num_minibatches=4)
    assert not (tmp_path / "run").exists()


def test_track_mirrors_to_wandb_offline(tmp_path):
    pytest.importorskip("wandb")
    env = subprocess_env()
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(tmp_path))
    out = script(
        "--track",
        "--num-envs",
        "16",
        "--num-steps",
        "8",
        "--total-timesteps",
        "256",
        "--eval-interval",
        "0",
        "--output-dir",
        str(tmp_path),
        "--run-name",
        "tracked",
        env=env,
    )
    assert out.returncode == 0, out.stdout[-3000:]
    assert list((tmp_path / "tracked").rglob("offline-run-*")), "no offline wandb run was written"


def test_bf16_autocast_runs_and_keeps_float32_storage(tmp_path):
    summary = train(tmp_path, env_id="Pendulum-v1", bf16=True, total_timesteps=64 * 16 * 2)
    state = torch.load(Path(summary["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    assert all(v.dtype in (torch.float32, torch.float64) for k, v in state["model"].items() if v.is_floating_point())
    assert all(torch.isfinite(v).all() for v in state["model"].values())


@pytest.mark.slow
def test_compiled_run_learns_cartpole_like_eager(tmp_path):
    """--compile changes how the steps run, not what they compute: the CartPole target is met too."""
    summary = train(
        tmp_path,
        seed=1,
        num_envs=4096,
        num_steps=24,
        total_timesteps=3_000_000,
        compile=True,
        eval_interval=2,
        num_eval_envs=64,
        target_return=475.0,
    )
    assert summary["best_eval_return"] >= 475.0, summary


@pytest.mark.parametrize("compile", [False, True])
def test_target_kl_ends_the_epochs_early(tmp_path, compile):
    """--target-kl: an epoch whose mean KL is above it is the last of the update. With a target no
    update can stay under, every iteration runs one epoch of minibatch steps, not update_epochs.
    Compiled, the targets and the minibatch step are compiled alone and counted once each."""
    from tests.lockstep import inductor_settings

    iterations, minibatches = 4, 4
    with inductor_settings(kernels=False):  # the compiled functions are counted here
        summary = train(tmp_path, target_kl=1e-12, num_minibatches=minibatches, update_epochs=5, compile=compile)
    adam = torch.load(summary["checkpoints"]["last"], weights_only=True)["optimizers"]["adam"]
    assert int(adam["state"][0]["step"]) == iterations * minibatches
    if compile:
        by_function = summary["compile_seconds_by_function"]
        assert set(by_function) == {"rollout", "targets", "minibatch update"}, by_function
        assert summary["compile_seconds"] == pytest.approx(sum(by_function.values()))


def test_a_logged_scalar_added_in_the_middle_of_the_loss_changes_nothing_else(tmp_path, monkeypatch):
    """Statistics go by name: a copy of ppo.py (outside algos/) with one more logged scalar put in the
    middle of ppo_loss's dict logs it, and its adaptive learning rate (which reads the KL by name),
    its other tags and values, and its weights are those of the original."""
    import importlib.util

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tests.helpers import run_main

    source = (ROOT / "algos" / "ppo.py").read_text()
    anchor = '"policy_loss": pg_loss.detach(),\n'
    assert source.count(anchor) == 1
    copy = tmp_path / "my_ppo.py"
    copy.write_text(source.replace(anchor, anchor + '"ratio_max": ratio.max().detach(),\n'))
    spec = importlib.util.spec_from_file_location("my_ppo", copy)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "my_ppo", module)
    spec.loader.exec_module(module)

    settings = dict(
        device="cpu",
        progress=False,
        run_name="run",
        env_id="Pendulum-v1",
        num_envs=16,
        num_steps=8,
        num_minibatches=2,
        update_epochs=1,
        lr_schedule="adaptive",
        desired_kl=1e-5,
        total_timesteps=16 * 8 * 4,
        eval_interval=0,
        hidden_sizes=(16, 16),
    )
    curves = {}
    for name, script in (("original", load_script("ppo")), ("copy", module)):
        run_main(script, output_dir=str(tmp_path / name), **settings)
        events = EventAccumulator(str(tmp_path / name / "run"))
        events.Reload()
        curves[name] = {
            tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]
            if not tag.endswith("_seconds") and tag != "charts/SPS"
        }
    original, copied = curves["original"], curves["copy"]
    assert set(copied) == set(original) | {"losses/ratio_max"}
    assert len({v for _, v in original["charts/learning_rate"]}) > 1, "the adaptive schedule moved the rate"
    for tag, values in original.items():
        assert copied[tag] == values, tag
    weights = [
        torch.load(tmp_path / name / "run" / "checkpoints" / "last.pt", weights_only=True)["model"]
        for name in ("original", "copy")
    ]
    for key in weights[0]:
        assert torch.equal(weights[0][key], weights[1][key]), key


def test_a_copy_outside_algos_without_the_package_says_how_to_get_it(tmp_path, monkeypatch):
    import importlib.util
    import runpy

    copy = tmp_path / "my_ppo.py"
    copy.write_text((ROOT / "algos" / "ppo.py").read_text())
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "common" else find_spec(name, *a))
    with pytest.raises(
        SystemExit, match=r"^error: my_ppo\.py needs the project's common/ package: .*pip install -e \."
    ):
        runpy.run_path(str(copy), run_name="copied")


@pytest.mark.parametrize("script", ["ppo", "ppo_rnd", "ppo_lstm"])
def test_timeout_bootstrap_on_a_step_that_also_terminates(script):
    """One env, two steps: the first both terminates and times out, the second times out alone. Ours
    (--timeout-bootstrap unless-terminated) bootstraps only the second; rsl_rl's (every-timeout) both, by gamma * V."""
    module = ppo if script == "ppo" else load_script(script)
    r = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    fv = torch.tensor([[10.0], [20.0]], dtype=torch.float64)
    zero, nv = torch.zeros(2, 1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    term, trunc = torch.tensor([[True], [False]]), torch.tensor([[True], [True]])
    returns = {}
    for flag in ("unless-terminated", "every-timeout"):
        args = parse_args(module.Args, ["--timeout-bootstrap", flag])
        every = args.timeout_bootstrap == "every-timeout"
        returns[flag] = module.compute_advantages(r, zero, nv, fv, term, trunc, 0.5, 1.0, every)[1][:, 0].tolist()
    assert returns["unless-terminated"] == [1.0, 2.0 + 0.5 * 20.0]
    assert returns["every-timeout"] == [1.0 + 0.5 * 10.0, 2.0 + 0.5 * 20.0]
    assert parse_args(module.Args, []).timeout_bootstrap == "unless-terminated"
