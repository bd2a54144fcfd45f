"""The teacher of a distillation (algos/distill.py): the observation group it reads, its checkpoint checked against
the task before anything runs, and the record of which file taught. The script rebuilds the teacher's actor from the
checkpoint with its own network class and freezes it."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import gymnasium as gym

from common.checkpoint import CheckpointError, algorithm_of, load_checkpoint

if TYPE_CHECKING:
    from common.record import Run


def teacher_group(args, obs) -> str:
    """The observation group the teacher reads: --teacher-obs, or "critic" (the full state) where the env has one."""
    group = args.teacher_obs or ("critic" if "critic" in obs.keys() else "policy")
    if args.teacher is None:
        raise SystemExit(
            "error: --teacher PATH is required: a checkpoint of ppo.py or ppo_lstm.py trained on the task "
            "(with its full state, e.g. the env's 'critic' observations)"
        )
    if group not in obs.keys():
        raise SystemExit(
            f"error: --teacher-obs {group}: {args.env_id} has the observation groups {', '.join(obs.keys())}"
        )
    return group


def teacher_checkpoint(
    path: str, obs_dim: int, group: str, action_space: gym.Space, env_id: str, teachers: tuple[str, ...]
) -> tuple[dict, str]:
    """The checkpoint at `path` and the file's sha256, where it is a teacher: of one of the algorithms `teachers` (or
    a copy), its actor reading `obs_dim` observations of `group` and acting in `action_space`; else one line stops."""
    try:
        ckpt = load_checkpoint(path)
    except CheckpointError as e:
        raise SystemExit(f"error: --teacher: {e}") from None
    # By algorithm, not by the writing script's name: a copy of ppo.py (ppo_mine.py) writes "algo": "ppo_mine" and
    # "algorithm": "ppo", and its actor is ppo's.
    algorithm = algorithm_of(ckpt)
    if algorithm not in teachers:
        raise SystemExit(
            f"error: --teacher {path} was written by {ckpt['algo']}.py (algorithm {algorithm}); a teacher "
            f"comes from {', '.join(f'{t}.py' for t in teachers)} or a copy of one"
        )
    model = ckpt["model"]
    first = model["rnn.weight_ih_l0" if ckpt["args"].get("cell", "none") != "none" else "actor.0.weight"]
    head = [k for k in model if k.startswith("actor.") and k.endswith(".weight")]
    last = model[max(head, key=lambda k: int(k.split(".")[1]))]  # the actor's output layer
    discrete = isinstance(action_space, gym.spaces.Discrete)
    space = f"Discrete({action_space.n})" if discrete else f"Box{list(action_space.shape)}"
    gaussian = "log_std" in model or "std" in model  # ppo's Gaussians: a learned log-std, or the std (--std-type)
    other_kind = algorithm != "distill" and gaussian == discrete
    outputs = int(action_space.n) if discrete else action_space.shape[0]
    if first.shape[1] != obs_dim or last.shape[0] != outputs or other_kind:
        raise SystemExit(
            f"error: --teacher {path} ({ckpt['algo']} on {ckpt['env_id']}) reads {first.shape[1]} observations "
            f"and has {last.shape[0]} action outputs{' (Gaussian)' if gaussian else ''}; {env_id}'s "
            f"{group!r} observations have {obs_dim} and its actions are {space}: give a teacher of this task "
            f"(--teacher-obs names the group it reads)"
        )
    return ckpt, hashlib.sha256(Path(path).read_bytes()).hexdigest()


def note_teacher(run: Run, info: dict, path: str, digest: str) -> None:
    """The teacher's file (resolved path, sha256) into `info`, which the checkpoints keep; a notice if it changed."""
    if info["sha256"] not in (None, digest):
        run.say(f"notice: --teacher {path} is not the file the checkpoint's run distilled from (sha256 differs)")
    info.update(path=str(Path(path).resolve()), sha256=digest)
