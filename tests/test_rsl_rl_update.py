"""rsl_rl's update in the PPO family's scripts (the flags the `task` settings set, docs/rsl_rl.md) keeps the contract
the plain defaults keep: its captured functions replay the same kernels on the same tensors with no host sync, in the
capture layouts it changes (the rate adapted inside the minibatch step, the acting distribution stored by the rollout,
the analytic KL, two gradient clips), and its compiled run computes what its eager run computes. tests/test_scripts.py
runs the same checks with the plain defaults; tests/test_rsl_rl_parity.py compares the update with rsl_rl's own."""

from __future__ import annotations

import pytest

from tests.replay import assert_keeps_python_state, assert_no_host_sync, assert_replays_alike, record_captured
from tests.contract import CONTRACT, GYM_16
from tests.lockstep import inductor_settings, lockstep_compiled
from tests.test_scripts import train, units
from tests.helpers import load_script

# the task set's update flags, as common.settings.translate_rsl_rl sets them for an mjlab 1.6 config
RSL_RL = dict(
    lr_schedule="adaptive",
    kl_estimator="analytic",
    lr_adapt="before-step",
    lr_max=1e-2,
    grad_clip="per-network",
    adam_eps=1e-8,
    shuffle="once",
    std_type="scalar",
    adv_norm="batch",
    reward_norm=False,
)
LAYOUTS = [
    ("ppo", {}),  # a built-in env: the whole rollout and the whole update, each one graph
    ("ppo", dict(target_kl=1.0, symmetry="both")),  # the targets and each minibatch apart, the mirror images
    ("ppo", dict(env_id="gym:Pendulum-v1", env_kwargs=GYM_16)),  # an adapter: each acting step apart
    ("ppo_rnd", {}),
    ("ppo_lstm", dict(shuffle="never")),
    ("ppo_lstm", dict(env_id="gym:Pendulum-v1", env_kwargs=GYM_16, shuffle="never")),
]


@pytest.mark.parametrize("algo, layout", LAYOUTS, ids=[f"{a}-{i}" for i, (a, _) in enumerate(LAYOUTS)])
def test_rsl_rls_update_replays_without_host_sync(algo, layout, tmp_path, monkeypatch):
    """Every function the script captures, with rsl_rl's update flags: the same ops on the same live tensors in two
    calls after its warm-up, and no host sync after the first (tests/replay.py)."""
    signatures = record_captured(monkeypatch, load_script(algo))
    settings = {**RSL_RL, **layout}
    train(algo, tmp_path, **{"total_timesteps": units(algo, 5), "eval_interval": CONTRACT[algo]["sync"], **settings})
    assert len(signatures) >= 2, signatures.keys()
    for name, calls in signatures.items():
        assert_replays_alike(name, calls)
        assert_no_host_sync(name, calls)
        assert_keeps_python_state(name, calls)


def test_rsl_rls_update_compiles_as_it_runs_eagerly(tmp_path, monkeypatch):
    """ppo.py with rsl_rl's update flags (and its symmetry), compiled on CPU in lockstep (tests/lockstep.py): every
    compiled call returns and writes what eager does from the same state, the rate adapted inside the minibatch step
    among them, up to float32 rounding at each tensor's scale."""
    checked = lockstep_compiled(monkeypatch)
    settings = dict(total_timesteps=units("ppo", 2), symmetry="both", **RSL_RL)
    with inductor_settings(kernels=False):
        compiled = train("ppo", tmp_path, compile=True, **settings)
    assert compiled["compile"] and compiled["compile_seconds_by_function"]
    assert len(checked.calls) >= 2, checked.calls
