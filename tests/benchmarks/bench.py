"""Speed of the training scripts next to the speed of the env they train on, in one invocation.

    python -m tests.benchmarks.bench --env-id Pendulum-v1 --num-envs 4096 --device cpu
        [--algos ppo pqn ...] [--modes eager compile compile+cudagraphs] [--iterations K]
        [--warmup-iterations W] [--hidden-sizes 64 64] [--json PATH | --json -] [--markdown]
    python -m tests.benchmarks.bench --storage-bytes [--num-envs 4096 --num-steps 128 --frame 4 84 84]

A benchmark, not a test: pytest does not collect it (no test_ prefix), and nothing here asserts
a speed. For one env id, num_envs and device it measures, side by side:

1. env only: `env.step` with random actions (tests/benchmarks/envs.py's `bench_one`), eager;
2. env + inference: PPO's acting step (the `Agent` of algos/ppo.py, default Args and
   --hidden-sizes, acting through a grad-free twin as the script does) feeding `env.step`,
   per mode (eager, torch.compile, + CUDA graphs on CUDA);
3. network cost of PPO (per mode): one rollout's inference (num_steps acting calls on a fixed
   observation batch, no env) and the bare forward+backward passes of an update
   (update_epochs * num_minibatches passes of actor and critic on random minibatches of the
   same shape, a plain sum as the loss: no optimizer, no PPO losses, no indexing);
4. training: every script in algos/ (or those named by --algos) that takes the common flags,
   run in a subprocess per mode (so compile caches, threads and memory cannot leak between
   modes), with eval off and checkpoints only at the end; each script's SPS also as a ratio to
   ppo.py's in the same mode (ppo_lstm: what its memory costs; distill: an iteration of a student of
   ppo_lstm's size beside ppo_lstm's, with an untrained ppo.py teacher of ppo's default size).

Steady-state training SPS. The first iteration(s) carry torch.compile's work (tens of seconds
on CPU) and one-off allocations; the last carries the final checkpoint. Running N and 2N
iterations and subtracting would cancel those, but compile time varies by seconds from run to
run, which swamps the difference unless N is large. Instead every script logs `charts/SPS`
once per log interval (--log-interval iterations: 1 on CPU and 10 on CUDA for ppo/pqn, 100 for
td3/sac), and TensorBoard stores each event with its wall-clock time. So one run of W + K logged
intervals suffices: the SPS is (env steps between the events W and W+K) / (wall time between
them), which covers whole iterations (rollout, advantages, update, logging) and nothing before
or after.
The rollout/update split comes from the `charts/rollout_seconds` and `charts/update_seconds`
events of the same window (per-iteration means over each log interval, their median; with a log
interval of k, an iteration's seconds are an event interval's over k; PPO's and PQN's update phase includes
their targets: advantages, normalizer updates, statistics); "other" is the rest of an iteration
(the logging read, evaluation and saves are outside the window's phases). summary.json gives the
peak memory (RSS on CPU, torch.cuda.max_memory_allocated on CUDA) and the SPS including the
warm-up, reported as well. A script that logs no per-iteration SPS falls back to
summary.json's SPS, marked as including warm-up.

Measurements 1-3 run in this process: all of them are prepared first (compiled, warmed up),
then they take turns for --repeats rounds and each reports its median, so a drifting load on a
shared machine spreads over all of them. On a machine busier than its core count, more than one
torch thread per process can be many times slower than one (the threads wait for each other):
--threads 1 is then the setting that measures the code rather than the contention.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # also runnable as `python tests/benchmarks/bench.py`
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from tensordict import from_module  # noqa: E402

from tests.benchmarks.envs import bench_one  # noqa: E402
from tests.helpers import load_script, untrained_teacher  # noqa: E402

ALL_MODES = ("eager", "compile", "compile+cudagraphs")
# Flags a script must take to be benchmarked (the design's common flags that the runner sets).
REQUIRED_FIELDS = (
    "env_id",
    "num_envs",
    "total_timesteps",
    "seed",
    "device",
    "output_dir",
    "run_name",
    "compile",
    "cudagraphs",
)
SAVE_NEVER = 10**9  # --save-interval: only the final checkpoint, which lies outside the timed window


# ----------------------------------------------------------------------------------------------
# Machine
# ----------------------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: torch.device) -> dict:
    """What the figures depend on, without naming the host."""
    info = {
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "gpu": None,
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def machine_label(machine: dict) -> str:
    if machine.get("gpu"):
        return machine["gpu"]
    return f"{machine['cpu']} ({machine['cpu_cores']} cores)"


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def overload_notes() -> list[str]:
    """A warning when other work competes for the CPU: figures are then low and noisy, and more
    than one torch thread per process can be far slower than one (threads wait for each other)."""
    load, cores = load_average(), os.cpu_count() or 1
    if load is None or load[0] <= 0.75 * cores:
        return []
    return [
        f"load average {load[0]} with {cores} cores before the benchmark: other work competes for the CPU, "
        f"so figures are low and noisy (--threads 1 suffers least from it)"
    ]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def modes_for(device: torch.device, requested: list[str]) -> tuple[list[str], list[str]]:
    """(modes to run, notes on dropped ones): CUDA graphs exist only on CUDA."""
    run, notes = [], []
    for mode in requested:
        if "cudagraphs" in mode and device.type != "cuda":
            notes.append(f"{mode}: skipped, CUDA graphs need a CUDA device")
        else:
            run.append(mode)
    return run, notes


def wrap_mode(fn, mode: str):
    """The transformation the scripts apply under --compile / --cudagraphs."""
    if "compile" in mode:
        fn = torch.compile(fn)
    if "cudagraphs" in mode:
        from tensordict.nn import CudaGraphModule

        fn = CudaGraphModule(fn)
    return fn


def time_env(step, num_envs: int, act_dim: int, device: torch.device, steps: int, warmup: int, repeats: int) -> dict:
    """Median over `repeats` windows of `steps` steps of `step(action)`, after `warmup` steps."""
    gen = torch.Generator().manual_seed(0)
    pool = [(torch.rand(num_envs, act_dim, generator=gen) * 2 - 1).to(device) for _ in range(8)]
    for i in range(warmup):
        step(pool[i % len(pool)])
    seconds = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        for i in range(steps):
            step(pool[i % len(pool)])
        sync(device)
        seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds)
    return {
        "sps": steps * num_envs / median,
        "ms_per_step": 1e3 * median / steps,
        "steps": steps,
        "repeats": repeats,
        "sps_all_windows": [steps * num_envs / s for s in seconds],
    }


def timed(device: torch.device, fn) -> float:
    """Seconds `fn()` takes, the device synchronised on both sides."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


# ----------------------------------------------------------------------------------------------
# 1. env only, 2. env + PPO inference, 3. PPO's network costs
#
# Each measurement is first prepared (env built, functions compiled and warmed up) and returns a
# timer: a function that runs one timed sample and returns its seconds. The timers of every
# measurement and mode then run in turns, --repeats rounds, and each reports its median. On a
# machine whose load drifts, taking turns spreads the drift over all of them instead of
# penalising whichever ran last.
# ----------------------------------------------------------------------------------------------
def prepare_env_only(env_id: str, num_envs: int, device: torch.device, steps: int, warmup: int):
    """tests/benchmarks/envs.py's measurement: random actions, env.step only, eager."""

    def sample() -> float:
        return bench_one(env_id, num_envs, device, steps, warmup, use_compile=False)["seconds"]

    return sample


def measure_env_only(env_id: str, num_envs: int, device: torch.device, steps: int = 200, repeats: int = 3) -> dict:
    """Env-only SPS alone (median of `repeats`), for reports that need only this baseline."""
    sample = prepare_env_only(env_id, num_envs, device, steps, warmup=20)
    seconds = statistics.median(sample() for _ in range(repeats))
    return {"sps": steps * num_envs / seconds, "ms_per_step": 1e3 * seconds / steps, "steps": steps, "repeats": repeats}


def build_ppo_policy(env, device: torch.device, hidden_sizes):
    """PPO's Agent for this env, and its grad-free acting twin, as algos/ppo.py builds them."""
    ppo = load_script("ppo")
    args = ppo.Args() if hidden_sizes is None else ppo.Args(hidden_sizes=tuple(hidden_sizes))
    obs, _ = env.reset(seed=0)
    obs_dim = obs["policy"].shape[-1]
    critic_dim = obs["critic"].shape[-1] if args.asymmetric_critic and "critic" in obs.keys() else None
    agent = ppo.Agent(obs_dim, critic_dim, env.single_action_space, args).to(device)
    twin = ppo.Agent(obs_dim, critic_dim, env.single_action_space, args).to(device)
    from_module(agent).data.to_module(twin)
    return ppo, args, agent, twin, obs


def prepare_inference(env_id, num_envs, device, mode, steps, warmup, hidden_sizes):
    """Timer of `steps` env steps with PPO's acting step choosing the actions (no storage, no update)."""
    from common.envs import make_env

    env = make_env(env_id, num_envs, device=device, seed=0)
    ppo, _, _, twin, obs = build_ppo_policy(env, device, hidden_sizes)
    policy_step = wrap_mode(lambda o: twin.act(o), mode)
    state = {"obs": obs}

    @torch.no_grad()
    def run(n: int) -> None:
        o = state["obs"]
        for _ in range(n):
            action = policy_step(o)[0]  # (action, log-prob, the actor's output)
            o, _, _, _, _ = env.step(twin.to_env(action))
        state["obs"] = o

    run(warmup)
    return lambda: timed(device, lambda: run(steps))


def prepare_network(env_id, num_envs, device, mode, hidden_sizes):
    """Timers of one rollout's inference and of one update's bare forward+backward passes, and their sizes."""
    from common.envs import make_env

    env = make_env(env_id, num_envs, device=device, seed=0)
    _, args, agent, twin, obs = build_ppo_policy(env, device, hidden_sizes)
    minibatch = num_envs * args.num_steps // args.num_minibatches
    passes = args.update_epochs * args.num_minibatches
    policy_step = wrap_mode(lambda o: twin.act(o), mode)

    @torch.no_grad()
    def rollout_inference() -> None:
        for _ in range(args.num_steps):
            policy_step(obs)

    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(minibatch, agent.actor[0].in_features, device=device, generator=g)
    xc = torch.randn(minibatch, agent.critic[0].in_features, device=device, generator=g)

    def forward(a, c):
        return agent.actor(a).sum() + agent.critic(c).sum()

    fwd = torch.compile(forward) if "compile" in mode else forward  # its backward is compiled with it (AOTAutograd)

    def bare_update() -> None:
        for _ in range(passes):
            fwd(x, xc).backward()

    for _ in range(3):  # warm-up, compilation included
        rollout_inference()
        fwd(x, xc).backward()
    info = {
        "num_steps": args.num_steps,
        "passes": passes,
        "minibatch_size": minibatch,
        "hidden_sizes": list(args.hidden_sizes),
    }
    if "cudagraphs" in mode:
        info["note"] = "bare fwd/bwd compiled without CUDA graphs"
    timers = {
        "rollout_inference_seconds": lambda: timed(device, rollout_inference),
        "bare_fwd_bwd_seconds": lambda: timed(device, bare_update),
    }
    return timers, info


def micro_benchmarks(env_id, num_envs, device, modes, steps, repeats, hidden_sizes, log) -> tuple[dict, dict, dict]:
    """(env_only, inference per mode, network per mode): sections 1-3, timers taking turns."""
    warmup = 20
    timers = {("env_only", None, "seconds"): prepare_env_only(env_id, num_envs, device, steps, warmup)}
    network = {}
    for mode in modes:
        log(f"preparing env + ppo inference and ppo network timers, {mode}")
        timers[("inference", mode, "seconds")] = prepare_inference(
            env_id, num_envs, device, mode, steps, warmup, hidden_sizes
        )
        net_timers, network[mode] = prepare_network(env_id, num_envs, device, mode, hidden_sizes)
        for key, fn in net_timers.items():
            timers[("network", mode, key)] = fn
    samples = {key: [] for key in timers}
    for round_ in range(repeats):
        log(f"micro-benchmarks, round {round_ + 1}/{repeats}")
        for key, fn in timers.items():
            samples[key].append(fn())
    med = {key: statistics.median(v) for key, v in samples.items()}
    env_seconds = med[("env_only", None, "seconds")]
    env_only = {
        "sps": steps * num_envs / env_seconds,
        "ms_per_step": 1e3 * env_seconds / steps,
        "steps": steps,
        "repeats": repeats,
        "sps_all_rounds": [steps * num_envs / t for t in samples[("env_only", None, "seconds")]],
    }
    inference = {}
    for mode in modes:
        sec = samples[("inference", mode, "seconds")]
        inference[mode] = {
            "sps": steps * num_envs / med[("inference", mode, "seconds")],
            "steps": steps,
            "repeats": repeats,
            "sps_all_rounds": [steps * num_envs / t for t in sec],
        }
        for key in ("rollout_inference_seconds", "bare_fwd_bwd_seconds"):
            network[mode][key] = med[("network", mode, key)]
        network[mode]["repeats"] = repeats
    return env_only, inference, network


# ----------------------------------------------------------------------------------------------
# 4. training runs
# ----------------------------------------------------------------------------------------------
def discover_algos(requested: list[str] | None) -> tuple[dict, dict]:
    """{name: Args class} of the scripts to run, and {name: why skipped}.

    Without --algos: every algos/*.py that imports and whose Args has the common flags. Scripts
    still being written may be absent or broken; they are reported, not fatal.
    """
    names = requested or sorted(p.stem for p in (ROOT / "algos").glob("*.py") if not p.stem.startswith("_"))
    found, skipped = {}, {}
    for name in names:
        if not (ROOT / "algos" / f"{name}.py").exists():
            skipped[name] = f"no algos/{name}.py"
            continue
        try:
            args_cls = load_script(name).Args
            fields = {f.name for f in dataclasses.fields(args_cls)}
        except Exception as e:  # a script mid-edit: report it, measure the others
            skipped[name] = f"cannot import algos/{name}.py: {type(e).__name__}: {e}"
            continue
        missing = [f for f in REQUIRED_FIELDS if f not in fields]
        if missing:
            skipped[name] = f"Args lacks the common flag(s) {', '.join('--' + m.replace('_', '-') for m in missing)}"
            continue
        found[name] = args_cls
    return found, skipped


def ppo_activations() -> tuple[str, ...]:
    """The activations algos/ppo.py's --activation takes (its Args field's choices)."""
    import typing

    return typing.get_args(typing.get_type_hints(load_script("ppo").Args)["activation"])


def flag_value(flags: list[str], name: str) -> str | None:
    """The value given to `--name` in a tyro command line (`--name V` or `--name=V`), if any."""
    for i, flag in enumerate(flags):
        if flag == name and i + 1 < len(flags):
            return flags[i + 1]
        if flag.startswith(name + "="):
            return flag.split("=", 1)[1]
    return None


def script_plan(
    args_cls, num_envs: int, iterations: int, warmup: int, extra_args: list[str], device: str = "cpu"
) -> tuple[int, list[str], int]:
    """(--total-timesteps for warmup + iterations logged iterations, flags this script takes for a quiet
    timed run, iterations per logged event: its log interval).

    A --log-interval the script leaves to the device (None) is set explicitly to the script's
    default there (10 on CUDA, 1 elsewhere): a logged iteration is then the same on every run."""
    defaults = {f.name: f.default for f in dataclasses.fields(args_cls)}
    flags = []
    if (
        "log_interval" in defaults
        and defaults["log_interval"] is None
        and flag_value(extra_args, "--log-interval") is None
    ):
        defaults["log_interval"] = 10 if device.startswith("cuda") else 1
        flags += ["--log-interval", str(defaults["log_interval"])]

    def setting(name: str) -> int:  # the run's value: from the extra flags, else the script's default
        given = flag_value(extra_args, "--" + name.replace("_", "-"))
        return int(given if given is not None else defaults.get(name, 1))

    steps_per_iteration = num_envs * setting("num_steps")
    steps_per_event = steps_per_iteration * setting("log_interval")
    if "eval_interval" in defaults:
        flags += ["--eval-interval", "0"]
    if "save_interval" in defaults:
        flags += ["--save-interval", str(SAVE_NEVER)]
    if "progress" in defaults:
        flags += ["--no-progress"]
    if "learning_starts" in defaults:  # off-policy: updates from the second iteration on, inside the warm-up
        flags += ["--learning-starts", str(steps_per_iteration)]
    total = (warmup + iterations) * steps_per_event
    return total, flags, setting("log_interval")


def read_scalars(run_dir: Path) -> dict[str, list]:
    """TensorBoard scalars of a run: {tag: [(wall_time, step, value), ...]}, in logging order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.wall_time, e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags().get("scalars", [])}


def steady_state(scalars: dict, warmup: int, iterations_per_event: int = 1) -> dict | None:
    """Figures over the events after the first `warmup` ones (see the module docstring). An event
    covers `iterations_per_event` iterations (the log interval); its phase seconds are their means."""
    sps_events = scalars.get("charts/SPS", [])
    first = max(warmup, 1) - 1  # the window opens at the end of the last warm-up iteration
    if len(sps_events) < first + 2:
        return None
    window = sps_events[first:]
    seconds = window[-1][0] - window[0][0]
    steps = window[-1][1] - window[0][1]
    if seconds <= 0 or steps <= 0:
        return None
    per_iter = [
        ((b[0] - a[0]) / iterations_per_event, (b[1] - a[1]) / iterations_per_event) for a, b in zip(window, window[1:])
    ]
    median_iter = statistics.median(dt for dt, _ in per_iter)
    out = {
        "sps": steps / seconds,
        "sps_median_iteration": per_iter[0][1] / median_iter if median_iter > 0 else None,
        "measured_iterations": len(per_iter) * iterations_per_event,
        "measured_steps": steps,
        "iteration_seconds": median_iter,
    }
    # Per-iteration phase times of the same iterations (the events at index first+1 ...).
    for key, tag in (("rollout_seconds", "charts/rollout_seconds"), ("update_seconds", "charts/update_seconds")):
        events = scalars.get(tag, [])
        if len(events) == len(sps_events):
            out[key] = statistics.median(v for _, _, v in events[first + 1 :])
    if "rollout_seconds" in out and "update_seconds" in out:
        out["other_seconds"] = max(median_iter - out["rollout_seconds"] - out["update_seconds"], 0.0)
        for key in ("rollout", "update", "other"):
            out[f"{key}_fraction"] = out[f"{key}_seconds"] / median_iter
        out["rollout_sps"] = per_iter[0][1] / out["rollout_seconds"] if out["rollout_seconds"] > 0 else None
    return out


def subprocess_env(threads: int | None) -> dict:
    """The environment of a measured subprocess: every learner of one command on the same torch thread count (the
    given one, else this process's). Without it a script would choose its own from the load average
    (common.settings.choose_threads), which the benchmark's previous subprocess has just raised: ours then ran on
    fewer threads than the peer it is set beside."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("WANDB_MODE", None)
    env["OMP_NUM_THREADS"] = str(threads if threads is not None else torch.get_num_threads())
    return env


def run_command(cmd: list[str], timeout: float, env: dict) -> tuple[int, str]:
    """Run in its own process group; on timeout kill the whole group. Returns (rc, output)."""
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return 124, (out or "") + f"\n[timed out after {timeout:.0f}s]"
    return proc.returncode, out


def display_command(cmd: list[str]) -> str:
    """The command as a user would type it: `python` and paths relative to the checkout."""
    shown = ["python" if c == sys.executable else c for c in cmd]
    return shlex.join(shown)


def failure_reason(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:") or "Error" in line.split(":")[0]]
    return (errors or lines or ["(no output)"])[-1][:300]


def run_worker(module: str, cfg: dict, marker: str, record: dict, timeout: float, threads: int | None) -> dict:
    """`python -m <module> --worker <cfg>` in a subprocess; `record` updated with the JSON it prints
    after `marker` (its last such line), or with the cause of its failure."""
    cmd = [sys.executable, "-m", module, "--worker", json.dumps(cfg)]
    record["command"] = display_command(cmd)
    rc, output = run_command(cmd, timeout, subprocess_env(threads))
    lines = [line for line in output.splitlines() if line.startswith(marker)]
    if rc != 0 or not lines:
        record.update(status="failed", error=failure_reason(output), returncode=rc)
        return record
    record.update(json.loads(lines[-1][len(marker) :]))
    return record


def run_training(
    algo: str,
    args_cls,
    env_id: str,
    num_envs: int,
    device: str,
    mode: str,
    iterations: int,
    warmup: int,
    hidden_sizes=None,
    extra_args: list[str] | None = None,
    threads: int | None = None,
    timeout: float = 3600.0,
    workdir: Path | None = None,
    seed: int = 1,
) -> dict:
    """Train `algo` for warmup + iterations logged iterations in a subprocess; its steady-state figures."""
    total, flags, iterations_per_event = script_plan(args_cls, num_envs, iterations, warmup, extra_args or [], device)
    run_name = f"{algo}-{mode.replace('+', '-')}-{env_id.replace(':', '-').replace('/', '-')}-{num_envs}"
    with tempfile.TemporaryDirectory(prefix="bench-", dir=workdir) as out_dir:
        script_args = [
            "--env-id",
            env_id,
            "--num-envs",
            str(num_envs),
            "--device",
            device,
            "--seed",
            str(seed),
            "--total-timesteps",
            str(total),
            "--output-dir",
            out_dir,
            "--run-name",
            run_name,
            *flags,
        ]
        if (
            "teacher" in {f.name for f in dataclasses.fields(args_cls)}
            and flag_value(extra_args or [], "--teacher") is None
        ):
            # distill.py: an untrained ppo.py teacher of the env's full observation (its cost is its size's, not its
            # skill's)
            script_args += ["--teacher", str(untrained_teacher(Path(out_dir) / "teacher.pt", env_id.split(":")[-1]))]
        if hidden_sizes is not None and "hidden_sizes" in {f.name for f in dataclasses.fields(args_cls)}:
            script_args += ["--hidden-sizes", *map(str, hidden_sizes)]
        # explicit: the scripts' default ("auto") turns both on under CUDA
        script_args += ["--compile", str("compile" in mode), "--cudagraphs", str("cudagraphs" in mode)]
        script_args += extra_args or []
        cmd = [sys.executable, f"algos/{algo}.py", *script_args]
        record = {"algo": algo, "mode": mode, "command": display_command(cmd).replace(out_dir, "<tmpdir>")}
        start = time.perf_counter()
        rc, output = run_command(cmd, timeout, subprocess_env(threads))
        record["process_seconds"] = time.perf_counter() - start
        run_dir = Path(out_dir) / run_name
        summary_path = run_dir / "summary.json"
        if rc != 0 or not summary_path.exists():
            record.update(status="failed", error=failure_reason(output), returncode=rc)
            return record
        summary = json.loads(summary_path.read_text())
        record.update(
            status="ok",
            sps_including_warmup=summary.get("sps"),
            peak_memory_mb=summary.get("peak_memory_mb"),
            global_step=summary.get("global_step"),
            total_rollout_seconds=summary.get("rollout_seconds"),
            total_update_seconds=summary.get("update_seconds"),
        )
        try:
            steady = steady_state(read_scalars(run_dir), warmup, iterations_per_event)
        except Exception as e:  # unreadable events: fall back to the summary
            steady, record["note"] = None, f"events unreadable ({type(e).__name__}); SPS includes warm-up"
        if steady is None:
            record["sps"] = summary.get("sps")
            record.setdefault("note", "no per-iteration SPS events; SPS includes warm-up")
        else:
            record.update(steady)
        return record


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------
def ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def add_ratios(report: dict) -> None:
    env_sps = report["env_only"]["sps"]
    inference = report["inference"]
    for mode, r in inference.items():
        r["ratio_to_env_only"] = ratio(r["sps"], env_sps)
        r["speedup_vs_eager"] = ratio(r["sps"], inference.get("eager", {}).get("sps"))
    eager_sps = {r["algo"]: r.get("sps") for r in report["training"] if r["mode"] == "eager" and r["status"] == "ok"}
    ppo_sps = {r["mode"]: r.get("sps") for r in report["training"] if r["algo"] == "ppo" and r["status"] == "ok"}
    network = report["network"]
    for r in report["training"]:
        if r["status"] != "ok":
            continue
        r["ratio_to_env_only"] = ratio(r.get("sps"), env_sps)
        r["ratio_to_inference"] = ratio(r.get("sps"), inference.get(r["mode"], {}).get("sps"))
        r["speedup_vs_eager"] = ratio(r.get("sps"), eager_sps.get(r["algo"]))
        r["ratio_to_ppo"] = ratio(r.get("sps"), ppo_sps.get(r["mode"]))  # e.g. ppo_lstm's cost of its memory
        net = network.get(r["mode"])
        if r["algo"] == "ppo" and net and r.get("update_seconds") is not None:
            r["update_over_rollout_inference"] = ratio(r["update_seconds"], net["rollout_inference_seconds"])
            r["update_over_bare_fwd_bwd"] = ratio(r["update_seconds"], net["bare_fwd_bwd_seconds"])
            r["bare_fwd_bwd_over_rollout_inference"] = ratio(
                net["bare_fwd_bwd_seconds"], net["rollout_inference_seconds"]
            )


def fmt(x, spec: str = ",.0f", none: str = "-") -> str:
    return none if x is None else format(x, spec)


def fmt_ratio(x) -> str:
    """Ratios with three significant digits: 1.23, 0.0114."""
    return "-" if x is None else f"{x:.3g}" if x < 0.1 else f"{x:.2f}"


def print_table(report: dict, file=sys.stdout) -> None:
    cfg, m = report["config"], report["machine"]
    p = lambda *a: print(*a, file=file)  # noqa: E731
    p(
        f"{cfg['env_id']} x {cfg['num_envs']} envs on {cfg['device']}: {machine_label(m)}, torch {m['torch']}, "
        f"{m['torch_threads']} threads; load average {report['load_average']['start']} -> "
        f"{report['load_average']['end']}"
    )
    p(
        f"{'measure':<28}{'mode':<20}{'SPS':>13}{'x env':>8}{'x eager':>9}{'rollout s':>11}{'update s':>10}"
        f"{'other s':>9}{'peak MB':>9}"
    )
    p(f"{'env only (random actions)':<28}{'eager':<20}{fmt(report['env_only']['sps']):>13}{'1.00':>8}")
    for mode, r in report["inference"].items():
        p(
            f"{'env + ppo inference':<28}{mode:<20}{fmt(r['sps']):>13}{fmt_ratio(r['ratio_to_env_only']):>8}"
            f"{fmt(r['speedup_vs_eager'], '.2f'):>9}"
        )
    for r in report["training"]:
        name = f"{r['algo']} training"
        if r["status"] != "ok":
            p(f"{name:<28}{r['mode']:<20}{'failed':>13}  {r['error']}")
            continue
        p(
            f"{name:<28}{r['mode']:<20}{fmt(r.get('sps')):>13}{fmt_ratio(r.get('ratio_to_env_only')):>8}"
            f"{fmt(r.get('speedup_vs_eager'), '.2f'):>9}{fmt(r.get('rollout_seconds'), '.3f'):>11}"
            f"{fmt(r.get('update_seconds'), '.3f'):>10}{fmt(r.get('other_seconds'), '.3f'):>9}"
            f"{fmt(r.get('peak_memory_mb'), ',.0f'):>9}" + (f"  ({r['note']})" if r.get("note") else "")
        )
    for mode, n in report["network"].items():
        ppo_run = next(
            (r for r in report["training"] if r["algo"] == "ppo" and r["mode"] == mode and r["status"] == "ok"), None
        )
        line = (
            f"ppo network, {mode}: rollout inference {n['rollout_inference_seconds'] * 1e3:,.1f} ms "
            f"({n['num_steps']} acting steps); bare fwd+bwd {n['bare_fwd_bwd_seconds'] * 1e3:,.1f} ms "
            f"({n['passes']} passes of {n['minibatch_size']})"
        )
        if ppo_run and ppo_run.get("update_seconds") is not None:
            line += (
                f"; update {ppo_run['update_seconds'] * 1e3:,.1f} ms = "
                f"{fmt(ppo_run.get('update_over_rollout_inference'), '.1f')} x rollout inference, "
                f"{fmt(ppo_run.get('update_over_bare_fwd_bwd'), '.2f')} x bare fwd+bwd"
            )
        p(line)
    for r in report["training"]:
        if r["algo"] != "ppo" and r.get("ratio_to_ppo") is not None:
            p(f"{r['algo']} training, {r['mode']}: {fmt_ratio(r['ratio_to_ppo'])} x ppo's training SPS (same command)")
    for note in report["notes"]:
        p(f"note: {note}")


def markdown_rows(report: dict) -> list[str]:
    """Rows for the README's benchmark table: | machine | env | num_envs | mode | SPS | x env only |."""
    cfg = report["config"]
    label = f"{machine_label(report['machine'])}, torch {report['machine']['torch']}"
    head = f"| {label} | {cfg['env_id']} | {cfg['num_envs']} |"
    rows = [
        "| machine | env | num_envs | mode | SPS | x env only |",
        "|---|---|---|---|---|---|",
        f"{head} env only | {fmt(report['env_only']['sps'])} | 1.00 |",
    ]
    for mode, r in report["inference"].items():
        rows.append(f"{head} env + ppo inference, {mode} | {fmt(r['sps'])} | {fmt_ratio(r['ratio_to_env_only'])} |")
    for r in report["training"]:
        if r["status"] == "ok":
            rows.append(
                f"{head} {r['algo']} training, {r['mode']} | {fmt(r.get('sps'))} | "
                f"{fmt_ratio(r.get('ratio_to_env_only'))} |"
            )
    return rows


def write_json(report: dict, target: str) -> None:
    text = json.dumps(report, indent=2)
    if target == "-":
        print(text)
    else:
        Path(target).write_text(text + "\n")


# ----------------------------------------------------------------------------------------------
def rollout_storage_bytes(num_envs: int, num_steps: int, frame: tuple[int, ...]) -> dict:
    """The bytes of a ppo.py rollout of `frame` observations as common.buffer's RolloutStorage lays it
    out, with uint8 frames (as an image group is stored) and, for comparison, float32 ones. A step
    stores its observation and, for the time-out bootstrap, V(final_obs) (a float, not a second
    frame; pqn.py stores max_a Q(final_obs) alike, without the log-prob). The storage keeps the
    dtypes of its first write and its layout is one transition's repeated num_envs * num_steps
    times, so a storage of one step of two envs gives the figure without allocating it (13.8 GiB at
    4096 x 128 x 84x84x4; 27.6 GiB when final_obs was stored too)."""
    from tensordict import TensorDict

    from common.buffer import RolloutStorage, bytes_per_transition

    out = {"num_envs": num_envs, "num_steps": num_steps, "frame": list(frame)}
    for dtype in (torch.uint8, torch.float32):
        storage = RolloutStorage(1, 2, "cpu")
        storage.write(
            0,
            TensorDict(
                {
                    "obs": {"policy": torch.zeros(2, *frame, dtype=dtype)},
                    "final_values": torch.zeros(2),
                    "actions": torch.zeros(2, dtype=torch.long),
                    "logprobs": torch.zeros(2),
                    "rewards": torch.zeros(2),
                    "terminated": torch.zeros(2, dtype=torch.bool),
                    "truncated": torch.zeros(2, dtype=torch.bool),
                },
                batch_size=[2],
            ),
        )
        name = str(storage.data["obs", "policy"].dtype).replace("torch.", "")
        per = bytes_per_transition(storage.data)
        out[name] = {"bytes_per_transition": per, "bytes": per * num_envs * num_steps}
    return out


def print_storage_bytes(figures: dict) -> None:
    n, t, frame = figures["num_envs"], figures["num_steps"], "x".join(map(str, figures["frame"]))
    for name in ("uint8", "float32"):
        f = figures[name]
        print(
            f"rollout storage, {n} envs x {t} steps of {frame} frames (obs, and V(final_obs) for the bootstrap) as "
            f"{name}: "
            f"{f['bytes_per_transition']:,} bytes "
            f"per transition, {f['bytes']:,} bytes ({f['bytes'] / 2**30:.2f} GiB)"
        )
    print(f"uint8 / float32: {figures['uint8']['bytes'] / figures['float32']['bytes']:.3f}")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="Pendulum-v1")
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:K")
    parser.add_argument(
        "--algos",
        nargs="+",
        default=None,
        help="scripts in algos/ to train (default: every one that takes the common flags)",
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        default=None,
        choices=ALL_MODES,
        help="default: eager compile, plus compile+cudagraphs on CUDA",
    )
    parser.add_argument(
        "--iterations",
        type=int,
        default=10,
        help="timed training iterations after the warm-up (log intervals for scripts with --log-interval)",
    )
    parser.add_argument(
        "--warmup-iterations",
        type=int,
        default=2,
        help="logged intervals (iterations for scripts that log each one) left out of the SPS (compilation)",
    )
    parser.add_argument(
        "--hidden-sizes",
        type=int,
        nargs="+",
        default=None,
        help="hidden layers of every network (default: each script's own)",
    )
    parser.add_argument(
        "--env-steps", type=int, default=200, help="timed steps of the env-only and inference measurements"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="repeats of each in-process measurement (median reported)"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads, here and in the training runs (default: torch's)"
    )
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds a training run may take before it is killed"
    )
    parser.add_argument(
        "--script-args",
        default="",
        metavar="'FLAGS'",
        help="extra flags for every training run, e.g. --script-args='--no-torch-deterministic'",
    )
    parser.add_argument("--skip-training", action="store_true", help="only the in-process measurements (1-3)")
    parser.add_argument(
        "--json",
        metavar="PATH",
        default=None,
        help="write the figures as JSON to PATH ('-': stdout, instead of the table)",
    )
    parser.add_argument("--markdown", action="store_true", help="also print README table rows")
    parser.add_argument(
        "--storage-bytes",
        action="store_true",
        help="only print the bytes of a --num-envs x --num-steps rollout of --frame observations, uint8 and float32",
    )
    parser.add_argument("--num-steps", type=int, default=128, help="rollout steps of --storage-bytes")
    parser.add_argument(
        "--frame", type=int, nargs="+", default=[4, 84, 84], help="one observation's shape for --storage-bytes"
    )
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.warmup_iterations < 1:
        parser.error(
            "--iterations and --warmup-iterations must be >= 1 (the window opens at the end of a warm-up iteration)"
        )
    return args


def run_benchmark(args: argparse.Namespace, argv: list[str]) -> dict:
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch sees no CUDA device; use --device cpu")
    from common.envs import make_env

    try:
        make_env(args.env_id, 1, device=device)  # an unknown id fails here with the list of known ones
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    requested_modes = args.modes or [m for m in ALL_MODES if device.type == "cuda" or "cudagraphs" not in m]
    modes, notes = modes_for(device, requested_modes)
    algos, skipped = discover_algos(args.algos)
    notes += [f"{name}: skipped, {why}" for name, why in skipped.items()]
    notes += overload_notes()

    report = {
        "benchmark": "tests.benchmarks.bench",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(device),
        "load_average": {"start": load_average(), "end": None},
        "config": {
            "env_id": args.env_id,
            "num_envs": args.num_envs,
            "device": str(device),
            "modes": modes,
            "algos": list(algos),
            "iterations": args.iterations,
            "warmup_iterations": args.warmup_iterations,
            "hidden_sizes": args.hidden_sizes,
            "env_steps": args.env_steps,
            "repeats": args.repeats,
            "threads": args.threads,
            "script_args": args.script_args,
        },
        "commands": {"benchmark": shlex.join(["python", "-m", "tests.benchmarks.bench", *argv]), "training": []},
        "env_only": {},
        "inference": {},
        "network": {},
        "training": [],
        "notes": notes,
    }
    log = lambda msg: print(msg, file=sys.stderr, flush=True)
    report["env_only"], report["inference"], report["network"] = micro_benchmarks(
        args.env_id, args.num_envs, device, modes, args.env_steps, args.repeats, args.hidden_sizes, log
    )
    torch.compiler.reset()
    if not args.skip_training:
        for algo, args_cls in algos.items():
            for mode in modes:
                log(f"{algo} training, {mode}: {args.warmup_iterations} + {args.iterations} iterations")
                record = run_training(
                    algo,
                    args_cls,
                    args.env_id,
                    args.num_envs,
                    str(device),
                    mode,
                    args.iterations,
                    args.warmup_iterations,
                    args.hidden_sizes,
                    extra_args=shlex.split(args.script_args),
                    threads=args.threads,
                    timeout=args.timeout,
                )
                report["training"].append(record)
                report["commands"]["training"].append(record["command"])
                if record["status"] != "ok":
                    log(f"  failed: {record['error']}")
                    if args.algos is None:  # an incompatible env (e.g. a discrete-only script): skip its other modes
                        break
    report["load_average"]["end"] = load_average()
    add_ratios(report)
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.storage_bytes:
        figures = rollout_storage_bytes(args.num_envs, args.num_steps, tuple(args.frame))
        print_storage_bytes(figures) if args.json != "-" else None
        if args.json is not None:
            write_json(figures, args.json)
        return 0
    report = run_benchmark(args, argv)
    if args.json != "-":
        print_table(report)
    if args.json is not None:
        write_json(report, args.json)
    if args.markdown:  # on stderr when stdout carries the JSON
        print("\n".join(markdown_rows(report)), file=sys.stderr if args.json == "-" else sys.stdout)
    # Explicitly requested scripts must run; auto-discovered ones may not fit the env (reported above).
    failed = [r for r in report["training"] if r["status"] != "ok"]
    return 1 if failed and args.algos is not None else 0


if __name__ == "__main__":
    sys.exit(main())
