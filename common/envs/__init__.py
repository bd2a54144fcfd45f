"""`make_env`: one entry point for built-in torch envs and adapters to real simulators.

    envs = make_env("CartPole-v1", num_envs=4096, device="cuda", seed=1)
    obs, info = envs.reset(seed=1)
    obs, reward, terminated, truncated, info = envs.step(action)

A plain id names a built-in batched torch env: gymnasium's classic control (classic.py) and
MinAtar's games (the minatar package, one module per game, e.g. `MinAtar/Breakout-v1`, image observations).
An id `<prefix>:<name>` is handed to an adapter, imported only when used so that its
simulator is an optional dependency:

    gym:<id>          gymnasium env, e.g. gym:HalfCheetah-v5, gym:ALE/Pong-v5 (preset="atari")
    envpool:<task>    envpool task, e.g. envpool:Pong-v5 (preset="atari"), envpool:HalfCheetah-v5
    mjlab:<task>      mjlab task, e.g. mjlab:Mjlab-Velocity-Flat-Unitree-G1
    playground:<task> MuJoCo Playground task on JAX, e.g. playground:CartpoleBalance, playground:Go1JoystickFlatTerrain

An Isaac Lab prefix is a small addition on top of mjlab_adapter.ManagerBasedEnvAdapter, which
wraps any env with Isaac Lab's ManagerBasedRLEnv interface (see the README).
"""

from __future__ import annotations

import difflib
import inspect
import os

import torch

from common.envs.classic import Acrobot, CartPole, MountainCar, MountainCarContinuous, Pendulum
from common.envs.core import TorchEnv
from common.envs.minatar import MINATAR_ENVS

BUILTIN_ENVS: dict[str, type[TorchEnv]] = {
    cls.env_id: cls for cls in (CartPole, Pendulum, MountainCarContinuous, Acrobot, MountainCar, *MINATAR_ENVS)
}
ADAPTER_PREFIXES = ("gym", "envpool", "mjlab", "playground")
CANNOT_RENDER = {  # adapters whose envs draw no frames (--capture-video), and why
    "mjlab": "mjlab's offscreen renderer is not wired in",
    "playground": "Playground renders trajectories after the fact, not a live batch",
}

__all__ = [
    "ADAPTER_PREFIXES",
    "BUILTIN_ENVS",
    "EVAL_PRESETS",
    "TorchEnv",
    "eval_env_kwargs",
    "draws_with_pygame",
    "list_envs",
    "make_env",
]

# A training preset -> the evaluation preset it implies: Atari's training preset ends an episode at a lost
# life and clips rewards; evaluated so, best.pt would be chosen on per-life clipped sums, not game scores.
EVAL_PRESETS = {"atari": "atari-eval"}


def eval_env_kwargs(kwargs: dict, eval_kwargs: dict) -> tuple[dict, str | None]:
    """The eval envs' keyword arguments: the training envs' `kwargs` updated with `eval_kwargs`, where a
    training preset implies its evaluation preset unless `eval_kwargs` names a preset. Returns them and,
    when a preset was implied, a line that says so."""
    merged = {**kwargs, **eval_kwargs}
    preset = kwargs.get("preset")
    if "preset" in eval_kwargs or preset not in EVAL_PRESETS:
        return merged, None
    merged["preset"] = EVAL_PRESETS[preset]
    return merged, (
        f'eval envs: preset "{merged["preset"]}" (implied by the training preset "{preset}": whole games, '
        f"unclipped scores); --eval-env-kwargs '{{\"preset\": ...}}' sets another"
    )


def draws_with_pygame(env_id: str) -> bool:
    """Whether the env's video frames come from gymnasium's classic renderers (pygame), not from its images."""
    env = BUILTIN_ENVS.get(env_id)
    return env is not None and env.render is TorchEnv.render


def list_envs() -> list[str]:
    """Ids of the built-in envs (adapters accept any id their simulator knows)."""
    return list(BUILTIN_ENVS)


def _ids_help() -> str:
    prefixes = ", ".join(f"{p}:<name>" for p in ADAPTER_PREFIXES)
    return f"built-in ids: {', '.join(BUILTIN_ENVS)}; or an adapter id: {prefixes}"


def make_env(
    env_id: str,
    num_envs: int,
    device: str | torch.device = "cpu",
    seed: int = 0,
    render_mode: str | None = None,
    **kwargs,
):
    """Create `num_envs` parallel envs of `env_id` on `device`; env i is seeded `seed + i`.

    Since env i of a batch uses seed `seed + i`, batches that must differ (ranks of a
    distributed run, train vs eval envs) need disjoint ranges, e.g. `seed + rank * num_envs`.

    Built-in envs accept `dtype` (default torch.float32), `max_episode_steps` (default:
    gymnasium's registered limit) and the options of gymnasium's constructor (e.g. `g` for
    Pendulum-v1); CartPole-v1 and Pendulum-v1 also `mask_velocity` (observations without the
    velocities: a partially observed task). Adapter ids pass `kwargs` on to the adapter.

    `render_mode="rgb_array"` asks for envs whose `render(env_ids)` returns frames (for recorded
    evaluation); built-in envs always can, `gym:` envs are built for it, `envpool:` envs draw them
    from image observations, other adapters say they cannot.
    """
    if render_mode not in (None, "rgb_array"):
        raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
    if render_mode is not None:  # gymnasium's renderers draw with pygame: off-screen, silent
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    if ":" in env_id:
        prefix, name = env_id.split(":", 1)
        if not name:
            raise ValueError(f"env id {env_id!r} names no env after the prefix; {_ids_help()}")
        # Adapters are imported here, not at module level: their simulators are optional.
        if prefix == "gym":
            from common.envs.gym_adapter import make_gym_env

            return make_gym_env(name, num_envs, device=device, seed=seed, render_mode=render_mode, **kwargs)
        if prefix == "envpool":
            from common.envs.envpool_adapter import make_envpool_env

            return make_envpool_env(name, num_envs, device=device, seed=seed, render_mode=render_mode, **kwargs)
        if render_mode is not None and prefix in CANNOT_RENDER:
            raise ValueError(
                f"{env_id}: this adapter cannot render frames ({CANNOT_RENDER[prefix]}); run without --capture-video"
            )
        if prefix == "mjlab":
            from common.envs.mjlab_adapter import make_mjlab_env

            return make_mjlab_env(name, num_envs, device=device, seed=seed, **kwargs)
        if prefix == "playground":
            from common.envs.playground_adapter import make_playground_env

            return make_playground_env(name, num_envs, device=device, seed=seed, **kwargs)
        raise ValueError(f"unknown env id prefix {prefix!r} in {env_id!r}; {_ids_help()}")

    cls = BUILTIN_ENVS.get(env_id)
    if cls is None:
        close = difflib.get_close_matches(env_id, list(BUILTIN_ENVS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown env id {env_id!r}{hint}; {_ids_help()}")

    positional = ("self", "num_envs", "device", "seed")
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p not in positional]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise TypeError(
            f"make_env({env_id!r}) got unexpected keyword argument(s) {', '.join(unknown)}; "
            f"it accepts: {', '.join(accepted)}"
        )
    return cls(num_envs, device=device, seed=seed, **kwargs)
