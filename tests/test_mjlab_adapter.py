"""The `mjlab:` adapter: true final observations, no host sync of its own, the contract.

Two halves:
- with `tests/fake_mjlab.py`, a CPU stand-in for mjlab 1.6's env with the same step and reset
  structure (always run): the terminal mode against mjlab's explicit reset flow (auto_reset off,
  then reset(env_ids)) bit for bit, the final observation against an env whose episode never
  ends, the other envs untouched, no host read of the adapter per step, returned tensors never
  rewritten, episode statistics, and the refusals; the task's mirror (data_augmentation), from its
  registered rsl_rl config through the stand-in's task registry, and ppo.py's --symmetry on it;
- with real mjlab (skipped when it is not installed): the same equalities on
  Mjlab-Cartpole-Balance (5-dim actor and critic observations, 1 action), the contract, and PPO
  end to end; on the G1 velocity task, the adapter against mjlab's own rsl_rl wrapper (RslRlVecEnvWrapper,
  what mjlab's train.py trains on) for the same actions. On CPU, MuJoCo Warp compiles its kernels on
  first use (about a minute, cached on disk afterwards), then a step of a few envs takes milliseconds.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from common.envs import mjlab_adapter
from common.envs.mjlab_adapter import ManagerBasedEnvAdapter
from common.run import Run
from common.stats import record_env_log, reduce_iteration
from common.symmetry import env_mirror, mirror_images
from tests import fake_mjlab
from tests.fake_mjlab import FakeEnvCfg, FakeManagerBasedRlEnv
from tests.helpers import printed_summary
from tests.host_sync import RecordHostSyncsByOwner

ROOT = Path(__file__).resolve().parents[1]
_skip_without_mjlab = pytest.mark.skipif(importlib.util.find_spec("mjlab") is None, reason="needs mjlab")


def requires_mjlab(test):
    """Skipped without mjlab; marked `sims`, so .ci/run's sims lane runs it and fails if it skips."""
    return pytest.mark.sims(_skip_without_mjlab(test))


# --------------------------------------------------------------------------------------------
# shared helpers
# --------------------------------------------------------------------------------------------
def flat_groups(obs: dict, groups: dict[str, str], n: int) -> dict[str, torch.Tensor]:
    """The contract's view of a raw observation dict, computed here independently of the adapter."""
    out = {}
    for key, group in groups.items():
        value = obs[group]
        if isinstance(value, dict):
            value = torch.cat([v.reshape(n, -1) for v in value.values()], dim=-1)
        out[key] = value.reshape(n, -1).float().clone()
    return out


def explicit_reset_flow(env, actions: torch.Tensor, groups: dict[str, str]) -> list[dict]:
    """mjlab's documented way to the true final observations: an env with auto_reset off returns the
    terminal observations from step, and the caller resets the finished envs with reset(env_ids)."""
    n, out = env.num_envs, []
    for action in actions:
        obs, reward, terminated, truncated, extras = env.step(action)
        log = dict(extras["log"])
        final = flat_groups(obs, groups, n)
        done = terminated | truncated
        ids = done.nonzero().squeeze(-1)
        nxt = dict(final)
        if len(ids) > 0:
            reset_obs, reset_extras = env.reset(env_ids=ids)
            log.update(reset_extras["log"])
            fresh = flat_groups(reset_obs, groups, n)
            nxt = {k: torch.where(done[:, None], fresh[k], final[k]) for k in final}
        out.append(
            {
                "obs": nxt,
                "final_obs": final,
                "reward": reward.clone(),
                "terminated": terminated.clone(),
                "truncated": truncated.clone(),
                "log": log,
            }
        )
    return out


def adapter_flow(envs: ManagerBasedEnvAdapter, actions: torch.Tensor) -> list[dict]:
    out = []
    for action in actions:
        obs, reward, terminated, truncated, info = envs.step(action)
        out.append(
            {
                "obs": {k: obs[k].clone() for k in obs.keys()},
                "final_obs": {k: info["final_obs"][k].clone() for k in obs.keys()},
                "reward": reward.clone(),
                "terminated": terminated.clone(),
                "truncated": truncated.clone(),
                "log": dict(info["log"]),
            }
        )
    return out


def assert_same_steps(ours: list[dict], reference: list[dict]) -> None:
    for t, (a, b) in enumerate(zip(ours, reference, strict=True)):
        for field in ("obs", "final_obs"):
            for key in b[field]:
                assert torch.equal(a[field][key], b[field][key]), f"step {t}: {field}[{key!r}] differs"
        for field in ("reward", "terminated", "truncated"):
            assert torch.equal(a[field], b[field]), f"step {t}: {field} differs"
        assert set(a["log"]) == set(b["log"]), f"step {t}: log keys differ"
        for key, value in b["log"].items():
            assert float(a["log"][key]) == pytest.approx(float(value), rel=1e-6, abs=1e-7), f"step {t}: log {key}"


def reset_pattern(steps: list[dict]) -> tuple[int, int, int]:
    """(steps without a finished episode, steps where some but not all envs finished, steps where all did)."""
    counts = [0, 0, 0]
    for s in steps:
        done = s["terminated"] | s["truncated"]
        counts[0 if not done.any() else 2 if done.all() else 1] += 1
    return tuple(counts)


def owners(simulator_files) -> dict:
    adapter_file = mjlab_adapter.__file__
    return {
        "adapter": lambda f: f == adapter_file,
        "simulator": lambda f: any(f.startswith(p) for p in simulator_files),
    }


def keep_and_check(envs, actions: torch.Tensor) -> None:
    """Every tensor a step returns keeps its values through all later steps (the caller owns it)."""
    kept = []
    for action in actions:
        obs, reward, terminated, truncated, info = envs.step(action)
        tensors = (
            [obs[k] for k in obs.keys()] + [info["final_obs"][k] for k in obs.keys()] + [reward, terminated, truncated]
        )
        kept.append([(x, x.clone()) for x in tensors])
    for t, pairs in enumerate(kept):
        for x, copy in pairs:
            assert torch.equal(x, copy), f"a tensor returned at step {t} was rewritten by a later step"


# --------------------------------------------------------------------------------------------
# with the CPU stand-in
# --------------------------------------------------------------------------------------------
GROUPS = {"policy": "actor", "critic": "critic"}
STEPS_COLUMN = 2  # the actor group's episode step counter


def fake_env(**cfg) -> FakeManagerBasedRlEnv:
    return FakeManagerBasedRlEnv(FakeEnvCfg(**cfg))


def fake_adapter(final_obs: str = "terminal", copy_obs: bool = False, **cfg) -> ManagerBasedEnvAdapter:
    return ManagerBasedEnvAdapter(fake_env(**cfg), "fake", final_obs=final_obs, copy_obs=copy_obs)


def fake_actions(n: int, steps: int, seed: int = 0) -> torch.Tensor:
    """A push of its own per env (so that envs fall at different steps) plus noise."""
    gen = torch.Generator().manual_seed(seed)
    return torch.linspace(-3.0, 3.0, n)[None, :, None] + torch.rand(steps, n, 1, generator=gen) - 0.5


def test_terminal_is_the_explicit_reset_flow_bit_for_bit():
    """Same seed, same actions: the hook inside the env's step gives what an env with auto_reset off
    and reset(env_ids) after the step gives (observations and their noise, history, commands,
    rewards, flags, episode statistics), on steps with no, some and all episodes ending."""
    n, steps = 6, 40
    actions = fake_actions(n, steps)
    envs = fake_adapter()
    envs.reset(seed=3)
    ours = adapter_flow(envs, actions)
    reference_env = fake_env(auto_reset=False)
    reference_env.reset(seed=3)
    reference = explicit_reset_flow(reference_env, actions, GROUPS)
    assert_same_steps(ours, reference)
    none, some, all_ = reset_pattern(reference)
    assert none > 0 and some > 0, (none, some, all_)
    assert any(s["log"] for s in ours)


def test_terminal_final_obs_is_the_last_observation_and_the_other_envs_are_untouched():
    """Against an env whose episodes never end (no noise; commands do not depend on draws): up to
    the end of its first episode every env sees the same observations in both; at that step the
    final observation is the one the never-ending env sees (its step counter, its command, its
    whole history) and the returned one is a new episode's first. Envs that go on meanwhile keep
    matching the never-ending env, while others are reset beside them."""
    n, steps = 6, 12
    actions = fake_actions(n, steps)
    short = fake_adapter(noise=0.0, episode_steps=8)
    endless = fake_adapter(noise=0.0, episode_steps=10**6, fall_at=float("inf"))
    short.reset(seed=5)
    endless.reset(seed=5)
    first_end = torch.full((n,), -1)
    continued_beside_a_reset = 0
    for t, action in enumerate(actions):
        obs, _, terminated, truncated, info = short.step(action)
        ref, *_ = endless.step(action)
        done = terminated | truncated
        for i in range(n):
            if first_end[i] >= 0:
                continue  # past its first episode: the two envs' states differ from here on
            for key in ("policy", "critic"):
                assert torch.equal(info["final_obs"][key][i], ref[key][i]), (t, i, key)
            if done[i]:
                first_end[i] = t
                policy = obs["policy"][i]
                assert policy[STEPS_COLUMN] == 0 and info["final_obs"]["policy"][i, STEPS_COLUMN] == t + 1
                assert torch.all(policy[-3:] == policy[-1])  # history backfilled with the first frame
                assert not torch.equal(info["final_obs"]["policy"][i, -3:], policy[-3:])
            else:
                for key in ("policy", "critic"):
                    assert torch.equal(obs[key][i], ref[key][i]), (t, i, key)
                continued_beside_a_reset += int(done.any())
    assert (first_end >= 0).all() and len(set(first_end.tolist())) > 1, first_end
    assert continued_beside_a_reset > 0


def test_pre_step_final_obs_is_the_previous_observation():
    n = 6
    envs = fake_adapter(final_obs="pre_step")
    prev, _ = envs.reset(seed=1)
    seen_done = 0
    for action in fake_actions(n, 20):
        obs, _, terminated, truncated, info = envs.step(action)
        done = terminated | truncated
        for key in ("policy", "critic"):
            expected = torch.where(done[:, None], prev[key], obs[key])
            assert torch.equal(info["final_obs"][key], expected)
        assert (obs["policy"][done, STEPS_COLUMN] == 0).all()  # mjlab reset them: a new episode's first
        seen_done += int(done.sum())
        prev = obs
    assert seen_done > 0


def test_finite_horizon_time_limit_is_terminal():
    envs = fake_adapter(fall_at=float("inf"), episode_steps=3, is_finite_horizon=True)
    envs.reset()
    for action in fake_actions(6, 3):
        _, _, terminated, truncated, info = envs.step(action)
    assert terminated.all() and truncated.all()
    assert (info["final_obs"]["policy"][:, STEPS_COLUMN] == 3).all()


@pytest.mark.parametrize("final_obs", ["terminal", "pre_step"])
def test_no_host_sync_of_the_adapter_per_step(final_obs, monkeypatch):
    """The adapter reads nothing back: every host sync during its steps is the simulator's own (its
    nonzero of finished envs, its .item() statistics), including those in the passes the terminal
    hook runs through the simulator's managers. The recorder does catch a sync in the adapter."""
    envs = fake_adapter(final_obs)
    envs.reset(seed=2)
    actions = fake_actions(6, 30)
    recorder = RecordHostSyncsByOwner(owners([fake_mjlab.__file__]))
    with recorder:
        for action in actions:
            envs.step(action)
    assert recorder.of("adapter") == [] and recorder.of("other") == [], recorder.charged
    assert len(recorder.of("simulator")) >= len(actions)  # at least the env's own nonzero per step

    def log_with_a_read(self, extras):  # a host read per step, the kind of thing the rule forbids
        torch.ones(1).sum().item()
        return {}

    monkeypatch.setattr(ManagerBasedEnvAdapter, "_log", log_with_a_read)
    recorder = RecordHostSyncsByOwner(owners([fake_mjlab.__file__]))
    with recorder:
        for action in actions[:3]:
            envs.step(action)
    assert len(recorder.of("adapter")) + len(recorder.of("other")) == 3


@pytest.mark.parametrize("final_obs", ["terminal", "pre_step"])
def test_returned_tensors_are_never_rewritten(final_obs):
    """Observations pass through without copies (the simulator builds new ones at every compute);
    rewards and flags, which it rewrites in place, are copied."""
    envs = fake_adapter(final_obs)
    envs.reset(seed=4)
    keep_and_check(envs, fake_actions(6, 15))


def test_observations_of_a_simulator_that_rewrites_them_are_copied():
    """copy_obs (the default for an env other than mjlab's) protects the caller from a simulator
    that writes its observations into the same tensor at every step; without it they change."""
    envs = ManagerBasedEnvAdapter(fake_env(reuse_obs_buffers=True), "fake")  # copy_obs=True
    envs.reset(seed=4)
    keep_and_check(envs, fake_actions(6, 10))
    unsafe = fake_adapter(reuse_obs_buffers=True, copy_obs=False)
    unsafe.reset(seed=4)
    with pytest.raises(AssertionError, match="rewritten"):
        keep_and_check(unsafe, fake_actions(6, 10))


def test_episode_statistics_stay_where_they_are_and_average_as_before():
    """Tensors stay 0-d float32 on the device, numbers stay Python floats (no host-to-device copy);
    env/<name> is the mean over the steps that reported <name>, as before."""
    envs = fake_adapter()
    envs.reset(seed=6)
    logs = []
    for action in fake_actions(6, 30):
        logs.append(envs.step(action)[4]["log"])
    reported = [log for log in logs if log]
    assert 1 < len(reported) < len(logs)
    for log in reported:
        assert isinstance(log["Metrics/command/error"], float) and isinstance(
            log["Episode_Termination/time_out"], float
        )
        assert log["Episode_Reward/alive"].dtype == torch.float32 and log["Episode_Reward/alive"].shape == ()

    run = Run(
        args=SimpleNamespace(max_wall_seconds=None, save_interval_seconds=None),
        algo="test",
        rank=0,
        world_size=1,
        device=torch.device("cpu"),
        is_main=True,
    )
    extra = [{"log": {"only_once": torch.tensor(3.0), "mixed": 1.0}}, {"log": {"mixed": torch.tensor(2.0)}}]
    kept = {k: v.clone() for k, v in reported[0].items() if isinstance(v, torch.Tensor)}
    for log in logs:
        record_env_log(run, {"log": log})
    for info in extra:
        record_env_log(run, info)
    for key, value in kept.items():
        assert torch.equal(reported[0][key], value)  # the sums are ours: the env's tensors are not added into
    stats = reduce_iteration(run)
    names = {k for log in reported for k in log}
    for name in names:
        values = [float(log[name]) for log in reported if name in log]
        assert stats[f"env/{name}"] == pytest.approx(np.mean(values), rel=1e-6)
    assert stats["env/only_once"] == 3.0 and stats["env/mixed"] == 1.5
    assert run.env_log == {}  # the next interval starts afresh


def test_terminal_refuses_an_env_without_what_it_relies_on():
    """One line each: the cause, then the ways out (mjlab 1.6.x or pre_step); pre_step accepts them."""

    class StepWithoutResetIdx(FakeManagerBasedRlEnv):
        def step(self, action):
            return FakeManagerBasedRlEnv.step(self, action)

    no_env_ids = fake_env()
    no_env_ids.observation_manager.compute = lambda update_history=False: {}
    cases = {
        "observation_manager.compute takes no env_ids argument": no_env_ids,
        "step never calls self._reset_idx(...)": StepWithoutResetIdx(FakeEnvCfg()),
        "built with cfg.auto_reset=False": fake_env(auto_reset=False),
    }
    for cause, env in cases.items():
        with pytest.raises(ValueError) as err:
            ManagerBasedEnvAdapter(env, "mjlab:Task", final_obs="terminal")
        message = str(err.value)
        assert "\n" not in message and message.startswith("mjlab:Task: final_obs='terminal'")
        assert cause in message, message
        assert "pip install 'mjlab==1.6.*'" in message and '"final_obs": "pre_step"' in message
        ManagerBasedEnvAdapter(env, "mjlab:Task", final_obs="pre_step")


def test_a_step_that_no_longer_computes_after_the_reset_is_caught():
    envs = fake_adapter(skip_post_reset_observations=True)
    envs.reset(seed=1)
    with pytest.raises(RuntimeError, match=r"did not call observation_manager.compute.*pre_step"):
        for action in fake_actions(6, 20):
            envs.step(action)
    # the redirect did not linger: the manager's own compute again
    assert "compute" not in vars(envs.env.observation_manager) and "compute" not in vars(envs.env.command_manager)


def test_hook_lives_on_the_instance_and_leaves_with_close():
    envs = fake_adapter()
    env = envs.env
    assert "_reset_idx" in vars(env)
    obs, _ = envs.reset(seed=0)  # env.reset() runs _reset_idx through the hook: nothing captured there
    assert envs._terminal_obs is None and (obs["policy"][:, STEPS_COLUMN] == 0).all()
    envs.close()
    assert "_reset_idx" not in vars(env) and env.closed
    assert "_reset_idx" not in vars(fake_adapter(final_obs="pre_step").env)


def test_seeds_are_folded_into_the_simulators_range():
    """The scripts derive 62-bit seeds; mjlab seeds numpy (32-bit) and warp (int32) with them."""
    envs = fake_adapter()
    envs.reset(seed=2**61 + 5)
    assert envs.env.last_seed == (2**61 + 5) % 2**31


# --------------------------------------------------------------------------------------------
# the task's mirror (data_augmentation), with the stand-in's task registry
# --------------------------------------------------------------------------------------------
MIRRORED_TASKS = ["Fake-Point-Symmetric", "Fake-Point-Symmetric-By-Group"]  # rsl_rl >= 3's form, rsl_rl 2's
# The point's mirror x -> -x in the adapter's columns. "policy": kinematics, command, step counter (kept),
# last action, 3 history frames; "critic" (terms not concatenated, flattened in the order the task gives them,
# which is not its space's sorted order): kinematics, |kinematics| (kept), command, 3 history frames.
POLICY_MIRROR = torch.tensor([-1.0, -1.0, 1.0, -1.0, -1.0, -1.0, -1.0])
CRITIC_MIRROR = torch.tensor([-1.0, 1.0, -1.0, -1.0, -1.0, -1.0])


@pytest.fixture
def fake_tasks(monkeypatch):
    """make_env("mjlab:<task>") builds the stand-in's registered tasks."""
    fake_mjlab.install(monkeypatch)
    fake_mjlab.mirror_point.last_env = None


def fake_task(task: str, n: int = 5, **kwargs) -> ManagerBasedEnvAdapter:
    from common.envs import make_env

    return make_env(f"mjlab:{task}", n, seed=1, **kwargs)


def test_the_mirror_is_the_tasks_rl_config_symmetry_function(fake_tasks):
    """data_augmentation where the task's rsl_rl config declares a mirror (algorithm.symmetry_cfg's
    data_augmentation_func), called with the env the adapter wraps; none where it does not."""
    assert getattr(fake_task("Fake-Point"), "data_augmentation", None) is None
    envs = fake_task("Fake-Point-Symmetric")
    obs, _ = envs.reset(seed=0)
    envs.data_augmentation(obs=obs)
    assert fake_mjlab.mirror_point.last_env is envs.env
    by_group = fake_task("Fake-Point-Symmetric-By-Group")  # a "module:name" string, as Isaac Lab's dicts have it
    assert by_group._task_mirror is fake_mjlab.mirror_point_by_group


@pytest.mark.parametrize("task", MIRRORED_TASKS)
def test_the_tasks_mirror_keeps_rsl_rls_contract(task, fake_tasks):
    """Originals unchanged first, then their mirror images, for flat rows (and a [T, N] batch through
    common.symmetry, which flattens it); mirroring the mirror images gives the originals back; None stays None; one
    group alone is mirrored alone."""
    n = 5
    envs = fake_task(task, n)
    envs.reset(seed=2)
    for action in fake_actions(n, 4):  # nonzero history, commands, last actions
        obs = envs.step(action)[0]
    actions = fake_actions(n, 1, seed=3)[0]
    aug_obs, aug_actions = envs.data_augmentation(obs=obs, actions=actions)
    assert aug_obs.batch_size == (2 * n,) and set(aug_obs.keys()) == {"policy", "critic"}
    for key, signs in (("policy", POLICY_MIRROR), ("critic", CRITIC_MIRROR)):
        assert torch.equal(aug_obs[key][:n], obs[key])
        assert torch.equal(aug_obs[key][n:], obs[key] * signs)
    assert torch.equal(aug_actions[:n], actions) and torch.equal(aug_actions[n:], -actions)
    twice, twice_actions = envs.data_augmentation(obs=aug_obs[n:], actions=aug_actions[n:])
    for key in ("policy", "critic"):
        assert torch.equal(twice[key][n:], obs[key])
    assert torch.equal(twice_actions[n:], actions)
    assert envs.data_augmentation(obs=obs)[1] is None and envs.data_augmentation(actions=actions)[0] is None
    assert torch.equal(envs.data_augmentation(actions=actions)[1], aug_actions)
    alone = envs.data_augmentation(obs=obs.select("policy"))[0]
    assert set(alone.keys()) == {"policy"} and torch.equal(alone["policy"], aug_obs["policy"])

    rollout, rollout_actions = torch.stack([obs, aug_obs[n:]]), torch.stack([actions, -actions])  # [T, N]
    images = mirror_images(envs.data_augmentation, rollout, rollout_actions)
    assert images.batch_size == (2, n, 1)
    for key, signs in (("policy", POLICY_MIRROR), ("critic", CRITIC_MIRROR)):
        assert torch.equal(images["obs", key][:, :, 0], rollout[key] * signs)
    assert torch.equal(images["actions"][:, :, 0], -rollout_actions)


def test_a_mirror_the_env_or_its_config_carries_is_taken_as_is(fake_tasks):
    """A data_augmentation on the unwrapped env, or on its config (a task without an rsl_rl mirror, configured
    with one), is the adapter's, unchanged, and comes before a task function; without any, none."""

    def mirror(obs=None, actions=None):
        return obs, actions

    env = fake_env()
    env.data_augmentation = mirror
    envs = ManagerBasedEnvAdapter(env, "fake", data_augmentation_func=fake_mjlab.mirror_point)
    assert envs.data_augmentation is mirror
    configured = fake_task("Fake-Point", configure=lambda cfg: setattr(cfg, "data_augmentation", mirror))
    assert configured.data_augmentation is mirror
    assert not hasattr(ManagerBasedEnvAdapter(fake_env(), "fake"), "data_augmentation")


def test_a_task_mirror_that_leaves_out_the_originals_is_refused():
    """common.symmetry's check, before training, of a task's function that returns its mirror images alone."""
    envs = ManagerBasedEnvAdapter(
        fake_env(), "mjlab:Task", data_augmentation_func=lambda env, obs=None, actions=None: (obs, -actions)
    )
    obs, _ = envs.reset(seed=0)
    args = SimpleNamespace(symmetry="augmentation", env_id="mjlab:Task")
    refused = r"^error: --symmetry augmentation: mjlab:Task: its mirror \(data_augmentation\) returned observations"
    with pytest.raises(SystemExit, match=refused):
        env_mirror(envs, obs, args)


def test_ppo_symmetry_augmentation_runs_on_a_task_with_a_mirror(fake_tasks, tmp_path):
    """ppo.py --symmetry augmentation trains on the task's mirror (logged: the mirror loss each iteration); on a
    task without one it stops with the one-line error."""
    from tests.helpers import load_script, run_main
    from tests.test_scripts import scalars

    ppo = load_script("ppo")
    flags = dict(
        symmetry="augmentation",
        num_envs=4,
        num_steps=8,
        num_minibatches=2,
        total_timesteps=96,
        num_eval_envs=2,
        eval_interval=0,
        hidden_sizes=(16,),
        device="cpu",
        progress=False,
        output_dir=str(tmp_path),
    )
    summary = run_main(ppo, env_id="mjlab:Fake-Point-Symmetric", run_name="mirrored", **flags)
    assert summary["global_step"] == 96 and fake_mjlab.mirror_point.last_env is not None
    assert len(scalars(tmp_path / "mirrored")["losses/mirror_loss"]) == summary["iteration"] == 3
    with pytest.raises(SystemExit, match=r"^error: --symmetry augmentation: mjlab:Fake-Point has no mirror"):
        run_main(ppo, env_id="mjlab:Fake-Point", run_name="plain", **flags)


# --------------------------------------------------------------------------------------------
# with real mjlab
# --------------------------------------------------------------------------------------------
TASK = "Mjlab-Cartpole-Balance"
STEP_DT = 0.05  # the task's control period (timestep 0.01 s, decimation 5)


def episode_steps(steps: int, finite_horizon: bool = False):
    """A `configure` hook giving episodes of `steps` control steps."""

    def configure(cfg):
        cfg.episode_length_s = (steps - 0.5) * STEP_DT  # mjlab rounds the length in steps up
        cfg.is_finite_horizon = finite_horizon

    return configure


def with_history_delay_and_term_groups(steps: int):
    """Episodes of `steps` steps, an actor term with a 3-frame history and one with a 1-2 step delay,
    and a critic group whose terms are not concatenated: what a second observation pass would disturb."""

    def configure(cfg):
        episode_steps(steps)(cfg)
        terms = cfg.observations["actor"].terms
        names = list(terms)
        terms[names[0]].history_length = 3
        terms[names[1]].delay_min_lag, terms[names[1]].delay_max_lag = 1, 2
        cfg.observations["critic"].concatenate_terms = False

    return configure


def mjlab_actions(num_envs: int, steps: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.rand(steps, num_envs, 1, generator=gen) * 2 - 1


def raw_mjlab_env(num_envs: int, seed: int, configure, auto_reset: bool, task: str = TASK):
    import mjlab.tasks  # noqa: F401
    from mjlab.envs import ManagerBasedRlEnv
    from mjlab.tasks.registry import load_env_cfg

    cfg = load_env_cfg(task)
    configure(cfg)
    cfg.scene.num_envs, cfg.seed, cfg.auto_reset = num_envs, seed, auto_reset
    return ManagerBasedRlEnv(cfg, device="cpu")


def stagger(env, num_envs: int, length: int) -> None:
    """Start the envs at different points of their episodes, so that they end at different steps."""
    env.episode_length_buf[:] = torch.arange(num_envs) % length


def mjlab_files() -> list[str]:
    files = []
    for name in ("mjlab", "mujoco_warp", "warp"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            files += [str(Path(p)) + os.sep for p in spec.submodule_search_locations]
    return files


@requires_mjlab
def test_mjlab_contract_shapes_and_dtypes():
    from common.envs import make_env

    n = 3
    envs = make_env(f"mjlab:{TASK}", n, seed=1, configure=episode_steps(4))
    try:
        assert isinstance(envs, ManagerBasedEnvAdapter)
        assert envs.num_envs == n and envs.device == torch.device("cpu") and envs.max_episode_steps == 4
        assert envs.single_observation_space.shape == (5,) and envs.single_observation_space.dtype == np.float32
        assert envs.single_critic_observation_space.shape == (5,)
        assert envs.single_action_space.shape == (1,)
        obs, info = envs.reset(seed=1)
        assert set(obs.keys()) == {"policy", "critic"} and obs.batch_size == torch.Size([n])
        assert obs["policy"].dtype == torch.float32 and obs["policy"].shape == (n, 5) and obs["critic"].shape == (n, 5)
        seen_log = {}
        for t in range(4):
            obs, reward, terminated, truncated, info = envs.step(torch.zeros(n))  # [N] accepted for one action
            assert reward.dtype == torch.float32 and reward.shape == (n,)
            assert terminated.dtype == torch.bool and truncated.dtype == torch.bool and truncated.shape == (n,)
            assert set(info) == {"final_obs", "log"}
            assert set(info["final_obs"].keys()) == {"policy", "critic"} and info["final_obs"]["critic"].shape == (n, 5)
            for key, value in info["log"].items():
                assert isinstance(value, float) or (value.shape == () and value.dtype == torch.float32), key
            seen_log.update(info["log"])
        assert truncated.all() and not terminated.any()  # the time limit of 4 steps, bootstrapped
        assert "Episode_Reward/smooth_reward" in seen_log  # episode statistics forwarded at the reset
        assert envs.state_dict() == {}
        envs.load_state_dict({})
        with pytest.raises(ValueError, match="shape"):
            envs.step(torch.zeros(n, 2))
    finally:
        envs.close()


def mjlab_rollout(envs, acts: torch.Tensor):
    envs.reset(seed=7)  # re-seeds the generators mjlab draws from: both runs see the same draws
    out = []
    for a in acts:
        obs, reward, terminated, truncated, info = envs.step(a)
        out.append((obs.clone(), info["final_obs"].clone(), truncated.clone()))
    return out


@requires_mjlab
def test_mjlab_terminal_final_obs_is_the_true_last_observation():
    """An env whose episodes end after 4 steps reports, as final_obs, exactly the observation an
    env without the time limit sees after step 4; its returned obs is the new episode's first."""
    from common.envs import make_env

    n, steps = 3, 4
    acts = mjlab_actions(n, steps)
    short = make_env(f"mjlab:{TASK}", n, seed=1, configure=episode_steps(steps))
    short_run = mjlab_rollout(short, acts)
    short.close()
    long = make_env(f"mjlab:{TASK}", n, seed=1, configure=episode_steps(100))
    long_run = mjlab_rollout(long, acts)
    long.close()
    for t in range(steps - 1):
        assert not short_run[t][2].any()
        for key in ("policy", "critic"):
            assert torch.equal(short_run[t][0][key], long_run[t][0][key])
    obs, final_obs, truncated = short_run[-1]
    assert truncated.all()
    for key in ("policy", "critic"):  # policy observations carry noise: equal draws, equal values
        assert torch.equal(final_obs[key], long_run[-1][0][key])
        assert not torch.allclose(obs[key], final_obs[key])  # reset: a new episode's first observation


def both_flows(envs: ManagerBasedEnvAdapter, reference_env, actions: torch.Tensor, prepare) -> tuple[list, list]:
    """The adapter's steps and mjlab's explicit reset flow from the same seed and start (`prepare(env)`),
    checked equal step for step; both envs closed."""
    try:
        envs.reset(seed=9)
        prepare(envs.env)
        ours = adapter_flow(envs, actions)
        reference_env.reset(seed=9)
        prepare(reference_env)
        reference = explicit_reset_flow(reference_env, actions, GROUPS)
    finally:
        envs.close()
        reference_env.close()
    assert_same_steps(ours, reference)
    return ours, reference


@requires_mjlab
def test_mjlab_terminal_is_the_explicit_reset_flow_bit_for_bit():
    """mjlab with auto_reset=False and reset(env_ids) after each step (its documented way to the
    terminal observation) against the adapter's hook inside mjlab's own auto-reset, with staggered
    episode ends, observation history, delays, noise and a group of separate terms."""
    n, length, steps = 4, 5, 14
    configure = with_history_delay_and_term_groups(length)
    acts = mjlab_actions(n, steps)
    envs = ManagerBasedEnvAdapter(raw_mjlab_env(n, 1, configure, auto_reset=True), f"mjlab:{TASK}", copy_obs=False)
    reference_env = raw_mjlab_env(n, 1, configure, auto_reset=False)
    ours, reference = both_flows(envs, reference_env, acts, lambda env: stagger(env, n, length))
    none, some, _ = reset_pattern(reference)
    assert some > 0 and any(s["log"] for s in ours)


@requires_mjlab
def test_mjlab_terminal_with_commands_is_the_explicit_reset_flow_bit_for_bit():
    """The same on the G1 velocity task, which has what Cartpole lacks: a velocity command with timers and
    metrics, a curriculum, contact sensors, falls. Episodes end at different steps (four start near their
    time limit) and some command timers run out inside the window."""
    task, n, steps = "Mjlab-Velocity-Flat-Unitree-G1", 6, 12
    acts = torch.randn(steps, n, 29, generator=torch.Generator().manual_seed(0))

    def start(env):
        limit = env.max_episode_length
        env.episode_length_buf[:] = torch.tensor([limit - 2, limit - 4, limit - 6, limit - 8, 0, 3])
        env.command_manager.get_term("twist").time_left[:] = torch.tensor([0.06, 0.1, 0.2, 5.0, 5.0, 0.04])

    envs = ManagerBasedEnvAdapter(raw_mjlab_env(n, 1, lambda cfg: None, True, task), task, copy_obs=False)
    reference_env = raw_mjlab_env(n, 1, lambda cfg: None, False, task)
    ours, reference = both_flows(envs, reference_env, acts, start)
    none, some, _ = reset_pattern(reference)
    assert none > 0 and some > 0
    assert any(k.startswith("Metrics/twist/") for s in ours for k in s["log"])


@requires_mjlab
def test_mjlab_pre_step_final_obs_is_the_previous_observation():
    from common.envs import make_env

    n = 2
    envs = make_env(f"mjlab:{TASK}", n, seed=1, configure=episode_steps(3), final_obs="pre_step")
    try:
        prev, _ = envs.reset(seed=3)
        for a in mjlab_actions(n, 3):
            obs, _, _, truncated, info = envs.step(a)
            expected = prev["critic"] if truncated.all() else obs["critic"]
            assert torch.equal(info["final_obs"]["critic"], expected)
            prev = obs
        assert truncated.all()
    finally:
        envs.close()


@requires_mjlab
def test_mjlab_finite_horizon_time_limit_is_terminal():
    from common.envs import make_env

    envs = make_env(f"mjlab:{TASK}", 2, seed=1, configure=episode_steps(2, finite_horizon=True))
    try:
        envs.reset()
        for a in mjlab_actions(2, 2):
            _, _, terminated, truncated, _ = envs.step(a)
        assert terminated.all()  # no bootstrap at a finite horizon
    finally:
        envs.close()


@requires_mjlab
@pytest.mark.parametrize("final_obs", ["terminal", "pre_step"])
def test_mjlab_no_host_sync_of_the_adapter_and_tensors_kept(final_obs):
    from common.envs import make_env

    n, length = 4, 3
    envs = make_env(
        f"mjlab:{TASK}", n, seed=1, configure=with_history_delay_and_term_groups(length), final_obs=final_obs
    )
    try:
        envs.reset(seed=2)
        stagger(envs.env, n, length)
        acts = mjlab_actions(n, 8)
        recorder = RecordHostSyncsByOwner(owners(mjlab_files()))
        with recorder:
            for a in acts:
                envs.step(a)
        assert recorder.of("adapter") == [] and recorder.of("other") == [], recorder.charged
        assert len(recorder.of("simulator")) >= len(acts)  # mjlab's own reads (its nonzero of finished envs)
        keep_and_check(envs, acts)
    finally:
        envs.close()


@requires_mjlab
def test_mjlab_errors_are_clear():
    from common.envs import make_env

    with pytest.raises(ValueError, match="Mjlab-Cartpole-Balance"):
        make_env("mjlab:Mjlab-Cartpole-Balanse", 2)
    with pytest.raises(ValueError, match="final_obs"):
        make_env(f"mjlab:{TASK}", 2, final_obs="exact")


@requires_mjlab
def test_ppo_runs_mjlab_with_asymmetric_critic(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "algos" / "ppo.py"),
            "--env-id",
            f"mjlab:{TASK}",
            "--num-envs",
            "4",
            "--num-steps",
            "8",
            "--num-minibatches",
            "2",
            "--total-timesteps",
            "64",
            "--num-eval-envs",
            "2",
            "--eval-interval",
            "0",
            "--obs-norm",  # the task's own config may turn it off (its `task` settings): the critic's normalizer shows
            "--output-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={"OMP_NUM_THREADS": "1", **os.environ, "CI": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = printed_summary(proc.stdout)
    assert summary["global_step"] == 64 and summary["iteration"] == 2
    checkpoint = torch.load(summary["checkpoints"]["last"], weights_only=True)
    assert "critic_obs_rms.mean" in checkpoint["model"]  # the critic read the task's "critic" group
    assert checkpoint["model"]["critic.0.weight"].shape[1] == 5


# --------------------------------------------------------------------------------------------
# against mjlab's own rsl_rl wrapper (what mjlab's train.py trains on)
# --------------------------------------------------------------------------------------------
G1 = "Mjlab-Velocity-Flat-Unitree-G1"


def g1_falls_soon(corruption: bool = True):
    """A `configure` hook: the fall limit lowered from the task's, so that robots under random actions fall
    within a few steps, at different steps; `corruption=False` turns off the observation noise."""

    def configure(cfg):
        cfg.terminations["fell_over"].params["limit_angle"] = 0.1
        if not corruption:
            for group in cfg.observations.values():
                group.enable_corruption = False

    return configure


def g1_start(env, command_timers: bool = True) -> None:
    """Four envs near their time limit (so that episodes are also truncated, at different steps), two not;
    with `command_timers`, three twist commands run out of time inside the window."""
    limit = env.max_episode_length
    env.episode_length_buf[:] = torch.tensor([limit - 2, limit - 4, limit - 6, limit - 8, 0, 3])
    timers = [0.06, 0.1, 0.2, 5.0, 5.0, 0.04] if command_timers else [5.0] * 6
    env.command_manager.get_term("twist").time_left[:] = torch.tensor(timers)


def adapter_and_wrapper_steps(final_obs: str, configure, start, n: int = 6, steps: int = 12):
    """The same G1 task, seed, start and actions through the adapter (make_env) and through mjlab's
    RslRlVecEnvWrapper with the task's clip_actions: per step (ours, the wrapper's), obs as plain dicts, and the
    critic group's terms as [(name, first column, end column)]."""
    import mjlab.tasks  # noqa: F401
    from mjlab.envs import ManagerBasedRlEnv
    from mjlab.rl import RslRlVecEnvWrapper
    from mjlab.tasks.registry import load_env_cfg, load_rl_cfg

    from common.envs import make_env
    from common.envs.mjlab_adapter import sim_seed

    actions = torch.randn(steps, n, 29, generator=torch.Generator().manual_seed(0))
    envs = make_env(f"mjlab:{G1}", n, seed=1, final_obs=final_obs, configure=configure)
    try:
        envs.reset(seed=9)
        start(envs.env)
        ours = adapter_flow(envs, actions)
    finally:
        envs.close()

    cfg = load_env_cfg(G1)
    configure(cfg)
    cfg.scene.num_envs, cfg.seed = n, sim_seed(1)  # the seeds the adapter hands mjlab
    wrapper = RslRlVecEnvWrapper(ManagerBasedRlEnv(cfg, device="cpu"), clip_actions=load_rl_cfg(G1).clip_actions)
    try:
        # the raw env's reset, as the adapter's: the wrapper's get_observations() would draw the noise again
        raw, _ = wrapper.unwrapped.reset(seed=sim_seed(9))
        start(wrapper.unwrapped)
        manager, column, critic_terms = wrapper.unwrapped.observation_manager, 0, []
        for name, shape in zip(manager.active_terms["critic"], manager.group_obs_term_dim["critic"], strict=True):
            critic_terms.append((name, column, column + int(np.prod(shape))))
            column += int(np.prod(shape))
        before = {"policy": raw["actor"].clone(), "critic": raw["critic"].clone()}
        theirs = []
        for action in actions:
            obs, reward, dones, extras = wrapper.step(action)
            after = {"policy": obs["actor"].clone(), "critic": obs["critic"].clone()}
            theirs.append(
                {
                    "obs": after,
                    "obs_before": before,
                    "reward": reward.clone(),
                    "dones": dones.clone(),
                    "time_outs": extras["time_outs"].clone(),
                }
            )
            before = after
    finally:
        wrapper.close()
    return ours, theirs, critic_terms


def assert_same_transitions(ours: list[dict], theirs: list[dict]) -> None:
    """Rewards, dones (terminated | truncated), time_outs (truncated) and the policy observations equal."""
    for t, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert torch.equal(a["reward"], b["reward"]), f"step {t}: reward"
        assert torch.equal((a["terminated"] | a["truncated"]).to(b["dones"].dtype), b["dones"]), f"step {t}: dones"
        assert torch.equal(a["truncated"], b["time_outs"].bool()), f"step {t}: time_outs"
        assert torch.equal(a["obs"]["policy"], b["obs"]["policy"]), f"step {t}: policy observation"


def assert_falls_and_time_limits(ours: list[dict]) -> None:
    terminated = torch.stack([s["terminated"] for s in ours])
    truncated = torch.stack([s["truncated"] for s in ours])
    assert terminated.any() and truncated.any() and not (terminated | truncated).all(dim=1).any()
    assert not (terminated | truncated)[0].any()  # a first step where no episode ends


@requires_mjlab
def test_mjlab_pre_step_is_what_mjlabs_rsl_rl_wrapper_gives():
    """final_obs="pre_step" against mjlab's RslRlVecEnvWrapper on the G1 velocity task, with observation noise,
    command timers running out, falls and time limits at different steps: bit for bit the wrapper's policy
    ("actor") and critic observations, rewards, dones and time_outs, and as final_obs of a finished env the
    wrapper's observation before the step (what rsl_rl bootstraps a time-out from)."""
    ours, theirs, _ = adapter_and_wrapper_steps("pre_step", g1_falls_soon(), g1_start)
    assert_falls_and_time_limits(ours)
    assert_same_transitions(ours, theirs)
    for t, (a, b) in enumerate(zip(ours, theirs)):
        done = (a["terminated"] | a["truncated"])[:, None]
        for key in ("policy", "critic"):
            assert torch.equal(a["obs"][key], b["obs"][key]), f"step {t}: {key} observation"
            expected = torch.where(done, b["obs_before"][key], b["obs"][key])
            assert torch.equal(a["final_obs"][key], expected), f"step {t}: final_obs[{key!r}]"


@requires_mjlab
def test_mjlab_terminal_takes_the_same_transitions_as_mjlabs_rsl_rl_wrapper():
    """final_obs="terminal" (the default) against the same wrapper: its final observations are its own (the
    true last ones, see the explicit reset flow tests), and on a step where an episode ends mjlab's random
    draws come in another order (the extra observation pass before the reset), so here without observation
    noise and with no command timer running out: rewards, dones, time_outs and policy observations equal at
    every step, the critic's too but for its foot contact terms on steps where an episode ends: those read the
    contact sensor, which differs there as it does between mjlab's own auto-reset and its explicit reset flow."""
    ours, theirs, critic_terms = adapter_and_wrapper_steps(
        "terminal", g1_falls_soon(corruption=False), lambda env: g1_start(env, command_timers=False)
    )
    assert_falls_and_time_limits(ours)
    assert_same_transitions(ours, theirs)
    contact = [(a, b) for name, a, b in critic_terms if name in ("foot_contact", "foot_contact_forces")]
    assert len(contact) == 2 and critic_terms[-1][2] == theirs[0]["obs"]["critic"].shape[1]
    unaffected = torch.ones(critic_terms[-1][2], dtype=torch.bool)
    for a, b in contact:
        unaffected[a:b] = False
    for t, (a, b) in enumerate(zip(ours, theirs)):
        columns = unaffected if (a["terminated"] | a["truncated"]).any() else slice(None)
        assert torch.equal(a["obs"]["critic"][:, columns], b["obs"]["critic"][:, columns]), f"step {t}: critic"


# --------------------------------------------------------------------------------------------
# the `task` settings: the task's registered rsl_rl runner config, as mjlab's train.py reads it
# --------------------------------------------------------------------------------------------
@requires_mjlab
@pytest.mark.parametrize("task", ["Mjlab-Velocity-Flat-Unitree-G1", "Mjlab-Velocity-Flat-Unitree-Go1"])
@pytest.mark.parametrize("script", ["ppo", "ppo_rnd", "ppo_lstm"])
def test_task_settings_are_the_registered_rsl_rl_config(task, script, monkeypatch):
    """`--env-id mjlab:<task>` alone resolves to the task's registered runner config (load_rl_cfg), field by field,
    read here from mjlab's own config objects, with rsl_rl's update; nothing is named at start (ppo_lstm.py: only
    that the config has no memory, its cell its own). tests/test_settings.py holds the G1 config's every field."""
    import json
    import math

    import mjlab.tasks  # noqa: F401  (registers the tasks)
    from mjlab.tasks.registry import load_rl_cfg

    from common.args import parse_args
    from tests.helpers import load_script
    from tests.test_settings import RSL_RL

    cfg = load_rl_cfg(task)
    actor, algorithm = cfg.actor, cfg.algorithm
    assert tuple(cfg.critic.hidden_dims) == tuple(actor.hidden_dims)  # else named at start, not checked here
    argv = ["--env-id", f"mjlab:{task}", "--num-envs", "256"]
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    args = parse_args(load_script(script).Args, argv)
    groups = {"policy": cfg.obs_groups["actor"][0], "critic": cfg.obs_groups["critic"][0]}
    expected = dict(
        settings="task",
        seed=cfg.seed,
        num_steps=cfg.num_steps_per_env,
        total_timesteps=256 * cfg.num_steps_per_env * cfg.max_iterations,
        save_interval=cfg.save_interval,
        hidden_sizes=tuple(actor.hidden_dims),
        activation=actor.activation,
        obs_norm=actor.obs_normalization,
        init_log_std=round(math.log(actor.distribution_cfg["init_std"]), 6),
        std_type=actor.distribution_cfg.get("std_type", "scalar"),
        learning_rate=algorithm.learning_rate,
        lr_schedule={"fixed": "constant"}.get(algorithm.schedule, algorithm.schedule),
        desired_kl=algorithm.desired_kl,
        update_epochs=algorithm.num_learning_epochs,
        num_minibatches=algorithm.num_mini_batches,
        clip_coef=algorithm.clip_param,
        gamma=algorithm.gamma,
        gae_lambda=algorithm.lam,
        vf_coef=2 * algorithm.value_loss_coef,  # rsl_rl's weighs (V - R)^2, ours 0.5 * (V - R)^2
        ent_coef=algorithm.entropy_coef,
        max_grad_norm=algorithm.max_grad_norm,
        clip_vloss=algorithm.use_clipped_value_loss,
        adv_norm="minibatch" if algorithm.normalize_advantage_per_mini_batch else "batch",
        **{**RSL_RL, "env_kwargs": json.dumps({"obs_groups": groups, "final_obs": "pre_step"})},
    )
    if script == "ppo_lstm":
        expected["shuffle"] = "never" if actor.rnn_type is not None else "once"
    assert {k: getattr(args, k) for k in expected} == expected
    no_memory = "a policy without a memory (the task's config is not recurrent: the cell is ppo_lstm.py's own)"
    assert args._settings_origin[1] == ([no_memory] if script == "ppo_lstm" else [])
