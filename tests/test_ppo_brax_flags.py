"""ppo.py with brax's update (the flags the `task` set of a Playground DM Control task sets; tests/test_brax_ppo.py
holds them against brax's loss) keeps the contract of every script on the GPU path, proven on a CPU as
tests/test_scripts.py proves it for the defaults: compiled in lockstep with eager, and its captured functions replaying
the same kernels on the same tensors without a host sync. A built-in env: no Playground needed."""

from __future__ import annotations

import math

from tests.helpers import load_script
from tests.lockstep import inductor_settings, lockstep_compiled
from tests.replay import (
    assert_keeps_python_state,
    assert_no_host_sync,
    assert_replays_alike,
    assert_runs_compiled,
    record_captured,
)
from tests.test_scripts import train, units

# brax's update on the contract's tiny ppo run (16 envs of 8 steps: 16 unrolls, 2 minibatches of 8)
BRAX = dict(
    policy_dist="tanh-normal",
    entropy="sampled",
    critic_hidden_sizes=(32, 32),
    reward_scale=10.0,
    reward_norm=False,
    gae="in-loss",
    adv_std="population",
    vf_coef=0.5,
    clip_vloss=False,
    max_grad_norm=math.inf,
    adam_eps=1e-8,
)


def test_brax_update_compiles_to_what_eager_computes(tmp_path, monkeypatch):
    """--compile in lockstep (tests/lockstep.py): every compiled call returns and writes what eager does, the sampled
    entropy's draw among them (inductor drawing as eager does)."""
    checked = lockstep_compiled(monkeypatch)
    with inductor_settings(kernels=False):
        summary = train("ppo", tmp_path, compile=True, total_timesteps=units("ppo", 2), eval_interval=0, **BRAX)
    assert summary["compile"] and len(checked.calls) >= 2, checked.calls


def test_brax_update_replays_its_captured_functions_without_host_sync(tmp_path, monkeypatch):
    """The whole rollout and the whole update (targets, and the epochs with GAE in each minibatch's loss) record the
    same ops on the same tensors in two calls after the warm-up, with no host read."""
    signatures = record_captured(monkeypatch, load_script("ppo"))
    train("ppo", tmp_path, total_timesteps=units("ppo", 5), eval_interval=0, **BRAX)
    assert {"rollout", "update"} <= set(signatures), signatures.keys()
    for name, calls in signatures.items():
        assert_replays_alike(name, calls)
        assert_no_host_sync(name, calls)
        assert_keeps_python_state(name, calls)
    assert_runs_compiled(signatures)
