"""A tiny image env for the tests of image observation groups: Catch (as bsuite's), batched in torch.

A ball falls from a random column of the top row, one row per step; the agent moves a paddle
on the bottom row left, not at all or right. When the ball reaches the bottom row the episode
terminates with reward +1 if the paddle is under it, -1 if not. The observation is the
"policy" group uint8 [N, 2, H, W] (channel 0 the ball, channel 1 the paddle, 0 or 255), so it
goes through an image encoder; with `proprio=True` a vector group "critic" [N, 2] (the ball's
column and the paddle's, scaled to [0, 1]) sits beside it, for an asymmetric critic. With `terms=True`
the "policy" group is a group of terms instead: "image" uint8 [N, 1, H, W], the ball alone, and
"proprio" [N, 1], the paddle's column (0 to H-1, unscaled: the normalizer scales it), and the paddle
starts in a random column, so that a policy must read both terms to catch every ball. With
`vector_policy=True` the groups swap kinds: "policy" is the columns [N, 2] (its space unbounded) and
"critic" the frames.

`register()` (a pytest fixture calls it) adds it to the built-in envs under CATCH, in this process only.
"""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict

from common.envs.core import TorchEnv

CATCH = "Catch-v0"


class Catch(TorchEnv):
    env_id = CATCH
    state_dim = 3  # ball column, ball row, paddle column
    num_reset_uniforms = 1
    default_max_episode_steps = 100

    def __init__(
        self,
        num_envs,
        device="cpu",
        seed=0,
        dtype=torch.float32,
        max_episode_steps=None,
        size: int = 6,
        proprio: bool = False,
        terms: bool = False,
        vector_policy: bool = False,
    ):
        self.size, self.proprio, self.terms, self.vector_policy = size, proprio, terms, vector_policy
        self.num_reset_uniforms = 2 if terms else 1  # the paddle's first column too
        self.single_observation_space = spaces.Box(0, 255, (2, size, size), dtype=np.uint8)
        if terms:
            self.single_observation_space = spaces.Dict(
                {
                    "image": spaces.Box(0, 255, (1, size, size), dtype=np.uint8),
                    "proprio": spaces.Box(0, size - 1, (1,), dtype=np.float32),
                }
            )
        if (
            vector_policy
        ):  # the columns for the policy (unbounded, as vector spaces often are), the frames for the critic
            self.single_observation_space = spaces.Box(-np.inf, np.inf, (2,), dtype=np.float32)
            self.single_critic_observation_space = spaces.Box(0, 255, (2, size, size), dtype=np.uint8)
        self.single_action_space = spaces.Discrete(3)
        super().__init__(num_envs, device, seed, dtype, max_episode_steps)
        self.cells = torch.arange(size, device=self.device)

    def _initial_state(self, u):
        ball = (u[:, 0] * self.size).floor()
        paddle = (u[:, 1] * self.size).floor() if self.terms else torch.full_like(ball, self.size // 2)
        return torch.stack([ball, torch.zeros_like(ball), paddle], dim=1)

    def _dynamics(self, state, action):
        paddle = (state[:, 2] + (action - 1).to(state.dtype)).clamp(0, self.size - 1)
        row = state[:, 1] + 1
        terminated = row >= self.size - 1
        caught = state[:, 0] == paddle
        reward = torch.where(terminated, torch.where(caught, 1.0, -1.0), 0.0).to(torch.float32)
        return torch.stack([state[:, 0], row, paddle], dim=1), reward, terminated

    def _observe(self, state):
        long = state.long()
        ball = (self.cells[:, None] == long[:, 1, None, None]) & (self.cells == long[:, 0, None, None])
        paddle = (self.cells[:, None] == self.size - 1) & (self.cells == long[:, 2, None, None])
        return torch.stack([ball, paddle], dim=1).to(torch.uint8) * 255

    def _wrap_obs(self, obs):
        groups = {"policy": obs}
        # positions read back from the frame, so that final_obs gets them too
        columns = obs.amax(2).to(torch.float32) @ self.cells.to(torch.float32) / 255  # [N, 2]: the ball's, the paddle's
        if self.terms:
            groups["policy"] = {"image": obs[:, :1], "proprio": columns[:, 1:]}
        if self.proprio:
            groups["critic"] = columns / self.size
        if self.vector_policy:
            groups = {"policy": columns / self.size, "critic": obs}
        return TensorDict(groups, batch_size=self._batch_size, device=self.device)


def register() -> None:
    import common.envs

    common.envs.BUILTIN_ENVS[CATCH] = Catch
