"""algos/ppo_rnd.py: the novelty RND measures, the intrinsic return's two heads, the weight schedule.

The run contract (resume with RND's state, compile parity, capture, logging) is tested for every script in
tests/test_scripts.py; whether RND reaches MountainCarContinuous-v0's goal is tests.benchmarks.learning's
experiment `ppo_rnd:MountainCarContinuous-v0` (minutes, not a test)."""

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDict

from common.envs import make_env
from common.normalize import RewardNormalizer
from common.symmetry import output_mirror
from tests.helpers import load_script, run_main
from tests.test_symmetry import Symmetrized

ppo_rnd = load_script("ppo_rnd")


def test_weight_schedule_is_rsl_rls():
    """constant; linear from the weight at initial_step to final_value at final_step (counted in steps of one env);
    equal steps switch at final_step (rsl_rl's "step" mode)."""
    constant = ppo_rnd.Args(rnd_weight=0.7)
    assert [ppo_rnd.rnd_weight_at(s, constant) for s in (0, 10**9)] == [0.7, 0.7]
    linear = ppo_rnd.Args(rnd_weight=1.0, rnd_weight_final=0.2, rnd_weight_steps=(100, 300))
    assert [ppo_rnd.rnd_weight_at(s, linear) for s in (0, 100, 200, 300, 10**6)] == pytest.approx(
        [1.0, 1.0, 0.6, 0.2, 0.2]
    )
    step = ppo_rnd.Args(rnd_weight=1.0, rnd_weight_final=0.0, rnd_weight_steps=(50, 50))
    assert [ppo_rnd.rnd_weight_at(s, step) for s in (0, 49, 50, 51)] == [1.0, 1.0, 0.0, 0.0]


def test_novelty_falls_on_visited_states_only():
    """The predictor trained on one region of the observation space: its error there falls tenfold, while on a region
    it never saw it stays high; that difference is the intrinsic reward."""
    torch.manual_seed(0)
    rnd = ppo_rnd.RND((2,), ppo_rnd.Args(), 255.0)
    visited = torch.randn(4096, 2) * 0.3 - 1.0
    unseen = torch.randn(4096, 2) * 0.3 + 1.5
    rnd.obs_rms.update(torch.cat([visited, unseen]))  # one normalization for both, as the rollouts give it
    obs = lambda x: TensorDict({"policy": x}, batch_size=[x.shape[0]])  # noqa: E731
    before = rnd.novelty(obs(visited), "policy").mean().item()
    optimizer = torch.optim.Adam(rnd.predictor.parameters(), lr=1e-3)
    for _ in range(300):
        loss = rnd.error(rnd.obs_rms(visited[torch.randint(4096, (256,))])).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        after, elsewhere = (rnd.novelty(obs(x), "policy").mean().item() for x in (visited, unseen))
    assert after < before / 10, (before, after)
    assert elsewhere > 5 * after, (after, elsewhere)
    assert not any(p.requires_grad for p in rnd.target.parameters())  # the target stays random


def test_intrinsic_return_runs_on_across_episode_ends():
    """An env that terminates at step 0: its extrinsic return is that step's reward, its intrinsic return goes on
    through the next episode's steps to the bootstrap (non-episodic); the advantage is A_ext + weight * A_int."""
    args = ppo_rnd.Args(
        reward_norm=False,
        rnd_reward_norm=False,
        obs_norm=False,
        rnd_state_norm=False,
        gamma=0.5,
        rnd_gamma=0.5,
        gae_lambda=1.0,
        adv_norm="none",
        hidden_sizes=(8,),
        rnd_hidden_sizes=(8,),
        rnd_target_hidden_sizes=(8,),
    )
    torch.manual_seed(1)
    T, N = 3, 2
    agent = ppo_rnd.Agent(2, None, gym.spaces.Box(-1.0, 1.0, (1,)), args)
    rnd = ppo_rnd.RND((2,), args, 255.0)
    terminated = torch.zeros(T, N, dtype=torch.bool)
    terminated[0, 0] = True
    data = TensorDict(
        {
            "obs": TensorDict({"policy": torch.randn(T, N, 2)}, batch_size=[T, N]),
            "rewards": torch.rand(T, N),
            "int_rewards": torch.rand(T, N),
            "terminated": terminated,
            "truncated": torch.zeros(T, N, dtype=torch.bool),
            "final_values": torch.zeros(T, N),
            "actions": torch.zeros(T, N, 1),
            "logprobs": torch.zeros(T, N),
        },
        batch_size=[T, N],
    )
    next_obs = TensorDict({"policy": torch.randn(N, 2)}, batch_size=[N])
    normalizers = (RewardNormalizer(N, args.gamma), RewardNormalizer(N, args.rnd_gamma))
    weight = torch.tensor(0.25)
    batch, _, charts, _ = ppo_rnd.targets(
        agent,
        rnd,
        normalizers,
        weight,
        data,
        next_obs,
        None,
        torch.zeros(2, N, dtype=torch.float64),
        torch.zeros(3, dtype=torch.float64),
        args,
    )
    returns, values = batch["returns"].reshape(T, N, 2), batch["values"].reshape(T, N, 2)
    with torch.no_grad():
        bootstrap = agent.value(TensorDict({"policy": next_obs["policy"]}, batch_size=[N]))[:, 1]
    r_int = data["int_rewards"]
    expected_int = r_int[0] + 0.5 * r_int[1] + 0.25 * r_int[2] + 0.125 * bootstrap  # lambda 1: the discounted sum
    torch.testing.assert_close(returns[0, :, 1], expected_int)
    torch.testing.assert_close(returns[0, 0, 0], data["rewards"][0, 0])  # the extrinsic return ends with its episode
    advantages = batch["advantages"].reshape(T, N)
    torch.testing.assert_close(
        advantages, (returns[..., 0] - values[..., 0]) + 0.25 * (returns[..., 1] - values[..., 1])
    )
    torch.testing.assert_close(charts["intrinsic_reward"], 0.25 * r_int.mean())


def test_an_absent_observation_group_is_a_one_line_error(tmp_path):
    with pytest.raises(SystemExit, match=r"^error: --rnd-obs-group critic: CartPole-v1 has only policy$"):
        ppo_rnd.main(
            ppo_rnd.Args(
                env_id="CartPole-v1",
                rnd_obs_group="critic",
                num_envs=4,
                num_steps=4,
                total_timesteps=16,
                output_dir=str(tmp_path),
                run_name="run",
                progress=False,
            )
        )
    assert not (tmp_path / "run").exists()  # stopped before anything was written


# --- --symmetry, as ppo.py's (tests/test_symmetry.py) ---------------------------------------------------------------
def rnd_minibatch(args, env_id="Pendulum-v1", T=4, N=8):
    """targets() of a random [T, N] rollout with the env's mirror, and its first N rows: the agent, env, minibatch."""
    g = torch.Generator().manual_seed(0)
    env = make_env(env_id, N, seed=1)
    agent = ppo_rnd.Agent(env.single_observation_space.shape[0], None, env.single_action_space, args)
    rnd = ppo_rnd.RND(env.single_observation_space.shape, args, 255.0)
    obs = TensorDict({"policy": torch.randn(T, N, env.single_observation_space.shape[0], generator=g)}, [T, N])
    discrete = hasattr(env.single_action_space, "n")
    data = TensorDict(
        {
            "obs": obs,
            "actions": torch.randint(2, (T, N), generator=g) if discrete else torch.randn(T, N, 1, generator=g),
            "logprobs": torch.randn(T, N, generator=g) - 1,
            "rewards": torch.randn(T, N, generator=g),
            "int_rewards": torch.rand(T, N, generator=g),
            "final_values": torch.zeros(T, N),
            "terminated": torch.zeros(T, N, dtype=torch.bool),
            "truncated": torch.zeros(T, N, dtype=torch.bool),
        },
        batch_size=[T, N],
    )
    normalizers = (RewardNormalizer(N, args.gamma), RewardNormalizer(N, args.rnd_gamma))
    zeros = torch.zeros(2, N, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    batch = ppo_rnd.targets(
        agent, rnd, normalizers, torch.tensor(0.5), data, obs[-1], env.data_augmentation, *zeros, args
    )
    return agent, env, batch[0][:N]


def test_symmetry_augmentation_adds_the_mirror_images_with_their_originals_old_values():
    """The actor reads the originals, then their mirror images, with the mirrored actions; both value heads read them
    against the originals' old values and returns; the KL and entropy are the originals'."""
    args = ppo_rnd.Args(symmetry="augmentation", hidden_sizes=(16,), adv_norm="none", clip_vloss=False)
    agent, env, mb = rnd_minibatch(args)
    seen, log_prob_entropy = {}, agent.log_prob_entropy
    agent.log_prob_entropy = lambda out, actions: (
        seen.update(out=out, actions=actions) or log_prob_entropy(out, actions)
    )
    _, logged = ppo_rnd.ppo_loss(agent, mb, args, output_mirror(env.data_augmentation, env.single_action_space, "cpu"))
    obs_n = torch.cat([mb["obs_n", "policy"], mb["mirrored", "obs_n", "policy"][:, 0]])
    torch.testing.assert_close(seen["out"], agent.actor(obs_n))
    torch.testing.assert_close(seen["actions"], torch.cat([mb["actions"], -mb["actions"]]))
    with torch.no_grad():
        new_v = agent.value(TensorDict({"policy": obs_n}, [obs_n.shape[0]]))
        v_loss = 0.5 * ((new_v - mb["returns"].repeat(2, 1)) ** 2).mean(0).sum()
        logratio = log_prob_entropy(agent.actor(obs_n), seen["actions"])[0][: mb.shape[0]] - mb["logprobs"]
    torch.testing.assert_close(logged["value_loss"], v_loss)
    torch.testing.assert_close(logged["approx_kl"], ((logratio.exp() - 1) - logratio).mean())


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
def test_mirror_loss_is_zero_for_a_symmetric_actor_and_weighed_in(env_id):
    """A symmetric actor (tests/test_symmetry.py's Symmetrized) has mirror loss and symmetry error 0, its asymmetric
    source both positive; --symmetry mirror-loss adds mirror_loss_coef times it to the loss, log nothing."""
    args = ppo_rnd.Args(symmetry="log", hidden_sizes=(16,), obs_norm=False)
    agent, env, mb = rnd_minibatch(args, env_id)
    mirrored_output = output_mirror(env.data_augmentation, env.single_action_space, "cpu")
    with torch.no_grad():  # out of the near-zero initial outputs, and biases: not odd, so not symmetric by chance
        agent.actor[-1].weight.mul_(100.0)
        for layer in agent.actor.modules():
            if isinstance(layer, torch.nn.Linear):
                layer.bias.normal_(generator=torch.Generator().manual_seed(1))
    symmetric = Symmetrized(agent.actor, env, env.single_observation_space.shape[0])
    for actor, positive in ((agent.actor, True), (symmetric, False)):
        agent.actor = actor
        args.symmetry, args.mirror_loss_coef = "log", 3.0
        log_loss, logged = ppo_rnd.ppo_loss(agent, mb, args, mirrored_output)
        args.symmetry = "mirror-loss"
        mirror_loss = ppo_rnd.ppo_loss(agent, mb, args, mirrored_output)[0]
        torch.testing.assert_close(mirror_loss - log_loss, 3.0 * logged["mirror_loss"])
        assert (logged["mirror_loss"] > 1e-3) == positive and (logged["charts/symmetry_error"] > 1e-3) == positive


def test_symmetry_runs_and_logs_and_an_env_without_a_mirror_is_refused(tmp_path):
    from tests.test_scripts import scalars

    flags = dict(num_envs=8, num_steps=8, num_minibatches=2, hidden_sizes=(16,), eval_interval=0, progress=False)
    flags.update(output_dir=str(tmp_path), device="cpu")
    summary = run_main(ppo_rnd, env_id="Pendulum-v1", symmetry="both", total_timesteps=128, run_name="run", **flags)
    logged = scalars(tmp_path / "run")
    assert len(logged["losses/mirror_loss"]) == len(logged["charts/symmetry_error"]) == summary["iteration"] == 2
    with pytest.raises(SystemExit, match=r"^error: --symmetry log: MountainCarContinuous-v0 has no mirror"):
        run_main(ppo_rnd, env_id="MountainCarContinuous-v0", symmetry="log", run_name="plain", **flags)


def test_symmetry_augmentation_trains_a_symmetric_policy(tmp_path):
    """ppo.py's test (tests/test_symmetry.py) with RND beside it: the same budget with the symmetry only logged and
    with augmentation; the augmented policy's symmetry error (the last three logs, of the torque) ends under a quarter
    of the other's."""
    from tests.test_symmetry import last_errors

    errors = {}
    for mode in ("log", "augmentation"):
        flags = dict(num_envs=64, num_steps=16, total_timesteps=64 * 16 * 24, log_interval=4, eval_interval=0)
        flags.update(device="cpu", progress=False, output_dir=str(tmp_path), run_name=mode)
        run_main(ppo_rnd, env_id="Pendulum-v1", symmetry=mode, **flags)
        errors[mode] = last_errors(tmp_path / mode)
    assert errors["augmentation"] < 0.25 * errors["log"] and errors["augmentation"] < 0.15, errors


def test_bf16_target_kl_and_the_linear_schedule_are_ppos(tmp_path):
    """ppo.py's flags, as ppo.py's: --target-kl with a target no update stays under runs one epoch per iteration (both
    Adams step once per minibatch); --lr-schedule linear anneals; --bf16 keeps the weights float32 (the
    statistics float64), finite."""
    from tests.test_scripts import scalars

    iterations, minibatches = 3, 2
    flags = dict(num_envs=16, num_steps=8, num_minibatches=minibatches, update_epochs=4, eval_interval=0)
    flags.update(device="cpu", progress=False, output_dir=str(tmp_path), run_name="run", hidden_sizes=(16,))
    summary = run_main(
        ppo_rnd,
        env_id="Pendulum-v1",
        bf16=True,
        target_kl=1e-12,
        lr_schedule="linear",
        total_timesteps=16 * 8 * 3,
        **flags,
    )
    state = torch.load(summary["checkpoints"]["last"], weights_only=True)
    for adam in ("adam", "rnd_adam"):
        assert int(state["optimizers"][adam]["state"][0]["step"]) == iterations * minibatches
    lrs = [value for _, value in scalars(tmp_path / "run")["charts/learning_rate"]]
    assert lrs == pytest.approx([1e-3 * (1 - i / iterations) for i in range(iterations)])
    weights = [v for v in state["model"].values() if v.is_floating_point()]
    assert all(v.dtype in (torch.float32, torch.float64) and torch.isfinite(v).all() for v in weights)


def test_a_shared_encoder_is_one_module_under_the_policy_and_both_value_heads(tmp_path, monkeypatch):
    """--shared-encoder as ppo.py's (tests/test_pixels.py): the critic's two heads sit on the actor's encoder, whose
    features the loss computes once, giving what the networks called apart give; a run on Catch keeps one encoder in
    its checkpoint; vector observations, with no encoder to share, are refused."""
    import common.envs
    from tests.pixel_env import CATCH, Catch

    args = ppo_rnd.Args(encoder="minatar", hidden_sizes=(), shared_encoder=True)
    agent = ppo_rnd.Agent((2, 6, 6), None, gym.spaces.Discrete(3), args)
    assert agent.critic[0] is agent.actor[0]
    g = torch.Generator().manual_seed(0)
    mb = TensorDict(
        {
            "obs_n": {"policy": torch.randint(0, 256, (16, 2, 6, 6), dtype=torch.uint8, generator=g)},
            "actions": torch.randint(0, 3, (16,), generator=g),
            "logprobs": torch.full((16,), -1.1),
            "values": torch.randn(16, 2, generator=g),
            "advantages": torch.randn(16, generator=g),
            "returns": torch.randn(16, 2, generator=g),
        },
        batch_size=[16],
        device="cpu",
    )
    loss, logged = ppo_rnd.ppo_loss(agent, mb, args)
    agent.shared_encoder = False  # the same module called twice, as separate networks are
    loss_apart, logged_apart = ppo_rnd.ppo_loss(agent, mb, args)
    torch.testing.assert_close(loss, loss_apart)
    torch.testing.assert_close(logged["value_loss"], logged_apart["value_loss"])

    monkeypatch.setitem(common.envs.BUILTIN_ENVS, CATCH, Catch)
    flags = dict(num_envs=8, num_steps=8, num_minibatches=2, total_timesteps=128, eval_interval=0, progress=False)
    flags.update(encoder="minatar", hidden_sizes=(), device="cpu", output_dir=str(tmp_path), run_name="run")
    run_main(ppo_rnd, env_id=CATCH, shared_encoder=True, **flags)
    model = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)["model"]
    torch.testing.assert_close(model["actor.0.convs.0.weight"], model["critic.0.convs.0.weight"])
    with pytest.raises(SystemExit, match="^error: --shared-encoder needs an image"):
        ppo_rnd.Agent(3, None, gym.spaces.Discrete(2), args)
