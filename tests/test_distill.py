"""algos/distill.py: a student on masked CartPole learns from a teacher trained on the full state, its networks
start ppo_lstm.py and ppo.py with --init-from, and a teacher that does not fit the task stops the run in one line.
(The contract every script keeps: tests/test_scripts.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from gymnasium import spaces

from common.checkpoint import save_checkpoint
from common.envs.core import TorchEnv
from tests.helpers import load_script, run_main, untrained_teacher

MASKED = '{"mask_velocity": true}'
PLAIN = dict(device="cpu", progress=False, num_eval_envs=64, save_interval=10_000)


def test_a_student_loaded_into_ppo_lstm_or_ppo_acts_as_it_does():
    """Every tensor of a student (cell, actor head, normalizer) is one that ppo_lstm.py's Agent (cell lstm/gru) or
    ppo.py's (no cell) has, with the same shape and meaning: loaded by name, as --init-from loads it, the
    agent's deterministic actions over a sequence of observations are the student's."""
    distill, ppo_lstm, ppo = load_script("distill"), load_script("ppo_lstm"), load_script("ppo")
    g = torch.Generator().manual_seed(0)
    for space in (gym.spaces.Discrete(2), gym.spaces.Box(-2.0, 2.0, (1,))):
        for cell, script in (("lstm", ppo_lstm), ("gru", ppo_lstm), ("none", ppo)):
            student = distill.Policy(2, space, cell, 16, 2 if cell != "none" else 1, (32,), "tanh", True, 10.0)
            student.obs_rms.update(torch.randn(64, 2, generator=g) * 3 + 1)  # a normalizer that is not the identity
            args = script.Args(
                hidden_sizes=(32,), **({"cell": cell, "rnn_hidden_size": 16, "rnn_layers": 2} if cell != "none" else {})
            )
            agent = script.Agent(2, 4, space, args)
            own = agent.state_dict()
            assert all(k in own and own[k].shape == v.shape for k, v in student.state_dict().items()), (cell, space)
            agent.load_state_dict(student.state_dict(), strict=False)
            obs = torch.randn(5, 8, 2, generator=g)
            with torch.no_grad():
                if cell == "none":
                    assert torch.equal(agent.deterministic(obs[0]), student.deterministic(obs[0])), space
                    continue
                a_state = s_state = student.initial_state(8)
                for x in obs:
                    (a, a_state), (s, s_state) = agent.recurrent_step(x, a_state), student.recurrent_step(x, s_state)
                    assert torch.equal(a, s) and torch.equal(a_state, s_state), (cell, space)


def test_the_update_batch_is_on_the_rollouts_device():
    """targets() gives the update a batch on the rollout's device: the update draws its minibatch permutation on
    batch.device, and a batch without one drew it on the host, whose index copy to the GPU a CUDA capture refuses."""
    distill = load_script("distill")
    student = distill.Policy(3, gym.spaces.Discrete(2), "gru", 8, 1, (16,), "tanh", True, 10.0)
    T, N = 4, 6
    data = distill.TensorDict(
        {
            "obs": torch.randn(T, N, 3),
            "teacher": torch.randn(T, N, 2),
            "rewards": torch.ones(T, N),
            "dones": torch.zeros(T, N, dtype=torch.bool),
        },
        batch_size=[T, N],
        device="cpu",
    )
    batch, _ = distill.targets(
        student, data, torch.zeros(2, N, dtype=torch.float64), torch.zeros(3, dtype=torch.float64), distill.Args()
    )
    assert batch.device == torch.device("cpu") and batch.batch_size == (T, N)


def test_a_teacher_that_does_not_fit_the_task_stops_in_one_line(tmp_path):
    distill = load_script("distill")
    teacher = untrained_teacher(tmp_path / "pendulum.pt", "Pendulum-v1")
    common = dict(PLAIN, output_dir=str(tmp_path / "out"), num_envs=8, num_steps=4, total_timesteps=64)
    with pytest.raises(
        SystemExit,
        match=r"^error: --teacher .*pendulum.pt \(ppo on Pendulum-v1\) reads 3 observations and "
        r"has 1 action outputs \(Gaussian\); CartPole-v1's 'critic' observations have 4",
    ):
        run_main(distill, **common, env_id="CartPole-v1", env_kwargs=MASKED, teacher=str(teacher))
    with pytest.raises(SystemExit, match=r"^error: --teacher PATH is required"):
        run_main(distill, **common)
    with pytest.raises(
        SystemExit, match=r"^error: --teacher-obs height: Pendulum-v1 has the observation groups policy$"
    ):
        run_main(distill, **common, env_id="Pendulum-v1", teacher=str(teacher), teacher_obs="height")
    with pytest.raises(SystemExit, match=r"^error: --teacher: no checkpoint at"):
        run_main(distill, **common, env_id="Pendulum-v1", teacher=str(tmp_path / "none.pt"))
    assert not (tmp_path / "out").exists()


def test_a_teacher_whose_gaussian_learns_its_std_itself_teaches(tmp_path):
    """ppo.py's --std-type scalar (rsl_rl's, the task set's) keeps the std itself, not its log: its checkpoint is a
    Gaussian teacher all the same, refused for a Discrete task and taken for its own."""
    distill = load_script("distill")
    teacher = untrained_teacher(tmp_path / "scalar.pt", "Pendulum-v1", std_type="scalar")
    assert "std" in torch.load(teacher, weights_only=True)["model"]
    common = dict(PLAIN, num_envs=8, num_steps=4, total_timesteps=32, eval_interval=0)
    summary = run_main(distill, **common, output_dir=str(tmp_path / "out"), env_id="Pendulum-v1", teacher=str(teacher))
    assert summary["global_step"] == 32
    with pytest.raises(SystemExit, match=r"has 1 action outputs \(Gaussian\); CartPole-v1's"):
        run_main(distill, **common, output_dir=str(tmp_path / "no"), env_id="CartPole-v1", teacher=str(teacher))


def as_copys(path, to, algo: str, algorithm: str):
    """The checkpoint at `path` as the script `algo`, a copy of `algorithm`'s, writes it (its two names) at `to`."""
    ckpt = torch.load(path, weights_only=True)
    ckpt.update(algo=algo, algorithm=algorithm)
    return str(save_checkpoint(ckpt, to))


def test_a_teacher_is_taken_by_its_algorithm_so_a_copys_checkpoint_teaches(tmp_path):
    """A copy of ppo.py (ppo_mine.py) writes "algo": "ppo_mine", "algorithm": "ppo": it teaches as ppo's does; a
    copy of distill.py's Box student teaches as a student does (its mean, no log_std); a copy of another algorithm
    stops in one line that names both."""
    distill = load_script("distill")
    tiny = dict(
        PLAIN,
        output_dir=str(tmp_path / "out"),
        env_id="Pendulum-v1",
        num_envs=8,
        num_steps=4,
        num_minibatches=2,
        num_eval_envs=4,
        eval_interval=0,
        total_timesteps=64,
    )
    ppo_copy = as_copys(untrained_teacher(tmp_path / "ppo.pt"), tmp_path / "ppo_mine.pt", "ppo_mine", "ppo")
    student = run_main(distill, **tiny, run_name="of_ppo_mine", cell="none", teacher=ppo_copy)
    assert student["global_step"] == 64 and student["teacher"]["path"] == ppo_copy
    distill_copy = as_copys(student["checkpoints"]["last"], tmp_path / "distill_mine.pt", "distill_mine", "distill")
    again = run_main(distill, **tiny, run_name="of_distill_mine", teacher=distill_copy)
    assert again["global_step"] == 64 and again["teacher"]["path"] == distill_copy
    other = as_copys(untrained_teacher(tmp_path / "ppo.pt"), tmp_path / "pqn_mine.pt", "pqn_mine", "pqn")
    with pytest.raises(
        SystemExit,
        match=r"^error: --teacher .*pqn_mine.pt was written by pqn_mine.py \(algorithm pqn\); "
        r"a teacher comes from ppo.py, ppo_lstm.py, distill.py or a copy of one$",
    ):
        run_main(distill, **tiny, run_name="of_pqn_mine", teacher=other)


class Lives(TorchEnv):
    """A stand-in for a game with lives and vector observations (distill.py reads no frames): a life is the
    learner's episode, LIFE steps with reward 1 on every other one (clipped, as Atari's training preset gives
    them); info's game_reward is the game's own, 2 on those steps and 5 more at each lost life, and game_over
    ends the game at its LIVES-th lost life. A game scores GAME_SCORE whatever the actions; a life, clipped, 4."""

    env_id, state_dim, num_reset_uniforms, default_max_episode_steps = "Lives-v0", 1, 1, 1000
    LIFE, LIVES = 8, 3
    GAME_SCORE = (2 * LIFE // 2 + 5) * LIVES

    def __init__(self, num_envs, device="cpu", seed=0, dtype=torch.float32, max_episode_steps=None):
        self.single_observation_space = spaces.Box(-float("inf"), float("inf"), (2,))
        self.single_action_space = spaces.Discrete(2)
        super().__init__(num_envs, device, seed, dtype, max_episode_steps)
        self.lives_lost = torch.zeros(num_envs, device=self.device)

    def _initial_state(self, u):
        return torch.zeros_like(u[:, :1])

    def _dynamics(self, state, action):
        frame = state + 1
        terminated = frame[:, 0] >= self.LIFE
        return frame, (frame[:, 0] % 2 == 0).float(), terminated

    def _observe(self, state):
        return torch.stack([state[:, 0] / self.LIFE, self.lives_lost.to(state.dtype)], 1)

    def reset(self, seed=None):
        self.lives_lost.zero_()
        return super().reset(seed)

    def step(self, action):
        frame = self.state[:, 0] + 1  # the step's frame of the life, before the autoreset
        obs, reward, terminated, truncated, info = super().step(action)
        self.lives_lost.add_(terminated)
        game_over = (self.lives_lost >= self.LIVES) | truncated
        self.lives_lost.masked_fill_(game_over, 0)
        info.update(game_reward=2.0 * (frame % 2 == 0) + 5.0 * terminated, game_over=game_over)
        return obs, reward, terminated, truncated, info


def test_a_student_logs_the_games_score_where_the_env_reports_one(tmp_path, monkeypatch):
    """An env whose info has the game's reward and end (Atari's presets): charts/episodic_return and
    eval/episodic_return are the game's score (39), not a life's clipped sum (4)."""
    import common.envs

    monkeypatch.setitem(common.envs.BUILTIN_ENVS, Lives.env_id, Lives)
    teacher = untrained_teacher(tmp_path / "teacher.pt", Lives.env_id)
    summary = run_main(
        load_script("distill"),
        **dict(PLAIN, num_eval_envs=1),
        output_dir=str(tmp_path / "out"),
        env_id=Lives.env_id,
        teacher=str(teacher),
        num_envs=4,
        num_steps=24,
        num_minibatches=2,
        total_timesteps=4 * 24 * 2,
        eval_interval=2,
        eval_episodes=1,
        seed=1,
    )
    assert summary["last_train_return"] == Lives.GAME_SCORE == 39
    assert summary["best_eval_return"] == Lives.GAME_SCORE


@pytest.fixture(scope="module")
def distilled(tmp_path_factory):
    """A ppo.py teacher trained on unmasked CartPole-v1 (seconds), then an LSTM student distilled from it on the
    masked task, the teacher reading the env's 'critic' group (the full state)."""
    out = tmp_path_factory.mktemp("distill")
    teacher = run_main(
        load_script("ppo"),
        **PLAIN,
        output_dir=str(out),
        run_name="teacher",
        env_id="CartPole-v1",
        num_envs=256,
        num_steps=32,
        eval_interval=0,
        total_timesteps=196_608,
    )
    student = run_main(
        load_script("distill"),
        **PLAIN,
        output_dir=str(out),
        run_name="student",
        env_id="CartPole-v1",
        env_kwargs=MASKED,
        teacher=teacher["checkpoints"]["last"],
        num_envs=256,
        num_steps=32,
        eval_interval=2,
        total_timesteps=163_840,
        target_return=475.0,
    )
    return out, teacher, student


@pytest.mark.slow
def test_an_lstm_student_balances_masked_cartpole_from_a_full_state_teacher(distilled):
    out, teacher, student = distilled
    assert student["best_eval_return"] >= 475.0, student
    assert student["teacher"]["path"] == teacher["checkpoints"]["last"] and len(student["teacher"]["sha256"]) == 64
    saved = torch.load(student["checkpoints"]["best"], weights_only=True)
    assert saved["state"]["teacher"] == student["teacher"]  # the checkpoint knows its teacher too


def test_a_recurrent_teacher_acts_with_its_own_hidden_state(tmp_path):
    """A ppo_lstm.py checkpoint teaches too: its cell runs beside the student's (an MLP here), with one hidden
    state per env that the checkpoints keep (exact resume); a distilled student teaches in turn."""
    tiny = dict(
        PLAIN,
        output_dir=str(tmp_path),
        env_id="Pendulum-v1",
        num_envs=16,
        num_steps=8,
        num_minibatches=2,
        num_eval_envs=4,
        eval_interval=0,
        env_kwargs='{"max_episode_steps": 16}',
    )
    teacher = run_main(load_script("ppo_lstm"), **tiny, run_name="teacher", rnn_hidden_size=8, total_timesteps=128)
    student = run_main(
        load_script("distill"),
        **tiny,
        run_name="student",
        cell="none",
        total_timesteps=384,
        teacher=teacher["checkpoints"]["last"],
    )
    saved = torch.load(student["checkpoints"]["last"], weights_only=True)
    teacher_state = saved["ranks"][0]["state"]["teacher_state"]
    assert teacher_state.shape == (2, 16, 8) and teacher_state.abs().sum() > 0  # h and c rows of an LSTM of 8
    assert saved["ranks"][0]["state"]["rnn_state"].numel() == 0  # the MLP student has no memory
    again = run_main(
        load_script("distill"), **tiny, run_name="again", total_timesteps=128, teacher=student["checkpoints"]["last"]
    )
    assert again["global_step"] == 128 and again["teacher"]["path"] == str(
        Path(student["checkpoints"]["last"]).resolve()
    )


def test_results_command_runs_a_student_after_its_teacher_and_reuses_finished_runs(tmp_path, monkeypatch):
    """tests/benchmarks/learning.py: an experiment `after` another starts from that experiment's run of the same
    seed (its teacher's checkpoint, given as --teacher), which runs first and is not stopped at its target;
    --reuse reads finished runs instead of running them again."""
    from tests.benchmarks import learning

    tiny = [
        "--num-envs",
        "16",
        "--num-steps",
        "8",
        "--eval-interval",
        "1",
        "--num-eval-envs",
        "4",
        "--env-kwargs",
        '{"max_episode_steps": 16}',
    ]
    monkeypatch.setattr(
        learning,
        "EXPERIMENTS",
        {
            "ppo:Pendulum-v1@teacher": dict(target=-1e9, budget=256, flags=tiny),
            "distill:Pendulum-v1@student": dict(
                target=1e9,
                budget=256,
                flags=[*tiny, "--cell", "none"],
                after=("ppo:Pendulum-v1@teacher", "--teacher", "last.pt"),
            ),
        },
    )
    argv = [
        "--experiments",
        "distill:Pendulum-v1@student",
        "--seeds",
        "3",
        "--jobs",
        "1",
        "--threads",
        "1",
        "--stop-at-target",
        "--out",
        str(tmp_path / "out"),
        "--runs-dir",
        str(tmp_path / "runs"),
    ]
    assert learning.main(argv) == 0
    runs = json.loads((tmp_path / "out" / "learning.json").read_text())["runs"]
    teacher, student = runs
    assert teacher["name"] == "ppo:Pendulum-v1@teacher" and "--target-return" not in teacher["command"]
    assert teacher["summary"]["global_step"] == 256  # not stopped at its (reached) target: a teacher trains on
    assert student["summary"]["teacher"]["path"] == str(Path(teacher["summary"]["checkpoints"]["last"]).resolve())
    assert learning.main([*argv, "--reuse"]) == 0
    again = json.loads((tmp_path / "out" / "learning.json").read_text())["runs"]
    assert [r["summary"] for r in again] == [teacher["summary"], student["summary"]]  # read, not run again


def test_a_recurrent_students_export_carries_its_state(tmp_path):
    """--eval-only --export of an LSTM student: policy.pt2 takes (obs, state) and returns (action, next_state),
    the student's own steps over a sequence; policy.json gives the state's shape."""
    pytest.importorskip("onnx")
    from tests.helpers import load_exported_program

    distill = load_script("distill")
    tiny = dict(
        PLAIN,
        output_dir=str(tmp_path),
        run_name="run",
        env_id="Pendulum-v1",
        num_envs=16,
        num_steps=8,
        num_minibatches=2,
        num_eval_envs=4,
        eval_interval=0,
        rnn_hidden_size=8,
        teacher=str(untrained_teacher(tmp_path / "teacher.pt", "Pendulum-v1")),
    )
    run_main(distill, **tiny, total_timesteps=256)
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    run_main(distill, **tiny, eval_only=True, resume=str(last), export=str(tmp_path / "export"))
    assert json.loads((tmp_path / "export" / "policy.json").read_text())["state"]["shape"] == [2, "batch", 8]
    saved = torch.load(last, weights_only=True)
    student = distill.Policy(3, gym.spaces.Box(-2.0, 2.0, (1,)), "lstm", 8, 1, (64,), "tanh", True, 10.0)
    student.load_state_dict(saved["model"])
    program = load_exported_program(tmp_path / "export" / "policy.pt2")
    assert "model.policy.rnn.weight_ih_l0" in program.state_dict()  # the names the script's own EvalPolicy gave
    state = expected_state = student.initial_state(5)
    for obs in torch.randn(4, 5, 3, generator=torch.Generator().manual_seed(0)):
        with torch.no_grad():
            (action, state), (expected, expected_state) = (
                program(obs, state),
                student.recurrent_step(obs, expected_state),
            )
        torch.testing.assert_close(action, expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(state, expected_state, rtol=0, atol=1e-5)
