"""algos/pqn.py: learning, Q(lambda) targets, the exploration schedule.

The run contract (resume, checkpoints, logging, NaN guard, torchrun, faults, errors) is tested
for every script in tests/test_scripts.py."""

import json
import subprocess
import sys

import pytest
import torch

from tests.helpers import load_script, run

pqn = load_script("pqn")


def script(*args, timeout=300) -> subprocess.CompletedProcess:
    # tests/helpers.py's environment: one torch thread, as each `-n 2` worker has (tests/conftest.py); with two beside
    # the other worker's tests, the threads spun waiting for each other (the CartPole run below: 60 to 130 s, not 10)
    return run([sys.executable, "algos/pqn.py", *map(str, args)], timeout=timeout)


def train(tmp_path, **overrides) -> dict:
    """Run pqn.main in this process, for the tests that need to reach inside (tiny runs only)."""
    kwargs = dict(
        output_dir=str(tmp_path),
        run_name="run",
        progress=False,
        num_envs=16,
        num_steps=8,
        total_timesteps=16 * 8 * 4,
        eval_interval=0,
        num_eval_envs=4,
        hidden_sizes=(32, 32),
    )
    kwargs.update(overrides)
    return pqn.main(pqn.Args(**kwargs))


# --------------------------------------------------------------------------------------------
# learning
# --------------------------------------------------------------------------------------------
# Tuned for a 2-core CPU: few envs, a small network, rewards scaled by 0.1 (Q-values near 10, not 100).
# Seeds 1-8 reach eval return >= 475 within 20k-120k env steps.
CARTPOLE_FAST = [
    "--num-envs",
    64,
    "--num-steps",
    16,
    "--num-minibatches",
    4,
    "--update-epochs",
    2,
    "--hidden-sizes",
    64,
    64,
    "--learning-rate",
    2.5e-3,
    "--reward-scale",
    0.1,
    "--total-timesteps",
    300_000,
    "--num-eval-envs",
    8,
    "--eval-interval",
    5,
    "--target-return",
    475,
]


@pytest.mark.slow
def test_cartpole_learns(tmp_path):
    """Eval return (epsilon-greedy, --eval-epsilon 0.05) >= 475 on CartPole-v1 (seed 1: about 50k env steps)."""
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
            out[t, n] = (
                sum((1 - lam) * lam ** (k - 1) * returns[k - 1] for k in range(1, K)) + lam ** (K - 1) * returns[-1]
            )
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
    torch.testing.assert_close(
        targets, q_lambda_reference(rewards, next_q_max, final_q_max, terminated, truncated, gamma, lam)
    )
    # the cut at episode ends, read directly
    torch.testing.assert_close(targets[terminated], rewards[terminated])
    only_trunc = truncated & ~terminated
    torch.testing.assert_close(targets[only_trunc], rewards[only_trunc] + gamma * final_q_max[only_trunc])
    torch.testing.assert_close(targets[-1, 1], rewards[-1, 1] + gamma * next_q_max[-1, 1])


# --------------------------------------------------------------------------------------------
# exploration schedule and flags
# --------------------------------------------------------------------------------------------
def test_epsilon_decays_linearly_then_stays_and_is_logged_as_the_mean_over_envs(tmp_path):
    args = pqn.Args(start_e=1.0, end_e=0.1, exploration_fraction=0.5)
    assert [pqn.epsilon_at(step, 1000, args) for step in (0, 250, 500, 900)] == pytest.approx([1.0, 0.55, 0.1, 0.1])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(tmp_path, total_timesteps=16 * 8 * 6, epsilon_spread=0.5)
    acc = EventAccumulator(str(tmp_path / "run"))
    acc.Reload()
    eps = [e.value for e in acc.Scalars("charts/epsilon")]
    # the schedule at each iteration's start (exploration over 20% of 6 iterations), times the mean scale 0.75
    expected = [0.75 * pqn.epsilon_at(16 * 8 * i, 16 * 8 * 6, pqn.Args()) for i in range(6)]
    assert eps == pytest.approx(expected)


def test_batch_that_does_not_divide(tmp_path):
    with pytest.raises(SystemExit, match="does not divide into --num-minibatches 4"):
        train(tmp_path, num_envs=10, num_steps=3, num_minibatches=4)
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------------------------
# evaluation: epsilon-greedy (the DQN protocol), within a step budget
# --------------------------------------------------------------------------------------------
def untrained_breakout(eval_epsilon: float, num_envs: int = 16):
    from common.envs import make_env

    envs = make_env("MinAtar/Breakout-v1", num_envs, torch.device("cpu"), seed=5)
    obs, _ = envs.reset()
    args = pqn.Args(env_id="MinAtar/Breakout-v1", encoder="minatar", hidden_sizes=(32,), eval_epsilon=eval_epsilon)
    torch.manual_seed(0)
    return envs, pqn.QNetwork(tuple(obs["policy"].shape[1:]), int(envs.single_action_space.n), args, 1.0)


def test_the_evaluated_policy_is_epsilon_greedy_and_the_exported_one_greedy():
    """--eval-epsilon 0.05 by default (CleanRL's DQN evaluation, the DQN papers'): the evaluation acts at random 5% of
    the time; `deterministic`, which --export writes, stays greedy."""
    assert pqn.Args().eval_epsilon == 0.05
    envs, qnet = untrained_breakout(0.05, num_envs=4000)
    obs = envs.reset()[0]["policy"]
    greedy = qnet.deterministic(obs)
    assert torch.equal(greedy, qnet(qnet.obs_rms(obs)).argmax(-1))
    differs = (qnet.evaluation_action(obs) != greedy).float().mean().item()
    assert 0.02 < differs < 0.05  # 5% random actions, a 1/3 (MinAtar Breakout's three actions) of them the greedy one
    qnet.eval_epsilon = 0.0
    assert torch.equal(qnet.evaluation_action(obs), greedy)


def test_an_untrained_breakout_evaluation_ends_within_its_step_budget():
    """The evaluation stops at its budget of steps per eval env, however many episodes it was asked for: the episodes
    still running count with their returns and lengths so far (truncated), so every step played is in the mean; its
    random draws come from its own seeded generators, leaving the training's streams where they were."""
    from common.evaluation import run_episodes

    envs, qnet = untrained_breakout(0.05)
    before = torch.random.get_rng_state()
    result = run_episodes(envs, qnet, episodes=10_000, seed=3, max_steps=256)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert 0 < result["unfinished"] <= 16 and result["episodes"] > 16
    assert result["length"] * result["episodes"] == pytest.approx(16 * 256)  # every step played, none past the budget
    assert run_episodes(envs, qnet, episodes=10_000, seed=3, max_steps=256) == result  # it replays exactly
    # without a budget, whole episodes only (each env's first two end long before the env's time limit)
    whole = run_episodes(envs, qnet, episodes=2, seed=3)
    assert whole["unfinished"] == 0 and whole["episodes"] == 32


def test_a_cut_evaluation_says_so_and_eval_only_replays_it(tmp_path, capsys, monkeypatch):
    """A pqn Breakout run whose evaluations outgrow their budget: one line each, the return that best.pt was saved
    for given back by --eval-only (the same budget, from the checkpoint's counters)."""
    import common.evaluation

    monkeypatch.setattr(common.evaluation, "EVAL_FLOOR", 1)  # the budget is 5% of the steps between evaluations
    flags = dict(env_id="MinAtar/Breakout-v1", encoder="minatar", hidden_sizes=(32,), num_minibatches=4)
    summary = train(tmp_path, eval_interval=2, eval_episodes=50, num_eval_envs=2, **flags)  # budget: 64 steps
    said = capsys.readouterr().out
    assert said.count("notice: the evaluation at step ") == 2 and "stopped at its budget of 64 steps per eval env" in (
        said
    ), said
    assert "at most 64 steps each" in said
    best = tmp_path / "run" / "checkpoints" / "best.pt"
    replayed = train(tmp_path, eval_only=True, resume=str(best), eval_episodes=50, num_eval_envs=2, **flags)
    assert replayed["eval_return"] == pytest.approx(summary["best_eval_return"], abs=1e-9)
    assert "notice: the evaluation at step " in capsys.readouterr().out


def test_evaluations_leave_the_training_as_it_was(tmp_path):
    """An epsilon-greedy evaluation draws random numbers of its own: a run that evaluates every iteration trains the
    same weights as one that never does."""
    train(tmp_path / "with", eval_interval=1)
    train(tmp_path / "without", eval_interval=0)
    a, b = (
        torch.load(tmp_path / d / "run" / "checkpoints" / "last.pt", weights_only=True) for d in ("with", "without")
    )
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


@pytest.mark.sims
def test_a_greedy_pqn_on_atari_breakout_is_evaluated_within_its_budget(tmp_path, capsys):
    """The report's case: an untrained greedy policy that never presses FIRE plays Breakout to ALE's 27,000-step cap;
    the evaluation stops at its budget (1,024 steps an eval env here), counts the games so far and says so."""
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    flags = dict(env_id="gym:ALE/Breakout-v5", hidden_sizes=(), eval_epsilon=0.0)  # raw frames: no FIRE at a reset
    summary = train(
        tmp_path,
        num_envs=4,
        num_steps=4,
        num_minibatches=1,
        total_timesteps=16,
        eval_interval=1,
        num_eval_envs=2,
        **flags,
    )
    said = capsys.readouterr().out
    assert "at most 1,024 steps each" in said and "notice: the evaluation at step 16 stopped at its budget" in said, (
        said
    )
    acc = EventAccumulator(str(tmp_path / "run"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("eval/episodic_length")] == [1024.0]
    assert summary["evaluation_seconds"] < 60, summary
