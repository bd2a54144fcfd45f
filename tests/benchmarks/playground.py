"""algos/ppo.py on a MuJoCo Playground task next to Playground's own rsl_rl path, and the env alone, in one invocation
on one device.

    python -m tests.benchmarks.playground [--task Go1JoystickFlatTerrain] [--num-envs 4096] [--device cuda]
        [--impl warp|jax] [--full-reset] [--rl-config-of TASK] [--iterations 10] [--warmup-iterations 2]
        [--env-steps 100] [--repeats 3] [--no-brax] [--brax-num-envs N] [--brax-overrides JSON] [--no-td3]
        [--td3-num-envs N] [--td3-args "FLAGS"] [--threads T] [--out DIR] [--json PATH | --json -]

    bash tests/benchmarks/playground_gpu.sh [DIR]    # the GPU comparison: Go1, the three learners, under ten minutes

    python -m tests.benchmarks.playground --device cpu --task CartpoleBalance --impl jax --num-envs 64 --iterations 3

A benchmark, not a test: nothing here asserts a speed. It needs MuJoCo Playground (`pip install -e ".[playground]"`)
and, for its last row, rsl-rl-lib 4 or newer (`pip install --no-deps rsl-rl-lib GitPython`); it stops with the cause
when either is missing. Rows of the table:

1. env only, Playground's torch wrapper: `RSLRLBraxWrapper.step` (brax's training wrappers: episode counter and
   auto-reset back to each env's first state, DLPack both ways, each of the task's metrics read to the host at every
   step), uniform random actions in [-1, 1] made by torch on the device;
2. env only, the `playground:` adapter: the same task, config, envs and actions (`full_reset` as --full-reset says;
   off by default, as the wrapper restarts); its step also keeps each finished env's last observation;
3. algos/ppo.py: the script trained for W + K iterations in a subprocess (bench.run_training: SPS from the wall-clock
   times of its TensorBoard events after the warm-up; rollout and update seconds per iteration, the medians of its
   `charts/rollout_seconds` / `charts/update_seconds`);
4. Playground's rsl_rl path: what Playground's `learning/train_rsl_rl.py` builds (the task loaded with its default
   config, `RSLRLBraxWrapper` with the task's domain randomizer, rsl_rl's `OnPolicyRunner` with the task's
   `rsl_rl_config`) trained for W + K iterations in a subprocess; SPS from the wall-clock times of rsl_rl's
   per-iteration log call after the warm-up. Playground 0.2.0's configs are in rsl_rl 3's layout (one `policy`
   ActorCritic); rsl_rl 4 and 5 take an `actor` and a `critic` model instead, so the worker writes the same fields in
   that layout (rsl_rl_5_config): hidden sizes, activation, the scalar std's initial value, empirical normalization;
5. brax's own PPO, as Playground's `learning/train_jax_ppo.py` builds it: `brax.training.agents.ppo.train` with the
   task's `brax_ppo_config` (its networks, `network_factory`), `wrap_for_brax_training` and the task's randomizer (as
   for row 4; train_jax_ppo.py's --domain_randomization), in a subprocess; W + K training steps of brax's (each one
   batch of batch_size x num_minibatches x unroll_length env steps and its update), one per epoch, no evaluation
   (run_evals=False) and no host resets between them (num_resets_per_eval=0); SPS the median of brax's own
   `training/sps` of the epochs after the warm-up. brax fuses collection and update in one compiled step: no split.
   Its envs are the config's (--brax-num-envs sets them; --brax-overrides JSON any other field, e.g. a CPU's sizes).
   --no-brax leaves the row out;
6. algos/td3.py with its `task` set, FastTD3's published Playground settings (common/settings.py), at FastTD3's 1,024
   envs (--td3-num-envs), W + K iterations as row 3; with the hours its SPS needs for FastTD3's budget of the task (its
   `total_timesteps`, counted in iterations). FastTD3 reports its Playground runs as return against wall-clock curves
   (arXiv 2505.22642), not a table: the hours are what to set beside them. --no-td3 leaves the row out.

Matched: both learners train with the task's rsl_rl config. A locomotion or manipulation task has its own, which ppo.py
takes as its `task` set (the same field-by-field translation as for mjlab, with rsl_rl's update); a DM Control task
has none (Playground trains those with brax), so both take the config of --rl-config-of (default
Go1JoystickFlatTerrain's), ppo.py through its sizes: --num-steps, --update-epochs, --num-minibatches, --hidden-sizes and
--activation. Both start every env at step 0 (`init_at_random_ep_len=False`, as Playground's script does). rsl_rl's
runner runs with log_dir=None: no writer and no per-step episode bookkeeping; ours writes its TensorBoard scalars at
its log interval. So logging favours rsl_rl's runner, if anything.

The locomotion and manipulation tasks need mujoco_menagerie (docs/playground.md says where Playground looks for it): on
a machine without internet, copy it there first."""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # runnable as `python -m tests.benchmarks.playground` or as a file
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tests.benchmarks import bench  # noqa: E402
from tests.benchmarks.rsl_rl import rsl_rl_version, time_runner  # noqa: E402
from tests.helpers import load_script  # noqa: E402

RESULT_MARKER = "BENCH_PLAYGROUND_RESULT "
BORROWED_CONFIG = "Go1JoystickFlatTerrain"  # the rsl_rl config a DM Control task trains with here (it has none)


def require(rsl_rl: bool) -> None:
    """Stop with the cause and the install line when Playground (or, for its rsl_rl path, rsl_rl) is missing."""
    if importlib.util.find_spec("mujoco_playground") is None:
        raise SystemExit('error: tests.benchmarks.playground needs MuJoCo Playground; pip install -e ".[playground]"')
    if rsl_rl:
        version = rsl_rl_version()
        if importlib.util.find_spec("rsl_rl") is None or version is None:
            raise SystemExit(
                "error: tests.benchmarks.playground needs rsl-rl-lib for Playground's rsl_rl path; "
                "pip install --no-deps rsl-rl-lib GitPython"
            )
        if int(version.split(".")[0]) < 4:
            raise SystemExit(
                f"error: rsl-rl-lib {version} found; this benchmark writes rsl_rl 4/5's actor/critic layout"
            )


def runner_config(task: str, borrowed: str) -> tuple[dict, str]:
    """(the rsl_rl config both learners train with, as Playground ships it; the task it belongs to)."""
    from common.envs.playground_adapter import configure_jax_memory

    configure_jax_memory()
    from mujoco_playground import registry
    from mujoco_playground.config import locomotion_params, manipulation_params

    for envs, params in (
        (registry.locomotion.ALL_ENVS, locomotion_params),
        (registry.manipulation.ALL_ENVS, manipulation_params),
    ):
        if task in envs:
            return params.rsl_rl_config(task).to_dict(), task
    return locomotion_params.rsl_rl_config(borrowed).to_dict(), borrowed


def config_sizes(rl_cfg: dict) -> dict:
    """The batch and network settings of an rsl_rl config, in rsl_rl 3's layout (Playground's) or 4/5's."""
    algorithm = rl_cfg["algorithm"]
    if "policy" in rl_cfg:
        policy = rl_cfg["policy"]
        actor, critic, activation = policy["actor_hidden_dims"], policy["critic_hidden_dims"], policy["activation"]
    else:
        actor, critic = rl_cfg["actor"]["hidden_dims"], rl_cfg["critic"]["hidden_dims"]
        activation = rl_cfg["actor"]["activation"]
    return {
        "num_steps": int(rl_cfg["num_steps_per_env"]),
        "update_epochs": int(algorithm["num_learning_epochs"]),
        "num_minibatches": int(algorithm["num_mini_batches"]),
        "hidden_sizes": [int(h) for h in actor],
        "critic_hidden_sizes": [int(h) for h in critic],
        "activation": str(activation),
    }


def rsl_rl_5_config(rl_cfg: dict, asymmetric: bool, seed: int) -> dict:
    """The runner config of Playground's train_rsl_rl.py (obs groups, seed) in rsl_rl 4/5's layout: its `policy`
    ActorCritic written as an `actor` and a `critic` model of the same fields."""
    cfg = {k: v for k, v in rl_cfg.items() if k not in ("policy", "runner_class_name", "resume", "load_run")}
    cfg["seed"] = seed
    cfg["obs_groups"] = {"actor": ["state"], "critic": ["privileged_state" if asymmetric else "state"]}
    algorithm = dict(rl_cfg["algorithm"])
    if algorithm.get("class_name") == "PPO":
        algorithm["class_name"] = "rsl_rl.algorithms:PPO"
    cfg["algorithm"] = algorithm
    if "policy" in rl_cfg:
        policy, normalize = rl_cfg["policy"], bool(rl_cfg.get("empirical_normalization", False))
        model = {
            "class_name": "rsl_rl.models:MLPModel",
            "activation": policy["activation"],
            "obs_normalization": normalize,
        }
        distribution = {
            "class_name": "rsl_rl.modules.distribution:GaussianDistribution",
            "init_std": float(policy.get("init_noise_std", 1.0)),
            "std_type": "scalar",  # rsl_rl 3's ActorCritic: the std itself is the parameter
        }
        cfg["actor"] = {**model, "hidden_dims": list(policy["actor_hidden_dims"]), "distribution_cfg": distribution}
        cfg["critic"] = {**model, "hidden_dims": list(policy["critic_hidden_dims"])}
        cfg.pop("empirical_normalization", None)
    return cfg


def ours_flags(sizes: dict, own_config: bool, env_kwargs: dict) -> tuple[list[str], list[str]]:
    """(flags for algos/ppo.py: the task set where the task has its own rsl_rl config, else the borrowed config's sizes;
    notes on what could not be matched)."""
    flags = ["--settings", "task" if own_config else "builtin", "--env-kwargs", json.dumps(env_kwargs)]
    flags += ["--num-steps", str(sizes["num_steps"]), "--update-epochs", str(sizes["update_epochs"])]
    flags += ["--num-minibatches", str(sizes["num_minibatches"]), "--num-eval-envs", "1"]
    notes = []
    if not own_config:
        flags += ["--hidden-sizes", *map(str, sizes["hidden_sizes"])]
        if sizes["activation"] in bench.ppo_activations():
            flags += ["--activation", sizes["activation"]]
        else:
            notes.append(f"algos/ppo.py has no activation {sizes['activation']!r}: ours runs with its default")
        if sizes["critic_hidden_sizes"] != sizes["hidden_sizes"]:
            notes.append(f"the config's critic has hidden sizes {sizes['critic_hidden_sizes']}; ours the actor's")
    return flags, notes


def wrapper_env(task: str, num_envs: int, device: torch.device, seed: int, impl: str | None):
    """Playground's torch wrapper as its train_rsl_rl.py builds it: the task's default config, its randomizer."""
    from common.envs.playground_adapter import configure_jax_memory

    configure_jax_memory()
    from mujoco_playground import registry
    from mujoco_playground._src.wrapper_torch import RSLRLBraxWrapper

    config = registry.get_default_config(task)
    if impl is not None:
        config.impl = impl
    env = registry.load(task, config=config)
    rank = (device.index or 0) if device.type == "cuda" else None
    wrapped = RSLRLBraxWrapper(
        env,
        num_envs,
        seed,
        config.episode_length,
        config.get("action_repeat", 1),
        randomization_fn=registry.get_domain_randomizer(task),
        device_rank=rank,
    )
    return wrapped, isinstance(env.observation_size, dict)


def env_only(args, device: torch.device) -> list[dict]:
    """Rows 1 and 2: the wrapper's step and the adapter's, the same actions, in this process."""
    import contextlib

    from common.envs import make_env

    timing = (args.env_steps, args.env_warmup_steps, args.repeats)
    with contextlib.redirect_stdout(sys.stderr):  # the wrapper's prints: not on the report's stdout
        theirs, _ = wrapper_env(args.task, args.num_envs, device, args.seed, args.impl)
        theirs.reset()
    act_dim = int(theirs.num_actions)
    rows = [
        {
            "learner": "env only: RSLRLBraxWrapper",
            **bench.time_env(theirs.step, args.num_envs, act_dim, device, *timing),
        }
    ]
    kwargs = {"full_reset": args.full_reset, **({} if args.impl is None else {"impl": args.impl})}
    ours = make_env(f"playground:{args.task}", args.num_envs, device, seed=args.seed, **kwargs)
    ours.reset(seed=args.seed)
    learner = f"env only: adapter, full_reset={args.full_reset}"
    rows.append({"learner": learner, **bench.time_env(ours.step, args.num_envs, act_dim, device, *timing)})
    ours.close()
    return rows


def brax_ppo_config(task: str, impl: str | None):
    """The task's brax PPO config as Playground's train_jax_ppo.py reads it (locomotion, manipulation, DM Control)."""
    from mujoco_playground import registry
    from mujoco_playground.config import dm_control_suite_params, locomotion_params, manipulation_params

    for envs, params in (
        (registry.locomotion.ALL_ENVS, locomotion_params),
        (registry.manipulation.ALL_ENVS, manipulation_params),
        (registry.dm_control_suite.ALL_ENVS, dm_control_suite_params),
    ):
        if task in envs:
            return params.brax_ppo_config(task, impl)
    raise SystemExit(f"error: Playground has no brax PPO config for {task}")


def replicate_on_one_device() -> None:
    """brax 0.14's ppo.train replicates its state with jax.device_put_replicated, which JAX 0.10 removed (it raises
    AttributeError): a stand-in for the one device the worker trains on (max_devices_per_host=1), the leading axis
    pmap maps over. Nothing where JAX still has it."""
    import jax
    import jax.numpy as jnp

    try:
        jax.device_put_replicated  # noqa: B018 (the deprecation raises on access)
        return
    except AttributeError:
        pass

    def device_put_replicated(x, devices):
        if len(devices) != 1:
            raise NotImplementedError("the stand-in replicates on one device (max_devices_per_host=1)")
        return jax.device_put(jax.tree.map(lambda a: jnp.expand_dims(jnp.asarray(a), 0), x), devices[0])

    jax.device_put_replicated = device_put_replicated


def run_brax_worker(cfg: dict) -> dict:
    """Row 5: brax's ppo.train as train_jax_ppo.py calls it, W + K training steps (one per epoch, no evaluation)."""
    import functools
    import os
    import statistics

    device = cfg["device"]
    if device == "cpu":  # JAX on the device the other rows use: its CPU, or the GPU of that index alone
        os.environ["JAX_PLATFORMS"] = "cpu"
    elif ":" in device:
        os.environ["CUDA_VISIBLE_DEVICES"] = device.split(":")[1]
    from common.envs.playground_adapter import configure_jax_memory

    configure_jax_memory()  # brax's update shares the GPU with nothing here, but as the other rows run
    from brax.training.agents.ppo import networks as ppo_networks
    from brax.training.agents.ppo import train as ppo
    from mujoco_playground import registry, wrapper

    replicate_on_one_device()

    task, impl = cfg["task"], cfg["impl"]
    params = brax_ppo_config(task, impl).to_dict()
    params.update(cfg.get("overrides") or {})
    if cfg.get("num_envs"):
        params["num_envs"] = cfg["num_envs"]
    network = params.pop("network_factory", {})
    params.pop("num_eval_envs", None)
    per_step = params["batch_size"] * params["num_minibatches"] * params["unroll_length"] * params["action_repeat"]
    steps = cfg["warmup"] + cfg["iterations"]
    params.update(num_timesteps=steps * per_step, num_evals=steps + 1, num_resets_per_eval=0)
    env_cfg = registry.get_default_config(task)
    if impl is not None:
        env_cfg.impl = impl
    env = registry.load(task, config=env_cfg)
    epochs = []
    ppo.train(
        environment=env,
        **params,
        network_factory=functools.partial(ppo_networks.make_ppo_networks, **network),
        seed=cfg["seed"],
        wrap_env_fn=wrapper.wrap_for_brax_training,
        randomization_fn=registry.get_domain_randomizer(task),
        max_devices_per_host=1,
        run_evals=False,
        progress_fn=lambda step, metrics: epochs.append(float(metrics["training/sps"])),
    )
    timed = epochs[cfg["warmup"] :]
    sps = statistics.median(timed)
    return {
        "status": "ok",
        "sps": sps,
        "iteration_seconds": per_step / sps,
        "steps_per_iteration": per_step,
        "num_envs": params["num_envs"],
        "brax_config": {k: v for k, v in params.items() if k not in ("num_timesteps", "num_evals")},
        "network_factory": network,
        "iterations_timed": len(timed),
    }


def run_playground_worker(cfg: dict) -> dict:
    """Row 4: Playground's rsl_rl path trained for warmup + iterations iterations in this process."""
    require(rsl_rl=True)
    if cfg.get("threads"):
        torch.set_num_threads(cfg["threads"])
    from rsl_rl.runners import OnPolicyRunner

    device = torch.device(cfg["device"])
    env, asymmetric = wrapper_env(cfg["task"], cfg["num_envs"], device, cfg["seed"], cfg["impl"])
    # rsl_rl 4/5's runner reads two attributes of its VecEnv that Playground 0.2.0's wrapper (written for rsl_rl 3)
    # sets only on a GPU (device) or not at all (cfg); nothing of its step changes
    env.cfg = getattr(env, "cfg", {})
    env.device = getattr(env, "device", str(device))
    rl_cfg, _ = runner_config(cfg["task"], cfg["rl_config_of"])
    runner = OnPolicyRunner(env, rsl_rl_5_config(rl_cfg, asymmetric, cfg["seed"]), None, str(device))
    steps_per_iteration = cfg["num_envs"] * int(rl_cfg["num_steps_per_env"])
    figures = time_runner(
        runner, device, cfg["warmup"], cfg["iterations"], steps_per_iteration, init_at_random_ep_len=False
    )
    return {"status": "ok", **figures}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="Go1JoystickFlatTerrain", help="a task of mujoco_playground.registry")
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--device", default=None, help="cuda, cuda:K or cpu (default: cuda when there is one)")
    parser.add_argument("--impl", default=None, choices=("warp", "jax"), help="the backend (default: the task's)")
    parser.add_argument("--full-reset", action="store_true", help="the adapter restarts from fresh resets")
    parser.add_argument(
        "--rl-config-of", default=BORROWED_CONFIG, help="whose rsl_rl config a task without one trains with"
    )
    parser.add_argument("--iterations", type=int, default=10, help="timed training iterations after the warm-up")
    parser.add_argument("--warmup-iterations", type=int, default=2, help="training iterations left out of the figures")
    parser.add_argument("--env-steps", type=int, default=100, help="timed steps of each env-only window")
    parser.add_argument("--env-warmup-steps", type=int, default=20, help="untimed steps before the env-only windows")
    parser.add_argument("--repeats", type=int, default=3, help="env-only windows (median reported)")
    parser.add_argument("--skip-env-only", action="store_true", help="only the training runs")
    parser.add_argument("--brax", action=argparse.BooleanOptionalAction, default=True, help="brax's own PPO row")
    parser.add_argument("--brax-num-envs", type=int, default=None, help="brax's envs (default: its config's)")
    parser.add_argument(
        "--brax-overrides", default="{}", help="JSON object of brax PPO config fields (e.g. a CPU's batch sizes)"
    )
    parser.add_argument("--td3", action=argparse.BooleanOptionalAction, default=True, help="the td3.py row")
    parser.add_argument("--td3-num-envs", type=int, default=None, help="td3.py's envs (default: FastTD3's, 1,024)")
    parser.add_argument("--td3-args", default="", help="more flags for td3.py (e.g. a smaller --batch-size on a CPU)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads, here and in the training runs")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds a training run may take")
    parser.add_argument("--json", metavar="PATH", default=None, help="write the figures as JSON ('-': stdout only)")
    parser.add_argument("--out", metavar="DIR", default=None, help="write report.md and playground.json into DIR")
    parser.add_argument("--worker", metavar="CONFIG", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is None and (args.iterations < 1 or args.warmup_iterations < 1 or args.repeats < 1):
        parser.error("--iterations, --warmup-iterations and --repeats must be >= 1")
    return args


def run_benchmark(args: argparse.Namespace, argv: list[str]) -> dict:
    require(rsl_rl=True)
    from common.envs.playground_adapter import configure_jax_memory

    configure_jax_memory()  # before anything imports JAX
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch sees no CUDA device; use --device cpu")
    from importlib import metadata

    from mujoco_playground import registry

    if args.task not in registry.ALL_ENVS:
        raise SystemExit(f"error: unknown Playground task {args.task!r}; its tasks: {', '.join(registry.ALL_ENVS)}")
    rl_cfg, config_of = runner_config(args.task, args.rl_config_of)
    sizes = config_sizes(rl_cfg)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    report = {
        "benchmark": "tests.benchmarks.playground",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": bench.machine_info(device),
        "load_average": {"start": bench.load_average(), "end": None},
        "config": {
            "task": args.task,
            "num_envs": args.num_envs,
            "device": str(device),
            "impl": args.impl,
            "full_reset": args.full_reset,
            "rl_config_of": config_of,
            "iterations": args.iterations,
            "warmup_iterations": args.warmup_iterations,
            "env_steps": args.env_steps,
            "repeats": args.repeats,
            "threads": args.threads,
            "seed": args.seed,
            "sizes": sizes,
            "playground_version": metadata.version("playground"),
            "jax_version": metadata.version("jax"),
            "rsl_rl_version": rsl_rl_version(),
        },
        "commands": {"benchmark": shlex.join(["python", "-m", "tests.benchmarks.playground", *argv]), "runs": []},
        "env_only": [],
        "training": [],
        "notes": bench.overload_notes(),
    }
    if config_of != args.task:
        report["notes"].append(f"{args.task} has no rsl_rl config in Playground: both learners take {config_of}'s")
    if not args.skip_env_only:
        log(f"env only: RSLRLBraxWrapper and the playground: adapter, {args.task} x {args.num_envs}")
        report["env_only"] = env_only(args, device)

    env_kwargs = {"full_reset": args.full_reset, **({} if args.impl is None else {"impl": args.impl})}
    flags, notes = ours_flags(sizes, config_of == args.task, env_kwargs)
    report["notes"] += notes
    log(f"algos/ppo.py: {args.warmup_iterations} + {args.iterations} iterations")
    ours = bench.run_training(
        "ppo",
        load_script("ppo").Args,
        f"playground:{args.task}",
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
    ours["learner"] = "algos/ppo.py"
    log(f"Playground's rsl_rl path: {args.warmup_iterations} + {args.iterations} iterations")
    worker_cfg = {
        "task": args.task,
        "num_envs": args.num_envs,
        "device": str(device),
        "impl": args.impl,
        "rl_config_of": args.rl_config_of,
        "seed": args.seed,
        "iterations": args.iterations,
        "warmup": args.warmup_iterations,
        "threads": args.threads,
    }
    record = {"learner": "Playground's rsl_rl path (RSLRLBraxWrapper + OnPolicyRunner)"}
    theirs = bench.run_worker(
        "tests.benchmarks.playground", worker_cfg, RESULT_MARKER, record, args.timeout, args.threads
    )
    report["training"] = [ours, theirs]
    if args.brax:
        report["training"].append(brax_row(args, device, log))
    for r in report["training"]:
        ok = theirs.get("status") == "ok"
        r["ratio_to_playground_rsl_rl"] = bench.ratio(r.get("sps"), theirs.get("sps")) if ok else None
    if args.td3:
        report["training"].append(td3_row(args, device, env_kwargs, log))
    report["commands"]["runs"] = [r["command"] for r in report["training"]]
    for r in report["training"]:
        if r.get("status") != "ok":
            log(f"  {r['learner']} failed: {r.get('error')}")
    report["load_average"]["end"] = bench.load_average()
    return report


def brax_row(args, device: torch.device, log) -> dict:
    """Row 5: brax's own PPO with the task's brax PPO config, in a subprocess (run_brax_worker)."""
    log(f"brax's PPO (ppo.train, brax_ppo_config): {args.warmup_iterations} + {args.iterations} training steps")
    worker_cfg = {
        "kind": "brax",
        "task": args.task,
        "device": str(device),
        "impl": args.impl,
        "num_envs": args.brax_num_envs,
        "overrides": json.loads(args.brax_overrides),
        "seed": args.seed,
        "iterations": args.iterations,
        "warmup": args.warmup_iterations,
    }
    record = {"learner": "brax's PPO (ppo.train + wrap_for_brax_training, brax_ppo_config)"}
    return bench.run_worker(
        "tests.benchmarks.playground", worker_cfg, RESULT_MARKER, record, args.timeout, args.threads
    )


def td3_row(args, device: torch.device, env_kwargs: dict, log) -> dict:
    """Row 6: td3.py with FastTD3's settings for W + K iterations; the hours its SPS needs for FastTD3's budget."""
    from common.settings import FASTTD3_PLAYGROUND, FASTTD3_PLAYGROUND_TASKS

    fasttd3 = {**FASTTD3_PLAYGROUND, **FASTTD3_PLAYGROUND_TASKS.get(args.task, {})}
    num_envs = args.td3_num_envs or int(fasttd3["num_envs"])
    log(f"algos/td3.py, FastTD3's settings: {args.warmup_iterations} + {args.iterations} iterations")
    flags = ["--settings", "task", "--env-kwargs", json.dumps(env_kwargs), "--num-eval-envs", "1"]
    r = bench.run_training(
        "td3",
        load_script("td3").Args,
        f"playground:{args.task}",
        num_envs,
        str(device),
        "eager",
        args.iterations,
        args.warmup_iterations,
        extra_args=flags + shlex.split(args.td3_args),
        threads=args.threads,
        timeout=args.timeout,
        seed=args.seed,
    )
    r["learner"] = "algos/td3.py, FastTD3's settings"
    r["fasttd3_iterations"] = int(fasttd3["total_timesteps"])  # FastTD3 counts its budget in iterations
    if r.get("status") == "ok" and r.get("sps"):
        r["hours_to_fasttd3_budget"] = r["fasttd3_iterations"] * num_envs / r["sps"] / 3600
    return r


def markdown_table(report: dict) -> list[str]:
    """The table: per iteration, medians after the warm-up; the ratio to Playground's rsl_rl path."""
    rows = ["| learner | SPS | rollout/collection s | update s | x Playground's rsl_rl |", "|---|---|---|---|---|"]
    for r in report["env_only"]:
        rows.append(f"| {r['learner']} | {bench.fmt(r['sps'])} | - | - | - |")
    for r in report["training"]:
        if r.get("status") != "ok":
            rows.append(f"| {r['learner']} | failed: {r.get('error')} | - | - | - |")
            continue
        rows.append(
            f"| {r['learner']} | {bench.fmt(r.get('sps'))} | {bench.fmt(r.get('rollout_seconds'), '.3f')} | "
            f"{bench.fmt(r.get('update_seconds'), '.3f')} | {bench.fmt_ratio(r.get('ratio_to_playground_rsl_rl'))} |"
        )
    return rows


def print_report(report: dict) -> None:
    cfg, m, s = report["config"], report["machine"], report["config"]["sizes"]
    print(
        f"playground:{cfg['task']} x {cfg['num_envs']} envs on {cfg['device']} ({bench.machine_label(m)}, torch "
        f"{m['torch']}, {m['torch_threads']} threads); playground {cfg['playground_version']}, jax "
        f"{cfg['jax_version']}, rsl-rl-lib {cfg['rsl_rl_version']}; {cfg['rl_config_of']}'s rsl_rl config: "
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
    for r in report["training"]:
        if r.get("brax_config") is not None and r.get("status") == "ok":
            c = r["brax_config"]
            print(
                f"brax's PPO: {r['num_envs']:,} envs, {r['steps_per_iteration']:,} env steps per training step "
                f"(batch_size {c['batch_size']} x num_minibatches {c['num_minibatches']} x unroll_length "
                f"{c['unroll_length']}), {c['num_updates_per_batch']} epochs, {r['iteration_seconds']:.3f} s each "
                f"(collection and update in one compiled step); networks {r['network_factory'] or 'brax defaults'}"
            )
        if r.get("hours_to_fasttd3_budget") is not None:
            print(
                f"td3.py at FastTD3's settings: {r['hours_to_fasttd3_budget']:.2f} h for FastTD3's budget of "
                f"{r['fasttd3_iterations']:,} iterations at these SPS (FastTD3 reports its Playground runs as curves "
                "of return against wall-clock time, arXiv 2505.22642)"
            )
    for note in report["notes"]:
        print(f"note: {note}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker is not None:
        cfg = json.loads(args.worker)
        result = run_brax_worker(cfg) if cfg.get("kind") == "brax" else run_playground_worker(cfg)
        print(RESULT_MARKER + json.dumps(result), flush=True)
        return 0
    report = run_benchmark(args, argv)
    if args.json != "-":
        print_report(report)
    if args.json is not None:
        bench.write_json(report, args.json)
    if args.out is not None:  # the results of one command under one folder
        import contextlib
        import io

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        bench.write_json(report, str(out / "playground.json"))
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            print_report(report)
        (out / "report.md").write_text(f"    {report['commands']['benchmark']}\n\n{text.getvalue()}")
    return 1 if any(r.get("status") != "ok" for r in report["training"]) else 0


if __name__ == "__main__":
    sys.exit(main())
