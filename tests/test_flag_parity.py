"""No fork that drifts: every PPO-family script offers ppo.py's flags, or leaves one out on purpose, listed here once
with the reason. A flag added to ppo.py without the others (or this list) fails here, as does a listed difference
that is no longer one. distill.py is not of the family: it trains a student on a teacher's actions, with no PPO loss.
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.helpers import load_script

PPO_FAMILY = ["ppo_lstm", "ppo_rnd"]
SYMMETRY_OF_A_MEMORY = (
    "a mirror image of a sequence needs the mirror image of the hidden state it starts from (truncated BPTT starts "
    "from the state the rollout stored, which holds the unmirrored history), and a learned hidden state has no known "
    "mirror: replayed from that state, or from zeros, the mirrored sequences are histories the env never produced "
    "(rsl_rl refuses symmetry with a recurrent policy too)"
)
BRAX_UPDATE = (
    "brax's PPO update (Playground's trainer of its DM Control tasks), held against brax's own loss for ppo.py "
    "(tests/test_brax_ppo.py); the task set that sets it is ppo.py's: not ported"
)
# (script, ppo.py's flag it leaves out): why
DIFFERENCES = {
    ("ppo_lstm", "target_kl"): "not ported: ppo.py's way (targets and each minibatch captured alone, a host read of "
    "the KL per epoch) applies, with each minibatch's initial states captured beside it",
    ("ppo_lstm", "shared_encoder"): "always shared: the policy group's encoder and the recurrent cell serve both heads",
    ("ppo_lstm", "symmetry"): SYMMETRY_OF_A_MEMORY,
    ("ppo_lstm", "mirror_loss_coef"): SYMMETRY_OF_A_MEMORY,
    **{
        (script, flag): BRAX_UPDATE
        for script in PPO_FAMILY
        for flag in ("policy_dist", "entropy", "critic_hidden_sizes", "reward_scale", "gae", "unroll_length", "adv_std")
    },
}


def flags(script: str) -> dict[str, dataclasses.Field]:
    return {field.name: field for field in dataclasses.fields(load_script(script).Args)}


@pytest.mark.parametrize("script", PPO_FAMILY)
def test_a_ppo_family_script_has_ppos_flags_or_says_why_not(script):
    """ppo.py's flags the script lacks are exactly the listed ones (each with a reason); the ones it shares have the
    same type and range (a default may differ: a recurrent policy wants other sizes)."""
    ppo, own = flags("ppo"), flags(script)
    listed = {flag for name, flag in DIFFERENCES if name == script}
    assert set(ppo) - set(own) == listed, (
        f"{script}.py: ppo.py's flags it lacks {sorted(set(ppo) - set(own))}, listed {sorted(listed)}: add the flag to "
        f"{script}.py, or list it in DIFFERENCES with the reason"
    )
    assert all(DIFFERENCES[script, flag].strip() for flag in listed), "each difference says why"
    for name in set(ppo) & set(own):
        assert own[name].type == ppo[name].type, f"--{name.replace('_', '-')}: {script}.py's type differs from ppo.py's"
