"""MinAtar's Freeway (the `minatar` package's environments/freeway.py) as a batched torch env: Freeway."""

from __future__ import annotations

import torch

from common.envs.minatar.base import MinAtarEnv


class Freeway(MinAtarEnv):
    """Freeway: lead the chicken up across eight lanes of traffic (+1 a crossing, after which the
    cars' speeds are drawn again); a car sends it back to the bottom; the game lasts 2,500 steps."""

    env_id = "MinAtar/Freeway-v1"
    channels = ("chicken", "car", "speed1", "speed2", "speed3", "speed4", "speed5")
    minimal_actions = ("n", "u", "d")
    fields = (("pos", 1), ("move_timer", 1), ("terminate_timer", 1), ("car_x", 8), ("car_timer", 8), ("car_speed", 8))
    game_lanes = 16  # a crossing redraws the speeds: randint(1, 6, 8), then rand(8) for the directions
    reset_lanes = 16
    player_speed, time_limit = 3, 2500  # the package's constants

    def _speeds(self, u: torch.Tensor) -> torch.Tensor:
        """Signed car speeds [n, 8] from 16 lanes: sizes 1-5, directions sign(rand - 0.5)."""
        return (1 + (u[:, :8] * 5).floor().long()) * torch.sign(u[:, 8:16] - 0.5).long()

    def _new_game(self, u, n):
        speed = self._speeds(u)
        return self.pack(
            n,
            pos=9,
            move_timer=self.player_speed,
            terminate_timer=self.time_limit,
            car_x=0,
            car_timer=speed.abs(),
            car_speed=speed,
        )

    def _game_step(self, state, a, u):
        n = len(state)
        col = lambda name: self.col(state, name)  # noqa: E731
        pos, move_timer = col("pos"), col("move_timer")
        can_move = move_timer == 0
        up, down = can_move & (a == 2), can_move & (a == 4)
        move_timer = torch.where(up | down, self.player_speed, move_timer)
        pos = torch.where(up, (pos - 1).clamp(min=0), torch.where(down, (pos + 1).clamp(max=9), pos))
        crossed = pos == 0
        new_speed = self._speeds(u)
        car_speed = torch.where(crossed[:, None], new_speed, col("car_speed"))
        car_timer = torch.where(crossed[:, None], new_speed.abs(), col("car_timer"))
        pos = torch.where(crossed, 9, pos)
        # Cars: each moves a cell when its timer is up. A car on the chicken's cell, before or after its
        # move, sends it to the bottom row (where no car drives, so one hit is all there is).
        lanes = torch.arange(1, 9, device=self.device)
        car_x = col("car_x")
        on_lane = lanes == pos[:, None]
        hit = on_lane & (car_x == 4)
        moves = car_timer == 0
        car_x = torch.where(moves, (car_x + torch.where(car_speed > 0, 1, -1)) % 10, car_x)
        hit |= on_lane & moves & (car_x == 4)
        car_timer = torch.where(moves, car_speed.abs(), car_timer - 1)
        pos = torch.where(hit.any(1), 9, pos)
        terminate_timer = col("terminate_timer") - 1
        return (
            self.pack(
                n,
                pos=pos,
                move_timer=move_timer - (move_timer > 0).long(),
                terminate_timer=terminate_timer,
                car_x=car_x,
                car_timer=car_timer,
                car_speed=car_speed,
            ),
            crossed.long(),
            terminate_timer < 0,
        )

    def _observe(self, state):
        n = len(state)
        col = lambda name: self.col(state, name)  # noqa: E731
        image = self._image(n)
        self._put(image, "chicken", col("pos"), torch.full_like(col("pos"), 4))
        lanes = torch.arange(1, 9, device=self.device).expand(n, 8)
        car_x, speed = col("car_x"), col("car_speed")
        self._put(image, "car", lanes, car_x)
        self._put(image, 1 + speed.abs(), lanes, (car_x - torch.where(speed > 0, 1, -1)) % 10)
        return self._frame(image)
