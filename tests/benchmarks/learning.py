"""Learning results: scripts x envs x seeds, run with their default flags, into a table and figures.

    python -m tests.benchmarks.learning --out runs/results       # every experiment, seeds 1-5
    python -m tests.benchmarks.learning --experiments ppo:CartPole-v1 --seeds 1 2 3 --jobs 2 --out runs/cartpole
    python -m tests.benchmarks.learning --report runs/cartpole/learning.json   # the tables and figures again

Each run is `python algos/<algo>.py --env-id <env> --seed <s>` with the experiment's budget (and
flags, if any) in a subprocess of its own; runs go `--jobs` at a time, with cores / jobs torch
threads each.
From each run's TensorBoard events it takes the eval curve and writes, under --out:

- `learning.json`: every run's eval curve (env steps, training seconds, return) and summary;
- `learning.md`: per script and env, the env steps and training seconds until the eval return
  first reached the target (median and range over the seeds that reached it), how many seeds
  did, the eval return of the last fifth of each run and the best one (mean +- std over seeds), the
  command and the hardware;
- `learning_steps.png`, `learning_time.png`: eval return against env steps and against training
  wall time, mean over seeds with a min-max band, one panel per env (needs matplotlib: the
  `[plot]` extra).

--out names the directory; there is no default. The committed results live in
tests/benchmarks/results/ and are rewritten only on request: an --out there (or a --report of a
learning.json there) also needs --update-committed, and then the results document
(tests/benchmarks/results/README.md) and the README's summary are written again from every committed
learning.json:

    python -m tests.benchmarks.learning --report tests/benchmarks/results --update-committed --no-figures

With --stop-at-target each run stops at its experiment's target (`--target-return`), so its
final return is the one that reached the target, and a budget is spent only where it is not reached.

Training seconds count from the start of the training loop (after start-up and compilation)
and include the evaluations.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.benchmarks.bench import machine_info, machine_label  # noqa: E402

COMMITTED = ROOT / "tests" / "benchmarks" / "results"  # the results the README shows

# script:env[@label] -> target eval return, env-step budget, extra flags over the script's named settings for the env
# (common.settings: its family's set, else its defaults; tests/test_settings.py checks that each gives the Args the
# long flags of the committed results gave); `after`:
# (experiment, flag, checkpoint): a run starts from the checkpoint of that experiment's run of the same seed, given
# with the flag (--teacher, --init-from); that run goes first and is not stopped at its target
MASKED = '{"mask_velocity": true}'
FAST_CARTPOLE = ["--num-envs", "256", "--num-steps", "32", "--eval-interval", "4"]
EXPERIMENTS = {
    "ppo:CartPole-v1": dict(target=475.0, budget=3_000_000, flags=[]),
    "ppo:Acrobot-v1": dict(target=-100.0, budget=5_000_000, flags=[]),
    "ppo:Pendulum-v1": dict(target=-200.0, budget=8_000_000, flags=[]),
    # The goal lies hundreds of steps away for a policy that has just found it: at gamma 0.99 it is
    # discounted to under 1% (0.99**500), its signal drowns under the immediate action costs, and the
    # policy settles on standing still. A longer discount keeps it; a wider start to the exploration
    # noise lets every seed find it: ppo's mountaincar settings (--gamma 0.999 --init-log-std 0.5).
    "ppo:MountainCarContinuous-v0": dict(target=90.0, budget=3_000_000, flags=[]),
    "ppo:MountainCarContinuous-v0@defaults": dict(target=90.0, budget=3_000_000, flags=["--settings", "builtin"]),
    # Exploration: RND's intrinsic reward (algos/ppo_rnd.py) against ppo alone, both at their defaults (gamma 0.99,
    # where
    # the goal's reward fades under the action costs); the targets are gymnasium's reward thresholds
    "ppo_rnd:MountainCarContinuous-v0": dict(target=90.0, budget=3_000_000, flags=[]),
    # MountainCar-v0: `goal` -200, the return of an episode cut at its 200 steps, so an eval return above it says an
    # eval episode reached the flag; @decay: the intrinsic weight taken linearly to 0 by 488 steps of each env
    # (2,000,000 env steps at 4,096 envs), rsl_rl's linear schedule, so the last third trains on the task's reward alone
    "ppo:MountainCar-v0": dict(target=-110.0, budget=3_000_000, goal=-200.0, flags=[]),
    "ppo_rnd:MountainCar-v0": dict(target=-110.0, budget=3_000_000, goal=-200.0, flags=[]),
    "ppo_rnd:MountainCar-v0@decay": dict(
        target=-110.0,
        budget=3_000_000,
        goal=-200.0,
        flags=["--rnd-weight-final", "0", "--rnd-weight-steps", "0", "488"],
    ),
    # Symmetry (ppo --symmetry, rsl_rl's): the minibatch's mirror images added (augmentation), or the mirror loss at its
    # default coefficient 1.0, against ppo with the symmetry only measured (--symmetry log: the same updates), all at
    # the
    # defaults otherwise; charts/symmetry_error read at the end
    **{
        f"ppo:{env_id}@{mode}": dict(target=target, budget=budget, flags=["--symmetry", mode])
        for env_id, target, budget in [("Pendulum-v1", -200.0, 8_000_000), ("Acrobot-v1", -100.0, 5_000_000)]
        for mode in ("log", "augmentation", "mirror-loss")
    },
    "pqn:CartPole-v1": dict(target=475.0, budget=3_000_000, flags=[]),
    "pqn:Acrobot-v1": dict(target=-100.0, budget=3_000_000, flags=[]),
    # TD3 and SAC: their defaults depend on the device (32 envs and batches of 512 on a CPU)
    "td3:Pendulum-v1": dict(target=-200.0, budget=150_000, flags=[]),
    "sac:Pendulum-v1": dict(target=-200.0, budget=150_000, flags=[]),
    # Partially observed: the velocities masked out of the observation. A feed-forward policy (ppo) cannot
    # tell which way the pole moves; the recurrent one (ppo_lstm) infers it from its observation history.
    # Their critics read the masked observation too (--no-asymmetric-critic: the rows as measured before the
    # masked envs had a "critic" group; with it, the default, they are unmeasured).
    "ppo_lstm:CartPole-v1@masked": dict(
        target=475.0, budget=5_000_000, flags=["--env-kwargs", '{"mask_velocity": true}', "--no-asymmetric-critic"]
    ),
    "ppo:CartPole-v1@masked": dict(
        target=475.0, budget=5_000_000, flags=["--env-kwargs", '{"mask_velocity": true}', "--no-asymmetric-critic"]
    ),
    "ppo_lstm:Pendulum-v1@masked": dict(
        target=-200.0, budget=30_000_000, flags=["--env-kwargs", '{"mask_velocity": true}', "--no-asymmetric-critic"]
    ),
    "ppo:Pendulum-v1@masked": dict(
        target=-200.0, budget=30_000_000, flags=["--env-kwargs", '{"mask_velocity": true}', "--no-asymmetric-critic"]
    ),
    "ppo_lstm:CartPole-v1": dict(target=475.0, budget=3_000_000, flags=[]),
    "ppo_lstm:Pendulum-v1": dict(target=-200.0, budget=8_000_000, flags=[]),
    # Distillation (algos/distill.py): a ppo.py teacher trained on the unmasked task (the @teacher run of the same
    # seed, run first and past its target) reads the masked env's "critic" group, the full state; the student reads
    # the masked observations. Its env steps are the student's alone, against ppo_lstm's from scratch above. Then
    # ppo_lstm fine-tunes the LSTM student (--init-from its best.pt), evaluated at each of its first 10 iterations.
    "ppo:CartPole-v1@teacher": dict(target=475.0, budget=393_216, flags=[*FAST_CARTPOLE]),
    "distill:CartPole-v1@masked-lstm": dict(
        target=475.0,
        budget=327_680,
        after=("ppo:CartPole-v1@teacher", "--teacher", "last.pt"),
        flags=["--env-kwargs", MASKED, *FAST_CARTPOLE[:4], "--eval-interval", "2"],
    ),
    "distill:CartPole-v1@masked-mlp": dict(
        target=475.0,
        budget=327_680,
        after=("ppo:CartPole-v1@teacher", "--teacher", "last.pt"),
        flags=["--env-kwargs", MASKED, *FAST_CARTPOLE[:4], "--eval-interval", "2", "--cell", "none"],
    ),
    "ppo_lstm:CartPole-v1@finetune": dict(
        target=475.0,
        budget=81_920,
        after=("distill:CartPole-v1@masked-lstm", "--init-from", "best.pt"),
        flags=[
            "--env-kwargs",
            MASKED,
            *FAST_CARTPOLE[:4],
            "--eval-interval",
            "1",
            "--learning-rate",
            "1e-5",
            "--lr-schedule",
            "constant",
            "--ent-coef",
            "0",
        ],
    ),
    "ppo:Pendulum-v1@teacher": dict(target=-200.0, budget=8_000_000, flags=[]),
    "distill:Pendulum-v1@masked-lstm": dict(
        target=-200.0,
        budget=1_747_626,
        after=("ppo:Pendulum-v1@teacher", "--teacher", "best.pt"),
        flags=[
            "--env-kwargs",
            MASKED,
            "--num-envs",
            "256",
            "--update-epochs",
            "5",
            "--num-minibatches",
            "8",
            "--learning-rate",
            "2e-3",
            "--eval-interval",
            "4",
        ],
    ),
    # the fastest CartPole settings found for a 2-core CPU (run with --jobs 1: both cores for one run)
    "ppo:CartPole-v1@fast": dict(
        target=475.0, budget=500_000, flags=["--num-envs", "256", "--num-steps", "32", "--eval-interval", "4"]
    ),
    # Pixels: MinAtar Breakout's uint8 [4, 10, 10] frames through MinAtar's one-conv network (--encoder minatar;
    # the Atari DQN CNN's 8x8/4 kernel does not fit 10x10 frames), on a CPU. pqn takes the PQN code's MinAtar
    # config (purejaxql: 128 envs x 32 steps, 32 minibatches, 2 epochs, lr 5e-4, epsilon to 0.05 over the first 10%,
    # unscaled rewards), except Adam for RAdam and the head's one extra 128-unit layer; ppo the MinAtar-sized
    # batch with a larger entropy bonus: the scripts' minatar settings. @mlp: the same settings on the flattened
    # frames, for contrast. The target is not from the papers: see the README (Pixels).
    "pqn:MinAtar/Breakout-v1": dict(target=10.0, budget=500_000, flags=[]),
    "pqn:MinAtar/Breakout-v1@mlp": dict(target=10.0, budget=500_000, flags=["--encoder", "mlp"]),
    "ppo:MinAtar/Breakout-v1": dict(target=10.0, budget=500_000, flags=[]),
    "ppo:MinAtar/Breakout-v1@mlp": dict(target=10.0, budget=500_000, flags=["--encoder", "mlp"]),
}
# MinAtar's five games, pqn and ppo with the Breakout settings above, no target of our own (Breakout's 10 aside): the
# eval return at env steps beside the one published figure readable near this budget, gymnax-blines' PPO log
# (RobertTLange/gymnax-blines, agents/<Game>-MinAtar/ppo.pkl: one seed, an MLP, gymnax's MinAtar without sticky
# actions and with 1,000-step episodes, so another setting; its return at 639,936 steps). None has Seaquest; no PQN
# figure is readable below 10M steps. The budget is 160 iterations of 4,096 steps, the evaluation after 639,936.
MINATAR_BUDGET = 655_360
GYMNAX_PPO = {"Asterix": 1.62, "Breakout": 15.45, "Freeway": 28.16, "SpaceInvaders": 30.37}
for game in ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders"):
    for algo in ("pqn", "ppo"):
        name = f"{algo}:MinAtar/{game}-v1"
        base = EXPERIMENTS.get(name, dict(target=math.inf, budget=MINATAR_BUDGET, flags=[]))  # Breakout's kept
        EXPERIMENTS[name] = dict(
            base,
            at_steps=(100_000, 250_000, 500_000, 639_936),
            reference=GYMNAX_PPO.get(game) if algo == "ppo" else None,
            reference_at=639_936,
        )
# Atari Pong with CleanRL's ppo_atari_envpool.py settings, ppo's atari settings (8 envs x 128 steps, 4 minibatches, 4
# epochs, lr 2.5e-4 annealed over its 10M steps, clip 0.1, entropy 0.01, value coefficient 0.5, gradient clip 0.5,
# rewards clipped and not normalized; its agent: one nature CNN under two linear heads; steps are agent steps, 4 frames
# each). Eval: 8 games at every 51,200 steps. On a CPU it takes hours: a checkpoint every 10 minutes and --resume auto,
# so the same command, stopped (SIGTERM: the run writes last.pt and its summary) and run again with --reuse left out,
# goes on where it stopped. The reference is CleanRL's table (docs/benchmark/ppo_atari_envpool.md: 3 seeds at 10M
# steps).
EXPERIMENTS["ppo:envpool:Pong-v5"] = dict(
    target=math.inf,
    budget=10_000_000,
    reference=20.45,
    reference_at=10_000_000,
    train_bin=100_000,
    at_steps=(500_000, 1_000_000, 2_500_000, 10_000_000),
    flags=["--save-interval-seconds", "600", "--resume", "auto"],
)
# gymnasium MuJoCo on a CPU at the scripts' mujoco settings: td3/sac 32 envs, 2 updates of 512 per step, 1-step
# returns, Adam at 1e-3 (the @n1lr rows), an eval on 10 envs every 50,016 steps; ppo with CleanRL's
# ppo_continuous_action.py settings but 8 envs x 256 steps for its 1 x 2048 (the same batch), an eval on 8 envs every
# 51,200 steps. The target is 90% of CleanRL's published mean return at 1M steps (3 seeds, training episodic returns;
# td3 and ppo on the v4 tasks, sac on v2: docs/rl-algorithms/td3.md, sac.md and ppo.md of vwxyzjn/cleanrl); the
# at-steps table gives each seed's eval return at 100k/250k/500k/1M beside it.
CLEANRL = {
    "td3": {"Hopper-v5": 3134.61, "HalfCheetah-v5": 9583.22, "Walker2d-v5": 4057.59},
    "sac": {"Hopper-v5": 2310.46, "HalfCheetah-v5": 9634.89, "Walker2d-v5": 3591.45},
    "ppo": {"HalfCheetah-v5": 1442.64},
}
OFF_POLICY_MUJOCO = ["--device", "cpu"]
# td3's mujoco set when these rows ran: 2 updates of 512 per step (4 of 256 since: the td3-hopper section)
TD3_TWO_UPDATES = ["--num-updates", "2", "--batch-size", "512"]
BUILTIN_LR = ["--q-lr", "3e-4", "--policy-lr", "3e-4"]  # the GPU-sized defaults' learning rates, for the rows below
PPO_MUJOCO = ["--num-envs", "8", "--num-steps", "256"]
AT_STEPS = (100_000, 250_000, 500_000, 1_000_000)
for algo, tasks in CLEANRL.items():
    for task, published in tasks.items():
        EXPERIMENTS[f"{algo}:gym:{task}"] = dict(
            target=round(0.9 * published, 1),
            budget=1_000_000,
            reference=published,
            at_steps=AT_STEPS,
            flags=PPO_MUJOCO if algo == "ppo" else [*OFF_POLICY_MUJOCO, "--n-step", "3", *BUILTIN_LR],
        )
        if algo == "td3":
            EXPERIMENTS[f"{algo}:gym:{task}"]["flags"] += TD3_TWO_UPDATES
# td3 on Hopper-v5 at its defaults (3-step returns) sat at 330-400 from 100k to 300k steps (seed 1); with --n-step 1
# it rose to 810 by 300k (the README's gymnasium-MuJoCo paragraph: what else was measured). sac@n1, seed 1, was
# stopped at 450k steps (1,065 there; sac at its defaults: 2,763).
for name in [f"td3:gym:{task}" for task in CLEANRL["td3"]] + ["sac:gym:Hopper-v5"]:
    two = TD3_TWO_UPDATES if name.startswith("td3") else []
    EXPERIMENTS[f"{name}@n1"] = dict(EXPERIMENTS[name], flags=[*OFF_POLICY_MUJOCO, *BUILTIN_LR, *two])
# HalfCheetah-v5 below 90% at the CPU defaults (seed 1 at 1M: td3@n1 7,025, sac 7,863): twice the gradient steps on
# the same transitions sampled per env step (4 updates of 256 for 2 of 512), and td3 with its default 3-step returns.
FOUR_UPDATES = ["--num-updates", "4", "--batch-size", "256"]
EXPERIMENTS["td3:gym:HalfCheetah-v5@n1u4"] = dict(
    EXPERIMENTS["td3:gym:HalfCheetah-v5"],
    flags=[*OFF_POLICY_MUJOCO, *BUILTIN_LR],  # td3's mujoco set: 4 of 256
)
EXPERIMENTS["sac:gym:HalfCheetah-v5@u4"] = dict(
    EXPERIMENTS["sac:gym:HalfCheetah-v5"], flags=[*OFF_POLICY_MUJOCO, "--n-step", "3", *BUILTIN_LR, *FOUR_UPDATES]
)
# td3@n1 with Adam at 1e-3 for the actor and the critics (Fujimoto et al.'s first TD3 setting) where the CPU defaults
# take 16x fewer gradient steps per env step than CleanRL's script: a larger step for each, at no cost per step. The
# same flags for sac; td3@n1lr and sac@n1lr are the scripts' mujoco settings (td3's with 2 updates of 512 then).
for algo in ("td3", "sac"):
    for task in CLEANRL[algo]:
        EXPERIMENTS[f"{algo}:gym:{task}@n1lr"] = dict(
            EXPERIMENTS[f"{algo}:gym:{task}"],
            flags=[*OFF_POLICY_MUJOCO, *(TD3_TWO_UPDATES if algo == "td3" else [])],
        )
# td3 with its mujoco set of then (4 updates of 256 per step, tau 0.1, observation normalization) and nothing else,
# 500k steps
EXPERIMENTS["td3:gym:Hopper-v5@500k"] = dict(
    target=2500.0,
    budget=500_000,
    reference=CLEANRL["td3"]["Hopper-v5"],
    at_steps=(100_000, 250_000, 500_000),
    flags=[],
)

# Ant-v5 below CleanRL's TD3 per env step at 1M (issue 78): td3's mujoco set of then (4 updates of 256 per iteration,
# tau 0.1, observation normalization) with one thing at a time changed toward
# CleanRL's td3_continuous_action.py (1 update of 256 per transition from one env; tau 0.005; exploration noise 0.1;
# no observation normalization; Adam at 3e-4; 25,000 random steps), one seed, 100k env steps, an eval every 313
# iterations (10,016 steps) for the curve. @set: the mujoco set itself; @u8/@u16/@u32: 8/16/32 updates of 256 per
# iteration of 32 envs (0.25/0.5/1 update per transition, CleanRL's 1 at @u32); @obs27: Ant-v4's 27-dim observation
# (Ant-v5 adds the 78 contact forces, CleanRL's Ant-v4 leaves them out).
ANT_EVAL = ["--eval-interval", "313"]
ANT_ARMS = {
    "set": [],
    "u8": ["--num-updates", "8"],
    "u16": ["--num-updates", "16"],
    "u32": ["--num-updates", "32"],
    "tau": ["--tau", "0.005"],
    "u32tau": ["--num-updates", "32", "--tau", "0.005"],
    "noise": ["--std-min", "0.1", "--std-max", "0.1"],
    "noobsnorm": ["--no-obs-norm"],
    "u32noobsnorm": ["--num-updates", "32", "--no-obs-norm"],
    "lr": BUILTIN_LR,
    "ls25k": ["--learning-starts", "25000"],
    "obs27": ["--env-kwargs", '{"env_kwargs": {"include_cfrc_ext_in_observation": false}}'],
}
for arm, arm_flags in ANT_ARMS.items():
    EXPERIMENTS[f"td3:gym:Ant-v5@{arm}"] = dict(
        target=math.inf,
        budget=100_000,
        reference=4917.0,
        at_steps=(25_000, 50_000, 75_000, 100_000),
        flags=[*ANT_EVAL, *arm_flags],
    )
# Ant-v5 at CleanRL's budget (issue 78): the mujoco set (@1m) and the set without observation normalization
# (@1mnoobsnorm), the best single change of the 100k arms, an eval every 1,563 iterations (the set's); 3 seeds each.
# @1mnoobsnorm27: one change more, the 27 numbers of Ant-v4's observation that CleanRL's published runs observe (the
# second best change at 100k), so that the task is the one its 4,917 was measured on but for v5's reward changes.
# @1mnoobsnorm27u8: that and 8 updates of 256 per iteration of 32 envs (0.25 per transition, twice the set's: the
# issue's first hypothesis at the budget where the set still climbs; at 100k more updates were behind, @u32 above).
# @1mnoobsnorm27u8tau, @1mnoobsnorm27u8lr: that and CleanRL's tau 0.005, or its Adam at 3e-4: the two changes toward
# CleanRL's that @1mnoobsnorm27u8's critic divergences pointed to (tests/benchmarks/collapse.py reads them from a run).
# A run is 45 minutes to hours on one CPU core by the machine's load: a checkpoint every 10 minutes with the replay
# buffer in it (--save-buffer, 0.88 GB at 1M transitions of Ant's 105 numbers) and --resume auto, so the same command,
# stopped (SIGTERM) and run again with --reuse left out, goes on bit-identically where it stopped.
LONG_RUN = ["--save-buffer", "--save-interval-seconds", "600", "--resume", "auto"]
for arm, arm_flags in {
    "1m": [],
    "1mnoobsnorm": ["--no-obs-norm"],
    "1mnoobsnorm27": ["--no-obs-norm", *ANT_ARMS["obs27"]],
    "1mnoobsnorm27u8": ["--no-obs-norm", *ANT_ARMS["obs27"], *ANT_ARMS["u8"]],
    "1mnoobsnorm27u8tau": ["--no-obs-norm", *ANT_ARMS["obs27"], *ANT_ARMS["u8"], *ANT_ARMS["tau"]],
    "1mnoobsnorm27u8lr": ["--no-obs-norm", *ANT_ARMS["obs27"], *ANT_ARMS["u8"], *ANT_ARMS["lr"]],
}.items():
    EXPERIMENTS[f"td3:gym:Ant-v5@{arm}"] = dict(
        target=round(0.9 * 4917.0, 1),
        budget=1_000_000,
        reference=4917.0,
        at_steps=AT_STEPS,
        flags=[*arm_flags, *LONG_RUN],
    )
# td3's mujoco set since issue 78, given as flags (rows that stay what they ran): Ant-v5's best at 1M
# (@1mnoobsnorm27u8tau) less its Ant-only change of observation, on the three tasks the set of then led or neared
# CleanRL on: no observation normalization, 8 updates of 256 per iteration of 32 envs (0.25 per transition), tau
# 0.005. It became the set when these tasks kept their lead (the mujoco-set section).
# @1mnoobsnorm27u16tau: Ant-v5 with 16 updates (0.5 per transition), the next step toward CleanRL's 1.
# Humanoid-v5 beside them, against CleanRL's TD3 on Humanoid-v4: 5,035.36 ± 21.67 (its docs/rl-algorithms/td3.md,
# 3 seeds); v5's 348 numbers are v4's 376 less 28 that are always zero (the world body's inertia, velocity and
# external force, the free joint's actuator force), and v5 charges again the contact cost that v4 left out. Ant-v5 by
# its name alone (its 105 numbers, the 78 contact forces in), as a user runs it, against the 4,917 of the Ant rows.
# @obsnormu8tau: the same with observation normalization on. Without it on Humanoid-v5 the actor's tanh saturated
# within 20k steps (every episode 16 steps long from there to 186k, shorter than a random policy's 24, seed 1): v5's
# 78 contact forces reach thousands (v4's were all zero) and its actuator forces 120.


def at_cleanrl_budget(published: float | None, flags: list[str]) -> dict:
    """An experiment at CleanRL's 1M MuJoCo steps against its published mean (target 90% of it; none where it
    publishes none)."""
    target = math.inf if published is None else round(0.9 * published, 1)
    return dict(target=target, budget=1_000_000, reference=published, at_steps=AT_STEPS, flags=flags)


for task, published in {**CLEANRL["td3"], "Humanoid-v5": 5035.36, "Ant-v5": 4917.0}.items():
    for arm, obs_norm in [("noobsnormu8tau", "--no-obs-norm"), ("obsnormu8tau", "--obs-norm")]:
        EXPERIMENTS[f"td3:gym:{task}@{arm}"] = at_cleanrl_budget(
            published, [obs_norm, *ANT_ARMS["u8"], *ANT_ARMS["tau"], *LONG_RUN]
        )
EXPERIMENTS["td3:gym:Ant-v5@1mnoobsnorm27u16tau"] = dict(
    EXPERIMENTS["td3:gym:Ant-v5@1mnoobsnorm27u8tau"],
    flags=["--no-obs-norm", *ANT_ARMS["obs27"], *ANT_ARMS["u16"], *ANT_ARMS["tau"], *LONG_RUN],
)

# ppo.py's mujoco set by the env's name alone (CleanRL's ppo_continuous_action.py: 1 env x 2048 steps, 488 iterations)
# on the five tasks, against CleanRL's PPO on the v4 tasks at 1M steps, 3 seeds (its docs/benchmark/
# ppo_continuous_action.md, tag pr-424). It publishes none on Ant.
for task, published in {
    "Hopper-v5": 2382.86,
    "Walker2d-v5": 2287.95,
    "HalfCheetah-v5": CLEANRL["ppo"]["HalfCheetah-v5"],
    "Ant-v5": None,
    "Humanoid-v5": 716.11,
}.items():
    EXPERIMENTS[f"ppo:gym:{task}@set"] = at_cleanrl_budget(published, [])

# sac.py's mujoco set by name on the two tasks its table lacks: Humanoid-v5 against CleanRL's SAC on Humanoid-v4 at 1M,
# 4,996.29 ± 686.40 (its docs/benchmark/sac.md, tag pr-424, 3 seeds); it publishes none on Ant.
for task, published in {"Ant-v5": None, "Humanoid-v5": 4996.29}.items():
    EXPERIMENTS[f"sac:gym:{task}@set"] = at_cleanrl_budget(published, LONG_RUN)


def td3_mujoco_set_before_78(flags: list[str]) -> list[str]:
    """An experiment's flags over td3's mujoco set as it was when the experiment ran, before issue 78's runs gave it 8
    updates, tau 0.005 and no observation normalization: the flags, then the old set's values of the three that they
    leave to the set (4 updates of 256, tau 0.1, observation normalization)."""
    return [
        *flags,
        *([] if "--num-updates" in flags else ["--num-updates", "4"]),
        *([] if "--tau" in flags else ["--tau", "0.1"]),
        *([] if "--no-obs-norm" in flags or "--obs-norm" in flags else ["--obs-norm"]),
    ]


for name, spec in EXPERIMENTS.items():
    if name.startswith("td3:gym:"):  # every td3 MuJoCo experiment: those that name all three keep their flags
        spec["flags"] = td3_mujoco_set_before_78(spec["flags"])


def split_name(name: str) -> tuple[str, str, str]:
    """'ppo:CartPole-v1@fast' -> ('ppo', 'CartPole-v1', 'fast')."""
    algo, rest = name.split(":", 1)
    env_id, _, label = rest.partition("@")
    return algo, env_id, label


def run_command(name: str, seed: int, budget: int, flags: list[str], out: Path) -> list[str]:
    algo, env_id, label = split_name(name)
    run_name = f"{algo}__{env_id.replace('/', '-')}{'__' + label if label else ''}__{seed}"
    return [
        "python",
        f"algos/{algo}.py",
        "--env-id",
        env_id,
        "--seed",
        str(seed),
        "--total-timesteps",
        str(budget),
        *flags,
        "--no-progress",
        "--output-dir",
        str(out),
        "--run-name",
        run_name,
    ]


def training_clock(run_dir: Path):
    """A function from an event's wall time to the run's training seconds then, or None (no charts/SPS). Each events
    file is a segment of the run (its start, then each resume), and the time between segments (a stopped run waiting
    to be resumed) is not training. The first segment starts where its first SPS event dates it (SPS = steps / (now -
    start), from step 0); a resumed one one log interval (the median time between its SPS events) before its first."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    segments, done = [], 0.0  # (start, training seconds before it), in order
    for path in sorted(Path(run_dir).glob("events.out.tfevents.*"), key=lambda p: float(p.name.split(".")[3])):
        acc = EventAccumulator(str(path))
        acc.Reload()
        if "charts/SPS" not in acc.Tags()["scalars"]:
            continue
        sps = acc.Scalars("charts/SPS")
        if not segments:
            if sps[0].value <= 0:
                return None
            lead = sps[0].step / sps[0].value
        else:
            gaps = [b.wall_time - a.wall_time for a, b in zip(sps, sps[1:])]
            lead = statistics.median(gaps) if gaps else 0.0
        start = sps[0].wall_time - lead
        end = max(e.wall_time for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag))
        segments.append((start, done))
        done += end - start
    if not segments:
        return None
    return lambda t: next(
        (before + t - start for start, before in reversed(segments) if t >= start), t - segments[0][0]
    )


def read_curve(run_dir: Path, train_bin: int | None = None) -> dict:
    """The eval curve of a run: env steps, training seconds and returns, from its events. With `train_bin`, also the
    training curve (charts/episodic_return, what CleanRL plots): the mean of the values logged in each `train_bin`
    env steps, at the bin's end (train_steps, train_returns)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    clock = training_clock(run_dir)
    evals = acc.Scalars("eval/episodic_return") if "eval/episodic_return" in acc.Tags()["scalars"] else []
    curve = {
        "steps": [e.step for e in evals],
        "seconds": [clock(e.wall_time) for e in evals] if clock else [],
        "returns": [e.value for e in evals],
    }
    if train_bin and "charts/episodic_return" in acc.Tags()["scalars"]:
        bins = {}
        for e in acc.Scalars("charts/episodic_return"):
            bins.setdefault(math.ceil(e.step / train_bin) * train_bin, []).append(e.value)
        curve["train_steps"] = sorted(bins)
        curve["train_returns"] = [statistics.mean(bins[x]) for x in curve["train_steps"]]
    if "charts/symmetry_error" in acc.Tags()["scalars"]:  # ppo --symmetry: the policy's asymmetry at the last log
        curve["symmetry_error"] = acc.Scalars("charts/symmetry_error")[-1].value
    return curve


def run_one(job: dict) -> dict:
    cmd = job["command"]
    env = dict(os.environ, OMP_NUM_THREADS=str(job["threads"]), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.time()
    run_dir = ROOT / job["out"] / cmd[-1]  # the runs write relative to the project root, their cwd
    if job["reuse"] and (run_dir / "summary.json").exists():  # --reuse: a finished run is read, not run again
        proc = subprocess.CompletedProcess(cmd, 0, "", "")
    else:
        proc = subprocess.run([sys.executable, *cmd[1:]], cwd=ROOT, env=env, capture_output=True, text=True)
    record = {
        **{k: job[k] for k in ("name", "algo", "env_id", "seed", "target", "budget", "threads")},
        "command": shlex.join(cmd),
        "returncode": proc.returncode,
        "process_seconds": time.time() - t0,
    }
    if proc.returncode != 0 or not (run_dir / "summary.json").exists():
        record["error"] = (proc.stdout + proc.stderr)[-2000:]
        return record
    record["summary"] = json.loads((run_dir / "summary.json").read_text())
    record["curve"] = read_curve(run_dir, EXPERIMENTS.get(job["name"], {}).get("train_bin"))
    reached = [i for i, r in enumerate(record["curve"]["returns"]) if r >= job["target"]]
    record["steps_to_target"] = record["curve"]["steps"][reached[0]] if reached else None
    record["seconds_to_target"] = (
        record["curve"]["seconds"][reached[0]] if reached and record["curve"]["seconds"] else None
    )
    return record


def fmt(x, spec: str = ",.0f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def median_range(values: list, spec: str) -> str:
    if not values:
        return "-"
    return f"{fmt(statistics.median(values), spec)} ({fmt(min(values), spec)}-{fmt(max(values), spec)})"


def mean_std(values: list) -> str:
    if not values:
        return "-"
    return f"{statistics.mean(values):,.1f} ± {statistics.pstdev(values):,.1f}"


def seeds_cell(values: list, spec: str) -> str:
    """Mean ± std over the seeds that have a value, then each seed's ("-" for one without), in seed order."""
    got = [v for v in values if v is not None]
    return f"{mean_std(got)} ({' / '.join(fmt(v, spec) for v in values)})" if got else "-"


def at_or_after(steps: list, values: list, step: int, default=None):
    """The value at the first of `steps` at or after `step`, else `default`."""
    return next((value for x, value in zip(steps, values) if x >= step), default)


# One evaluation swings from the next by more than seeds differ (a few greedy episodes of a policy still moving), so
# an eval figure in these tables is a mean over the evaluations in the last fifth of the env steps up to its point.
WINDOW = 0.2


def late_mean(steps: list, returns: list, upto: int, end: int | None = None) -> float:
    """The mean of the returns of the evaluations at env steps from (1 - WINDOW) * upto to the evaluation at index
    `end` (default: the last), which is always among them."""
    end = len(returns) - 1 if end is None else end
    window = [r for x, r in zip(steps[: end + 1], returns[: end + 1]) if x >= (1 - WINDOW) * upto]
    return statistics.mean(window or [returns[end]])


def spec_of(name: str, specs: dict | None) -> dict:
    """An experiment's target, budget, flags... as its report recorded them (what ran), else as EXPERIMENTS has it."""
    return (specs or {}).get(name) or EXPERIMENTS.get(name) or {}


def shown_flags(name: str, spec: dict) -> list[str]:
    """The flags a table shows beside an experiment's env: its flags today (over the script's named settings for the
    env), which tests/test_settings.py proves give the Args of the long flags its committed runs recorded; a run of
    an experiment no longer in EXPERIMENTS shows what it recorded."""
    return EXPERIMENTS[name]["flags"] if name in EXPERIMENTS else spec.get("flags", [])


def env_cell(env_id: str, label: str) -> str:
    return f"{env_id}{'@' + label if label else ''}"


def table(records: list[dict], experiments: list[str], seeds: list[int], specs: dict | None = None) -> list[str]:
    rows = [
        "| script | env | target | budget (env steps) | seeds | at target | env steps to target, median (range) "
        "| training s to target, median (range) | eval return, last fifth | best eval return |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in experiments:
        algo, env_id, label = split_name(name)
        runs = [r for r in records if r["name"] == name and "summary" in r]
        hit = [r for r in runs if r["steps_to_target"] is not None]
        late = [
            late_mean(r["curve"]["steps"], r["curve"]["returns"], r["curve"]["steps"][-1])
            for r in runs
            if r["curve"]["returns"]
        ]
        best = [max(r["curve"]["returns"]) for r in runs if r["curve"]["returns"]]
        failed = len([r for r in records if r["name"] == name]) - len(runs)
        spec = spec_of(name, specs)
        budgets = sorted({r["budget"] for r in records if r["name"] == name})
        flags = f" `{shlex.join(shown)}`" if (shown := shown_flags(name, spec)) else ""
        target = fmt(spec.get("target"), "g") if math.isfinite(spec.get("target", math.inf)) else "-"
        rows.append(
            f"| {algo} | {env_id}{flags} | {target} | {', '.join(fmt(b) for b in budgets)} | {len(runs)}"
            f"{f' ({failed} failed)' if failed else ''} | {len(hit)}/{len(runs)} "
            f"| {median_range([r['steps_to_target'] for r in hit], ',.0f')} "
            f"| {median_range([r['seconds_to_target'] for r in hit if r['seconds_to_target'] is not None], '.1f')} "
            f"| {mean_std(late)} | {mean_std(best)} |"
        )
    return rows


def ran_its_budget(record: dict) -> bool:
    """Whether the run ended at its --total-timesteps (not stopped early by a signal, a target or a NaN guard)."""
    return record.get("summary", {}).get("stop_reason", "total_timesteps") == "total_timesteps"


def late_mean_at(record: dict, step: int) -> float | None:
    """A run's eval return at `step`: the mean over its evaluations from (1 - WINDOW) * step to the first at or after
    it; a run whose budget is `step` may end an iteration short of it: then up to its last (not for a run stopped
    before its budget, e.g. by SIGTERM: it has no eval at `step`); None where the run has not got there."""
    steps, returns = record["curve"]["steps"], record["curve"]["returns"]
    end = next((i for i, x in enumerate(steps) if x >= step), None)
    if end is None and record.get("budget", 0) >= step and ran_its_budget(record):
        end = len(steps) - 1
    return None if end is None else late_mean(steps, returns, step, end)


def at_steps_table(records: list[dict], experiments: list[str], specs: dict | None = None) -> list[str]:
    """For the experiments with `at_steps`: the eval return at each of those env steps (`late_mean_at`: mean ± std
    over seeds, then each seed's), the published reference, and the wall minutes per million env steps (training
    seconds at the last evaluation / its env steps). A variant of a task keeps its label in the env cell
    (`gym:Hopper-v5@n1`)."""
    named = [n for n in experiments if spec_of(n, specs).get("at_steps")]
    if not named:
        return []
    steps = sorted({s for n in named for s in spec_of(n, specs)["at_steps"]})
    at = {spec_of(n, specs).get("reference_at", 1_000_000) for n in named}  # the steps of the published figures
    reference_header = (
        "reference at 1M" if at == {1_000_000} else f"reference at {', '.join(f'{s:,}' for s in sorted(at))}"
    )
    rows = [
        "| script | env | "
        + " | ".join(f"eval at {s:,}" for s in steps)
        + f" | {reference_header} | wall min per 1M steps |",
        "|---|---|" + "---|" * len(steps) + "---|---|",
    ]
    for name in named:
        algo, env_id, label = split_name(name)
        runs = sorted(
            (r for r in records if r["name"] == name and r.get("curve", {}).get("returns")), key=lambda r: r["seed"]
        )
        cells = []
        for s in steps:
            values = [late_mean_at(r, s) for r in runs]
            got = [v for v in values if v is not None]
            cells.append(
                seeds_cell(values, ",.1f" if got and max(abs(v) for v in got) < 100 else ",.0f")
            )  # MinAtar's in tenths
        minutes = [
            r["curve"]["seconds"][-1] / r["curve"]["steps"][-1] * 1e6 / 60 for r in runs if r["curve"]["seconds"]
        ]
        reference = spec_of(name, specs).get("reference")
        reference = fmt(reference, ",.0f" if abs(reference or 0) >= 100 else ",.2f")
        rows.append(
            f"| {algo} | {env_cell(env_id, label)} | "
            + " | ".join(cells)
            + f" | {reference} | {median_range(minutes, '.1f')} |"
        )
    return rows


def train_table(records: list[dict], experiments: list[str], specs: dict | None = None) -> list[str]:
    """For the experiments with `train_bin`: the training return (the mean of its bin) at the bin ending at or after
    each of their `at_steps`, mean ± std over seeds, then each seed's; "-" where a run has not got there."""
    named = [n for n in experiments if spec_of(n, specs).get("train_bin") and spec_of(n, specs).get("at_steps")]
    if not named:
        return []
    steps = sorted({s for n in named for s in spec_of(n, specs)["at_steps"]})
    rows = [
        "| script | env | " + " | ".join(f"training return at {s:,}" for s in steps) + " |",
        "|---|---|" + "---|" * len(steps),
    ]
    for name in named:
        algo, env_id, label = split_name(name)
        runs = sorted(
            (r for r in records if r["name"] == name and r.get("curve", {}).get("train_returns")),
            key=lambda r: r["seed"],
        )
        cells = [
            seeds_cell([at_or_after(r["curve"]["train_steps"], r["curve"]["train_returns"], s) for r in runs], ",.1f")
            for s in steps
        ]
        rows.append(f"| {algo} | {env_cell(env_id, label)} | " + " | ".join(cells) + " |")
    return rows


def goal_table(records: list[dict], experiments: list[str], specs: dict | None = None) -> list[str]:
    """For the experiments with a `goal` (a return only an episode that reached the goal exceeds): each seed's env
    steps at its first evaluation above it, in seed order, and their median."""
    named = [n for n in experiments if spec_of(n, specs).get("goal") is not None]
    if not named:
        return []
    rows = [
        "| script | env | goal: eval return above | env steps to the first eval above it, median (each seed) |",
        "|---|---|---|---|",
    ]
    for name in named:
        algo, env_id, label = split_name(name)
        goal = spec_of(name, specs)["goal"]
        runs = sorted(
            (r for r in records if r["name"] == name and r.get("curve", {}).get("returns")), key=lambda r: r["seed"]
        )
        steps = [
            next((x for x, ret in zip(r["curve"]["steps"], r["curve"]["returns"]) if ret > goal), None) for r in runs
        ]
        got = [s for s in steps if s is not None]
        median = (
            fmt(statistics.median(got)) if len(got) == len(steps) and got else "-"
        )  # a seed that never got there: none
        rows.append(
            f"| {algo} | {env_cell(env_id, label)} | {fmt(goal, 'g')} | {median} "
            f"({' / '.join(fmt(s) for s in steps)}) |"
        )
    return rows


def symmetry_table(records: list[dict], experiments: list[str]) -> list[str]:
    """For the runs that logged charts/symmetry_error (ppo --symmetry): each seed's env steps to the target and
    its last symmetry error (the policy's mean |pi(m(s)) - m(pi(s))|), in seed order, and their mean ± std."""
    named = [n for n in experiments if any(r["name"] == n and "symmetry_error" in r.get("curve", {}) for r in records)]
    if not named:
        return []
    rows = [
        "| script | env | `--symmetry` | env steps to target, each seed | charts/symmetry_error at the end, mean ± std "
        "(each seed) |",
        "|---|---|---|---|---|",
    ]
    for name in named:
        algo, env_id, label = split_name(name)
        runs = sorted(
            (r for r in records if r["name"] == name and "symmetry_error" in r.get("curve", {})),
            key=lambda r: r["seed"],
        )
        errors = [r["curve"]["symmetry_error"] for r in runs]
        rows.append(
            f"| {algo} | {env_id} | `{label}` | {' / '.join(fmt(r['steps_to_target']) for r in runs)} "
            f"| {statistics.mean(errors):.3f} ± {statistics.pstdev(errors):.3f} "
            f"({' / '.join(f'{e:.3f}' for e in errors)}) |"
        )
    return rows


LEGEND = ("mean over seeds", "min-max over seeds", "target", "training return (mean per bin, over seeds)")
FIGURES = ("learning_steps.png", "learning_time.png")


def figures(records: list[dict], experiments: list[str], out: Path, specs: dict | None = None) -> list[Path]:
    """Eval return against env steps and against training seconds: mean and min-max band over seeds,
    with a legend that says which is which."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    paths = []
    for axis, xlabel, filename in (
        ("steps", "env steps", FIGURES[0]),
        ("seconds", "training wall time (s)", FIGURES[1]),
    ):
        cols = min(4, len(experiments))
        rows = math.ceil(len(experiments) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False)
        for ax, name in zip(axes.flat, experiments):
            algo, env_id, label = split_name(name)
            runs = [r for r in records if r["name"] == name and r.get("curve", {}).get("returns")]
            if runs:
                n = min(len(r["curve"]["returns"]) for r in runs)  # the evaluations every seed has
                x = (
                    np.mean([r["curve"][axis][:n] for r in runs], axis=0)
                    if axis == "seconds"
                    else runs[0]["curve"]["steps"][:n]
                )
                y = np.array([r["curve"]["returns"][:n] for r in runs])
                ax.fill_between(x, y.min(0), y.max(0), alpha=0.25, linewidth=0, label=LEGEND[1])
                ax.plot(x, y.mean(0), linewidth=1.5, marker="o" if n < 8 else None, markersize=3, label=LEGEND[0])
            trained = [r for r in runs if r["curve"].get("train_returns")]
            if axis == "steps" and trained:  # the curve CleanRL plots: training episodes' returns
                n = min(len(r["curve"]["train_returns"]) for r in trained)
                ax.plot(
                    trained[0]["curve"]["train_steps"][:n],
                    np.mean([r["curve"]["train_returns"][:n] for r in trained], 0),
                    linewidth=1.0,
                    color="tab:orange",
                    label=LEGEND[3],
                )
            target = spec_of(name, specs).get("target")
            if target is not None and math.isfinite(target):
                ax.axhline(target, color="gray", linestyle="--", linewidth=0.8, label=LEGEND[2])
            ax.set_title(f"{algo} {env_id}{' (' + label + ')' if label else ''}", fontsize=9)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.tick_params(labelsize=7)
            if axis == "steps":
                ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
                ax.xaxis.get_offset_text().set_fontsize(7)
        for ax in list(axes.flat)[len(experiments) :]:
            ax.axis("off")
        axes[0][0].set_ylabel("eval return", fontsize=8)
        entries = {}  # one legend for all panels, below them
        for ax in axes.flat:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                entries.setdefault(label, handle)
        labels = [label for label in LEGEND if label in entries]
        ncol = max(1, min(len(labels), cols))  # as many entries side by side as the panels are wide
        legend_height = (0.1 + 0.16 * math.ceil(len(labels) / ncol)) / fig.get_figheight()  # inches -> fraction
        fig.legend(
            [entries[label] for label in labels], labels, loc="lower center", ncol=ncol, fontsize=7, frameon=False
        )
        fig.tight_layout(rect=(0, legend_height, 1, 1))
        path = out / filename
        fig.savefig(path, dpi=80)
        plt.close(fig)
        paths.append(path)
    return paths


# What the committed results folders are about, in the order the results document shows them: a title, and the
# setting of the runs that the tables do not say (how they were run, what changed since). No measured figure here:
# the tables give them. A committed folder missing here still gets its section, titled by its name, at the end.
FOLDERS = {
    ".": dict(
        title="Classic control, each script at its defaults",
        about="Each script with its default flags on a CPU (td3 and sac at their CPU defaults: 32 envs, 2 updates "
        "of 512 per step), except MountainCarContinuous-v0's flags (its note). The ppo rows were measured while "
        "ppo's adaptive learning rate was capped at rsl_rl's 1e-2: today's ppo (capped at 5e-3) gives the next "
        "section's rows instead, so the command no longer gives these ppo rows back.",
    ),
    "ppo-cap": dict(
        title="PPO with its adaptive learning rate capped at 5e-3",
        about="ppo's cap since these runs: the first section's ppo experiments, the same seeds and defaults, and "
        "MountainCarContinuous-v0 at every default. Four runs of the command, one per `--out`, gathered into one "
        "learning.json. The 2-core CPU ran other jobs beside them, so only the env steps compare, not the seconds.",
    ),
    "mcc-defaults": dict(
        title="MountainCarContinuous-v0 at every default, with the 1e-2 cap",
        about="ppo with gamma 0.99 and an initial log-std of 0, measured with the first section's ppo (the 1e-2 "
        "cap). The same experiment at today's cap is a row of the section above.",
    ),
    "recurrent": dict(
        title="Partially observed tasks: ppo_lstm against ppo",
        about="`mask_velocity` leaves the velocities out of the observation: CartPole observes the cart position "
        "and the pole angle, Pendulum the cosine and sine of the angle. Each script at its defaults (ppo_lstm: "
        "4096 envs x 32 steps, an LSTM of 64), each run stopped at its target (`--stop-at-target`: a budget runs "
        "out only where the target is not reached), the machine otherwise idle. These runs predate the masked "
        "envs' `critic` group: their critics read the masked observation, which the experiments now ask for with "
        "`--no-asymmetric-critic`. With the full-state critic (the scripts' default) these rows are not measured.",
    ),
    "distill": dict(
        title="Distillation on masked CartPole-v1",
        about="Per seed, a ppo.py teacher trained on unmasked CartPole-v1 (`@teacher`, its last checkpoint) "
        "teaches two students on the masked task through its `critic` group: an LSTM (`@masked-lstm`) and an "
        "MLP (`@masked-mlp`, `--cell none`). Then ppo_lstm fine-tunes each LSTM student from its best.pt "
        "(`@finetune`, `--init-from`), evaluated at each of its first 10 iterations. A student's env steps are "
        "its own, its teacher's not counted. The 2-core machine ran other jobs beside these, so the seconds are "
        "slower than idle; `--reuse` read teacher and student runs the command had written just before.",
    ),
    "distill-pendulum": dict(
        title="Distillation on masked Pendulum-v1",
        about="Per seed, a ppo.py teacher at its defaults on the unmasked task (`@teacher`, its best.pt) and an "
        "LSTM student with more gradient steps per env step than the defaults give. The teachers were run by the "
        "same command without `--reuse` just before, which `--reuse` read.",
    ),
    "rnd": dict(
        title="Exploration: ppo_rnd against ppo",
        about="Both scripts at their defaults (gamma 0.99, 4,096 envs; ppo_rnd's intrinsic weight 1.0), an "
        "evaluation every 196,608 env steps (`--eval-interval 2`), one thread per run, the other core running "
        "another job. The targets are gymnasium's reward thresholds. MountainCar-v0's goal table gives the env "
        "steps until an evaluation first reached the flag: an eval return above -200, the return of an episode "
        "cut at its 200 steps. `@decay` takes the intrinsic weight linearly to 0 by 488 steps of each env "
        "(2,000,000 env steps), rsl_rl's linear schedule.",
    ),
    "symmetry": dict(
        title="Symmetry: mirror augmentation and mirror loss",
        about="ppo `--symmetry`, each run stopped at its target, an evaluation every 2 iterations (196,608 env "
        "steps); one thread per run, two runs at a time, so the seconds do not compare. `log` is "
        "the baseline: ppo's updates with the symmetry only measured; `mirror-loss` at its default coefficient "
        "1.0. `charts/symmetry_error` is each run's last logged value: of the torque on Pendulum-v1 (actions in "
        "[-2, 2]), of the centred logits on Acrobot-v1.",
    ),
    "fast": dict(
        title="CartPole-v1 in the least time on a 2-core CPU",
        about="One run at a time with both cores; the defaults (4096 envs x 24 steps) are in the first sections.",
    ),
    "minatar": dict(
        title="Pixels: MinAtar Breakout",
        about="MinAtar Breakout's uint8 [4, 10, 10] frames on a CPU, one thread per run, one run at a time. pqn "
        "and ppo with MinAtar's network (`--encoder minatar`), and both on the flattened frames (`@mlp`) for "
        "contrast. pqn runs the PQN code's MinAtar config (purejaxql `pqn_minatar.yaml`: 128 envs x 32 steps, 32 "
        "minibatches, 2 epochs, lr 5e-4 annealed, epsilon to 0.05 over the first 10%, unscaled rewards) with Adam "
        "for its RAdam and one more 128-unit layer in the head; ppo the same batch with 8 minibatches, 4 epochs "
        "and an entropy bonus of 0.01. Episodes are cut at the env's 10,000 steps, not gymnax's 1,000. The "
        "target, 10, is at or above the MinAtar paper's curves at the same env steps (Young & Tian 2019: at "
        "500,000 frames, read off its plot, DQN 8.3 and AC(λ=0.8) 7.0; theirs are ε-greedy training returns, "
        "ours greedy evaluations on 16 envs). The command wrote to `runs/minatar500k`; this folder is a copy.",
    ),
    "minatar5": dict(
        title="Pixels: MinAtar, all five games",
        about="pqn and ppo with the Breakout flags above, 655,360 env steps each (160 iterations of 128 envs x 32 "
        "steps), five seeds; one thread per run, two runs at a time beside other work on the same two cores, so the "
        "seconds are not an idle machine's. No target of our own outside Breakout's 10. The reference is "
        "gymnax-blines' PPO training log at 639,936 env steps (RobertTLange/gymnax-blines, "
        "`agents/<Game>-MinAtar/ppo.pkl`: one seed, an MLP on the flattened frames, 64 envs x 128 steps; no "
        "Seaquest run), another setting: gymnax's "
        "MinAtar has no sticky actions (ours, as the `minatar` package's: 0.1) and cuts episodes at 1,000 steps.",
    ),
    "pong": dict(
        title="Atari Pong with CleanRL's settings, on a CPU",
        about="`envpool:Pong-v5` with CleanRL's `ppo_atari_envpool.py` configuration whole (8 envs x 128 steps, "
        "4 minibatches, 4 epochs, lr 2.5e-4 annealed over 10M steps, clip 0.1, entropy 0.01, value coefficient "
        "0.5, gradient clip 0.5, rewards clipped and not normalized, one nature CNN under a Linear policy head and "
        "a Linear value head: `--shared-encoder --hidden-sizes`; a step is 4 frames), two threads. Eval: 8 whole "
        "games of the greedy policy (`atari-eval`: game scores) every 51,200 steps; the training return is the "
        "game score of the training games (the curve CleanRL plots), averaged over each 100,000 steps. The run "
        "has not reached its budget: it was stopped by SIGTERM and resumed (the pause is not training time), and "
        "the same command without `--reuse` continues it (`--resume auto`, a checkpoint every 10 minutes). The "
        "reference is CleanRL's published return at 10M steps (3 seeds).",
    ),
    "mujoco": dict(
        title="gymnasium MuJoCo on a CPU",
        about='`pip install -e ".[mujoco]"`. td3.py and sac.py at their CPU defaults (32 envs, 2 updates of 512 per'
        " step); `@n1lr`: with `--n-step 1 --q-lr 1e-3 --policy-lr 1e-3`, their mujoco settings then (td3's "
        "takes 4 updates of 256 since: the next section); `@n1`: `--n-step 1` alone. ppo.py with CleanRL's "
        "MuJoCo settings (an eval every 25 iterations). The target is 90% of the reference, CleanRL's "
        "published mean return at 1M steps (3 seeds, returns of the training episodes; TD3 and PPO on the v4 "
        "tasks, SAC on v2: docs.cleanrl.dev); ours are greedy evaluations on 10 (td3, sac) or 8 (ppo) "
        "episodes. The runs were made once each by the same module without `--reuse`, two or three at a time "
        "on the 2-core machine beside other work, so the wall minutes are a loaded machine's; `--reuse` read "
        "them.",
    ),
    "td3-hopper": dict(
        title="td3 on Hopper-v5 by its name alone",
        about="`python algos/td3.py --env-id gym:Hopper-v5 --total-timesteps 500000 --seed N`, no other flag: td3's"
        " mujoco settings then (32 envs, 4 updates of 256 per step, 1-step returns, Adam at 1e-3, tau 0.1, "
        "observation normalization; issue 78's runs changed three of them since: the mujoco-set section), which the "
        "flags shown now name. Seeds "
        "1 and 3 were the seeds tried while choosing 4 updates of 256 (with the set's 2 of 512, seed 3 stood "
        "near 400 to 300k steps: the previous section); seeds 2, 4 and 5 were not. Every run is that command "
        "with `--num-updates 4 --batch-size 256` given (the set's values today), made just before the set "
        "took them: seeds 2, 4 and 5 three at once beside other work on the 2-core machine (the seconds are a"
        " loaded machine's); seeds 1 and 3 earlier the same day, before td3.py's wiring moved to "
        "common/offpolicy.py; re-run after the move, both gave the same evaluations bit for bit to 200,064 "
        "steps (four evaluations) and were stopped there. `--reuse` read the runs. The target is the 2,500 an"
        " evaluation should reach by 500k steps; the reference CleanRL's published TD3 return at 1M.",
    ),
    "mujoco-halfcheetah": dict(
        title="What moves HalfCheetah-v5",
        about="One seed each: td3 at its defaults (3-step returns) and, for td3 `--n-step 1` and sac, 4 updates of "
        "256 per step instead of 2 of 512 (`@n1u4`, `@u4`: the same transitions sampled per env step, twice the "
        "gradient steps), beside the first seed of the section above.",
    ),
    "ant": dict(
        title="What moves Ant-v5 (td3, one change at a time toward CleanRL's)",
        about="td3.py on `gym:Ant-v5`, seed 1, 100,000 env steps per run, an evaluation on 10 envs every 313 "
        "iterations (10,016 steps): its mujoco set of then (`@set`: 4 updates of 256 per iteration, tau 0.1, "
        "observation normalization, the values the flags shown name) and the set with one change toward CleanRL's "
        "`td3_continuous_action.py` (1 env, 1 update of 256 per transition, tau 0.005, exploration noise 0.1, no "
        "observation normalization, Adam at 3e-4, 25,000 random steps; Ant-v4's 27-dim observation). `@u8`, `@u16`, "
        "`@u32`: 8, 16, 32 updates of 256 per iteration of 32 envs (0.25, 0.5, 1 per transition; the set's 4: "
        "0.125; CleanRL's: 1); `@u32tau`: 32 and `--tau 0.005`; `@tau`: `--tau 0.005` (the set's is the "
        "default 0.1); `@noise`: `--std-min 0.1 --std-max 0.1`; `@noobsnorm`, `@lr` (3e-4), `@ls25k`, `@obs27` "
        "(`include_cfrc_ext_in_observation` false); then one change over the best single one: `@u32noobsnorm`, 32 "
        "updates without observation normalization. The rows are the arms that were run; the others are defined in "
        "tests/benchmarks/learning.py and not run. The runs used the code of commit 626336f, one at a time with one "
        "torch thread, beside other work that kept the 2-core machine's load average at 4 to 10, so the wall minutes "
        "are a loaded machine's (on the idle machine a short run of 6,400 steps gave 580 steps/s with the set's 4 "
        "updates, 107 with 32). The reference is CleanRL's TD3 on Ant-v4 at 1M steps, 4,917 ± 599 (the model card of "
        "huggingface.co/sdpkjc/Ant-v4-td3_continuous_action-seed4: 10 evaluation episodes of the trained model; "
        "seed 3's card: 5,089 ± 106; CleanRL's docs table has no Ant row), not a figure at this budget. How to read "
        "the rows: an Ant that stands still through its 1,000 steps earns about 1,000 (the healthy reward) less its "
        "control costs, so at this budget, a tenth of CleanRL's, the rows rank how the arms start, not what they reach "
        "at 1M; one seed each, and one evaluation swings from the next by hundreds.",
    ),
    "ant-1m": dict(
        title="Ant-v5 at 1M steps without observation normalization (td3)",
        about="td3.py on `gym:Ant-v5` with its mujoco set of then (4 updates, tau 0.1) and `--no-obs-norm` "
        "(`@1mnoobsnorm`), the best single "
        "change of the section above, at CleanRL's budget: 1M env steps, seeds 1 to 3, an evaluation on 10 envs "
        "every 1,563 iterations (50,016 steps, the set's). The set itself at 1M (`@1m`) is defined and not run here. "
        "The runs used the scripts of commit b299af0 (algos/ and common/ unchanged since), one torch thread each on "
        "the 2-core machine: seeds 1 and 2 side by side, nothing else on it but a few seconds of tests; seed 3 later, "
        "in two sittings (stopped at 166,400 steps and resumed from its checkpoint with its replay buffer, "
        "`--resume auto`), beside tests and a CI run for part of it, so its wall-clock time is not comparable with "
        "the other two's. The reference is CleanRL's TD3 "
        "on Ant-v4 at 1M steps, 4,917 ± 599 (see the section above), whose observation has Ant-v4's 27 numbers; the "
        "target is 90% of it.",
    ),
    "ant-1m-27": dict(
        title="Ant-v5 at 1M steps with Ant-v4's observation, without observation normalization (td3)",
        about="td3.py on `gym:Ant-v5` as in the section above (`--no-obs-norm`) and one change more, the 27 numbers of "
        "Ant-v4's observation that CleanRL's published runs observe (`include_cfrc_ext_in_observation` false; "
        "`@1mnoobsnorm27`): the task CleanRL's 4,917 was measured on but for what v5 changed in the reward (a contact "
        "cost always; the healthy reward only while healthy, gymnasium's version history). Seeds 1 to 3, 1M env "
        "steps, an evaluation on 10 envs every 1,563 iterations, one torch thread on the 2-core machine beside "
        "tests for part of their time (their wall-clock is a loaded machine's); the scripts of commit d0fadcd (seeds 2 "
        "and 3 ran on later commits with the same scripts; seed 3 in two sittings, stopped near 50,000 steps and "
        "resumed from its checkpoint with its replay buffer, `--resume auto`).",
    ),
    "ant-1m-27u8": dict(
        title="Ant-v5 at 1M steps with Ant-v4's observation, without observation normalization, 8 updates (td3)",
        about="td3.py on `gym:Ant-v5` as in the section above (`--no-obs-norm`, Ant-v4's 27 numbers) and one change "
        "more, 8 updates of 256 per iteration of 32 envs instead of the set's 4 (`--num-updates 8`, 0.25 updates per "
        "transition, `@1mnoobsnorm27u8`): the issue's first hypothesis, more updates per transition, at the budget "
        "CleanRL's 4,917 was measured at. Seeds 1 to 3, 1M env steps, an evaluation on 10 envs every 1,563 "
        "iterations, one torch thread on a 2-core machine beside tests and the other seed's run for part of their "
        "time (their wall-clock is a loaded machine's). Why seeds fell (`python -m tests.benchmarks.collapse` on each "
        "run's directory): in every seed the critic diverged once, its batches' mean Q, having climbed smoothly for "
        "hundreds of thousands of steps, rising tenfold within ten logs at 387,200, 492,800 and 736,000 env steps "
        "(peaks of 26,582, 1,669 and 15.2 million, the critic loss 8.74e11 in seed 3's). Seeds 1 and 2 came back; "
        "seed 3's actor was left saturated: on its replay buffer's newest 300 steps of every env, every action of its "
        "last.pt lies within 1% of a bound (median pre-tanh output 37.6, where tanh passes no gradient back), so each "
        "step earns the healthy reward of 1 less a control cost of 0.5 x 8 = 4, the -3,006 of its last evaluations.",
    ),
    "ant-1m-27u8tau": dict(
        title="Ant-v5 at 1M steps, 8 updates, the target critics at CleanRL's tau (td3)",
        about="td3.py on `gym:Ant-v5` as in the section above (`--no-obs-norm`, Ant-v4's 27 numbers, 8 updates of 256 "
        "per iteration of 32 envs) and one change more, CleanRL's and Fujimoto et al.'s tau of 0.005 per update "
        "instead of the script's 0.1 (`--tau 0.005`, `@1mnoobsnorm27u8tau`): the target critics follow the online "
        "ones over hundreds of updates, not ten, the change the divergences above pointed to. 1M env steps, an "
        "evaluation on 10 envs every 1,563 iterations, one torch thread, two runs at a time on the 2-core machine and "
        "nothing else (seed 1 beside the Adam-at-3e-4 run of the next section, seeds 2 and 3 beside each other). "
        "`python -m tests.benchmarks.collapse` on each run: the mean Q never rose tenfold within ten logs, and the "
        "actor's actions at the end lie within 1% of a bound in 1.0 to 1.9% of their entries. The evaluations at 1M: "
        "4,789 / 4,476 / 3,746 (CleanRL's 4,917 ± 599 is its final models' evaluations). What the 8 updates cost: "
        "`OMP_NUM_THREADS=1 python algos/td3.py --env-id gym:Ant-v5 --no-obs-norm --env-kwargs "
        '\'{"env_kwargs": {"include_cfrc_ext_in_observation": false}}\' --num-updates N --total-timesteps 40000 '
        "--eval-interval 100000`, alone on the machine, one after the other: 98.7 s with N = 8 against 56.2 s with the "
        "set's 4 (the updates 77.8 against 36.5 s; 10,000 of the steps are random ones without updates); tau costs "
        "nothing.",
    ),
    "ant-1m-27u8lr": dict(
        title="Ant-v5 at 1M steps, 8 updates, Adam at CleanRL's 3e-4 (td3)",
        about="td3.py on `gym:Ant-v5` with `@1mnoobsnorm27u8`'s flags (`--no-obs-norm`, Ant-v4's 27 numbers, 8 "
        "updates of 256 per iteration of 32 envs, tau 0.1) and the other change the divergences pointed to, Adam at "
        "CleanRL's 3e-4 for the critics and the actor instead of 1e-3 (`@1mnoobsnorm27u8lr`). Seed 1 alone (tau "
        "0.005, the section above, did better at the same seed and took the two seeds more), 1M env steps, an "
        "evaluation on 10 envs every 1,563 iterations, one torch thread beside that section's seed 1 on the 2-core "
        "machine. `python -m tests.benchmarks.collapse` on the run: the mean Q never rose tenfold within ten logs.",
    ),
    "mujoco-set": dict(
        title="td3's mujoco set of today: 8 updates, tau 0.005, no observation normalization",
        about="td3.py by the env's name with the flags that are its mujoco set since issue 78 (`@noobsnormu8tau`: "
        "`--no-obs-norm --num-updates 8 --tau 0.005` over the set of then; given, so that the rows stay what they "
        "ran), 1M env steps, an evaluation on 10 envs every 1,563 iterations: the Ant-v5 runs of the tau section above "
        "less their Ant-only change of observation, on the tasks where the set of then led or neared CleanRL's TD3. "
        "The reference is CleanRL's TD3 on the v4 task (its docs/rl-algorithms/td3.md: 3 seeds, returns of the "
        "training episodes); ours are greedy evaluations of 10 episodes, the last fifth's mean. Against the set of "
        "then: the `mujoco` section's `@n1lr` rows (2 updates of 512, tau 0.1, observation normalization) and the "
        "td3-hopper section (4 of 256, 500k steps). One torch thread per run, two runs at a time on the 2-core "
        "machine (a few minutes of tests beside them). Seed 1 on each task; seeds 2 and 3 are to come (a run is "
        "about an hour here). `python -m tests.benchmarks.collapse` on each run: the mean Q never rose tenfold "
        "within ten logs. On Hopper the set starts slower (409 at 250k and 1,915 at 500k, against 1,250 and 2,613 "
        "for the set of then's 5 seeds in the td3-hopper section) and is ahead at 1M; on Walker2d and HalfCheetah "
        "it is ahead from 250k on.",
    ),
    "mujoco-name": dict(
        title="td3 by the env's name on Ant-v5 and Humanoid-v5, with and without observation normalization",
        about="td3.py by the env's name alone on the two tasks the mujoco-set section leaves out, Ant-v5 (its 105 "
        "numbers: Ant-v4's 27 and the 78 contact forces, clipped to [-1, 1]) and Humanoid-v5 (348 numbers, 78 of "
        "them contact forces that reach thousands where v4's were all zero, and actuator forces up to 120), with "
        "the set's flags (`@noobsnormu8tau`) and the same with observation normalization on (`@obsnormu8tau`, "
        "`--obs-norm`). 1M env steps, an evaluation on 10 envs every 1,563 iterations, seed 1, one torch thread per "
        "run, two runs at a time on the 2-core machine. Without normalization Humanoid's actor saturated within 20k "
        "steps: from there every episode lasted 16 steps, shorter than a random policy's 24, and the run was stopped "
        "at 185,600 steps. With it Humanoid passed CleanRL's 5,035 by 350k and held 5,662 over the last fifth. On "
        "Ant both stay near 0.6x CleanRL's 4,917 (2,783 without, 3,106 with, one seed each), where the same flags "
        "with Ant-v4's 27 numbers got 4,106 ± 335 over three seeds (the tau section above): by name Ant-v5 observes "
        "the contact forces that CleanRL's Ant-v4 runs leave out. The references are CleanRL's TD3 on the v4 tasks, "
        "as in the sections above. Each run shared the machine with one other run, the last 9 minutes of Ant's "
        "`@obsnormu8tau` with a CI run instead.",
    ),
}
# Why an experiment takes the flags it does, printed under the tables of every folder that has it.
NOTES = {
    "ppo:MountainCarContinuous-v0": "`--gamma 0.999 --init-log-std 0.5`: the goal lies hundreds of steps away for a "
    "policy that has just found it. At gamma 0.99 it is discounted to under 1% (0.99^500 = 0.007), its signal drowns "
    "under the immediate action costs, and the policy settles on standing still (an eval return of -0.0). A longer "
    "discount keeps what is found; a wider start to the exploration noise lets every seed find it. Both belong to "
    "this task's long horizon, so they are the task's flags, not the script's defaults (rsl_rl's locomotion "
    "settings: gamma 0.99, initial std 1).",
    "ppo_lstm:CartPole-v1@finetune": "`--learning-rate 1e-5 --lr-schedule constant --ent-coef 0`: the student's "
    "critic is new, its advantages are noise at first, and PPO's steps on them walk the policy off what it was "
    "taught; small steps keep it while the critic learns.",
    "distill:Pendulum-v1@masked-lstm": "256 envs, 5 epochs of 8 minibatches, learning rate 2e-3: at the defaults "
    "(4096 envs, 2 epochs of 4) a student's 13 iterations are about 100 gradient steps.",
    "td3:gym:Hopper-v5@n1lr": "`--n-step 1`: the CPU defaults keep every transition (1M slots over 32 envs), so "
    "most replayed 3-step returns follow the actions of older, noisier policies, uncorrected; on Hopper, where a "
    "noisy action makes the hopper fall, that is a pessimistic target (FastTD3's 3-step returns run with thousands "
    "of envs, whose replay turns over quickly). `--q-lr 1e-3 --policy-lr 1e-3` (Fujimoto et al.'s first TD3 "
    "setting): the CPU defaults take 16x fewer gradient steps per env step than CleanRL's scripts, so each may be "
    "larger; the learning rate costs nothing per step.",
    "td3:gym:Ant-v5@obs27": '`--env-kwargs \'{"env_kwargs": {"include_cfrc_ext_in_observation": false}}\'`: '
    "Ant-v5's observation (105 numbers) holds, after Ant-v4's 27, the external contact forces of its 13 bodies (78), "
    "clipped to [-1, 1] and zero in most steps (2.4% of them nonzero over 300 random steps); CleanRL's Ant-v4 "
    "(`use_contact_forces` false) observes the 27 alone. Scaled by their running std (`--obs-norm`, the set's), a "
    "rare contact reads as a value up to the clip of 10. The env steps at the same speed either way (about 1,540 "
    "steps/s each, one env, timed one after the other in one process).",
    "td3:gym:Ant-v5@u32tau": "`--tau 0.005`: the set's tau is the script's default 0.1 (FastTD3's, for a few updates "
    "per step of a thousand envs); at 32 updates per iteration the target critics follow the online ones within a "
    "few iterations. CleanRL's tau is 0.005 per update.",
}
# The README's summary: (folder, experiment) per script and env, the setting a reader would run first.
HEADLINES = [
    ("ppo-cap", "ppo:CartPole-v1"),
    ("ppo-cap", "ppo:Acrobot-v1"),
    ("ppo-cap", "ppo:Pendulum-v1"),
    ("ppo-cap", "ppo:MountainCarContinuous-v0"),
    (".", "pqn:CartPole-v1"),
    (".", "pqn:Acrobot-v1"),
    (".", "td3:Pendulum-v1"),
    (".", "sac:Pendulum-v1"),
    ("recurrent", "ppo_lstm:CartPole-v1@masked"),
    ("recurrent", "ppo_lstm:Pendulum-v1@masked"),
    ("distill", "distill:CartPole-v1@masked-lstm"),
    ("distill-pendulum", "distill:Pendulum-v1@masked-lstm"),
    ("rnd", "ppo_rnd:MountainCarContinuous-v0"),
    ("minatar", "pqn:MinAtar/Breakout-v1"),
    ("minatar", "ppo:MinAtar/Breakout-v1"),
    ("pong", "ppo:envpool:Pong-v5"),
    ("mujoco-set", "td3:gym:Hopper-v5@noobsnormu8tau"),
    ("mujoco-set", "td3:gym:Walker2d-v5@noobsnormu8tau"),
    ("mujoco-set", "td3:gym:HalfCheetah-v5@noobsnormu8tau"),
    ("ant-1m-27u8tau", "td3:gym:Ant-v5@1mnoobsnorm27u8tau"),
    ("mujoco", "sac:gym:HalfCheetah-v5@n1lr"),
    ("mujoco", "ppo:gym:HalfCheetah-v5"),
]
DOCUMENT = COMMITTED / "README.md"  # the results document, written whole from every committed learning.json
README = ROOT / "README.md"  # its summary goes between these markers
MARKERS = ("<!-- results:begin -->", "<!-- results:end -->")
INDEX_COMMAND = "python -m tests.benchmarks.learning --report tests/benchmarks/results --update-committed"


def report_lines(report: dict, figure_names: list[str], prefix: str = "") -> list[str]:
    """A report's text: its command, the hardware, its tables, the notes of its experiments, and links to the
    figures named (paths under `prefix`)."""
    records, machine, specs = report["runs"], report["machine"], report["experiments"]
    experiments, seeds = list(specs), sorted({r["seed"] for r in records})
    lines = [
        f"`{report['command']}` ({report['date']}, {machine_label(machine)}, torch {machine['torch']}, "
        f"{report['jobs']} run(s) at a time with {report.get('threads', 1)} thread(s) each):",
        "",
        *table(records, experiments, seeds, specs),
    ]
    if extra := at_steps_table(records, experiments, specs):
        lines += [
            "",
            "Eval return at env steps: each seed's mean over its evaluations from 0.8 x the step to the first at or "
            "after it; mean ± std over seeds (each seed's, in seed order):",
            "",
            *extra,
        ]
    if extra := train_table(records, experiments, specs):
        lines += [
            "",
            "Training return (charts/episodic_return: the mean of the values logged in each bin of env steps, "
            "here the bin ending at the step; the curve CleanRL plots), mean ± std over seeds (each seed's):",
            "",
            *extra,
        ]
    if extra := goal_table(records, experiments, specs):
        lines += ["", "Env steps until the policy first reached the goal in an evaluation:", "", *extra]
    if extra := symmetry_table(records, experiments):
        lines += ["", "The policy's asymmetry (ppo `--symmetry`), each seed's last logged value:", "", *extra]
    for name in experiments:
        if name in NOTES:
            lines += ["", f"`{name}`: {NOTES[name]}"]
    for name in figure_names:
        lines += ["", f"![{Path(name).stem}]({prefix}{name})"]
    return lines


def write_report(report: dict, out: Path, draw: bool = True) -> None:
    """learning.md (the command, the hardware, the tables) and, with `draw`, the figures, from a report; without
    `draw` it links the figures already in `out`."""
    names = [name for name in FIGURES if (out / name).exists()]
    if draw:
        try:
            names = [
                path.name for path in figures(report["runs"], list(report["experiments"]), out, report["experiments"])
            ]
        except ImportError:
            names = None
    lines = report_lines(report, names or [])
    if names is None:
        lines += ["", '(no figures: matplotlib is missing: pip install -e ".[plot]")']
    (out / "learning.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def committed_reports() -> list[tuple[str, dict]]:
    """(folder, report) of every committed learning.json, folder relative to the results ('.' for their root), in
    FOLDERS' order, then the others by name."""
    found = {
        path.parent.relative_to(COMMITTED).as_posix(): json.loads(path.read_text())
        for path in sorted(COMMITTED.rglob("learning.json"))
    }
    order = [f for f in FOLDERS if f in found] + sorted(f for f in found if f not in FOLDERS)
    return [(folder, found[folder]) for folder in order]


def title_of(folder: str) -> str:
    return FOLDERS.get(folder, {}).get("title", folder)


def anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return "".join(c for c in title.lower() if c.isalnum() or c in " -_").replace(" ", "-")


def summary_table(reports: list[tuple[str, dict]], link: str) -> list[str]:
    """One row per HEADLINES entry: seeds, target, seeds at it and the median env steps to it, the eval return of
    the last fifth of the runs, the published reference, and a link to its section (`link` + anchor)."""
    found = dict(reports)
    rows = [
        "| script | env | seeds | target | at target | env steps to target, median "
        "| eval return, last fifth, mean ± std over seeds | reference | section |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for folder, name in HEADLINES:
        if folder not in found or name not in found[folder]["experiments"]:
            continue
        report = found[folder]
        algo, env_id, label = split_name(name)
        spec = spec_of(name, report["experiments"])
        runs = [r for r in report["runs"] if r["name"] == name and r.get("curve", {}).get("returns")]
        hit = [r["steps_to_target"] for r in runs if r["steps_to_target"] is not None]
        late = [late_mean(r["curve"]["steps"], r["curve"]["returns"], r["curve"]["steps"][-1]) for r in runs]
        target = spec.get("target", math.inf)
        reference = spec.get("reference")
        rows.append(
            f"| {algo} | {env_cell(env_id, label)} | {len(runs)} "
            f"| {fmt(target, 'g') if math.isfinite(target) else '-'} "
            f"| {f'{len(hit)}/{len(runs)}' if math.isfinite(target) else '-'} "
            f"| {fmt(statistics.median(hit)) if hit else '-'} | {mean_std(late)} "
            f"| {fmt(reference, ',.0f' if abs(reference or 0) >= 100 else ',.2f')} "
            f"| [{folder if folder != '.' else 'results'}]({link}#{anchor(title_of(folder))}) |"
        )
    return rows


def results_document(reports: list[tuple[str, dict]]) -> str:
    """The results document: how to read and redo it, the summary, then one section per committed folder."""
    lines = [
        "# Learning results",
        "",
        f"<!-- written whole by `{INDEX_COMMAND}` from the learning.json of every folder here; edit "
        "tests/benchmarks/learning.py, not this file -->",
        "",
        "Every figure here is the output of `python -m tests.benchmarks.learning` (tests/benchmarks/learning.py), "
        "run with the command shown in its section; each folder holds that command's `learning.json` (every "
        "run's evaluation curve and summary), `learning.md` (its tables) and figures. A section was measured at "
        "the date it shows, with the code of that day: where a later change is known to have moved its rows, "
        "the section says so.",
        "",
        "How to read the tables:",
        "",
        "- seeds: the runs that finished (one per seed); at target: how many of them reached the target in an "
        "evaluation; env steps and training seconds to the target count up to the first such evaluation (median "
        "and range over the seeds that reached it). Training seconds start at the training loop (after start-up "
        "and compilation) and include the evaluations.",
        f"- eval return, last fifth: each seed's mean over its evaluations in the last fifth of its env steps "
        f"(from {1 - WINDOW:g} x the steps of its last evaluation), then mean ± std over the seeds. One evaluation "
        "(a few greedy episodes) swings from the next by more than the seeds differ; the mean of the last fifth "
        "does not. A run stopped at its target (`--stop-at-target`) ends at the evaluation that reached it, so its "
        "last fifth also holds the evaluations before. Best eval return: each seed's highest single evaluation (what "
        "`best.pt` was saved for).",
        "- flags: beside an env, the flags of the experiment over the script's named settings for that env (its "
        "family's set: `mujoco`, `minatar`, `atari`...; `--help` lists them). One run of a row is `python "
        "algos/SCRIPT.py --env-id ENV --seed N --total-timesteps BUDGET` and those flags. Runs recorded before the "
        "named settings existed hold the long flags they ran with (their learning.json); tests/test_settings.py "
        "proves each experiment's flags give the same Args.",
        "- figures: eval return against env steps and against training seconds, the mean over the seeds as a "
        "line and their min-max as a band.",
        "",
        "To run them yourself, name a directory of your own (the runs' outputs go to its `runs/`):",
        "",
        "```bash",
        "python -m tests.benchmarks.learning --experiments ppo:CartPole-v1 --seeds 1 2 --out runs/cartpole",
        "python -m tests.benchmarks.learning --report runs/cartpole/learning.json   # its tables and figures again",
        "```",
        "",
        "The command refuses an `--out` (or a `--report`) inside tests/benchmarks/results/ without "
        "`--update-committed`; with it, it also rewrites this document and the README's summary from every "
        f"committed learning.json (`{INDEX_COMMAND} --no-figures` rewrites the text alone).",
        "",
        "## Summary",
        "",
        *summary_table(reports, ""),
    ]
    for folder, report in reports:
        about = FOLDERS.get(folder, {}).get("about")
        names = [name for name in FIGURES if (COMMITTED / folder / name).exists()]
        prefix = "" if folder == "." else f"{folder}/"
        lines += ["", f"## {title_of(folder)}", "", f"Folder: [`{prefix or './'}`]({prefix or './'})."]
        lines += ["", about] if about else []
        lines += ["", *report_lines(report, names, prefix)]
    return "\n".join(lines) + "\n"


def readme_block(reports: list[tuple[str, dict]]) -> str:
    """The README's results summary, between its markers."""
    document = "tests/benchmarks/results/README.md"  # DOCUMENT, as the README links it
    lines = [
        MARKERS[0],
        f"<!-- written by `{INDEX_COMMAND}`; edit tests/benchmarks/learning.py, not this block -->",
        "",
        f"Learning on a CPU, each script at the settings its section gives; every figure, command and curve "
        f"is in [{document}]({document}). The eval return is each seed's mean over its evaluations in the "
        "last fifth of its env steps, then mean ± std over the seeds.",
        "",
        *summary_table(reports, document),
        MARKERS[1],
    ]
    return "\n".join(lines)


def with_readme_block(text: str, block: str) -> str:
    """The README's text with the block between its markers replaced (the markers must be there, once each)."""
    begin, end = text.index(MARKERS[0]), text.index(MARKERS[1]) + len(MARKERS[1])
    return text[:begin] + block + text[end:]


def write_index() -> None:
    """The results document and the README's summary, from every committed learning.json."""
    reports = committed_reports()
    DOCUMENT.write_text(results_document(reports))
    text = README.read_text()
    if MARKERS[0] in text and MARKERS[1] in text:
        README.write_text(with_readme_block(text, readme_block(reports)))
    print(f"wrote {DOCUMENT} and the summary in {README} from {len(reports)} results folders")


def report_paths(names: list[str]) -> list[Path]:
    """Each learning.json named, or found under a directory named."""
    paths = []
    for name in map(Path, names):
        paths += sorted(name.rglob("learning.json")) if name.is_dir() else [name]
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--experiments", nargs="+", default=list(EXPERIMENTS), help="script:env ids, e.g. ppo:CartPole-v1"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    parser.add_argument(
        "--jobs",
        type=int,
        default=max(1, (os.cpu_count() or 1)),
        help="runs at a time; each gets cores // jobs torch threads",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads of each run (default: cores // jobs); 1 on a machine shared with other work",
    )
    parser.add_argument("--budget", type=int, default=None, help="env steps of every run (default: each experiment's)")
    parser.add_argument(
        "--out",
        default=None,
        help="directory of the JSON, the table and the figures (required; with --report: default "
        "the learning.json's directory)",
    )
    parser.add_argument("--runs-dir", default=None, help="directory of the runs' own outputs (default: OUT/runs)")
    parser.add_argument(
        "--report",
        nargs="+",
        default=None,
        help="no runs: write the tables and figures of learning.json files again (a directory: every learning.json "
        "under it)",
    )
    parser.add_argument(
        "--no-figures", action="store_true", help="with --report: the text alone, linking the figures already there"
    )
    parser.add_argument(
        "--update-committed",
        action="store_true",
        help="allow writing into tests/benchmarks/results/, the results the README shows (and rewrite "
        "the results document and the README's summary from them)",
    )
    parser.add_argument(
        "--stop-at-target",
        action="store_true",
        help="stop each run at its experiment's target (--target-return): 'final' is then the return that reached it",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="read the runs that finished in the runs directory (summary.json) instead of running them again",
    )
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="flags passed on to every run")
    args = parser.parse_args(argv)
    if args.out is None and not args.report:
        parser.error("--out DIR is required: the directory of the JSON, the table and the figures (e.g. runs/results)")
    if args.report:
        paths = report_paths(args.report)
        if not paths:
            parser.error(f"no learning.json in {' '.join(args.report)}")
        if args.out is not None and len(paths) > 1:
            parser.error(
                f"--out takes one learning.json; {len(paths)} were named: leave --out out to write each beside its own"
            )
        outs = [Path(args.out) if args.out is not None else path.parent for path in paths]
    else:
        outs = [Path(args.out)]
    for out in outs:
        if is_committed(out) and not args.update_committed:
            parser.error(
                f"{out} holds the committed results that the README shows; name another --out, or pass "
                "--update-committed to rewrite them"
            )
    if args.report:
        for path, out in zip(paths, outs):
            out.mkdir(parents=True, exist_ok=True)
            write_report(json.loads(path.read_text()), out, draw=not args.no_figures)
        if any(is_committed(out) for out in outs):
            write_index()
        return 0
    out = outs[0]
    unknown = [e for e in args.experiments if e not in EXPERIMENTS and ":" not in e]
    if unknown:
        parser.error(f"unknown experiments {unknown}; known: {', '.join(EXPERIMENTS)} (or any script:env)")
    out.mkdir(parents=True, exist_ok=True)
    runs_dir = Path(args.runs_dir) if args.runs_dir else Path(args.out) / "runs"  # as given: commands stay portable

    def after(name: str):  # (the experiment a run starts from, its flag, its checkpoint), or None
        return EXPERIMENTS.get(name, {}).get("after")

    def depth(name: str) -> int:
        return 0 if after(name) is None else 1 + depth(after(name)[0])

    names, todo = [], list(args.experiments)
    while todo:  # the experiments asked for and those they start from
        name = todo.pop(0)
        names += [name] if name not in names else []
        todo += [after(name)[0]] if after(name) else []
    names.sort(key=depth)  # the runs others start from first
    sources = {after(n)[0] for n in names if after(n)}
    jobs = []
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    for name in names:
        algo, env_id, _ = split_name(name)
        spec = EXPERIMENTS.get(name, dict(target=math.inf, budget=1_000_000, flags=[]))
        budget = args.budget or spec["budget"]
        stop = (
            ["--target-return", str(spec["target"])]
            if args.stop_at_target and math.isfinite(spec["target"]) and name not in sources
            else []
        )
        for seed in args.seeds:
            start = []
            if after(name):  # the checkpoint of the run of this seed that this one starts from
                source, flag, file = after(name)
                start = [flag, str(runs_dir / run_command(source, seed, 0, [], runs_dir)[-1] / "checkpoints" / file)]
            jobs.append(
                dict(
                    name=name,
                    algo=algo,
                    env_id=env_id,
                    seed=seed,
                    target=spec["target"],
                    budget=budget,
                    threads=threads,
                    out=str(runs_dir),
                    depth=depth(name),
                    reuse=args.reuse,
                    command=run_command(name, seed, budget, [*spec["flags"], *start, *stop, *args.extra], runs_dir),
                )
            )
    started = time.time()
    records = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for phase in sorted({job["depth"] for job in jobs}):  # the runs others start from, then those
            for record in pool.map(run_one, [job for job in jobs if job["depth"] == phase]):
                if "error" in record:  # the run's own last line says why (an error line, or a traceback's end)
                    lines = [line for line in record["error"].splitlines() if line.strip()]
                    status = f"failed (exit {record['returncode']}): {lines[-1] if lines else 'no output'}"
                else:
                    status = f"steps to target {fmt(record['steps_to_target'])}"
                print(f"{record['algo']} {record['env_id']} seed {record['seed']}: {status}", flush=True)
                records.append(record)
    args.experiments = names
    machine = machine_info(__import__("torch").device("cpu"))
    command = shlex.join(["python", "-m", "tests.benchmarks.learning", *(argv if argv is not None else sys.argv[1:])])
    report = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "command": command,
        "machine": machine,
        "jobs": args.jobs,
        "wall_seconds": time.time() - started,
        "experiments": {n: EXPERIMENTS.get(n) for n in args.experiments},
        "threads": threads,
        "runs": records,
    }
    (out / "learning.json").write_text(json.dumps(report, indent=1))
    write_report(report, out)
    if is_committed(out):
        write_index()
    return 0 if all("error" not in r for r in records) else 1


def is_committed(path: Path) -> bool:
    """Whether path is tests/benchmarks/results/ or inside it."""
    path = path.resolve()
    return path == COMMITTED or COMMITTED in path.parents


if __name__ == "__main__":
    sys.exit(main())
