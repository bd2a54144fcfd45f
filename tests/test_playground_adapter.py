"""The playground: adapter against MuJoCo Playground itself (its training wrapper, its torch wrapper, its configs), the
scripts on a Playground task, and its bad inputs. Marked `playground`: .ci/run's playground lane installs the package
(its MuJoCo is not the one mjlab pins, so it has a lane of its own) and runs them on CPU JAX with a DM Control task,
whose model ships inside the package. The envs here share one compiled step per size (the adapter's cache)."""

from __future__ import annotations

import importlib.util
import math
import sys

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.playground,
    pytest.mark.skipif(importlib.util.find_spec("mujoco_playground") is None, reason="needs MuJoCo Playground"),
]

TASK = "CartpoleBalance"
EPISODE = 10  # short episodes: several time-outs in a few dozen steps
KWARGS = dict(impl="jax", episode_length=EPISODE)  # MJX: a few seconds to compile on a CPU, where Warp takes a minute
N = 4
SEED = 7


def _numpy(x) -> np.ndarray:
    return np.asarray(x.cpu() if isinstance(x, torch.Tensor) else x)


@pytest.fixture(scope="module")
def tasks():
    """{impl: Playground's own env of the task and config, and its step of one env alone}, each compiled once."""
    import jax
    from mujoco_playground import registry

    def load(impl: str):
        if impl not in loaded:
            env = registry.load(TASK, config_overrides={**KWARGS, "impl": impl})
            loaded[impl] = env, jax.jit(env.step)
        return loaded[impl]

    loaded = {}
    return load


# MJX both ways; MuJoCo Warp (Playground's default backend, whose data holds leaves all envs share) with the trainers'
# full reset
@pytest.mark.parametrize("impl, full_reset", [("jax", True), ("jax", False), ("warp", True)])
def test_steps_as_playgrounds_own_wrappers_and_keeps_the_true_final_observation(impl, full_reset, tasks):
    """From the same seed and actions, every step's observations, rewards, dones and time-outs are those of
    Playground's own wrappers: its trainers' `wrap_for_brax_training(full_reset=True)` and, for full_reset=False, its
    torch wrapper RSLRLBraxWrapper (Playground's rsl_rl path). At a reset step ours also holds the last observation:
    the task's own step of that env alone, before any reset."""
    import jax
    from mujoco_playground._src import wrapper
    from mujoco_playground._src.wrapper_torch import RSLRLBraxWrapper

    from common.envs import make_env

    env, single_step = tasks(impl)
    ours = make_env(f"playground:{TASK}", N, seed=SEED, full_reset=full_reset, **{**KWARGS, "impl": impl})
    obs, _ = ours.reset(seed=SEED)
    if full_reset:  # the trainers' wrapper, reset from the keys the torch wrapper derives from SEED
        batched = wrapper.wrap_for_brax_training(env, episode_length=EPISODE, action_repeat=1, full_reset=True)
        their_step = jax.jit(batched.step)
        state = jax.jit(batched.reset)(jax.random.split(jax.random.split(jax.random.PRNGKey(SEED))[0], N))
    else:
        theirs = RSLRLBraxWrapper(env, N, SEED, EPISODE, 1)
        theirs.reset()
        state = theirs.env_state
    np.testing.assert_array_equal(_numpy(obs["policy"]), np.asarray(state.obs))
    actions = torch.rand(3 * EPISODE + 3, N, 1, generator=torch.Generator().manual_seed(0)) * 2.4 - 1.2
    ends = 0
    for t, action in enumerate(actions):
        obs, reward, terminated, truncated, info = ours.step(action)
        before = state
        if full_reset:
            state = their_step(state, jax.numpy.asarray(action.clamp(-1, 1).numpy()))
            # brax's full reset hands a restarted env the reset's info, truncation 0 among it: the limit it reached
            truncation = (np.asarray(state.done) > 0) & (np.asarray(state.info["steps"]) >= EPISODE)
        else:
            _, _, _, their_info = theirs.step(action)  # clipped there as here
            state = theirs.env_state
            truncation = _numpy(their_info["time_outs"]) > 0
        np.testing.assert_array_equal(_numpy(obs["policy"]), np.asarray(state.obs), err_msg=f"step {t}")
        np.testing.assert_array_equal(_numpy(reward), np.asarray(state.reward), err_msg=f"step {t}")
        np.testing.assert_array_equal(_numpy(terminated | truncated), np.asarray(state.done) > 0, err_msg=f"step {t}")
        np.testing.assert_array_equal(
            _numpy(truncated), truncation, err_msg=f"step {t}"
        )  # (CartpoleBalance never fails)
        for i in np.flatnonzero(_numpy(terminated | truncated)):
            ends += 1
            one = jax.tree.map(lambda x: x[i] if x.ndim and x.shape[0] == N else x, before)  # Warp's shared leaves
            alone = single_step(one, jax.numpy.asarray(action[i].clamp(-1, 1).numpy()))
            final = _numpy(info["final_obs"]["policy"][i])
            np.testing.assert_allclose(final, np.asarray(alone.obs), rtol=1e-6, atol=1e-6, err_msg=f"step {t} env {i}")
            assert not np.allclose(final, _numpy(obs["policy"][i])), "the final observation is the reset's"
    assert ends >= 3 * N  # every env timed out three times


def test_warps_per_step_solver_warning_is_off_and_said_once(capfd):
    """MuJoCo Warp prints "solver iterations limit reached" from inside every step of CartpoleBalance (its config's
    solver stops at 1 iteration): the adapter turns that warning off, says so at start, and keeps the rest."""
    import ctypes

    from common.envs import make_env
    from common.envs import playground_adapter

    playground_adapter._said.clear()  # the line is said once per process: this test's process may have said it
    playground_adapter._COMPILED.clear()
    envs = make_env(f"playground:{TASK}", N, seed=SEED, **{**KWARGS, "impl": "warp"})
    from mujoco_playground import registry

    loaded = registry.load(TASK, config_overrides={**KWARGS, "impl": "warp"})._mjx_model.opt._impl.warn_overflow
    assert loaded & playground_adapter.ITERATIONS_OVERFLOW  # Playground's model warns
    flags = envs.task._mjx_model.opt._impl.warn_overflow
    assert flags == loaded & ~playground_adapter.ITERATIONS_OVERFLOW, "only the iterations warning is off"
    said = capfd.readouterr().out
    assert said.count("solver reached its iteration limit is off (the task's config sets 1)") == 1, said
    envs.reset(seed=SEED)
    for _ in range(2 * EPISODE):
        envs.step(torch.zeros(N, 1))
    ctypes.CDLL(None).fflush(None)  # Warp's kernels print through C's stdio
    assert "limit reached" not in capfd.readouterr().out


def test_contract_and_the_saved_state_continues_exactly():
    """Spaces, dtypes and devices of the contract; metrics as 0-d tensors; a state_dict restored into a new env steps
    on bit for bit as the env it came from."""
    from common.envs import make_env

    envs = make_env(f"playground:{TASK}", N, seed=SEED, **KWARGS)
    assert envs.capturable is False and envs.num_envs == N
    assert envs.single_action_space.shape == (1,) and envs.single_action_space.high.tolist() == [1.0]
    assert envs.single_critic_observation_space is None and envs.max_episode_steps == EPISODE
    obs, _ = envs.reset(seed=SEED)
    obs, reward, terminated, truncated, info = envs.step(torch.zeros(N, 1))
    assert obs["policy"].shape == (N, *envs.single_observation_space.shape) and obs["policy"].dtype == torch.float32
    assert reward.dtype == torch.float32 and terminated.dtype == truncated.dtype == torch.bool
    assert info["log"] and all(v.shape == () and v.dtype == torch.float32 for v in info["log"].values())
    saved = envs.state_dict()
    assert all(isinstance(v, torch.Tensor) for v in saved.values())
    actions = torch.rand(EPISODE + 3, N, 1, generator=torch.Generator().manual_seed(2)) * 2 - 1
    first = [envs.step(a) for a in actions]
    other = make_env(f"playground:{TASK}", N, seed=SEED + 1, **KWARGS)
    other.load_state_dict(saved)
    for a, (obs, reward, terminated, truncated, info) in zip(actions, first):
        o, r, te, tr, i = other.step(a)
        assert torch.equal(o["policy"], obs["policy"]) and torch.equal(r, reward)
        assert torch.equal(te, terminated) and torch.equal(tr, truncated)
        assert torch.equal(i["final_obs"]["policy"], info["final_obs"]["policy"])
    with pytest.raises(ValueError, match="arrays"):
        make_env(f"playground:{TASK}", N, seed=SEED, full_reset=False, **KWARGS).load_state_dict(saved)


def test_bad_inputs_are_one_line_each(monkeypatch):
    from mujoco_playground._src import mjx_env

    from common.envs import make_env

    def line(**kwargs) -> str:
        env_id = kwargs.pop("env_id", f"playground:{TASK}")
        with pytest.raises(ValueError) as e:
            make_env(env_id, 2, **kwargs)
        assert "\n" not in str(e.value), str(e.value)
        return str(e.value)

    assert "'CartpoleBalance'" in line(env_id="playground:CartpoleBalanc")
    assert "no field of the task's config" in line(episode_lenght=5) and "episode_length" in line(episode_lenght=5)
    import jax

    if not any(d.platform == "gpu" for d in jax.devices()):
        assert "needs a CUDA build of JAX" in line(device="cuda", **KWARGS)
    if not mjx_env.MENAGERIE_PATH.exists():  # a machine that reaches no git host
        message = line(env_id="playground:Go1JoystickFlatTerrain")
        assert "mujoco_menagerie" in message and str(mjx_env.MENAGERIE_PATH) in message
    monkeypatch.setitem(sys.modules, "mujoco_playground", None)  # as if not installed
    assert "pip install -e '.[playground]'" in line(env_id="playground:CheetahRun")


def test_task_sets_translate_playgrounds_configs_field_by_field():
    """ppo's task set of a DM Control task is its brax PPO config, a locomotion task's its rsl_rl config (read without
    its assets), sac's a DM Control task's brax SAC config; what has no flag is named."""
    from mujoco_playground.config import dm_control_suite_params, locomotion_params

    from common.args import family
    from common.settings import RSL_RL_UPDATE, translate_brax_ppo, translate_brax_sac, translate_rsl_rl
    from tests.helpers import load_script

    assert family(f"playground:{TASK}") == family("playground:Go1JoystickFlatTerrain") == "task"
    ppo, sac = load_script("ppo"), load_script("sac")
    ppo_fields, sac_fields = set(ppo.Args.__dataclass_fields__), set(sac.Args.__dataclass_fields__)

    brax = dm_control_suite_params.brax_ppo_config(TASK)
    values, named = translate_brax_ppo(brax.to_dict(), ppo_fields, num_envs=brax.num_envs)
    per_update = brax.batch_size * brax.num_minibatches * brax.unroll_length
    assert values["num_envs"] == brax.num_envs and values["num_steps"] * brax.num_envs == per_update
    assert values["num_minibatches"] == brax.num_minibatches and values["update_epochs"] == brax.num_updates_per_batch
    assert values["gamma"] == brax.discounting and values["learning_rate"] == brax.learning_rate
    assert values["ent_coef"] == brax.entropy_cost and values["obs_norm"] == brax.normalize_observations
    assert values["total_timesteps"] == brax.num_timesteps and values["lr_schedule"] == "constant"
    assert values["eval_interval"] == brax.num_timesteps // per_update // brax.num_evals
    assert values["reward_scale"] == brax.reward_scaling and values["reward_norm"] is False  # brax's update too
    assert (values["policy_dist"], values["gae"], values["unroll_length"]) == ("tanh-normal", "in-loss", 30)
    assert set(values) <= ppo_fields
    # another number of envs keeps brax's batch per update
    values, _ = translate_brax_ppo(brax.to_dict(), ppo_fields, num_envs=64)
    assert values["num_steps"] * 64 == per_update

    rl = locomotion_params.rsl_rl_config("Go1JoystickFlatTerrain")
    values, named = translate_rsl_rl(rl.to_dict(), ppo_fields, num_envs=4096)
    algorithm = rl.algorithm
    assert values["learning_rate"] == algorithm.learning_rate and values["lr_schedule"] == "constant"
    assert values["num_steps"] == rl.num_steps_per_env and values["update_epochs"] == algorithm.num_learning_epochs
    assert values["vf_coef"] == 2 * algorithm.value_loss_coef and values["ent_coef"] == algorithm.entropy_coef
    assert values["hidden_sizes"] == tuple(rl.policy.actor_hidden_dims) and values["activation"] == "elu"
    assert values["total_timesteps"] == rl.max_iterations * rl.num_steps_per_env * 4096
    assert all(values[k] == v for k, v in RSL_RL_UPDATE.items() if k in values)
    assert not any(n.startswith(("runner_class_name", "checkpoint", "resume_path")) for n in named)

    sac_cfg = dm_control_suite_params.brax_sac_config(TASK)
    values, named = translate_brax_sac(sac_cfg.to_dict(), sac_fields)
    assert values["num_envs"] == sac_cfg.num_envs and values["batch_size"] == sac_cfg.batch_size
    assert values["num_updates"] == sac_cfg.grad_updates_per_step and values["q_lr"] == sac_cfg.learning_rate
    assert values["learning_starts"] == sac_cfg.min_replay_size and values["buffer_size"] == sac_cfg.max_replay_size
    assert values["gamma"] == sac_cfg.discounting and values["n_step"] == 1
    assert values["critic_layer_norm"] is sac_cfg.network_factory.q_network_layer_norm is True
    assert not any(n.startswith("network_factory") for n in named), named  # its one field translated


# Each script for a few iterations on the task, stopped and resumed, against a run never stopped; the same tiny sizes
# as the contract tests, 8 envs for training and evaluation alike (one compiled step).
ENV = dict(env_id=f"playground:{TASK}", env_kwargs='{"impl": "jax", "episode_length": 16}', settings="builtin")
RUN = dict(device="cpu", progress=False, run_name="run", num_envs=8, num_eval_envs=8, hidden_sizes=(32, 32))
ON_POLICY = dict(num_steps=8, num_minibatches=2)
OFF_POLICY = dict(batch_size=32, learning_starts=16, buffer_size=240, log_interval=4, save_buffer=True)
SCRIPTS = {
    "ppo": dict(ON_POLICY, units=8, eval_interval=2),
    "ppo_rnd": dict(ON_POLICY, units=8, eval_interval=2, rnd_hidden_sizes=(16,), rnd_target_hidden_sizes=(16,)),
    "ppo_lstm": dict(ON_POLICY, units=8, eval_interval=2, rnn_hidden_size=16),
    "distill": dict(ON_POLICY, units=8, eval_interval=2, rnn_hidden_size=16, teacher_action_prob=0.5),
    "td3": dict(OFF_POLICY, units=4, eval_interval=8),
    "sac": dict(OFF_POLICY, units=4, eval_interval=8),
}


@pytest.mark.parametrize("algo", list(SCRIPTS))
def test_every_script_trains_resumes_bit_identically_and_evaluates_on_a_playground_task(algo, tmp_path):
    from tests.helpers import load_script, run_main
    from tests.test_scripts import assert_same, next_second, without_flags_and_clocks

    flags = dict(SCRIPTS[algo])
    steps = flags.pop("units") * RUN["num_envs"]  # env steps of one iteration (an update unit of td3 and sac)
    if algo == "distill":  # a teacher of the task: one iteration of ppo.py
        ppo = dict(ENV, **RUN, **ON_POLICY, output_dir=str(tmp_path / "teacher"), total_timesteps=steps)
        run_main(load_script("ppo"), **ppo)
        flags["teacher"] = str(tmp_path / "teacher" / "run" / "checkpoints" / "last.pt")
    module = load_script(algo)

    def train(out, **more):
        return run_main(module, **ENV, **RUN, **flags, output_dir=str(out), total_timesteps=4 * steps, **more)

    full = train(tmp_path / "a")
    first = train(tmp_path / "b", max_wall_seconds=0.0)
    assert first["stop_reason"] == "max_wall_seconds" and first["global_step"] < full["global_step"]
    next_second()
    last = train(tmp_path / "b", resume="auto")
    assert last["global_step"] == full["global_step"] == 4 * steps
    ckpt = {k: torch.load(tmp_path / k / "run" / "checkpoints" / "last.pt", weights_only=True) for k in "ab"}
    assert ckpt["a"]["ranks"][0]["env"], "the envs' JAX state is in the checkpoint"
    assert_same(without_flags_and_clocks(ckpt["a"]), without_flags_and_clocks(ckpt["b"]))
    assert math.isfinite(full["best_eval_return"]) and full["best_eval_return"] == last["best_eval_return"]


# sac.py by the task's name on a CPU: the `task` set is Playground's brax SAC config of CartpoleBalance (128 envs,
# batches of 512, 8 updates per step, lr 1e-3, 8,192 random steps first, layer-normed critics), its budget cut for a
# CPU. Measured first (seed 1, a 2-core CPU; docs/playground.md, its command): an untrained policy's eval return 269;
# with the set whole, evaluations every 25,600 steps 483, 426, 407, 465, 618 (at 128,000), 545: 500 is passed at
# 128,000 steps, 7 minutes here, more than this lane can pay; with --no-critic-layer-norm 525 (at 25,600), 430, 402,
# 562, 559, 513. The set without the layer norm is held here: 500 within 128,000 steps (it stops at 25,600, a minute).
SAC_TARGET, SAC_BUDGET = 500.0, 128_000


@pytest.mark.slow
def test_sac_learns_cartpole_balance_with_the_tasks_set_on_a_cpu(tmp_path, monkeypatch):
    from common.args import parse_args
    from tests.helpers import load_script

    sac = load_script("sac")
    argv = ["--env-id", f"playground:{TASK}", "--device", "cpu", "--seed", "1", "--total-timesteps", str(SAC_BUDGET)]
    argv += ["--num-eval-envs", "16", "--eval-interval", "200", "--target-return", str(SAC_TARGET), "--no-progress"]
    argv += ["--output-dir", str(tmp_path), "--run-name", "run", "--no-critic-layer-norm", "--settings", "task"]
    monkeypatch.setattr(sys, "argv", ["sac.py", *argv])
    args = parse_args(sac.Args, argv)
    assert args.settings == "task" and (args.num_envs, args.batch_size, args.num_updates) == (128, 512, 8)
    assert not args.critic_layer_norm
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        summary = sac.main(args)
    finally:
        torch.set_num_threads(threads)
    assert summary["best_eval_return"] >= SAC_TARGET and summary["global_step"] <= SAC_BUDGET, summary


# ppo.py by the task's name on a CPU: the `task` set is brax's PPO config of CartpoleBalance, sized for 2,048 envs and
# 60M steps on a GPU (983,040 steps per update; cut to 64 envs it had not learned by 160,000 steps, docs/playground.md),
# so a machine without CUDA gets the `cpu` set: the plain defaults at 64 envs (24 steps, 4 minibatches, 5 epochs, an
# adaptive rate), 16 eval envs, MJX. Measured first (the plain command, seed 1, one torch thread, a 2-core CPU at a load
# average of 7-8 from other work): its first evaluation 62 s after the command started (55 s of them imports and
# compiles), eval returns 353, 367, 589, 314, 953, 1,000 at 15,360 to 92,160 steps. Held: the first evaluation within a
# minute of the start (its first 10 iterations, the cpu set's evaluation interval), and 900 within 100 iterations (it
# stops at 76,800 steps).
PPO_TARGET, PPO_BUDGET, FIRST_EVALUATION_ITERATIONS = 900.0, 100 * 64 * 24, 10


@pytest.mark.slow
def test_ppo_by_the_tasks_name_on_a_cpu_evaluates_within_a_minute_and_learns(tmp_path, monkeypatch, capsys):
    import time

    import common.loop
    from common.args import parse_args
    from tests.helpers import load_script

    started = time.monotonic()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without CUDA, whatever this one has
    ppo = load_script("ppo")
    argv = ["--env-id", f"playground:{TASK}", "--total-timesteps", str(PPO_BUDGET), "--target-return", str(PPO_TARGET)]
    argv += ["--no-progress", "--output-dir", str(tmp_path), "--run-name", "run"]
    monkeypatch.setattr(sys, "argv", ["ppo.py", *argv])
    args = parse_args(ppo.Args, argv)
    assert args.settings == "cpu" and (args.num_envs, args.num_eval_envs, args.num_steps) == (64, 16, 24)
    evaluated, evaluate = [], common.loop.evaluate

    def timed_evaluate(run, *a):  # the step and the time its line is said
        result = evaluate(run, *a)
        evaluated.append((run.global_step, time.monotonic() - started))
        return result

    monkeypatch.setattr(common.loop, "evaluate", timed_evaluate)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        summary = ppo.main(args)
    finally:
        torch.set_num_threads(threads)
    start_line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("ppo on "))
    assert f"settings cpu (for playground:{TASK} on a machine without CUDA: a CPU's sizes" in start_line, start_line
    assert f"python algos/ppo.py --env-id playground:{TASK} --settings task)" in start_line, start_line
    # the first one said early: at most FIRST_EVALUATION_ITERATIONS iterations in, a count of work that the CPU figure
    # above puts within a minute (the seconds are printed, not held: a test asserts no wall time)
    print(f"first evaluation at {evaluated[0][0]:,} env steps, {evaluated[0][1]:.0f} s after the start")
    assert evaluated and evaluated[0][0] <= FIRST_EVALUATION_ITERATIONS * 64 * 24, evaluated
    assert summary["best_eval_return"] >= PPO_TARGET and summary["global_step"] <= PPO_BUDGET, summary  # ...it learns


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("rsl_rl") is None, reason="needs rsl-rl-lib (the playground lane has it)")
def test_playground_benchmark_measures_every_row_on_a_cpu(tmp_path, capsys):
    """tests/benchmarks/playground.py end to end at tiny sizes: both env-only rows, algos/ppo.py and Playground's own
    rsl_rl path (its torch wrapper under rsl_rl's runner) each measured, with the borrowed config's sizes on both,
    brax's own PPO (ppo.train with the task's brax PPO config, cut to a CPU's batch), and td3.py with FastTD3's settings
    and the hours its SPS needs for FastTD3's budget; the results under one folder (--out)."""
    import json

    from tests.benchmarks import playground as playground_bench

    out = tmp_path / "playground.json"
    argv = ["--device", "cpu", "--task", TASK, "--impl", "jax", "--num-envs", "8", "--iterations", "2"]
    argv += ["--warmup-iterations", "1", "--env-steps", "3", "--env-warmup-steps", "1", "--repeats", "1"]
    # FastTD3's 1,024 envs and 32,768 a batch are a GPU's; its log interval, 100 iterations, made this row 300
    # iterations of a 1,024-wide critic, most of this test's time on two cores: here 10 make one logged iteration
    argv += ["--td3-num-envs", "8", "--td3-args", "--batch-size 64 --log-interval 10"]
    # brax's config collects 983,040 steps per training step: 8 envs, 2 minibatches of 8 unrolls of 4 steps here
    brax = {"batch_size": 8, "num_minibatches": 2, "unroll_length": 4, "num_updates_per_batch": 1}
    argv += ["--brax-num-envs", "8", "--brax-overrides", json.dumps(brax), "--out", str(tmp_path / "results")]
    threads = torch.get_num_threads()
    try:
        code = playground_bench.main([*argv, "--threads", "1", "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    stdout = capsys.readouterr().out
    assert code == 0, stdout[-3000:]
    report = json.loads(out.read_text())
    assert [r["learner"] for r in report["env_only"]] == [
        "env only: RSLRLBraxWrapper",
        "env only: adapter, full_reset=False",
    ]
    assert all(math.isfinite(r["sps"]) and r["sps"] > 0 for r in report["env_only"])
    assert [r["learner"] for r in report["training"]] == [
        "algos/ppo.py",
        "Playground's rsl_rl path (RSLRLBraxWrapper + OnPolicyRunner)",
        "brax's PPO (ppo.train + wrap_for_brax_training, brax_ppo_config)",
        "algos/td3.py, FastTD3's settings",
    ]
    for r in report["training"]:
        assert r["status"] == "ok", r
        keys = ("sps", "iteration_seconds") if "brax" in r["learner"] else ("sps", "rollout_seconds", "update_seconds")
        keys += ("hours_to_fasttd3_budget",) if "td3" in r["learner"] else ("ratio_to_playground_rsl_rl",)
        for key in keys:
            assert math.isfinite(r[key]) and r[key] > 0, (r["learner"], key, r.get(key))
    brax_row = report["training"][2]  # brax's own loop: 64 env steps per training step, the overrides applied
    assert brax_row["steps_per_iteration"] == 64 and brax_row["iterations_timed"] == 2, brax_row
    assert brax_row["brax_config"]["reward_scaling"] == 10.0 and brax_row["num_envs"] == 8, brax_row
    td3 = report["training"][3]
    assert td3["fasttd3_iterations"] == 1_500_000 and "--settings task" in td3["command"], td3  # its Playground default
    assert td3["hours_to_fasttd3_budget"] == pytest.approx(1_500_000 * 8 / td3["sps"] / 3600)
    sizes = report["config"]["sizes"]  # Go1's rsl_rl config, CartpoleBalance having none
    assert report["config"]["rl_config_of"] == "Go1JoystickFlatTerrain" and sizes["hidden_sizes"] == [512, 256, 128]
    ours = report["training"][0]["command"]
    assert "--hidden-sizes 512 256 128" in ours and "--activation elu" in ours and "--num-steps 24" in ours, ours
    assert "--settings builtin" in ours, ours
    rows = [line for line in stdout.splitlines() if line.startswith("| ")]
    assert rows[0] == "| learner | SPS | rollout/collection s | update s | x Playground's rsl_rl |", rows
    assert len(rows) == 1 + 6 and rows[-1].startswith("| algos/td3.py, FastTD3's settings | "), rows
    assert rows[-2].startswith("| brax's PPO (ppo.train + wrap_for_brax_training, brax_ppo_config) | "), rows
    results = tmp_path / "results"  # one folder: the report as printed and the figures
    assert json.loads((results / "playground.json").read_text())["training"][2]["sps"] == brax_row["sps"]
    assert "| brax's PPO (" in (results / "report.md").read_text()
    assert "h for FastTD3's budget of 1,500,000 iterations" in stdout, stdout[-2000:]
