"""MinAtar's Seaquest (the `minatar` package's environments/seaquest.py) as a batched torch env: Seaquest."""

from __future__ import annotations

import torch

from common.envs.minatar.base import MinAtarEnv


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
    channels = (
        "sub_front",
        "sub_back",
        "friendly_bullet",
        "trail",
        "enemy_bullet",
        "enemy_fish",
        "enemy_sub",
        "oxygen_guage",
        "diver_guage",
        "diver",
    )
    minimal_actions = ("n", "l", "u", "r", "d", "f")
    # The entity lists: name -> (capacity, fields besides on/x/y/lr).
    lists = {"fb": (4, ()), "eb": (40, ()), "fish": (40, ("mt",)), "subs": (40, ("mt", "st")), "divers": (4, ("mt",))}
    fields = tuple(
        (name, 1)
        for name in (
            "oxygen",
            "diver_count",
            "sub_x",
            "sub_y",
            "sub_or",
            "spawn_speed",
            "spawn_timer",
            "diver_timer",
            "move_speed",
            "ramp_index",
            "shot_timer",
            "surface",
        )
    ) + tuple(
        (f"{name}_{field}", capacity)
        for name, (capacity, extra) in lists.items()
        for field in ("on", "x", "y", "lr") + extra
    )
    game_lanes = 5  # an enemy spawn: rand() < 1/2 (from the left), rand() < 1/3 (a sub), randint(1, 9) (the
    # row); then a diver spawn: rand() < 1/2, randint(1, 9); each only when its timer is up
    # The package's constants.
    max_oxygen, init_spawn_speed, diver_spawn_speed, init_move_interval = 200, 20, 30, 5
    shot_cool_down, enemy_shot_interval, diver_move_interval = 5, 10, 5

    def _setup(self):
        self.entities_dropped = torch.zeros((), dtype=torch.int64, device=self.device)

    def _new_game(self, u, n):
        return self.pack(
            n,
            oxygen=self.max_oxygen,
            sub_x=5,
            spawn_speed=self.init_spawn_speed,
            spawn_timer=self.init_spawn_speed,
            diver_timer=self.diver_spawn_speed,
            move_speed=self.init_move_interval,
            surface=1,
        )

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
        at = (
            movers["claim"][:, :, None]
            & (movers["x"][:, :, None] == bx[:, None, :])
            & (movers["y"][:, :, None] == by[:, None, :])
        )
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
        used["subs"], dropped = self._append(
            subs,
            spawn & ~blocked & is_sub,
            used["subs"],
            dropped,
            x=x,
            y=row,
            lr=lr,
            mt=move_speed,
            st=self.enemy_shot_interval,
        )
        used["fish"], dropped = self._append(
            fish, spawn & ~blocked & ~is_sub, used["fish"], dropped, x=x, y=row, lr=lr, mt=move_speed
        )
        spawn_timer = torch.where(spawn, spawn_speed, col("spawn_timer"))
        diver_spawn = col("diver_timer") == 0
        k = torch.where(spawn, 3, 0)[:, None]  # the diver's draws follow the enemy's, if it drew
        d_lr = u.gather(1, k)[:, 0] < 1 / 2
        d_row = 1 + (u.gather(1, k + 1)[:, 0] * 8).floor().long()
        used["divers"], dropped = self._append(
            divers,
            diver_spawn,
            used["divers"],
            dropped,
            x=torch.where(d_lr, 0, 9),
            y=d_row,
            lr=d_lr,
            mt=self.diver_move_interval,
        )
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
            hit_fish = self._first(
                fish["on"] & (fish["x"] == bx[:, None]) & (fish["y"] == by[:, None]) & alive[:, None]
            )
            alive_after_fish = alive & ~hit_fish.any(1)
            hit_sub = self._first(
                subs["on"] & (subs["x"] == bx[:, None]) & (subs["y"] == by[:, None]) & alive_after_fish[:, None]
            )
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
        subs["st"] = torch.where(
            was_on & (subs["st"] == 0), self.enemy_shot_interval, torch.where(was_on, subs["st"] - 1, subs["st"])
        )
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
        return (
            self.pack(
                n,
                oxygen=oxygen,
                diver_count=diver_count,
                sub_x=sub_x,
                sub_y=sub_y,
                sub_or=sub_or,
                spawn_speed=spawn_speed,
                spawn_timer=spawn_timer,
                diver_timer=diver_timer,
                move_speed=move_speed,
                ramp_index=ramp_index + ramp.long(),
                shot_timer=shot_timer,
                surface=surface,
                **columns,
            ),
            reward,
            terminated,
            dropped,
        )

    def _observe(self, state):
        n = len(state)
        col = lambda name: self.col(state, name)  # noqa: E731
        image = self._image(n)
        sub_x, sub_y = col("sub_x"), col("sub_y")
        self._put(image, "sub_front", sub_y, sub_x)
        self._put(image, "sub_back", sub_y, (sub_x - torch.where(col("sub_or") == 1, 1, -1)) % 10)
        columns = torch.arange(10, device=self.device)
        oxygen_cells = col("oxygen").clamp(min=0) * 10 // self.max_oxygen
        image[:, 7 * 100 + 90 : 7 * 100 + 100] = (columns < oxygen_cells[:, None]).to(torch.uint8) * 255
        image[:, 8 * 100 + 90 : 8 * 100 + 100] = ((columns >= 9 - col("diver_count")[:, None]) & (columns < 9)).to(
            torch.uint8
        ) * 255
        for name, channel, trail in (
            ("fb", "friendly_bullet", False),
            ("eb", "enemy_bullet", False),
            ("fish", "enemy_fish", True),
            ("subs", "enemy_sub", True),
            ("divers", "diver", True),
        ):
            on, x, y = col(f"{name}_on").bool(), col(f"{name}_x"), col(f"{name}_y")
            self._put(image, channel, y, x, on)
            if trail:
                back = x - torch.where(col(f"{name}_lr") == 1, 1, -1)
                self._put(image, "trail", y, back.clamp(0, 9), on & (back >= 0) & (back <= 9))
        return self._frame(image)
