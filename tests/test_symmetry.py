"""Mirror symmetry of the built-in envs (common/envs/classic.py, MirrorSymmetric): the mirror is its own
inverse, the dynamics commute with it over random states, and `data_augmentation` keeps rsl_rl's contract.
Then ppo.py's --symmetry on it: the augmented minibatch, the mirror loss, the symmetry error, training."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from tensordict import TensorDict

from common.envs import make_env
from common.normalize import RewardNormalizer
from common.symmetry import env_mirror, mirror_images, output_mirror
from tests.helpers import load_script, run_main

MASKED = {"mask_velocity": True}
# env id, constructor options, and the ranges random states are drawn from (wider than the initial states: the
# symmetry has to hold wherever an episode can go, up to the termination bounds and the speed limits)
SYMMETRIC = [
    ("CartPole-v1", {}, [(-2.4, 2.4), (-3.0, 3.0), (-0.21, 0.21), (-3.0, 3.0)]),
    ("CartPole-v1", MASKED, [(-2.4, 2.4), (-3.0, 3.0), (-0.21, 0.21), (-3.0, 3.0)]),
    ("Pendulum-v1", {}, [(-3 * math.pi, 3 * math.pi), (-8.0, 8.0)]),
    ("Pendulum-v1", MASKED, [(-3 * math.pi, 3 * math.pi), (-8.0, 8.0)]),
    (
        "Acrobot-v1",
        {},
        [(-math.pi, math.pi), (-math.pi, math.pi), (-4 * math.pi, 4 * math.pi), (-9 * math.pi, 9 * math.pi)],
    ),
]
IDS = [f"{env_id}{'-masked' if kwargs else ''}" for env_id, kwargs, _ in SYMMETRIC]
N = 4096


def random_states(ranges, generator) -> torch.Tensor:
    low, high = (torch.tensor(r, dtype=torch.float64) for r in zip(*ranges))
    return low + (high - low) * torch.rand(N, len(ranges), dtype=torch.float64, generator=generator)


def random_actions(env, generator) -> torch.Tensor:
    space = env.single_action_space
    if hasattr(space, "n"):
        return torch.randint(int(space.n), (N,), generator=generator)
    low, high = float(space.low[0]), float(space.high[0])
    # beyond the bounds too: the env clips a torque, and the mirror must commute with the clip
    return 1.5 * (low + (high - low) * torch.rand(N, 1, dtype=torch.float64, generator=generator))


def step_from(env, state: torch.Tensor, action: torch.Tensor):
    """One step of `env` from `state` (fresh episodes: no time limit in the way); the true next observation
    (info["final_obs"], valid on every row), the reward, termination and the next physical state."""
    env.reset()
    env.state.copy_(state)
    _, reward, terminated, truncated, info = env.step(action)
    assert not truncated.any()
    return info["final_obs"], reward, terminated


def assert_commutes(env, mirror_env, state, action, mirror_state, mirror_obs, mirror_action):
    obs, reward, terminated = step_from(env, state, action)
    m_obs, m_reward, m_terminated = step_from(mirror_env, mirror_state(state), mirror_action(action))
    assert torch.equal(terminated, m_terminated)
    torch.testing.assert_close(m_reward, reward, rtol=1e-12, atol=1e-12)
    for group in obs.keys():
        torch.testing.assert_close(m_obs[group], mirror_obs(obs)[group], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(("env_id", "kwargs", "ranges"), SYMMETRIC, ids=IDS)
def test_mirror_is_its_own_inverse(env_id, kwargs, ranges):
    env = make_env(env_id, N, seed=1, dtype=torch.float64, **kwargs)
    g = torch.Generator().manual_seed(0)
    state, action = random_states(ranges, g), random_actions(env, g)
    env.reset()
    env.state.copy_(state)
    obs = env.step(action)[4]["final_obs"]
    assert not torch.equal(env.mirror_state(state), state)  # a mirror that moves the states it is tested on
    assert torch.equal(env.mirror_state(env.mirror_state(state)), state)
    assert torch.equal(env.mirror_action(env.mirror_action(action)), action)
    twice = env.mirror_obs(env.mirror_obs(obs))
    assert twice.keys() == obs.keys() == ({"policy", "critic"} if kwargs else {"policy"})
    for group in obs.keys():
        assert torch.equal(twice[group], obs[group])


@pytest.mark.parametrize(("env_id", "kwargs", "ranges"), SYMMETRIC, ids=IDS)
def test_dynamics_commute_with_the_mirror(env_id, kwargs, ranges):
    """step(mirror(s), mirror(a)) = mirror(step(s, a)): next observation (every group), reward and termination, in
    float64 over random states and actions."""
    env, mirror_env = (make_env(env_id, N, seed=1, dtype=torch.float64, **kwargs) for _ in range(2))
    g = torch.Generator().manual_seed(1)
    state, action = random_states(ranges, g), random_actions(env, g)
    assert_commutes(env, mirror_env, state, action, env.mirror_state, env.mirror_obs, env.mirror_action)
    if env_id == "CartPole-v1":  # the states reach the failure bounds: both sides of termination were compared
        terminated = step_from(env, state, action)[2]
        assert terminated.any() and not terminated.all()


def test_a_wrong_mirror_is_caught():
    """The commutation check fails for a mirror that is almost right: CartPole with the pole's angular rate
    left unflipped, and with push left and right not swapped."""
    env, mirror_env = (make_env("CartPole-v1", N, seed=1, dtype=torch.float64) for _ in range(2))
    g = torch.Generator().manual_seed(2)
    state, action = random_states(SYMMETRIC[0][2], g), random_actions(env, g)
    signs = torch.tensor([-1.0, -1.0, -1.0, 1.0], dtype=torch.float64)

    def wrong_obs(obs):
        return obs.apply(lambda x: x * signs)

    with pytest.raises(AssertionError):
        assert_commutes(env, mirror_env, state, action, lambda s: s * signs, wrong_obs, env.mirror_action)
    with pytest.raises(AssertionError):
        assert_commutes(env, mirror_env, state, action, env.mirror_state, env.mirror_obs, lambda a: a)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_data_augmentation_is_rsl_rls_contract(env_id):
    """Originals first, then their mirror images along dim 0, for a [B] or [T, N] batch; None stays None."""
    env = make_env(env_id, 8, seed=3, **MASKED)
    obs, _ = env.reset()
    action = torch.stack([torch.as_tensor(env.single_action_space.sample()) for _ in range(8)])
    aug_obs, aug_action = env.data_augmentation(obs=obs, actions=action)
    assert aug_obs.batch_size == (16,) and aug_action.shape[0] == 16
    for group in ("policy", "critic"):
        assert torch.equal(aug_obs[group][:8], obs[group])
        assert torch.equal(aug_obs[group][8:], env.mirror_obs(obs)[group])
    assert torch.equal(aug_action[8:], env.mirror_action(action))
    assert env.data_augmentation(obs=None, actions=action)[0] is None
    assert env.data_augmentation(obs=obs, actions=None)[1] is None


# --- one mirror contract for every env kind (common/symmetry.py) -----------------------------------------------------
def rsl_rl_style_mirror(obs=None, actions=None):
    """A mirror written as rsl_rl's tasks write theirs, indexing rows: feature 1 of every group and action 0 change
    sign. Given a [T, N] batch as is, it would negate env 1 of every step instead (and env 0's actions)."""
    if obs is not None:
        image = obs.clone()
        for key in image.keys():
            image[key][:, 1] = -image[key][:, 1]
        obs = torch.cat([obs, image])
    if actions is not None:
        image = actions.clone()
        image[:, 0] = -image[:, 0]
        actions = torch.cat([actions, image])
    return obs, actions


class RowMirrored(gym.Env):
    """A gym env whose own mirror is rsl_rl_style_mirror (the gym adapter passes it on as is)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, shape=(7,), dtype=np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        return np.zeros(7, dtype=np.float32), {}

    def step(self, action):
        return np.zeros(7, dtype=np.float32), 0.0, False, False, {}

    def data_augmentation(self, obs=None, actions=None):
        return rsl_rl_style_mirror(obs, actions)


gym.register(id="TestRowMirrored-v0", entry_point=RowMirrored)


def env_with_rsl_rl_style_mirror(kind: str):
    if kind == "built-in":  # the attribute a built-in env's mirror is found by
        env = make_env("Pendulum-v1", 2)
        env.data_augmentation = rsl_rl_style_mirror
        return env
    if kind == "gym":
        return make_env("gym:TestRowMirrored-v0", 2)
    from common.envs.mjlab_adapter import ManagerBasedEnvAdapter
    from tests.fake_mjlab import FakeEnvCfg, FakeManagerBasedRlEnv

    def task_mirror(env, obs=None, actions=None):  # rsl_rl's signature; sees the task's group names ("actor")
        return rsl_rl_style_mirror(obs, actions)

    return ManagerBasedEnvAdapter(FakeManagerBasedRlEnv(FakeEnvCfg()), "fake", data_augmentation_func=task_mirror)


@pytest.mark.parametrize("kind", ["built-in", "gym", "mjlab"])
def test_an_rsl_rl_style_mirror_means_the_same_on_every_env_kind(kind):
    """A rollout's [T, N] batch through the env's mirror: the images are the rows with feature 1 negated, whatever
    the env kind (the function sees flat rows), each row's image beside it ([T, N, k-1])."""
    g = torch.Generator().manual_seed(4)
    obs = TensorDict({"policy": torch.randn(T, B, 7, generator=g)}, batch_size=[T, B])
    actions = torch.randn(T, B, 1, generator=g)
    images = mirror_images(env_with_rsl_rl_style_mirror(kind).data_augmentation, obs, actions)
    assert images.batch_size == (T, B, 1)
    expected = obs["policy"].clone()
    expected[..., 1] = -expected[..., 1]
    assert torch.equal(images["obs", "policy"][..., 0, :], expected)
    assert torch.equal(images["actions"][..., 0, :], -actions)


def test_the_built_in_mirror_keeps_the_contract_on_a_rollout():
    """The built-in mirror through mirror_images: each step's image beside it; the actor's outputs mirrored as
    actions (Box) or by the permutation of the actions (Discrete), in rsl_rl's order."""
    env = make_env("Pendulum-v1", B)
    obs = torch.stack([env.reset()[0]] * T)
    actions = torch.randn(T, B, 1)
    images = mirror_images(env.data_augmentation, obs, actions)
    assert torch.equal(images["obs"][:, :, 0]["policy"], env.mirror_obs(obs)["policy"])
    assert torch.equal(images["actions"][:, :, 0], -actions)
    assert torch.equal(output_mirror(env.data_augmentation, env.single_action_space, "cpu")(actions[0]), -actions[0])
    acrobot = make_env("Acrobot-v1", 1)  # torque -1 <-> +1: the logits of actions 0 and 2 swap places
    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])
    mirrored = output_mirror(acrobot.data_augmentation, acrobot.single_action_space, "cpu")(logits)
    assert mirrored.tolist() == [[2.0, 1.0, 0.0], [5.0, 4.0, 3.0]]


def test_a_mirror_that_breaks_the_contract_stops_the_run_in_one_line():
    """Checked once, before training: a mirror that leaves out the originals (or returns too few rows), and an env
    without one; --symmetry none asks for nothing."""
    env = make_env("Pendulum-v1", 4)
    obs, _ = env.reset()
    args = ppo.Args(env_id="Pendulum-v1", symmetry="log")
    assert env_mirror(env, obs, args) == env.data_augmentation
    env.data_augmentation = lambda obs=None, actions=None: (env.mirror_obs(obs), env.mirror_action(actions))
    refused = r"^error: --symmetry log: Pendulum-v1: its mirror \(data_augmentation\) returned observations of shape "
    with pytest.raises(SystemExit, match=refused + r"\[4\] for \[4\]; it must return the 4 rows given, then"):
        env_mirror(env, obs, args)
    assert env_mirror(env, obs, ppo.Args(symmetry="none")) is None
    with pytest.raises(SystemExit, match=r"^error: --symmetry log: MountainCar-v0 has no mirror"):
        env_mirror(make_env("MountainCar-v0", 4), obs, ppo.Args(env_id="MountainCar-v0", symmetry="log"))


def test_discrete_mirror_swaps_the_actions():
    assert make_env("CartPole-v1", 1).mirror_action(torch.tensor([0, 1])).tolist() == [1, 0]
    assert make_env("Acrobot-v1", 1).mirror_action(torch.tensor([0, 1, 2])).tolist() == [2, 1, 0]


@pytest.mark.parametrize("env_id", ["MountainCar-v0", "MountainCarContinuous-v0"])
def test_mountain_cars_declare_no_mirror(env_id):
    """Their wall and goal are not mirror images (classic.py's docstring): a script must find no mirror there."""
    assert getattr(make_env(env_id, 1), "data_augmentation", None) is None


# --- ppo.py --symmetry
# -------------------------------------------------------------------------------------------------
ppo = load_script("ppo")
T, B = 4, 8  # a rollout of T steps of B envs


def symmetric_batch(env_id: str, args, offset: float = 0.0, seed: int = 0, mirror=None):
    """targets() of a random [T, B] rollout (observations shifted by `offset`, so a normalizer that has seen them has
    a mean the mirror does not keep); the agent, the env, the flat batch, and the rollout's raw observations."""
    g = torch.Generator().manual_seed(seed)
    env = make_env(env_id, B, seed=1)
    agent = ppo.Agent(env.single_observation_space.shape[0], None, env.single_action_space, args)
    dim = env.single_observation_space.shape[0]
    obs = TensorDict({"policy": torch.randn(T, B, dim, generator=g) + offset}, batch_size=[T, B])
    if hasattr(env.single_action_space, "n"):
        actions = torch.randint(int(env.single_action_space.n), (T, B), generator=g)
    else:
        actions = torch.randn(T, B, 1, generator=g)
    agent.obs_rms.update(obs["policy"])
    data = TensorDict(
        {
            "obs": obs,
            "actions": actions,
            "logprobs": torch.randn(T, B, generator=g) - 1,
            "rewards": torch.randn(T, B, generator=g),
            "final_values": torch.zeros(T, B),
            "terminated": torch.zeros(T, B, dtype=torch.bool),
            "truncated": torch.zeros(T, B, dtype=torch.bool),
        },
        batch_size=[T, B],
    )
    before = agent.obs_rms(env.mirror_obs(obs)["policy"]), agent.obs_rms(obs["policy"])  # targets() updates obs_rms
    batch, _, _ = ppo.targets(
        agent,
        RewardNormalizer(B, 0.99),
        data,
        obs[-1],
        mirror or env.data_augmentation,
        torch.zeros(2, B, dtype=torch.float64),
        torch.zeros(3, dtype=torch.float64),
        args,
    )
    return agent, env, batch, before


def test_augmentation_adds_the_mirrored_minibatch_with_the_originals_old_values():
    """rsl_rl's augmentation: the actor and critic read the originals, then their mirror images (mirrored raw, then
    normalized: not the mirror image of the normalized observation, whose mean is not symmetric), the log-probs are
    of the mirrored actions, and the surrogate, value loss and KL are what the originals' old log-probs, values,
    advantages (normalized per minibatch before the images are added, as rsl_rl does) and returns, repeated, give:
    computed here by hand."""
    args = ppo.Args(symmetry="augmentation", hidden_sizes=(16,))
    agent, env, batch, (mirrored_n, original_n) = symmetric_batch("Pendulum-v1", args, offset=0.7)
    signs = env.mirror_obs(TensorDict({"policy": torch.ones(1, 3)}, batch_size=[1]))["policy"]
    assert not torch.allclose(mirrored_n, original_n * signs, atol=0.1)  # the test can tell the two apart
    torch.testing.assert_close(batch["mirrored", "obs_n", "policy"][:, 0], mirrored_n.reshape(-1, 3))
    torch.testing.assert_close(batch["mirrored", "actions"][:, 0], -batch["actions"])

    mb = batch[torch.randperm(T * B, generator=torch.Generator().manual_seed(0))[:B]]
    seen = {}
    log_prob_entropy, value = agent.log_prob_entropy, agent.value
    agent.log_prob_entropy = lambda out, actions: (
        seen.update(out=out, actions=actions) or log_prob_entropy(out, actions)
    )
    agent.value = lambda obs_n: seen.update(critic=obs_n["policy"]) or value(obs_n)
    _, logged = ppo.ppo_loss(agent, mb, args, output_mirror(env.data_augmentation, env.single_action_space, "cpu"))
    obs_n = torch.cat([mb["obs_n", "policy"], mb["mirrored", "obs_n", "policy"][:, 0]])
    assert seen["out"].shape[0] == seen["actions"].shape[0] == seen["critic"].shape[0] == 2 * B
    torch.testing.assert_close(seen["critic"], obs_n)
    torch.testing.assert_close(seen["out"], agent.actor(obs_n))
    torch.testing.assert_close(seen["actions"], torch.cat([mb["actions"], -mb["actions"]]))

    with torch.no_grad():
        d = torch.distributions.Normal(agent.actor(obs_n), agent.log_std.exp())
        logratio = d.log_prob(seen["actions"]).sum(-1) - mb["logprobs"].repeat(2)
        ratio, adv = logratio.exp(), mb["advantages"]
        adv = ((adv - adv.mean()) / (adv.std() + 1e-8)).repeat(2)  # the originals' statistics, as rsl_rl normalizes
        pg = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).mean()
        new_v, old_v, ret = (
            value(TensorDict({"policy": obs_n}, [2 * B])),
            mb["values"].repeat(2),
            mb["returns"].repeat(2),
        )
        v_loss = 0.5 * torch.max((new_v - ret) ** 2, (old_v + (new_v - old_v).clamp(-0.2, 0.2) - ret) ** 2).mean()
        kl = ((ratio[:B] - 1) - logratio[:B]).mean()  # of the originals only, as rsl_rl's schedule reads it
    torch.testing.assert_close(logged["policy_loss"], pg)
    torch.testing.assert_close(logged["value_loss"], v_loss)
    torch.testing.assert_close(logged["approx_kl"], kl)
    assert not torch.allclose(kl, ((ratio - 1) - logratio).mean())  # the mirrored half would have changed it


def pendulums_mirror_written_as_rsl_rl_does(obs=None, actions=None):
    """The built-in Pendulum's mirror, rows indexed: sin(theta) and its rate change sign, and the torque."""
    image, actions_image = obs.clone(), actions.clone()
    image["policy"][:, 1:] = -image["policy"][:, 1:]
    actions_image[:, 0] = -actions_image[:, 0]
    return torch.cat([obs, image]), torch.cat([actions, actions_image])


def test_the_targets_mirror_each_step_with_a_mirror_written_as_rsl_rl_does():
    """ppo.py's targets of a [T, N] rollout with the env's mirror and the same mirror written as rsl_rl's tasks write
    it (indexing rows): the same mirror images, each beside its step."""
    args = ppo.Args(symmetry="augmentation", hidden_sizes=(16,))
    batch = symmetric_batch("Pendulum-v1", args, offset=0.7)[2]
    rsl_rl_style = symmetric_batch("Pendulum-v1", args, offset=0.7, mirror=pendulums_mirror_written_as_rsl_rl_does)[2]
    for key in ("obs_n", "actions"):
        torch.testing.assert_close(rsl_rl_style["mirrored", key], batch["mirrored", key])


class Symmetrized(torch.nn.Module):
    """(f(s) + m(f(m(s)))) / 2, the mirror m of the observations by their signs and of the outputs by the env's own
    mirror_action: a signs vector for a Gaussian's mean, the permutation of the logits for discrete actions."""

    def __init__(self, f, env, dim):
        super().__init__()
        self.f, self.signs = f, env.mirror_obs(TensorDict({"policy": torch.ones(1, dim)}, batch_size=[1]))["policy"]
        space = env.single_action_space
        self.out = (
            (lambda o: o[:, env.mirror_action(torch.arange(int(space.n)))])
            if hasattr(space, "n")
            else (lambda o: o * env.mirror_action(torch.ones(1, 1)))
        )

    def forward(self, x):
        return (self.f(x) + self.out(self.f(x * self.signs))) / 2


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1", "Acrobot-v1"])
def test_mirror_loss_is_zero_for_a_symmetric_policy_and_positive_otherwise(env_id):
    """The same minibatch (under a normalizer whose mean is zero, the mirror of whose output is the output of the
    mirror): an actor made symmetric has mirror loss and symmetry error 0; the actor it was made from has both
    positive; mirror-loss adds mirror_loss_coef * the mirror loss to the loss, log adds nothing. The discrete
    envs' logits get a constant added in the symmetric actor: the same policy, still symmetric."""
    args = ppo.Args(symmetry="log", hidden_sizes=(16,), obs_norm=False)
    agent, env, batch, _ = symmetric_batch(env_id, args)
    mb = batch[:B]
    mirrored_output = output_mirror(env.data_augmentation, env.single_action_space, "cpu")
    asymmetric = agent.actor
    with torch.no_grad():  # out of the near-zero initial outputs (out_gain 0.01); biases, which start at zero: a
        asymmetric[-1].weight.mul_(100.0)  # tanh network without them is odd, and so symmetric where the mirror
        for layer in asymmetric.modules():  # negates every observation (CartPole)
            if isinstance(layer, torch.nn.Linear):
                layer.bias.normal_(generator=torch.Generator().manual_seed(1))
    losses = {}
    symmetric = Symmetrized(asymmetric, env, env.single_observation_space.shape[0])
    for name, actor in [("asymmetric", asymmetric), ("symmetric", symmetric)]:
        agent.actor = actor if name == "asymmetric" or not agent.discrete else torch.nn.Sequential(actor, Shift())
        for mode in ("log", "mirror-loss"):
            args.symmetry, args.mirror_loss_coef = mode, 3.0
            losses[name, mode] = ppo.ppo_loss(agent, mb, args, mirrored_output)
    (log_loss, logged), (mirror_loss, _) = losses["asymmetric", "log"], losses["asymmetric", "mirror-loss"]
    assert logged["mirror_loss"] > 1e-3 and logged["charts/symmetry_error"] > 1e-2, logged
    torch.testing.assert_close(mirror_loss - log_loss, 3.0 * logged["mirror_loss"])
    (log_loss, logged), (mirror_loss, _) = losses["symmetric", "log"], losses["symmetric", "mirror-loss"]
    assert logged["mirror_loss"] < 1e-12 and logged["charts/symmetry_error"] < 1e-6, logged
    torch.testing.assert_close(mirror_loss, log_loss)


class Shift(torch.nn.Module):
    def forward(self, logits):
        return logits + 5.0


def test_a_mirror_the_env_lacks_is_a_one_line_error(tmp_path):
    with pytest.raises(
        SystemExit, match=r"^error: --symmetry augmentation: MountainCar-v0 has no mirror \(data_augmentation\)"
    ):
        ppo.main(
            ppo.Args(
                env_id="MountainCar-v0",
                symmetry="augmentation",
                num_envs=4,
                num_steps=4,
                total_timesteps=16,
                output_dir=str(tmp_path),
                run_name="run",
                progress=False,
            )
        )
    assert not (tmp_path / "run").exists()  # stopped before anything was written


def last_errors(run_dir) -> float:
    from tests.test_scripts import scalars

    return sum(v for _, v in scalars(run_dir)["charts/symmetry_error"][-3:]) / 3


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
def test_augmentation_trains_a_symmetric_policy(env_id, tmp_path):
    """The same budget (seconds) with the symmetry only logged and with augmentation: trained on both halves, the
    policy ends near symmetric, its error (the last three logs, of the torque or the logits) under a quarter of
    the one trained without."""
    errors = {}
    for mode in ("log", "augmentation"):
        run_main(
            ppo,
            env_id=env_id,
            symmetry=mode,
            num_envs=64,
            num_steps=16,
            total_timesteps=64 * 16 * 24,
            log_interval=4,
            eval_interval=0,
            device="cpu",
            progress=False,
            output_dir=str(tmp_path),
            run_name=mode,
        )
        errors[mode] = last_errors(tmp_path / mode)
    assert errors["augmentation"] < 0.25 * errors["log"] and errors["augmentation"] < 0.15, errors
