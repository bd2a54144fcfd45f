"""Env steps per second of the playground: adapter beside Playground's own torch wrapper (RSLRLBraxWrapper, its rsl_rl
path), the same task, envs, backend and device, in one command, after each has compiled and warmed up:

    python -m tests.benchmarks.playground --task G1JoystickFlatTerrain --num-envs 4096 --device cuda
    python -m tests.benchmarks.playground --task CartpoleBalance --num-envs 256 --impl jax --device cpu

Both step with uniform random actions made by torch on the device; each timed run ends with a device synchronisation.
Prints one JSON line per env (`sps`: env steps of all envs per second) and their ratio. The adapter's step also
keeps the true final observations (and, with --full-reset, restarts from a fresh reset); the wrapper's does neither."""

from __future__ import annotations

import argparse
import json
import time

import torch


def timed(step, actions, repeats: int, device: torch.device) -> float:
    for a in actions[:5]:  # warm-up after the compile
        step(a)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for i in range(repeats):
        out = step(actions[i % len(actions)])
    torch.as_tensor(out).sum().item()  # the last step done (JAX dispatches asynchronously)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="CartpoleBalance")
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=200, help="timed steps of each")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--impl", default=None, help="the task config's backend: warp or jax (default: the task's)")
    parser.add_argument("--full-reset", action="store_true", help="the adapter restarts from fresh resets")
    args = parser.parse_args()
    device = torch.device(args.device)

    from common.envs import make_env

    overrides = {} if args.impl is None else {"impl": args.impl}
    ours = make_env(f"playground:{args.task}", args.num_envs, device, seed=1, full_reset=args.full_reset, **overrides)
    ours.reset(seed=1)
    from mujoco_playground import registry
    from mujoco_playground._src.wrapper_torch import RSLRLBraxWrapper

    config = registry.get_default_config(args.task)
    env = registry.load(args.task, config_overrides=overrides or None)
    randomizer = registry.get_domain_randomizer(args.task)
    rank = (device.index or 0) if device.type == "cuda" else None
    theirs = RSLRLBraxWrapper(
        env, args.num_envs, 1, config.episode_length, config.get("action_repeat", 1), randomizer, device_rank=rank
    )
    theirs.reset()
    generator = torch.Generator(device).manual_seed(0)
    actions = torch.rand(16, args.num_envs, ours.act_dim, device=device, generator=generator) * 2 - 1
    figures = {}
    for name, step in (
        ("playground_adapter", lambda a: ours.step(a)[1]),
        ("RSLRLBraxWrapper", lambda a: theirs.step(a)[1]),
    ):
        seconds = timed(step, actions, args.steps, device)
        figures[name] = args.steps * args.num_envs / seconds
        print(json.dumps(dict(env=name, task=args.task, num_envs=args.num_envs, device=str(device), sps=figures[name])))
    ratio = figures["playground_adapter"] / figures["RSLRLBraxWrapper"]
    print(json.dumps(dict(ratio_adapter_over_wrapper=ratio, full_reset=args.full_reset, impl=args.impl)))


if __name__ == "__main__":
    main()
