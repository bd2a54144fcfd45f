"""A copy of td3.py made as a researcher would make it, from td3.py alone: REDQ's random pair of critics in the
target and a linearly annealed target policy noise, common/ untouched. tests/test_copies.py runs every per-script
contract test on it, beside the README's copy; here, the idea.

The copy, `cp algos/td3.py algos/td3_redq.py` and the idea edited in as text (each anchor must occur exactly once,
so a change to td3.py that moves one fails here loudly, not silently):
  - a third critic, the target's min taken over two of the three drawn at random at every critic step (Chen et al.
    2021, REDQ): the draw on the device inside the captured update, no host read;
  - --policy-noise-final: the target policy noise annealed linearly from --policy-noise over the run. The critic
    step is captured (td3.py's compile-and-capture block says so), so the noise is a 0-d tensor the loop changes in
    place before the updates, never a Python float; it is held in the checkpoint with the run's other state, read by
    train's critic step from train's scope (one call changed), and logged as charts/policy_noise.
"""

from __future__ import annotations

import sys

import pytest
import torch

from tests.helpers import load_script, run_main
from tests.test_copies import copy_text
from tests.test_scripts import scalars

REDQ_COPY = [
    (
        "class Args(RunArgs):\n",
        "class Args(RunArgs):\n"
        "    policy_noise_final: Annotated[float, Ge(0)] = 0.0\n"
        '    """target policy noise std at the end of the run, annealed linearly from --policy-noise"""\n',
    ),
    ("NUM_CRITICS = 2  # clipped double Q\n", "NUM_CRITICS = 3  # REDQ: the target's min over two drawn at random\n"),
    (
        "def critic_loss(agent: Agent, b: TensorDict, args: Args):\n",
        "def critic_loss(agent: Agent, b: TensorDict, args: Args, policy_noise: torch.Tensor):\n",
    ),
    (  # the noise of this iteration: a 0-d tensor the loop anneals in place (the critic step is captured)
        '(torch.randn_like(b["actions"]) * args.policy_noise)',
        '(torch.randn_like(b["actions"]) * policy_noise)',
    ),
    (
        '        next_out = agent.q_out(agent.critic_target, b["next_obs_n"], next_action)\n',
        "        # REDQ: two target critics drawn at random for this step, on the device (no host read)\n"
        "        pair = torch.rand(NUM_CRITICS, device=b.device).argsort()[:2]\n"
        '        next_out = agent.q_out(agent.critic_target, b["next_obs_n"], next_action).index_select(0, pair)\n',
    ),
    (  # the critic step, train's own, reads the noise from train's scope: this one call changes
        "        q_loss, q_mean = critic_loss(agent, batch, args)\n",
        "        q_loss, q_mean = critic_loss(agent, batch, args, policy_noise)\n",
    ),
    (
        "    noise_std = draw_noise_std(args, device)\n",
        "    noise_std = draw_noise_std(args, device)\n"
        "    policy_noise = torch.tensor(args.policy_noise, device=device)  # annealed in place by the loop\n",
    ),
    (
        'replicated={"reward_normalizer": reward_normalizer, "counters": counters}',
        'replicated={"reward_normalizer": reward_normalizer, "counters": counters, "policy_noise": policy_noise}',
    ),
    (
        '            with timed(run, "update"):\n',
        "            # the target policy noise of this iteration's updates, linear in the env steps of the run\n"
        "            progress = min(run.global_step / total_steps, 1.0)\n"
        "            policy_noise.fill_(args.policy_noise + (args.policy_noise_final - args.policy_noise) * progress)\n"
        '            with timed(run, "update"):\n',
    ),
    (  # the schedule's value in the log, beside the losses (common/ untouched)
        "        if log_eval_save(run, final_iteration, stats, eval_envs, agent_inference, state, next_obs):\n",
        '        noise = {"charts/policy_noise": policy_noise}  # the schedule, logged as it is at the log\n'
        "        if log_eval_save(run, final_iteration, stats, eval_envs, agent_inference, state, next_obs, noise):\n",
    ),
]
# A direct run of the copy: 20 iterations of 8 envs, the updates from the first iteration on (1-step targets)
DIRECT = dict(
    device="cpu",
    progress=False,
    run_name="run",
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
    log_interval=1,  # the stop (--max-wall-seconds) is checked at every iteration
    policy_noise=0.2,
    policy_noise_final=0.05,
    total_timesteps=8 * 20,
)


def test_a_td3_copy_with_redq_critics_and_annealed_policy_noise_is_live(tmp_path):
    """The copy (REDQ_COPY, made from td3.py's text alone) passes every per-script contract test beside the README's
    copy (tests/test_copies.py::test_copies_made_as_a_researcher_would_pass_the_contract_tests: exact resume, compiled
    as eager, captured without a host read, the device-kernel guard with the pair's draw traced in the update). Here
    a direct run shows the idea live: three critics and their targets in the checkpoint, the noise where the
    schedule puts it, mid-run and at the end, and its value at every log in the event file as charts/policy_noise
    (log_eval_save takes the copy's own scalars)."""
    copy = tmp_path / "td3_redq.py"
    copy.write_text(copy_text("td3", REDQ_COPY, least=10))
    # the idea is live: three critics, and the noise annealed in place and checkpointed
    try:
        redq = load_script("td3_redq", copy)
        run_main(redq, **DIRECT, output_dir=str(tmp_path / "mid"), max_wall_seconds=0.0)  # stops after iteration 1
        run_main(redq, **DIRECT, output_dir=str(tmp_path / "end"))
    finally:
        sys.modules.pop("td3_redq", None)
    for stage, steps in (("mid", 8), ("end", 8 * 20)):
        state = torch.load(tmp_path / stage / "run" / "checkpoints" / "last.pt", weights_only=True)
        assert state["global_step"] == steps and state["state"]["counters"]["update_count"] > 0, stage
        for name in ("critic", "critic_target"):
            weights = [v for k, v in state["model"].items() if k.startswith(f"{name}.") and k.endswith("weight")]
            assert weights and all(w.shape[0] == 3 for w in weights), (name, [w.shape for w in weights])
        noise = state["state"]["policy_noise"]
        expected = 0.2 + (0.05 - 0.2) * steps / (8 * 20)
        assert noise.shape == () and noise.item() == pytest.approx(expected, rel=1e-6), (stage, noise, expected)
    # the schedule's value, logged by the copy as charts/policy_noise at every log (--log-interval 1): read back
    logged = scalars(tmp_path / "end" / "run")["charts/policy_noise"]
    assert [step for step, _ in logged] == list(range(8, 8 * 20 + 1, 8))
    assert [value for _, value in logged] == pytest.approx([0.2 + (0.05 - 0.2) * s / (8 * 20) for s, _ in logged])
