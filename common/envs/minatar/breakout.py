"""MinAtar's Breakout (the `minatar` package's environments/breakout.py) as a batched torch env: Breakout."""

from __future__ import annotations

import torch

from common.envs.minatar.base import MinAtarEnv


class Breakout(MinAtarEnv):
    """Breakout: bounce the ball off the paddle to break three rows of bricks (+1 a brick); the ball
    travels on diagonals; cleared rows come back; the episode ends when the ball reaches the bottom."""

    env_id = "MinAtar/Breakout-v1"
    channels = ("paddle", "ball", "trail", "brick")
    minimal_actions = ("n", "l", "r")
    fields = (
        ("ball_x", 1),
        ("ball_y", 1),
        ("ball_dir", 1),
        ("pos", 1),
        ("strike", 1),
        ("last_x", 1),
        ("last_y", 1),
        ("bricks", 100),
    )
    reset_lanes = 1  # randint(2): which side the ball starts from
    # Directions 0-3: up-left, up-right, down-right, down-left; the package's direction changes.
    tables = dict(dx=(-1, 1, 1, -1), dy=(-1, -1, 1, 1), flip_x=(1, 0, 3, 2), flip_y=(3, 2, 1, 0), back=(2, 3, 0, 1))

    def _setup(self):
        # The two start states, by the package's ball_start: (x, dir) = [(0, 2), (9, 3)][start].
        right = torch.arange(2, device=self.device)
        bricks = torch.zeros(2, 10, 10, dtype=torch.int64, device=self.device)
        bricks[:, 1:4].fill_(1)
        self._starts = self.pack(
            2,
            ball_x=9 * right,
            ball_y=3,
            ball_dir=2 + right,
            pos=4,
            strike=0,
            last_x=9 * right,
            last_y=3,
            bricks=bricks,
        )

    def _new_game(self, u, n):
        return self._starts[(u[:, 0] * 2).floor().long()]

    def _game_step(self, state, a, u):
        col = lambda name: self.col(state, name)  # noqa: E731
        pos = col("pos")
        pos = torch.where(a == 1, (pos - 1).clamp(min=0), torch.where(a == 3, (pos + 1).clamp(max=9), pos))
        last_x, last_y, direction = col("ball_x"), col("ball_y"), col("ball_dir")
        new_x = last_x + self.lookup("dx", direction)
        new_y = last_y + self.lookup("dy", direction)
        # Side walls: clamp and reflect horizontally.
        side = (new_x < 0) | (new_x > 9)
        new_x = new_x.clamp(0, 9)
        direction = torch.where(side, self.lookup("flip_x", direction), direction)
        # Then one of: the top wall, a brick, the bottom row (paddle or loss), as the package's elif chain.
        top = new_y < 0
        new_y = new_y.clamp(min=0)
        direction = torch.where(top, self.lookup("flip_y", direction), direction)
        bricks = state[:, self.columns["bricks"]].clone()
        cell = (new_y * 10 + new_x)[:, None]
        brick = ~top & (bricks.gather(1, cell)[:, 0] == 1)
        breaks = brick & (col("strike") == 0)  # a ball still inside a brick it just broke breaks no other
        bricks.scatter_(1, cell, bricks.gather(1, cell) * ~breaks[:, None])
        new_y = torch.where(breaks, last_y, new_y)
        direction = torch.where(breaks, self.lookup("flip_y", direction), direction)
        bottom = ~top & ~brick & (new_y == 9)
        refill = bottom & (bricks.sum(1) == 0)
        bricks[:, 10:40] |= refill[:, None].long()
        paddle_old = bottom & (last_x == pos)  # the ball was above the paddle: straight back up
        paddle_new = bottom & ~paddle_old & (new_x == pos)  # the ball lands on it: back the way it came
        direction = torch.where(
            paddle_old,
            self.lookup("flip_y", direction),
            torch.where(paddle_new, self.lookup("back", direction), direction),
        )
        new_y = torch.where(paddle_old | paddle_new, last_y, new_y)
        terminated = bottom & ~paddle_old & ~paddle_new

        next_state = self.pack(
            len(state),
            ball_x=new_x,
            ball_y=new_y,
            ball_dir=direction,
            pos=pos,
            strike=brick,
            last_x=last_x,
            last_y=last_y,
            bricks=bricks,
        )
        return next_state, breaks.long(), terminated

    def _observe(self, state):
        col = lambda name: self.col(state, name)  # noqa: E731
        n = len(state)
        image = self._image(n)
        image[:, 300:400] = col("bricks").to(torch.uint8) * 255
        self._put(image, "ball", col("ball_y"), col("ball_x"))
        self._put(image, "paddle", torch.full_like(col("pos"), 9), col("pos"))
        self._put(image, "trail", col("last_y"), col("last_x"))
        return self._frame(image)
