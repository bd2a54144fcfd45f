"""algos/ppo.py on an mjlab task next to mjlab's own PPO, and the env alone, in one invocation on one device.

    python -m tests.benchmarks.mjlab [--task Mjlab-Velocity-Flat-Unitree-G1] [--num-envs 4096] [--device cuda]
        [--iterations 10] [--warmup-iterations 2] [--env-steps 100] [--repeats 3] [--final-obs terminal pre_step]
        [--mjlab-logging] [--threads T] [--json PATH | --json -]

    python -m tests.benchmarks.mjlab --device cpu --task Mjlab-Cartpole-Balance --num-envs 64 --iterations 3

A benchmark, not a test: nothing here asserts a speed. It needs mjlab (and rsl-rl-lib, which mjlab
installs) and stops with the cause when either is missing. Rows of the table:

1. env only, mjlab: `ManagerBasedRlEnv.step` with uniform random actions in [-1, 1], mjlab's own
   auto-reset, no adapter;
2. env only, through the `mjlab:` adapter, per `final_obs` mode: what the adapter adds per step
   (for "terminal" that includes the extra forward/observation pass on steps where an episode ends,
   see common/envs/mjlab_adapter.py);
3. algos/ppo.py, per `final_obs` mode: the script trained for W + K iterations in a subprocess
   (bench.run_training, the measurement of tests/benchmarks/bench.py: SPS from the wall-clock times
   of its TensorBoard events, one per log interval, after the warm-up; rollout and update seconds
   per iteration, the medians of its `charts/rollout_seconds` / `charts/update_seconds`);
4. mjlab's PPO: the task's registered runner class (rsl_rl's OnPolicyRunner underneath) with the
   task's rsl_rl config, on the env wrapped as mjlab's train.py wraps it (RslRlVecEnvWrapper with
   the task's clip_actions), trained for W + K iterations in a subprocess; SPS from the wall-clock
   times of rsl_rl's per-iteration log call after the warm-up, collection and learning seconds the
   medians of rsl_rl's own per-iteration timers.

Matched sizes: both learners use the task's rsl_rl config for the batch and the networks: num_envs,
steps per env (`num_steps_per_env`), epochs, minibatches, hidden sizes and activation of actor and
critic; ours takes them as --num-steps, --update-epochs, --num-minibatches, --hidden-sizes and
--activation (the learning rate, entropy and the like stay each learner's own: they do not change
the work of an iteration). Both read the task's "actor" and "critic" observation groups and
normalize observations. Neither randomizes the initial episode lengths (mjlab's train.py does,
`init_at_random_ep_len=True`): both start every env at step 0, so the two see episode ends at the
same rate. The phase split differs slightly: ours reports rollout and update (advantages apart),
rsl_rl collection (returns included) and learning.

Logging: ours writes its TensorBoard scalars once per iteration. mjlab's runner runs with
log_dir=None by default: no writer, no per-step episode bookkeeping (which reads finished episodes
back to the host every step) and no checkpoints; --mjlab-logging runs it with a TensorBoard writer
in a temporary directory, as mjlab's train.py does with --agent.logger tensorboard (its model_0.pt,
and the ONNX export of runners that export, fall in the warm-up). rsl_rl's per-step NaN check of the
observations stays on, as mjlab's config leaves it. So logging favours mjlab's runner, if anything.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib.util
import json
import shlex
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Run as a file, this folder would come first on sys.path and `import mjlab` would find this module.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
if str(ROOT) not in sys.path:  # runnable as `python -m tests.benchmarks.mjlab` or as a file
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from common.envs.mjlab_adapter import FINAL_OBS_MODES, mjlab_version  # noqa: E402
from tests.benchmarks import bench  # noqa: E402
from tests.benchmarks.rsl_rl import rsl_rl_version, time_runner  # noqa: E402
from tests.helpers import load_script  # noqa: E402

RESULT_MARKER = "BENCH_MJLAB_RESULT "


def require_mjlab() -> None:
    """Stop with the cause and the install line when mjlab or rsl_rl cannot be imported."""
    for module, package, hint in (
        ("mjlab", "mjlab", "pip install 'mjlab==1.6.*' -c torch-pin.txt (see the README: pin your torch)"),
        ("rsl_rl", "rsl-rl-lib", "it comes with mjlab; pip install --no-deps rsl-rl-lib"),
    ):
        if importlib.util.find_spec(module) is None:
            raise SystemExit(f"error: tests.benchmarks.mjlab needs {package}, which is not installed; {hint}")


def task_sizes(task: str) -> dict:
    """The batch and network settings of the task's registered rsl_rl config."""
    from mjlab.tasks.registry import load_rl_cfg

    cfg = load_rl_cfg(task)
    return {
        "num_steps": int(cfg.num_steps_per_env),
        "update_epochs": int(cfg.algorithm.num_learning_epochs),
        "num_minibatches": int(cfg.algorithm.num_mini_batches),
        "hidden_sizes": [int(h) for h in cfg.actor.hidden_dims],
        "critic_hidden_sizes": [int(h) for h in cfg.critic.hidden_dims],
        "activation": str(cfg.actor.activation),
        "clip_actions": cfg.clip_actions,
    }


def ours_flags(sizes: dict, final_obs: str) -> tuple[list[str], list[str]]:
    """(flags for algos/ppo.py with the task's sizes, notes on what could not be matched)."""
    flags = [
        "--num-steps",
        str(sizes["num_steps"]),
        "--update-epochs",
        str(sizes["update_epochs"]),
        "--num-minibatches",
        str(sizes["num_minibatches"]),
        "--hidden-sizes",
        *map(str, sizes["hidden_sizes"]),
        "--env-kwargs",
        json.dumps({"final_obs": final_obs}),
        "--num-eval-envs",
        "1",
    ]
    notes = []
    if sizes["activation"] in bench.ppo_activations():
        flags += ["--activation", sizes["activation"]]
    else:
        notes.append(f"algos/ppo.py has no activation {sizes['activation']!r}: ours runs with its default")
    if sizes["critic_hidden_sizes"] != sizes["hidden_sizes"]:
        notes.append(
            f"the task's critic has hidden sizes {sizes['critic_hidden_sizes']}; ours uses the actor's for both"
        )
    return flags, notes


# ----------------------------------------------------------------------------------------------
# env only (in this process)
# ----------------------------------------------------------------------------------------------
def env_only_raw(task: str, num_envs: int, device: torch.device, steps: int, warmup: int, repeats: int) -> dict:
    from mjlab.envs import ManagerBasedRlEnv
    from mjlab.tasks.registry import load_env_cfg

    cfg = load_env_cfg(task)
    cfg.scene.num_envs, cfg.seed = num_envs, 0
    with contextlib.redirect_stdout(sys.stderr):  # mjlab's tables of managers: not on the report's stdout
        env = ManagerBasedRlEnv(cfg, device=str(device))
        env.reset()
    try:
        act_dim = int(env.single_action_space.shape[0])
        return bench.time_env(env.step, num_envs, act_dim, device, steps, warmup, repeats)
    finally:
        env.close()


def env_only_adapter(
    task: str, num_envs: int, device: torch.device, final_obs: str, steps: int, warmup: int, repeats: int
) -> dict:
    from common.envs import make_env

    with contextlib.redirect_stdout(sys.stderr):
        env = make_env(f"mjlab:{task}", num_envs, device=device, seed=0, final_obs=final_obs)
        env.reset()
    try:
        return bench.time_env(env.step, num_envs, int(env.single_action_space.shape[0]), device, steps, warmup, repeats)
    finally:
        env.close()


def release(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------
# mjlab's PPO (worker subprocess)
# ----------------------------------------------------------------------------------------------
def run_mjlab_worker(cfg: dict) -> dict:
    """Train mjlab's runner for warmup + iterations iterations in this process; steady-state figures."""
    require_mjlab()
    if cfg.get("threads"):
        torch.set_num_threads(cfg["threads"])
    import mjlab.tasks  # noqa: F401  (registers the tasks)
    from mjlab.envs import ManagerBasedRlEnv
    from mjlab.rl import MjlabOnPolicyRunner, RslRlVecEnvWrapper
    from mjlab.tasks.registry import load_env_cfg, load_rl_cfg, load_runner_cls

    task, device = cfg["task"], torch.device(cfg["device"])
    env_cfg = load_env_cfg(task)
    env_cfg.scene.num_envs, env_cfg.seed = cfg["num_envs"], cfg["seed"]
    agent_cfg = load_rl_cfg(task)
    agent_cfg.seed = cfg["seed"]
    agent_cfg.logger = "tensorboard"  # only used with --mjlab-logging (never wandb: no network here)
    agent_cfg.upload_model = False
    env = RslRlVecEnvWrapper(ManagerBasedRlEnv(env_cfg, device=str(device)), clip_actions=agent_cfg.clip_actions)
    runner_cls = load_runner_cls(task) or MjlabOnPolicyRunner
    with tempfile.TemporaryDirectory(prefix="bench-mjlab-") as log_dir:
        runner = runner_cls(env, dataclasses.asdict(agent_cfg), log_dir if cfg["logging"] else None, str(device))
        steps_per_iteration = cfg["num_envs"] * int(agent_cfg.num_steps_per_env)
        figures = time_runner(
            runner, device, cfg["warmup"], cfg["iterations"], steps_per_iteration, init_at_random_ep_len=False
        )
    env.close()
    return {"status": "ok", "runner": f"{runner_cls.__module__}.{runner_cls.__name__}", **figures}


def run_mjlab_ppo(cfg: dict, timeout: float, threads: int | None) -> dict:
    return bench.run_worker(
        "tests.benchmarks.mjlab", cfg, RESULT_MARKER, {"learner": "mjlab PPO (rsl_rl)"}, timeout, threads
    )


# ----------------------------------------------------------------------------------------------
# the comparison
# ----------------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="Mjlab-Velocity-Flat-Unitree-G1", help="a registered mjlab task")
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--device", default=None, help="cuda, cuda:K or cpu (default: cuda when there is one)")
    parser.add_argument(
        "--final-obs",
        nargs="+",
        default=list(FINAL_OBS_MODES),
        choices=FINAL_OBS_MODES,
        help="the adapter's final_obs modes to measure (env only and algos/ppo.py)",
    )
    parser.add_argument("--iterations", type=int, default=10, help="timed training iterations after the warm-up")
    parser.add_argument("--warmup-iterations", type=int, default=2, help="training iterations left out of the figures")
    parser.add_argument("--env-steps", type=int, default=100, help="timed steps of each env-only window")
    parser.add_argument("--env-warmup-steps", type=int, default=20, help="untimed steps before the env-only windows")
    parser.add_argument("--repeats", type=int, default=3, help="env-only windows (median reported)")
    parser.add_argument(
        "--mjlab-logging",
        action="store_true",
        help="run mjlab's runner with its TensorBoard writer and per-step episode bookkeeping",
    )
    parser.add_argument("--skip-env-only", action="store_true", help="only the training runs")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads, here and in the training runs")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds a training run may take before it is killed"
    )
    parser.add_argument(
        "--json", metavar="PATH", default=None, help="write the figures as JSON ('-': stdout, instead of the table)"
    )
    parser.add_argument("--worker", metavar="CONFIG", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is None and (args.iterations < 1 or args.warmup_iterations < 1 or args.repeats < 1):
        parser.error("--iterations, --warmup-iterations and --repeats must be >= 1")
    return args


def run_benchmark(args: argparse.Namespace, argv: list[str]) -> dict:
    require_mjlab()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch sees no CUDA device; use --device cpu")
    import mjlab.tasks  # noqa: F401  (registers the tasks)
    from mjlab.tasks.registry import list_tasks

    if args.task not in list_tasks():
        raise SystemExit(f"error: unknown mjlab task {args.task!r}; registered tasks: {', '.join(list_tasks())}")
    sizes = task_sizes(args.task)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    report = {
        "benchmark": "tests.benchmarks.mjlab",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": bench.machine_info(device),
        "load_average": {"start": bench.load_average(), "end": None},
        "config": {
            "task": args.task,
            "num_envs": args.num_envs,
            "device": str(device),
            "final_obs": args.final_obs,
            "iterations": args.iterations,
            "warmup_iterations": args.warmup_iterations,
            "env_steps": args.env_steps,
            "repeats": args.repeats,
            "mjlab_logging": args.mjlab_logging,
            "threads": args.threads,
            "seed": args.seed,
            "sizes": sizes,
            "mjlab_version": mjlab_version(),
            "rsl_rl_version": rsl_rl_version(),
        },
        "commands": {"benchmark": shlex.join(["python", "-m", "tests.benchmarks.mjlab", *argv]), "runs": []},
        "env_only": [],
        "training": [],
        "notes": bench.overload_notes(),
    }

    if not args.skip_env_only:
        timing = (args.env_steps, args.env_warmup_steps, args.repeats)
        log(f"env only: mjlab {args.task} x {args.num_envs}")
        report["env_only"].append(
            {"learner": "env only: mjlab (its auto-reset)", **env_only_raw(args.task, args.num_envs, device, *timing)}
        )
        release(device)
        for mode in args.final_obs:
            log(f"env only: the mjlab: adapter, final_obs={mode}")
            report["env_only"].append(
                {
                    "learner": f"env only: adapter, final_obs={mode}",
                    **env_only_adapter(args.task, args.num_envs, device, mode, *timing),
                }
            )
            release(device)

    ppo_args = load_script("ppo").Args
    for mode in args.final_obs:
        flags, notes = ours_flags(sizes, mode)
        report["notes"] += [n for n in notes if n not in report["notes"]]
        log(f"algos/ppo.py, final_obs={mode}: {args.warmup_iterations} + {args.iterations} iterations")
        r = bench.run_training(
            "ppo",
            ppo_args,
            f"mjlab:{args.task}",
            args.num_envs,
            str(device),
            "eager",
            args.iterations,
            args.warmup_iterations,
            extra_args=flags,
            threads=args.threads,
            timeout=args.timeout,
            seed=args.seed,
        )
        r["learner"] = f"algos/ppo.py, final_obs={mode}"
        report["training"].append(r)
        report["commands"]["runs"].append(r["command"])
    log(f"mjlab's PPO: {args.warmup_iterations} + {args.iterations} iterations")
    worker_cfg = {
        "task": args.task,
        "num_envs": args.num_envs,
        "device": str(device),
        "seed": args.seed,
        "iterations": args.iterations,
        "warmup": args.warmup_iterations,
        "logging": args.mjlab_logging,
        "threads": args.threads,
    }
    theirs = run_mjlab_ppo(worker_cfg, args.timeout, args.threads)
    report["training"].append(theirs)
    report["commands"]["runs"].append(theirs["command"])
    for r in report["training"]:
        if r.get("status") != "ok":
            log(f"  {r['learner']} failed: {r.get('error')}")
        r["ratio_to_mjlab_ppo"] = bench.ratio(r.get("sps"), theirs.get("sps")) if theirs.get("status") == "ok" else None
    report["load_average"]["end"] = bench.load_average()
    return report


def markdown_table(report: dict) -> list[str]:
    """| learner | SPS | rollout/collection s | update s | x mjlab PPO | (per iteration: medians after the warm-up)."""
    rows = ["| learner | SPS | rollout/collection s | update s | x mjlab PPO |", "|---|---|---|---|---|"]
    for r in report["env_only"]:
        rows.append(f"| {r['learner']} | {bench.fmt(r['sps'])} | - | - | - |")
    for r in report["training"]:
        if r.get("status") != "ok":
            rows.append(f"| {r['learner']} | failed: {r.get('error')} | - | - | - |")
            continue
        rows.append(
            f"| {r['learner']} | {bench.fmt(r.get('sps'))} | {bench.fmt(r.get('rollout_seconds'), '.3f')} | "
            f"{bench.fmt(r.get('update_seconds'), '.3f')} | {bench.fmt_ratio(r.get('ratio_to_mjlab_ppo'))} |"
        )
    return rows


def print_report(report: dict) -> None:
    cfg, m, s = report["config"], report["machine"], report["config"]["sizes"]
    print(
        f"mjlab:{cfg['task']} x {cfg['num_envs']} envs on {cfg['device']} ({bench.machine_label(m)}, torch "
        f"{m['torch']}, "
        f"{m['torch_threads']} threads); mjlab {cfg['mjlab_version']}, rsl-rl-lib {cfg['rsl_rl_version']}; "
        f"{s['num_steps']} steps x {s['update_epochs']} epochs x {s['num_minibatches']} minibatches, hidden "
        f"{s['hidden_sizes']} {s['activation']}; {cfg['warmup_iterations']} + {cfg['iterations']} iterations; "
        f"load average {report['load_average']['start']} -> {report['load_average']['end']}"
    )
    print()
    print("\n".join(markdown_table(report)))
    print()
    print(
        "SPS: env steps per second; seconds: per iteration, medians after the warm-up; env-only rows: "
        f"{cfg['repeats']} windows of {cfg['env_steps']} steps, median"
    )
    for note in report["notes"]:
        print(f"note: {note}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker is not None:
        result = run_mjlab_worker(json.loads(args.worker))
        print(RESULT_MARKER + json.dumps(result), flush=True)
        return 0
    report = run_benchmark(args, argv)
    if args.json != "-":
        print_report(report)
    if args.json is not None:
        bench.write_json(report, args.json)
    return 1 if any(r.get("status") != "ok" for r in report["training"]) else 0


if __name__ == "__main__":
    sys.exit(main())
