"""Named settings' values that come from elsewhere: a mjlab task's registered rsl_rl runner config, translated field by
field (`rsl_rl_settings`); and the torch threads a run takes on a busy CPU (`choose_threads`)."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import sys


# ----------------------------------------------------------------------------------------------
# mjlab and Playground tasks: the task's rsl_rl runner config, field by field
# ----------------------------------------------------------------------------------------------
def rsl_rl_settings(env_id: str, fields: set[str]):
    """the task's own training config, translated field by field: mjlab's registered rsl_rl runner config
    (load_rl_cfg) or Playground's rsl_rl config, with rsl_rl's update; Playground's brax PPO config for a DM Control
    task, which has no rsl_rl config"""
    task = env_id.split(":", 1)[-1]
    if env_id.startswith("playground:"):
        return playground_ppo_settings(task, fields)
    try:
        from mjlab.tasks.registry import load_rl_cfg

        rl_cfg = load_rl_cfg(task)
    except ImportError:  # make_env says how to install it
        return {}, []
    except (KeyError, ValueError):  # an unknown task: make_env names the registered ones
        return {}, []
    from common.args import RunArgs, flag_value

    # max_iterations counts iterations of this run's size: its envs (the command line's --num-envs) and processes
    num_envs = flag_value(sys.argv[1:], "num_envs")
    num_envs = int(num_envs) if num_envs is not None and num_envs.isdigit() else RunArgs.num_envs
    return translate_rsl_rl(rl_cfg, fields, num_envs, int(os.environ.get("WORLD_SIZE", "1")))


def _setter(fields: set[str], values: dict, named: list[str]):
    """put(flag, value, source): the value of a config's field into `values` where the script has the flag, else named
    in `named` as the config spells it; a None value (a field left unset) is neither."""

    def put(flag: str, value, source: str):
        if value is None:
            return
        if flag in fields:
            values[flag] = value
        else:
            named.append(f"{source}={value!r}")

    return put


def _command_line_envs(default: int) -> int:
    """--num-envs as the command line gives it, else `default` (a set's values are read before the flags are)."""
    from common.args import flag_value

    num_envs = flag_value(sys.argv[1:], "num_envs")
    return int(num_envs) if num_envs is not None and num_envs.isdigit() else default


# ----------------------------------------------------------------------------------------------
# MuJoCo Playground tasks: the rsl_rl config Playground ships (locomotion, manipulation), else its brax PPO config
# ----------------------------------------------------------------------------------------------
def playground_ppo_settings(task: str, fields: set[str]):
    """Playground's rsl_rl config of a locomotion or manipulation task, else its brax PPO config (DM Control)."""
    from common.envs.playground_adapter import configure_jax_memory

    configure_jax_memory()  # the configs import JAX: its allocator is set before
    try:
        from mujoco_playground import registry
        from mujoco_playground.config import dm_control_suite_params, locomotion_params, manipulation_params
    except ImportError:  # make_env says how to install it
        return {}, []
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if task in registry.locomotion.ALL_ENVS or task in registry.manipulation.ALL_ENVS:
        params = locomotion_params if task in registry.locomotion.ALL_ENVS else manipulation_params
        try:
            rl_cfg = params.rsl_rl_config(task).to_dict()
        except (KeyError, ValueError):  # a task without a tuned rsl_rl config
            return {}, [f"Playground has no rsl_rl config for {task}: the plain defaults"]
        from common.args import RunArgs

        return translate_rsl_rl(rl_cfg, fields, _command_line_envs(RunArgs.num_envs), world_size)
    if task in registry.dm_control_suite.ALL_ENVS:
        try:
            config = dm_control_suite_params.brax_ppo_config(task).to_dict()
        except (KeyError, ValueError):
            return {}, [f"Playground has no brax PPO config for {task}: the plain defaults"]
        return translate_brax_ppo(config, fields, _command_line_envs(int(config["num_envs"])), world_size)
    return {}, []  # an unknown task: make_env names the known ones


# brax's PPO update, where ppo.py's defaults differ (tests/test_brax_ppo.py holds it on one batch against brax's loss,
# gradients and optimizer step; docs/playground.md's table): its tanh-squashed Gaussian with its one-sample entropy,
# GAE in each minibatch's loss over whole unrolls, advantages over the population std, its value loss, its Adam, and
# ppo.train's defaults that Playground's DM Control configs leave as they are (clip 0.3, swish, a constant rate)
BRAX_PPO_UPDATE = dict(
    policy_dist="tanh-normal",
    entropy="sampled",
    gae="in-loss",
    adv_norm="minibatch",  # normalize_advantage=True: per minibatch,
    adv_std="population",  # over jnp.std (ddof 0)
    vf_coef=0.5,  # vf_loss_coefficient: brax's 0.5 * 0.5 * (vs - V)^2, ours 0.5 * vf_coef * (R - V)^2
    clip_vloss=False,  # clipping_epsilon_value=None
    clip_coef=0.3,  # clipping_epsilon
    adam_eps=1e-8,  # optax.adam's
    lr_schedule="constant",
    activation="silu",  # make_ppo_networks' linen.swish
    reward_norm=False,  # reward_scaling instead: --reward-scale
)
BRAX_PPO_NETWORKS = dict(policy_hidden_layer_sizes=(32,) * 4, value_hidden_layer_sizes=(256,) * 5)  # their defaults
# What brax's update does that ppo.py's does not (docs/playground.md's table)
BRAX_PPO_UNTRANSLATED = (
    "brax's observation normalizer: the statistics of every batch so far, updated with the batch before its epochs, "
    "unclipped (here updated after them, clipped at --obs-clip)",
)


def translate_brax_ppo(config: dict, fields: set[str], num_envs: int, world_size: int = 1) -> tuple[dict, list[str]]:
    """({flag: value}, [what has no flag here]) of a brax PPO config of Playground (`brax_ppo_config`), for a run of
    `num_envs` envs per process. brax collects batch_size x num_minibatches unrolls of unroll_length steps per update:
    so many steps over this run's envs are one iteration's --num-steps, cut into unrolls of --unroll-length, and its
    update is brax's (BRAX_PPO_UPDATE: GAE of each minibatch's unrolls in its loss, its tanh-squashed Gaussian, ...).
    Every field is translated or named; brax's own defaults where ours differ too."""
    values, named = {}, []
    put = _setter(fields, values, named)

    known = {"num_envs", "batch_size", "num_minibatches", "unroll_length", "num_updates_per_batch", "discounting"}
    known |= {"learning_rate", "entropy_cost", "normalize_observations", "num_timesteps", "num_evals"}
    known |= {"reward_scaling", "episode_length", "action_repeat", "num_resets_per_eval", "network_factory"}
    known |= {"unroll_length", "max_grad_norm"}
    put("num_envs", int(config["num_envs"]), "num_envs")
    per_update = int(config["batch_size"]) * int(config["num_minibatches"]) * int(config["unroll_length"])
    num_steps = max(1, round(per_update / (num_envs * world_size)))
    if num_steps * num_envs * world_size != per_update:
        named.append(
            f"batch_size x num_minibatches x unroll_length = {per_update} steps per update "
            f"({num_steps * num_envs * world_size} here)"
        )
    put("num_steps", num_steps, "unroll_length")
    put("num_minibatches", int(config["num_minibatches"]), "num_minibatches")
    put("update_epochs", int(config["num_updates_per_batch"]), "num_updates_per_batch")
    put("gamma", float(config["discounting"]), "discounting")
    put("learning_rate", float(config["learning_rate"]), "learning_rate")
    put("ent_coef", float(config["entropy_cost"]), "entropy_cost")
    put("obs_norm", bool(config["normalize_observations"]), "normalize_observations")
    put("total_timesteps", int(config["num_timesteps"]), "num_timesteps")
    if config.get("num_evals"):
        iterations = max(1, int(config["num_timesteps"]) // (num_steps * num_envs * world_size))
        put("eval_interval", max(1, iterations // int(config["num_evals"])), "num_evals")
    # brax's update: the unrolls, the networks, the reward scale, the gradient clip
    if num_steps % int(config["unroll_length"]) == 0:
        put("unroll_length", int(config["unroll_length"]), "unroll_length")
    else:
        named.append(f"unroll_length={config['unroll_length']!r} (does not divide --num-steps {num_steps})")
    network = {**BRAX_PPO_NETWORKS, **dict(config.get("network_factory") or {})}
    put("hidden_sizes", tuple(network.pop("policy_hidden_layer_sizes")), "network_factory.policy_hidden_layer_sizes")
    put(
        "critic_hidden_sizes",
        tuple(network.pop("value_hidden_layer_sizes")),
        "network_factory.value_hidden_layer_sizes",
    )
    named.extend(f"network_factory.{name}={value!r}" for name, value in sorted(network.items()))
    put("reward_scale", float(config.get("reward_scaling", 1.0)), "reward_scaling")
    # max_grad_norm=None: no clip, an infinite bound here (clip_grad_norm_ then scales by exactly 1)
    put(
        "max_grad_norm",
        math.inf if config.get("max_grad_norm") is None else float(config["max_grad_norm"]),
        "max_grad_norm",
    )
    put("grad_clip", "global", "max_grad_norm")
    for flag, value in BRAX_PPO_UPDATE.items():
        put(flag, value, f"brax's {flag}")
    named.append(
        f"episode_length={config.get('episode_length')!r}, action_repeat={config.get('action_repeat')!r} "
        f"(the task config's; --env-kwargs sets them)"
    )
    if "num_resets_per_eval" in config:
        named.append(f"num_resets_per_eval={config['num_resets_per_eval']!r} (eval envs start a new episode each time)")
    named.extend(f"{name}={config[name]!r}" for name in sorted(set(config) - known))
    named.extend(BRAX_PPO_UNTRANSLATED)
    return values, named


def brax_sac_settings(env_id: str, fields: set[str]):
    """Playground's brax SAC config of a DM Control task, translated field by field"""
    if not env_id.startswith("playground:"):
        return {}, []
    task = env_id.split(":", 1)[-1]
    from common.envs.playground_adapter import configure_jax_memory

    configure_jax_memory()  # the configs import JAX: its allocator is set before
    try:
        from mujoco_playground.config import dm_control_suite_params
    except ImportError:
        return {}, []
    try:
        config = dm_control_suite_params.brax_sac_config(task).to_dict()
    except (KeyError, ValueError, AttributeError):
        return {}, [f"Playground has no brax SAC config for {task}: the plain defaults"]
    return translate_brax_sac(config, fields)


def translate_brax_sac(config: dict, fields: set[str]) -> tuple[dict, list[str]]:
    """({flag: value}, [what has no flag here]) of a brax SAC config of Playground (`brax_sac_config`), with brax's
    one-step targets and its tau of 0.005."""
    values, named = {}, []
    put = _setter(fields, values, named)

    put("num_envs", int(config["num_envs"]), "num_envs")
    put("batch_size", int(config["batch_size"]), "batch_size")
    put("gamma", float(config["discounting"]), "discounting")
    put("num_updates", int(config["grad_updates_per_step"]), "grad_updates_per_step")
    put("q_lr", float(config["learning_rate"]), "learning_rate")
    put("policy_lr", float(config["learning_rate"]), "learning_rate")
    put("buffer_size", int(config["max_replay_size"]), "max_replay_size")
    put("learning_starts", int(config["min_replay_size"]), "min_replay_size")
    put("obs_norm", bool(config["normalize_observations"]), "normalize_observations")
    put("total_timesteps", int(config["num_timesteps"]), "num_timesteps")
    put("n_step", 1, "brax's n_step")
    put("tau", 0.005, "brax's tau")
    network = dict(config.get("network_factory") or {})
    if "q_network_layer_norm" in network:
        put("critic_layer_norm", bool(network.pop("q_network_layer_norm")), "network_factory.q_network_layer_norm")
    known = {"num_envs", "batch_size", "discounting", "grad_updates_per_step", "learning_rate", "max_replay_size"}
    known |= {"min_replay_size", "normalize_observations", "num_timesteps", "network_factory"}
    named.extend(f"network_factory.{name}={value!r}" for name, value in sorted(network.items()))
    named.extend(f"{name}={config[name]!r}" for name in sorted(set(config) - known))
    return values, named


# ----------------------------------------------------------------------------------------------
# A Playground task named on a machine without CUDA: sizes a CPU trains in minutes
# ----------------------------------------------------------------------------------------------
# The task's configs are a GPU's: brax's PPO config of CartpoleBalance runs 2,048 envs in 983,040-step iterations (an
# hour and its first evaluation at 5.9M steps on a CPU), and cut to 64 envs it does not learn (docs/playground.md);
# FastTD3's 1,024 envs and batches of 32,768 are a GPU's too. With no --settings and no CUDA, a Playground task gets
# the `cpu` set instead, and the start line names the command of the task's own config.
# On-policy scripts: the plain defaults at 64 envs (ppo.py reaches 949 at 202,752 steps on CartpoleBalance, a 2-core
# CPU, docs/playground.md), 16 eval envs, a budget of minutes (307,200 steps: whole iterations of 24 or 32 steps).
CPU_ON_POLICY = dict(num_envs=64, num_eval_envs=16, total_timesteps=307_200)
# Off-policy scripts: about 200,000 steps, an evaluation every 12,800 (counted in iterations of the run's envs). sac.py
# keeps brax's SAC config of the task (128 envs, batches of 512: a CPU's sizes; it passes 500 on CartpoleBalance at
# 128,000 steps); td3.py takes the plain defaults (its device defaults: 32 envs, batches of 512), not FastTD3's.
CPU_OFF_POLICY_STEPS, CPU_OFF_POLICY_EVAL_STEPS = 204_800, 12_800
# MJX, not MuJoCo Warp: on a CPU, MJX compiles CartpoleBalance in about 10 s (Warp about a minute) and steps faster
CPU_ENV_KWARGS = {"impl": "jax"}


def cpu_settings(env_id: str, fields: set[str], task_set) -> tuple[dict, list[str]]:
    """({flag: value}, []) of the `cpu` set of a script whose `task` set is `task_set`, for a Playground task (each task
    set below carries it as its `cpu_set`, which common.args.resolve_settings takes without CUDA)."""
    values = {}
    if "update_epochs" in fields:  # on-policy: the plain defaults at a CPU's sizes
        values.update(CPU_ON_POLICY)
    else:  # off-policy: brax's SAC config where it is the script's task set, else the plain defaults
        if task_set is brax_sac_settings:
            values.update(task_set(env_id, fields)[0])
        values.pop("total_timesteps", None)
        num_envs = _command_line_envs(int(values.get("num_envs", 32)))
        values["num_eval_envs"] = 16
        values["total_timesteps"] = CPU_OFF_POLICY_STEPS
        values["eval_interval"] = max(1, CPU_OFF_POLICY_EVAL_STEPS // num_envs)
    if "impl" in _task_config_fields(env_id, "impl"):
        values["env_kwargs"] = json.dumps(CPU_ENV_KWARGS)
    return {k: v for k, v in values.items() if k in fields}, []


def _task_config_fields(env_id: str, default: str) -> set[str]:
    """The fields of a Playground task's config; {default} where Playground is missing or the task unknown (make_env
    says which)."""
    from common.envs.playground_adapter import configure_jax_memory

    configure_jax_memory()  # the registry imports JAX: its allocator is set before
    try:
        from mujoco_playground import registry

        return set(registry.get_default_config(env_id.split(":", 1)[-1]).keys())
    except (ImportError, KeyError, ValueError):
        return {default}


# ----------------------------------------------------------------------------------------------
# td3.py on Playground: FastTD3's published settings (its hyperparams.py: MuJoCoPlaygroundArgs and the task classes)
# ----------------------------------------------------------------------------------------------
# FastTD3's values in its own units: buffer_size per env, learning_starts and total_timesteps in iterations (one step
# of every env), networks by their first width (the actor halves it twice: 512, 256, 128; the critic 1024, 512, 256).
FASTTD3_PLAYGROUND = dict(
    num_envs=1024, num_eval_envs=1024, buffer_size=1024 * 10, batch_size=32768, gamma=0.97, tau=0.1, num_steps=1,
    num_updates=2, policy_frequency=2, learning_starts=10, total_timesteps=1_500_000, eval_interval=10000,
    critic_learning_rate=3e-4, actor_learning_rate=3e-4, std_min=0.001, std_max=0.4, policy_noise=0.001,
    noise_clip=0.5, num_atoms=101, v_min=-10.0, v_max=10.0, actor_hidden_dim=512, critic_hidden_dim=1024,
    init_scale=0.01, obs_normalization=True, amp=True, use_cdq=True, weight_decay=0.1, max_grad_norm=0.0,
    use_domain_randomization=False, use_push_randomization=False,
)  # fmt: skip
FASTTD3_PLAYGROUND_TASKS = {
    "G1JoystickFlatTerrain": dict(total_timesteps=100_000),
    "G1JoystickRoughTerrain": dict(total_timesteps=100_000),
    "T1JoystickFlatTerrain": dict(total_timesteps=100_000),
    "T1JoystickRoughTerrain": dict(total_timesteps=100_000),
    "T1LowDofJoystickFlatTerrain": dict(total_timesteps=1_000_000),
    "T1LowDofJoystickRoughTerrain": dict(total_timesteps=1_000_000),
    "CheetahRun": dict(num_steps=3, v_min=-500.0, v_max=500.0, std_min=0.1, policy_noise=0.1),  # its DM Control one
    **{
        task: dict(total_timesteps=50_000, std_min=0.2, std_max=0.8, policy_noise=0.2, num_updates=8)
        for task in ("Go1JoystickFlatTerrain", "Go1JoystickRoughTerrain", "Go1Getup")
    },
    "LeapCubeReorient": dict(num_steps=3, policy_noise=0.2, v_min=-50.0, v_max=50.0, use_cdq=False),
    "LeapCubeRotateZAxis": dict(num_steps=1, policy_noise=0.2, v_min=-10.0, v_max=10.0, use_cdq=False),
}


def fasttd3_settings(env_id: str, fields: set[str]):
    """FastTD3's published MuJoCo Playground settings (its defaults for Playground, and its values for the tasks it
    tuned), translated field by field"""
    if not env_id.startswith("playground:"):
        return {}, [f"no published FastTD3 settings for {env_id} here: the plain defaults"]
    task = env_id.split(":", 1)[-1]
    config = {**FASTTD3_PLAYGROUND, **FASTTD3_PLAYGROUND_TASKS.get(task, {})}
    return translate_fasttd3(config, fields, _command_line_envs(int(config["num_envs"])))


# The `cpu` set of each task set (common.args.resolve_settings adds it for a Playground task)
for _task_set in (rsl_rl_settings, brax_sac_settings, fasttd3_settings):
    _task_set.cpu_set = functools.partial(cpu_settings, task_set=_task_set)


def translate_fasttd3(config: dict, fields: set[str], num_envs: int) -> tuple[dict, list[str]]:
    """({flag: value}, [what has no flag here]) of FastTD3's settings for a run of `num_envs` envs per process: its
    per-env buffer and its counts of iterations become transitions and env steps of this run's envs."""
    values, named = {}, []
    put = _setter(fields, values, named)

    put("num_envs", int(config["num_envs"]), "num_envs")
    put("num_eval_envs", int(config["num_eval_envs"]), "num_eval_envs")
    put("buffer_size", int(config["buffer_size"]) * num_envs, "buffer_size (per env)")
    put("batch_size", int(config["batch_size"]), "batch_size")
    put("gamma", float(config["gamma"]), "gamma")
    put("tau", float(config["tau"]), "tau")
    put("n_step", int(config["num_steps"]), "num_steps")
    put("num_updates", int(config["num_updates"]), "num_updates")
    put("policy_frequency", int(config["policy_frequency"]), "policy_frequency")
    put("learning_starts", int(config["learning_starts"]) * num_envs, "learning_starts (iterations)")
    put("total_timesteps", int(config["total_timesteps"]) * num_envs, "total_timesteps (iterations)")
    put("eval_interval", int(config["eval_interval"]), "eval_interval")
    put("q_lr", float(config["critic_learning_rate"]), "critic_learning_rate")
    put("policy_lr", float(config["actor_learning_rate"]), "actor_learning_rate")
    for name in ("std_min", "std_max", "policy_noise", "noise_clip", "num_atoms", "v_min", "v_max"):
        put(name, config[name], name)
    put("distributional", True, "FastTD3's C51 critic")
    width = int(config["actor_hidden_dim"])
    put("hidden_sizes", (width, width // 2, width // 4), "actor_hidden_dim")
    width = int(config["critic_hidden_dim"])
    put("critic_hidden_sizes", (width, width // 2, width // 4), "critic_hidden_dim")
    put("obs_norm", bool(config["obs_normalization"]), "obs_normalization")
    put("bf16", bool(config["amp"]), "amp (bf16)")
    if not config["use_cdq"]:
        named.append(
            "use_cdq=False (FastTD3 bootstraps each critic from its own target, its actor follows their mean; "
            "the minimum of the two here)"
        )
    named.append(f"weight_decay={config['weight_decay']!r} (AdamW; Adam without weight decay here)")
    named.append(f"init_scale={config['init_scale']!r} (the std of the actor's output layer; torch's init here)")
    named.append(
        f"use_domain_randomization={config['use_domain_randomization']!r}, "
        f"use_push_randomization={config['use_push_randomization']!r} "
        "(the task's randomizer applies here unless --env-kwargs '{\"randomize\": false}')"
    )
    return values, named


def _get(cfg, name: str, default=None):
    if cfg is None:
        return default
    return cfg.get(name, default) if isinstance(cfg, dict) else getattr(cfg, name, default)


def _names(cfg) -> list[str]:
    """The fields a config holds (a dict's keys, a dataclass's fields, an object's attributes), None ones left out."""
    if cfg is None:
        return []
    if isinstance(cfg, dict):
        names = list(cfg)
    elif dataclasses.is_dataclass(cfg):
        names = [f.name for f in dataclasses.fields(cfg)]
    else:
        names = [n for n in vars(cfg) if not n.startswith("_")]
    return [n for n in names if _get(cfg, n) is not None]


# What rsl_rl's update does where ours differs (each a flag of the PPO family; docs/rsl_rl.md says what each is), set by
# every runner config: the `task` settings train as rsl_rl trains, the plain defaults keep ours.
RSL_RL_UPDATE = dict(
    kl_estimator="analytic",  # KL(old || new) of the stored and the current Gaussians, not the sampled k3 estimate
    lr_adapt="before-step",  # the KL of a minibatch, before its step, sets that step's rate
    lr_max=1e-2,  # the adaptive rate's cap
    adam_eps=1e-8,  # torch's default: rsl_rl's optimizer is a plain Adam
    reward_norm=False,  # the rewards as the env gives them
    timeout_bootstrap="every-timeout",  # process_env_step: gamma * V on every time-out, a terminating one too
)
# The runner's fields that are not the training's (where it logs, what it loads, its device): ours are --output-dir,
# --run-name, --track, --resume, --device, --compile; clip_actions is the mjlab adapter's (the env's action bounds),
# read by make_env from the same registered config.
RUNNER_BOOKKEEPING = {
    "class_name",
    "experiment_name",
    "run_name",
    "logger",
    "neptune_project",
    "wandb_tags",
    "resume",
    "load_run",
    "load_checkpoint",
    "upload_model",
    "device",
    "check_for_nan",
    "torch_compile_mode",
    "clip_actions",
    "runner_class_name",  # Playground's rsl_rl configs: the runner's class under rsl_rl 2's name
    "checkpoint",
    "resume_path",
}
ACTIVATIONS = {"elu": "elu", "relu": "relu", "tanh": "tanh", "silu": "silu", "swish": "silu"}  # rsl_rl's -> ours


def translate_rsl_rl(rl_cfg, fields: set[str], num_envs: int = 4096, world_size: int = 1) -> tuple[dict, list[str]]:
    """({flag: value}, [what has no flag here, one line each]) of an rsl_rl runner config: rsl_rl 5 / mjlab 1.6's
    (`actor` and `critic` model configs) or rsl_rl 2-3 / Isaac Lab's (one `policy` config). Every field is translated
    or named: only `fields` (the script's flags) are set, a value the script cannot take is named, never dropped; the
    runner's bookkeeping (RUNNER_BOOKKEEPING) is not the training's. rsl_rl's update comes with it (RSL_RL_UPDATE, the
    gradient clip of the layout's rsl_rl, its minibatch order and its time-out bootstrap). `num_envs` x `world_size`
    envs turn max_iterations into --total-timesteps."""
    values, named = {}, []
    put = _setter(fields, values, named)

    def unknown(cfg, known: set[str], where: str):  # a field this translation does not know: named, never dropped
        for name in _names(cfg):
            if name not in known:
                named.append(f"{where}{name}={_get(cfg, name)!r}")

    algorithm, policy, actor = _get(rl_cfg, "algorithm"), _get(rl_cfg, "policy"), _get(rl_cfg, "actor")
    layout_2_3 = policy is not None and actor is None  # rsl_rl 2-3 / Isaac Lab: one actor-critic, one gradient norm
    runner_fields = {"seed", "num_steps_per_env", "max_iterations", "obs_groups", "save_interval", "wandb_project"}
    runner_fields |= {"algorithm", "policy", "actor", "critic", "empirical_normalization", "obs_normalization"}
    unknown(rl_cfg, runner_fields | RUNNER_BOOKKEEPING, "")
    if _get(rl_cfg, "class_name", "OnPolicyRunner") != "OnPolicyRunner":
        named.append(f"class_name={_get(rl_cfg, 'class_name')!r} (ppo's runner here)")
    put("seed", _get(rl_cfg, "seed"), "seed")
    num_steps = _get(rl_cfg, "num_steps_per_env")
    put("num_steps", num_steps, "num_steps_per_env")
    put("save_interval", _get(rl_cfg, "save_interval"), "save_interval")
    put("wandb_project_name", _get(rl_cfg, "wandb_project"), "wandb_project")
    iterations = _get(rl_cfg, "max_iterations")
    if iterations is not None and num_steps is not None:  # the iterations of this run's envs and processes
        put("total_timesteps", num_envs * num_steps * iterations * world_size, f"max_iterations={iterations}: steps")
    elif iterations is not None:
        named.append(f"max_iterations={iterations} (without num_steps_per_env: --total-timesteps is the plain one)")
    recurrent = _models(rl_cfg, policy, actor, layout_2_3, fields, put, named, unknown)
    _algorithm(algorithm, fields, put, named, unknown)
    _obs_groups(_get(rl_cfg, "obs_groups"), _get(algorithm, "rnd_cfg") is not None, fields, put, named)
    for flag, value in RSL_RL_UPDATE.items():
        put(flag, value, flag)
    put("grad_clip", "global" if layout_2_3 else "per-network", "grad_clip")  # rsl_rl 2-3 clips one norm, 5 two
    put("shuffle", "never" if recurrent else "once", "shuffle")  # rsl_rl's minibatch generators
    if "adv_norm" not in values and "adv_norm" in fields and algorithm is not None:
        values["adv_norm"] = "batch"  # rsl_rl's default: normalize_advantage_per_mini_batch=False
    return values, named


def _models(rl_cfg, policy, actor, layout_2_3: bool, fields: set[str], put, named: list, unknown) -> bool:
    """The networks' fields of either layout; whether the task's actor is recurrent."""
    critic = _get(rl_cfg, "critic")
    if layout_2_3:  # rsl_rl 2-3 / Isaac Lab: one policy config
        unknown(
            policy,
            {"class_name", "init_noise_std", "noise_std_type", "state_dependent_std", "actor_obs_normalization"}
            | {"critic_obs_normalization", "actor_hidden_dims", "critic_hidden_dims", "activation", "rnn_type"}
            | {"rnn_hidden_dim", "rnn_num_layers"},
            "policy.",
        )
        kind = _get(policy, "class_name", "ActorCritic")
        recurrent = kind == "ActorCriticRecurrent" or _get(policy, "rnn_type") is not None
        if kind not in ("ActorCritic", "ActorCriticRecurrent"):
            named.append(f"policy.class_name={kind!r} (an MLP actor and critic here)")
        actor_dims, critic_dims = _get(policy, "actor_hidden_dims"), _get(policy, "critic_hidden_dims")
        activations = {_get(policy, "activation")} - {None}
        norm = {_get(policy, "actor_obs_normalization"), _get(policy, "critic_obs_normalization")} - {None}
        runner_norm = {_get(rl_cfg, "empirical_normalization"), _get(rl_cfg, "obs_normalization")} - {None}
        if norm and runner_norm and {bool(x) for x in runner_norm} != {bool(x) for x in norm}:
            # rsl_rl 3 reads the policy's switches and ignores the runner's: said, since the two disagree
            named.append(
                f"empirical_normalization={min(runner_norm)!r}, which the policy's actor_obs_normalization/"
                "critic_obs_normalization override (as in rsl_rl 3: the policy's switches win)"
            )
        norm = norm or runner_norm
        init_std, std_type = _get(policy, "init_noise_std"), _get(policy, "noise_std_type", "scalar")
        if _get(policy, "state_dependent_std"):
            named.append("policy.state_dependent_std=True (a state-independent std here)")
        rnn, critic_rnn = policy, policy if recurrent else None  # ActorCriticRecurrent: a memory for each
    else:  # rsl_rl 5 / mjlab 1.6: two model configs
        for name in ("empirical_normalization", "obs_normalization"):  # rsl_rl 2's switch, ignored by rsl_rl 5
            if _get(rl_cfg, name) is not None:
                named.append(f"{name}={_get(rl_cfg, name)!r} (rsl_rl 5 reads the models' obs_normalization)")
        for model, where in ((actor, "actor."), (critic, "critic.")):
            known = {"class_name", "hidden_dims", "activation", "obs_normalization", "distribution_cfg", "rnn_type"}
            unknown(model, known | {"rnn_hidden_dim", "rnn_num_layers", "cnn_cfg"}, where)
            if _get(model, "cnn_cfg") is not None:
                named.append(f"{where}cnn_cfg={_get(model, 'cnn_cfg')!r} (image groups are read by --encoder here)")
        recurrent = _get(actor, "rnn_type") is not None or _get(actor, "class_name") == "RNNModel"
        critic_recurrent = _get(critic, "rnn_type") is not None or _get(critic, "class_name") == "RNNModel"
        actor_dims, critic_dims = _get(actor, "hidden_dims"), _get(critic, "hidden_dims")
        activations = {_get(actor, "activation"), _get(critic, "activation")} - {None}
        norm = {_get(actor, "obs_normalization"), _get(critic, "obs_normalization")} - {None}
        distribution = _get(actor, "distribution_cfg")
        init_std, std_type = _get(distribution, "init_std"), _get(distribution, "std_type", "scalar")
        kind = _get(distribution, "class_name", "GaussianDistribution")
        if distribution is not None and kind != "GaussianDistribution":
            named.append(f"actor.distribution_cfg.class_name={kind!r} (a Gaussian with a state-independent std here)")
        for name in _names(distribution):
            if name not in ("class_name", "init_std", "std_type"):  # std_range, learn_std: a learned, floored std here
                named.append(f"actor.distribution_cfg.{name}={_get(distribution, name)!r}")
        rnn, critic_rnn = actor, critic if critic_recurrent else None
    if actor_dims is not None and critic_dims is not None and tuple(actor_dims) != tuple(critic_dims):
        named.append(
            f"critic hidden dims {tuple(critic_dims)} (one --hidden-sizes for both: the actor's {tuple(actor_dims)})"
        )
    put("hidden_sizes", None if actor_dims is None else tuple(actor_dims), "actor hidden dims")
    if len(activations) == 1 and min(activations) in ACTIVATIONS:
        put("activation", ACTIVATIONS[min(activations)], "activation")
    elif len(activations) == 1:
        named.append(f"activation={min(activations)!r} (one of {', '.join(sorted(set(ACTIVATIONS.values())))} here)")
    elif activations:
        named.append(f"activations {sorted(activations)} (one --activation for both)")
    if len(norm) == 1:
        put("obs_norm", bool(norm.pop()), "obs normalization")
    elif norm:
        named.append("obs normalization of the actor only or the critic only (one --obs-norm for both)")
    if init_std is not None:
        put("init_log_std", round(math.log(init_std), 6), "init_std")
        put("std_type", std_type, "std_type")
    _memory(rnn, critic_rnn, recurrent, fields, put, named)
    return recurrent


def _memory(rnn, critic_rnn, recurrent: bool, fields: set[str], put, named: list) -> None:
    """A recurrent actor's cell: ppo_lstm.py's flags, or the line that says to use it."""
    cell, size, layers = _get(rnn, "rnn_type"), _get(rnn, "rnn_hidden_dim"), _get(rnn, "rnn_num_layers")
    if recurrent and "cell" not in fields:
        named.append(
            f"rnn_type={cell!r}, rnn_hidden_dim={size!r}, rnn_num_layers={layers!r} (this task's config is "
            "recurrent: use algos/ppo_lstm.py)"
        )
    elif recurrent:
        if cell is not None and cell.lower() not in ("lstm", "gru"):
            named.append(f"rnn_type={cell!r} (an lstm or a gru here)")
        else:
            put("cell", None if cell is None else cell.lower(), "rnn_type")
        put("rnn_hidden_size", size, "rnn_hidden_dim")
        put("rnn_layers", layers, "rnn_num_layers")
        if critic_rnn is not None:
            named.append("the critic's own memory (rsl_rl's: one for each network; one cell here, read by both heads)")
        else:
            named.append("a critic without a memory (rsl_rl's MLP critic; here the critic head reads the cell too)")
    elif "cell" in fields:
        named.append("a policy without a memory (the task's config is not recurrent: the cell is ppo_lstm.py's own)")


def _algorithm(algorithm, fields: set[str], put, named: list, unknown) -> None:
    """The algorithm's fields: ppo.py's flags, rsl_rl's value loss scale, the RND and symmetry configs."""
    own = {"learning_rate", "desired_kl", "num_learning_epochs", "num_mini_batches", "clip_param", "gamma", "lam"}
    own |= {"entropy_coef", "max_grad_norm", "use_clipped_value_loss", "schedule", "value_loss_coef", "optimizer"}
    own |= {"class_name", "normalize_advantage_per_mini_batch", "share_cnn_encoders", "rnd_cfg", "symmetry_cfg"}
    unknown(algorithm, own, "algorithm.")
    if _get(algorithm, "class_name", "PPO") != "PPO":
        named.append(f"algorithm.class_name={_get(algorithm, 'class_name')!r} (PPO here)")
    schedule = _get(algorithm, "schedule")
    if schedule not in (None, "fixed", "adaptive"):
        named.append(f"schedule={schedule!r} (fixed or adaptive)")
    else:
        put("lr_schedule", {"fixed": "constant", "adaptive": "adaptive"}.get(schedule), "schedule")
    for ours, theirs in (
        ("learning_rate", "learning_rate"),
        ("desired_kl", "desired_kl"),
        ("update_epochs", "num_learning_epochs"),
        ("num_minibatches", "num_mini_batches"),
        ("clip_coef", "clip_param"),
        ("gamma", "gamma"),
        ("gae_lambda", "lam"),
        ("ent_coef", "entropy_coef"),
        ("max_grad_norm", "max_grad_norm"),
        ("clip_vloss", "use_clipped_value_loss"),
    ):
        put(ours, _get(algorithm, theirs), theirs)
    value_loss_coef = _get(algorithm, "value_loss_coef")  # of (V - R)^2; ours weighs 0.5 * (V - R)^2
    put("vf_coef", None if value_loss_coef is None else 2.0 * value_loss_coef, "value_loss_coef")
    per_minibatch = _get(algorithm, "normalize_advantage_per_mini_batch")
    if per_minibatch is not None:
        put("adv_norm", "minibatch" if per_minibatch else "batch", "normalize_advantage_per_mini_batch")
    if str(_get(algorithm, "optimizer", "adam")).lower() != "adam":
        named.append(f"optimizer={_get(algorithm, 'optimizer')!r} (Adam here)")
    if _get(algorithm, "share_cnn_encoders"):
        named.append("share_cnn_encoders=True (--shared-encoder shares one under both heads, the critic on 'policy')")
    symmetry = _get(algorithm, "symmetry_cfg")
    if symmetry is not None and "symmetry" in fields:
        augment, mirror = bool(_get(symmetry, "use_data_augmentation")), bool(_get(symmetry, "use_mirror_loss"))
        put(
            "symmetry",
            {(True, True): "both", (True, False): "augmentation", (False, True): "mirror-loss"}.get(
                (augment, mirror), "log"
            ),
            "symmetry_cfg",
        )
        put("mirror_loss_coef", _get(symmetry, "mirror_loss_coeff"), "symmetry_cfg.mirror_loss_coeff")
    elif symmetry is not None:
        named.append("symmetry_cfg (ppo.py's --symmetry)")
    rnd = _get(algorithm, "rnd_cfg")
    if rnd is not None and "rnd_weight" not in fields:
        named.append("rnd_cfg (ppo_rnd.py's RND)")
    elif rnd is not None:
        put("rnd_weight", _get(rnd, "weight"), "rnd_cfg.weight")
        put("rnd_learning_rate", _get(rnd, "learning_rate"), "rnd_cfg.learning_rate")
        put("rnd_state_norm", _get(rnd, "state_normalization"), "rnd_cfg.state_normalization")
        put("rnd_reward_norm", _get(rnd, "reward_normalization"), "rnd_cfg.reward_normalization")
        for ours, theirs in (
            ("rnd_hidden_sizes", "predictor_hidden_dims"),
            ("rnd_target_hidden_sizes", "target_hidden_dims"),
        ):
            dims = _get(rnd, theirs)
            if dims is not None and -1 in dims:  # rsl_rl's -1: as wide as the input
                named.append(f"rnd_cfg.{theirs}={dims!r} (-1, the input's size: give --{ours.replace('_', '-')})")
            else:
                put(ours, None if dims is None else tuple(dims), f"rnd_cfg.{theirs}")
        put("rnd_num_outputs", _get(rnd, "num_outputs"), "rnd_cfg.num_outputs")
        _rnd_schedule(_get(rnd, "weight_schedule"), put, named)
        known = {"weight", "learning_rate", "state_normalization", "reward_normalization", "predictor_hidden_dims"}
        unknown(rnd, known | {"target_hidden_dims", "num_outputs", "weight_schedule"}, "rnd_cfg.")


def _rnd_schedule(schedule, put, named: list) -> None:
    """rsl_rl's weight_schedule: --rnd-weight-final and --rnd-weight-steps (docs/rsl_rl.md's table)."""
    mode = _get(schedule, "mode", "constant") if schedule is not None else "constant"
    if mode == "constant":
        return
    final_step, final_value = _get(schedule, "final_step"), _get(schedule, "final_value")
    if mode in ("linear", "step") and final_step is not None and final_value is not None:
        start = _get(schedule, "initial_step", 0) if mode == "linear" else final_step
        put("rnd_weight_final", final_value, "rnd_cfg.weight_schedule.final_value")
        put("rnd_weight_steps", (int(start), int(final_step)), "rnd_cfg.weight_schedule steps")
    else:
        named.append(f"rnd_cfg.weight_schedule={schedule!r} (--rnd-weight-final)")


def _obs_groups(obs_groups, rnd: bool, fields: set[str], put, named: list) -> None:
    """rsl_rl's observation sets (actor, or rsl_rl 3's policy; critic; rnd_state) as the env groups the mjlab adapter
    maps to "policy" and "critic" (--env-kwargs obs_groups: a group the task lacks stops make_env in one line), with
    rsl_rl's time-out bootstrap (final_obs "pre_step": V of the observation before a time-out, not after it)."""
    groups, kwargs = dict(obs_groups or {}), {}
    for key, sets in (("policy", ("actor", "policy")), ("critic", ("critic",))):
        theirs = next((groups[s] for s in sets if s in groups), None)
        theirs = [theirs] if isinstance(theirs, str) else theirs
        if theirs is not None and len(theirs) == 1:
            kwargs[key] = theirs[0]
        elif theirs is not None:  # rsl_rl concatenates them; the adapter maps one group per network
            named.append(f"obs_groups[{sets[0]!r}]={tuple(theirs)!r} (one group per network here)")
    rnd_state = groups.get("rnd_state")
    rnd_state = [rnd_state] if isinstance(rnd_state, str) else rnd_state
    if rnd and rnd_state is not None and "rnd_obs_group" in fields:
        mapped = {group: key for key, group in kwargs.items()}
        if len(rnd_state) == 1 and rnd_state[0] in mapped:
            put("rnd_obs_group", mapped[rnd_state[0]], "obs_groups['rnd_state']")
        else:
            named.append(f"obs_groups['rnd_state']={tuple(rnd_state)!r} (--rnd-obs-group reads policy or critic)")
    for name in set(groups) - {"actor", "policy", "critic", "rnd_state"}:
        named.append(f"obs_groups[{name!r}]={groups[name]!r} (no such network here)")
    env_kwargs = {"obs_groups": kwargs} if kwargs else {}
    put("env_kwargs", json.dumps({**env_kwargs, "final_obs": "pre_step"}), "time-out bootstrap")


# ----------------------------------------------------------------------------------------------
# Threads: torch's default (one per core) collapses on a busy machine
# ----------------------------------------------------------------------------------------------
def choose_threads() -> str | None:
    """Give torch the cores the machine has free where no OMP_NUM_THREADS is set; the start line saying so, or None.
    Why: torch's threads spin while they wait for each other, and on busy cores that wait is most of a step."""
    import torch

    if os.environ.get("OMP_NUM_THREADS") or not hasattr(os, "getloadavg"):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    load = os.getloadavg()[0]
    threads = max(1, min(torch.get_num_threads(), math.floor(cores - load + 0.5)))
    if threads >= torch.get_num_threads():
        return None
    torch.set_num_threads(threads)
    return (
        f"threads: torch uses {threads} of {cores} cores (the load over the last minute is {load:.1f}); "
        f"OMP_NUM_THREADS=N sets them"
    )
