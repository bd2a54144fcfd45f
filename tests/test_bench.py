"""tests/benchmarks/bench.py runs end to end at tiny sizes and reports every field. Functional only: no figure
is compared with a speed (speed claims come from running the benchmark, never from a test)."""

import importlib.util
import json
import math
import re
import statistics
from pathlib import Path

import pytest
import torch

from tests.benchmarks import bench
from tests.benchmarks.bench import steady_state


def positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.fixture
def run_bench(capsys):
    """bench.main in this process (the training runs are still subprocesses): no second interpreter
    start-up, which is most of a tiny benchmark's time. Returns (exit code, stdout)."""
    threads = torch.get_num_threads()

    def run(argv):
        try:
            code = bench.main(argv)
        finally:
            torch.set_num_threads(threads)
        return code, capsys.readouterr().out

    return run


def test_bench_smoke_json(tmp_path, run_bench):
    out = tmp_path / "bench.json"
    code, stdout = run_bench(
        [
            "--env-id",
            "Pendulum-v1",
            "--num-envs",
            "64",
            "--algos",
            "ppo",
            "--modes",
            "eager",
            "--iterations",
            "2",
            "--warmup-iterations",
            "1",
            "--env-steps",
            "5",
            "--repeats",
            "1",
            "--threads",
            "1",
            "--json",
            str(out),
            "--markdown",
        ]
    )
    assert code == 0, stdout[-3000:]
    report = json.loads(out.read_text())

    assert report["date"] and report["commands"]["benchmark"].startswith("python -m tests.benchmarks.bench")
    machine = report["machine"]
    assert machine["cpu"] and machine["cpu_cores"] >= 1 and machine["torch"]
    assert "gpu" in machine and len(report["load_average"]["start"]) == 3
    assert report["config"] == {
        **report["config"],
        "env_id": "Pendulum-v1",
        "num_envs": 64,
        "modes": ["eager"],
        "algos": ["ppo"],
    }

    assert positive(report["env_only"]["sps"])
    inference = report["inference"]["eager"]
    assert positive(inference["sps"]) and positive(inference["ratio_to_env_only"])
    network = report["network"]["eager"]
    assert positive(network["rollout_inference_seconds"]) and positive(network["bare_fwd_bwd_seconds"])
    assert network["passes"] > 0 and network["minibatch_size"] > 0

    [ppo] = report["training"]
    assert ppo["algo"] == "ppo" and ppo["mode"] == "eager" and ppo["status"] == "ok", ppo
    assert ppo["measured_iterations"] == 2
    for key in (
        "sps",
        "sps_including_warmup",
        "rollout_seconds",
        "update_seconds",
        "iteration_seconds",
        "peak_memory_mb",
        "ratio_to_env_only",
        "ratio_to_inference",
        "update_over_rollout_inference",
        "update_over_bare_fwd_bwd",
    ):
        assert positive(ppo[key]), (key, ppo[key])
    assert ppo["speedup_vs_eager"] == 1.0
    assert ppo["command"].startswith("python algos/ppo.py") and ppo["command"] in report["commands"]["training"]
    assert 0 < ppo["rollout_fraction"] + ppo["update_fraction"] <= 1.0 + 1e-9

    # the table and the README rows
    assert "ppo training" in stdout and "env only" in stdout
    rows = [line for line in stdout.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| machine | env | num_envs | mode | SPS |")
    assert any("ppo training, eager" in r for r in rows[2:])


def test_bench_reports_absent_scripts_without_failing_the_others(tmp_path, run_bench):
    out = tmp_path / "bench.json"
    code, stdout = run_bench(
        [
            "--num-envs",
            "16",
            "--algos",
            "no_such_algo",
            "--modes",
            "eager",
            "--env-steps",
            "2",
            "--repeats",
            "1",
            "--threads",
            "1",
            "--skip-training",
            "--json",
            str(out),
        ]
    )
    assert code == 0, stdout[-3000:]
    report = json.loads(out.read_text())
    assert report["config"]["algos"] == [] and report["training"] == []
    assert any("no_such_algo" in note for note in report["notes"])


def test_steady_state_window_leaves_out_the_warmup():
    # Three iterations of 100 steps: the first takes 10 s (compilation), the next two 1 s each.
    events = {
        "charts/SPS": [(10.0, 100, 0.0), (11.0, 200, 0.0), (12.0, 300, 0.0)],
        "charts/rollout_seconds": [(10.0, 100, 3.0), (11.0, 200, 0.25), (12.0, 300, 0.25)],
        "charts/update_seconds": [(10.0, 100, 7.0), (11.0, 200, 0.5), (12.0, 300, 0.5)],
    }
    s = steady_state(events, warmup=1)
    assert s["sps"] == 100.0 and s["measured_iterations"] == 2
    assert s["rollout_seconds"] == 0.25 and s["update_seconds"] == 0.5 and s["other_seconds"] == 0.25
    assert steady_state({"charts/SPS": events["charts/SPS"][:1]}, warmup=1) is None
    # A run that logs every 4 iterations of 25 steps: an event covers 4 iterations, its phase
    # seconds are their means, and the figures are per iteration.
    events = {
        "charts/SPS": events["charts/SPS"],
        "charts/rollout_seconds": [(10.0, 100, 2.0), (11.0, 200, 0.05), (12.0, 300, 0.05)],
        "charts/update_seconds": [(10.0, 100, 5.0), (11.0, 200, 0.15), (12.0, 300, 0.15)],
    }
    s = steady_state(events, warmup=1, iterations_per_event=4)
    assert s["sps"] == 100.0 and s["measured_iterations"] == 8 and s["iteration_seconds"] == 0.25
    assert s["other_seconds"] == pytest.approx(0.05) and s["rollout_sps"] == pytest.approx(25 / 0.05)


def test_bench_prints_the_bytes_of_a_pixel_rollout_as_uint8(tmp_path, capsys):
    """--storage-bytes: 4096 envs x 128 steps of 84x84x4 frames (one frame of 28,224 bytes, plus 22 bytes of
    V(final_obs), actions, log-probs, rewards and flags per transition: no second frame for the time-out
    bootstrap) as the storage keeps them (uint8), a quarter of the frames' float32 bytes; 13.8 GiB in all."""
    assert bench.main(["--storage-bytes", "--json", str(tmp_path / "bytes.json")]) == 0
    out = capsys.readouterr().out
    per = 4 * 84 * 84 + 4 + 8 + 4 + 4 + 1 + 1
    assert (
        f"4096 envs x 128 steps of 4x84x84 frames (obs, and V(final_obs) for the bootstrap) as uint8: {per:,} bytes "
        f"per transition, {per * 4096 * 128:,} bytes (13.79 GiB)" in out
    )
    figures = json.loads((tmp_path / "bytes.json").read_text())
    assert figures["float32"]["bytes_per_transition"] == 4 * 4 * 84 * 84 + 22


def test_learning_results_command_writes_curves_table_and_figures(tmp_path):
    """tests/benchmarks/learning.py end to end at a tiny budget: two seeds of one experiment, each run
    told to stop at the experiment's target (--stop-at-target)."""
    from tests.benchmarks import learning

    threads = torch.get_num_threads()
    try:
        code = learning.main(
            [
                "--experiments",
                "ppo:CartPole-v1",
                "--seeds",
                "1",
                "2",
                "--jobs",
                "2",
                "--budget",
                str(4096 * 24 * 2),
                "--out",
                str(tmp_path),
                "--stop-at-target",
                "--extra",
                "--eval-interval",
                "1",
            ]
        )
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    report = json.loads((tmp_path / "learning.json").read_text())
    runs = report["runs"]
    assert sorted(r["seed"] for r in runs) == [1, 2] and report["command"].startswith(
        "python -m tests.benchmarks.learning"
    )
    for r in runs:
        curve = r["curve"]
        assert curve["steps"] == [4096 * 24, 4096 * 24 * 2]  # an eval every iteration
        assert len(curve["returns"]) == len(curve["seconds"]) == 2 and 0 < curve["seconds"][0] < curve["seconds"][1]
        assert r["summary"]["global_step"] == 4096 * 24 * 2  # not reached at this budget: every step ran
        assert "--target-return 475.0" in r["command"]
    assert runs[0]["curve"]["returns"] != runs[1]["curve"]["returns"]  # two seeds, two runs
    table = (tmp_path / "learning.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| ppo | CartPole-v1"))
    final = [r["curve"]["returns"][-1] for r in runs]
    assert f"{sum(final) / 2:,.1f} ±" in row and "196,608" in row
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "learning_steps.png").stat().st_size > 0 and (
            tmp_path / "learning_time.png"
        ).stat().st_size > 0


def test_at_steps_table_reads_each_seed_at_the_first_eval_at_or_after_the_step():
    """The gymnasium-MuJoCo rows: each seed's eval return at 100k/250k/500k/1M (the first evaluation at or
    after), mean ± std, the published reference, and wall minutes per million steps."""
    from tests.benchmarks import learning

    name = "td3:gym:Hopper-v5"
    spec = learning.EXPERIMENTS[name]
    assert spec["reference"] == 3134.61 and spec["target"] == 2821.1 and spec["budget"] == 1_000_000
    steps = [50_016 * k for k in range(1, 20)] + [1_000_000]
    records = [
        {
            "name": name,
            "seed": seed,
            "curve": {
                "steps": steps,
                "seconds": [x / 1000 for x in steps],
                "returns": [seed * 1000 + i for i in range(len(steps))],
            },
        }
        for seed in (2, 1)
    ]
    rows = learning.at_steps_table(records, ["ppo:CartPole-v1", name])
    assert len(rows) == 3 and rows[0].count("eval at") == 4  # only the experiment with at_steps gets a row
    cells = [c.strip() for c in rows[2].split("|")[1:-1]]

    def cell(indices: list[int], seeds=(1, 2)) -> str:  # the seeds' mean over these evaluations, "-" for None
        mean = statistics.mean(indices)
        values = [None if seed is None else seed * 1000 + mean for seed in seeds]
        got = [v for v in values if v is not None]
        return (
            f"{statistics.mean(got):,.1f} ± {statistics.pstdev(got):,.1f} ("
            + " / ".join("-" if v is None else f"{v:,.0f}" for v in values)
            + ")"
        )

    # each step's evaluations from 0.8 x the step to the first at or after it: 100k -> 100,032 (index 1); 250k ->
    # 200,064 and 250,080 (3, 4); 500k -> 400,128 to 500,160 (7-9); 1M -> 800,256 to the last (15-19)
    assert cells[:2] == ["td3", "gym:Hopper-v5"]
    assert cells[2:6] == [cell([1]), cell([3, 4]), cell([7, 8, 9]), cell([15, 16, 17, 18, 19])]
    assert cells[6] == "3,135" and cells[7].startswith("16.7 ")  # 1,000 s per 1M steps
    for r in records:  # a run that ended an iteration short of its budget of 1M: its last evaluations are the 1M ones
        r.update(budget=1_000_000, curve={k: v[:-1] for k, v in r["curve"].items()})
    assert [c.strip() for c in learning.at_steps_table(records, [name])[2].split("|")[1:-1]][5] == cell(
        [15, 16, 17, 18]
    )
    records[0]["summary"] = {"stop_reason": "SIGTERM"}  # stopped before its budget: no eval at 1M for that seed
    assert [c.strip() for c in learning.at_steps_table(records, [name])[2].split("|")[1:-1]][5] == cell(
        [15, 16, 17, 18], seeds=(1, None)
    )
    del records[0]["summary"]
    for r in records:
        r["name"] = name + "@n1"
    assert [c.strip() for c in learning.at_steps_table(records, [name + "@n1"])[2].split("|")[1:-1]][
        1
    ] == "gym:Hopper-v5@n1"


def test_the_eval_return_of_a_table_is_the_mean_of_the_last_fifth_of_each_run():
    """One evaluation swings from the next: the table's eval return is each seed's mean over its evaluations in the
    last fifth of its env steps (from 0.8 x its last evaluation's steps), then mean ± std over the seeds, with the
    number of seeds that finished beside it."""
    from tests.benchmarks import learning

    steps = list(range(10, 101, 10))
    records = [
        {
            "name": "ppo:CartPole-v1",
            "seed": seed,
            "budget": 100,
            "summary": {},
            "steps_to_target": None,
            "seconds_to_target": None,
            "curve": {"steps": steps, "seconds": steps, "returns": returns},
        }
        for seed, returns in ((1, [0.0] * 7 + [100.0, 300.0, 200.0]), (2, [0.0] * 7 + [300.0, 100.0, 400.0]))
    ]
    records.append({"name": "ppo:CartPole-v1", "seed": 3, "budget": 100, "error": "failed"})
    row = learning.table(records, ["ppo:CartPole-v1"], [1, 2, 3])[2]
    cells = [c.strip() for c in row.split("|")[1:-1]]
    # seed 1: the evaluations at 80, 90, 100 (>= 0.8 x 100): 200.0; seed 2: 266.7
    assert cells[4:6] == ["2 (1 failed)", "0/2"]
    assert cells[8] == f"{(200 + 800 / 3) / 2:,.1f} ± {(800 / 3 - 200) / 2:,.1f}" and cells[9] == "350.0 ± 50.0"


def test_training_seconds_leave_out_the_time_a_stopped_run_waits_for_its_resume(tmp_path):
    """A run stopped by a signal at 10,000 steps and resumed 3,900 s later writes a second events file: the eval
    curve's training seconds count each segment from its start (the first from step 0 by its SPS, the resumed one a
    log interval before its first SPS event), not the wait between them; so does the wall minutes per 1M steps."""
    from torch.utils.tensorboard import SummaryWriter

    from tests.benchmarks import learning

    for n, (t0, first, last) in enumerate([(1000.0, 0, 10_000), (5000.0, 10_000, 20_000)]):
        part = tmp_path / f"part{n}"
        writer = SummaryWriter(str(part))
        for step in range(first + 1000, last + 1, 1000):  # 100 steps/s from the segment's start
            writer.add_scalar("charts/SPS", 100.0, step, walltime=t0 + (step - first) / 100)
            if step % 5000 == 0:
                writer.add_scalar("eval/episodic_return", step / 1000, step, walltime=t0 + (step - first) / 100)
        writer.close()
        (events,) = part.glob("events.out.tfevents.*")
        name = events.name.split(".")
        events.rename(tmp_path / ".".join([*name[:3], str(int(t0)), *name[4:]]))  # its segment's creation time
    curve = learning.read_curve(tmp_path)
    assert curve["steps"] == [5000, 10_000, 15_000, 20_000] and curve["returns"] == [5.0, 10.0, 15.0, 20.0]
    assert curve["seconds"] == pytest.approx([50.0, 100.0, 150.0, 200.0])
    record = {
        "name": "ppo:envpool:Pong-v5",
        "seed": 1,
        "budget": 10_000_000,
        "curve": curve,
        "summary": {"stop_reason": "signal:SIGTERM"},
    }
    row = learning.at_steps_table([record], ["ppo:envpool:Pong-v5"])[2]
    assert row.split("|")[-2].strip().startswith(f"{200 / 20_000 * 1e6 / 60:.1f}")  # 166.7 min per 1M steps


def test_the_training_return_is_read_in_bins_of_env_steps_and_tabled_at_the_steps(tmp_path):
    """Pong's training curve (what CleanRL plots): charts/episodic_return read from the events as the mean of each
    100,000 env steps' logged values, at the bin's end; the table gives the bin ending at or after each at-step, "-"
    for a run not there yet; an experiment without train_bin keeps no training curve."""
    from torch.utils.tensorboard import SummaryWriter

    from tests.benchmarks import learning

    name = "ppo:envpool:Pong-v5"
    assert learning.EXPERIMENTS[name]["train_bin"] == 100_000 and learning.EXPERIMENTS[name]["at_steps"][0] == 500_000
    writer = SummaryWriter(str(tmp_path))
    for step in range(0, 1_000_001, 25_000):  # -21 up to 500k, then step / 50k - 31: -20.5 at 525k, ... -11 at 1M
        writer.add_scalar("charts/SPS", 100.0, max(step, 1))
        writer.add_scalar("charts/episodic_return", -21.0 if step <= 500_000 else step / 50_000 - 31, step)
    writer.close()
    curve = learning.read_curve(tmp_path, 100_000)
    assert curve["train_steps"][:2] == [0, 100_000] and curve["train_steps"][-1] == 1_000_000
    assert curve["train_returns"][5] == -21.0  # 425k..500k
    assert curve["train_returns"][-1] == statistics.mean(
        [s / 50_000 - 31 for s in (925_000, 950_000, 975_000, 1_000_000)]
    )
    assert "train_returns" not in learning.read_curve(tmp_path)
    short = {k: v[:6] for k, v in curve.items() if k.startswith("train_")}  # up to 500k
    records = [
        {"name": name, "seed": 2, "curve": {**curve, "steps": [], "returns": []}},
        {"name": name, "seed": 1, "curve": {"steps": [], "returns": [], **short}},
    ]
    rows = learning.train_table(records, ["ppo:CartPole-v1", name])
    assert len(rows) == 3 and rows[0].count("training return at") == 4
    cells = [c.strip() for c in rows[2].split("|")[1:-1]]
    assert cells[:3] == ["ppo", "envpool:Pong-v5", "-21.0 ± 0.0 (-21.0 / -21.0)"]
    assert cells[3] == f"{curve['train_returns'][-1]:.1f} ± 0.0 (- / {curve['train_returns'][-1]:.1f})" and cells[
        4:
    ] == ["-", "-"]


def test_symmetry_table_gives_each_seeds_steps_and_last_symmetry_error():
    """ppo --symmetry rows: steps to target and the last charts/symmetry_error per seed, in seed order; the runs
    that logged no symmetry error (ppo without --symmetry) get no row."""
    from tests.benchmarks import learning

    records = [
        {
            "name": "ppo:Pendulum-v1@augmentation",
            "seed": seed,
            "steps_to_target": steps,
            "curve": {"steps": [1], "returns": [0.0], "symmetry_error": error},
        }
        for seed, steps, error in ((2, None, 0.05), (1, 983_040, 0.01))
    ]
    records.append(
        {"name": "ppo:Pendulum-v1", "seed": 1, "steps_to_target": 1, "curve": {"steps": [1], "returns": [0.0]}}
    )
    rows = learning.symmetry_table(records, ["ppo:Pendulum-v1", "ppo:Pendulum-v1@augmentation"])
    assert len(rows) == 3
    assert [c.strip() for c in rows[2].split("|")[1:-1]] == [
        "ppo",
        "Pendulum-v1",
        "`augmentation`",
        "983,040 / -",
        "0.030 ± 0.020 (0.010 / 0.050)",
    ]
    assert learning.symmetry_table(records[2:], ["ppo:Pendulum-v1"]) == []


def test_goal_table_gives_each_seeds_first_eval_above_the_goal():
    """MountainCar-v0's rows: the steps of each seed's first eval return above -200 (an episode reached the flag);
    a seed that never got there is '-', and then the row has no median."""
    from tests.benchmarks import learning

    name = "ppo:MountainCar-v0"
    assert learning.EXPERIMENTS[name]["goal"] == -200.0
    records = [
        {"name": name, "seed": 2, "curve": {"steps": [10, 20, 30], "returns": [-200.0, -200.0, -150.0]}},
        {"name": name, "seed": 1, "curve": {"steps": [10, 20, 30], "returns": [-200.0, -199.5, -120.0]}},
    ]
    rows = learning.goal_table(records, ["ppo:CartPole-v1", name])
    assert len(rows) == 3 and [c.strip() for c in rows[2].split("|")[1:-1]] == [
        "ppo",
        "MountainCar-v0",
        "-200",
        "25 (20 / 30)",
    ]
    records[0]["curve"]["returns"][-1] = -200.0
    assert learning.goal_table(records, [name])[2].split("|")[4].strip() == "- (20 / -)"


def committed_files() -> dict:
    from tests.benchmarks import learning

    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in learning.COMMITTED.rglob("*") if p.is_file()}


def test_collapse_names_the_step_a_critic_diverged_and_a_saturated_actor():
    """tests/benchmarks/collapse.py: a mean Q that climbs smoothly (even 20-fold over a run) is no divergence, one that
    leaps 10-fold within ten logs is, at its step; an actor whose pre-tanh outputs are large acts at the bounds."""
    from tests.benchmarks.collapse import actor_at_the_end, first_jump

    climb = [(1000 * i, 10.0 + 2.0 * i) for i in range(100)]  # 10 -> 208
    assert first_jump(climb, 10.0) is None
    leap = [*climb[:60], (60_000, 3_000.0), *climb[61:]]
    assert first_jump(leap, 10.0) == 60_000
    envs, capacity, dims, actions = 2, 8, 3, 2
    generator = torch.Generator().manual_seed(0)
    buffer = {
        "ptr": 5,
        "size": capacity,
        "capacity": capacity,
        "data": {"obs.policy": torch.randn(envs, capacity, dims, generator=generator)},
    }
    model = {
        "actor.0.0.weight": torch.randn(4, dims, generator=generator),
        "actor.0.0.bias": torch.zeros(4),
        "actor.0.2.weight": torch.randn(actions, 4, generator=generator),
        "actor.0.2.bias": torch.full((actions,), 100.0),
        "action_scale": torch.ones(actions),
    }
    args = {"obs_norm": False, "hidden_sizes": (4,)}
    checkpoint = {"args": args, "ranks": [{"buffer": buffer}], "model": model}
    saturated = actor_at_the_end(checkpoint, steps=4)
    assert saturated["observations"] == envs * 4 and saturated["share of actions within 1% of a bound"] == 1.0
    assert saturated["mean sum of squared actions"] == pytest.approx(actions)
    model["actor.0.2.bias"].zero_()
    model["actor.0.2.weight"].mul_(1e-3)
    assert actor_at_the_end(checkpoint, steps=4)["share of actions within 1% of a bound"] == 0.0
    assert actor_at_the_end({**checkpoint, "args": {**args, "obs_norm": True}}, steps=4).startswith("left out")


def test_learning_results_command_writes_only_where_named(tmp_path, capsys):
    """No default directory, and the committed results (what the README shows) are rewritten only
    with --update-committed: the command stops with the cause before any run or any write."""
    from tests.benchmarks import learning

    before = committed_files()
    for argv, cause in (
        (["--experiments", "ppo:CartPole-v1"], "--out DIR is required"),
        (["--experiments", "ppo:CartPole-v1", "--out", str(learning.COMMITTED)], "holds the committed results"),
        (["--out", str(learning.COMMITTED / "fast")], "pass --update-committed to rewrite them"),
        (["--report", str(learning.COMMITTED / "learning.json")], "holds the committed results"),
    ):
        with pytest.raises(SystemExit) as stop:
            learning.main(argv)
        assert stop.value.code == 2 and cause in capsys.readouterr().err
    assert committed_files() == before
    # a --report of the committed learning.json into a directory named: the same table, written there
    code = learning.main(["--report", str(learning.COMMITTED / "learning.json"), "--out", str(tmp_path)])
    assert code == 0 and committed_files() == before
    written = (tmp_path / "learning.md").read_text().split("\n\n![")[0].split("\n\n(no figures")[0]
    assert written == (learning.COMMITTED / "learning.md").read_text().split("\n\n![")[0]
    with pytest.raises(SystemExit) as stop:  # one --out for several reports would write them over each other
        learning.main(["--report", str(learning.COMMITTED), "--out", str(tmp_path)])
    assert stop.value.code == 2 and "--out takes one learning.json" in capsys.readouterr().err


def test_the_committed_results_document_and_summary_are_the_report_commands_output(tmp_path, monkeypatch):
    """`--report tests/benchmarks/results --update-committed --no-figures` over a copy of the committed results
    writes every learning.md, the results document and the README's summary byte for byte as committed: the
    committed text is the command's output from the committed learning.json files, nothing written by hand."""
    import shutil

    from tests.benchmarks import learning

    copy, readme = tmp_path / "results", tmp_path / "README.md"
    shutil.copytree(learning.COMMITTED, copy)
    shutil.copy(learning.README, readme)
    for path in [*copy.rglob("learning.md"), copy / "README.md"]:
        path.write_text("stale\n")
    readme.write_text(learning.with_readme_block(readme.read_text(), "\n".join(learning.MARKERS)))
    monkeypatch.setattr(learning, "COMMITTED", copy)
    monkeypatch.setattr(learning, "DOCUMENT", copy / "README.md")
    monkeypatch.setattr(learning, "README", readme)
    assert learning.main(["--report", str(copy), "--update-committed", "--no-figures"]) == 0
    committed = {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    assert committed == {
        p.relative_to(learning.ROOT / "tests/benchmarks/results"): p.read_bytes()
        for p in (learning.ROOT / "tests/benchmarks/results").rglob("*")
        if p.is_file()
    }
    assert readme.read_bytes() == (learning.ROOT / "README.md").read_bytes()


def test_the_results_document_names_every_committed_folder_and_links_what_exists():
    """Every committed results folder has a section; the summary's rows, the folders' descriptions and the notes
    name experiments and folders that are committed; every link of the summary is a heading of the document."""
    from tests.benchmarks import learning

    reports = dict(learning.committed_reports())
    document = learning.DOCUMENT.read_text()
    headings = {learning.anchor(line[3:]) for line in document.splitlines() if line.startswith("## ")}
    assert {learning.anchor(learning.title_of(folder)) for folder in reports} <= headings
    assert set(learning.FOLDERS) <= set(reports)
    for folder, name in learning.HEADLINES:
        assert name in reports[folder]["experiments"], (folder, name)
    assert all(any(name in r["experiments"] for r in reports.values()) for name in learning.NOTES)
    summary = [line for line in learning.readme_block(list(reports.items())).splitlines() if line.startswith("|")]
    assert len(summary) == 2 + len(learning.HEADLINES)
    for line in summary[2:]:
        assert line.split("](")[-1].split("#")[-1].rstrip(") |") in headings


def synthetic_report() -> dict:
    """A learning.json of two seeds of ppo:CartPole-v1, three evaluations each."""
    runs = [
        {
            "name": "ppo:CartPole-v1",
            "algo": "ppo",
            "env_id": "CartPole-v1",
            "seed": seed,
            "target": 475.0,
            "budget": 300,
            "threads": 1,
            "command": "python algos/ppo.py",
            "returncode": 0,
            "summary": {},
            "curve": {"steps": [100, 200, 300], "seconds": [1.0, 2.0, 3.0], "returns": returns},
            "steps_to_target": steps,
            "seconds_to_target": seconds,
        }
        for seed, returns, steps, seconds in (
            (1, [100.0, 480.0, 500.0], 200, 2.0),
            (2, [50.0, 300.0, 400.0], None, None),
        )
    ]
    return {
        "date": "2026-01-01",
        "command": "python -m tests.benchmarks.learning --out somewhere",
        "jobs": 1,
        "machine": {"cpu": "a CPU", "cpu_cores": 2, "torch": "2", "gpu": None},
        "wall_seconds": 1.0,
        "experiments": {"ppo:CartPole-v1": {"target": 475.0, "budget": 300, "flags": []}},
        "threads": 1,
        "runs": runs,
    }


def test_learning_report_rewrites_table_and_figures_with_a_legend(tmp_path, monkeypatch):
    """--report: the table and the figures from a learning.json, beside it by default; each figure has
    a legend saying that the line is the mean over seeds and the band their min-max."""
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    from tests.benchmarks import learning

    legends, savefig = {}, matplotlib.figure.Figure.savefig

    def recording_savefig(fig, path, *args, **kwargs):
        legends[Path(path).name] = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
        return savefig(fig, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", recording_savefig)
    (tmp_path / "learning.json").write_text(json.dumps(synthetic_report()))
    assert learning.main(["--report", str(tmp_path / "learning.json")]) == 0
    table = (tmp_path / "learning.md").read_text()
    assert table.startswith("`python -m tests.benchmarks.learning --out somewhere` (2026-01-01, a CPU (2 cores)")
    row = next(line for line in table.splitlines() if line.startswith("| ppo | CartPole-v1"))
    assert "| 2 | 1/2 | 200 (200-200) | 2.0 (2.0-2.0) | 450.0 ± 50.0 | 450.0 ± 50.0 |" in row
    assert legends == {
        "learning_steps.png": ["mean over seeds", "min-max over seeds", "target"],
        "learning_time.png": ["mean over seeds", "min-max over seeds", "target"],
    }
    for name in legends:
        assert (tmp_path / name).stat().st_size > 0 and f"]({name})" in table


def test_mjlab_benchmark_stops_with_the_cause_without_mjlab(monkeypatch):
    from tests.benchmarks import mjlab as mjlab_bench

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mjlab" else real(name, *a))
    with pytest.raises(
        SystemExit, match=r"^error: tests.benchmarks.mjlab needs mjlab, .*pip install 'mjlab==1\.6\.\*'"
    ):
        mjlab_bench.main(["--device", "cpu"])
    present = {"mjlab": object(), "rsl_rl": None}  # mjlab there, rsl_rl not
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: present[name] if name in present else real(name, *a)
    )
    with pytest.raises(SystemExit, match=r"^error: tests.benchmarks.mjlab needs rsl-rl-lib"):
        mjlab_bench.main(["--device", "cpu"])


@pytest.mark.slow
@pytest.mark.sims
@pytest.mark.skipif(importlib.util.find_spec("mjlab") is None, reason="needs mjlab")
def test_mjlab_benchmark_smoke(tmp_path, capsys):
    """tests/benchmarks/mjlab.py end to end on CPU at tiny sizes: every row measured, the table printed."""
    from tests.benchmarks import mjlab as mjlab_bench

    out = tmp_path / "mjlab.json"
    threads = torch.get_num_threads()
    try:
        code = mjlab_bench.main(
            [
                "--device",
                "cpu",
                "--task",
                "Mjlab-Cartpole-Balance",
                "--num-envs",
                "8",
                "--iterations",
                "2",
                "--warmup-iterations",
                "1",
                "--env-steps",
                "3",
                "--env-warmup-steps",
                "1",
                "--repeats",
                "1",
                "--threads",
                "1",
                "--json",
                str(out),
            ]
        )
    finally:
        torch.set_num_threads(threads)
    stdout = capsys.readouterr().out
    assert code == 0, stdout[-3000:]
    report = json.loads(out.read_text())
    assert [r["learner"] for r in report["env_only"]] == [
        "env only: mjlab (its auto-reset)",
        "env only: adapter, final_obs=terminal",
        "env only: adapter, final_obs=pre_step",
    ]
    assert all(positive(r["sps"]) for r in report["env_only"])
    learners = [r["learner"] for r in report["training"]]
    assert learners == ["algos/ppo.py, final_obs=terminal", "algos/ppo.py, final_obs=pre_step", "mjlab PPO (rsl_rl)"]
    for r in report["training"]:
        assert r["status"] == "ok", r
        for key in ("sps", "rollout_seconds", "update_seconds", "ratio_to_mjlab_ppo"):
            assert positive(r[key]), (r["learner"], key, r.get(key))
    assert "--hidden-sizes 64 64" in report["training"][0]["command"]  # the task's networks (Cartpole: 64, 64)
    rows = [line for line in stdout.splitlines() if line.startswith("| ")]
    assert (
        rows[0] == "| learner | SPS | rollout/collection s | update s | x mjlab PPO |" and len(rows) == 1 + 6
    )  # the header and six learners


@pytest.mark.slow
def test_gpu_check_runs_its_cpu_part_and_names_what_needs_a_gpu(tmp_path):
    """python -m tests.benchmarks.gpu_check without a GPU: ppo's and td3's iterations with the host-sync
    recorder and the Python-state check, the compiled acting step against eager and its own random
    numbers, torchrun with one rank (gloo) and its NaN-guard exit; the CUDA tests, the compiled runs
    and the speed sections listed as skipped. Beside the scripts, two copies of ppo.py with a mutation
    each (tests/helpers.py's MUTATIONS): today's scripts pass, and each copy fails, naming its captured
    function. The report is written as markdown and JSON."""
    import subprocess
    import sys

    from tests.benchmarks.gpu_check import ROOT
    from tests.helpers import mutated_ppo, subprocess_env

    if torch.cuda.is_available():
        pytest.skip("with a GPU the command runs its GPU part (minutes): run it by hand")
    out = tmp_path / "report"
    # one script of each loop: the command's own work (its sections, verdict and report) is the same for every script,
    # and every script's captured functions are held to the same checks by tests/test_scripts.py's contract tests
    scripts = ["ppo", "td3"]
    assert all((ROOT / "algos" / f"{script}.py").is_file() for script in scripts)
    copies = [str(mutated_ppo(tmp_path, mutation)) for mutation in ("tolist", "counter")]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.benchmarks.gpu_check",
            "--out",
            str(out),
            "--num-envs",
            "16",
            "--iterations",
            "12",
            "--algos",
            *scripts,
            *copies,
        ],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["verdict"] == "failed: checks" and (out / "gpu_check.md").read_text().startswith("# GPU check")
    sections = report["sections"]
    checks = {r["algo"]: r for r in sections["checks"]["result"]["scripts"]}
    assert sorted(checks) == sorted([*scripts, "ppo_tolist", "ppo_counter"])
    for algo in scripts:
        r = checks[algo]
        assert (
            r["status"] == "ok" and r["syncs"] == [] and r["python_state"] == [] and r["summary"]["iteration"] == 12
        ), r
    assert checks["ppo_tolist"]["syncs"] and all(
        re.fullmatch(r"tolist in \S+/ppo_tolist\.py:\d+ update_fn", s) for s in checks["ppo_tolist"]["syncs"]
    ), checks["ppo_tolist"]["syncs"]
    assert checks["ppo_tolist"]["python_state"] == [] and checks["ppo_counter"]["syncs"] == []
    assert checks["ppo_counter"]["python_state"][0].startswith("update: call 2 changes update_fn.<iterations_in_stats>")
    assert {f.split(":")[0] for f in sections["checks"]["failures"]} == {"ppo_tolist", "ppo_counter"}
    acting = sections["parity"]["result"]["acting"]
    assert [(a["part"], a["status"]) for a in acting] == [
        ("compiled against eager", "ok"),
        ("captured against eager", "skipped"),
        ("own random numbers", "ok"),
    ], acting
    assert sections["parity"]["status"] == sections["torchrun"]["status"] == "ok"
    assert {k: r["status"] for k, r in sections["torchrun"]["result"].items()} == {
        "distributed_paths": "ok",
        "nan_guard_exit": "ok",
    }
    assert sections["tests"]["status"] == "skipped" and len(sections["tests"]["result"]["tests"]) >= 10
    assert sum("speed" in s for s in report["skipped"]) == 2 and "speed" not in sections


def test_gpu_check_parts_fit_a_short_reservation(capsys):
    """Each of gpu_check's parts is expected within 9 minutes on one H100, together they hold every
    section once, and the plan a run prints lists its sections' expected minutes and the parts."""
    from tests.benchmarks import gpu_check

    assert sorted(s for part in gpu_check.PARTS for s in part) == sorted(gpu_check.SECTIONS)
    assert all(gpu_check.expected_minutes(part) <= 9 for part in gpu_check.PARTS)
    assert gpu_check.expected_minutes(gpu_check.SECTIONS) <= 20
    gpu_check.print_plan(list(gpu_check.SECTIONS), "gpu", "cuda")
    plan = capsys.readouterr().err
    for section, minutes in gpu_check.EXPECTED_MINUTES.items():
        assert re.search(rf"{re.escape(section)} +{minutes:4.1f} min on one H100", plan), plan
    for part in gpu_check.PARTS:
        assert f"--sections {' '.join(part)}   # about {gpu_check.expected_minutes(part):.1f} min" in plan


def test_gpu_check_parity_compares_the_same_plan_eager_and_compiled(tmp_path):
    """Both sides of gpu_check's parity take one plan (the same --total-timesteps and iterations):
    pqn, whose epsilon schedule depends on the total steps, run eagerly on both sides has every tensor of
    each numbered checkpoint (model, optimizer, normalizers, env and each rank's state) equal, from iteration 1
    to the last. A run planned for fewer total steps (what the eager side once was) anneals its learning rate on
    another schedule: judged, at iteration 2, where that schedule first differs (and the runs part there)."""
    from tests.benchmarks import gpu_check
    from tests.helpers import load_script, run_main

    pqn = load_script("pqn")
    args = gpu_check.parity_plan("pqn", "cpu", 8, 16, tmp_path)
    for name, total in (("eager", None), ("compiled", None), ("shorter", 5 * 16 * pqn.Args().num_steps)):
        run_main(pqn, **{**args, "run_name": name, **({"total_timesteps": total} if total else {})})
    same = gpu_check.parity(tmp_path / "eager", tmp_path / "compiled")
    assert same["status"] == "ok" and same["max_abs_diff"] == 0.0 and same["iteration"] == 1, same
    assert same["parted_at"] is None and same["last"]["iteration"] == 8 and same["last"]["max_abs_diff"] == 0.0, same
    assert same["parts"] == ["model", "optimizers", "ranks", "state"] and same["tensors"] > 20
    other = gpu_check.parity(tmp_path / "eager", tmp_path / "shorter")  # the same epsilon at the first rollout only
    assert other["parted_at"] == 2 and other["last"]["status"] == "differs" and other["last"]["max_abs_diff"] > 0, other
    assert other["status"] == "differs" and other["iteration"] == 2, other
    assert any(d.startswith("/state/learning_rate: ") for d in other["differing"]), other


def test_gpu_check_parity_judges_the_first_update_and_reports_where_the_runs_part(tmp_path):
    """Checkpoints of two runs of one plan, as td3's would be (no update at iteration 1: an empty optimizer state):
    judged at the first checkpoint after an update (iteration 2). Runs that agree there and part later (a weight
    moved, as a flipped discrete action would move it): ok, parted at the first iteration that differs. A difference
    at the judged iteration: differs. Runs that never update: failed, saying so."""
    from tests.benchmarks import gpu_check

    def write(run: str, moved_from: int | None, updates_from: int | None = 2):
        (tmp_path / run / "checkpoints").mkdir(parents=True)
        for it in (1, 2, 3, 4):
            w = torch.ones(3) + (0.5 if moved_from is not None and it >= moved_from else 0.0)
            updated = updates_from is not None and it >= updates_from
            adam = {"state": {0: {"step": torch.tensor(float(it))}} if updated else {}, "param_groups": []}
            torch.save(
                {
                    "iteration": it,
                    "global_step": 64 * it,
                    "model": {"w": w},
                    "optimizers": {"adam": adam},
                    "rng": {"cpu": torch.zeros(2)},
                },
                tmp_path / run / "checkpoints" / f"step_{64 * it}.pt",
            )

    write("eager", None)
    write("parts", 3)
    write("at_update", 2)
    write("eager_never", None, updates_from=None)
    write("never", None, updates_from=None)
    parted = gpu_check.parity(tmp_path / "eager", tmp_path / "parts")
    assert parted["status"] == "ok" and parted["iteration"] == 2 and parted["parted_at"] == 3, parted
    assert parted["last"]["iteration"] == 4 and parted["last"]["status"] == "differs", parted
    assert parted["last"]["max_abs_diff"] == 0.5 and parted["last"]["worst_tensor"] == "/model/w", parted
    same = gpu_check.parity(tmp_path / "eager", tmp_path / "eager")
    assert same["status"] == "ok" and same["parted_at"] is None and same["last"]["max_abs_diff"] == 0.0, same
    assert gpu_check.parity(tmp_path / "eager", tmp_path / "at_update")["status"] == "differs"
    never = gpu_check.parity(tmp_path / "eager_never", tmp_path / "never")
    assert never == {"status": "failed", "error": "no update by iteration 4 (the last checkpoint)"}, never


def write_checkpoints(run_dir: Path, changes: dict | None = None, iterations: int = 4) -> None:
    """Numbered checkpoints of a run as parity reads them: a model, Adam's state (an update at every iteration), a
    learning rate on a schedule, a host counter, an env's step counts and a device counter. `changes`:
    {iteration: function(checkpoint)} to make one run differ from iteration k on."""
    (run_dir / "checkpoints").mkdir(parents=True)
    for it in range(1, iterations + 1):
        ckpt = {
            "iteration": it,
            "global_step": 64 * it,
            "args": {"lr_schedule": "linear"},
            "model": {"w": torch.ones(3)},
            "optimizers": {"adam": {"state": {0: {"step": torch.tensor(float(it))}}, "param_groups": [{"lr": 0.1}]}},
            "state": {"learning_rate": torch.tensor(1.0 - it / 8), "counters": {"updates": it}},
            "ranks": [{"env": {"episode_steps": torch.arange(4) + it, "filled": torch.tensor(it)}, "rng": {}}],
        }
        for since, change in (changes or {}).items():
            if it >= since:
                change(ckpt)
        torch.save(ckpt, run_dir / "checkpoints" / f"step_{64 * it}.pt")


def test_gpu_check_parity_judges_counters_schedules_and_every_entry_at_every_iteration(tmp_path):
    """What never parts, compared at every iteration, not only the first after an update: a host counter, a device
    counter, Adam's step count or a scheduled learning rate that differs from iteration 2 on; an entry that only the
    compiled run has (or only the eager one); a checkpoint that only one run wrote: each fails the parity, naming it
    and the iteration. An env's step counts that differ from iteration 2 on (a flipped action changes an episode)
    and an adaptive learning rate (it follows the data) are reported where the runs part, not judged."""
    from tests.benchmarks import gpu_check

    def counter(ckpt):
        ckpt["state"]["counters"]["updates"] += 1

    def device_counter(ckpt):
        ckpt["ranks"][0]["env"]["filled"] += 1

    def adam_step(ckpt):
        ckpt["optimizers"]["adam"]["state"][0]["step"] -= 1

    def schedule(ckpt):
        ckpt["state"]["learning_rate"] += 1e-6  # within the float tolerance: a schedule is judged exactly

    def own_state(ckpt):
        ckpt["state"]["adv_ema"] = torch.zeros(())

    def episodes(ckpt):
        ckpt["ranks"][0]["env"]["episode_steps"][0] = 0

    def adaptive(ckpt):
        ckpt["args"]["lr_schedule"] = "adaptive"

    def adapted(ckpt):
        ckpt["state"]["learning_rate"] *= 1.5

    write_checkpoints(tmp_path / "eager")
    judged = {
        "counter": ({2: counter}, "/state/counters/updates: 2 vs 3"),
        "device_counter": ({2: device_counter}, "/ranks[0]/env/filled: 2 vs 3"),
        "adam_step": ({2: adam_step}, "/optimizers/adam/state/0/step: 2.0 vs 1.0"),
        "schedule": ({3: schedule}, "/state/learning_rate: "),
        "own_state": ({2: own_state}, "/state/adv_ema: only in the compiled run"),
    }
    for name, (changes, line) in judged.items():
        write_checkpoints(tmp_path / name, changes)
        result = gpu_check.parity(tmp_path / "eager", tmp_path / name)
        assert result["status"] == "differs" and result["iteration"] == min(changes), (name, result)
        assert result["differing"][0].startswith(line), (name, result)
        assert gpu_check.failures(
            "parity", {"scripts": [{"algo": "x", "status": "ok", "parity": result}], "acting": []}
        )
    missing = gpu_check.parity(tmp_path / "own_state", tmp_path / "eager")  # the other way round
    assert missing["status"] == "differs" and missing["differing"] == ["/state/adv_ema: only in the eager run"]
    (tmp_path / "counter" / "checkpoints" / "step_256.pt").unlink()  # a checkpoint of one run only
    fewer = gpu_check.parity(tmp_path / "eager", tmp_path / "counter")
    assert fewer["status"] == "differs" and fewer["differing"][0] == "step_256.pt: only in the eager run", fewer

    write_checkpoints(tmp_path / "parts", {2: episodes})
    parted = gpu_check.parity(tmp_path / "eager", tmp_path / "parts")
    assert parted["status"] == "ok" and parted["parted_at"] == 2, parted
    assert parted["last"]["differing"] == ["/ranks[0]/env/episode_steps"], parted
    write_checkpoints(tmp_path / "adaptive", {1: adaptive})
    write_checkpoints(tmp_path / "adapted", {1: adaptive, 3: adapted})
    adapted_result = gpu_check.parity(tmp_path / "adaptive", tmp_path / "adapted")
    assert adapted_result["status"] == "ok" and adapted_result["parted_at"] == 3, adapted_result
    same = gpu_check.parity(tmp_path / "eager", tmp_path / "eager")
    assert same["status"] == "ok" and same["parted_at"] is None and same["tensors"] == 5, same


def test_gpu_check_accepts_only_the_graph_breaks_that_an_update_step_brings():
    """dynamo's graph breaks as gpu_check's checks judge them: those of compiling a whole update step
    (backward(), the optimizer's zero_grad and step, a normalizer update kept out on purpose with
    torch.compiler.disable) are by design; an nn.LSTM that dynamo will not trace and a graph_break()
    of a script's own fail. Dynamo's own breaks, traced with its eager backend (no inductor)."""
    from torch._dynamo.utils import graph_break_reasons

    from common.normalize import RunningMeanStd
    from tests.benchmarks.gpu_check import accepted_break

    net, lstm, rms = torch.nn.Linear(3, 1), torch.nn.LSTM(3, 3), RunningMeanStd(3)
    optimizer = torch.optim.Adam(net.parameters())

    def update(x):
        rms.update(x)
        loss = net(rms(x)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    def act(x):
        return lstm(x)[0] + 1

    def own_break(x):
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1

    judged = {}
    for name, fn, x in (
        ("update", update, torch.randn(4, 3)),
        ("act", act, torch.randn(2, 4, 3)),
        ("own_break", own_break, torch.randn(3)),
    ):
        torch._dynamo.reset()
        first = len(graph_break_reasons)
        torch.compile(fn, backend="eager")(x)
        judged[name] = [accepted_break(r) for r in graph_break_reasons[first:] if r.graph_break]
    torch._dynamo.reset()
    assert set(judged["update"]) == {
        "backward()",
        "the optimizer's zero_grad",
        "the optimizer's step",
        "a torch.compiler.disable'd function",
    }, judged
    assert judged["act"] and judged["own_break"] and set(judged["act"] + judged["own_break"]) == {None}, judged


def test_gpu_check_judges_captured_random_numbers_by_distribution():
    """The judgment of the captured acting step's own random numbers: independent standard normal
    draws pass; the same draws at every replay or every step, or a wrong scale, fail by name."""
    from tests.benchmarks.gpu_check import judge_noise

    g = torch.Generator().manual_seed(0)
    draws = torch.randn(6, 4, 256, generator=g)
    assert judge_noise(draws)["status"] == "ok", judge_noise(draws)
    assert judge_noise(draws[:1].expand(6, 4, 256))["failed"] == ["across_replays"]
    assert judge_noise(draws[:, :1].expand(6, 4, 256))["failed"] == ["across_steps"]
    assert judge_noise(0.9 * draws)["failed"] == ["var"]


def test_gpu_check_speed_row_below_its_floor_fails_naming_the_floor(monkeypatch):
    """The speed sections' judgment (the runs themselves stubbed): on an H200 a row below 90% of the figure last
    measured on an H200 fails, naming its floor; above it passes; on an H100, which has no figures yet, and on a
    GPU the floors are not for, every row passes and its figure is printed to add."""
    from tests.benchmarks import gpu_check

    sps = {}
    monkeypatch.setattr(bench, "measure_env_only", lambda *a, **k: {"sps": 5e7})
    monkeypatch.setattr(
        bench,
        "run_training",
        lambda algo, args_cls, env_id, num_envs, device, mode, *a, **k: {
            "algo": algo,
            "mode": mode,
            "status": "ok",
            "sps": sps.get((algo, num_envs, mode), 4e7),
        },
    )
    h200, h100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"
    sps[("ppo", 4096, "compile+cudagraphs")] = 8.0e6
    result = gpu_check.section_speed("speed", "cuda", 60, 3, h200)
    assert gpu_check.failures("speed", result) == [
        "ppo compile+cudagraphs CartPole-v1 4096: 8,000,000 SPS is below its floor of 8,201,178 SPS "
        "(90% of 9,112,420, the last measured on an H200)"
    ]
    assert [(r["algo"], n["num_envs"]) for n in result["rows"] for r in n["runs"]][:6:2] == [
        ("ppo", 4096),
        ("ppo_lstm", 4096),
        ("pqn", 4096),
    ]
    floors = {
        (r["algo"], row["num_envs"], r["mode"]): r.get("floor", {}).get("measured")
        for row in result["rows"]
        for r in row["runs"]
    }
    assert floors == {
        ("ppo", 4096, "eager"): 554_530,
        ("ppo", 4096, "compile+cudagraphs"): 9_112_420,
        ("ppo_lstm", 4096, "eager"): None,
        ("ppo_lstm", 4096, "compile+cudagraphs"): 3_206_883,
        ("pqn", 4096, "eager"): None,
        ("pqn", 4096, "compile+cudagraphs"): 12_552_176,
        ("ppo", 65536, "eager"): None,
        ("ppo", 65536, "compile+cudagraphs"): 29_305_583,
    }
    pendulum = gpu_check.section_speed("speed-pendulum", "cuda", 60, 3, h200)
    assert {r["algo"]: r["floor"]["measured"] for r in pendulum["rows"][0]["runs"] if r.get("floor")} == {
        "td3": 375_009,
        "sac": 373_168,
    }
    sps[("ppo", 4096, "compile+cudagraphs")] = 8.3e6
    assert gpu_check.failures("speed", gpu_check.section_speed("speed", "cuda", 60, 3, h200)) == []
    for gpu in (h100, "NVIDIA A100"):  # no figures there: nothing fails, every figure is printed to add
        sps[("ppo", 4096, "compile+cudagraphs")] = 1.0e6
        result = gpu_check.section_speed("speed", "cuda", 60, 3, gpu)
        assert gpu_check.failures("speed", result) == [] and not any(
            r.get("floor") for n in result["rows"] for r in n["runs"]
        )
    report = {
        "date": "now",
        "machine": {"gpu": h100, "torch": "2"},
        "tensordict": "0",
        "commit": "c",
        "mode": "gpu",
        "mode_text": "the GPU plan",
        "verdict": "all passed",
        "skipped": [],
        "sections": {"speed": {"status": "ok", "seconds": 60.0, "failures": [], "result": result}},
    }
    text = gpu_check.markdown(report)
    assert '("ppo", "CartPole-v1", 4096, "compile+cudagraphs"): 1e+06' in text
    assert '("ppo_lstm", "CartPole-v1", 4096, "compile+cudagraphs"): 4e+07' in text


def test_gpu_check_quick_plan_fits_eight_minutes_and_names_what_it_leaves_out(monkeypatch, capsys):
    """--quick: the checks of all six scripts, the parity rows and the captured 4096-env speed rows of ppo, ppo_lstm
    and pqn, within 8 minutes by its plan; the plan and --help name what it leaves out; its speed section runs those
    three rows in the captured mode only."""
    from tests.benchmarks import gpu_check

    assert gpu_check.QUICK == ("checks", "parity", "speed-quick")
    assert gpu_check.expected_minutes(gpu_check.QUICK, quick=True) <= 8
    gpu_check.print_plan(list(gpu_check.QUICK), "gpu", "cuda", quick=True)
    plan = capsys.readouterr().err
    for left_out in gpu_check.QUICK_LEAVES_OUT:
        assert left_out in plan
    assert "tests" in " ".join(gpu_check.QUICK_LEAVES_OUT) and "torchrun" in " ".join(gpu_check.QUICK_LEAVES_OUT)
    with pytest.raises(SystemExit):
        gpu_check.main(["--help"])
    assert "--quick" in capsys.readouterr().out
    monkeypatch.setattr(bench, "measure_env_only", lambda *a, **k: {"sps": 5e7})
    monkeypatch.setattr(
        bench,
        "run_training",
        lambda algo, args_cls, env_id, num_envs, device, mode, *a, **k: {
            "algo": algo,
            "mode": mode,
            "status": "ok",
            "sps": 1e7,
        },
    )
    result = gpu_check.section_speed("speed-quick", "cuda", 60, 3, "NVIDIA H200")
    assert [(row["env_id"], row["num_envs"], r["algo"], r["mode"]) for row in result["rows"] for r in row["runs"]] == [
        ("CartPole-v1", 4096, algo, "compile+cudagraphs") for algo in ("ppo", "ppo_lstm", "pqn")
    ]


def test_gpu_check_parity_reports_every_row_when_one_part_fails(monkeypatch):
    """The parity section, given failing parts: the acting step's part whose compile raises (as the capture error
    on the H200 did) is that part's failure, with its error and where, and its other parts still run; a script
    whose process failed and one whose plan raised are rows of their own, and every other row is reported; an
    acting step whose process died is one failed row. The scripts' processes are stubbed; the acting step runs."""
    import argparse

    import common.capture
    from tests.benchmarks import gpu_check

    calls = []

    def compiled(run, fn):  # the first compile fails; the others run eagerly (the judgment is the same)
        calls.append(fn)
        if len(calls) == 1:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
        return fn

    monkeypatch.setattr(common.capture, "compiled", compiled)
    parts = gpu_check.acting_step("cpu")
    assert [(p["part"], p["status"]) for p in parts] == [
        ("compiled against eager", "failed"),
        ("captured against eager", "skipped"),
        ("own random numbers", "ok"),
    ], parts
    assert parts[0]["error"] == "RuntimeError: CUDA error: operation failed due to a previous error during capture"
    assert parts[0]["at"].startswith("tests/test_bench.py:") and len(calls) == 2  # where it was raised

    ok = {
        "status": "ok",
        "iteration": 5,
        "max_abs_diff": 0.0,
        "worst_tensor": None,
        "tensors": 30,
        "parts": ["model"],
        "differing": [],
    }
    acting = {"algo": "ppo", "job": "acting", "status": "ok", "parts": parts, "seconds": 1.0}

    def run_worker(cfg, timeout):
        if cfg["job"] == "acting":
            return acting
        if cfg["algo"] == "pqn":  # its process died, as a CUDA error ends one
            return {
                "algo": "pqn",
                "job": "parity",
                "status": "failed",
                "error": "torch.AcceleratorError: CUDA error",
                "returncode": 1,
                "seconds": 1.0,
            }
        return {"algo": cfg["algo"], "job": "parity", "status": "ok", "parity": ok, "seconds": 1.0}

    def plan(algo, *args, **kwargs):
        if algo == "td3":
            raise ValueError("td3 cannot be planned")
        return {"device": "cpu"}

    monkeypatch.setattr(gpu_check, "run_worker", run_worker)
    monkeypatch.setattr(gpu_check, "plan", plan)
    cfg = argparse.Namespace(iterations=5, num_envs=16, timeout=60.0)
    result = gpu_check.section_parity("dry", "cpu", ["ppo", "pqn", "td3", "sac"], cfg)
    assert [(r["algo"], r["status"]) for r in result["scripts"]] == [
        ("ppo", "ok"),
        ("pqn", "failed"),
        ("td3", "failed"),
        ("sac", "ok"),
    ]
    bad = gpu_check.failures("parity", result)
    assert bad[:2] == ["pqn: torch.AcceleratorError: CUDA error", "td3: ValueError: td3 cannot be planned"], bad
    assert len(bad) == 3 and bad[2].startswith("acting step, compiled against eager: RuntimeError: CUDA error"), bad
    report = {
        "date": "now",
        "machine": {"cpu": "a CPU", "cpu_cores": 2, "torch": "2"},
        "tensordict": "0",
        "commit": "c",
        "mode": "dry",
        "mode_text": "a dry run",
        "verdict": "failed: parity",
        "skipped": [],
        "sections": {"parity": {"status": "failed", "seconds": 6.0, "failures": bad, "result": result}},
    }
    text = gpu_check.markdown(report)
    for row in (
        "| ppo | ok |",
        "| pqn | failed: torch.AcceleratorError: CUDA error",
        "| td3 | failed: ValueError",
        "| sac | ok |",
        "- compiled against eager: failed: RuntimeError",
        "- own random numbers: ok",
    ):
        assert row in text, text
    acting = {"algo": "ppo", "job": "acting", "status": "failed", "error": "Segmentation fault", "seconds": 1.0}
    result = gpu_check.section_parity("dry", "cpu", ["ppo"], cfg)
    assert gpu_check.failures("parity", result) == ["acting step, its process: Segmentation fault"]
