"""MinAtar's Asterix (the `minatar` package's environments/asterix.py) as a batched torch env: Asterix."""

from __future__ import annotations

import torch

from common.envs.minatar.base import MinAtarEnv


class Asterix(MinAtarEnv):
    """Asterix: move about the board to pick up gold (+1) and dodge the enemies that cross it row by
    row; both spawn, and move, faster as the game goes on; touching an enemy ends the episode."""

    env_id = "MinAtar/Asterix-v1"
    channels = ("player", "enemy", "trail", "gold")
    minimal_actions = ("n", "l", "u", "r", "d")
    fields = (
        ("player_x", 1),
        ("player_y", 1),
        ("spawn_speed", 1),
        ("spawn_timer", 1),
        ("move_speed", 1),
        ("move_timer", 1),
        ("ramp_timer", 1),
        ("ramp_index", 1),
        ("on", 8),
        ("x", 8),
        ("lr", 8),
        ("gold", 8),
    )  # the 8 entity slots (slot k runs along row k + 1)
    game_lanes = 3  # a spawn: rand() < 1/2 (from the left), rand() < 1/3 (gold), randint(free slots)
    ramp_interval, init_spawn_speed, init_move_interval = 100, 10, 5  # the package's constants

    def _new_game(self, u, n):
        return self.pack(
            n,
            player_x=5,
            player_y=5,
            spawn_speed=self.init_spawn_speed,
            spawn_timer=self.init_spawn_speed,
            move_speed=self.init_move_interval,
            move_timer=self.init_move_interval,
            ramp_timer=self.ramp_interval,
            ramp_index=0,
        )

    def _game_step(self, state, a, u):
        n = len(state)
        col = lambda name: self.col(state, name)  # noqa: E731
        on, x, lr, gold = (col(name).bool() if name != "x" else col(name) for name in ("on", "x", "lr", "gold"))
        # A spawn, when its timer is up: the side, the kind, then one of the free slots.
        spawn_speed, spawn_timer = col("spawn_speed"), col("spawn_timer")
        spawn = spawn_timer == 0
        spawn_timer = torch.where(spawn, spawn_speed, spawn_timer)
        free = ~on
        new_lr, new_gold = u[:, 0] < 1 / 2, u[:, 1] < 1 / 3
        pick = (u[:, 2] * free.sum(1)).floor().long()
        chosen = spawn[:, None] & free & (free.long().cumsum(1) - 1 == pick[:, None])
        on = on | chosen
        x = torch.where(chosen, torch.where(new_lr, 0, 9)[:, None], x)
        lr = torch.where(chosen, new_lr[:, None], lr)
        gold = torch.where(chosen, new_gold[:, None], gold)
        # The player's move.
        px, py = col("player_x"), col("player_y")
        px = torch.where(a == 1, (px - 1).clamp(min=0), torch.where(a == 3, (px + 1).clamp(max=9), px))
        py = torch.where(a == 2, (py - 1).clamp(min=1), torch.where(a == 4, (py + 1).clamp(max=8), py))
        rows = torch.arange(1, 9, device=self.device)
        player_row = rows == py[:, None]
        # Touches before the entities move, then after (when their timer is up); an entity that leaves
        # the board is gone.
        touch = on & player_row & (x == px[:, None])
        reward = (touch & gold).sum(1)
        terminated = (touch & ~gold).any(1)
        on = on & ~(touch & gold)
        move_speed, move_timer = col("move_speed"), col("move_timer")
        move = move_timer == 0
        move_timer = torch.where(move, move_speed, move_timer)
        x = torch.where(move[:, None] & on, x + torch.where(lr, 1, -1), x)
        on = on & ((x >= 0) & (x <= 9))
        touch = move[:, None] & on & player_row & (x == px[:, None])
        reward = reward + (touch & gold).sum(1)
        terminated = terminated | (touch & ~gold).any(1)
        on = on & ~(touch & gold)
        # The difficulty ramp: every ramp_interval + 1 steps, spawns one step more often, and moves too
        # every second time, down to every step.
        ramp_timer, ramp_index = col("ramp_timer"), col("ramp_index")
        ramping = ((spawn_speed > 1) | (move_speed > 1)) & self.difficulty_ramping
        wait = ramping & (ramp_timer >= 0)
        level_up = ramping & (ramp_timer < 0)
        move_speed = move_speed - (level_up & (move_speed > 1) & (ramp_index % 2 == 1)).long()
        spawn_speed = spawn_speed - (level_up & (spawn_speed > 1)).long()
        ramp_timer = torch.where(wait, ramp_timer - 1, torch.where(level_up, self.ramp_interval, ramp_timer))
        return (
            self.pack(
                n,
                player_x=px,
                player_y=py,
                spawn_speed=spawn_speed,
                spawn_timer=spawn_timer - 1,
                move_speed=move_speed,
                move_timer=move_timer - 1,
                ramp_timer=ramp_timer,
                ramp_index=ramp_index + level_up.long(),
                on=on,
                x=x * on,
                lr=lr & on,
                gold=gold & on,
            ),
            reward,
            terminated,
        )

    def _observe(self, state):
        n = len(state)
        col = lambda name: self.col(state, name)  # noqa: E731
        image = self._image(n)
        self._put(image, "player", col("player_y"), col("player_x"))
        on, x, lr, gold = col("on").bool(), col("x"), col("lr").bool(), col("gold").bool()
        rows = torch.arange(1, 9, device=self.device).expand(n, 8)
        self._put(image, "gold", rows, x, on & gold)
        self._put(image, "enemy", rows, x, on & ~gold)
        back = x - torch.where(lr, 1, -1)
        self._put(image, "trail", rows, back.clamp(0, 9), on & (back >= 0) & (back <= 9))
        return self._frame(image)
