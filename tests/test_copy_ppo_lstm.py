"""A copy of ppo_lstm.py with chunked BPTT, made as a researcher would make it, is a first-class script.

`cp algos/ppo_lstm.py algos/ppo_lstm_chunks.py`, then the idea in that file alone (CHUNKS: anchor -> replacement,
each anchor found exactly once, so a change to ppo_lstm.py that moves one fails here loudly): a flag --seq-len that
cuts each env's rollout into chunks of that many steps (it must divide --num-steps, its own one-line error otherwise),
minibatches of chunks (--num-minibatches divides num_envs * num_steps / seq_len, the rule adapted), each chunk
replayed from the hidden state the rollout stored at its first step, and a start line of its own. common/ is not
touched. tests/test_copies.py runs the per-script contract tests on the copy, beside the README's; here, the idea.
"""

from __future__ import annotations

import sys

import pytest
import torch

from tests.helpers import load_script, run_main
from tests.test_copies import copy_text
from tests.contract import COMMON, CONTRACT

NAME = "ppo_lstm_chunks"
CHUNKS = [
    # the flag: chunks of --seq-len steps (2 by default: it divides every rollout length the contract tests run)
    (
        '    """steps per env per rollout, also the length of the replayed sequences (truncated BPTT)"""\n',
        '    """steps per env per rollout"""\n'
        "    seq_len: Annotated[int, Ge(1)] = 2\n"
        '    """length of the replayed chunks (truncated BPTT over --seq-len steps); divides --num-steps"""\n',
    ),
    (
        '    """minibatches per epoch, each a set of envs with all their steps"""\n',
        '    """minibatches per epoch, each a set of chunks"""\n',
    ),
    # its divisibility rules, each a one-line error before anything runs
    (
        """\
def env_minibatches(args: Args) -> int:
    \"\"\"Envs per minibatch: a minibatch is a set of envs with their whole sequences, so --num-minibatches divides
    --num-envs, or a one-line error before anything runs.\"\"\"
    if args.num_envs % args.num_minibatches != 0:
        raise SystemExit(
            f"error: --num-envs {args.num_envs} does not divide into --num-minibatches {args.num_minibatches} "
            f"(a minibatch is a set of envs with their whole sequences); pick a divisor of {args.num_envs}"
        )
    return args.num_envs // args.num_minibatches
""",
        """\
def chunk_minibatches(args: Args) -> int:
    \"\"\"Chunks per minibatch: a rollout is cut into chunks of --seq-len steps, so --seq-len divides --num-steps, and a
    minibatch is a set of chunks, so --num-minibatches divides num_envs * num_steps / seq_len; else one line each.\"\"\"
    if args.num_steps % args.seq_len != 0:
        raise SystemExit(
            f"error: --seq-len {args.seq_len} does not divide --num-steps {args.num_steps} (a rollout is cut "
            f"into chunks of --seq-len steps); pick a divisor of {args.num_steps}"
        )
    num_chunks = args.num_envs * (args.num_steps // args.seq_len)
    if num_chunks % args.num_minibatches != 0:
        raise SystemExit(
            f"error: the {num_chunks} chunks of a rollout (--num-envs {args.num_envs} x --num-steps "
            f"{args.num_steps} / --seq-len {args.seq_len}) do not divide into --num-minibatches "
            f"{args.num_minibatches}; pick a divisor of {num_chunks}"
        )
    return num_chunks // args.num_minibatches
""",
    ),
    (
        "    envs_per_minibatch = env_minibatches(args)  # or a one-line error: the envs must divide\n",
        "    chunks_per_minibatch = chunk_minibatches(args)  # or a one-line error: the chunks must divide\n",
    ),
    # the hidden state at each chunk's first step, stored by the rollout
    (
        """\
    # graph reads it where it is), and the one at the start of the rollout, which the update replays from
    rnn_state = torch.zeros(agent.state_shape[0], args.num_envs, agent.state_shape[1], device=device)
    initial_state = torch.zeros_like(rnn_state)
""",
        """\
    # graph reads it where it is), and the one at the first step of each chunk, which the update replays it from
    rnn_state = torch.zeros(agent.state_shape[0], args.num_envs, agent.state_shape[1], device=device)
    chunk_states = torch.zeros(args.num_steps // args.seq_len, *rnn_state.shape, device=device)  # [C, rows, N, H]
""",
    ),
    (
        """\
        initial_state.copy_(rnn_state)  # the hidden states the rollout starts from: the update replays from them
        for step in range(args.num_steps):
""",
        """\
        for step in range(args.num_steps):
            if step % args.seq_len == 0:  # a chunk starts here: the update replays it from this state
                chunk_states[step // args.seq_len].copy_(rnn_state)
""",
    ),
    # the update: the [T, N] rollout as [seq_len, C * N] sequences, each with the state at its first step
    (
        """\
        num_envs, loss_sums, num_updates = batch.shape[1], {}, 0
""",
        """\
        num_chunks = batch.shape[0] // args.seq_len  # per env
        batch = batch.reshape(num_chunks, args.seq_len, -1).transpose(0, 1).reshape(args.seq_len, -1)  # chunk-major
        initial_state = chunk_states.transpose(0, 1).flatten(1, 2)  # [C, rows, N, H] -> [rows, C * N, H]
        num_envs, loss_sums, num_updates = batch.shape[1], {}, 0  # the chunks, as the envs were
""",
    ),
    # its start line
    (
        """\
        f"batch {global_batch} per iteration ({args.num_minibatches} minibatches of {envs_per_minibatch} envs x "
        f"{args.num_steps} steps per process); {args.cell} {args.rnn_layers}x{args.rnn_hidden_size}"
""",
        """\
        f"batch {global_batch} per iteration ({args.num_minibatches} minibatches of {chunks_per_minibatch} "
        f"chunks of {args.seq_len} steps per process); {args.cell} {args.rnn_layers}x{args.rnn_hidden_size}"
""",
    ),
]
# ppo_lstm's tiny settings in tests/test_scripts.py (the copy joins the contract tests with them): 16 envs x 8 steps
SMALL = {**COMMON, **CONTRACT["ppo_lstm"]["kwargs"]}
ITERATION = 16 * 8


def without_run_specifics(ckpt: dict) -> dict:
    """What two runs of different scripts and flags that trained alike hold alike: all but the script's name, the
    flags and the clocks."""
    return {k: v for k, v in ckpt.items() if k not in ("algo", "args", "totals")}


def test_a_chunked_bptt_copy_of_ppo_lstm_is_live(tmp_path, capsys):
    """The copy (CHUNKS, made from ppo_lstm.py's text alone) passes every per-script contract test beside the
    README's copy (tests/test_copies.py::test_copies_made_as_a_researcher_would_pass_the_contract_tests). Here the
    idea, directly: the two one-line errors, the start line, the chunks replayed from the stored states (the first
    minibatch's log-probs and values are the rollout's), --seq-len < --num-steps training otherwise than --seq-len ==
    --num-steps, which is ppo_lstm.py's run exactly."""
    from tests.test_scripts import assert_same

    path = tmp_path / f"{NAME}.py"
    path.write_text(copy_text("ppo_lstm", CHUNKS, least=10))
    chunks, original = load_script(NAME, path), load_script("ppo_lstm")
    try:
        # the rules, each in one line before anything runs: --seq-len divides --num-steps; --num-minibatches divides
        # the chunks (64 here), not the envs (16), which ppo_lstm.py asks
        out = tmp_path / "runs"
        with pytest.raises(SystemExit, match=r"^error: --seq-len 3 does not divide --num-steps 8 .*divisor of 8$"):
            run_main(chunks, **{**SMALL, "seq_len": 3}, output_dir=str(out))
        with pytest.raises(SystemExit, match=r"^error: the 64 chunks of a rollout .*--num-minibatches 5; .* of 64$"):
            run_main(chunks, **{**SMALL, "num_minibatches": 5}, output_dir=str(out))
        with pytest.raises(SystemExit, match=r"^error: --num-envs 16 does not divide into --num-minibatches 32"):
            run_main(original, **{**SMALL, "num_minibatches": 32}, output_dir=str(out))
        assert not out.exists()
        capsys.readouterr()
        run_main(chunks, **{**SMALL, "num_minibatches": 32}, total_timesteps=ITERATION, output_dir=str(out / "32"))
        assert "batch 128 per iteration (32 minibatches of 2 chunks of 2 steps per process); lstm 1x16" in (
            capsys.readouterr().out
        )

        # each chunk is replayed from the state the rollout had at its first step: before the first gradient step,
        # the replay gives the log-probs and values the rollout acted with (from zero states it would not, but where
        # the chunk starts an episode or the rollout)
        first = {}

        def recording(agent, mb, state, args):
            if not first:
                with torch.no_grad():
                    replayed = agent.replay(mb["obs_n", "policy"], state, mb["starts"])
                    zero = agent.replay(mb["obs_n", "policy"], torch.zeros_like(state), mb["starts"])
                    first.update(
                        logprobs=agent.log_prob_entropy(replayed, mb["actions"])[0],
                        values=agent.value(replayed, mb["obs_n"]),
                        zero_values=agent.value(zero, mb["obs_n"]),
                        mb=mb,
                    )
            return ppo_loss(agent, mb, state, args)

        ppo_loss, chunks.ppo_loss = chunks.ppo_loss, recording
        try:
            run_main(chunks, **SMALL, total_timesteps=2 * ITERATION, output_dir=str(out / "replay"))
        finally:
            chunks.ppo_loss = ppo_loss
        assert first["mb"].shape == (2, 32)  # 2 minibatches of the 64 chunks of 2 steps
        torch.testing.assert_close(first["logprobs"], first["mb"]["logprobs"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(first["values"], first["mb"]["values"], rtol=1e-4, atol=1e-5)
        assert (first["zero_values"] - first["mb"]["values"]).abs().max() > 1e-3

        # --seq-len == --num-steps is ppo_lstm.py's run, tensor for tensor; a shorter one trains otherwise
        for name, module, flags in (
            ("original", original, {}),
            ("whole", chunks, dict(seq_len=8)),
            ("chunked", chunks, dict(seq_len=4)),
        ):
            run_main(module, **{**SMALL, **flags}, total_timesteps=2 * ITERATION, output_dir=str(out / name))
        last = {
            name: without_run_specifics(torch.load(out / name / "run" / "checkpoints" / "last.pt", weights_only=True))
            for name in ("original", "whole", "chunked")
        }
        assert_same(last["original"], last["whole"])
        differs = [k for k, v in last["chunked"]["model"].items() if not torch.equal(v, last["whole"]["model"][k])]
        assert "rnn.weight_hh_l0" in differs, differs
    finally:
        sys.modules.pop(NAME, None)
