"""Does the GPU path work, and how fast is it? One command for a person with one GPU and ten minutes:

    python -m tests.benchmarks.gpu_check [--out DIR] [--sections tests checks torchrun speed]

It writes DIR/gpu_check.md and DIR/gpu_check.json (DIR defaults to runs/gpu_check), prints the
markdown, and exits non-zero if anything that ran failed. Sections, each in processes of its own
(on a GPU 1-3 side by side, as their time is mostly compiling on the CPU's cores, then 4 alone):

1. tests: the CUDA tests (`pytest -m cuda`: tests/test_cuda.py and the CUDA cases elsewhere).
2. checks: every script in algos/ for 20 iterations at its CUDA defaults (compile and CUDA graphs
   on; --log-interval 5 and an evaluation every 10 so that the host-read points come round), with
   torch.cuda's sync debug mode set to "error" from the start of each iteration's rollout to its
   first host read (the log, evaluation or save), and dynamo's frame counter read around every
   call of a captured function once it is warm: zero syncs, zero recompiles, or the function that
   broke it. Beside it the same flags run eagerly, and the parameters of both after iteration 5
   (checkpoints/step_*.pt) are compared: inductor draws its random numbers as eager does
   (fallback_random), and td3/sac's replay buffer samples against its device fill level in both.
3. torchrun: ppo under `torchrun --nproc-per-node 1`, whose one rank joins an NCCL group and so
   runs every distributed path (the all-reduces inside the captured update, gather_object at
   save, the parameter check at the end); then the NaN guard under the same launcher, which must
   end the rank with the error within seconds (graphs released before the group goes).
4. speed: ppo and pqn on CartPole-v1 at 4096 and 65536 envs, ppo, td3 and sac on Pendulum-v1 at
   4096, eager and compile+cudagraphs, each run alone in its own process (tests/benchmarks/bench.py:
   steady state over 3 log intervals after one of warm-up, from the logged events), next to the
   env-only SPS.

Without a GPU it runs what a CPU can and lists the rest as skipped: the checks' iterations on the
CPU (eager, with a host-sync recorder in place of the sync debug mode), torchrun with gloo, and
the parity of the compiled acting step; CI runs that mode (tests/test_bench.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tests.benchmarks import bench  # noqa: E402
from tests.helpers import free_port, load_script, subprocess_env  # noqa: E402

SECTIONS = ("tests", "checks", "torchrun", "speed")
MARKER = "GPU_CHECK_RESULT "
HOST_READS = ("reduce_iteration", "log", "evaluate", "checkpoints_to_write", "save", "finish", "eval_only")
SPEED_ROWS = [("CartPole-v1", 4096, ("ppo", "pqn")), ("CartPole-v1", 65536, ("ppo", "pqn")),
              ("Pendulum-v1", 4096, ("ppo", "td3", "sac"))]
SPEED_MODES = ("eager", "compile+cudagraphs")


# ----------------------------------------------------------------------------------------------
# 2. checks: the worker that runs one script with the sync window and the recompile counter
# ----------------------------------------------------------------------------------------------
class SyncWindow:
    """Host syncs are errors while `open`: CUDA's sync debug mode, or on CPU a recorder of the ops
    that would sync (the optimizers' own step reads left out, as in the contract test)."""

    def __init__(self, cuda: bool):
        self.cuda, self.open, self.syncs = cuda, False, []
        if not cuda:
            from tests.host_sync import SyncsOutsideTheOptimizer

            window = self

            class Recorder(SyncsOutsideTheOptimizer):
                def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                    before = len(self.syncs)
                    out = super().__torch_dispatch__(func, types, args, kwargs)
                    if window.open and len(self.syncs) > before:
                        window.syncs.append(f"{self.syncs[-1]} in {where()}")
                    return out

            self.recorder = Recorder()

    def set(self, is_open: bool) -> None:
        self.open = is_open
        if self.cuda:
            torch.cuda.set_sync_debug_mode("error" if is_open else 0)

    @contextmanager
    def closed(self):
        was = self.open
        self.set(False)
        try:
            yield
        finally:
            self.set(was)


def where(tb=None) -> str:
    """The innermost frame of the project's own code (algos/, common/) in a stack or traceback."""
    frames = traceback.extract_tb(tb) if tb is not None else traceback.extract_stack()
    ours = [f for f in frames if "/algos/" in f.filename or "/common/" in f.filename]
    f = (ours or frames)[-1]
    return f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno} {f.name}"


def worker(cfg: dict) -> dict:
    """One run of cfg["algo"] with cfg["args"]; with cfg["check"], the sync window and recompile count."""
    import common.buffer
    import common.capture
    import common.evaluation
    from torch._dynamo.utils import counters

    module = load_script(cfg["algo"])
    real_init = common.buffer.ReplayBuffer.__init__  # sampled against the device fill level in both runs
    common.buffer.ReplayBuffer.__init__ = lambda self, *a, **k: real_init(self, *a, **{**k, "capturable": True})
    torch._inductor.config.fallback_random = True
    cuda = cfg["args"]["device"].startswith("cuda")
    window, recompiles = SyncWindow(cuda), []

    if cfg["check"]:
        real_captured = common.capture.captured

        def captured(run, name, fn, capture=True):
            wrapped = real_captured(run, name, fn, capture)
            ready = getattr(wrapped, "ready", lambda: True)

            def call(*a, **k):
                if not ready():  # compile, warm-up and capture may sync and compile
                    with window.closed():
                        return wrapped(*a, **k)
                before = counters["frames"]["ok"]
                out = wrapped(*a, **k)
                if counters["frames"]["ok"] > before:
                    recompiles.append(name)
                return out
            return call

        def closing_window(fn):
            def call(*a, **k):
                window.set(False)
                return fn(*a, **k)
            return call

        real_timed = module.timed

        @contextmanager
        def timed(run, phase):
            if phase == "rollout":
                window.set(True)  # an iteration starts: no host read until its first host-read point
            with real_timed(run, phase):
                yield

        module.captured = common.capture.captured = common.evaluation.captured = captured
        module.timed = timed
        for name in HOST_READS:
            if hasattr(module, name):
                setattr(module, name, closing_window(getattr(module, name)))

    result = {"algo": cfg["algo"], "status": "ok"}
    try:
        if cfg["check"] and not cuda:
            with window.recorder:
                summary = module.main(module.Args(**cfg["args"]))
        else:
            summary = module.main(module.Args(**cfg["args"]))
        result["summary"] = {k: summary.get(k) for k in ("global_step", "iteration", "compile", "cudagraphs",
                                                         "compile_seconds", "wall_seconds", "params_in_sync")}
    except BaseException as e:  # noqa: BLE001 -- reported, with where it happened
        window.set(False)
        result.update(status="failed", error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                      at=where(e.__traceback__))
    result.update(syncs=window.syncs, recompiles=sorted(set(recompiles)))
    return result


def run_worker(cfg: dict, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "tests.benchmarks.gpu_check", "--worker", json.dumps(cfg)]
    rc, output = bench.run_command(cmd, timeout, subprocess_env())
    lines = [line for line in output.splitlines() if line.startswith(MARKER)]
    if not lines:
        return {"algo": cfg["algo"], "status": "failed", "error": bench.failure_reason(output), "returncode": rc}
    return json.loads(lines[-1][len(MARKER):])


def plan(algo: str, device: str, iterations: int, num_envs: int | None, out: Path, name: str) -> dict:
    """The flags of a check run: the script's defaults on the device, and the schedule of host reads."""
    module = load_script(algo)
    fields = {f.name: f.default for f in dataclasses.fields(module.Args)}
    cuda = device.startswith("cuda")
    if num_envs is None:
        num_envs = fields["num_envs"]
        if num_envs is None:  # a device default of the script's (td3/sac: DEVICE_DEFAULTS)
            num_envs = module.DEVICE_DEFAULTS["num_envs"][0 if cuda else 1]
    steps = num_envs * fields.get("num_steps", 1)
    args = dict(device=device, num_envs=num_envs, total_timesteps=iterations * steps, output_dir=str(out),
                run_name=name, progress=False, log_interval=5, eval_interval=10, checkpoint_interval=5,
                save_interval=10**9, num_eval_envs=min(fields["num_eval_envs"], num_envs))
    if "learning_starts" in fields:  # off-policy: updates from the third iteration on
        args["learning_starts"] = 2 * steps
    return args


def parity(eager_dir: Path, compiled_dir: Path) -> dict:
    """The models of the first numbered checkpoints (iteration 5) of both runs, compared."""
    def first(run_dir):
        files = sorted((run_dir / "checkpoints").glob("step_*.pt"), key=lambda p: int(p.stem[5:]))
        return torch.load(files[0], weights_only=True) if files else None

    a, b = first(eager_dir), first(compiled_dir)
    if a is None or b is None:
        return {"status": "failed", "error": "no step checkpoint"}
    worst, worst_name, close = 0.0, None, True
    for k, x in a["model"].items():
        if not x.is_floating_point():
            continue
        y = b["model"][k]
        diff = (x.double() - y.double()).abs().max().item() if x.numel() else 0.0
        if diff > worst:
            worst, worst_name = diff, k
        close &= torch.allclose(y.double(), x.double(), rtol=1e-3, atol=1e-4)
    return {"status": "ok" if close else "differs", "iteration": a["iteration"], "max_abs_diff": worst,
            "worst_tensor": worst_name}


def section_checks(device: str, algos: list[str], iterations: int, num_envs: int | None, timeout: float) -> list[dict]:
    """On CUDA the scripts' runs go side by side (correctness only: most of their time is compiling,
    which runs on the CPU's cores); on a CPU one after the other."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        def check(algo: str) -> dict:
            out = Path(tmp) / algo
            t0 = time.time()
            if device.startswith("cuda"):
                checked = run_worker({"algo": algo, "check": True, "args": {
                    **plan(algo, device, iterations, num_envs, out, "compiled"), "compile": True, "cudagraphs": True}},
                    timeout)
                eager = run_worker({"algo": algo, "check": False, "args": {
                    **plan(algo, device, 5, num_envs, out, "eager"), "compile": False, "cudagraphs": False}}, timeout)
                checked["parity"] = (parity(out / "eager", out / "compiled") if "ok" == checked["status"] == eager["status"]
                                     else {"status": "skipped", "error": eager.get("error") or "the checked run failed"})
            else:  # the same iterations, eager: the sync recorder stands in for the debug mode
                checked = run_worker({"algo": algo, "check": True, "args": plan(algo, device, iterations, num_envs, out,
                                                                                  "checked")}, timeout)
                checked["parity"] = {"status": "skipped", "error": "needs CUDA"}
            checked["seconds"] = time.time() - t0
            return checked

        with ThreadPoolExecutor(max_workers=len(algos) if device.startswith("cuda") else 1) as pool:
            return list(pool.map(check, algos))


def acting_parity(device: str) -> dict:
    """ppo's Gaussian acting step compiled (and captured on CUDA) against eager: the same actions and
    log-probs from the same generator state (inductor's fallback_random)."""
    import torch._inductor.config
    from tensordict.nn import CudaGraphModule

    from common.envs import make_env

    ppo = load_script("ppo")
    envs = make_env("Pendulum-v1", 256, device=device, seed=1)
    obs, _ = envs.reset()
    agent = ppo.Agent(obs["policy"].shape[-1], None, envs.single_action_space, ppo.Args()).to(device)
    act = lambda o: agent.act(o)  # noqa: E731
    fast = torch.compile(act)
    if device.startswith("cuda"):
        fast = CudaGraphModule(fast, warmup=3)
    results = []
    with torch.no_grad(), torch._inductor.config.patch(fallback_random=True):
        for fn in (act, fast):
            torch.manual_seed(0)
            results.append([tuple(t.clone() for t in fn(obs)) for _ in range(5)])
    diffs = [max((x - y).abs().max().item() for x, y in zip(a, b)) for a, b in zip(*results)]
    return {"status": "ok" if max(diffs) < 1e-5 else "differs", "max_abs_diff": max(diffs),
            "captured": device.startswith("cuda")}


# ----------------------------------------------------------------------------------------------
# 1, 3, 4: tests, torchrun, speed
# ----------------------------------------------------------------------------------------------
def section_tests(cuda: bool, timeout: float) -> dict:
    if not cuda:
        out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "cuda", "-p", "no:cacheprovider"],
                             cwd=ROOT, capture_output=True, text=True, env=subprocess_env())
        return {"status": "skipped", "error": "needs CUDA", "tests": [ln for ln in out.stdout.splitlines() if "::" in ln]}
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        rc, output = bench.run_command([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider",
                                        f"--junitxml={xml}"], timeout, subprocess_env())
        counts = {k: int(v) for k, v in re.findall(r'(tests|failures|errors|skipped)="(\d+)"', xml.read_text())[:4]} \
            if xml.exists() else {}
        failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.M)
    return {"status": "ok" if rc == 0 else "failed", "returncode": rc, "counts": counts, "failed": failed,
            "tail": output.splitlines()[-1] if output else ""}


def section_torchrun(device: str, num_envs: int, timeout: float) -> dict:
    """ppo under torchrun with one rank: the distributed paths, then the NaN guard's exit."""
    cuda = device.startswith("cuda")
    out = {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1", "--master-addr=127.0.0.1"]
        flags = ["--device", device, "--num-envs", str(num_envs), "--num-steps", "16", "--output-dir", tmp,
                 "--no-progress", "--log-interval", "2", "--eval-interval", "4", "--save-interval", "4",
                 "--num-eval-envs", "16"]
        cmd = [*launch, f"--master-port={free_port()}", "algos/ppo.py", *flags, "--run-name", "sync",
               "--total-timesteps", str(12 * 16 * num_envs)]
        t0 = time.time()
        rc, output = bench.run_command(cmd, timeout, subprocess_env())
        summary_path = Path(tmp) / "sync" / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        ok = rc == 0 and summary.get("params_in_sync") is True and summary.get("world_size") == 1
        out["distributed_paths"] = {"status": "ok" if ok else "failed", "seconds": time.time() - t0,
                                    "backend": "nccl" if cuda else "gloo", "compile": summary.get("compile"),
                                    "cudagraphs": summary.get("cudagraphs"),
                                    **({} if ok else {"error": bench.failure_reason(output), "returncode": rc})}
        # graphs on, compile off (its time buys nothing here): the update graph holds the all-reduces
        nan = [*launch, f"--master-port={free_port()}", "tests/nan_launch.py", str(3 * 16 + 1), "algos/ppo.py", *flags,
               "--run-name", "nan", "--total-timesteps", str(12 * 16 * num_envs), "--compile", "False",
               "--cudagraphs", str(cuda)]
        t0 = time.time()
        rc, output = bench.run_command(nan, min(timeout, 300), subprocess_env())
        seconds = time.time() - t0
        guarded = rc not in (0, None) and "FloatingPointError: non-finite" in output and "warning: closing the run" not in output
        out["nan_guard_exit"] = {"status": "ok" if guarded else "failed", "seconds": seconds, "returncode": rc,
                                 **({} if guarded else {"error": bench.failure_reason(output)})}
    return out


def section_speed(device: str, timeout: float, iterations: int) -> list[dict]:
    rows = []
    for env_id, num_envs, algos in SPEED_ROWS:
        row = {"env_id": env_id, "num_envs": num_envs,
               "env_only_sps": bench.measure_env_only(env_id, num_envs, torch.device(device))["sps"], "runs": []}
        for algo in algos:
            args_cls = load_script(algo).Args
            for mode in SPEED_MODES:
                record = bench.run_training(algo, args_cls, env_id, num_envs, device, mode, iterations, 1, timeout=timeout)
                row["runs"].append({k: record.get(k) for k in ("algo", "mode", "status", "sps", "rollout_seconds",
                                                               "update_seconds", "peak_memory_mb", "process_seconds",
                                                               "error", "command")})
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------
def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [f"# GPU check, {report['date']}", "",
             f"{bench.machine_label(m)}; torch {m['torch']}, tensordict {report['tensordict']}; "
             f"{report['seconds']:.0f} s in all. Verdict: **{report['verdict']}**", ""]
    if report["skipped"]:
        lines += ["Skipped (needs a GPU): " + "; ".join(report["skipped"]), ""]
    tests = report.get("tests")
    if tests:
        lines += ["## CUDA tests", ""]
        if tests["status"] == "skipped":
            lines += [f"skipped ({tests['error']}): {len(tests['tests'])} tests: " + ", ".join(tests["tests"]), ""]
        else:
            lines += [f"{tests['status']}: {tests['tail']}", *[f"- failed: {t}" for t in tests["failed"]], ""]
    if report.get("checks"):
        lines += ["## Every script at its defaults: host syncs, recompiles, parity with eager", "",
                  "| script | run | syncs between log points | recompiles after warm-up | parity after iteration 5 | seconds |",
                  "|---|---|---|---|---|---|"]
        for r in report["checks"]:
            run = r["status"] if r["status"] == "ok" else f"failed: {r.get('error')} at {r.get('at')}"
            p = r["parity"]
            par = p["status"] + (f" (max abs diff {p['max_abs_diff']:.2g} in {p['worst_tensor']})" if "max_abs_diff" in p else
                                 f" ({p.get('error')})" if p.get("error") else "")
            lines.append(f"| {r['algo']} | {run} | {len(r.get('syncs', []))} {'; '.join(r.get('syncs', [])[:3])} | "
                         f"{len(r.get('recompiles', []))} {', '.join(r.get('recompiles', []))} | {par} | {r['seconds']:.0f} |")
        a = report["acting_parity"]
        lines += ["", f"ppo's acting step, compiled{' and captured' if a['captured'] else ''} against eager: "
                      f"{a['status']} (max abs diff {a['max_abs_diff']:.2g})", ""]
    if report.get("torchrun"):
        t = report["torchrun"]
        lines += ["## torchrun, one rank", ""]
        for name, r in t.items():
            lines.append(f"- {name}: {r['status']} in {r['seconds']:.0f} s" + (f" ({r['error']})" if r.get("error") else ""))
        lines.append("")
    if report.get("speed"):
        lines += ["## Speed (steady state, each run alone in its own process)", "",
                  "| env | num_envs | env only SPS | script | mode | SPS | x env only | rollout s | update s | peak MB |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for row in report["speed"]:
            for r in row["runs"]:
                sps = r.get("sps")
                x = f"{sps / row['env_only_sps']:.2f}" if sps else "-"
                lines.append(f"| {row['env_id']} | {row['num_envs']} | {row['env_only_sps']:,.0f} | {r['algo']} | {r['mode']} | "
                             + (f"{sps:,.0f} | {x} | {bench.fmt(r.get('rollout_seconds'), '.4f')} | "
                                f"{bench.fmt(r.get('update_seconds'), '.4f')} | {bench.fmt(r.get('peak_memory_mb'))} |"
                                if r["status"] == "ok" else f"failed: {r.get('error')} | | | | |"))
        lines.append("")
    return "\n".join(lines)


def verdict(report: dict) -> str:
    bad = []
    if report.get("tests", {}).get("status") == "failed":
        bad.append("CUDA tests")
    for r in report.get("checks", []):
        if r["status"] != "ok" or r.get("syncs") or r.get("recompiles") or r["parity"]["status"] not in ("ok", "skipped"):
            bad.append(f"checks of {r['algo']}")
    if report.get("acting_parity", {}).get("status") == "differs":
        bad.append("acting parity")
    bad += [f"torchrun {k}" for k, r in report.get("torchrun", {}).items() if r["status"] != "ok"]
    bad += [f"speed {r['algo']} {r['mode']}" for row in report.get("speed", []) for r in row["runs"] if r["status"] != "ok"]
    return "all passed" if not bad else "failed: " + ", ".join(bad)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/gpu_check", help="directory of gpu_check.md and gpu_check.json")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--device", default=None, help="default: cuda if there is one, else cpu")
    parser.add_argument("--algos", nargs="+", default=None, help="scripts of the checks (default: all in algos/)")
    parser.add_argument("--iterations", type=int, default=20, help="iterations of each checked run")
    parser.add_argument("--num-envs", type=int, default=None, help="envs of the checked runs (default: each script's)")
    parser.add_argument("--speed-iterations", type=int, default=3,
                        help="timed log intervals of each speed run, after one of warm-up (compile and capture)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one process may take")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        print(MARKER + json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    import tensordict

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    algos = args.algos or sorted(bench.discover_algos(None)[0])
    report = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": bench.machine_info(torch.device(device)),
              "tensordict": tensordict.__version__, "device": device, "skipped": [], "command":
              " ".join(["python -m tests.benchmarks.gpu_check", *(argv if argv is not None else sys.argv[1:])])}
    t_all = time.time()
    log = lambda msg: print(f"[gpu_check] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    # The correctness sections side by side on a GPU (their time is mostly compiling, on the CPU's
    # cores); the speed table after them, each of its runs alone on the GPU.
    jobs = {"tests": lambda: section_tests(cuda, 3 * args.timeout),
            "checks": lambda: section_checks(device, algos, args.iterations, args.num_envs, args.timeout),
            "torchrun": lambda: section_torchrun(device, 4096 if cuda else 64, args.timeout)}
    jobs = {name: job for name, job in jobs.items() if name in args.sections}
    log(f"{', '.join(jobs)} on {device}{' side by side' if cuda else ''}")
    with ThreadPoolExecutor(max_workers=len(jobs) if cuda else 1) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        report.update({name: f.result() for name, f in futures.items()})
    if "checks" in report:
        report["acting_parity"] = acting_parity(device)
    if not cuda:
        if "tests" in report:
            report["skipped"].append(f"the {len(report['tests']['tests'])} CUDA tests")
        if "checks" in report:
            report["skipped"].append("sync debug mode, recompile counts and parity with eager of the compiled and "
                                     "captured runs (here: the iterations eager, with the host-sync recorder)")
        if "torchrun" in report:
            report["skipped"].append("NCCL and captured all-reduces (here: gloo, eager)")
    if "speed" in args.sections:
        if cuda:
            log("speed table")
            report["speed"] = section_speed(device, args.timeout, args.speed_iterations)
        else:
            report["skipped"].append("the speed table")
    report["seconds"] = time.time() - t_all
    report["verdict"] = verdict(report)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(report)
    (out / "gpu_check.md").write_text(text + "\n")
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    print(text)
    print(f"report: {out / 'gpu_check.md'} and {out / 'gpu_check.json'}")
    return 0 if report["verdict"] == "all passed" else 1


if __name__ == "__main__":
    sys.exit(main())
