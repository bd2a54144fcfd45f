"""Throughput of the built-in torch envs: env steps per second, env only, random actions.

    python -m tests.benchmarks.envs [--device cpu] [--num-envs 4096 65536] [--steps 200] [--threads T]
                               [--compile] [--json]

A benchmark, not a test: pytest does not collect it (no test_ prefix). Actions are drawn
before the clock starts and cycled, so only `env.step` is timed (including the same-step
autoreset and the TensorDict wrapping of observations). On CUDA the device is
synchronised before reading the clock, since kernels run asynchronously. With --compile
the step is wrapped in torch.compile (the warm-up steps absorb the compilation).
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import gymnasium as gym
import torch

from common.envs import BUILTIN_ENVS, make_env


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_action_pool(env, pool_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """A few random action batches on the env's device, reused cyclically while timing."""
    n, space = env.num_envs, env.single_action_space
    pool = []
    for _ in range(pool_size):
        if isinstance(space, gym.spaces.Discrete):
            a = torch.randint(0, int(space.n), (n,), generator=generator)
        else:
            low = torch.as_tensor(space.low, dtype=torch.float32)
            high = torch.as_tensor(space.high, dtype=torch.float32)
            a = low + (high - low) * torch.rand((n, *space.shape), generator=generator)
        pool.append(a.to(env.device))
    return pool


def bench_one(env_id: str, num_envs: int, device: torch.device, steps: int, warmup: int, use_compile: bool) -> dict:
    env = make_env(env_id, num_envs, device=device, seed=0)
    env.reset()
    if use_compile:
        # Every env shares TorchEnv.step's code; start from an empty compile cache so that
        # earlier measurements cannot exhaust the recompile limit (silent eager fallback).
        torch.compiler.reset()
        step = torch.compile(env.step)
    else:
        step = env.step
    actions = random_action_pool(env, 8, torch.Generator().manual_seed(0))
    for i in range(warmup):
        step(actions[i % len(actions)])
    _sync(device)
    start = time.perf_counter()
    for i in range(steps):
        step(actions[i % len(actions)])
    _sync(device)
    seconds = time.perf_counter() - start
    return {
        "env_id": env_id,
        "num_envs": num_envs,
        "device": str(device),
        "compile": use_compile,
        "steps": steps,
        "seconds": seconds,
        "env_steps_per_second": steps * num_envs / seconds,
        "ms_per_step": 1e3 * seconds / steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[4096, 65536])
    parser.add_argument("--steps", type=int, default=200, help="timed steps per measurement")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps before timing")
    parser.add_argument("--envs", nargs="+", default=list(BUILTIN_ENVS), help="env ids to run")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--compile", action="store_true", help="time torch.compile(env.step)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    device = torch.device(args.device)
    results = [
        bench_one(env_id, n, device, args.steps, args.warmup, args.compile)
        for env_id in args.envs
        for n in args.num_envs
    ]
    machine = {
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine(),
        "cpu_threads": torch.get_num_threads(),
    }
    if args.json:
        print(json.dumps({"machine": machine, "results": results}, indent=2))
        return
    mode = "torch.compile" if args.compile else "eager"
    print(
        f"torch {machine['torch']} {mode} on {device} ({machine['device_name']}, {machine['cpu_threads']} CPU threads)"
    )
    print(f"{'env':<26}{'num_envs':>10}{'env steps/s':>16}{'ms/step':>10}")
    for r in results:
        print(f"{r['env_id']:<26}{r['num_envs']:>10}{r['env_steps_per_second']:>16,.0f}{r['ms_per_step']:>10.3f}")


if __name__ == "__main__":
    main()
