"""MinAtar's five games (Young & Tian, 2019) as batched torch envs: `MinAtar/Breakout-v1`, ...

Each class reproduces the game of the same name in the `minatar` package (version 1.0.15):
dynamics, rewards, terminations, sticky actions (`sticky_action_prob`, default 0.1) and the
difficulty ramp (`difficulty_ramping`, default on), with the package's gym registration's
"-v1" action set (the game's minimal action set, e.g. no-op/left/right for Breakout).

Observations: the group `policy` is uint8 [N, C, 10, 10], the package's boolean 10x10xC state
channel-first, with 255 where the package has True: every image group of the project is a
uint8 picture that the networks scale by 1/255, which gives the package's 0/1 here.

State: every game keeps its whole state in one int64 tensor `state` [N, state_dim] (named
column slices below: positions, timers, the brick map, ...), so autoreset, checkpoints and
in-place updates work as in the classic envs (core.TorchEnv). The last action taken (for
sticky actions) is a column of it and, as in the package, it carries over into the next
episode; `reset()` sets it to 0, as a new `minatar.Environment` starts.

Randomness (counter-based, see core.py): every step of env i draws one block of
`num_reset_uniforms` float64 uniforms from its own stream (`reset()` draws one too), and the
package's random calls of that step are served from it in the order the package makes them:
lane 0 is the sticky-action test (`random.rand() < sticky_action_prob`), the next lanes the
game's own draws in `act`, and the last `reset_lanes` lanes the draws of a reset that ends the
step (an autoreset) or of `reset()`. A package call `rand()` takes a lane `u`, `randint(n)`
takes `floor(u * n)`, `randint(lo, hi)` `lo + floor(u * (hi - lo))` (tests/test_minatar.py
serves the package's generator this way, and the two envs step alike, draw for draw).

Frame stacking: `frame_stack=k` observes the last k frames, oldest first ([N, k * C, 10, 10]; a new
episode's stack is its first frame repeated), kept in a buffer written in place, so the env stays
capturable. MinAtar's games need none (their trail channels show where things move): it is an option
for experiments with a longer view.

Time limit: the package has none (a good Breakout player never loses); the envs truncate at
`max_episode_steps` (default 10,000; gymnax's MinAtar, used by the PQN paper, stops at 1,000).
"""

from __future__ import annotations

import numbers

import numpy as np
import torch
from gymnasium import spaces

from common.envs.core import TorchEnv, _uniform_

FULL_ACTIONS = ("n", "l", "u", "r", "d", "f")  # the package's action names, in its full action set's order


class MinAtarEnv(TorchEnv):
    """A MinAtar game over a batch of envs. A subclass sets the class attributes and writes

        _new_game(u, n)               reset lanes [n, reset_lanes] (None without) -> state [n, state_dim]
        _game_step(state, a, u)       full-set action [N], the step's game lanes -> (new state, reward, terminated),
                                      or with a 4th: entities [N] the game had no slot for (Seaquest); it must not
                                      write into `state` (the env's live state)
        _observe(state)               -> uint8 [N, C, 10, 10]
    """

    channels: tuple[str, ...] = ()
    minimal_actions: tuple[str, ...] = ()
    fields: tuple[tuple[str, int], ...] = ()  # state columns: (name, width), `last_action` added first
    tables: dict[str, tuple[int, ...]] = {}  # lookup tables of the game's rules (see `lookup`)
    game_lanes = 0  # uniforms the game's `act` may draw in one step
    reset_lanes = 0  # uniforms a reset draws
    default_max_episode_steps = 10_000

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        max_episode_steps: int | None = None,
        sticky_action_prob: float = 0.1,
        difficulty_ramping: bool = True,
        frame_stack: int = 1,
    ):
        if not isinstance(sticky_action_prob, numbers.Real) or not 0.0 <= sticky_action_prob <= 1.0:
            raise ValueError(f"{self.env_id}: sticky_action_prob must be in [0, 1], got {sticky_action_prob!r}")
        if not isinstance(frame_stack, numbers.Integral) or frame_stack < 1:
            raise ValueError(f"{self.env_id}: frame_stack must be a positive int, got {frame_stack!r}")
        self.sticky_action_prob = float(sticky_action_prob)
        self.difficulty_ramping = bool(difficulty_ramping)
        self.frame_stack = int(frame_stack)
        shape = (len(self.channels) * self.frame_stack, 10, 10)
        self.single_observation_space = spaces.Box(0, 255, shape, dtype=np.uint8)
        self.single_action_space = spaces.Discrete(len(self.minimal_actions))
        # Column slices of `state`, by name.
        self.columns: dict[str, slice] = {}
        start = 0
        for name, width in (("last_action", 1),) + self.fields:
            self.columns[name] = slice(start, start + width)
            start += width
        self.state_dim = start
        self.num_reset_uniforms = 1 + self.game_lanes + self.reset_lanes  # one block per step
        super().__init__(num_envs, device, seed, dtype, max_episode_steps)
        self.state = torch.zeros(self.num_envs, self.state_dim, dtype=torch.int64, device=self.device)
        self._action_set = torch.tensor([FULL_ACTIONS.index(a) for a in self.minimal_actions], device=self.device)
        # On the device once: a tensor made from Python values inside a step would be a host-to-device
        # copy in every step, which a CUDA graph cannot replay.
        self._tables = {name: torch.tensor(values, device=self.device) for name, values in self.tables.items()}
        # The last `frame_stack` frames, oldest first (allocated once, written in place: capturable).
        self._frames = torch.zeros(self.num_envs, *shape, dtype=torch.uint8, device=self.device)
        # A game that starts without random draws starts from one state, made once (broadcast over the envs).
        self._start_state = self._new_game(None, 1) if self.reset_lanes == 0 else None
        self._setup()

    def lookup(self, table: str, index: torch.Tensor) -> torch.Tensor:
        """tables[table][index], elementwise."""
        return self._tables[table][index]

    # -- state columns ----------------------------------------------------------------------

    def col(self, state: torch.Tensor, name: str) -> torch.Tensor:
        """Column `name` of `state`: [N] for a scalar field, [N, width] for a wider one (a view)."""
        s = self.columns[name]
        return state[:, s.start] if s.stop - s.start == 1 else state[:, s]

    def pack(self, n: int, **values) -> torch.Tensor:
        """A state [n, state_dim] from its fields (each [n], [n, width] or [n, 10, 10], or a number; 0 where
        not given), in one concatenation."""
        pieces = []
        for name, s in self.columns.items():
            value = values.get(name, 0)
            if isinstance(value, numbers.Number):  # a fill: a tensor made from a number would be a copy from the host
                pieces.append(torch.full((n, s.stop - s.start), value, dtype=torch.int64, device=self.device))
            else:
                pieces.append(value.long().reshape(n, s.stop - s.start))
        return torch.cat(pieces, 1)

    def _setup(self) -> None:
        """What a game prepares once, at the end of __init__ (e.g. start states)."""

    # -- random draws -----------------------------------------------------------------------

    def _draw_block(self) -> torch.Tensor:
        """This step's uniforms [N, num_reset_uniforms] (float64, like numpy's `rand()`)."""
        start = self._rng_key + self._rng_counter * self._rng_stride
        return _uniform_(start[:, None] + self._rng_lane_offsets, torch.float64)

    def _draw_initial_state(self) -> torch.Tensor:
        return self._new_game(self._draw_block()[:, -self.reset_lanes:] if self.reset_lanes else None, self.num_envs)

    # -- the step ---------------------------------------------------------------------------

    def step(self, action):
        """Sticky action, the game's step, the time limit, and a same-step autoreset (see TorchEnv.step)."""
        if self._needs_reset:
            raise RuntimeError(f"{self.env_id}: call reset() before step()")
        action = self._action_set[self._check_action(action)]
        u = self._draw_block()
        self._rng_counter.add_(1)  # every env draws one block per step, finished or not
        action = torch.where(u[:, 0] < self.sticky_action_prob, self.col(self.state, "last_action"), action)
        # The game reads the state and makes a new one (its last-action column left 0: set below).
        next_state, reward, terminated, *dropped = self._game_step(self.state, action, u[:, 1:1 + self.game_lanes])

        steps = self.episode_steps + 1
        truncated = steps >= self.max_episode_steps
        done = terminated | truncated
        final_obs = self._observe(next_state)
        if self._start_state is not None:
            fresh = self._start_state
        else:
            fresh = self._new_game(u[:, self.num_reset_uniforms - self.reset_lanes:], self.num_envs)
        self.state.copy_(torch.where(done[:, None], fresh, next_state))
        self.state[:, self.columns["last_action"].start].copy_(action)  # the package keeps it across episodes
        self.episode_steps.copy_(steps.masked_fill(done, 0))
        obs = self._observe(self.state)
        if self.frame_stack > 1:  # a new episode's stack is its first frame, repeated
            older = self._frames[:, len(self.channels):]
            final_obs = torch.cat([older, final_obs], 1)
            obs = torch.where(done[:, None, None, None], obs.repeat(1, self.frame_stack, 1, 1), torch.cat([older, obs], 1))
            self._frames.copy_(obs)
        info = {"final_obs": self._wrap_obs(final_obs), "log": {}}
        if dropped:  # entities a fixed number of slots could not hold: counted on the device, never silently lost
            dropped = dropped[0].sum()
            self.entities_dropped.add_(dropped)
            if self.device.type != "cuda":  # on CUDA the rollout is one graph that runs no Python: read entities_dropped
                info["log"]["entities_dropped"] = dropped.float()
        return self._wrap_obs(obs), reward.to(self.dtype), terminated, truncated, info

    def reset(self, seed=None):
        """Start a new episode in every env (see TorchEnv.reset); a stack starts as the first frame, repeated."""
        obs, info = super().reset(seed)
        self._frames.copy_(obs["policy"].repeat(1, self.frame_stack, 1, 1))
        return self._wrap_obs(self._frames.clone()), info

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**super().state_dict(), "frames": self._frames.clone()}

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        sd = dict(sd)
        frames = sd.pop("frames", None)
        if frames is None or tuple(frames.shape) != tuple(self._frames.shape):
            raise ValueError(f"{self.env_id}: env state_dict entry 'frames' is missing or has shape "
                             f"{None if frames is None else list(frames.shape)}, expected {list(self._frames.shape)} "
                             f"(was it saved with another num_envs or frame_stack?)")
        super().load_state_dict(sd)
        self._frames.copy_(frames)

    # -- drawing ----------------------------------------------------------------------------

    def _image(self, n: int) -> torch.Tensor:
        """An empty observation [n, C * 100] (uint8), filled by `_put` and reshaped by `_frame`."""
        return torch.zeros(n, len(self.channels) * 100, dtype=torch.uint8, device=self.device)

    def _put(self, image: torch.Tensor, channel, y: torch.Tensor, x: torch.Tensor, on=None) -> None:
        """Set pixel (y, x) of `channel` (a name, or channel numbers like y) in each row of `image` ([N] or
        [N, k] coordinates), only where `on` when given (an off pixel leaves its cell as it was: the
        writes are maxima)."""
        n = len(image)
        channel = self.channels.index(channel) if isinstance(channel, str) else channel
        index = (channel * 100 + y * 10 + x).reshape(n, -1)
        value = torch.full_like(index, 255, dtype=torch.uint8)
        if on is not None:
            value = value * on.reshape(n, -1)
        image.scatter_reduce_(1, index, value, "amax")

    def _frame(self, image: torch.Tensor) -> torch.Tensor:
        return image.view(len(image), len(self.channels), 10, 10)

    def render(self, env_ids: list[int]) -> list[np.ndarray]:
        """Frames of the envs `env_ids`, drawn from their observations (the newest frame; see
        common.envs.frames)."""
        from common.envs.frames import frames_from_image

        return frames_from_image(self._observe(self.state[env_ids]), kind="objects")

    def close(self) -> None:
        pass


class Breakout(MinAtarEnv):
    """Breakout: bounce the ball off the paddle to break three rows of bricks (+1 a brick); the ball
    travels on diagonals; cleared rows come back; the episode ends when the ball reaches the bottom."""

    env_id = "MinAtar/Breakout-v1"
    channels = ("paddle", "ball", "trail", "brick")
    minimal_actions = ("n", "l", "r")
    fields = (("ball_x", 1), ("ball_y", 1), ("ball_dir", 1), ("pos", 1), ("strike", 1), ("last_x", 1),
              ("last_y", 1), ("bricks", 100))
    reset_lanes = 1  # randint(2): which side the ball starts from
    # Directions 0-3: up-left, up-right, down-right, down-left; the package's direction changes.
    tables = dict(dx=(-1, 1, 1, -1), dy=(-1, -1, 1, 1), flip_x=(1, 0, 3, 2), flip_y=(3, 2, 1, 0), back=(2, 3, 0, 1))

    def _setup(self):
        # The two start states, by the package's ball_start: (x, dir) = [(0, 2), (9, 3)][start].
        right = torch.arange(2, device=self.device)
        bricks = torch.zeros(2, 10, 10, dtype=torch.int64, device=self.device)
        bricks[:, 1:4].fill_(1)
        self._starts = self.pack(2, ball_x=9 * right, ball_y=3, ball_dir=2 + right, pos=4, strike=0,
                                 last_x=9 * right, last_y=3, bricks=bricks)

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
        direction = torch.where(paddle_old, self.lookup("flip_y", direction),
                                torch.where(paddle_new, self.lookup("back", direction), direction))
        new_y = torch.where(paddle_old | paddle_new, last_y, new_y)
        terminated = bottom & ~paddle_old & ~paddle_new

        next_state = self.pack(len(state), ball_x=new_x, ball_y=new_y,
                               ball_dir=direction, pos=pos, strike=brick, last_x=last_x, last_y=last_y, bricks=bricks)
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


class SpaceInvaders(MinAtarEnv):
    """Space Invaders: shoot the aliens (+1 each) marching side to side and down, firing at the
    cannon; a new wave, faster, when all are shot; the episode ends when the cannon is hit or the
    aliens reach the bottom row."""

    env_id = "MinAtar/SpaceInvaders-v1"
    channels = ("cannon", "alien", "alien_left", "alien_right", "friendly_bullet", "enemy_bullet")
    minimal_actions = ("n", "l", "r", "f")
    fields = (("pos", 1), ("alien_dir", 1), ("move_interval", 1), ("move_timer", 1), ("shot_timer_aliens", 1),
              ("ramp_index", 1), ("shot_timer", 1), ("f_bullets", 100), ("e_bullets", 100), ("aliens", 100))
    shot_cool_down, enemy_move_interval, enemy_shot_interval = 5, 12, 10  # the package's constants

    def _new_game(self, u, n):
        aliens = torch.zeros(n, 10, 10, dtype=torch.int64, device=self.device)
        aliens[:, 0:4, 2:8].fill_(1)
        return self.pack(n, pos=5, alien_dir=-1, move_interval=self.enemy_move_interval,
                         move_timer=self.enemy_move_interval, shot_timer_aliens=self.enemy_shot_interval,
                         ramp_index=0, shot_timer=0, aliens=aliens)

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
        aliens = torch.where(down[:, None, None], aliens.roll(1, 1),
                             torch.where((sideways & (direction > 0))[:, None, None], aliens.roll(1, 2),
                                         torch.where(sideways[:, None, None], aliens.roll(-1, 2), aliens)))
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
        return self.pack(n, pos=pos, alien_dir=direction,
                         move_interval=move_interval - faster.long(), move_timer=move_timer - 1,
                         shot_timer_aliens=shoot_timer - 1, ramp_index=col("ramp_index") + faster.long(),
                         shot_timer=shot_timer, f_bullets=f_bullets, e_bullets=e_bullets, aliens=aliens), reward, terminated

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
        return self.pack(n, pos=9, move_timer=self.player_speed, terminate_timer=self.time_limit, car_x=0,
                         car_timer=speed.abs(), car_speed=speed)

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
        return (self.pack(n, pos=pos, move_timer=move_timer - (move_timer > 0).long(),
                          terminate_timer=terminate_timer, car_x=car_x, car_timer=car_timer, car_speed=car_speed),
                crossed.long(), terminate_timer < 0)

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


class Asterix(MinAtarEnv):
    """Asterix: move about the board to pick up gold (+1) and dodge the enemies that cross it row by
    row; both spawn, and move, faster as the game goes on; touching an enemy ends the episode."""

    env_id = "MinAtar/Asterix-v1"
    channels = ("player", "enemy", "trail", "gold")
    minimal_actions = ("n", "l", "u", "r", "d")
    fields = (("player_x", 1), ("player_y", 1), ("spawn_speed", 1), ("spawn_timer", 1), ("move_speed", 1),
              ("move_timer", 1), ("ramp_timer", 1), ("ramp_index", 1),
              ("on", 8), ("x", 8), ("lr", 8), ("gold", 8))  # the 8 entity slots (slot k runs along row k + 1)
    game_lanes = 3  # a spawn: rand() < 1/2 (from the left), rand() < 1/3 (gold), randint(free slots)
    ramp_interval, init_spawn_speed, init_move_interval = 100, 10, 5  # the package's constants

    def _new_game(self, u, n):
        return self.pack(n, player_x=5, player_y=5, spawn_speed=self.init_spawn_speed,
                         spawn_timer=self.init_spawn_speed, move_speed=self.init_move_interval,
                         move_timer=self.init_move_interval, ramp_timer=self.ramp_interval, ramp_index=0)

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
        return (self.pack(n, player_x=px, player_y=py, spawn_speed=spawn_speed,
                          spawn_timer=spawn_timer - 1, move_speed=move_speed, move_timer=move_timer - 1,
                          ramp_timer=ramp_timer, ramp_index=ramp_index + level_up.long(),
                          on=on, x=x * on, lr=lr & on, gold=gold & on), reward, terminated)

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


class Seaquest(MinAtarEnv):
    """Seaquest: a submarine shoots fish and enemy subs (+1 each; subs shoot back), picks up divers,
    and must surface before its oxygen runs out: surfacing with six divers scores the oxygen left;
    surfacing with none, running out of oxygen or being hit ends the episode. Each surfacing with
    divers makes the enemies spawn, and move, faster.

    The package keeps its entities in Python lists, appended at the end and visited from the last;
    here each list is a fixed number of slots in list order (compacted after every step), and the
    few rules that depend on that order (which of two bullets on one cell a fish takes, which of two
    subs on one cell a bullet takes, who gets a diver when the sub is full) follow it. An entity beyond
    the capacities below is dropped and counted: `entities_dropped` (on the device, in place: since the
    env was made) and info["log"]["entities_dropped"] per step (env/entities_dropped; not on CUDA, where
    a captured rollout runs no Python). The package's constants never reach them: at its fastest spawn
    rate (every step, moves every third step) about 30 enemies are on the board at once; a modified
    game might.
    """

    env_id = "MinAtar/Seaquest-v1"
    channels = ("sub_front", "sub_back", "friendly_bullet", "trail", "enemy_bullet", "enemy_fish", "enemy_sub",
                "oxygen_guage", "diver_guage", "diver")
    minimal_actions = ("n", "l", "u", "r", "d", "f")
    # The entity lists: name -> (capacity, fields besides on/x/y/lr).
    lists = {"fb": (4, ()), "eb": (40, ()), "fish": (40, ("mt",)), "subs": (40, ("mt", "st")), "divers": (4, ("mt",))}
    fields = tuple((name, 1) for name in ("oxygen", "diver_count", "sub_x", "sub_y", "sub_or", "spawn_speed",
                                          "spawn_timer", "diver_timer", "move_speed", "ramp_index", "shot_timer",
                                          "surface")) + tuple(
        (f"{name}_{field}", capacity) for name, (capacity, extra) in lists.items()
        for field in ("on", "x", "y", "lr") + extra)
    game_lanes = 5  # an enemy spawn: rand() < 1/2 (from the left), rand() < 1/3 (a sub), randint(1, 9) (the
    # row); then a diver spawn: rand() < 1/2, randint(1, 9); each only when its timer is up
    # The package's constants.
    max_oxygen, init_spawn_speed, diver_spawn_speed, init_move_interval = 200, 20, 30, 5
    shot_cool_down, enemy_shot_interval, diver_move_interval = 5, 10, 5

    def _setup(self):
        self.entities_dropped = torch.zeros((), dtype=torch.int64, device=self.device)

    def _new_game(self, u, n):
        return self.pack(n, oxygen=self.max_oxygen, sub_x=5, spawn_speed=self.init_spawn_speed,
                         spawn_timer=self.init_spawn_speed, diver_timer=self.diver_spawn_speed,
                         move_speed=self.init_move_interval, surface=1)

    def _list(self, state, name) -> dict[str, torch.Tensor]:
        """An entity list's fields [N, capacity] (copies: the step edits them)."""
        capacity, extra = self.lists[name]
        out = {f: self.col(state, f"{name}_{f}").clone() for f in ("on", "x", "y", "lr") + extra}
        out["on"], out["lr"] = out["on"].bool(), out["lr"].bool()
        return out

    @staticmethod
    def _append(entities, when, used, dropped, **values) -> tuple[torch.Tensor, torch.Tensor]:
        """Append an entity (fields [N]) where `when`, after the `used` slots; returns the new `used` and `dropped`
        [N] counting those with no slot left."""
        slots = torch.arange(entities["on"].shape[1], device=used.device)
        dropped = dropped + (when & (used >= len(slots))).long()
        at = (slots == used[:, None]) & when[:, None]
        entities["on"] = entities["on"] | at
        for field, value in values.items():
            entities[field] = torch.where(at, value[:, None] if torch.is_tensor(value) else value, entities[field])
        return used + when.long(), dropped

    @staticmethod
    def _first(match: torch.Tensor) -> torch.Tensor:
        """One-hot of the first True of each row of `match` (all False where there is none)."""
        return match & (match.long().cumsum(1) == 1)

    def _claims(self, movers, bullets) -> tuple[torch.Tensor, torch.Tensor]:
        """Enemies visited from the last, each taking the first (in list order) friendly bullet left on its
        cell: which enemies [N, E] and which bullets [N, F] go. Per bullet cell (a handful), in O(E)."""
        bx, by, bon = bullets["x"], bullets["y"], bullets["on"]
        # at[:, e, f]: eligible enemy e is on bullet f's cell.
        at = movers["claim"][:, :, None] & (movers["x"][:, :, None] == bx[:, None, :]) & (movers["y"][:, :, None] == by[:, None, :])
        at = at & bon[:, None, :]
        # An enemy's turn among the eligible enemies on its cell, visited from the last ...
        turn = at.flip(1).long().cumsum(1).flip(1) - 1
        # ... and a bullet's turn among the bullets on its cell, in list order.
        same = (bx[:, :, None] == bx[:, None, :]) & (by[:, :, None] == by[:, None, :]) & bon[:, None, :]
        fslots = torch.arange(bx.shape[1], device=self.device)
        bullet_turn = (same & (fslots[None, :] < fslots[:, None])[None]).sum(2)
        bullets_on_cell = same.sum(2)
        enemy_goes = (at & (turn < bullets_on_cell[:, None, :])).any(2)
        bullet_goes = bon & (bullet_turn < at.sum(1))
        return enemy_goes, bullet_goes

    def _enemies_move(self, enemies, sub_x, sub_y, move_speed, bullets):
        """The package's loop over fish or subs: a touch, a move when the timer is up (off the board:
        gone; onto the sub: a touch; else a friendly bullet on the new cell takes it)."""
        on = enemies["on"]
        touch = on & (enemies["x"] == sub_x[:, None]) & (enemies["y"] == sub_y[:, None])
        moves = on & (enemies["mt"] == 0)
        enemies["mt"] = torch.where(moves, move_speed[:, None], torch.where(on, enemies["mt"] - 1, enemies["mt"]))
        enemies["x"] = torch.where(moves, enemies["x"] + torch.where(enemies["lr"], 1, -1), enemies["x"])
        out = moves & ((enemies["x"] < 0) | (enemies["x"] > 9))
        touch_after = moves & ~out & (enemies["x"] == sub_x[:, None]) & (enemies["y"] == sub_y[:, None])
        enemies["claim"] = moves & ~out & ~touch_after
        shot, bullet_goes = self._claims(enemies, bullets)
        enemies["on"] = on & ~out & ~shot
        bullets["on"] = bullets["on"] & ~bullet_goes
        return (touch | touch_after).any(1), shot, out

    def _compact(self, entities) -> dict[str, torch.Tensor]:
        """The list in order with its gaps closed (a stable sort of the living first); empty slots zeroed."""
        order = torch.sort((~entities["on"]).to(torch.uint8), dim=1, stable=True).indices
        out = {f: v.gather(1, order) for f, v in entities.items() if f != "claim"}
        return {f: (v & out["on"]) if v.dtype == torch.bool else v * out["on"] for f, v in out.items()}

    def _game_step(self, state, a, u):
        n = len(state)
        col = lambda name: self.col(state, name)  # noqa: E731
        fb, eb, fish, subs, divers = (self._list(state, name) for name in self.lists)
        used = {name: lst["on"].sum(1) for name, lst in zip(self.lists, (fb, eb, fish, subs, divers))}
        move_speed, spawn_speed = col("move_speed"), col("spawn_speed")
        # Spawns: an enemy (unless one in its row heads the other way), then a diver.
        spawn = col("spawn_timer") == 0
        lr, is_sub, row = u[:, 0] < 1 / 2, u[:, 1] < 1 / 3, 1 + (u[:, 2] * 8).floor().long()
        blocked = torch.zeros_like(spawn)
        for enemies in (subs, fish):
            blocked = blocked | (enemies["on"] & (enemies["y"] == row[:, None]) & (enemies["lr"] != lr[:, None])).any(1)
        x, dropped = torch.where(lr, 0, 9), torch.zeros_like(spawn, dtype=torch.int64)
        used["subs"], dropped = self._append(subs, spawn & ~blocked & is_sub, used["subs"], dropped, x=x, y=row, lr=lr,
                                             mt=move_speed, st=self.enemy_shot_interval)
        used["fish"], dropped = self._append(fish, spawn & ~blocked & ~is_sub, used["fish"], dropped, x=x, y=row, lr=lr,
                                             mt=move_speed)
        spawn_timer = torch.where(spawn, spawn_speed, col("spawn_timer"))
        diver_spawn = col("diver_timer") == 0
        k = torch.where(spawn, 3, 0)[:, None]  # the diver's draws follow the enemy's, if it drew
        d_lr = u.gather(1, k)[:, 0] < 1 / 2
        d_row = 1 + (u.gather(1, k + 1)[:, 0] * 8).floor().long()
        used["divers"], dropped = self._append(divers, diver_spawn, used["divers"], dropped, x=torch.where(d_lr, 0, 9),
                                               y=d_row, lr=d_lr, mt=self.diver_move_interval)
        diver_timer = torch.where(diver_spawn, self.diver_spawn_speed, col("diver_timer"))
        # The sub: fire (when the gun is cool), or move.
        sub_x, sub_y, sub_or, shot_timer = col("sub_x"), col("sub_y"), col("sub_or").bool(), col("shot_timer")
        fire = (a == 5) & (shot_timer == 0)
        used["fb"], dropped = self._append(fb, fire, used["fb"], dropped, x=sub_x, y=sub_y, lr=sub_or)
        shot_timer = torch.where(fire, self.shot_cool_down, shot_timer)
        sub_x = torch.where(a == 1, (sub_x - 1).clamp(min=0), torch.where(a == 3, (sub_x + 1).clamp(max=9), sub_x))
        sub_or = torch.where(a == 1, False, torch.where(a == 3, True, sub_or))
        sub_y = torch.where(a == 2, (sub_y - 1).clamp(min=0), torch.where(a == 4, (sub_y + 1).clamp(max=8), sub_y))
        reward = torch.zeros_like(sub_x)
        # Friendly bullets, from the last: a step on; off the board, gone; else the first fish, or else
        # the first sub, on the new cell goes with it.
        for j in reversed(range(self.lists["fb"][0])):
            alive = fb["on"][:, j]
            fb["x"][:, j] += torch.where(fb["lr"][:, j], 1, -1) * alive
            bx, by = fb["x"][:, j], fb["y"][:, j]
            alive = alive & (bx >= 0) & (bx <= 9)
            hit_fish = self._first(fish["on"] & (fish["x"] == bx[:, None]) & (fish["y"] == by[:, None]) & alive[:, None])
            alive_after_fish = alive & ~hit_fish.any(1)
            hit_sub = self._first(subs["on"] & (subs["x"] == bx[:, None]) & (subs["y"] == by[:, None])
                                  & alive_after_fish[:, None])
            fish["on"] = fish["on"] & ~hit_fish
            subs["on"] = subs["on"] & ~hit_sub
            reward = reward + hit_fish.any(1).long() + hit_sub.any(1).long()
            fb["on"][:, j] = alive_after_fish & ~hit_sub.any(1)
        # Divers, from the last: the sub takes one on its cell (up to six), before or after its move.
        diver_count = col("diver_count")
        for j in reversed(range(self.lists["divers"][0])):
            alive = divers["on"][:, j]
            at_sub = (divers["x"][:, j] == sub_x) & (divers["y"][:, j] == sub_y)
            taken = alive & at_sub & (diver_count < 6)
            diver_count = diver_count + taken.long()
            rest = alive & ~taken
            moves = rest & (divers["mt"][:, j] == 0)
            divers["mt"][:, j] = torch.where(moves, self.diver_move_interval, divers["mt"][:, j] - rest.long())
            divers["x"][:, j] += torch.where(divers["lr"][:, j], 1, -1) * moves
            out = moves & ((divers["x"][:, j] < 0) | (divers["x"][:, j] > 9))
            at_sub = (divers["x"][:, j] == sub_x) & (divers["y"][:, j] == sub_y)
            taken_after = moves & ~out & at_sub & (diver_count < 6)
            diver_count = diver_count + taken_after.long()
            divers["on"][:, j] = alive & ~taken & ~out & ~taken_after
        # Enemy subs: touches, moves, bullets; each fires when its shot timer is up (from where it is
        # now: a sub that just left the board fires a bullet that leaves with it).
        subs_touch, shot, subs_out = self._enemies_move(subs, sub_x, sub_y, move_speed, fb)
        reward = reward + shot.sum(1)
        fires = (subs["on"] | shot) & ~subs_out & (subs["st"] == 0)
        was_on = subs["on"] | shot | subs_out
        subs["st"] = torch.where(was_on & (subs["st"] == 0), self.enemy_shot_interval,
                                 torch.where(was_on, subs["st"] - 1, subs["st"]))
        # The fired bullets join the enemy bullets after the used slots (their order there changes nothing);
        # a sub that does not fire writes into a spare last column, dropped.
        capacity = self.lists["eb"][0]
        slot = torch.where(fires, used["eb"][:, None] + fires.long().cumsum(1) - 1, capacity)
        dropped = dropped + (slot > capacity - 1).logical_and(fires).sum(1)  # a bullet past the last slot
        slot = slot.clamp(max=capacity)
        spare = torch.zeros(n, capacity + 1, dtype=torch.int64, device=self.device)
        written = spare.scatter(1, slot, fires.long())[:, :capacity].bool()
        for field in ("x", "y", "lr"):
            value = spare.scatter(1, slot, subs[field].long())[:, :capacity]
            eb[field] = torch.where(written, value.bool() if field == "lr" else value, eb[field])
        eb["on"] = eb["on"] | written
        # Enemy bullets: a touch, a step on, off the board gone, a touch.
        touch = eb["on"] & (eb["x"] == sub_x[:, None]) & (eb["y"] == sub_y[:, None])
        eb["x"] = eb["x"] + torch.where(eb["lr"], 1, -1) * eb["on"]
        eb["on"] = eb["on"] & (eb["x"] >= 0) & (eb["x"] <= 9)
        touch = touch | (eb["on"] & (eb["x"] == sub_x[:, None]) & (eb["y"] == sub_y[:, None]))
        fish_touch, shot, _ = self._enemies_move(fish, sub_x, sub_y, move_speed, fb)
        reward = reward + shot.sum(1)
        terminated = subs_touch | touch.any(1) | fish_touch
        spawn_timer = spawn_timer - (spawn_timer > 0).long()
        diver_timer = diver_timer - (diver_timer > 0).long()
        shot_timer = shot_timer - (shot_timer > 0).long()
        # Oxygen: used under water; at the surface, a new breath for a diver (six: a bonus), or the end.
        oxygen, surface, ramp_index = col("oxygen"), col("surface").bool(), col("ramp_index")
        terminated = terminated | (oxygen <= 0)
        below = sub_y > 0
        oxygen = oxygen - below.long()
        surfacing = ~below & ~surface
        terminated = terminated | (surfacing & (diver_count == 0))
        breath = surfacing & (diver_count != 0)
        full = breath & (diver_count == 6)
        reward = reward + torch.where(full, oxygen * 10 // self.max_oxygen, 0)
        diver_count = torch.where(full, 0, diver_count) - breath.long()
        oxygen = torch.where(breath, self.max_oxygen, oxygen)
        surface = torch.where(below, False, surface | breath)
        ramp = breath & ((spawn_speed > 1) | (move_speed > 2)) & self.difficulty_ramping
        move_speed = move_speed - (ramp & (move_speed > 2) & (ramp_index % 2 == 1)).long()
        spawn_speed = spawn_speed - (ramp & (spawn_speed > 1)).long()
        lists = {name: self._compact(lst) for name, lst in zip(self.lists, (fb, eb, fish, subs, divers))}
        columns = {f"{name}_{f}": v for name, lst in lists.items() for f, v in lst.items()}
        return (self.pack(n, oxygen=oxygen, diver_count=diver_count, sub_x=sub_x, sub_y=sub_y, sub_or=sub_or,
                          spawn_speed=spawn_speed, spawn_timer=spawn_timer, diver_timer=diver_timer,
                          move_speed=move_speed, ramp_index=ramp_index + ramp.long(), shot_timer=shot_timer,
                          surface=surface, **columns), reward, terminated, dropped)

    def _observe(self, state):
        n = len(state)
        col = lambda name: self.col(state, name)  # noqa: E731
        image = self._image(n)
        sub_x, sub_y = col("sub_x"), col("sub_y")
        self._put(image, "sub_front", sub_y, sub_x)
        self._put(image, "sub_back", sub_y, (sub_x - torch.where(col("sub_or") == 1, 1, -1)) % 10)
        columns = torch.arange(10, device=self.device)
        oxygen_cells = col("oxygen").clamp(min=0) * 10 // self.max_oxygen
        image[:, 7 * 100 + 90:7 * 100 + 100] = (columns < oxygen_cells[:, None]).to(torch.uint8) * 255
        image[:, 8 * 100 + 90:8 * 100 + 100] = ((columns >= 9 - col("diver_count")[:, None]) & (columns < 9)).to(torch.uint8) * 255
        for name, channel, trail in (("fb", "friendly_bullet", False), ("eb", "enemy_bullet", False),
                                     ("fish", "enemy_fish", True), ("subs", "enemy_sub", True), ("divers", "diver", True)):
            on, x, y = col(f"{name}_on").bool(), col(f"{name}_x"), col(f"{name}_y")
            self._put(image, channel, y, x, on)
            if trail:
                back = x - torch.where(col(f"{name}_lr") == 1, 1, -1)
                self._put(image, "trail", y, back.clamp(0, 9), on & (back >= 0) & (back <= 9))
        return self._frame(image)


MINATAR_ENVS = (Breakout, SpaceInvaders, Freeway, Asterix, Seaquest)
