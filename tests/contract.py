"""The settings the contract tests (tests/test_scripts.py and the per-script tests that import it) run each script
with, one entry per script. A copy in algos/ runs with its original's entry, merged with the settings it declares in
its own file, where its idea needs other settings or adds a branch to exercise (copy_entry): a module-level literal

    CONTRACT = {"kwargs": {"my_flag": 0.5}, "captures": [{}, {"my_flag": 0.0}]}

whose "kwargs" go over its original's key by key and whose other keys replace its original's; a bool flag the copy adds
runs turned from its default unless the copy sets it. This file stays as it is.

`CONTRACT[algo]["kwargs"]` are the tiny settings every contract test starts from (beside COMMON); each entry of
`captures` is a layout the capture and compiled-vs-eager tests run too, so a script's other main branches ride on them
at no added run: td3's MSE critic beside C51, sac's layer-normed critics with a fixed temperature, ppo's discrete
actions (Catch) beside continuous ones, ppo_lstm's GRU beside its LSTM, the adapters' eager env step beside the built-in
env's captured one."""

from __future__ import annotations

import atexit
import re
import shutil
import tempfile
from pathlib import Path

import torch

from tests.helpers import ROOT, untrained_teacher
from tests.pixel_env import CATCH

# Every script in algos/ joins these tests with one entry here: its tiny settings, and what the
# tests cannot guess from outside.
# - `steps`: env steps of one process per iteration; `sync`: iterations between two host reads (a
#   "unit" below is `sync` iterations); `kwargs`: the tiny settings;
# - `captures`: overrides that give each layout of its captured functions (built-in env, adapter,
#   other update schedules), every one of which the capture test checks;
# - `tags`: the TensorBoard tags of its own (beyond charts/ and eval/ that every script logs);
# - `per_read`: the flag that sets the env steps between two host reads (the rollout length, or
#   the log interval); --log-interval changes the logs alone in every script (tests/test_log_interval.py);
# - `wrong_actions`: an env of the action kind it cannot act in, and the script the error points to;
# - `policy(module, args, obs_dim, action_space)`: its evaluated model as the export test rebuilds it; a
#   recurrent one (with `recurrent_step(obs, state)` and `state_shape`) is stepped with its state fed back;
# - optional: `summary`, the script's own summary.json fields; `bounded`, a flag with a range, a value
#   outside it and the range's words (default: --gamma 1.5, in [0, 1]).
GYM_16 = '{"env_kwargs": {"max_episode_steps": 16}}'  # the gym: adapter's 16-step episodes
# tests/pixel_env.py's Catch: uint8 frames through an image encoder (and, for ppo and ppo_lstm, a vector "critic" group
# beside them)
PIXELS = dict(env_id=CATCH, env_kwargs='{"max_episode_steps": 16, "proprio": true}', encoder="minatar")
# Catch with a "policy" group of terms (an image term and a vector term) beside the "critic" vector group
TERMS = dict(env_id=CATCH, env_kwargs='{"max_episode_steps": 16, "proprio": true, "terms": true}', encoder="minatar")
PPO_TAGS = {
    "losses/policy_loss",
    "losses/value_loss",
    "losses/entropy",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/explained_variance",
    "charts/learning_rate",
    "charts/rollout_seconds",
    "charts/update_seconds",
}


def box_bounds(space):
    return [torch.as_tensor(b, dtype=torch.float32) for b in (space.low, space.high)]


CONTRACT = {
    "ppo": dict(
        steps=16 * 8,
        sync=1,
        kwargs=dict(
            env_id="Pendulum-v1", num_envs=16, num_steps=8, num_minibatches=2, lr_schedule="linear", reward_norm=True
        ),
        captures=[
            {},
            dict(target_kl=1.0, symmetry="both"),
            dict(env_id="gym:Pendulum-v1", env_kwargs=GYM_16),
            PIXELS,
            TERMS,
        ],
        tags=PPO_TAGS,
        per_read="num_steps",
        wrong_actions=None,
        policy=lambda module, args, obs_dim, space: module.Agent(obs_dim, None, space, args),
    ),
    "pqn": dict(
        steps=16 * 8,
        sync=1,
        kwargs=dict(
            env_id="CartPole-v1",
            num_envs=16,
            num_steps=8,
            num_minibatches=2,
            obs_norm=True,
            epsilon_spread=0.5,
            exploration_fraction=0.5,
            loss="huber",
        ),
        captures=[{}, dict(env_id="gym:CartPole-v1", env_kwargs=GYM_16), PIXELS, TERMS],
        tags={
            "losses/td_loss",
            "losses/q_values",
            "charts/epsilon",
            "charts/learning_rate",
            "charts/rollout_seconds",
            "charts/update_seconds",
        },
        per_read="num_steps",
        wrong_actions=("Pendulum-v1", "ppo.py"),
        policy=lambda module, args, obs_dim, space: module.QNetwork(obs_dim, int(space.n), args),
    ),
    "td3": dict(
        steps=8,
        sync=4,
        kwargs=dict(
            env_id="Pendulum-v1",
            num_envs=8,
            batch_size=32,
            learning_starts=16,
            buffer_size=240,
            n_step=2,
            log_interval=4,
            reward_norm=True,
            save_buffer=True,
            distributional=True,
            v_min=-100.0,
            v_max=0.0,
        ),
        captures=[
            dict(learning_starts=32),
            dict(learning_starts=32, num_updates=1, distributional=False),  # the MSE critic beside C51
            dict(env_id="gym:Pendulum-v1", env_kwargs=GYM_16),
        ],
        tags={
            "losses/q_loss",
            "losses/q_values",
            "losses/actor_loss",
            "charts/rollout_seconds",
            "charts/update_seconds",
        },
        per_read="log_interval",
        wrong_actions=("CartPole-v1", "pqn.py"),
        policy=lambda module, args, obs_dim, space: module.Agent(obs_dim, None, *box_bounds(space), args),
    ),
    "sac": dict(
        steps=8,
        sync=4,
        kwargs=dict(
            env_id="Pendulum-v1",
            num_envs=8,
            batch_size=32,
            learning_starts=16,
            buffer_size=240,
            n_step=2,
            log_interval=4,
            reward_norm=True,
            save_buffer=True,
        ),
        captures=[
            dict(learning_starts=32),
            dict(env_id="gym:Pendulum-v1", env_kwargs=GYM_16),
            dict(learning_starts=32, critic_layer_norm=True, autotune=False),  # brax SAC's critic, a fixed alpha
        ],
        tags={
            "losses/q_loss",
            "losses/q_values",
            "losses/actor_loss",
            "losses/alpha",
            "losses/entropy",
            "charts/rollout_seconds",
            "charts/update_seconds",
        },
        per_read="log_interval",
        wrong_actions=("Acrobot-v1", "pqn.py"),
        policy=lambda module, args, obs_dim, space: module.Agent(obs_dim, None, *box_bounds(space), args),
    ),
    "ppo_lstm": dict(
        steps=16 * 8,
        sync=1,
        kwargs=dict(
            env_id="Pendulum-v1",
            num_envs=16,
            num_steps=8,
            num_minibatches=2,
            lr_schedule="linear",
            reward_norm=True,
            rnn_hidden_size=16,
        ),
        # the GRU beside the default LSTM: the capture layouts share their runs between the cells
        captures=[{}, dict(env_id="gym:Pendulum-v1", env_kwargs=GYM_16, cell="gru"), PIXELS, dict(TERMS, cell="gru")],
        tags=PPO_TAGS,
        per_read="num_steps",
        wrong_actions=None,
        policy=lambda module, args, obs_dim, space: module.Agent(obs_dim, None, space, args),
    ),
    # a linear weight schedule that ends within the tiny runs, so resume and compile parity cover its steps
    "ppo_rnd": dict(
        steps=16 * 8,
        sync=1,
        kwargs=dict(
            env_id="Pendulum-v1",
            num_envs=16,
            num_steps=8,
            num_minibatches=2,
            lr_schedule="linear",
            reward_norm=True,
            rnd_hidden_sizes=(16,),
            rnd_target_hidden_sizes=(16,),
            rnd_num_outputs=4,
            rnd_weight_final=0.0,
            rnd_weight_steps=(8, 40),
        ),
        captures=[{}, dict(env_id="gym:Pendulum-v1", env_kwargs=GYM_16)],
        tags=PPO_TAGS | {"losses/rnd_loss", "charts/intrinsic_reward", "charts/rnd_weight"},
        per_read="num_steps",
        wrong_actions=None,
        policy=lambda module, args, obs_dim, space: module.Agent(obs_dim, None, space, args),
    ),
}
_TEACHERS = Path(tempfile.mkdtemp(prefix="distill-teacher-"))  # distill.py's teacher: a file for every run
atexit.register(shutil.rmtree, _TEACHERS, True)
CONTRACT["distill"] = dict(
    steps=16 * 8,
    sync=1,
    kwargs=dict(
        env_id="Pendulum-v1",
        num_envs=16,
        num_steps=8,
        num_minibatches=2,
        lr_schedule="linear",
        rnn_hidden_size=16,
        teacher_action_prob=0.5,
        teacher=str(untrained_teacher(_TEACHERS / "teacher.pt", hidden_sizes=(32, 32))),
    ),
    captures=[{}, dict(cell="none"), dict(env_id="gym:Pendulum-v1", env_kwargs=GYM_16)],
    tags={
        "losses/distill_loss",
        "losses/agreement",
        "charts/learning_rate",
        "charts/teacher_action_prob",
        "charts/rollout_seconds",
        "charts/update_seconds",
    },
    per_read="num_steps",
    wrong_actions=None,
    policy=lambda module, args, obs_dim, space: module.Policy(
        obs_dim,
        space,
        args.cell,
        args.rnn_hidden_size,
        args.rnn_layers,
        tuple(args.hidden_sizes),
        args.activation,
        args.obs_norm,
        args.obs_clip,
    ),
    summary={"teacher"},
    bounded=("teacher_action_prob", 1.5, r"in \[0, 1\]"),
)
SCRIPTS = sorted(p.stem for p in (ROOT / "algos").glob("*.py"))  # every script, found, not listed


def algo_of(script: str) -> str:
    """The ALGO a script declares (a copy of ppo.py keeps ppo's unless it renames it)."""
    found = re.search(r'^ALGO = "(\w+)"', (ROOT / "algos" / f"{script}.py").read_text(), re.M)
    return found.group(1) if found else script


def _module_literal(script: str, name: str):
    """The value of a module-level `name = <literal>` in algos/<script>.py (None without one), read, not imported."""
    import ast

    for node in ast.parse((ROOT / "algos" / f"{script}.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            try:
                return ast.literal_eval(node.value)
            except ValueError as error:
                raise ValueError(
                    f"algos/{script}.py: {name} must be a literal (dicts, lists, strings, numbers)"
                ) from error
    return None


def args_defaults(script: str) -> dict[str, object]:
    """The fields algos/<script>.py's own `class Args` declares, with their defaults where they are literals (else
    None), read from its text."""
    import ast

    for node in ast.parse((ROOT / "algos" / f"{script}.py").read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == "Args":
            fields = {}
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    try:
                        fields[item.target.id] = ast.literal_eval(item.value) if item.value is not None else None
                    except ValueError:
                        fields[item.target.id] = None
            return fields
    return {}


def added_flags(script: str) -> dict[str, object]:
    """The fields a copy's Args has and its original's does not, with their defaults."""
    original = args_defaults(algo_of(script))
    return {name: default for name, default in args_defaults(script).items() if name not in original}


def copy_entry(script: str) -> dict:
    """A copy's entry: its original's, with the copy's own `CONTRACT = {...}` (a literal at the top level of its file)
    merged over it (its "kwargs" key by key, any other key replaced), and every bool flag the copy adds turned from its
    default in "kwargs" unless the copy sets it: an idea behind a flag that is off by default runs in every test."""
    original, own = CONTRACT[algo_of(script)], _module_literal(script, "CONTRACT") or {}
    flipped = {name: not default for name, default in added_flags(script).items() if isinstance(default, bool)}
    return {**original, **own, "kwargs": {**original["kwargs"], **flipped, **own.get("kwargs", {})}}


# A copy in algos/ (a script that keeps its original's ALGO) joins every test with its original's entry, merged with
# the settings of its own that it declares in its file (copy_entry).
CONTRACT.update(
    {script: copy_entry(script) for script in SCRIPTS if script not in CONTRACT and algo_of(script) in CONTRACT}
)
COPIES = [script for script in SCRIPTS if algo_of(script) != script]
COMMON = dict(
    device="cpu",
    progress=False,
    run_name="run",
    num_eval_envs=4,
    eval_interval=0,
    save_interval=10_000,
    hidden_sizes=(32, 32),
    env_kwargs='{"max_episode_steps": 16}',
)
