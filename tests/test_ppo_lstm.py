"""algos/ppo_lstm.py: learning on partially observed tasks, the sequence replay, evaluation with
hidden states, and the exported recurrent policy.

The run contract (resume, checkpoints, logging, NaN guard, torchrun, faults, errors) is tested
for every script in tests/test_scripts.py."""

import json
import re

import numpy as np
import pytest
import torch

from common.envs import make_env
from common.evaluation import run_episodes
from tests.helpers import load_exported_program, load_script, run_main

ppo_lstm = load_script("ppo_lstm")
MASKED = '{"mask_velocity": true}'


def train(tmp_path, **overrides) -> dict:
    """ppo_lstm.main in this process, on one thread (tiny networks gain nothing from more)."""
    kwargs = dict(
        output_dir=str(tmp_path),
        run_name="run",
        progress=False,
        num_envs=32,
        num_steps=16,
        total_timesteps=32 * 16 * 3,
        eval_interval=0,
        num_eval_envs=8,
        device="cpu",
    )
    return run_main(ppo_lstm, **{**kwargs, **overrides})


def checkpoint(tmp_path, name="last.pt") -> dict:
    return torch.load(tmp_path / "run" / "checkpoints" / name, weights_only=True)


def build_agent(state: dict, env) -> "ppo_lstm.Agent":
    args = ppo_lstm.Args(**{k: tuple(v) if isinstance(v, list) else v for k, v in state["args"].items()})
    critic = getattr(env, "single_critic_observation_space", None)  # a masked env's full observation
    critic_dim = critic.shape[0] if critic is not None and args.asymmetric_critic else None
    agent = ppo_lstm.Agent(env.single_observation_space.shape[0], critic_dim, env.single_action_space, args)
    agent.load_state_dict(state["model"])
    return agent.eval()


def logged(run_dir, tag: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return [e.value for e in acc.Scalars(tag)]


# --------------------------------------------------------------------------------------------
# learning
# --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_masked_cartpole_is_solved_with_memory(tmp_path):
    """CartPole observing only the cart position and the pole angle: a feed-forward policy cannot
    tell which way the pole moves; ppo_lstm's memory can. Eval return >= 475 within 300k env steps
    with 64 envs x 16 steps (CI-sized; the defaults' figures come from tests/benchmarks/learning.py)."""
    summary = train(
        tmp_path,
        env_id="CartPole-v1",
        env_kwargs=MASKED,
        seed=1,
        num_envs=64,
        num_steps=16,
        total_timesteps=300_000,
        eval_interval=5,
        num_eval_envs=32,
        target_return=475.0,
    )
    assert summary["best_eval_return"] >= 475.0, summary


# --------------------------------------------------------------------------------------------
# the sequence replay
# --------------------------------------------------------------------------------------------
def replay_errors(monkeypatch, tmp_path, ignore_starts: bool = False, **kwargs) -> list[tuple[float, float]]:
    """(max |log-prob - rollout's|, max |value - rollout's|) of every minibatch's replay in a run with
    one epoch of one minibatch: its first forward pass, on the weights the rollout acted with."""
    errors, loss = [], ppo_lstm.ppo_loss

    def checked_loss(agent, mb, state, args):
        with torch.no_grad():
            starts = torch.zeros_like(mb["starts"]) if ignore_starts else mb["starts"]
            out = agent.replay(mb["obs_n", "policy"], state, starts)
            logprob, _ = agent.log_prob_entropy(out, mb["actions"])
            value = agent.value(out, mb["obs_n"])
        errors.append(((logprob - mb["logprobs"]).abs().max().item(), (value - mb["values"]).abs().max().item()))
        return loss(agent, mb, state, args)

    monkeypatch.setattr(ppo_lstm, "ppo_loss", checked_loss)
    train(tmp_path, num_minibatches=1, update_epochs=1, **kwargs)
    return errors


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_update_replays_the_rollout_exactly(tmp_path, monkeypatch, cell):
    """Replaying every env's sequence from its stored initial hidden state, with the state zeroed at
    the episode starts, gives back the rollout's log-probs and values, over iterations whose
    sequences start mid-episode and hold episode ends (8-step episodes in 12-step rollouts, both
    terminations and truncations). Without the zeroing at episode starts it does not."""
    kwargs = dict(
        env_id="CartPole-v1",
        env_kwargs='{"max_episode_steps": 8, "mask_velocity": true}',
        cell=cell,
        rnn_layers=2,
        num_steps=12,
        total_timesteps=32 * 12 * 4,
    )
    errors = replay_errors(monkeypatch, tmp_path / "exact", **kwargs)
    assert len(errors) == 4 and max(max(e) for e in errors) < 1e-5, errors
    leaky = replay_errors(monkeypatch, tmp_path / "leaky", ignore_starts=True, **kwargs)
    assert max(e[1] for e in leaky) > 1e-3, leaky


def test_hidden_state_is_checkpointed_per_env(tmp_path):
    """last.pt holds each env's hidden state [k * layers, num_envs, hidden] (exact resume is tested in
    test_scripts.py), and the envs whose episode just ended carry zeros there."""
    train(
        tmp_path,
        env_id="CartPole-v1",
        env_kwargs='{"max_episode_steps": 9}',
        rnn_layers=2,
        rnn_hidden_size=16,
        num_steps=9,
        total_timesteps=32 * 9,
    )
    rank = checkpoint(tmp_path)["ranks"][0]
    assert rank["state"]["rnn_state"].shape == (4, 32, 16)
    ended = rank["env"]["episode_steps"] == 0  # 9-step episodes, 9-step rollouts: every env just restarted
    assert ended.all() and (rank["state"]["rnn_state"] == 0).all()


def test_minibatches_split_envs(tmp_path):
    with pytest.raises(SystemExit, match=r"--num-envs 30 does not divide into --num-minibatches 4"):
        train(tmp_path, num_envs=30)
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------------------------
# acting and replay: the module's step as matmuls and pointwise ops, traced whole by torch.compile
# --------------------------------------------------------------------------------------------
def module_steps(rnn, x, state, starts):
    """What the nn.LSTM / nn.GRU module itself gives over x [T, B, D] from state [k * layers, B, H], called one
    step at a time with the state zeroed where starts [T, B] (the outputs [T, B, H], the last state)."""
    outputs = []
    for t in range(x.shape[0]):
        state = state * (~starts[t]).unsqueeze(-1)
        if isinstance(rnn, torch.nn.LSTM):
            out, (h, c) = rnn(x[t : t + 1], tuple(state.chunk(2)))
            state = torch.cat([h, c])
        else:
            out, state = rnn(x[t : t + 1], state)
        outputs.append(out[0])
    return torch.stack(outputs), state


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_acting_and_replay_are_the_modules_steps_to_float_rounding(cell):
    """Agent.memory (one acting step) and Agent.replay (a sequence, the state zeroed at episode starts) give
    what the nn.LSTM / nn.GRU module gives on its own weights (2 layers, random weights and states): the
    output and the next state of a step, and the outputs of every step of a replay, to float rounding. A gate
    in another order, or a GRU's reset gate applied before W_hn h, is off by far more."""
    args = ppo_lstm.Args(cell=cell, rnn_layers=2, rnn_hidden_size=16)
    agent = ppo_lstm.Agent(3, None, make_env("Pendulum-v1", 1).single_action_space, args)
    for (
        name,
        p,
    ) in agent.rnn.named_parameters():  # nonzero biases: the init zeroes them, which would hide a misplaced one
        torch.nn.init.normal_(p, std=0.5)
    g = torch.Generator().manual_seed(0)
    x, state = (
        torch.randn(12, 64, 3, generator=g),
        torch.randn(agent.state_shape[0], 64, agent.state_shape[1], generator=g),
    )
    starts = torch.rand(12, 64, generator=g) < 0.2
    with torch.no_grad():
        out, next_state = agent.memory(x[0], state)
        expected, expected_state = module_steps(agent.rnn, x[:1], state, torch.zeros_like(starts[:1]))
        assert torch.allclose(out, expected[0], rtol=1e-5, atol=1e-6), (out - expected[0]).abs().max()
        assert torch.allclose(next_state, expected_state, rtol=1e-5, atol=1e-6), (
            (next_state - expected_state).abs().max()
        )
        replayed = agent.replay(x, state, starts)
        expected, _ = module_steps(agent.rnn, x, state, starts)
        assert torch.allclose(replayed, expected, rtol=1e-5, atol=1e-6), (replayed - expected).abs().max()
        assert not torch.allclose(agent.replay(x, state, torch.zeros_like(starts)), expected, rtol=1e-3, atol=1e-3)


def called_name(fn) -> str:
    """A function's name; a lambda's (the scripts' wiring, `lambda obs: env_step(acting, end_step, obs)`) is the
    name of the function it calls."""
    import inspect

    name = getattr(fn, "__name__", getattr(getattr(fn, "func", None), "__name__", "?"))
    if name == "<lambda>":
        called = re.search(r"lambda[^:]*:\s*(\w+)\(", inspect.getsource(fn))
        name = called.group(1) if called else name
    return name


def test_compiled_acting_and_evaluation_have_no_graph_break(tmp_path, monkeypatch):
    """Under --compile, the env step (acting, a built-in env's step, the end of the step) and the evaluation
    step are traced whole: 0 dynamo graph breaks in them (an nn.LSTM / nn.GRU in a traced function breaks the
    graph at each use unless dynamo's allow_rnn is on: 16 breaks per run before), and none anywhere from
    the recurrent module. The breaks that remain are the update's and the targets', the same as ppo.py's
    (backward, the optimizer, the normalizers' updates kept out of compile): printed with the counts. The run is the
    contract's first layout of ppo_lstm as tests/test_scripts.py's compiled-vs-eager test runs it (inductor's settings
    as there): the same graphs, so that a worker that compiled one takes the other's from inductor's disk cache."""
    import collections

    import common.evaluation
    from tests.contract import CONTRACT
    from tests.lockstep import inductor_settings
    from tests.test_scripts import train as contract_run, units
    from torch._dynamo.utils import counters

    per_function = collections.Counter()

    def counting(compiled):
        def compiled_and_counted(run, fn):
            fn_compiled, name = compiled(run, fn), called_name(fn)

            def call(*args, **kwargs):
                before = counters["graph_break"].total()
                try:
                    return fn_compiled(*args, **kwargs)
                finally:
                    per_function[name] += counters["graph_break"].total() - before

            return call

        return compiled_and_counted

    monkeypatch.setattr(ppo_lstm, "compiled", counting(ppo_lstm.compiled))  # train's compile-and-capture block
    monkeypatch.setattr(common.evaluation, "compiled", counting(common.evaluation.compiled))
    before = collections.Counter(counters["graph_break"])
    with inductor_settings(kernels=False):  # the module is ppo_lstm above (load_script keeps one)
        contract_run(
            "ppo_lstm",
            tmp_path,
            compile=True,
            total_timesteps=units("ppo_lstm", 2),
            eval_interval=2 * CONTRACT["ppo_lstm"]["sync"],
            **CONTRACT["ppo_lstm"]["captures"][0],
        )
    breaks = collections.Counter(counters["graph_break"]) - before
    print("graph breaks by compiled function:", dict(per_function))
    print(
        "graph breaks by reason:",
        dict(sum((collections.Counter({r.splitlines()[0]: n}) for r, n in breaks.items()), collections.Counter())),
    )
    assert {"env_step", "_eval_step", "update_minibatch", "targets_fn"} <= per_function.keys(), per_function
    assert per_function["env_step"] == 0 and per_function["_eval_step"] == 0, per_function
    assert not [reason for reason in breaks if "RNN, GRU, or LSTM" in reason], breaks


# --------------------------------------------------------------------------------------------
# evaluation and the exported policy
# --------------------------------------------------------------------------------------------
def exported_episodes(step, env, seed: int, episodes: int, state_shape) -> tuple[list, np.ndarray]:
    """Run `step(obs, state) -> (action, next_state)` on `env` in a loop, resetting each env's state
    as policy.json says; returns the actions of every step and each env's first-episode return."""
    obs = env.reset(seed=seed)[0]["policy"]
    state = torch.zeros(state_shape[0], env.num_envs, state_shape[1])
    returns, running, done_count, actions = np.zeros(env.num_envs), np.zeros(env.num_envs), np.zeros(env.num_envs), []
    while (done_count < episodes).any():
        action, state = step(obs, state)
        actions.append(action)
        obs, reward, terminated, truncated, _ = env.step(action)
        obs = obs["policy"]
        done = (terminated | truncated).numpy()
        running += reward.numpy() * (done_count < episodes)
        returns += running * done * (done_count < episodes)
        done_count += done
        running *= ~done
        state = state * torch.as_tensor(~done)[:, None]  # the reset rule of policy.json
    return actions, returns / episodes


def test_exported_policy_runs_episodes_as_the_script_evaluates(tmp_path):
    """--export of a trained checkpoint: the torch.export program and ONNX, fed back their own next_state and
    reset as policy.json says, act through whole episodes as the script's deterministic policy, and
    reach the return the script's evaluation measures on the same episodes. The memory matters: the
    same policy with its state zeroed at every step acts otherwise."""
    onnxruntime = pytest.importorskip("onnxruntime")
    env_kwargs = '{"mask_velocity": true, "max_episode_steps": 60}'
    train(tmp_path, env_id="CartPole-v1", env_kwargs=env_kwargs, total_timesteps=32 * 16 * 6)
    out = tmp_path / "export"
    train(
        tmp_path,
        env_id="CartPole-v1",
        env_kwargs=env_kwargs,
        eval_only=True,
        export=str(out),
        resume=str(tmp_path / "run" / "checkpoints" / "last.pt"),
    )
    meta = json.loads((out / "policy.json").read_text())
    rows, _, hidden = meta["state"]["shape"]
    assert (
        meta["state"]["batch_dim"] == 1
        and meta["state"]["initial"] == "zeros"
        and "truncated" in meta["state"]["reset"]
    )
    assert (rows, hidden) == (2, 64) and meta["input"]["observation_space"]["shape"] == [2]

    env = make_env("CartPole-v1", 16, mask_velocity=True, max_episode_steps=60)
    agent = build_agent(checkpoint(tmp_path), env)
    assert agent.obs_rms.count > 0, "the run had observation normalization"
    with torch.no_grad():
        expected, script_returns = exported_episodes(agent.recurrent_step, env, 7, 2, (rows, hidden))
        program = load_exported_program(out / "policy.pt2")  # no deprecation notice
        # the weights keep their names (common.recurrent.EvalPolicy holds the agent as `agent`, as the script's did)
        assert "model.agent.rnn.weight_ih_l0" in program.state_dict()
        got_pt2, pt2_returns = exported_episodes(program, env, 7, 2, (rows, hidden))
    onnx = onnxruntime.InferenceSession(str(out / "policy.onnx"))

    def onnx_step(obs, state):
        action, next_state = onnx.run(None, {"obs": obs.numpy(), "state": state.numpy()})
        return torch.as_tensor(action), torch.as_tensor(next_state)

    got_onnx, onnx_returns = exported_episodes(onnx_step, env, 7, 2, (rows, hidden))
    assert len(expected) >= 60
    for a, b, c in zip(expected, got_pt2, got_onnx):
        assert torch.equal(a, b) and torch.equal(a, c)
    np.testing.assert_array_equal(pt2_returns, script_returns)
    np.testing.assert_array_equal(onnx_returns, script_returns)
    # the script's evaluation (one hidden state per eval env, reset at episode ends) on the same episodes
    evaluated = run_episodes(env, ppo_lstm.EvalPolicy(agent, env.num_envs), episodes=2, seed=7)
    assert evaluated["return"] == pytest.approx(script_returns.mean(), abs=1e-6)
    # memoryless: the state zeroed before every step
    with torch.no_grad():
        forgetful, _ = exported_episodes(
            lambda o, s: agent.recurrent_step(o, torch.zeros_like(s)), env, 7, 2, (rows, hidden)
        )
    assert any(not torch.equal(a, b) for a, b in zip(expected, forgetful))


def test_gru_and_stacked_layers_train_evaluate_and_export_the_best(tmp_path):
    """--cell gru --rnn-layers 2 (state rows: one per layer) with bf16 autocast; --export-best writes the
    recurrent policy with its state's shape when best.pt is written."""
    summary = train(
        tmp_path,
        env_id="Pendulum-v1",
        env_kwargs=MASKED,
        cell="gru",
        rnn_layers=2,
        rnn_hidden_size=16,
        eval_interval=3,
        bf16=True,
        export_best=True,
    )
    assert summary["global_step"] == 32 * 16 * 3 and summary["best_eval_return"] is not None
    assert checkpoint(tmp_path)["ranks"][0]["state"]["rnn_state"].shape == (2, 32, 16)
    meta = json.loads((tmp_path / "run" / "export" / "policy.json").read_text())
    assert meta["state"]["shape"] == [2, "batch", 16] and meta["global_step"] == 32 * 16 * 3
