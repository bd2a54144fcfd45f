"""algos/ppo.py next to rsl_rl's PPO on the same env, batch and networks: training SPS and their ratio.

    pip install --no-deps rsl-rl-lib && pip install GitPython   # --no-deps: keep the installed torch
    python -m tests.benchmarks.rsl_rl [--env-id Pendulum-v1] [--num-envs 4096] [--hidden-sizes 64 64]
        [--num-steps 24] [--update-epochs 5] [--num-minibatches 4] [--modes eager compile]
        [--iterations 10] [--warmup-iterations 2] [--rounds 1] [--no-obs-norm] [--json PATH | --json -]

A benchmark, not a test. Both learners run in their own subprocess, one after the other for each mode (`--rounds R`
alternates them R times and reports medians, which evens out a machine whose load drifts). The env is the same built-in
batched torch env from `make_env`; rsl_rl sees it through `RslRlVecEnv`, a small adapter to its VecEnv interface.

What is the same on both sides (taken from algos/ppo.py's default Args, so they follow it): env, num_envs, steps per
rollout, epochs, minibatches, hidden sizes and activation of actor and critic, Adam, learning rate and the adaptive-KL
schedule, clip range, clipped value loss, value/entropy coefficients, gradient-norm clip, advantages normalized per
minibatch, a Gaussian with a state-independent log-std (a categorical over logits on discrete envs), actions clipped to
the Box bounds before the env, time-outs bootstrapped from a value, and observation normalization on for actor and
critic (or off for both with --no-obs-norm).

What differs by design and is part of what is measured: rsl_rl computes the critic value at every rollout step and
updates its normalizers at every step (actor's and critic's separately); ours computes values and V(final_obs) for the
time-out bootstrap in batched passes after the rollout and updates one normalizer once per rollout. rsl_rl bootstraps
time-outs with V(s_t), ours with V(final_obs).

Overheads removed where we could:
- rsl_rl runs with log_dir=None: no TensorBoard writer, no per-step episode bookkeeping (which
  reads finished episodes back to the host every step), no git-diff or model files, and with
  check_for_nan off (a host read of every observation batch per step);
- ours cannot turn its TensorBoard writer off: it writes ~15 scalars per log interval (every
  iteration on CPU, every 10 on CUDA) after one host sync, with its NaN check; evaluation is off (--eval-interval 0)
  and its only checkpoint is written after the timed window.
So logging favours rsl_rl, if anything.

Timing is the same for both: wall-clock time between the end of warm-up iteration W and the end of iteration W+K,
divided into the env steps in between (for ours from its TensorBoard event times, see tests/benchmarks/bench.py; for
rsl_rl from a hook on its per-iteration log call). The phase split differs: ours reports rollout and update (GAE apart);
rsl_rl reports collection and learning, where learning includes its return computation."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # runnable as `python -m tests.benchmarks.rsl_rl`
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tests.benchmarks import bench  # noqa: E402
from tests.helpers import load_script  # noqa: E402

RESULT_MARKER = "BENCH_RSL_RL_RESULT "


# ----------------------------------------------------------------------------------------------
# rsl_rl side (imported only in the worker process)
# ----------------------------------------------------------------------------------------------
def make_rsl_rl_env(env_id: str, num_envs: int, device: str, seed: int):
    """A built-in env behind rsl_rl's VecEnv interface: dones = terminated | truncated,
    extras["time_outs"] = truncated and not terminated, Box actions clipped to the bounds."""
    import gymnasium as gym
    from rsl_rl.env import VecEnv

    from common.envs import make_env

    class RslRlVecEnv(VecEnv):
        def __init__(self):
            self.env = make_env(env_id, num_envs, device=device, seed=seed)
            self.num_envs = self.env.num_envs
            self.device = self.env.device
            self.cfg = {"env_id": env_id}
            space = self.env.single_action_space
            self.discrete = isinstance(space, gym.spaces.Discrete)
            self.num_actions = 1 if self.discrete else int(space.shape[0])
            self.num_classes = int(space.n) if self.discrete else None
            self.bounds = None
            if not self.discrete and space.is_bounded():
                self.bounds = (
                    torch.as_tensor(space.low, device=self.device),
                    torch.as_tensor(space.high, device=self.device),
                )
            self.max_episode_length = self.env.max_episode_steps
            self.obs, _ = self.env.reset(seed=seed)

        @property
        def episode_length_buf(self) -> torch.Tensor:
            return self.env.episode_steps

        @episode_length_buf.setter
        def episode_length_buf(self, value: torch.Tensor) -> None:
            self.env.episode_steps = value.to(torch.int64)

        def get_observations(self):
            return self.obs

        def step(self, actions: torch.Tensor):
            if self.discrete:
                actions = actions.reshape(self.num_envs).long()
            elif self.bounds is not None:
                actions = torch.maximum(torch.minimum(actions, self.bounds[1]), self.bounds[0])
            self.obs, reward, terminated, truncated, _ = self.env.step(actions)
            return self.obs, reward, terminated | truncated, {"time_outs": truncated & ~terminated}

    return RslRlVecEnv()


def categorical_distribution_class():
    """A categorical over logits in rsl_rl's Distribution interface (rsl_rl ships Gaussian and Beta
    only). Actions travel as float [B, 1] class indices, the layout rsl_rl's storage keeps."""
    from rsl_rl.modules.distribution import Distribution
    from torch.distributions import Categorical

    class CategoricalDistribution(Distribution):
        def __init__(self, output_dim: int, num_classes: int):
            super().__init__(output_dim)
            self.num_classes = num_classes
            self._distribution: Categorical | None = None

        def update(self, mlp_output):
            self._distribution = Categorical(logits=mlp_output, validate_args=False)

        def sample(self):
            return self._distribution.sample().unsqueeze(-1).float()

        def deterministic_output(self, mlp_output):
            return mlp_output.argmax(-1, keepdim=True).float()

        @property
        def input_dim(self):
            return self.num_classes

        @property
        def mean(self):
            return self.deterministic_output(self._distribution.logits)

        @property
        def std(self):  # spread of the class index; only read for rsl_rl's "mean action std" log line
            probs = self._distribution.probs
            idx = torch.arange(self.num_classes, device=probs.device, dtype=probs.dtype)
            mean = (probs * idx).sum(-1, keepdim=True)
            return ((probs * (idx - mean) ** 2).sum(-1, keepdim=True)).sqrt()

        @property
        def entropy(self):
            return self._distribution.entropy()

        @property
        def params(self):
            return (self._distribution.logits,)

        def log_prob(self, outputs):
            return self._distribution.log_prob(outputs.squeeze(-1).long())

        def kl_divergence(self, old_params, new_params):
            return torch.distributions.kl_divergence(
                Categorical(logits=old_params[0], validate_args=False),
                Categorical(logits=new_params[0], validate_args=False),
            )

    return CategoricalDistribution


def rsl_rl_config(ours, env, cfg: dict) -> dict:
    """rsl_rl's train_cfg with algos/ppo.py's default hyperparameters and the benchmark's sizes."""
    if env.discrete:
        distribution = {"class_name": categorical_distribution_class(), "num_classes": env.num_classes}
    else:
        distribution = {
            "class_name": "rsl_rl.modules.distribution:GaussianDistribution",
            "init_std": math.exp(ours.init_log_std),
            "std_type": "log",
        }
    model = {
        "class_name": "rsl_rl.models:MLPModel",
        "hidden_dims": list(cfg["hidden_sizes"]),
        "activation": ours.activation,
        "obs_normalization": cfg["obs_norm"],
    }
    return {
        "num_steps_per_env": cfg["num_steps"],
        "save_interval": 10**9,
        "check_for_nan": False,
        "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
        "torch_compile_mode": "default" if "compile" in cfg["mode"] else None,
        "algorithm": {
            "class_name": "rsl_rl.algorithms:PPO",
            "num_learning_epochs": cfg["update_epochs"],
            "num_mini_batches": cfg["num_minibatches"],
            "clip_param": ours.clip_coef,
            "gamma": ours.gamma,
            "lam": ours.gae_lambda,
            "value_loss_coef": ours.vf_coef,
            "entropy_coef": ours.ent_coef,
            "learning_rate": ours.learning_rate,
            "max_grad_norm": ours.max_grad_norm,
            "optimizer": "adam",
            "use_clipped_value_loss": ours.clip_vloss,
            "schedule": "adaptive" if ours.lr_schedule == "adaptive" else "fixed",
            "desired_kl": ours.desired_kl,
            "normalize_advantage_per_mini_batch": ours.adv_norm == "minibatch",
            "rnd_cfg": None,
            "symmetry_cfg": None,
        },
        "actor": {**model, "distribution_cfg": distribution},
        "critic": dict(model),
    }


def rsl_rl_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("rsl-rl-lib")
    except metadata.PackageNotFoundError:
        return None


def run_rsl_rl_worker(cfg: dict) -> dict:
    """Train rsl_rl's PPO for warmup + iterations iterations in this process; steady-state figures."""
    version = rsl_rl_version()
    try:
        from rsl_rl.runners import OnPolicyRunner
    except ImportError as e:
        raise SystemExit(f"error: rsl_rl is not importable ({e}); pip install --no-deps rsl-rl-lib") from None
    if version is None or int(version.split(".")[0]) < 4:
        raise SystemExit(
            f"error: rsl-rl-lib {version} found; this adapter targets the actor/critic model API of 4.x/5.x"
        )
    if cfg.get("threads"):
        torch.set_num_threads(cfg["threads"])
    torch.manual_seed(cfg["seed"])
    ours = load_script("ppo").Args()
    env = make_rsl_rl_env(cfg["env_id"], cfg["num_envs"], cfg["device"], cfg["seed"])
    runner = OnPolicyRunner(env, rsl_rl_config(ours, env, cfg), log_dir=None, device=cfg["device"])

    steps_per_iteration = cfg["num_envs"] * cfg["num_steps"]
    figures = time_runner(runner, torch.device(cfg["device"]), cfg["warmup"], cfg["iterations"], steps_per_iteration)
    return {"status": "ok", "rsl_rl_version": version, **figures}


def time_runner(
    runner, device: torch.device, warmup: int, iterations: int, steps_per_iteration: int, **learn_kwargs
) -> dict:
    """`runner.learn` (an rsl_rl runner) for warmup + iterations iterations, each timed at its logger's
    log call (where rsl_rl reports its collection and learning seconds): steady-state figures."""
    marks = []  # (wall time, collection seconds, learning seconds) at the end of every iteration
    inner_log = runner.logger.log

    def log(**kwargs):
        inner_log(**kwargs)
        marks.append((time.perf_counter(), kwargs["collect_time"], kwargs["learn_time"]))

    runner.logger.log = log
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    runner.learn(num_learning_iterations=warmup + iterations, **learn_kwargs)
    total_seconds = time.perf_counter() - start

    window = marks[warmup - 1 :]
    per_iter = [b[0] - a[0] for a, b in zip(window, window[1:])]
    median_iter = statistics.median(per_iter)
    collect = statistics.median(m[1] for m in window[1:])
    learn = statistics.median(m[2] for m in window[1:])
    return {
        "sps": steps_per_iteration * len(per_iter) / (window[-1][0] - window[0][0]),
        "sps_median_iteration": steps_per_iteration / median_iter,
        "sps_including_warmup": steps_per_iteration * len(marks) / total_seconds,
        "measured_iterations": len(per_iter),
        "iteration_seconds": median_iter,
        "rollout_seconds": collect,
        "update_seconds": learn,
        "other_seconds": max(median_iter - collect - learn, 0.0),
        "rollout_sps": steps_per_iteration / collect if collect > 0 else None,
        "peak_memory_mb": bench_peak_memory_mb(device),
    }


def bench_peak_memory_mb(device: torch.device) -> float:
    """Same definition as algos/ppo.py's summary: torch's peak allocation on CUDA, peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_rsl_rl(cfg: dict, timeout: float, threads: int | None) -> dict:
    return bench.run_worker(
        "tests.benchmarks.rsl_rl", cfg, RESULT_MARKER, {"impl": "rsl_rl", "mode": cfg["mode"]}, timeout, threads
    )


# ----------------------------------------------------------------------------------------------
# the comparison
# ----------------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="Pendulum-v1")
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--hidden-sizes", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--num-steps", type=int, default=24)
    parser.add_argument("--update-epochs", type=int, default=5)
    parser.add_argument("--num-minibatches", type=int, default=4)
    parser.add_argument(
        "--obs-norm",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="observation normalization on both sides (default: on)",
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["eager"],
        choices=["eager", "compile"],
        help="eager: no compilation on either side; compile: ours --compile, rsl_rl torch_compile_mode='default'",
    )
    parser.add_argument("--iterations", type=int, default=10, help="timed iterations after the warm-up")
    parser.add_argument("--warmup-iterations", type=int, default=2)
    parser.add_argument(
        "--rounds", type=int, default=1, help="alternate the two learners this many times (medians reported)"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads of both learners (default: torch's)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument(
        "--json", metavar="PATH", default=None, help="write the figures as JSON ('-': stdout, instead of the table)"
    )
    parser.add_argument("--worker", metavar="CONFIG", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is None and (args.iterations < 1 or args.warmup_iterations < 1 or args.rounds < 1):
        parser.error("--iterations, --warmup-iterations and --rounds must be >= 1")
    return args


def median_record(records: list[dict]) -> dict:
    """The median SPS over the rounds, with the other figures of the run nearest to it."""
    ok = [r for r in records if r.get("status") == "ok"]
    if not ok:
        return records[-1]
    sps = statistics.median(r["sps"] for r in ok)
    chosen = dict(min(ok, key=lambda r: abs(r["sps"] - sps)))
    chosen.update(sps=sps, sps_all_rounds=[r["sps"] for r in ok])
    return chosen


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker is not None:
        result = run_rsl_rl_worker(json.loads(args.worker))
        print(RESULT_MARKER + json.dumps(result), flush=True)
        return 0
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if rsl_rl_version() is None:
        raise SystemExit("error: rsl-rl-lib is not installed; pip install --no-deps rsl-rl-lib (keeps your torch)")
    sizes = [
        "--hidden-sizes",
        *map(str, args.hidden_sizes),
        "--num-steps",
        str(args.num_steps),
        "--update-epochs",
        str(args.update_epochs),
        "--num-minibatches",
        str(args.num_minibatches),
    ]
    if not args.obs_norm:
        sizes.append("--no-obs-norm")
    ppo_args = load_script("ppo").Args
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731

    report = {
        "benchmark": "tests.benchmarks.rsl_rl",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": bench.machine_info(device),
        "load_average": {"start": bench.load_average(), "end": None},
        "config": {
            "env_id": args.env_id,
            "num_envs": args.num_envs,
            "device": str(device),
            "hidden_sizes": args.hidden_sizes,
            "num_steps": args.num_steps,
            "update_epochs": args.update_epochs,
            "num_minibatches": args.num_minibatches,
            "obs_norm": args.obs_norm,
            "modes": args.modes,
            "iterations": args.iterations,
            "warmup_iterations": args.warmup_iterations,
            "rounds": args.rounds,
            "rsl_rl_version": rsl_rl_version(),
        },
        "commands": {"benchmark": shlex.join(["python", "-m", "tests.benchmarks.rsl_rl", *argv]), "runs": []},
        "results": {},
        "notes": bench.overload_notes(),
    }
    log(f"env only: {args.env_id} x {args.num_envs}")
    report["env_only"] = bench.measure_env_only(args.env_id, args.num_envs, device)
    failed = False
    for mode in args.modes:
        ours_runs, theirs_runs = [], []
        for round_ in range(args.rounds):
            log(f"{mode}, round {round_ + 1}/{args.rounds}: algos/ppo.py")
            r = bench.run_training(
                "ppo",
                ppo_args,
                args.env_id,
                args.num_envs,
                str(device),
                mode,
                args.iterations,
                args.warmup_iterations,
                extra_args=sizes,
                threads=args.threads,
                timeout=args.timeout,
                seed=args.seed,
            )
            r["impl"] = "ours"
            ours_runs.append(r)
            log(f"{mode}, round {round_ + 1}/{args.rounds}: rsl_rl")
            cfg = {
                "env_id": args.env_id,
                "num_envs": args.num_envs,
                "device": str(device),
                "mode": mode,
                "hidden_sizes": args.hidden_sizes,
                "num_steps": args.num_steps,
                "update_epochs": args.update_epochs,
                "num_minibatches": args.num_minibatches,
                "obs_norm": args.obs_norm,
                "iterations": args.iterations,
                "warmup": args.warmup_iterations,
                "seed": args.seed,
                "threads": args.threads,
            }
            theirs_runs.append(run_rsl_rl(cfg, args.timeout, args.threads))
            report["commands"]["runs"] += [ours_runs[-1]["command"], theirs_runs[-1]["command"]]
        ours, theirs = median_record(ours_runs), median_record(theirs_runs)
        ok = ours.get("status") == "ok" and theirs.get("status") == "ok"
        failed |= not ok
        report["results"][mode] = {
            "ours": ours,
            "rsl_rl": theirs,
            "ours_over_rsl_rl": bench.ratio(ours.get("sps"), theirs.get("sps")) if ok else None,
            "update_ours_over_rsl_rl": bench.ratio(ours.get("update_seconds"), theirs.get("update_seconds"))
            if ok
            else None,
            "rollout_ours_over_rsl_rl": bench.ratio(ours.get("rollout_seconds"), theirs.get("rollout_seconds"))
            if ok
            else None,
        }
    report["load_average"]["end"] = bench.load_average()

    if args.json != "-":
        print_table(report)
    if args.json is not None:
        bench.write_json(report, args.json)
    return 1 if failed else 0


def print_table(report: dict) -> None:
    cfg, m = report["config"], report["machine"]
    print(
        f"{cfg['env_id']} x {cfg['num_envs']} envs on {cfg['device']}, {cfg['num_steps']} steps x "
        f"{cfg['update_epochs']} epochs x {cfg['num_minibatches']} minibatches, hidden {cfg['hidden_sizes']}, "
        f"obs norm {'on' if cfg['obs_norm'] else 'off'}; rsl-rl-lib {cfg['rsl_rl_version']}; "
        f"{bench.machine_label(m)}, torch {m['torch']}, {m['torch_threads']} threads; "
        f"load average {report['load_average']['start']} -> {report['load_average']['end']}"
    )
    print(f"env only: {bench.fmt(report['env_only']['sps'])} SPS")
    print(f"{'learner':<16}{'mode':<10}{'SPS':>12}{'x env':>8}{'iter s':>9}{'rollout s':>11}{'update s':>10}", end="")
    print(f"{'peak MB':>9}")
    for mode, res in report["results"].items():
        for name, key in (("algos/ppo.py", "ours"), ("rsl_rl PPO", "rsl_rl")):
            r = res[key]
            if r.get("status") != "ok":
                print(f"{name:<16}{mode:<10}{'failed':>12}  {r.get('error')}")
                continue
            print(
                f"{name:<16}{mode:<10}{bench.fmt(r['sps']):>12}"
                f"{bench.fmt_ratio(bench.ratio(r['sps'], report['env_only']['sps'])):>8}"
                f"{bench.fmt(r.get('iteration_seconds'), '.3f'):>9}{bench.fmt(r.get('rollout_seconds'), '.3f'):>11}"
                f"{bench.fmt(r.get('update_seconds'), '.3f'):>10}{bench.fmt(r.get('peak_memory_mb')):>9}"
            )
        print(
            f"{mode}: ours / rsl_rl = {bench.fmt(res['ours_over_rsl_rl'], '.2f')} x training SPS "
            f"(rollout time {bench.fmt(res['rollout_ours_over_rsl_rl'], '.2f')} x, update time "
            f"{bench.fmt(res['update_ours_over_rsl_rl'], '.2f')} x theirs)"
        )
    for note in report["notes"]:
        print(f"note: {note}")


if __name__ == "__main__":
    sys.exit(main())
