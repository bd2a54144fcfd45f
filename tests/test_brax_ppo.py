"""brax's PPO update, the one Playground's `learning/train_jax_ppo.py` trains its tasks with (a DM Control task's `task`
set is its `brax_ppo_config`), on one fixed batch with fixed weights: brax's own loss (`brax.training.agents.ppo.losses.
compute_ppo_loss` with the networks of `ppo.networks.make_ppo_networks`), its gradients and one step of its optimizer,
against ours, term by term, at float32 rounding. docs/playground.md's table says what maps to what.

Ours is algos/ppo.py with the flags that make its update brax's (BRAX_FLAGS, what the `task` set of a DM Control task
sets): its targets, its loss and one Adam step (brax_update). Where one of them is set back to ppo.py's default, the
numbers part (test_each_difference_set_back_breaks_it): each is a difference, not a detail. Marked `playground`: brax
comes with Playground's extra (the playground lane)."""

from __future__ import annotations

import importlib.util
import math
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn as nn

pytestmark = [
    pytest.mark.playground,
    pytest.mark.skipif(importlib.util.find_spec("brax") is None, reason="needs brax (Playground's extra)"),
]

T, B, OBS, ACT = 30, 8, 5, 2  # brax's unroll of CartpoleBalance's config, unrolls in the minibatch, sizes
# CartpoleBalance's brax_ppo_config where the loss reads it, and brax's ppo.train defaults it leaves
CONFIG = dict(
    discounting=0.995,
    reward_scaling=10.0,
    entropy_cost=0.01,
    learning_rate=1e-3,
    clipping_epsilon=0.3,  # ppo.train's default
    gae_lambda=0.95,  # ppo.train's default
    vf_coefficient=0.5,  # ppo.train's vf_loss_coefficient
    normalize_advantage=True,
)
# ppo.py's flags that give brax's update (planned names; each a difference from ppo.py's defaults)
BRAX_FLAGS = dict(
    policy_dist="tanh-normal",  # brax's NormalTanhDistribution: the actor outputs loc and the std's pre-softplus
    hidden_sizes=(32, 32, 32, 32),  # brax's policy network
    critic_hidden_sizes=(256, 256, 256, 256, 256),  # brax's value network, apart from the policy's
    activation="silu",  # linen.swish
    entropy="sampled",  # brax's entropy: the Gaussian's plus the tanh's log-det-Jacobian at one sample
    reward_scale=10.0,  # reward_scaling, with --no-reward-norm
    gae="in-loss",  # GAE of each minibatch's whole unrolls in its loss, from the current critic, truncations masked
    unroll_length=None,  # the rollout's T steps are one unroll here
    adv_norm="minibatch",  # (A - mean) / (std + 1e-8) over the minibatch,
    adv_std="population",  # jnp.std's ddof 0
    vf_coef=0.5,  # brax's 0.5 * vf_loss_coefficient (0.5) * (vs - V)^2, ours 0.5 * vf_coef * (R - V)^2
    clip_vloss=False,  # clipping_epsilon_value=None (at the rollout's own weights, as here, the clip changes nothing)
    clip_coef=0.3,
    ent_coef=0.01,
    gamma=0.995,
    gae_lambda=0.95,
    max_grad_norm=math.inf,  # DM Control configs have no max_grad_norm: no clip
    adam_eps=1e-8,  # optax.adam's
)
# ppo.py's defaults for the same flags: each set back alone must break the match
PPO_DEFAULTS = dict(
    policy_dist="gaussian",
    entropy="analytic",
    reward_scale=1.0,
    gae="rollout",
    adv_std="unbiased",
    vf_coef=1.0,
    clip_coef=0.2,
    max_grad_norm=1.0,
    adam_eps=1e-5,
    critic_hidden_sizes=None,  # the actor's 4 x 32
    activation="tanh",
)


# ----------------------------------------------------------------------------------------------
# brax's side: its networks, its loss, its gradients and its optimizer's step, in JAX
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def brax_side():
    """One batch of B unrolls of T steps (time-outs and terminations among them), brax's networks at their init from a
    fixed key, the normalizer updated with the batch as ppo.train updates it before its SGD; brax's loss terms,
    gradients and the parameters after one step of optax.adam. All as numpy."""
    import jax
    import jax.numpy as jnp
    import optax
    from brax.training import types
    from brax.training.acme import running_statistics, specs
    from brax.training.agents.ppo import losses, networks

    rng = np.random.default_rng(0)
    obs = rng.normal(1.0, 2.0, (B, T + 1, OBS)).astype(np.float32)  # [B, T + 1]: each step's and the next
    raw_action = rng.normal(0.0, 1.5, (B, T, ACT)).astype(np.float32)  # pre-tanh, as brax stores them
    reward = rng.normal(0.5, 1.0, (B, T)).astype(np.float32)
    truncation = np.zeros((B, T), np.float32)
    truncation[1, 7] = truncation[4, 20] = 1.0  # time-outs (done, discount 1)
    done = truncation.copy()
    done[2, 11] = done[5, 29] = 1.0  # terminations
    discount = 1.0 - (done * (1.0 - truncation))
    behaviour_log_prob = (rng.normal(-2.0, 0.5, (B, T))).astype(np.float32)

    ppo_network = networks.make_ppo_networks(OBS, ACT, preprocess_observations_fn=running_statistics.normalize)
    key_policy, key_value, key_loss = jax.random.split(jax.random.PRNGKey(1), 3)
    params = losses.PPONetworkParams(
        policy=ppo_network.policy_network.init(key_policy), value=ppo_network.value_network.init(key_value)
    )
    normalizer = running_statistics.init_state(specs.Array((OBS,), jnp.dtype("float32")))
    normalizer = running_statistics.update(normalizer, jnp.asarray(obs[:, :T]))  # the batch's observations
    # the acting policy's outputs, which brax's loss reads for its logged KL only
    acting = ppo_network.policy_network.apply(normalizer, params.policy, jnp.asarray(obs[:, :T]))
    data = types.Transition(
        observation=jnp.asarray(obs[:, :T]),
        action=jnp.tanh(jnp.asarray(raw_action)),
        reward=jnp.asarray(reward),
        discount=jnp.asarray(discount),
        next_observation=jnp.asarray(obs[:, 1:]),
        extras={
            "state_extras": {"truncation": jnp.asarray(truncation)},
            "policy_extras": {
                "raw_action": jnp.asarray(raw_action),
                "log_prob": jnp.asarray(behaviour_log_prob),
                "distribution_params": acting,
            },
        },
    )

    def loss_fn(p):
        return losses.compute_ppo_loss(
            p,
            normalizer,
            data,
            key_loss,
            ppo_network,
            entropy_cost=CONFIG["entropy_cost"],
            discounting=CONFIG["discounting"],
            reward_scaling=CONFIG["reward_scaling"],
            gae_lambda=CONFIG["gae_lambda"],
            clipping_epsilon=CONFIG["clipping_epsilon"],
            normalize_advantage=CONFIG["normalize_advantage"],
            vf_coefficient=CONFIG["vf_coefficient"],
        )

    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    optimizer = optax.adam(learning_rate=CONFIG["learning_rate"])  # ppo.train's, without max_grad_norm
    updates, _ = optimizer.update(grads, optimizer.init(params), params)
    stepped = optax.apply_updates(params, updates)
    # the draw of its entropy: create_dist(...).sample(seed=key_loss) on [T, B, ACT] (time first inside the loss)
    noise = jax.random.normal(key_loss, (T, B, ACT))
    as_np = lambda tree: jax.tree.map(np.asarray, tree)  # noqa: E731
    return {
        "obs": obs,
        "raw_action": raw_action,
        "reward": reward,
        "truncation": truncation,
        "termination": done * (1.0 - truncation),
        "behaviour_log_prob": behaviour_log_prob,
        "mean": np.asarray(normalizer.mean),
        "std": np.asarray(normalizer.std),
        "params": as_np(params),
        "grads": as_np(grads),
        "stepped": as_np(stepped),
        "metrics": {k: float(v) for k, v in metrics.items()},
        "loss": float(loss),
        "noise": np.asarray(noise).swapaxes(0, 1),  # [B, T, ACT], the batch's layout
    }


# ----------------------------------------------------------------------------------------------
# Ours: ppo.py's targets, loss and step with the brax flags, from brax's weights and normalized observations
# ----------------------------------------------------------------------------------------------
def load_flax(net: nn.Sequential, flax_params: dict, outputs: int | None = None) -> None:
    """brax's Dense layers hidden_0.. (kernel [in, out]) into the Linear layers (weight [out, in]); `outputs`: the
    last layer's first ones only (the mean half of brax's policy output, for a Gaussian actor). Shapes must fit."""
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    dense = flax_params["params"]
    if len(linears) != len(dense):
        raise ValueError(f"{len(linears)} layers here, {len(dense)} in brax's network")
    with torch.no_grad():
        for i, layer in enumerate(linears):
            kernel, bias = np.asarray(dense[f"hidden_{i}"]["kernel"]), np.asarray(dense[f"hidden_{i}"]["bias"])
            if outputs is not None and i == len(linears) - 1:
                kernel, bias = kernel[:, :outputs], bias[:outputs]
            if layer.weight.shape != kernel.T.shape:
                raise ValueError(f"layer {i}: {tuple(layer.weight.shape)} here, {kernel.T.shape} in brax's network")
            layer.weight.copy_(torch.from_numpy(kernel.T.copy()))
            layer.bias.copy_(torch.from_numpy(bias.copy()))


def brax_update(side: dict, flags: dict) -> dict | None:
    """ppo.py with BRAX_FLAGS over `flags`: its targets of the batch as a [T, B] rollout (B envs of one unroll each),
    its loss of the whole batch as one minibatch (brax's minibatch: B unrolls), its gradients and one Adam step with its
    gradient clip. The observations come normalized by brax's statistics (--no-obs-norm here); brax's draw for its
    entropy is torch's randn_like's. None where brax's weights do not fit ppo.py's networks."""
    import gymnasium as gym
    from tensordict import TensorDict

    from common.normalize import RewardNormalizer
    from tests.helpers import load_script

    ppo = load_script("ppo")
    fields = set(ppo.Args.__dataclass_fields__)
    flags = {**BRAX_FLAGS, **flags}
    args = ppo.Args(
        **{k: v for k, v in flags.items() if k in fields},
        num_envs=B,
        num_steps=T,
        num_minibatches=1,
        obs_norm=False,
        reward_norm=False,
        lr_schedule="constant",
        learning_rate=CONFIG["learning_rate"],
    )
    agent = ppo.Agent((OBS,), None, gym.spaces.Box(-1.0, 1.0, (ACT,)), args)
    try:
        load_flax(agent.critic, side["params"].value)
        load_flax(agent.actor, side["params"].policy, None if agent.squashed else ACT)
    except ValueError:
        return None
    obs_n = (torch.tensor(side["obs"]) - torch.tensor(side["mean"])) / torch.tensor(side["std"])  # brax's, unclipped
    obs = obs_n.transpose(0, 1)  # [T + 1, B, OBS]: the rollout's layout
    truncated, terminated = torch.tensor(side["truncation"]).T > 0, torch.tensor(side["termination"]).T > 0
    with torch.no_grad():  # V(final observation) at the time-outs, as env_step stores it
        final_values = agent.value(TensorDict({"policy": obs[1:]}, [T, B])) * truncated
    data = TensorDict(
        {
            "obs": TensorDict({"policy": obs[:T]}, [T, B]),
            "actions": torch.tensor(side["raw_action"]).transpose(0, 1),
            "logprobs": torch.tensor(side["behaviour_log_prob"]).T,
            "rewards": torch.tensor(side["reward"]).T,
            "terminated": terminated,
            "truncated": truncated & ~terminated,
            "final_values": final_values,
        },
        [T, B],
    )
    next_obs = TensorDict({"policy": obs[T]}, [B])
    episodes = torch.zeros(3, dtype=torch.float64)
    batch, _, _ = ppo.targets(
        agent,
        RewardNormalizer(B, args.gamma),
        data,
        next_obs,
        None,
        torch.zeros(2, B, dtype=torch.float64),
        episodes,
        args,
    )
    noise = torch.tensor(side["noise"])  # brax's draw, [B, T, ACT] as the batch's unrolls hold it
    with mock.patch.object(torch, "randn_like", lambda x: noise.reshape(x.shape)):
        loss, logged = ppo.ppo_loss(agent, batch, args)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.adam_eps)
    optimizer.zero_grad()
    loss.backward()
    grads = {
        "actor": [p.grad.clone() for p in agent.actor.parameters()],
        "critic": [p.grad.clone() for p in agent.critic.parameters()],
    }
    for group in ppo.gradient_groups(agent, args):
        nn.utils.clip_grad_norm_(group, args.max_grad_norm)
    optimizer.step()
    return {
        "policy_loss": logged["policy_loss"].item(),
        "v_loss": args.vf_coef * logged["value_loss"].item(),
        "entropy_loss": -args.ent_coef * logged["entropy"].item(),
        "total_loss": loss.item(),
        "grads": grads,
        "stepped": {"actor": list(agent.actor.parameters()), "critic": list(agent.critic.parameters())},
    }


def flat(tree) -> list[np.ndarray]:
    """brax's parameters of one network in the Linear layers' order: weight (the kernel transposed), bias, ..."""
    dense = tree["params"]
    return [a for i in range(len(dense)) for a in (dense[f"hidden_{i}"]["kernel"].T, dense[f"hidden_{i}"]["bias"])]


def close(ours, theirs, what: str, rtol=2e-5, atol=2e-6) -> None:
    np.testing.assert_allclose(
        np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64), rtol, atol, err_msg=what
    )


# ----------------------------------------------------------------------------------------------
# The tests
# ----------------------------------------------------------------------------------------------
def test_brax_loss_terms_gradients_and_one_step_match_ours_at_float32_rounding(brax_side):
    ours = brax_update(brax_side, {})
    metrics = brax_side["metrics"]
    for term in ("policy_loss", "v_loss", "entropy_loss", "total_loss"):
        close(ours[term], metrics[term], term)
    close(ours["total_loss"], brax_side["loss"], "the loss brax differentiates")
    for net, theirs in (("actor", brax_side["grads"].policy), ("critic", brax_side["grads"].value)):
        for i, (g, t) in enumerate(zip(ours["grads"][net], flat(theirs), strict=True)):
            close(g.numpy(), t, f"{net} gradient {i}", rtol=1e-4, atol=1e-6)
    for net, theirs in (("actor", brax_side["stepped"].policy), ("critic", brax_side["stepped"].value)):
        for i, (p, t) in enumerate(zip(ours["stepped"][net], flat(theirs), strict=True)):
            close(p.detach().numpy(), t, f"{net} parameter {i} after one step")


@pytest.mark.parametrize("flag", sorted(PPO_DEFAULTS))
def test_each_difference_set_back_breaks_it(brax_side, flag):
    """Every flag of BRAX_FLAGS that differs from ppo.py's default changes the loss terms or the step: set back alone,
    something no longer matches brax's."""
    ours = brax_update(brax_side, {flag: PPO_DEFAULTS[flag]})
    if ours is None:  # brax's weights do not even fit ppo.py's networks (the critic's sizes)
        return
    metrics = brax_side["metrics"]
    differs = [
        term
        for term in ("policy_loss", "v_loss", "entropy_loss")
        if not np.isclose(ours[term], metrics[term], 2e-5, 2e-6)
    ]
    stepped = zip(
        [*ours["stepped"]["actor"], *ours["stepped"]["critic"]],
        [*flat(brax_side["stepped"].policy), *flat(brax_side["stepped"].value)],
    )
    differs += (
        ["step"]
        if any(p.shape != t.shape or not np.allclose(p.detach().numpy(), t, 2e-5, 2e-6) for p, t in stepped)
        else []
    )
    assert differs, f"--{flag.replace('_', '-')} {PPO_DEFAULTS[flag]} still matches brax's update"


def test_the_task_set_of_a_dm_control_task_sets_brax_update():
    """ppo.py's `task` set for a Playground DM Control task (its brax_ppo_config) sets every flag above: the update this
    file holds against brax's is the one a Playground user gets by the task's name (on CUDA, or with --settings task);
    brax's 30-step unrolls cut the 480 steps of its 2,048 envs' iteration."""
    from mujoco_playground.config import dm_control_suite_params

    from common.settings import translate_brax_ppo
    from tests.helpers import load_script

    ppo = load_script("ppo")
    config = dm_control_suite_params.brax_ppo_config("CartpoleBalance").to_dict()
    values, _ = translate_brax_ppo(config, set(ppo.Args.__dataclass_fields__), num_envs=2048)
    defaults = ppo.Args()
    for flag, value in BRAX_FLAGS.items():
        if flag != "unroll_length":  # the test's batch is one unroll per env; the config's 30 steps below
            assert values.get(flag, getattr(defaults, flag)) == value, (flag, values.get(flag))
    assert (values["num_steps"], values["unroll_length"], values["num_minibatches"]) == (480, 30, 32)
    assert values["obs_norm"] is True and values["reward_norm"] is False
