"""A copy of a script is a first-class script: what a researcher adds to a copy of ppo.py (a flag, a
logged statistic, a running tensor in the checkpoint) works under --compile and --resume without a
change to common/, and the contract tests catch a compiled write that is dropped.

The copy is made as a researcher would make it: algos/ppo.py, edited as text (each edit must apply
exactly once, so a change to ppo.py that moves an anchor fails here loudly, not silently).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import pytest
import torch

from common.args import Ge, Le, RunArgs, check_numbers, given_flags, parse_args
from common.checkpoint import load_checkpoint
from tests.helpers import ROOT, load_script, run, run_main, subprocess_env
from tests.lockstep import inductor_settings, lockstep_compiled
from tests.test_scripts import assert_runs_alike, next_second, scalars

# The copy's edits: (anchor in ppo.py, what replaces it)
EDITS = [
    # (a) two new flags, defaults a name-based check would have refused: no range declared, none checked
    (
        "class Args(RunArgs):\n",
        'class Args(RunArgs):\n    weight_norm: float = 0.0\n    """L2 penalty on the actor\'s weights"""\n'
        '    warmup_iters: int = 0\n    """iterations before anything new starts (a flag a copy adds)"""\n',
    ),
    (
        "    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef\n",
        "    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef\n"
        "    loss = loss + args.weight_norm * sum((p**2).sum() for p in agent.actor.parameters())\n",
    ),
    # (b) a new statistic of the targets, logged as losses/adv_abs; (c) a running 0-d float64 tensor
    # written in place in the compiled targets and declared in the checkpoint state
    (
        "    episodes: torch.Tensor,\n    args: Args,\n):",
        "    episodes: torch.Tensor,\n    args: Args,\n    adv_ema: torch.Tensor,\n):",
    ),
    (
        '    batch = {"obs_n": obs_n, "actions": data["actions"], "logprobs": data["logprobs"], "values": values}\n',
        "    adv_ema.mul_(0.9).add_(0.1 * advantages.abs().mean())\n"
        '    batch = {"obs_n": obs_n, "actions": data["actions"], "logprobs": data["logprobs"], "values": values}\n',
    ),
    (
        '{"explained_variance": explained_variance(returns, values)}',
        '{"explained_variance": explained_variance(returns, values), "adv_abs": advantages.abs().mean()}',
    ),
    ('stats["episodes"], args\n', 'stats["episodes"], args, adv_ema\n'),
    (
        "    ep_stats = torch.zeros(2, args.num_envs, device=device, dtype=torch.float64)  # running return, length\n",
        "    ep_stats = torch.zeros(2, args.num_envs, device=device, dtype=torch.float64)  # running return, length\n"
        "    adv_ema = torch.zeros((), device=device, dtype=torch.float64)  # the copy's running statistic\n",
    ),
    (
        'replicated={"learning_rate": lr, "reward_normalizer": reward_normalizer}',
        'replicated={"learning_rate": lr, "reward_normalizer": reward_normalizer, "adv_ema": adv_ema}',
    ),
]
TINY = dict(
    device="cpu",
    progress=False,
    run_name="run",
    env_id="Pendulum-v1",
    num_envs=16,
    num_steps=8,
    num_minibatches=2,
    hidden_sizes=(32, 32),
    num_eval_envs=4,
    eval_interval=0,
    save_interval=10_000,
    env_kwargs='{"max_episode_steps": 16}',
    weight_norm=0.0,
    warmup_iters=0,
)
ITERATION = 16 * 8


def write_copy(directory: Path) -> Path:
    text = (ROOT / "algos" / "ppo.py").read_text()
    for anchor, replacement in EDITS:
        assert text.count(anchor) == 1, f"the copy's edit no longer applies to algos/ppo.py: {anchor!r}"
        text = text.replace(anchor, replacement)
    path = directory / "ppo_ema.py"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    """The copy, imported, and its eager run of 3 iterations."""
    out = tmp_path_factory.mktemp("copy")
    module = load_script("ppo_ema", write_copy(out))
    run_main(module, **TINY, output_dir=str(out / "eager"), total_timesteps=3 * ITERATION, compile=False)
    yield module, out
    sys.modules.pop("ppo_ema", None)


def own_state(run_dir: Path, name: str = "adv_ema") -> torch.Tensor:
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["state"][name]


def test_a_copy_with_new_flags_a_statistic_and_state_compiles_as_it_runs_eagerly(copy, tmp_path, capfd, monkeypatch):
    """--compile, in lockstep with eager (tests/lockstep.py: every call of every compiled function from eager's state,
    compared): the flags are accepted, the new statistic is logged and non-zero, and the running 0-d float64 tensor
    (whose in-place write torch.compile would drop on a CPU) is written as eager writes it at every call; the run ends
    with the eager run's state and logs."""
    module, out = copy
    checked = lockstep_compiled(monkeypatch)
    with inductor_settings(kernels=False):
        run_main(module, **TINY, output_dir=str(tmp_path), total_timesteps=3 * ITERATION, compile=True)
    said = "".join(capfd.readouterr())
    assert "compile on (compiling takes a minute or more on a CPU), CUDA graphs: off;" in said
    assert len(checked.calls) >= 2, checked.calls
    eager, compiled = out / "eager" / "run", tmp_path / "run"
    assert own_state(compiled) != 0 and own_state(compiled) == pytest.approx(own_state(eager).item(), rel=1e-6)
    assert all(value != 0 for _, value in scalars(compiled)["losses/adv_abs"])
    assert_runs_alike(eager, compiled)


# The copy's write of its statistic in each form common.capture's probe tries (the same arithmetic, so
# the eager runs agree), for the test below to make the write the torch at hand drops
EMA_WRITES = {
    "method": "    adv_ema.mul_(0.9).add_(0.1 * advantages.abs().mean())\n",
    "operator": "    adv_ema *= 0.9\n    adv_ema += 0.1 * advantages.abs().mean()\n",
    "out": "    torch.add(torch.mul(adv_ema, 0.9, out=adv_ema), 0.1 * advantages.abs().mean(), out=adv_ema)\n",
    "setitem": "    adv_ema[...] = adv_ema * 0.9 + 0.1 * advantages.abs().mean()\n",
}


def test_compile_parity_fails_when_a_compiled_write_is_dropped(copy, tmp_path, monkeypatch):
    """Where the torch at hand drops an in-place write to a 0-d float64 CPU tensor (its probe says which
    forms: torch 2.13 drops method, augmented and out= writes; 2.14 none), the copy making its statistic's
    write in such a form loses it without the guard of common.capture.compiled, and the contract's compiled-vs-eager
    check (in lockstep) fails at the first call of the function that drops it, naming the tensor."""
    import common.capture

    lost = [form for form in EMA_WRITES if (form, torch.float64, True) in common.capture.lost_writes("cpu")]
    if not lost:
        pytest.skip(
            f"torch {torch.__version__} keeps every in-place write to a 0-d float64 CPU tensor that the "
            f"probe tries under torch.compile: no dropped write to catch"
        )
    module, out = copy
    text = (out / "ppo_ema.py").read_text()
    assert text.count(EMA_WRITES["method"]) == 1
    path, name = tmp_path / lost[0] / "ppo_ema.py", f"ppo_ema_{lost[0]}"  # the same script, by its file name
    path.parent.mkdir()
    path.write_text(text.replace(EMA_WRITES["method"], EMA_WRITES[lost[0]]))
    monkeypatch.setattr(common.capture, "lost_writes", lambda device: frozenset())  # the guard off
    lockstep_compiled(monkeypatch)
    try:
        with inductor_settings(kernels=False):  # the write is dropped from inductor's graph, kernels or not
            with pytest.raises(
                AssertionError,
                match=r"^[\w ,]+ \(ppo_ema.py:\d+\), call 1: compiled differs from eager in adv_ema: 1 of 1 differ",
            ):
                run_main(
                    load_script(name, path),
                    **TINY,
                    output_dir=str(tmp_path),
                    total_timesteps=3 * ITERATION,
                    compile=True,
                )
    finally:
        sys.modules.pop(name, None)


def test_a_carried_tensor_left_out_of_the_checkpoint_is_named_with_the_line_that_writes_it(tmp_path):
    """The copy with its running statistic not declared in TrainingState: exact resume would fail on a value that
    drifts later (the best eval return); the contract's carry check (tests/carried.py) names the tensor and the line
    of the copy that writes it."""
    from tests.carried import carried_outside_the_checkpoint

    text = (ROOT / "algos" / "ppo.py").read_text()
    for anchor, replacement in EDITS[:-1]:  # every edit but the one that puts adv_ema in TrainingState
        assert text.count(anchor) == 1, f"the copy's edit no longer applies to algos/ppo.py: {anchor!r}"
        text = text.replace(anchor, replacement)
    path = tmp_path / "ppo_forgets.py"
    path.write_text(text)
    line = text[: text.index("    adv_ema.mul_(0.9)")].count("\n") + 1
    module = load_script("ppo_forgets", path)
    try:
        missing = carried_outside_the_checkpoint(
            module,
            lambda: run_main(module, **TINY, output_dir=str(tmp_path), total_timesteps=3 * ITERATION, log_interval=1),
        )
    finally:
        sys.modules.pop("ppo_forgets", None)
    assert len(missing) == 1 and re.match(
        rf"adv_ema \(written at ppo_forgets.py:{line} \(\w+\) in iteration", missing[0]
    ), missing


def test_a_copy_resumes_its_own_state_exactly_and_starts_from_the_original_with_init_from(copy, tmp_path, capsys):
    module, out = copy
    common = dict(TINY, output_dir=str(tmp_path / "copy"), total_timesteps=3 * ITERATION)
    run_main(module, **common, max_wall_seconds=0.0)  # stops after its first iteration
    next_second()
    run_main(module, **common, resume="auto")
    assert own_state(tmp_path / "copy" / "run") == own_state(out / "eager" / "run")  # bit for bit

    # a resume that crosses scripts stops, naming both (the copy's run is not the original's, nor the reverse)
    ppo = load_script("ppo")
    plain = {k: v for k, v in TINY.items() if k not in ("weight_norm", "warmup_iters")}
    run_main(ppo, **plain, output_dir=str(tmp_path / "ppo"), total_timesteps=2 * ITERATION)
    original = tmp_path / "ppo" / "run" / "checkpoints" / "last.pt"
    with pytest.raises(
        SystemExit, match=rf"^error: {original} is a run of ppo.py, not of ppo_ema.py: .*--init-from {original}"
    ):
        run_main(module, **TINY, output_dir=str(tmp_path / "x"), resume=str(original))
    # meant (--resume-other-script): the original's checkpoint lacks the copy's state, one line and the way on
    with pytest.raises(
        SystemExit,
        match=rf"^error: {original} .*lacks adv_ema \(replicated\), which this script declares;.*"
        rf"--init-from {original}$",
    ):
        run_main(module, **TINY, output_dir=str(tmp_path / "x"), resume=str(original), resume_other_script=True)
    with pytest.raises(SystemExit, match=r"is a run of ppo_ema.py, not of ppo.py"):
        run_main(ppo, **plain, output_dir=str(tmp_path / "y"), resume=str(out / "eager" / "run"))
    with pytest.raises(SystemExit, match=r"holds adv_ema \(replicated\), which this script does not declare"):
        run_main(
            ppo, **plain, output_dir=str(tmp_path / "y"), resume=str(out / "eager" / "run"), resume_other_script=True
        )

    # --init-from: the original's weights and normalizers, nothing else (a new run from step 0)
    capsys.readouterr()
    started = run_main(
        module, **TINY, output_dir=str(tmp_path / "init"), total_timesteps=ITERATION, init_from=str(original)
    )
    assert started["global_step"] == ITERATION
    said = capsys.readouterr().out
    tensors = len(torch.load(original, weights_only=True)["model"])
    assert (
        f"initialised from {original} (ppo on Pendulum-v1, global step {2 * ITERATION:,}): {tensors} of {tensors} "
        f"model tensors, normalizers reward_normalizer" in said
    )
    # it starts from the original's observation statistics (one rollout more folded in)
    count = torch.load(original, weights_only=True)["model"]["obs_rms.count"]
    assert (
        torch.load(tmp_path / "init" / "run" / "checkpoints" / "last.pt", weights_only=True)["model"]["obs_rms.count"]
        == count + ITERATION
    )
    # networks that fit none of its tensors (another env) take nothing and say so
    with pytest.raises(SystemExit, match=r"--init-from .*: none of its \d+ model tensors fits .*--env-id Pendulum-v1"):
        run_main(
            module,
            **{**TINY, "env_id": "CartPole-v1", "hidden_sizes": (8,), "obs_norm": False},
            output_dir=str(tmp_path / "z"),
            total_timesteps=ITERATION,
            init_from=str(original),
        )


def test_resume_continues_the_run_it_points_to(tmp_path, capsys):
    """--resume without --num-envs or --total-timesteps continues the run at its own sizes to its own end;
    a given flag that cannot continue it stops in one line."""
    ppo = load_script("ppo")
    plain = {k: v for k, v in TINY.items() if k not in ("weight_norm", "warmup_iters")}
    first = run_main(ppo, **plain, output_dir=str(tmp_path), total_timesteps=4 * ITERATION, max_wall_seconds=0.0)
    assert first["global_step"] == ITERATION
    unsized = {k: v for k, v in plain.items() if k != "num_envs"}  # Args' default is 4096 envs
    with pytest.raises(
        SystemExit,
        match=r"^error: an iteration of 1 process\(es\) x 2048 envs is 16,384 env steps, more "
        r"than the 384 left from step 128 to --total-timesteps 512: resume with the "
        r"checkpoint's --num-envs 16",
    ):
        run_main(ppo, **unsized, num_envs=2048, output_dir=str(tmp_path), resume="auto")
    with pytest.raises(SystemExit, match=r"is at global step 128, past --total-timesteps 64: drop --total-timesteps"):
        run_main(ppo, **unsized, output_dir=str(tmp_path), resume="auto", total_timesteps=64)
    next_second()
    capsys.readouterr()
    last = run_main(ppo, **unsized, output_dir=str(tmp_path), resume="auto")
    assert last["global_step"] == 4 * ITERATION and last["iteration"] == 4 and last["stop_reason"] == "total_timesteps"
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("from the checkpoint: ")]
    assert "--num-envs 16 " in line and "--total-timesteps 512" in line, line  # the run's sizes, which it continues


def test_per_rank_state_that_cannot_be_restored_is_named(tmp_path, capsys):
    ppo = load_script("ppo")
    plain = {k: v for k, v in TINY.items() if k not in ("weight_norm", "warmup_iters")}
    gym = dict(
        plain,
        env_id="gym:Pendulum-v1",
        env_kwargs='{"env_kwargs": {"max_episode_steps": 16}}',
        output_dir=str(tmp_path),
        total_timesteps=2 * ITERATION,
    )
    run_main(ppo, **gym, max_wall_seconds=0.0)
    capsys.readouterr()
    run_main(ppo, **gym, resume="auto")
    assert (
        "notice: per-rank state not restored (the envs start fresh episodes), starting from its initial values: "
        "ep_stats, reward_returns"
    ) in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# flags: ranges declared with them, the given ones known whatever the class is called
# ----------------------------------------------------------------------------------------------
@dataclass
class Base(RunArgs):
    rate: Annotated[float, Ge(0), Le(1)] = 0.5
    """a rate"""
    sizes: Annotated[tuple[int, ...], Ge(1)] = (4,)
    """sizes"""


@dataclass
class Renamed(Base):
    rate: float = 0.25  # a new default: the base's range still holds
    """a rate"""
    weight_norm: float = 0.0
    """a flag without a range"""
    warmup_iters: int = 0
    """another"""


def test_a_flag_is_checked_by_the_range_declared_with_it_and_by_nothing_else():
    check_numbers(Renamed(weight_norm=0.0, warmup_iters=0, num_envs=1))
    check_numbers(Renamed(weight_norm=-3.0, warmup_iters=-1))  # no range declared: any value
    for bad, line in (
        (dict(rate=1.5), r"--rate must be in \[0, 1\], got 1.5"),
        (dict(rate=float("nan")), "--rate must be"),
        (dict(sizes=(4, 0)), r"each of --sizes must be >= 1, got \(4, 0\)"),
        (dict(num_envs=0), "--num-envs must be >= 1, got 0"),
    ):
        with pytest.raises(SystemExit, match=rf"^error: {line}"):
            check_numbers(Renamed(**bad))


def test_the_given_flags_are_the_command_lines_whatever_the_class_is_called(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["copy.py", "--rate", "0.25", "--no-track", "--seed=3"])
    args = parse_args(Renamed)
    assert args.rate == 0.25 and {"rate", "track", "seed"} <= given_flags(
        args
    )  # 0.25 is the default: named all the same
    assert "warmup_iters" not in given_flags(args) and "rate" not in given_flags(Renamed())


# ----------------------------------------------------------------------------------------------
# a copy's identity: its own name everywhere, a resume that never crosses scripts unasked, and a
# finished run that a resume leaves as it was
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mine(tmp_path_factory):
    """algos/ppo.py copied to ppo_mine.py with two new flags (the copy's first two edits), ALGO kept, as the
    README says; nothing else changed."""
    text = (ROOT / "algos" / "ppo.py").read_text()
    for anchor, replacement in EDITS[:2]:
        assert text.count(anchor) == 1, f"the copy's edit no longer applies to algos/ppo.py: {anchor!r}"
        text = text.replace(anchor, replacement)
    path = tmp_path_factory.mktemp("mine") / "ppo_mine.py"
    path.write_text(text)
    yield load_script("ppo_mine", path)
    sys.modules.pop("ppo_mine", None)


PLAIN = {k: v for k, v in TINY.items() if k not in ("weight_norm", "warmup_iters")}


def test_a_copy_is_its_own_script_in_its_run_name_summary_and_checkpoints(mine, tmp_path, capsys):
    summary = run_main(mine, **{**TINY, "run_name": None}, output_dir=str(tmp_path), total_timesteps=ITERATION)
    run_dir = Path(summary["run_dir"])
    assert run_dir.name.startswith("Pendulum-v1__ppo_mine__1__"), run_dir.name
    assert (summary["algo"], summary["algorithm"]) == ("ppo_mine", "ppo")
    assert json.loads((run_dir / "summary.json").read_text())["algo"] == "ppo_mine"
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert (state["algo"], state["algorithm"]) == ("ppo_mine", "ppo")
    said = capsys.readouterr().out
    assert "ppo_mine (a copy of ppo.py) on Pendulum-v1: 1 process x 16 envs on cpu;" in said
    assert "ppo_mine on Pendulum-v1: 128 steps (1 iteration)" in said


def test_a_resume_never_crosses_scripts_unasked_and_keeps_every_flag_of_the_run(mine, tmp_path, capsys):
    ppo = load_script("ppo")
    run_main(mine, **{**TINY, "warmup_iters": 3}, output_dir=str(tmp_path), total_timesteps=ITERATION)
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    # the original takes over the copy's run only when told to
    with pytest.raises(
        SystemExit,
        match=rf"^error: {last} is a run of ppo_mine.py, not of ppo.py: .*--init-from {last}, "
        r"resume it with ppo_mine.py, or pass --resume-other-script",
    ):
        run_main(ppo, **PLAIN, output_dir=str(tmp_path), resume="auto", total_timesteps=2 * ITERATION)
    assert {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()} == before, (
        "a refused resume writes nothing"
    )
    # and so the copy with the original's run
    run_main(ppo, **PLAIN, output_dir=str(tmp_path / "ppo"), total_timesteps=ITERATION)
    with pytest.raises(SystemExit, match=r"is a run of ppo.py, not of ppo_mine.py"):
        run_main(mine, **TINY, output_dir=str(tmp_path / "ppo"), resume="auto", total_timesteps=2 * ITERATION)
    # told: it continues, and the copy's flags stay in the run's config and checkpoints, named once
    next_second()
    capsys.readouterr()
    done = run_main(
        ppo, **PLAIN, output_dir=str(tmp_path), resume="auto", total_timesteps=2 * ITERATION, resume_other_script=True
    )
    assert done["global_step"] == 2 * ITERATION
    assert (
        "flags that ppo.py does not have are kept in its config.json and checkpoints, unused: --weight-norm 0.0 "
        "--warmup-iters 3" in capsys.readouterr().out
    )
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["warmup_iters"] == 3 and config["weight_norm"] == 0.0 and config["resume_other_script"] is True
    assert torch.load(last, weights_only=True)["args"]["warmup_iters"] == 3


def test_resuming_a_finished_run_changes_no_file_and_extending_it_adds_up_the_whole_run(tmp_path, capsys):
    ppo = load_script("ppo")
    first = run_main(ppo, **{**PLAIN, "eval_interval": 1}, output_dir=str(tmp_path), total_timesteps=2 * ITERATION + 5)
    files = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file()}
    next_second()
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        run_main(ppo, **PLAIN, output_dir=str(tmp_path), resume="auto")
    assert stopped.value.code == 0
    assert (
        f"the run in {tmp_path / 'run'} is finished (global step 256 of --total-timesteps 261); nothing to do, no "
        "file changed. Extend it with a larger --total-timesteps" in capsys.readouterr().out
    )
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file()} == files
    # a larger --total-timesteps extends it; the summary covers both processes: the first's totals as its last.pt
    # carries them (its summary, written after that save, adds the save's own seconds, which no checkpoint can hold:
    # on a loaded machine they outgrew the extension's one iteration)
    carried = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["totals"]
    assert 0 < carried["wall_seconds"] <= first["wall_seconds"] and carried["processes"] == 1, (carried, first)
    extended = run_main(ppo, **PLAIN, output_dir=str(tmp_path), resume="auto", total_timesteps=3 * ITERATION)
    assert extended["global_step"] == 3 * ITERATION and extended["processes"] == 2
    assert extended["wall_seconds"] > carried["wall_seconds"], (extended["wall_seconds"], carried)
    assert extended["rollout_seconds"] > carried["seconds"]["rollout"], (extended["rollout_seconds"], carried)
    assert extended["best_eval_return"] >= first["best_eval_return"]


def test_a_flag_the_script_lacks_names_the_flags_meant(monkeypatch, capsys):
    ppo = load_script("ppo")
    for given, meant in (
        ("--lr", "did you mean --learning-rate"),
        ("--num-env", "did you mean --num-envs"),
        ("--lerning-rate=3e-4", "did you mean --learning-rate?"),
    ):
        with pytest.raises(SystemExit, match=rf"^error: unknown flag {given.split('=')[0]}; {meant}"):
            parse_args(ppo.Args, [given, "3e-4"] if "=" not in given else [given])
    assert parse_args(ppo.Args, ["--learning-rate", "3e-4", "--no-track"]).learning_rate == 3e-4


# The README's copy, `cp algos/ppo.py algos/ppo_myidea.py` and an idea of 20+ lines: PPO's adaptive KL penalty
# (Schulman et al. 2017, sec. 4) added to the clipped loss. Two flags with declared ranges, the coefficient a 0-d
# tensor adapted in place after each minibatch and held in the checkpoint, the penalty logged as losses/kl_penalty.
README_COPY = [
    (
        "class Args(RunArgs):\n",
        "class Args(RunArgs):\n"
        "    kl_coef: Annotated[float, Ge(0)] = 0.2\n"
        '    """initial coefficient of the KL penalty added to the loss (0: no penalty)"""\n'
        "    kl_target: Annotated[float, Gt(0)] = 0.01\n"
        '    """the KL the penalty\'s coefficient adapts to: doubled above 1.5x it, halved below it / 1.5"""\n',
    ),
    (
        "# --- The PPO loss of a minibatch, with rsl_rl's symmetry",
        "def adapt_kl_coef(kl_coef: torch.Tensor, kl: torch.Tensor, kl_target: float) -> None:\n"
        '    """The PPO paper\'s adaptive KL penalty, in place on the device: the coefficient doubled when the KL is\n'
        "    above 1.5x the target, halved below the target / 1.5, kept in [0, 100]; a 0-d tensor in the checkpoint,\n"
        '    so that a resumed run goes on with the coefficient it had."""\n'
        "    factor = torch.where(kl > 1.5 * kl_target, 2.0, torch.where(kl < kl_target / 1.5, 0.5, 1.0))\n"
        "    kl_coef.copy_((kl_coef * factor).clamp(0.0, 100.0))\n"
        "\n"
        "\n"
        "# --- The PPO loss of a minibatch, with rsl_rl's symmetry",
    ),
    (
        "def ppo_loss(agent: Agent, mb: TensorDict, args: Args, output_mirror=None):",
        "def ppo_loss(agent: Agent, mb: TensorDict, args: Args, output_mirror=None, kl_coef=None):",
    ),
    (
        "    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef\n",
        "    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef\n"
        "    # the KL penalty: the k3 estimate of KL(old || new), with its gradient, weighed by its coefficient\n"
        "    kl = ((ratio[:b] - 1) - logratio[:b]).mean()\n"
        "    kl_penalty = kl_coef * kl if kl_coef is not None else torch.zeros_like(kl)\n"
        "    loss = loss + kl_penalty\n",
    ),
    ('        "clipfrac": clipfrac,\n', '        "clipfrac": clipfrac,\n        "kl_penalty": kl_penalty.detach(),\n'),
    (
        "    ep_stats = torch.zeros(2, args.num_envs, device=device, dtype=torch.float64)  # running return, length\n",
        "    ep_stats = torch.zeros(2, args.num_envs, device=device, dtype=torch.float64)  # running return, length\n"
        "    kl_coef = torch.tensor(args.kl_coef, device=device)  # the KL penalty's coefficient, adapted in place\n",
    ),
    (
        'replicated={"learning_rate": lr, "reward_normalizer": reward_normalizer}',
        'replicated={"learning_rate": lr, "reward_normalizer": reward_normalizer, "kl_coef": kl_coef}',
    ),
    (
        "        loss, losses = ppo_loss(agent, mb, args, output_mirror)\n",
        "        loss, losses = ppo_loss(agent, mb, args, output_mirror, kl_coef)\n",
    ),
    (
        "        optimizer.step()\n",
        "        optimizer.step()\n"
        "        # the ranks' mean KL of this minibatch adapts the coefficient (the same on every rank)\n"
        '        adapt_kl_coef(kl_coef, distributed.all_reduce(losses["approx_kl"].clone(), "mean"), args.kl_target)\n',
    ),
]
# The tests that find the scripts in algos/ (by glob, or parametrized over what they find), run on the copy there:
# the per-script ones where the copy is a parameter (-k ppo_myidea), the rest whole (they read all of algos/)
PER_SCRIPT_TESTS = [
    "tests/test_scripts.py",  # the contract (its SCRIPTS: found by glob)
    "tests/test_flags.py",  # bad flag values, generated from each script's Args (by glob)
    "tests/test_settings.py",  # --help lists each script's named settings (by glob)
    "tests/test_layout.py",  # the size budget of the originals (by glob; a copy is exempt)
    "tests/test_flag_parity.py",  # the PPO family's flags: ppo.py against the listed originals, never a copy
]


def copy_text(script: str, edits: list, least: int) -> str:
    """A researcher's copy of algos/`script`.py: its text with `edits` (anchor -> replacement, each anchor found
    exactly once, so a change to the original that moves one fails here loudly), at least `least` lines added."""
    import difflib

    original = (ROOT / "algos" / f"{script}.py").read_text()
    text = original
    for anchor, replacement in edits:
        assert text.count(anchor) == 1, f"the copy's edit no longer applies to algos/{script}.py: {anchor!r}"
        text = text.replace(anchor, replacement)
    added = [line for line in difflib.unified_diff(original.splitlines(), text.splitlines(), n=0) if line[:1] == "+"]
    assert len(added) - 1 >= least, f"the copy is an idea of {least}+ lines, not {len(added) - 1}"
    return text


def own_contract(kwargs: dict) -> tuple[str, str]:
    """The edit that gives a copy contract settings of its own (tests/contract.py's copy_entry): values of the flags
    it adds, so that its check runs them at other values than their defaults."""
    anchor = 'if __name__ == "__main__":\n'
    return anchor, f'CONTRACT = {{"kwargs": {kwargs!r}}}  # the settings of this copy\'s contract tests\n\n\n{anchor}'


def run_contract_tests(checkout: Path, copies: dict[str, int]) -> list[str]:
    """Every test of the suite that finds the scripts in algos/ (PER_SCRIPT_TESTS), run once in `checkout` on its
    copies (`copies`: name -> capture layouts of its original) as the README's test command would run them (its own
    common/, not one installed from elsewhere), but for what runs the originals' code paths unchanged at a cost of
    minutes, which the originals' own runs check: the torchrun faults and two-process resume (SIGTERM, SIGKILL),
    videos, and the compiled runs and captured replays (with the replays' device-kernel guard) of the capture layouts
    past the plain one (another env adapter, pixels: the originals' branches, which these copies leave as they are).
    Fails unless all passed, each file ran, and ran on each copy where the copy is a parameter, among them its exact
    resume and its compiled run against its eager one. Returns the passed tests' ids."""
    env = dict(subprocess_env(), PYTHONPATH=str(checkout))
    others = [
        f"--deselect=tests/{test}[{name}-{i}]"
        for test in (
            "test_scripts.py::test_compiled_run_computes_what_eager_computes",
            "test_scripts.py::test_captured_functions_replay_the_same_kernels_on_the_same_tensors_without_host_sync",
        )
        for name, layouts in copies.items()
        for i in range(1, layouts)
    ]
    # the README's shape and links: the project's documentation, which the checkout does not carry and no copy changes
    others.append(
        "--deselect=tests/test_layout.py::test_the_readme_reads_in_minutes_in_its_order_and_links_what_exists"
    )
    costly = "not sigterm and not sigkill and not video and not two_process"
    result = run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rA",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            *PER_SCRIPT_TESTS,
            "-k",
            f"test_layout or test_flag_parity or every_script or (({' or '.join(copies)}) and {costly})",
            *others,
        ],
        timeout=1800,
        env=env,
        cwd=checkout,
    )
    assert result.returncode == 0 and " passed" in result.stdout, result.stdout[-4000:]
    assert " failed" not in result.stdout and "error" not in result.stdout.splitlines()[-1], result.stdout[-4000:]
    passed = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("PASSED ")]
    for tests in PER_SCRIPT_TESTS:  # each file ran, on each copy where the copy is a parameter
        assert any(test.startswith(f"{tests}::") for test in passed), (tests, result.stdout[-4000:])
    for name in copies:
        for tests in PER_SCRIPT_TESTS[:3]:
            assert any(test.startswith(f"{tests}::") and f"[{name}" in test for test in passed), (name, tests, passed)
        for test in (
            f"test_every_flag_a_copy_adds_runs_at_a_value_of_its_own[{name}]",
            f"test_every_tensor_an_iteration_carries_is_in_the_checkpoint[{name}]",
            f"test_resume_is_bit_identical_to_an_uninterrupted_run[{name}]",
            f"test_compiled_run_computes_what_eager_computes[{name}-0]",
            f"test_captured_functions_replay_the_same_kernels_on_the_same_tensors_without_host_sync[{name}-0]",
        ):
            assert f"tests/test_scripts.py::{test}" in passed, (test, passed)
    assert (
        "tests/test_flags.py::test_every_bad_numeric_or_choice_flag_value_of_every_script_is_a_one_line_usage_error"
        in passed
    )
    return passed


@pytest.mark.slow
def test_copies_made_as_a_researcher_would_pass_the_contract_tests(tmp_path):
    """A fresh checkout (algos/, common/, tests/, pyproject.toml) and three copies in its algos/, each made from its
    script's text alone, common/ untouched: the README's (`cp algos/ppo.py algos/ppo_myidea.py` and 20+ lines of an
    idea in it, README_COPY: a KL penalty with two flags of declared ranges, a coefficient adapted in place and
    checkpointed, a logged statistic), td3.py with REDQ's random pair of three critics and annealed target policy
    noise (tests/test_copy_td3.py), and ppo_lstm.py with chunked BPTT (tests/test_copy_ppo_lstm.py). Every test of the
    suite that finds the scripts in algos/ runs on the three in one run (run_contract_tests: the contract, the
    generated bad flag values, --help's settings, the layout and the flag parity of the
    originals, which hold a copy to nothing and compare no copy with its original); tests/test_bench.py's gpu_check
    test (every script's iterations and torchrun again) is left out for the same reason as the costly cases, its CPU
    checks of a captured function are among the contract's. Then the README's idea is live (the other two copies'
    ideas: their own files)."""
    import hashlib
    import shutil

    from tests.test_copy_ppo_lstm import CHUNKS
    from tests.test_copy_td3 import REDQ_COPY
    from tests.contract import CONTRACT

    for part in ("algos", "common", "tests"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__", "results"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    copies = {  # name: (its original, the idea and the contract settings of its own, the least lines it adds)
        "ppo_myidea": ("ppo", [*README_COPY, own_contract({"kl_coef": 0.5, "kl_target": 0.02})], 20),
        "td3_redq": ("td3", [*REDQ_COPY, own_contract({"policy_noise_final": 0.05})], 10),
        "ppo_lstm_chunks": ("ppo_lstm", [*CHUNKS, own_contract({"seq_len": 1})], 10),
    }
    for name, (script, edits, least) in copies.items():
        (tmp_path / "algos" / f"{name}.py").write_text(copy_text(script, edits, least))
    digest = lambda: {p: hashlib.sha256(p.read_bytes()).digest() for p in sorted((tmp_path / "common").rglob("*.py"))}
    common_before = digest()
    run_contract_tests(tmp_path, {name: len(CONTRACT[script]["captures"]) for name, (script, _, _) in copies.items()})
    assert digest() == common_before, "a copy needs no change to common/"
    # and the README's idea is live: its coefficient adapted in place and checkpointed, its penalty logged
    try:
        idea = load_script("ppo_myidea", tmp_path / "algos" / "ppo_myidea.py")
        run_main(idea, **PLAIN, output_dir=str(tmp_path / "idea"), total_timesteps=2 * ITERATION)
    finally:
        sys.modules.pop("ppo_myidea", None)
    kl_coef = own_state(tmp_path / "idea" / "run", "kl_coef")
    assert kl_coef.shape == () and kl_coef != torch.tensor(0.2) and 0 < kl_coef <= 100, kl_coef  # --kl-coef: 0.2
    assert len(scalars(tmp_path / "idea" / "run")["losses/kl_penalty"]) == 2


def test_dynamos_notice_of_a_profiler_range_is_dropped_and_its_other_warnings_are_not(caplog):
    """torch.optim's step opens a profiler range that dynamo ignores, with a warning at every compiled run; a
    compiled run drops that warning at the loggers that make it, and only that one."""
    import logging

    import torch._dynamo.variables.ctx_manager as ctx_manager
    import torch._dynamo.variables.torch as torch_variables

    from common.run import start_run

    ppo = load_script("ppo")
    start_run(ppo.Args(device="cpu", compile=True, cudagraphs=False), "ppo")
    # caplog's handler on the logger itself, and the logger's propagation off while the test speaks: whether records
    # reach the root, where caplog listens, depends on the worker's earlier tests (once torch's logging has set itself
    # up, in any compiled run, torch._dynamo's logger stops propagating); with both, each record came twice
    for log in (ctx_manager.log, torch_variables.log):  # the loggers dynamo warns with
        level, propagate = log.level, log.propagate
        log.addHandler(caplog.handler)
        log.setLevel(logging.WARNING)
        log.propagate = False
        try:
            log.warning("Profiler record function %s will be ignored", "<class 'record_function'>")
            log.warning("Graph break from %s", "something else")
        finally:
            log.removeHandler(caplog.handler)
            log.setLevel(level)
            log.propagate = propagate
    said = [r.getMessage() for r in caplog.records]
    assert said == ["Graph break from something else"] * 2, said


@pytest.mark.slow
def test_a_copy_of_every_script_runs_the_flag_it_adds_in_its_check(tmp_path):
    """A copy of each script in algos/ (pqn's among them), each with a new flag that is off by default and says at
    start whether it is on, in algos/ of a fresh checkout: its check (`-k <copy>`) runs it turned on, finds that every
    flag it adds is run (test_every_flag_a_copy_adds_runs_at_a_value_of_its_own), and treats a foreign algorithm's
    checkpoint as foreign (a copy of pqn.py included). Kept to the cheap tests of a copy's check: one run each."""
    import shutil

    for part in ("algos", "common", "tests"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__", "results"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    originals = sorted(p.stem for p in (ROOT / "algos").glob("*.py") if load_script(p.stem).ALGO == p.stem)
    flag = (
        "class Args(RunArgs):\n",
        'class Args(RunArgs):\n    new_idea: bool = False\n    """a copy\'s idea, off by default"""\n',
    )
    said = (
        "def train(run, args: Args) -> dict:\n",
        "def train(run, args: Args) -> dict:\n"
        "    print(f\"{run.algo}: the new idea is {'on' if args.new_idea else 'off'}\", flush=True)\n",
    )
    for script in originals:
        (tmp_path / "algos" / f"{script}_idea.py").write_text(copy_text(script, [flag, said], 3))
    copies = " or ".join(f"{script}_idea" for script in originals)
    result = run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-s",
            "-rA",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",  # one process, whose output -s shows
            "tests/test_scripts.py",
            "-k",
            f"({copies}) and (another_network_shape or bad_inputs or every_flag_a_copy_adds)",
        ],
        timeout=900,
        env=dict(subprocess_env(), PYTHONPATH=str(tmp_path)),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-4000:]
    passed = {line.split()[1] for line in result.stdout.splitlines() if line.startswith("PASSED ")}
    for script in originals:
        for test in (
            "test_checkpoint_of_another_network_shape_is_a_clear_error",
            "test_bad_inputs_fail_with_a_clear_cause",
            "test_every_flag_a_copy_adds_runs_at_a_value_of_its_own",
        ):
            assert f"tests/test_scripts.py::{test}[{script}_idea]" in passed, (test, script, result.stdout[-4000:])
        assert f"{script}_idea: the new idea is on" in result.stdout, (script, result.stdout[-4000:])
        assert f"{script}_idea: the new idea is off" not in result.stdout, script


# A CrossQ copy of sac.py (Bhatt et al. 2024): BatchNorm in the critics, one pass of the online critics over the batch
# and the next observations together (the statistics of both), no target critics; the actor reads the critics with
# their running statistics (eval mode). With dropout in the critics beside it (DroQ's), a flag of its own whose value
# the copy's CONTRACT gives (a bool flag is turned on by itself; a number needs one).
CROSSQ = [
    (
        "class Args(RunArgs):\n",
        "class Args(RunArgs):\n"
        "    critic_batch_norm: bool = False\n"
        '    """CrossQ: BatchNorm after each hidden layer of the critics, no target critics"""\n'
        "    critic_dropout: float = 0.0\n"
        '    """dropout after each hidden layer of the critics (DroQ)"""\n',
    ),
    (
        "NUM_CRITICS = 2  # clipped double Q (the minimum of the two)\n",
        "NUM_CRITICS = 2  # clipped double Q (the minimum of the two)\n"
        'CONTRACT = {"kwargs": {"critic_dropout": 0.1}}  # the copy\'s own contract settings (tests/contract.py)\n'
        "\n\n"
        "class EnsembleBatchNorm(nn.Module):\n"
        '    """BatchNorm over [E, B, dim], each member its own statistics and affine, then dropout."""\n'
        "\n"
        "    def __init__(self, num: int, dim: int, dropout: float):\n"
        "        super().__init__()\n"
        "        self.norm = nn.BatchNorm1d(num * dim, momentum=0.01)\n"
        "        self.dropout = nn.Dropout(dropout)\n"
        "\n"
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
        "        e, b, d = x.shape\n"
        "        y = self.norm(x.permute(1, 0, 2).reshape(b, e * d)).reshape(b, e, d).permute(1, 0, 2)\n"
        "        return self.dropout(y)\n"
        "\n\n"
        "def critic_norm(args):\n"
        "    if args.critic_batch_norm:\n"
        "        return functools.partial(EnsembleBatchNorm, NUM_CRITICS, dropout=args.critic_dropout)\n"
        "    if args.critic_dropout:\n"
        "        return lambda dim: nn.Dropout(args.critic_dropout)\n"
        "    return functools.partial(EnsembleLayerNorm, NUM_CRITICS) if args.critic_layer_norm else None\n",
    ),
    (
        "            norm=functools.partial(EnsembleLayerNorm, NUM_CRITICS) if args.critic_layer_norm else None,\n",
        "            norm=critic_norm(args),\n",
    ),
    (
        '        next_q = agent.q(agent.critic_target, b["next_obs_n"], next_action).min(0).values\n'
        '        target = b["rewards"] + b["bootstrap"] * (next_q - agent.log_alpha.exp() * next_logp)\n'
        "    with torch.autocast(b.device.type, dtype=torch.bfloat16, enabled=args.bf16):\n"
        '        q = agent.q(agent.critic, b["obs_n"], b["actions"])\n',
        "    with torch.autocast(b.device.type, dtype=torch.bfloat16, enabled=args.bf16):\n"
        "        if args.critic_batch_norm:  # one pass over both batches: BatchNorm's statistics of the two\n"
        "            key = agent.critic_key\n"
        '            now = torch.cat([b["obs_n", key], b["actions"]], -1)\n'
        '            then = torch.cat([b["next_obs_n", key], next_action], -1)\n'
        "            q, next_q = agent.critic(torch.cat([now, then])).squeeze(-1).float().chunk(2, dim=1)\n"
        "            next_q = next_q.detach().min(0).values\n"
        "        else:\n"
        "            with torch.no_grad():\n"
        '                next_q = agent.q(agent.critic_target, b["next_obs_n"], next_action).min(0).values\n'
        '            q = agent.q(agent.critic, b["obs_n"], b["actions"])\n'
        '        target = b["rewards"] + b["bootstrap"] * (next_q - agent.log_alpha.exp().detach() * next_logp)\n',
    ),
    (  # no target critics (their soft update left at no step)
        "p_target.lerp_(p, args.tau)",
        "p_target.lerp_(p, 0.0 if args.critic_batch_norm else args.tau)",
    ),
    (
        '        q = agent.q(agent.critic, b["obs_n"], action).min(0).values\n',
        "        agent.critic.eval()  # the running statistics (and no dropout) for the actor\n"
        '        q = agent.q(agent.critic, b["obs_n"], action).min(0).values\n'
        "        agent.critic.train()\n",
    ),
]


def test_a_crossq_copy_with_dropout_critics_computes_compiled_what_it_computes_eagerly(tmp_path, monkeypatch):
    """The CrossQ copy (BatchNorm critics on the joint batch, train and eval statistics, dropout) compiled in lockstep
    with eager, as the contract's compiled-vs-eager test runs it: every compiled call returns and writes what eager
    does at float32 rounding (its reorderings of the batch statistics no longer compound over the run). Its settings:
    sac's first layout with what its check would give it (tests/contract.py's copy_entry: --critic-batch-norm turned
    on, the --critic-dropout of its CONTRACT)."""
    from tests.contract import COMMON, CONTRACT

    path = tmp_path / "algos" / "sac_crossq.py"
    path.parent.mkdir()
    path.write_text(copy_text("sac", CROSSQ, 20))
    module = load_script("sac_crossq", path)
    settings = {**COMMON, **CONTRACT["sac"]["kwargs"], **CONTRACT["sac"]["captures"][0]}
    settings.update(critic_batch_norm=True, critic_dropout=0.1, output_dir=str(tmp_path), total_timesteps=48)
    checked = lockstep_compiled(monkeypatch)
    try:
        with inductor_settings(kernels=True):  # the batch statistics as inductor's kernels fuse and reorder them
            run_main(module, **settings, compile=True)
    finally:
        sys.modules.pop("sac_crossq", None)
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert any(k.endswith("norm.running_mean") for k in state), "the critics have no BatchNorm"
    assert sum(checked.calls.values()) >= 6 and len(checked.calls) >= 3, checked.calls  # acting, critic, actor
