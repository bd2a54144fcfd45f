"""MinAtar's Space Invaders (the `minatar` package's environments/space_invaders.py) as a batched torch env:
SpaceInvaders."""

from __future__ import annotations

import torch

from common.envs.minatar.base import MinAtarEnv


class SpaceInvaders(MinAtarEnv):
    """Space Invaders: shoot the aliens (+1 each) marching side to side and down, firing at the
    cannon; a new wave, faster, when all are shot; the episode ends when the cannon is hit or the
    aliens reach the bottom row."""

    env_id = "MinAtar/SpaceInvaders-v1"
    channels = ("cannon", "alien", "alien_left", "alien_right", "friendly_bullet", "enemy_bullet")
    minimal_actions = ("n", "l", "r", "f")
    fields = (
        ("pos", 1),
        ("alien_dir", 1),
        ("move_interval", 1),
        ("move_timer", 1),
        ("shot_timer_aliens", 1),
        ("ramp_index", 1),
        ("shot_timer", 1),
        ("f_bullets", 100),
        ("e_bullets", 100),
        ("aliens", 100),
    )
    shot_cool_down, enemy_move_interval, enemy_shot_interval = 5, 12, 10  # the package's constants

    def _new_game(self, u, n):
        aliens = torch.zeros(n, 10, 10, dtype=torch.int64, device=self.device)
        aliens[:, 0:4, 2:8].fill_(1)
        return self.pack(
            n,
            pos=5,
            alien_dir=-1,
            move_interval=self.enemy_move_interval,
            move_timer=self.enemy_move_interval,
            shot_timer_aliens=self.enemy_shot_interval,
            ramp_index=0,
            shot_timer=0,
            aliens=aliens,
        )

    def _game_step(self, state, a, u):
        n = len(state)
        col = lambda name: self.col(state, name)  # noqa: E731
        grid = lambda name: col(name).reshape(n, 10, 10)  # noqa: E731
        pos, shot_timer = col("pos"), col("shot_timer")
        f_bullets, e_bullets, aliens = grid("f_bullets").clone(), grid("e_bullets"), grid("aliens")
        rows = torch.arange(n, device=self.device)
        fire = (a == 5) & (shot_timer == 0)
        f_bullets[rows, 9, pos] |= fire.long()
        shot_timer = torch.where(fire, self.shot_cool_down, shot_timer)
        pos = torch.where(a == 1, (pos - 1).clamp(min=0), torch.where(a == 3, (pos + 1).clamp(max=9), pos))
        # Bullets: friendly ones up a row, enemy ones down a row (np.roll, then the wrapped row cleared).
        f_bullets = f_bullets.roll(-1, 1)
        f_bullets[:, 9].fill_(0)
        e_bullets = e_bullets.roll(1, 1)
        e_bullets[:, 0].fill_(0)
        terminated = (e_bullets[rows, 9, pos] == 1) | (aliens[rows, 9, pos] == 1)
        # Aliens: when their timer is up, down a row at the edge they walk to (turning), else a column on.
        direction, move_interval, move_timer = col("alien_dir"), col("move_interval"), col("move_timer")
        move = move_timer == 0
        count = aliens.sum((1, 2))
        move_timer = torch.where(move, torch.minimum(count, move_interval), move_timer)
        at_edge = ((aliens[:, :, 0].sum(1) > 0) & (direction < 0)) | ((aliens[:, :, 9].sum(1) > 0) & (direction > 0))
        down, sideways = move & at_edge, move & ~at_edge
        terminated |= down & (aliens[:, 9].sum(1) > 0)
        direction = torch.where(down, -direction, direction)
        aliens = torch.where(
            down[:, None, None],
            aliens.roll(1, 1),
            torch.where(
                (sideways & (direction > 0))[:, None, None],
                aliens.roll(1, 2),
                torch.where(sideways[:, None, None], aliens.roll(-1, 2), aliens),
            ),
        )
        terminated |= move & (aliens[rows, 9, pos] == 1)
        # The alien nearest the cannon shoots: the nearest column with aliens (the left one of two
        # as near), from its lowest alien.
        shoot_timer = col("shot_timer_aliens")
        shoot = shoot_timer == 0
        shoot_timer = torch.where(shoot, self.enemy_shot_interval, shoot_timer)
        columns = torch.arange(10, device=self.device)
        occupied = aliens.sum(1) > 0
        order = ((columns - pos[:, None]).abs() * 2 + (columns > pos[:, None])).masked_fill(~occupied, 100)
        nearest = order.argmin(1)
        lowest = (aliens[rows, :, nearest] * columns).argmax(1)
        e_bullets = e_bullets.clone()
        e_bullets[rows, lowest, nearest] |= shoot.long()
        # Bullets that meet aliens take them out.
        kills = (aliens == 1) & (f_bullets == 1)
        reward = kills.sum((1, 2))
        aliens, f_bullets = aliens * ~kills, f_bullets * ~kills
        shot_timer = shot_timer - (shot_timer > 0).long()
        # A cleared wave: the next one, a step faster (down to one move every 6 steps) with the ramp.
        cleared = aliens.sum((1, 2)) == 0
        faster = cleared & (move_interval > 6) & self.difficulty_ramping
        aliens[:, 0:4, 2:8] |= cleared[:, None, None].long()
        return (
            self.pack(
                n,
                pos=pos,
                alien_dir=direction,
                move_interval=move_interval - faster.long(),
                move_timer=move_timer - 1,
                shot_timer_aliens=shoot_timer - 1,
                ramp_index=col("ramp_index") + faster.long(),
                shot_timer=shot_timer,
                f_bullets=f_bullets,
                e_bullets=e_bullets,
                aliens=aliens,
            ),
            reward,
            terminated,
        )

    def _observe(self, state):
        n = len(state)
        col = lambda name: self.col(state, name)  # noqa: E731
        image = self._image(n)
        aliens = col("aliens").to(torch.uint8) * 255
        left = (col("alien_dir") < 0).to(torch.uint8)[:, None]
        image[:, 100:200] = aliens
        image[:, 200:300] = aliens * left
        image[:, 300:400] = aliens * (1 - left)
        image[:, 400:500] = col("f_bullets").to(torch.uint8) * 255
        image[:, 500:600] = col("e_bullets").to(torch.uint8) * 255
        self._put(image, "cannon", torch.full_like(col("pos"), 9), col("pos"))
        return self._frame(image)
