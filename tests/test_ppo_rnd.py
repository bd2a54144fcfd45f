"""algos/ppo_rnd.py: the novelty RND measures, the intrinsic return's two heads, the weight schedule.

The run contract (resume with RND's state, compile parity, capture, logging) is tested for every script in
tests/test_scripts.py; whether RND reaches MountainCarContinuous-v0's goal is tests.benchmarks.learning's
experiment `ppo_rnd:MountainCarContinuous-v0` (minutes, not a test)."""

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDict

from common.normalize import RewardNormalizer
from tests.helpers import load_script

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
