"""Why an off-policy run's return fell: its critic's Q-values over training and its actor at the end.

    python -m tests.benchmarks.collapse runs/ant-1m-r/td3__gym:Ant-v5__1mnoobsnorm27u8__3

For each run directory of td3.py (TensorBoard events and a last.pt written with --save-buffer):

- the critic: `losses/q_values` (the batch's mean Q of the first critic) and `losses/q_loss` at a few steps, their
  highest, and the first step where the mean Q rose above `--jump` times the highest it had been ten logs before (a
  critic that diverged rather than learned: it had climbed smoothly to there);
- the deterministic tanh actor of last.pt on the observations of its replay buffer's newest `--steps` steps of every
  env: the median |pre-tanh| output and the share of actions within 1% of a bound (a saturated tanh passes no
  gradient back, so an actor pushed there by a diverged critic stays), and the mean sum of squared actions
  (gymnasium's Ant pays 0.5 x that per step, against a healthy reward of 1).

The actor's part needs a run without observation normalization (`--no-obs-norm`: the buffer holds what the actor
sees); for another run it is left out with a line saying so.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from common.nets import mlp
from tests.benchmarks.bench import read_scalars


def q_values(run_dir: Path) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(step, mean Q) and (step, critic loss) as logged."""
    scalars = read_scalars(run_dir)
    return [(step, v) for _, step, v in scalars["losses/q_values"]], [
        (step, v) for _, step, v in scalars["losses/q_loss"]
    ]


def first_jump(q: list[tuple[int, float]], jump: float, lag: int = 10) -> int | None:
    """The first step whose mean Q exceeds `jump` times the largest |Q| logged up to `lag` logs before it (a critic
    that learns climbs less than that in `lag` logs once it has left its start; a diverging one in a few)."""
    for i in range(2 * lag, len(q)):
        if abs(q[i][1]) > jump * max(abs(v) for _, v in q[: i - lag + 1]):
            return q[i][0]
    return None


def actor_at_the_end(checkpoint: dict, steps: int) -> dict | str:
    """The checkpoint's actor on its buffer's newest `steps` observations of every env."""
    if checkpoint["args"].get("obs_norm"):
        return "left out: the run normalizes observations (this reads runs with --no-obs-norm)"
    rank = checkpoint["ranks"][0]
    if "buffer" not in rank:
        return "left out: last.pt holds no replay buffer (--save-buffer)"
    buffer = rank["buffer"]
    obs = buffer["data"]["obs.policy"]  # (envs, capacity, dims)
    newest = (buffer["ptr"] - 1 - torch.arange(min(steps, buffer["size"]))) % buffer["capacity"]
    x = obs[:, newest].reshape(-1, obs.shape[-1]).float()
    args = checkpoint["args"]
    net = mlp(obs.shape[-1], checkpoint["model"]["action_scale"].numel(), tuple(args["hidden_sizes"]))
    net.load_state_dict(
        {k.removeprefix("actor.0."): v for k, v in checkpoint["model"].items() if k.startswith("actor.0.")}
    )
    with torch.no_grad():
        x = net(x)  # the actor before its tanh
    action = torch.tanh(x)
    return {
        "observations": action.shape[0],
        "median |pre-tanh|": x.abs().median().item(),
        "share of actions within 1% of a bound": (action.abs() > 0.99).float().mean().item(),
        "mean sum of squared actions": (action**2).sum(-1).mean().item(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories")
    parser.add_argument("--jump", type=float, default=10.0, help="a rise of the mean Q by this factor is a divergence")
    parser.add_argument("--steps", type=int, default=300, help="newest steps of every env the actor is given")
    args = parser.parse_args()
    for run_dir in args.runs:
        checkpoint = torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
        q, loss = q_values(run_dir)
        print(
            f"{run_dir.name}: last eval return {checkpoint['totals']['last_eval_return']:.1f} at step "
            f"{checkpoint['global_step']:,}, best {checkpoint['best_eval_return']:.1f}"
        )
        for (step, value), (_, critic_loss) in zip(q[:: max(1, len(q) // 10)], loss[:: max(1, len(loss) // 10)]):
            print(f"  step {step:>9,}: mean Q {value:14,.1f}  critic loss {critic_loss:18,.1f}")
        peak, peak_loss = max(q, key=lambda e: abs(e[1])), max(loss, key=lambda e: e[1])
        print(
            f"  highest |mean Q| {abs(peak[1]):,.1f} at step {peak[0]:,}; highest critic loss {peak_loss[1]:.3g} at "
            f"step {peak_loss[0]:,}"
        )
        jump = first_jump(q, args.jump)
        print(
            f"  mean Q rose {args.jump:g}x above its highest of ten logs before at step {jump:,}"
            if jump is not None
            else f"  mean Q never rose {args.jump:g}x above its highest of ten logs before"
        )
        actor = actor_at_the_end(checkpoint, args.steps)
        print(
            "  actor at the end: "
            + (
                actor
                if isinstance(actor, str)
                else ", ".join(f"{k} {v:,.3f}" if isinstance(v, float) else f"{k} {v:,}" for k, v in actor.items())
            )
        )


if __name__ == "__main__":
    main()
