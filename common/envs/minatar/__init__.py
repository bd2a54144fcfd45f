"""MinAtar's five games (Young & Tian, 2019) as batched torch envs: `MinAtar/Breakout-v1`, ...

Each class reproduces the game of the same name in the `minatar` package (version 1.0.15):
dynamics, rewards, terminations, sticky actions (`sticky_action_prob`, default 0.1) and the
difficulty ramp (`difficulty_ramping`, default on), with the package's gym registration's
"-v1" action set (the game's minimal action set, e.g. no-op/left/right for Breakout).

Layout, as the package lays out its own games (environment.py over environments/<game>.py):
base.py holds MinAtarEnv, what every game shares (the step, sticky actions, random draws, frame
stacking, state columns, drawing); asterix.py, breakout.py, freeway.py, seaquest.py and
space_invaders.py hold one game each. Import them from here: `from common.envs.minatar import Breakout`.

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

from common.envs.minatar.asterix import Asterix
from common.envs.minatar.base import FULL_ACTIONS, MinAtarEnv
from common.envs.minatar.breakout import Breakout
from common.envs.minatar.freeway import Freeway
from common.envs.minatar.seaquest import Seaquest
from common.envs.minatar.space_invaders import SpaceInvaders

MINATAR_ENVS = (Breakout, SpaceInvaders, Freeway, Asterix, Seaquest)

__all__ = ["FULL_ACTIONS", "MINATAR_ENVS", "Asterix", "Breakout", "Freeway", "MinAtarEnv", "Seaquest", "SpaceInvaders"]
