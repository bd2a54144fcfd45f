"""brax's PPO update, the one Playground's `learning/train_jax_ppo.py` trains its tasks with (a DM Control task's `task`
set is its `brax_ppo_config`), on one fixed batch with fixed weights: brax's own loss (`brax.training.agents.ppo.losses.
compute_ppo_loss` with the networks of `ppo.networks.make_ppo_networks`), its gradients and one step of its optimizer,
against ours, term by term, at float32 rounding. docs/playground.md's table says what maps to what.

Ours is `brax_update` below: what ppo.py computes with the flags that make its update brax's (BRAX_FLAGS), written here
as the script will hold it. Where one of them is set back to ppo.py's default, the numbers part
(test_each_difference_set_back_breaks_it): each is a difference, not a detail. Marked `playground`: brax comes with
Playground's extra (the playground lane)."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

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
    adv_norm="minibatch-population",  # (A - mean) / (std + 1e-8) over the minibatch, jnp.std's ddof 0
    vf_coef=0.5,  # brax's 0.5 * vf_loss_coefficient (0.5) * (vs - V)^2, ours 0.5 * vf_coef * (R - V)^2
    clip_vloss=False,  # clipping_epsilon_value=None (at the rollout's own weights, as here, the clip changes nothing)
    clip_coef=0.3,
    ent_coef=0.01,
    gamma=0.995,
    gae_lambda=0.95,
    max_grad_norm=None,  # DM Control configs have no max_grad_norm: no clip
    adam_eps=1e-8,  # optax.adam's
)
# ppo.py's defaults for the same flags: each set back alone must break the match
PPO_DEFAULTS = dict(
    policy_dist="gaussian",
    entropy="analytic",
    reward_scale=1.0,
    gae="rollout",
    adv_norm="minibatch",
    vf_coef=1.0,
    clip_coef=0.2,
    max_grad_norm=1.0,
    adam_eps=1e-5,
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
# Ours: ppo.py's update with the brax flags, as the script computes it
# ----------------------------------------------------------------------------------------------
def mlp(sizes: tuple[int, ...], out: int, activation: str) -> nn.Sequential:
    layers, last = [], OBS
    for width in sizes:
        layers += [nn.Linear(last, width), {"silu": nn.SiLU, "tanh": nn.Tanh, "elu": nn.ELU}[activation]()]
        last = width
    return nn.Sequential(*layers, nn.Linear(last, out))


def load_flax(net: nn.Sequential, flax_params: dict) -> None:
    """brax's Dense layers hidden_0.. (kernel [in, out]) into the Linear layers (weight [out, in])."""
    linears = [m for m in net if isinstance(m, nn.Linear)]
    dense = flax_params["params"]
    assert len(linears) == len(dense), (len(linears), list(dense))
    with torch.no_grad():
        for i, layer in enumerate(linears):
            layer.weight.copy_(torch.from_numpy(np.asarray(dense[f"hidden_{i}"]["kernel"]).T.copy()))
            layer.bias.copy_(torch.from_numpy(np.asarray(dense[f"hidden_{i}"]["bias"]).copy()))


def log_det_tanh(x: torch.Tensor) -> torch.Tensor:
    """log |d tanh(x) / dx|, as brax's TanhBijector computes it (stable for large |x|)."""
    return 2.0 * (math.log(2.0) - x - F.softplus(-2.0 * x))


def gae_in_unrolls(rewards, values, bootstrap, termination, truncation, gamma: float, lam: float):
    """GAE over [B, T] unrolls as brax's compute_gae: a termination ends the future, a time-out's step is masked out
    (no advantage, no value target of its own, the chain cut), the unroll's end bootstrapped with V(next obs)."""
    mask = 1.0 - truncation
    next_values = torch.cat([values[:, 1:], bootstrap[:, None]], 1)
    deltas = (rewards + gamma * (1.0 - termination) * next_values - values) * mask
    acc, vs_minus_v = torch.zeros_like(bootstrap), torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        acc = deltas[:, t] + gamma * (1.0 - termination[:, t]) * mask[:, t] * lam * acc
        vs_minus_v[:, t] = acc
    vs = vs_minus_v + values
    next_vs = torch.cat([vs[:, 1:], bootstrap[:, None]], 1)
    advantages = (rewards + gamma * (1.0 - termination) * next_vs - values) * mask
    return vs.detach(), advantages.detach()


def brax_update(side: dict, flags: dict) -> dict:
    """ppo.py's loss of the batch with `flags`, its gradients and one Adam step, from brax's weights and normalizer."""
    flags = {**BRAX_FLAGS, **flags}
    tanh_normal = flags["policy_dist"] == "tanh-normal"
    actor = mlp(flags["hidden_sizes"], 2 * ACT if tanh_normal else ACT, flags["activation"])
    critic = mlp(flags["critic_hidden_sizes"], 1, flags["activation"])
    load_flax(critic, side["params"].value)
    log_std = nn.Parameter(torch.zeros(ACT))  # the Gaussian's state-independent std (ppo.py's default)
    if tanh_normal:
        load_flax(actor, side["params"].policy)
    else:  # brax's policy's loc half as the mean
        load_flax_half(actor, side["params"].policy)
    params = [*actor.parameters(), *critic.parameters(), *([] if tanh_normal else [log_std])]
    mean, std = torch.tensor(side["mean"]), torch.tensor(side["std"])
    obs_n = (torch.from_numpy(side["obs"]) - mean) / std  # brax's normalize: no clip
    raw = torch.from_numpy(side["raw_action"])
    rewards = torch.from_numpy(side["reward"]) * flags["reward_scale"]
    termination, truncation = torch.from_numpy(side["termination"]), torch.from_numpy(side["truncation"])

    out = actor(obs_n[:, :T])
    values = critic(obs_n[:, :T]).squeeze(-1)
    bootstrap = critic(obs_n[:, T]).squeeze(-1)
    if tanh_normal:
        loc, scale = out.chunk(2, -1)
        scale = F.softplus(scale) + 0.001  # NormalTanhDistribution's min_std
        dist = torch.distributions.Normal(loc, scale, validate_args=False)
        logprob = (dist.log_prob(raw) - log_det_tanh(raw)).sum(-1)
        entropy = dist.entropy()
        if flags["entropy"] == "sampled":  # brax's: plus the log-det-Jacobian at a sample of the Gaussian
            entropy = entropy + log_det_tanh(loc + scale * torch.from_numpy(side["noise"]))
        entropy = entropy.sum(-1)
    else:  # ppo.py's Gaussian of the clipped action, its analytic entropy
        dist = torch.distributions.Normal(out, log_std.exp().expand_as(out), validate_args=False)
        logprob, entropy = dist.log_prob(torch.tanh(raw)).sum(-1), dist.entropy().sum(-1)
    if flags["gae"] == "in-loss":
        returns, advantages = gae_in_unrolls(
            rewards, values, bootstrap, termination, truncation, flags["gamma"], flags["gae_lambda"]
        )
    else:  # ppo.py's: a time-out bootstrapped with V(final obs) (here the next obs), its step kept
        returns, advantages = rollout_gae(rewards, values, bootstrap, obs_n, critic, termination, truncation, flags)
    if flags["adv_norm"] == "minibatch-population":
        advantages = (advantages - advantages.mean()) / (advantages.std(correction=0) + 1e-8)
    else:  # ppo.py's minibatch normalization: torch's unbiased std
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    ratio = (logprob - torch.from_numpy(side["behaviour_log_prob"])).exp()
    clip = flags["clip_coef"]
    policy_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip, 1 + clip)).mean()
    if flags["clip_vloss"]:  # around the rollout's values: here the same weights, so the clip only bounds
        v_clipped = values.detach() + (values - values.detach()).clamp(-clip, clip)
        v_loss = 0.5 * torch.max((values - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((values - returns) ** 2).mean()
    entropy_loss = -flags["ent_coef"] * entropy.mean()
    loss = policy_loss + flags["vf_coef"] * v_loss + entropy_loss
    optimizer = torch.optim.Adam(params, lr=CONFIG["learning_rate"], eps=flags["adam_eps"])
    optimizer.zero_grad()
    loss.backward()
    grads = {
        "actor": [p.grad.clone() for p in actor.parameters()],
        "critic": [p.grad.clone() for p in critic.parameters()],
    }
    if flags["max_grad_norm"] is not None:
        nn.utils.clip_grad_norm_(params, flags["max_grad_norm"])
    optimizer.step()
    return {
        "policy_loss": policy_loss.item(),
        "v_loss": (flags["vf_coef"] * v_loss).item(),
        "entropy_loss": entropy_loss.item(),
        "total_loss": loss.item(),
        "grads": grads,
        "stepped": {"actor": [p.detach().clone() for p in actor.parameters()], "critic": list(critic.parameters())},
    }


def load_flax_half(net: nn.Sequential, flax_params: dict) -> None:
    """brax's policy into an actor of ACT outputs: its last layer's loc half (the Gaussian's mean)."""
    linears = [m for m in net if isinstance(m, nn.Linear)]
    dense = flax_params["params"]
    with torch.no_grad():
        for i, layer in enumerate(linears):
            kernel, bias = np.asarray(dense[f"hidden_{i}"]["kernel"]), np.asarray(dense[f"hidden_{i}"]["bias"])
            if i == len(linears) - 1:
                kernel, bias = kernel[:, :ACT], bias[:ACT]
            layer.weight.copy_(torch.from_numpy(kernel.T.copy()))
            layer.bias.copy_(torch.from_numpy(bias.copy()))


def rollout_gae(rewards, values, bootstrap, obs_n, critic, termination, truncation, flags):
    """ppo.py's GAE of the rollout (common to all minibatches, from the rollout's values): a time-out's reward gets
    gamma * V(its final observation), the chain stops there."""
    from tests.helpers import load_script

    ppo = load_script("ppo")
    with torch.no_grad():
        final_values = torch.where(truncation > 0, critic(obs_n[:, 1:]).squeeze(-1), torch.zeros_like(values))
        advantages, returns = ppo.compute_advantages(
            rewards.T,
            values.detach().T,
            bootstrap.detach(),
            final_values.T,
            (termination > 0).T,
            (truncation > 0).T,
            flags["gamma"],
            flags["gae_lambda"],
        )
    return returns.T, advantages.T


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
