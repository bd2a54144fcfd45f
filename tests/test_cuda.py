"""The captured path on a GPU: what only CUDA can check. Skipped without CUDA (CI runs on CPU).

On CPU, tests/test_scripts.py checks what capture needs (the same ops on the same live tensors in
every call after warm-up, no host sync per step); here the graphs themselves run.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import ROOT, load_script, run, torchrun_cmd

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def train(algo: str, out, **overrides) -> dict:
    module = load_script(algo)
    kwargs = dict(device="cuda", progress=False, run_name="run", output_dir=str(out), save_interval=10_000)
    return module.main(module.Args(**{**kwargs, **overrides}))


def model_of(summary: dict) -> dict:
    return torch.load(summary["checkpoints"]["last"], weights_only=True)["model"]


@pytest.mark.parametrize("algo", ["ppo", "pqn"])
def test_graph_replays_compute_what_eager_computes(algo, tmp_path):
    """Without torch.compile the captured graphs replay eager's own kernels, and the CUDA RNG hands a
    replay the offsets eager would use: a few iterations end with the same parameters."""
    settings = dict(
        env_id="Pendulum-v1" if algo == "ppo" else "CartPole-v1",
        num_envs=256,
        num_steps=16,
        total_timesteps=256 * 16 * 6,
        eval_interval=3,
        num_eval_envs=16,
        log_interval=2,
        compile=False,
        torch_deterministic=True,
    )  # off by default on CUDA: atomics would reorder the sums
    eager = train(algo, tmp_path / "eager", cudagraphs=False, **settings)
    graphs = train(algo, tmp_path / "graphs", cudagraphs=True, **settings)
    assert graphs["compile_seconds_by_function"].keys() >= {"rollout", "update", "evaluation"}
    a, b = model_of(eager), model_of(graphs)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)
    assert graphs["best_eval_return"] == pytest.approx(eager["best_eval_return"], rel=1e-4)
    assert graphs["rollout_seconds"] > 0 and graphs["update_seconds"] > 0  # the phases' CUDA events were read


@pytest.mark.parametrize(
    "env_id, target, steps", [("CartPole-v1", 475.0, 3_000_000), ("Pendulum-v1", -200.0, 8_000_000)]
)
def test_default_cuda_path_learns(env_id, target, steps, tmp_path):
    """The defaults on CUDA (compile and CUDA graphs on, 4096 envs) reach the targets eager reaches."""
    summary = train("ppo", tmp_path, env_id=env_id, total_timesteps=steps, target_return=target)
    assert summary["compile"] and summary["cudagraphs"]
    assert summary["best_eval_return"] >= target, summary


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (NCCL refuses two ranks on one)")
@pytest.mark.parametrize("algo", ["ppo", "pqn"])
def test_captured_path_under_torchrun_nccl_keeps_ranks_in_sync(algo, tmp_path):
    """torchrun, one process per GPU, NCCL, the CUDA defaults: the gradient all-reduces (and ppo's
    KL mean for the adaptive learning rate) run inside the replayed update graph; every rank ends
    with the same parameters, and the run exits (graphs released before the process group)."""
    env_id = "Pendulum-v1" if algo == "ppo" else "CartPole-v1"
    out = run(
        torchrun_cmd(
            2,
            [
                str(ROOT / "algos" / f"{algo}.py"),
                "--device",
                "cuda",
                "--env-id",
                env_id,
                "--num-envs",
                "1024",
                "--num-steps",
                "16",
                "--total-timesteps",
                str(1024 * 16 * 2 * 20),
                "--eval-interval",
                "10",
                "--output-dir",
                str(tmp_path),
                "--run-name",
                "run",
                "--no-progress",
            ],
        ),
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-4000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["compile"] and summary["cudagraphs"], summary
    assert summary["params_in_sync"] and summary["iteration"] == 20, summary


def test_gaussian_acting_step_captures_in_a_plain_cuda_graph():
    """The Gaussian policy's acting step (sample, log-prob, clip to the bounds) in a plain
    torch.cuda.graph: warmed up on a side stream first, as capture requires of every op that
    initialises state on first use (the CUDA generator among them)."""
    ppo = load_script("ppo")
    from common.envs import make_env
    from common.nets import sample

    envs = make_env("Pendulum-v1", 1024, device="cuda", seed=1)
    obs, _ = envs.reset()
    args = ppo.Args()
    agent = ppo.Agent(obs["policy"].shape[-1], None, envs.single_action_space, args).cuda()
    static_obs = obs["policy"].clone()

    def act():  # as the script draws (common.nets.sample: torch.normal's std check would read the host)
        with torch.no_grad():
            d = agent.distribution(agent.actor(agent.obs_rms(static_obs)).float())
            action = sample(d)
            return agent.to_env(action), d.log_prob(action).sum(-1)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            act()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        action, logprob = act()
    first = []
    for _ in range(2):
        graph.replay()
        first.append(action.clone())
    torch.cuda.synchronize()
    assert torch.isfinite(logprob).all() and (action.abs() <= 2.0).all()
    assert not torch.equal(first[0], first[1]), "each replay must draw new noise"


def test_env_metrics_inside_a_capture_are_refused():
    """An env that reports metrics cannot be stepped inside a graph (their sums are Python): refused."""
    from common.stats import record_env_log

    value = torch.ones((), device="cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="capturable = False"):
        with torch.cuda.graph(graph):
            record_env_log(None, {"log": {"reward_term": value}})


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_recurrent_step_compiles_on_cuda_to_the_modules_cudnn_step(cell):
    """common.nets.rnn_step compiled on CUDA (the recurrent scripts' acting and replay step, whose dynamo graphs
    tests/replay.py's device-kernel guard keeps free of fused RNN ops on the CPU) gives what the nn.LSTM / nn.GRU module
    gives through cuDNN on the same weights, 2 layers, to float rounding (TF32 off on both sides)."""
    from common.nets import rnn_step

    rnn = (torch.nn.LSTM if cell == "lstm" else torch.nn.GRU)(4, 64, num_layers=2).cuda()
    x = torch.randn(1024, 4, device="cuda")
    state = torch.randn((2 if cell == "lstm" else 1) * 2, 1024, 64, device="cuda")
    step = torch.compile(rnn_step)
    exact_cudnn = torch.backends.cudnn.flags(enabled=True, allow_tf32=False)
    with torch.no_grad(), exact_cudnn, torch._dynamo.config.patch(allow_rnn=True):  # allow_rnn: as the scripts run
        out, next_state = step(rnn, x, state)
        if cell == "lstm":
            expected, (h, c) = rnn(x[None], tuple(state.chunk(2)))
            expected_state = torch.cat([h, c])
        else:
            expected, expected_state = rnn(x[None], state)
    torch.testing.assert_close(out, expected[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(next_state, expected_state, rtol=1e-4, atol=1e-5)


def test_sample_draws_what_torch_samples_on_cuda_and_captures():
    """common.nets.sample on CUDA: torch's .sample() numbers from the same generator state (Normal: rsample's;
    Categorical: torch's own draw), and both draw inside a plain CUDA graph, new numbers at each replay (torch's
    Normal.sample() checks std >= 0 with a host read first, which a capture refuses)."""
    from common.nets import sample

    out = torch.randn(4096, 6, device="cuda")
    dists = {
        "categorical": lambda: torch.distributions.Categorical(logits=out * 3, validate_args=False),
        "normal": lambda: torch.distributions.Normal(out, out.abs() + 0.1, validate_args=False),
    }
    for kind, make in dists.items():
        torch.manual_seed(7)
        expected = make().sample()
        torch.manual_seed(7)
        assert torch.equal(sample(make()), expected), kind
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            sample(make())
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            drawn = sample(make())
        replays = []
        for _ in range(2):
            graph.replay()
            replays.append(drawn.clone())
        assert not torch.equal(*replays), kind
