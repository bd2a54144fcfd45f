"""A copy of a script is a first-class script: what a researcher adds to a copy of ppo.py (a flag, a
logged statistic, a running tensor in the checkpoint) works under --compile and --resume without a
change to common/, and the contract tests catch a compiled write that is dropped.

The copy is made as a researcher would make it: algos/ppo.py, edited as text (each edit must apply
exactly once, so a change to ppo.py that moves an anchor fails here loudly, not silently).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import pytest
import torch

from common.args import Ge, Le, RunArgs, check_numbers, given_flags, parse_args
from tests.helpers import ROOT, load_script, run_main
from tests.test_scripts import assert_runs_alike, next_second, scalars

# The copy's edits: (anchor in ppo.py, what replaces it)
EDITS = [
    # (a) two new flags, defaults a name-based check would have refused: no range declared, none checked
    ("class Args(RunArgs):\n",
     'class Args(RunArgs):\n    weight_norm: float = 0.0\n    """L2 penalty on the actor\'s weights"""\n'
     '    warmup_iters: int = 0\n    """iterations before anything new starts (a flag a copy adds)"""\n'),
    ("    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef\n",
     "    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef\n"
     "    loss = loss + args.weight_norm * sum((p**2).sum() for p in agent.actor.parameters())\n"),
    # (b) a new statistic of the targets, logged as losses/adv_abs; (c) a running 0-d float64 tensor
    # written in place in the compiled targets and declared in the checkpoint state
    ("ep_stats: torch.Tensor, episodes: torch.Tensor, args: Args):",
     "ep_stats: torch.Tensor, episodes: torch.Tensor, args: Args, adv_ema: torch.Tensor):"),
    ("    var_y = returns.var()\n", "    adv_ema.mul_(0.9).add_(0.1 * advantages.abs().mean())\n    var_y = returns.var()\n"),
    ('{"explained_variance": explained_variance}', '{"explained_variance": explained_variance, "adv_abs": advantages.abs().mean()}'),
    ('stats["episodes"], args)', 'stats["episodes"], args, adv_ema)'),
    ("    ep_stats = torch.zeros(2, args.num_envs, device=device, dtype=torch.float64)  # running return, length\n",
     "    ep_stats = torch.zeros(2, args.num_envs, device=device, dtype=torch.float64)  # running return, length\n"
     "    adv_ema = torch.zeros((), device=device, dtype=torch.float64)  # the copy's running statistic\n"),
    ('shared={"learning_rate": lr, "reward_normalizer": reward_normalizer}',
     'shared={"learning_rate": lr, "reward_normalizer": reward_normalizer, "adv_ema": adv_ema}'),
]
TINY = dict(device="cpu", progress=False, run_name="run", env_id="Pendulum-v1", num_envs=16, num_steps=8, num_minibatches=2,
            hidden_sizes=(32, 32), num_eval_envs=4, eval_interval=0, save_interval=10_000,
            env_kwargs='{"max_episode_steps": 16}', weight_norm=0.0, warmup_iters=0)
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


def own_state(run_dir: Path) -> torch.Tensor:
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["state"]["adv_ema"]


def test_a_copy_with_new_flags_a_statistic_and_state_compiles_as_it_runs_eagerly(copy, tmp_path):
    """--compile: the flags are accepted, the new statistic is logged and non-zero, and the running 0-d
    float64 tensor (whose in-place write torch.compile would drop on a CPU) ends non-zero and equal to
    the eager run's, as does everything else the run holds and logs."""
    import torch._inductor.config

    module, out = copy
    with torch._inductor.config.patch(fallback_random=True):
        run_main(module, **TINY, output_dir=str(tmp_path), total_timesteps=3 * ITERATION, compile=True)
    eager, compiled = out / "eager" / "run", tmp_path / "run"
    assert own_state(compiled) != 0 and own_state(compiled) == pytest.approx(own_state(eager).item(), rel=1e-6)
    assert all(value != 0 for _, value in scalars(compiled)["losses/adv_abs"])
    assert_runs_alike(eager, compiled)


def test_compile_parity_fails_when_a_compiled_write_is_dropped(copy, tmp_path, monkeypatch):
    """Without the guard of common.capture.compiled, torch.compile drops the copy's in-place update of its
    0-d float64 statistic: the parity check of the contract tests names that entry."""
    import common.capture
    import torch._inductor.config

    module, out = copy
    monkeypatch.setattr(common.capture, "zero_d_float64_writes", lambda gm: [])
    with torch._inductor.config.patch(fallback_random=True):
        run_main(module, **TINY, output_dir=str(tmp_path), total_timesteps=3 * ITERATION, compile=True)
    assert own_state(tmp_path / "run") == 0  # the write was dropped
    with pytest.raises(AssertionError, match=r"\['state'\]\['adv_ema'\]"):
        assert_runs_alike(out / "eager" / "run", tmp_path / "run")


def test_a_copy_resumes_its_own_state_exactly_and_starts_from_the_original_with_init_from(copy, tmp_path, capsys):
    module, out = copy
    common = dict(TINY, output_dir=str(tmp_path / "copy"), total_timesteps=3 * ITERATION)
    run_main(module, **common, max_wall_seconds=0.0)  # stops after its first iteration
    next_second()
    run_main(module, **common, resume="auto")
    assert own_state(tmp_path / "copy" / "run") == own_state(out / "eager" / "run")  # bit for bit

    # the original script's checkpoint lacks the copy's state: one line, and the way on
    ppo = load_script("ppo")
    plain = {k: v for k, v in TINY.items() if k not in ("weight_norm", "warmup_iters")}
    run_main(ppo, **plain, output_dir=str(tmp_path / "ppo"), total_timesteps=2 * ITERATION)
    original = tmp_path / "ppo" / "run" / "checkpoints" / "last.pt"
    with pytest.raises(SystemExit, match=rf"^error: {original} .*lacks adv_ema \(shared\), which this script declares;.*"
                                         rf"--init-from {original}$"):
        run_main(module, **TINY, output_dir=str(tmp_path / "x"), resume=str(original))
    with pytest.raises(SystemExit, match=r"holds adv_ema \(shared\), which this script does not declare"):
        run_main(ppo, **plain, output_dir=str(tmp_path / "y"), resume=str(out / "eager" / "run"))

    # --init-from: the original's weights and normalizers, nothing else (a new run from step 0)
    capsys.readouterr()
    started = run_main(module, **TINY, output_dir=str(tmp_path / "init"), total_timesteps=ITERATION, init_from=str(original))
    assert started["global_step"] == ITERATION
    said = capsys.readouterr().out
    tensors = len(torch.load(original, weights_only=True)["model"])
    assert f"initialised from {original} (ppo on Pendulum-v1, global step {2 * ITERATION:,}): {tensors} of {tensors} " \
           f"model tensors, normalizers reward_normalizer" in said
    # it starts from the original's observation statistics (one rollout more folded in)
    count = torch.load(original, weights_only=True)["model"]["obs_rms.count"]
    assert torch.load(tmp_path / "init" / "run" / "checkpoints" / "last.pt", weights_only=True)["model"]["obs_rms.count"] \
        == count + ITERATION
    # networks that fit none of its tensors (another env) take nothing and say so
    with pytest.raises(SystemExit, match=r"--init-from .*: none of its \d+ model tensors fits .*--env-id Pendulum-v1"):
        run_main(module, **{**TINY, "env_id": "CartPole-v1", "hidden_sizes": (8,), "obs_norm": False},
                 output_dir=str(tmp_path / "z"), total_timesteps=ITERATION, init_from=str(original))


def test_resume_continues_the_run_it_points_to(tmp_path, capsys):
    """--resume without --num-envs or --total-timesteps continues the run at its own sizes to its own end;
    a given flag that cannot continue it stops in one line."""
    ppo = load_script("ppo")
    plain = {k: v for k, v in TINY.items() if k not in ("weight_norm", "warmup_iters")}
    first = run_main(ppo, **plain, output_dir=str(tmp_path), total_timesteps=4 * ITERATION, max_wall_seconds=0.0)
    assert first["global_step"] == ITERATION
    unsized = {k: v for k, v in plain.items() if k != "num_envs"}  # Args' default is 4096 envs
    with pytest.raises(SystemExit, match=r"^error: an iteration of 1 process\(es\) x 2048 envs is 16,384 env steps, more "
                                         r"than the 384 left from step 128 to --total-timesteps 512: resume with the "
                                         r"checkpoint's --num-envs 16"):
        run_main(ppo, **unsized, num_envs=2048, output_dir=str(tmp_path), resume="auto")
    with pytest.raises(SystemExit, match=r"is at global step 128, past --total-timesteps 64: drop --total-timesteps"):
        run_main(ppo, **unsized, output_dir=str(tmp_path), resume="auto", total_timesteps=64)
    next_second()
    capsys.readouterr()
    last = run_main(ppo, **unsized, output_dir=str(tmp_path), resume="auto")
    assert last["global_step"] == 4 * ITERATION and last["iteration"] == 4 and last["stop_reason"] == "total_timesteps"
    assert "from the checkpoint: --num-envs 16 --total-timesteps 512" in capsys.readouterr().out


def test_per_rank_state_that_cannot_be_restored_is_named(tmp_path, capsys):
    ppo = load_script("ppo")
    plain = {k: v for k, v in TINY.items() if k not in ("weight_norm", "warmup_iters")}
    gym = dict(plain, env_id="gym:Pendulum-v1", env_kwargs='{"env_kwargs": {"max_episode_steps": 16}}',
               output_dir=str(tmp_path), total_timesteps=2 * ITERATION)
    run_main(ppo, **gym, max_wall_seconds=0.0)
    capsys.readouterr()
    run_main(ppo, **gym, resume="auto")
    assert ("notice: per-rank state not restored (the envs start fresh episodes), starting from its initial values: "
            "ep_stats, reward_returns") in capsys.readouterr().out


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
    for bad, line in ((dict(rate=1.5), r"--rate must be in \[0, 1\], got 1.5"), (dict(rate=float("nan")), "--rate must be"),
                      (dict(sizes=(4, 0)), r"each of --sizes must be >= 1, got \(4, 0\)"),
                      (dict(num_envs=0), "--num-envs must be >= 1, got 0")):
        with pytest.raises(SystemExit, match=rf"^error: {line}"):
            check_numbers(Renamed(**bad))


def test_the_given_flags_are_the_command_lines_whatever_the_class_is_called(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["copy.py", "--rate", "0.25", "--no-track", "--seed=3"])
    args = parse_args(Renamed)
    assert args.rate == 0.25 and {"rate", "track", "seed"} <= given_flags(args)  # 0.25 is the default: named all the same
    assert "warmup_iters" not in given_flags(args) and "rate" not in given_flags(Renamed())
