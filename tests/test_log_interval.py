"""The log interval only logs (design.md, performance rules): two runs of a script that differ in --log-interval
alone end with the same last.pt, bit for bit in every tensor (model, optimizers, normalizers, replay buffer, RNG
states, the script's own state), for every script of the repository. No part of training (a normalizer's fold, a
schedule) hangs on the log."""

from __future__ import annotations

import pytest

from tests.contract import CONTRACT
from tests.test_scripts import assert_same, checkpoint, train

# the scripts, each run for a few iterations: enough for td3's and sac's updates to start (their tiny settings learn
# from the third iteration on) and for the PPO family's normalizers to fold more than once
ITERATIONS = {"td3": 6, "sac": 6}


@pytest.mark.parametrize("algo", ["td3", "sac", "ppo", "ppo_lstm", "ppo_rnd", "distill", "pqn"])
def test_two_runs_that_differ_in_the_log_interval_alone_end_bit_identical(algo, tmp_path):
    iterations = ITERATIONS.get(algo, 3)
    steps = CONTRACT[algo]["steps"] * iterations
    ends = {}
    for interval in (1, iterations + 1):  # a log at every iteration, and none but the final one
        train(algo, tmp_path / str(interval), total_timesteps=steps, log_interval=interval)
        ckpt = checkpoint(tmp_path / str(interval))
        assert ckpt["global_step"] == steps and ckpt["args"]["log_interval"] == interval
        # what may differ: the flags (--log-interval among them), and the totals' clocks and last logged return (the
        # mean over the episodes of the last log interval)
        ckpt.pop("args")
        ends[interval] = {**ckpt, "totals": ckpt["totals"]["processes"]}
    assert_same(ends[1], ends[iterations + 1])
