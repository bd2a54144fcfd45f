"""The built-in MinAtar games against the `minatar` package, step by step, draw for draw.

What is compared, at every step of every env: the observation (ours uint8 [C, 10, 10] with 255
where the package's boolean [10, 10, C] state is True), the reward, the termination, the true last
observation of a finished episode (`info["final_obs"]`) and the first observation of the next one.

How the randomness is aligned: each package env's numpy generator (the one `minatar.Environment`
uses for sticky actions and hands to its game) is replaced by `BlockRandom`, which serves the
uniforms of the same env's stream of ours (core.hash_uniform at the positions common.envs.minatar's
docstring gives): a step's calls take the lanes of that step's block in order (lane 0: the sticky
action test), a reset's calls the block's last lanes. So both envs take the same sticky actions
and draw the same starts and spawns, and any difference in the game's rules shows as a different
frame. Random play leaves some rules rare (a cleared wave, the difficulty ramp), so every game is
also set to 3,000 random states and stepped once, comparing every state variable.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from common.envs import make_env
from common.envs.core import hash_uniform, seed_to_key
from common.envs.minatar import FULL_ACTIONS, MINATAR_ENVS, Seaquest
from tests.host_sync import RecordHostSyncs
from tests.replay import ReplaySignature, changes, python_state

minatar = pytest.importorskip("minatar", reason="the minatar package (the `test` extra) is the reference")

GAMES = {cls.env_id: cls for cls in MINATAR_ENVS}
PACKAGE_NAME = {
    "MinAtar/Breakout-v1": "breakout",
    "MinAtar/Asterix-v1": "asterix",
    "MinAtar/Freeway-v1": "freeway",
    "MinAtar/SpaceInvaders-v1": "space_invaders",
    "MinAtar/Seaquest-v1": "seaquest",
}
# (envs, steps, time limit) of the side-by-side run: over 10,000 steps in all, limits short enough that
# some episodes of random play reach them (Freeway's own 2,500-step end instead).
SIDE_BY_SIDE = {
    "MinAtar/Breakout-v1": (16, 640, 15),
    "MinAtar/Asterix-v1": (16, 640, 60),
    "MinAtar/Freeway-v1": (4, 2600, 10_000),
    "MinAtar/SpaceInvaders-v1": (16, 640, 100),
    "MinAtar/Seaquest-v1": (16, 640, 150),
}
# Random actions: uniform, but for Freeway, mostly up (a uniformly random chicken seldom crosses).
ACTION_PROBS = {"MinAtar/Freeway-v1": [0.1, 0.8, 0.1]}


class BlockRandom:
    """Stands in for numpy's RandomState in one package env: serves that env's uniforms of ours, block
    by block, lane by lane (`rand`, `randint(n)`, `randint(lo, hi, size)`, as common.envs.minatar says)."""

    def __init__(self, uniforms: np.ndarray):
        self.uniforms = uniforms  # [blocks, lanes] float64
        self.block, self.lane = 0, 0

    def start(self, block: int, lane: int = 0) -> None:
        self.block, self.lane = block, lane

    def _take(self, size):
        k = 1 if size is None else int(np.prod(size))
        values = self.uniforms[self.block, self.lane : self.lane + k]
        assert len(values) == k, f"the package drew past the end of block {self.block}"
        self.lane += k
        return values[0] if size is None else values.reshape(size)

    def rand(self, *size):
        return self._take(size or None)

    def randint(self, low, high=None, size=None):
        if high is None:
            low, high = 0, low
        return low + np.floor(self._take(size) * (high - low)).astype(np.int64)


def our_uniforms(env, seed: int, blocks: int) -> np.ndarray:
    """[N, blocks, lanes]: uniform `lane` of block `b` of env i (seeded `seed + i`) is number
    b * lanes + lane of its stream."""
    lanes = env.num_reset_uniforms
    keys = seed_to_key(seed + torch.arange(env.num_envs, dtype=torch.int64))
    index = torch.arange(blocks * lanes, dtype=torch.int64)
    return hash_uniform(keys[:, None], index[None, :], torch.float64).reshape(env.num_envs, blocks, lanes).numpy()


def package_frames(games) -> np.ndarray:
    """The package envs' states as our observations: uint8 [N, C, 10, 10], 255 for True."""
    return np.stack([g.state() for g in games]).transpose(0, 3, 1, 2).astype(np.uint8) * 255


def run_side_by_side(env_id: str, num_envs: int, num_steps: int, seed: int, max_episode_steps: int, **kwargs):
    """Steps ours and the package's envs with the same random actions, asserting they agree at every
    step; returns counts of what happened (to show the comparison covered it)."""
    env = make_env(env_id, num_envs, seed=seed, max_episode_steps=max_episode_steps, **kwargs)
    lanes, reset_lanes, act_lanes = env.num_reset_uniforms, env.reset_lanes, 1 + env.game_lanes
    uniforms = our_uniforms(env, seed, num_steps + 1)
    games, randoms = [], []
    for i in range(num_envs):
        game = minatar.Environment(
            PACKAGE_NAME[env_id],
            sticky_action_prob=kwargs.get("sticky_action_prob", 0.1),
            difficulty_ramping=kwargs.get("difficulty_ramping", True),
        )
        game.random = game.env.random = BlockRandom(uniforms[i])
        game.random.start(0, lanes - reset_lanes)
        game.reset()
        games.append(game)
        randoms.append(game.random)
    obs, _ = env.reset()
    assert np.array_equal(obs["policy"].numpy(), package_frames(games))
    action_set = [FULL_ACTIONS.index(a) for a in env.minimal_actions]
    actions = np.random.default_rng(seed).choice(
        len(action_set), size=(num_steps, num_envs), p=ACTION_PROBS.get(env_id)
    )
    lengths = np.zeros(num_envs, dtype=int)
    counts = dict(terminated=0, truncated=0, reward=0.0, sticky=0)
    for t in range(num_steps):
        obs, reward, terminated, truncated, info = env.step(torch.from_numpy(actions[t]))
        rewards, terminals = np.zeros(num_envs), np.zeros(num_envs, dtype=bool)
        for i, (game, random) in enumerate(zip(games, randoms)):
            random.start(t + 1)
            rewards[i], terminals[i] = game.act(action_set[actions[t, i]])
            assert random.lane <= act_lanes, f"{env_id}: the package drew {random.lane} uniforms in a step"
            counts["sticky"] += game.last_action != action_set[actions[t, i]]
        lengths += 1
        assert np.array_equal(reward.numpy(), rewards), (t, reward, rewards)
        assert np.array_equal(terminated.numpy(), terminals), (t, terminated, terminals)
        assert np.array_equal(truncated.numpy(), lengths >= max_episode_steps), t
        assert np.array_equal(info["final_obs"]["policy"].numpy(), package_frames(games)), t
        for i in np.flatnonzero(terminals | (lengths >= max_episode_steps)):
            randoms[i].start(t + 1, lanes - reset_lanes)
            games[i].reset()
            lengths[i] = 0
        assert np.array_equal(obs["policy"].numpy(), package_frames(games)), t
        counts["terminated"] += int(terminals.sum())
        counts["truncated"] += int((truncated & ~terminated).sum())
        counts["reward"] += float(rewards.sum())
    return counts


@pytest.mark.parametrize("env_id", list(GAMES))
def test_matches_the_minatar_package_step_by_step(env_id):
    """Over 10,000 random-action steps (SIDE_BY_SIDE) with sticky actions, episodes that end by the
    game's rules and by the time limit, each compared frame by frame."""
    num_envs, num_steps, limit = SIDE_BY_SIDE[env_id]
    counts = run_side_by_side(env_id, num_envs=num_envs, num_steps=num_steps, seed=3, max_episode_steps=limit)
    assert num_envs * num_steps >= 10_000
    assert counts["terminated"] >= num_envs and counts["reward"] > 20 and counts["sticky"] > 100, counts
    assert counts["truncated"] > 0 or limit > num_steps, counts


def test_without_sticky_actions_the_agent_acts_as_told():
    counts = run_side_by_side(
        "MinAtar/Breakout-v1", num_envs=4, num_steps=200, seed=5, max_episode_steps=1000, sticky_action_prob=0.0
    )
    assert counts["sticky"] == 0 and counts["terminated"] > 0


# --------------------------------------------------------------------------------------
# From arbitrary states: every branch of the rules, and the whole state after a step
# --------------------------------------------------------------------------------------
# Our state column -> the package game's attribute (10x10 maps as arrays); Freeway's cars are a list.
PACKAGE_ATTRIBUTES = {
    "MinAtar/Breakout-v1": dict(
        ball_x="ball_x",
        ball_y="ball_y",
        ball_dir="ball_dir",
        pos="pos",
        strike="strike",
        last_x="last_x",
        last_y="last_y",
        bricks="brick_map",
    ),
    "MinAtar/SpaceInvaders-v1": dict(
        pos="pos",
        alien_dir="alien_dir",
        move_interval="enemy_move_interval",
        move_timer="alien_move_timer",
        shot_timer_aliens="alien_shot_timer",
        ramp_index="ramp_index",
        shot_timer="shot_timer",
        f_bullets="f_bullet_map",
        e_bullets="e_bullet_map",
        aliens="alien_map",
    ),
    "MinAtar/Freeway-v1": dict(pos="pos", move_timer="move_timer", terminate_timer="terminate_timer"),
    "MinAtar/Asterix-v1": {
        name: name
        for name in (
            "player_x",
            "player_y",
            "spawn_speed",
            "spawn_timer",
            "move_speed",
            "move_timer",
            "ramp_timer",
            "ramp_index",
        )
    },
    "MinAtar/Seaquest-v1": dict(
        oxygen="oxygen",
        diver_count="diver_count",
        sub_x="sub_x",
        sub_y="sub_y",
        sub_or="sub_or",
        spawn_speed="e_spawn_speed",
        spawn_timer="e_spawn_timer",
        diver_timer="d_spawn_timer",
        move_speed="move_speed",
        ramp_index="ramp_index",
        shot_timer="shot_timer",
        surface="surface",
    ),
}
# Seaquest's entity lists: our list name -> (the package's attribute, its entries' fields).
SEAQUEST_LISTS = {
    "fb": ("f_bullets", ("x", "y", "lr")),
    "eb": ("e_bullets", ("x", "y", "lr")),
    "fish": ("e_fish", ("x", "y", "lr", "mt")),
    "subs": ("e_subs", ("x", "y", "lr", "mt", "st")),
    "divers": ("divers", ("x", "y", "lr", "mt")),
}
CAR_COLUMNS = ("car_x", None, "car_timer", "car_speed")  # a package car is [x, lane, timer, speed]


def set_package_state(env_id: str, game, fields: dict, i: int) -> None:
    for column, attribute in PACKAGE_ATTRIBUTES[env_id].items():
        value = fields[column][i]
        setattr(game, attribute, value.reshape(10, 10).astype(float) if value.size == 100 else int(value))
    if env_id == "MinAtar/Freeway-v1":
        game.cars = [
            [int(fields["car_x"][i][k]), k + 1, int(fields["car_timer"][i][k]), int(fields["car_speed"][i][k])]
            for k in range(8)
        ]
    if env_id == "MinAtar/Seaquest-v1":
        for name, (attribute, entry) in SEAQUEST_LISTS.items():
            alive = np.flatnonzero(fields[f"{name}_on"][i])
            setattr(
                game,
                attribute,
                [
                    [int(fields[f"{name}_{f}"][i][k]) if f != "lr" else bool(fields[f"{name}_lr"][i][k]) for f in entry]
                    for k in alive
                ],
            )
        game.sub_or, game.surface = bool(game.sub_or), bool(game.surface)
    if env_id == "MinAtar/Asterix-v1":  # an entity is [x, row, from the left, gold], or None
        game.entities = [
            [int(fields["x"][i][k]), k + 1, bool(fields["lr"][i][k]), bool(fields["gold"][i][k])]
            if fields["on"][i][k]
            else None
            for k in range(8)
        ]
    game.terminal = False


def package_state(env_id: str, game) -> dict[str, np.ndarray]:
    """The package game's state in our columns' layout."""
    state = {
        column: np.asarray(getattr(game, attribute)).reshape(-1)
        for column, attribute in PACKAGE_ATTRIBUTES[env_id].items()
    }
    if env_id == "MinAtar/Freeway-v1":
        state.update({c: np.array([car[k] for car in game.cars]) for k, c in enumerate(CAR_COLUMNS) if c})
    if env_id == "MinAtar/Seaquest-v1":  # the lists in order, zero-padded; the enemy bullets as a sorted list
        for name, (attribute, entry) in SEAQUEST_LISTS.items():
            capacity = Seaquest.lists[name][0]
            entries = getattr(game, attribute)
            assert len(entries) <= capacity, (name, len(entries))
            if name == "eb":  # their order changes nothing in the game (each moves on its own)
                state["eb"] = sorted(tuple(int(v) for v in e) for e in entries)
                continue
            state[f"{name}_on"] = np.arange(capacity) < len(entries)
            for k, f in enumerate(entry):
                state[f"{name}_{f}"] = np.array([int(e[k]) for e in entries] + [0] * (capacity - len(entries)))
    if env_id == "MinAtar/Asterix-v1":
        entities = [e or [0, 0, False, False] for e in game.entities]
        state.update(
            on=np.array([e is not None for e in game.entities]),
            x=np.array([e[0] for e in entities]),
            lr=np.array([e[2] for e in entities]),
            gold=np.array([e[3] for e in entities]),
        )
    return state


def sparse_maps(rng, n: int, densities, rows=slice(0, 10)) -> np.ndarray:
    """[n, 100] 0/1 maps, each with a density drawn from `densities`, set only in `rows`."""
    maps = np.zeros((n, 10, 10), dtype=np.int64)
    maps[:, rows] = rng.random((n, 10, 10))[:, rows] < rng.choice(densities, size=(n, 1, 1))
    return maps.reshape(n, 100)


def random_states(env_id: str, rng, n: int) -> dict[str, np.ndarray]:
    """Game states drawn wide: edges, timers about to fire, near-empty and crowded maps."""
    if env_id == "MinAtar/Breakout-v1":
        x, y = rng.integers(0, 10, n), rng.integers(0, 9, n)
        return dict(
            ball_x=x,
            ball_y=y,
            ball_dir=rng.integers(0, 4, n),
            pos=rng.integers(0, 10, n),
            strike=rng.integers(0, 2, n),
            last_x=x,
            last_y=y,
            bricks=sparse_maps(rng, n, [0.0, 0.01, 0.3, 0.7], rows=slice(0, 9)),
        )
    if env_id == "MinAtar/SpaceInvaders-v1":
        aliens = sparse_maps(rng, n, [0.0, 0.02, 0.1, 0.4])
        aliens[np.arange(n), rng.integers(0, 100, n)] = 1  # the package shoots from an alien: there is one
        return dict(
            pos=rng.integers(0, 10, n),
            alien_dir=rng.choice([-1, 1], n),
            move_interval=rng.integers(5, 13, n),
            move_timer=rng.integers(0, 3, n),
            shot_timer_aliens=rng.integers(0, 3, n),
            ramp_index=rng.integers(0, 3, n),
            shot_timer=rng.integers(0, 3, n),
            f_bullets=sparse_maps(rng, n, [0.0, 0.05, 0.3]),
            e_bullets=sparse_maps(rng, n, [0.0, 0.05, 0.3]),
            aliens=aliens,
        )
    if env_id == "MinAtar/Freeway-v1":
        speed = rng.integers(1, 6, (n, 8)) * rng.choice([-1, 1], (n, 8))
        return dict(
            pos=rng.integers(0, 10, n),
            move_timer=rng.integers(0, 4, n),
            terminate_timer=rng.integers(0, 3, n),
            car_x=rng.integers(0, 10, (n, 8)),
            car_timer=rng.integers(0, 6, (n, 8)) % (speed.__abs__() + 1),
            car_speed=speed,
        )
    if env_id == "MinAtar/Asterix-v1":
        on = rng.random((n, 8)) < rng.choice([0.0, 0.3, 0.9, 1.0], size=(n, 1))
        return dict(
            player_x=rng.integers(0, 10, n),
            player_y=rng.integers(1, 9, n),
            spawn_speed=rng.integers(1, 11, n),
            spawn_timer=rng.integers(0, 3, n),
            move_speed=rng.integers(1, 6, n),
            move_timer=rng.integers(0, 3, n),
            ramp_timer=rng.choice([-1, 0, 1, 50], n),
            ramp_index=rng.integers(0, 4, n),
            on=on.astype(np.int64),
            x=rng.integers(0, 10, (n, 8)) * on,
            lr=rng.integers(0, 2, (n, 8)) * on,
            gold=rng.integers(0, 2, (n, 8)) * on,
        )
    if env_id == "MinAtar/Seaquest-v1":
        x = rng.integers(0, 10, n)
        fields = dict(
            oxygen=rng.choice([0, 1, 7, 100, 200], n),
            diver_count=rng.integers(0, 7, n),
            sub_x=x,
            sub_y=rng.choice([0, 0, 1, 4, 8], n),
            sub_or=np.where(x == 9, 1, np.where(x == 0, 0, rng.integers(0, 2, n))),
            spawn_speed=rng.integers(1, 21, n),
            spawn_timer=rng.integers(0, 3, n),
            diver_timer=rng.integers(0, 3, n),
            move_speed=rng.integers(2, 6, n),
            ramp_index=rng.integers(0, 4, n),
            shot_timer=rng.integers(0, 3, n),
            surface=rng.integers(0, 2, n),
        )
        for name, (count, extra) in Seaquest.lists.items():
            capacity = count
            alive = np.arange(capacity) < rng.integers(0, min(capacity, 12) + 1, (n, 1))  # in list order: the first k
            rows = (0, 9) if name == "fb" else (1, 9)
            fields.update(
                {
                    f"{name}_on": alive,
                    f"{name}_x": rng.integers(0, 10, (n, capacity)) * alive,
                    f"{name}_y": rng.integers(*rows, (n, capacity)) * alive,
                    f"{name}_lr": rng.integers(0, 2, (n, capacity)) * alive,
                }
            )
            fields.update({f"{name}_{f}": rng.integers(0, 3, (n, capacity)) * alive for f in extra})
        fields["fb_on"] &= np.arange(4) < 3  # at most three friendly bullets fly at once, three divers swim
        fields["divers_on"] &= np.arange(4) < 3
        return {k: v.astype(np.int64) for k, v in fields.items()}
    raise KeyError(env_id)


RAMPING_GAMES = (
    "MinAtar/Asterix-v1",
    "MinAtar/SpaceInvaders-v1",
    "MinAtar/Seaquest-v1",
)  # the others have no difficulty ramp


@pytest.mark.parametrize(
    "env_id, ramping", [(g, True) for g in PACKAGE_ATTRIBUTES] + [(g, False) for g in RAMPING_GAMES]
)
def test_from_random_states_one_step_matches_the_package(env_id, ramping):
    """3,000 random states, set in both envs and stepped once with random actions (the package's random
    draws served from our stream, as above): the same frame, reward and termination, and (where the
    episode goes on) the same value of every state variable."""
    rng = np.random.default_rng(0)
    n = 3000
    env = make_env(env_id, n, seed=0, sticky_action_prob=0.0, difficulty_ramping=ramping)
    env.reset()
    fields = random_states(env_id, rng, n)
    env.state.copy_(env.pack(n, **{k: torch.from_numpy(v) for k, v in fields.items()}))
    actions = rng.integers(0, env.single_action_space.n, n)
    obs, reward, terminated, truncated, info = env.step(torch.from_numpy(actions))
    action_set = [FULL_ACTIONS.index(a) for a in env.minimal_actions]
    game = minatar.Environment(PACKAGE_NAME[env_id], sticky_action_prob=0.0, difficulty_ramping=ramping)
    uniforms = our_uniforms(env, 0, 2)  # block 0: reset(), block 1: the step
    for i in range(n):
        set_package_state(env_id, game.env, fields, i)
        game.random = game.env.random = BlockRandom(uniforms[i])
        game.random.start(1)
        r, done = game.act(action_set[actions[i]])
        expected = game.state().transpose(2, 0, 1).astype(np.uint8) * 255
        assert np.array_equal(info["final_obs"]["policy"][i].numpy(), expected), (
            i,
            {k: v[i] for k, v in fields.items()},
        )
        assert reward[i].item() == r and terminated[i].item() == done, i
        if not done:
            for column, value in package_state(env_id, game.env).items():
                if column == "eb":
                    on = env.col(env.state, "eb_on")[i].bool()
                    ours = sorted(zip(*(env.col(env.state, f"eb_{f}")[i][on].tolist() for f in ("x", "y", "lr"))))
                    assert ours == value, (i, column)
                    continue
                assert np.array_equal(env.col(env.state, column)[i].numpy().reshape(-1), value), (i, column)
    assert 0 < int(terminated.sum()) < n and float(reward.sum()) > 0


# --------------------------------------------------------------------------------------
# The contract: spaces, capture, resume
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", list(GAMES))
def test_observations_are_uint8_images_and_the_spaces_say_so(env_id):
    env = make_env(env_id, 3)
    obs, _ = env.reset()
    space = env.single_observation_space
    assert obs["policy"].dtype == torch.uint8 and tuple(obs["policy"].shape) == (3, *space.shape)
    assert space.dtype == np.uint8 and space.shape[1:] == (10, 10) and space.high.max() == 255
    assert env.single_action_space.n == len(minatar.Environment(PACKAGE_NAME[env_id]).minimal_action_set())
    obs, reward, terminated, truncated, info = env.step(torch.zeros(3, dtype=torch.int64))
    assert reward.dtype == torch.float32 and terminated.dtype == truncated.dtype == torch.bool
    assert set(obs["policy"].unique().tolist()) <= {0, 255}


@pytest.mark.parametrize("env_id, frame_stack", [(g, 1) for g in GAMES] + [("MinAtar/Breakout-v1", 4)])
def test_step_is_capturable(env_id, frame_stack):
    """The checks of the capture contract (tests/replay.py) on the env's step: after a warm-up, two
    steps (one with episodes ending in it) run the same ops on the same tensors, read nothing back to
    the host and change no Python state."""
    n = 64
    env = make_env(env_id, n, seed=1, max_episode_steps=3, frame_stack=frame_stack)
    env.reset()
    action = torch.randint(0, env.single_action_space.n, (n,), generator=torch.Generator().manual_seed(0))
    env.step(action)  # warm-up
    calls, step = [], env.step
    for _ in range(3):  # the third step crosses the time limit
        before = python_state(step)
        with ReplaySignature((action,)) as sig, RecordHostSyncs() as syncs:
            step(action)
        calls.append((sig.ops, sig.external, syncs.syncs, changes(before, python_state(step))))
    assert calls[0][:2] == calls[1][:2] == calls[2][:2]
    assert all(not c[2] for c in calls), [c[2] for c in calls]
    assert all(not c[3] for c in calls), [c[3] for c in calls]


@pytest.mark.parametrize("env_id, frame_stack", [(g, 1) for g in GAMES] + [("MinAtar/Asterix-v1", 2)])
def test_state_dict_round_trip_resumes_exactly(env_id, frame_stack):
    n = 16
    env = make_env(env_id, n, seed=4, max_episode_steps=50, frame_stack=frame_stack)
    env.reset()
    rng = np.random.default_rng(1)
    for _ in range(30):
        env.step(torch.from_numpy(rng.integers(0, env.single_action_space.n, n)))
    saved = {k: v.clone() for k, v in env.state_dict().items()}
    actions = [torch.from_numpy(rng.integers(0, env.single_action_space.n, n)) for _ in range(60)]
    expected = [env.step(a) for a in actions]
    resumed = make_env(env_id, n, seed=99, max_episode_steps=50, frame_stack=frame_stack)
    resumed.load_state_dict(saved)
    for a, (obs, reward, terminated, truncated, info) in zip(actions, expected):
        r_obs, r_reward, r_terminated, r_truncated, _ = resumed.step(a)
        assert torch.equal(r_obs["policy"], obs["policy"]) and torch.equal(r_reward, reward)
        assert torch.equal(r_terminated, terminated) and torch.equal(r_truncated, truncated)


def test_frame_stack_observes_the_last_frames_of_the_episode():
    """frame_stack=3: the observation is the last 3 frames of the same env without stacking (the first
    frame repeated at an episode's start), and the final observation the last 3 of the ended episode."""
    n, k, c = 8, 3, 4
    stacked = make_env("MinAtar/Breakout-v1", n, seed=6, max_episode_steps=12, frame_stack=k)
    single = make_env("MinAtar/Breakout-v1", n, seed=6, max_episode_steps=12)
    assert stacked.single_observation_space.shape == (k * c, 10, 10)
    obs, _ = stacked.reset()
    frame, _ = single.reset()
    history = [[frame["policy"][i]] * k for i in range(n)]
    assert torch.equal(obs["policy"], torch.stack([torch.cat(h) for h in history]))
    rng = np.random.default_rng(0)
    ends = 0
    for _ in range(60):
        action = torch.from_numpy(rng.integers(0, 3, n))
        obs, _, terminated, truncated, info = stacked.step(action)
        frame, _, _, _, single_info = single.step(action)
        for i in range(n):
            final = history[i][1:] + [single_info["final_obs"]["policy"][i]]
            assert torch.equal(info["final_obs"]["policy"][i], torch.cat(final))
            history[i] = (
                [frame["policy"][i]] * k if terminated[i] or truncated[i] else final[:-1] + [frame["policy"][i]]
            )
            ends += int(terminated[i] or truncated[i])
            assert torch.equal(obs["policy"][i], torch.cat(history[i]))
    assert ends > n


def test_bad_options_fail_clearly():
    with pytest.raises(ValueError, match="sticky_action_prob"):
        make_env("MinAtar/Breakout-v1", 2, sticky_action_prob=1.5)
    with pytest.raises(TypeError, match="sticky_action_prob"):
        make_env("MinAtar/Breakout-v1", 2, sticky=0.1)
    with pytest.raises(ValueError, match="frame_stack"):
        make_env("MinAtar/Breakout-v1", 2, frame_stack=0)
    env = make_env("MinAtar/Breakout-v1", 2, frame_stack=2)
    with pytest.raises(ValueError, match="frame_stack"):
        env.load_state_dict(make_env("MinAtar/Breakout-v1", 2).state_dict())


def test_render_draws_the_observation_enlarged():
    """No renderer of its own: the video frames are the observation, each object kind in its colour."""
    from common.envs.frames import frames_from_image

    env = make_env("MinAtar/Breakout-v1", 4, seed=2)
    env.reset()
    for _ in range(3):
        env.step(torch.tensor([0, 1, 2, 1]))
    frames = env.render([1, 3])
    obs = env._observe(env.state)
    assert len(frames) == 2 and all(f.shape == (160, 160, 3) and f.dtype == np.uint8 for f in frames)
    for frame, i in zip(frames, (1, 3)):
        lit = frame[::16, ::16].any(-1)  # one pixel per board cell
        assert np.array_equal(lit, obs[i].numpy().any(0))
        ball = obs[i, 1].numpy().nonzero()
        assert len(set(map(tuple, frame[::16, ::16][ball]))) == 1  # the ball has one colour
        assert not np.array_equal(frame[::16, ::16][ball][0], frame[16, 0])  # not the bricks' colour
    with pytest.raises(ValueError, match="kind"):
        frames_from_image(obs, kind="hsv")
    assert frames_from_image(torch.zeros(2, 4, 84, 84, dtype=torch.uint8))[0].shape == (168, 168, 3)


def test_video_of_minatar_needs_no_pygame(monkeypatch):
    from common.envs import draws_with_pygame
    from common.video import check_dependencies

    monkeypatch.setitem(sys.modules, "pygame", None)
    assert not draws_with_pygame("MinAtar/Breakout-v1")  # drawn from the observation
    check_dependencies(pygame=draws_with_pygame("MinAtar/Breakout-v1"))
    assert draws_with_pygame("CartPole-v1")  # drawn by gymnasium's renderer
    with pytest.raises(SystemExit, match="pygame"):
        check_dependencies(pygame=draws_with_pygame("CartPole-v1"))


def test_seaquest_counts_the_entities_its_slots_cannot_hold():
    """Seaquest's entity lists are fixed numbers of slots: two slots of each, and an enemy and a diver spawned at
    every step, must overflow, and every dropped entity is counted (info["log"] per step, entities_dropped in all);
    with the package's capacities a game of the same steps drops none."""
    from common.envs.minatar import Seaquest

    class Crowded(Seaquest):
        lists = {name: (2, extra) for name, (_, extra) in Seaquest.lists.items()}
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
        init_spawn_speed = diver_spawn_speed = 1

    for cls, expect_drops in ((Crowded, True), (Seaquest, False)):
        env = cls(8, seed=3, max_episode_steps=200)
        env.reset()
        logged = 0.0
        for _ in range(100):
            *_, info = env.step(torch.full((8,), 5))  # fire: bullets too
            logged += info["log"]["entities_dropped"].item()
        assert logged == env.entities_dropped.item() and (logged > 0) == expect_drops, (cls.__name__, logged)
