"""algos/td3.py and algos/sac.py: learning, the pieces with closed-form references (SAC's squashed
log-prob, C51's projection), the replay buffer across resumes, bf16.

The run contract (resume, checkpoints, logging, NaN guard, torchrun, faults, errors) is tested
for every script in tests/test_scripts.py.
"""

import json
import math
import sys

import pytest
import torch

from tests.helpers import load_script, printed_summary, run, run_main
from tests.replay import assert_replays_alike, record_captured


def script(algo: str, tmp_path, *args: str, timeout: float = 240):
    cmd = [sys.executable, f"algos/{algo}.py", "--device", "cpu", "--output-dir", str(tmp_path), "--no-progress", *args]
    return run(cmd, timeout=timeout)


def summary_of(result) -> dict:
    """The summary line the main process prints last."""
    assert result.returncode == 0, result.stdout[-4000:]
    return printed_summary(result.stdout)


def train(algo: str, tmp_path, **overrides) -> dict:
    """Run algos/<algo>.py's main() in this process with tiny settings: 8 envs, a 30-slot ring per env that wraps."""
    module = load_script(algo)
    kwargs = dict(
        env_id="Pendulum-v1",
        device="cpu",
        output_dir=str(tmp_path),
        run_name="run",
        progress=False,
        num_envs=8,
        batch_size=64,
        hidden_sizes=(32, 32),
        learning_starts=64,
        num_eval_envs=4,
        buffer_size=240,
        n_step=2,
        log_interval=7,
        eval_interval=0,
        save_interval=10_000,
    )
    kwargs.update(overrides)
    return run_main(module, **kwargs)


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
    reference = (
        torch.distributions.TransformedDistribution(
            torch.distributions.Normal(mean, log_std.exp()), [torch.distributions.TanhTransform()]
        )
        .log_prob(torch.tanh(u))
        .sum(-1)
    )
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


def test_sacs_critic_layer_norm_is_each_critics_own_layer_norm():
    """--critic-layer-norm: each member of the ensemble critic computes what one nn.Linear -> nn.LayerNorm -> ReLU
    stack per critic computes, its own scale and shift trained apart; without it the critic has no norm at all."""
    from common.nets import EnsembleLayerNorm

    sac = load_script("sac")
    low, high = torch.tensor([-2.0]), torch.tensor([2.0])
    agent = sac.Agent(3, None, low, high, sac.Args(critic_layer_norm=True, hidden_sizes=(16, 8)))
    norms = [m for m in agent.critic if isinstance(m, EnsembleLayerNorm)]
    assert [n.weight.shape for n in norms] == [(2, 1, 16), (2, 1, 8)]
    plain = sac.Agent(3, None, low, high, sac.Args(hidden_sizes=(16, 8)))
    assert not any(isinstance(m, EnsembleLayerNorm) for m in plain.critic)
    g = torch.Generator().manual_seed(0)
    for n in norms:  # members apart: each its own scale and shift
        n.weight.data.uniform_(0.5, 1.5, generator=g)
        n.bias.data.normal_(generator=g)
    x = torch.randn(5, 4, generator=g)
    out = agent.critic(x)  # [E, B, 1]
    for k in range(2):
        h = x
        for m in agent.critic:
            if isinstance(m, EnsembleLayerNorm):
                ln = torch.nn.LayerNorm(m.weight.shape[-1])
                ln.weight.data, ln.bias.data = m.weight[k, 0], m.bias[k, 0]
                h = ln(h)
            elif hasattr(m, "weight"):  # EnsembleLinear: member k's weight [in, out] and bias
                h = h @ m.weight[k] + m.bias[k, 0]
            else:
                h = m(h)
        torch.testing.assert_close(out[k], h, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_sizes_left_unset_take_the_devices_defaults(algo, tmp_path):
    """--num-envs and --batch-size left at None resolve to the CPU sizes (32 envs, batch 512); the
    resolved values are what config.json and the checkpoint record, and a flag given wins."""
    module = load_script(algo)
    assert module.DEVICE_DEFAULTS == {"num_envs": (1024, 32), "batch_size": (32768, 512)}
    train(algo, tmp_path, num_envs=None, batch_size=None, total_timesteps=32 * 4, learning_starts=32 * 2)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config["num_envs"], config["batch_size"]) == (32, 512)
    assert last_checkpoint(tmp_path)["args"]["num_envs"] == 32 and last_checkpoint(tmp_path)["global_step"] == 128
    train(algo, tmp_path, run_name="given", num_envs=None, batch_size=64, total_timesteps=32)
    assert json.loads((tmp_path / "given" / "config.json").read_text())["batch_size"] == 64


# --------------------------------------------------------------------------------------------
# learning
# --------------------------------------------------------------------------------------------
# CPU settings that solve Pendulum-v1 (eval >= -200) in 200-325 iterations for seeds 1-3.
PENDULUM_FAST = [
    "--env-id",
    "Pendulum-v1",
    "--num-envs",
    "64",
    "--num-updates",
    "4",
    "--batch-size",
    "512",
    "--hidden-sizes",
    "64",
    "64",
    "--q-lr",
    "3e-3",
    "--policy-lr",
    "3e-3",
    "--tau",
    "0.05",
    "--learning-starts",
    "3200",
    "--eval-interval",
    "25",
    "--log-interval",
    "25",
]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_learns_pendulum(algo, tmp_path):
    summary = summary_of(
        script(
            algo,
            tmp_path,
            *PENDULUM_FAST,
            "--seed",
            "1",
            "--total-timesteps",
            "32000",
            "--target-return",
            "-200",
            "--run-name",
            "learn",
        )
    )
    assert summary["best_eval_return"] >= -200 and summary["stop_reason"] == "target_return", summary
    assert (tmp_path / "learn" / "checkpoints" / "best.pt").is_file()


# --------------------------------------------------------------------------------------------
# checkpoints, exact resume, logging
# --------------------------------------------------------------------------------------------
def test_resume_without_saved_buffer_refills_it_with_a_notice(tmp_path, capsys):
    train("td3", tmp_path, total_timesteps=8 * 20, max_wall_seconds=0.0)
    summary = train("td3", tmp_path, total_timesteps=8 * 20, resume="auto")
    out = capsys.readouterr().out
    assert "notice: the checkpoint holds no replay buffer" in out and summary["global_step"] == 160
    assert (
        last_checkpoint(tmp_path)["state"]["counters"]["update_count"] > 0
    )  # updates resumed once the buffer had refilled


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_resumed_buffer_of_an_env_without_snapshots_ends_its_episodes(algo, tmp_path):
    """gym: envs cannot be snapshotted: a resume starts fresh episodes. The restored buffer's last
    transition must end its episode there, or an n-step window would join two episodes."""
    common = dict(env_id="gym:Pendulum-v1", num_envs=4, total_timesteps=4 * 30, save_buffer=True, log_interval=10)
    train(algo, tmp_path, max_wall_seconds=0.0, **common)  # stops after iteration 10 with the buffer saved
    train(algo, tmp_path, resume="auto", **common)
    buffer = last_checkpoint(tmp_path)["ranks"][0]["buffer"]
    size = buffer["size"]
    assert size == 30 and buffer["ptr"] == 30  # slots 0..29 written, in chronological order (no wrap)
    data = {k: v[:, :size] for k, v in buffer["data"].items()}
    ended = data["terminated"] | data["truncated"]
    assert ended[:, 9].all(), "the transition before the resume does not end its episode"
    # everywhere else, a transition that does not end an episode continues into the next slot
    joined = torch.isclose(data["next_obs.policy"][:, :-1], data["obs.policy"][:, 1:]).all(-1)
    assert (joined | ended[:, :-1]).all()
    assert not joined[:, 9].any()  # and the join really is a jump: fresh episodes after the resume


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_bf16_autocast_runs_and_keeps_float32_storage(algo, tmp_path):
    extra = dict(distributional=True, v_min=-100.0, v_max=0.0) if algo == "td3" else {}
    train(algo, tmp_path, bf16=True, total_timesteps=8 * 12, learning_starts=8, **extra)
    state = last_checkpoint(tmp_path)
    assert state["state"]["counters"]["update_count"] > 0
    assert all(v.dtype in (torch.float32, torch.float64) for v in state["model"].values() if v.is_floating_point())
    assert all(torch.isfinite(v).all() for v in state["model"].values())


# --------------------------------------------------------------------------------------------
# the captured iteration: collect and update replay the same kernels on the same live tensors
# --------------------------------------------------------------------------------------------
def live_tensors(obj, path: str = "", depth: int = 0, seen: set | None = None) -> dict[str, int]:
    """{path: data_ptr} of every tensor a captured function reaches through its bound arguments: the
    env's state, the agent's parameters and buffers, the replay buffer's storage and pointers, the
    optimizers' state, the statistics. A graph replays on these addresses: none may be rebound."""
    import functools

    from tensordict import TensorDictBase

    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 8:
        return {}
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return {path: obj.untyped_storage().data_ptr()}
    if isinstance(obj, TensorDictBase):
        return {
            f"{path}/{k}": v.untyped_storage().data_ptr() for k, v in obj.items(include_nested=True, leaves_only=True)
        }
    if isinstance(obj, torch.nn.Module):
        return {f"{path}/{k}": v.untyped_storage().data_ptr() for k, v in obj.state_dict(keep_vars=True).items()}
    if isinstance(obj, torch.optim.Optimizer):
        return {
            f"{path}/{i}/{k}": v.untyped_storage().data_ptr()
            for i, state in enumerate(obj.state.values())
            for k, v in state.items()
            if isinstance(v, torch.Tensor)
        }
    children = {}
    if isinstance(obj, functools.partial):
        children = {"func": obj.func, **dict(enumerate(obj.args)), **obj.keywords}
    elif getattr(obj, "__closure__", None):  # a closure (the scripts' wiring): what it reads from its scope
        children = {name: cell.cell_contents for name, cell in zip(obj.__code__.co_freevars, obj.__closure__)}
    elif isinstance(obj, (list, tuple)):
        children = dict(enumerate(obj))
    elif isinstance(obj, dict):
        children = obj
    elif hasattr(obj, "__self__"):  # a bound method: its module
        children = {"self": obj.__self__}
    elif type(obj).__module__.startswith(("common.envs", "common.buffer", "td3", "sac")) and hasattr(obj, "__dict__"):
        children = vars(obj)
    out = {}
    for k, v in children.items():
        out.update(live_tensors(v, f"{path}/{k}", depth + 1, seen))
    return out


@pytest.mark.parametrize("algo,num_updates", [("td3", 2), ("sac", 2), ("td3", 1)])
def test_captured_functions_replay_the_same_kernels_on_the_same_tensors(algo, num_updates, tmp_path, monkeypatch):
    """Every function td3/sac capture in a CUDA graph (with --cudagraphs on CUDA) records, on CPU, the
    same ops on the same live tensors in two calls after its warm-up (tests/replay.py), and rebinds
    no tensor it reaches (env state, agent, replay buffer, optimizer state, statistics) from one
    call to the next. The buffer samples against its device fill level,
    as --cudagraphs makes it; num_updates=1 with policy_frequency=2 gives one update per phase."""
    import common.buffer

    module = load_script(algo)
    pointers = {}
    signatures = record_captured(
        monkeypatch, module, before_call=lambda name, fn: pointers.setdefault(name, []).append(live_tensors(fn))
    )
    monkeypatch.setattr(
        module, "ReplayBuffer", lambda *a, **k: common.buffer.ReplayBuffer(*a, **{**k, "capturable": True})
    )
    train(
        algo,
        tmp_path,
        total_timesteps=8 * 16,
        learning_starts=32,
        num_updates=num_updates,
        eval_interval=8,
        reward_norm=True,
        log_interval=4,
    )
    updates = {"update"} if num_updates == 2 else {"update, phase 0", "update, phase 1"}
    assert {"random step", "step", "evaluation"} | updates == set(signatures), signatures.keys()
    for name, calls in signatures.items():
        assert_replays_alike(name, calls)
        if name != "evaluation":
            seen = pointers[name]
            rebound = {k for p in seen[2:] for k in p.keys() | seen[1].keys() if p.get(k) != seen[1].get(k)}
            assert len(seen[1]) > 10 and not rebound, f"{name}: rebound between calls: {sorted(rebound)}"
    for name in ("step", *updates):  # the walk reaches the replay buffer's device pointer, and the critic's weights
        assert any(k.endswith("device_ptr") for k in pointers[name][1]), name
    assert any("critic_target" in k for k in pointers[next(iter(updates))][1])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_cudagraphs_fill_the_buffer_step_by_step_and_train(algo, tmp_path):
    """--cudagraphs on CUDA: the collect graph writes a new slot with the env's transition at every
    replay (the stored episodes chain obs -> next_obs across slots, through the wrap-around), the
    update graphs train to finite losses, and the returns are those of Pendulum."""
    n, iterations, capacity = 64, 300, 200
    summary = train(
        algo,
        tmp_path,
        device="cuda",
        cudagraphs=True,
        compile=False,
        num_envs=n,
        batch_size=256,
        buffer_size=n * capacity,
        total_timesteps=n * iterations,
        learning_starts=n * 10,
        save_buffer=True,
        env_kwargs='{"max_episode_steps": 50}',
        eval_interval=100,
        log_interval=20,
    )
    assert {"random step", "step", "update"} <= set(summary["compile_seconds_by_function"]), summary
    ckpt = last_checkpoint(tmp_path)
    buffer = ckpt["ranks"][0]["buffer"]
    assert (buffer["size"], buffer["ptr"]) == (capacity, iterations % capacity)
    order = [(buffer["ptr"] + t) % capacity for t in range(capacity)]  # oldest first
    data = {k: v[:, order] for k, v in buffer["data"].items()}
    ended = data["terminated"] | data["truncated"]
    joined = torch.isclose(data["next_obs.policy"][:, :-1], data["obs.policy"][:, 1:]).all(-1)
    assert (joined | ended[:, :-1]).all() and joined.float().mean() > 0.9  # one transition per slot, in order
    assert ended.float().mean() == pytest.approx(1 / 50, abs=1e-3)  # every 50th step ends its episode
    assert (data["actions"].abs() <= 1).all() and data["actions"].std() > 0.1
    assert torch.isfinite(data["rewards"]).all() and (data["rewards"] <= 0).all() and (data["rewards"] >= -16.3).all()
    assert ckpt["state"]["counters"]["update_count"] == 2 * (iterations - 9)
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())
    for ret in (summary["last_train_return"], summary["best_eval_return"]):
        assert -16.3 * 50 <= ret <= 0, summary


# A copy of td3.py with CleanRL SAC's actor schedule (the delay made up at once: policy_frequency actor steps after
# every policy_frequency-th critic step) and a statistic of its actor steps that is 1 at every step
EVERY_DELAY_AT_ONCE = [
    (
        '                add_step(stats["actor"], actor_step(batch))\n',
        "                for _ in range(args.policy_frequency):  # CleanRL SAC's schedule: the delay made up at once\n"
        '                    add_step(stats["actor"], {**actor_step(batch), "one": torch.ones((), device=device)})\n',
    ),
]


def test_the_logged_actor_means_divide_by_the_actor_steps_counted_where_they_happen(tmp_path):
    """The actor's logged means are over the actor steps the update made, counted in the update (add_step), not
    derived from a schedule: a copy that steps its actor twice at every second critic step logs a statistic that is
    1 at every actor step as 1, at the logs whose interval held actor steps and at no other."""
    from tests.test_copies import copy_text
    from tests.test_scripts import scalars

    path = tmp_path / "td3_at_once.py"
    path.write_text(copy_text("td3", EVERY_DELAY_AT_ONCE, least=2))
    try:
        module = load_script(path.stem, path)
        run_main(
            module,
            device="cpu",
            progress=False,
            run_name="run",
            output_dir=str(tmp_path / "out"),
            env_id="Pendulum-v1",
            num_envs=8,
            batch_size=32,
            buffer_size=240,
            learning_starts=0,
            n_step=1,
            hidden_sizes=(32, 32),
            num_eval_envs=4,
            eval_interval=0,
            save_interval=10_000,
            num_updates=1,  # the actor steps at every second iteration
            policy_frequency=2,
            log_interval=1,
            total_timesteps=8 * 8,
        )
    finally:
        sys.modules.pop(path.stem, None)
    logged = scalars(tmp_path / "out" / "run")
    critic_steps = [step for step, _ in logged["losses/q_loss"]]
    assert critic_steps == list(range(8, 8 * 8 + 1, 8))  # every iteration: one critic step
    assert [step for step, _ in logged["losses/one"]] == critic_steps[1::2]  # the actor's: every second one
    assert [value for _, value in logged["losses/one"]] == [1.0] * 4
