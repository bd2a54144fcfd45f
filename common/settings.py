"""Named settings' values that come from elsewhere: a mjlab task's registered rsl_rl runner config, translated field by
field (`rsl_rl_settings`); and the torch threads a run takes on a busy CPU (`choose_threads`)."""

from __future__ import annotations

import math
import os


# ----------------------------------------------------------------------------------------------
# mjlab tasks: the task's registered rsl_rl runner config, field by field
# ----------------------------------------------------------------------------------------------
def rsl_rl_settings(env_id: str, fields: set[str]):
    """the task's rsl_rl runner config (load_rl_cfg), translated field by field"""
    task = env_id.split(":", 1)[1]
    try:
        from mjlab.tasks.registry import load_rl_cfg

        rl_cfg = load_rl_cfg(task)
    except ImportError:  # make_env says how to install it
        return {}, []
    except (KeyError, ValueError):  # an unknown task: make_env names the registered ones
        return {}, []
    return translate_rsl_rl(rl_cfg, fields)


def _get(cfg, name: str, default=None):
    if cfg is None:
        return default
    return cfg.get(name, default) if isinstance(cfg, dict) else getattr(cfg, name, default)


def translate_rsl_rl(rl_cfg, fields: set[str]) -> tuple[dict, list[str]]:
    """({flag: value}, [what has no flag here]) of an rsl_rl 2-3 / Isaac Lab or rsl_rl 5 / mjlab 1.6 runner config.
    Only `fields` are set; a value the script cannot take is named, never dropped silently."""
    values, untranslated = {}, []

    def put(flag: str, value, source: str):
        if value is None:
            return
        if flag in fields:
            values[flag] = value
        else:
            untranslated.append(f"{source}={value!r}")

    algorithm = _get(rl_cfg, "algorithm")
    put("num_steps", _get(rl_cfg, "num_steps_per_env"), "num_steps_per_env")
    policy, actor, critic = _get(rl_cfg, "policy"), _get(rl_cfg, "actor"), _get(rl_cfg, "critic")
    if actor is not None:  # rsl_rl 5 / mjlab 1.6: two model configs
        actor_dims, critic_dims = _get(actor, "hidden_dims"), _get(critic, "hidden_dims")
        activations = {_get(actor, "activation"), _get(critic, "activation")} - {None}
        norm = {_get(actor, "obs_normalization"), _get(critic, "obs_normalization")} - {None}
        init_std = _get(_get(actor, "distribution_cfg"), "init_std")
        std_type = _get(_get(actor, "distribution_cfg"), "std_type")
        if std_type not in (None, "log"):  # same initial noise, another parameter learned: named, not dropped
            untranslated.append(f"actor std_type={std_type!r} (a learned log-std here)")
        for model, name in ((actor, "actor"), (critic, "critic")):
            for extra in ("rnn_type", "cnn_cfg"):
                if _get(model, extra) is not None:
                    untranslated.append(f"{name}.{extra}={_get(model, extra)!r}")
    else:  # rsl_rl 2-3 / Isaac Lab: one policy config
        actor_dims, critic_dims = _get(policy, "actor_hidden_dims"), _get(policy, "critic_hidden_dims")
        activations = {_get(policy, "activation")} - {None}
        norm = {_get(rl_cfg, "empirical_normalization"), _get(rl_cfg, "obs_normalization")} - {None}
        init_std = _get(policy, "init_noise_std")
    if actor_dims is not None and critic_dims is not None and tuple(actor_dims) != tuple(critic_dims):
        untranslated.append(
            f"critic hidden dims {tuple(critic_dims)} (one --hidden-sizes for both: the actor's {tuple(actor_dims)})"
        )
    put("hidden_sizes", None if actor_dims is None else tuple(actor_dims), "actor hidden dims")
    if len(activations) == 1:
        put("activation", activations.pop(), "activation")
    elif activations:
        untranslated.append(f"activations {sorted(activations)} (one --activation for both)")
    if len(norm) == 1:
        put("obs_norm", bool(norm.pop()), "obs normalization")
    elif norm:
        untranslated.append("obs normalization of the actor only or the critic only (one --obs-norm for both)")
    if init_std is not None:
        put("init_log_std", round(math.log(init_std), 6), "init_noise_std")
    schedule = _get(algorithm, "schedule")
    put("lr_schedule", {"fixed": "constant", "adaptive": "adaptive"}.get(schedule, schedule), "schedule")
    for ours, theirs in (
        ("learning_rate", "learning_rate"),
        ("desired_kl", "desired_kl"),
        ("update_epochs", "num_learning_epochs"),
        ("num_minibatches", "num_mini_batches"),
        ("clip_coef", "clip_param"),
        ("gamma", "gamma"),
        ("gae_lambda", "lam"),
        ("vf_coef", "value_loss_coef"),
        ("ent_coef", "entropy_coef"),
        ("max_grad_norm", "max_grad_norm"),
        ("clip_vloss", "use_clipped_value_loss"),
    ):
        put(ours, _get(algorithm, theirs), theirs)
    per_minibatch = _get(algorithm, "normalize_advantage_per_mini_batch")
    if per_minibatch is not None:
        put("adv_norm", "minibatch" if per_minibatch else "batch", "normalize_advantage_per_mini_batch")
    if _get(algorithm, "optimizer", "adam") != "adam":
        untranslated.append(f"optimizer={_get(algorithm, 'optimizer')!r} (Adam here)")
    symmetry = _get(algorithm, "symmetry_cfg")
    if symmetry is not None and "symmetry" in fields:
        augment, mirror = bool(_get(symmetry, "use_data_augmentation")), bool(_get(symmetry, "use_mirror_loss"))
        values["symmetry"] = {(True, True): "both", (True, False): "augmentation", (False, True): "mirror-loss"}.get(
            (augment, mirror), "none"
        )
        if mirror:
            put("mirror_loss_coef", _get(symmetry, "mirror_loss_coeff"), "symmetry_cfg.mirror_loss_coeff")
    elif symmetry is not None:
        untranslated.append("symmetry_cfg (ppo.py's --symmetry)")
    rnd = _get(algorithm, "rnd_cfg")
    if rnd is not None:
        if "rnd_weight" not in fields:
            untranslated.append("rnd_cfg (ppo_rnd.py's RND)")
        else:
            put("rnd_weight", _get(rnd, "weight"), "rnd_cfg.weight")
            put("rnd_learning_rate", _get(rnd, "learning_rate"), "rnd_cfg.learning_rate")
            put("rnd_state_norm", _get(rnd, "state_normalization"), "rnd_cfg.state_normalization")
            put("rnd_reward_norm", _get(rnd, "reward_normalization"), "rnd_cfg.reward_normalization")
            for ours, theirs in (
                ("rnd_hidden_sizes", "predictor_hidden_dims"),
                ("rnd_target_hidden_sizes", "target_hidden_dims"),
            ):
                dims = _get(rnd, theirs)
                put(ours, None if dims is None else tuple(dims), f"rnd_cfg.{theirs}")
            put("rnd_num_outputs", _get(rnd, "num_outputs"), "rnd_cfg.num_outputs")
            if _get(rnd, "weight_schedule") is not None:
                untranslated.append(f"rnd_cfg.weight_schedule={_get(rnd, 'weight_schedule')!r} (--rnd-weight-final)")
    return values, untranslated


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
