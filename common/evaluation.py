"""Evaluation of a policy on the eval envs, within a step budget, with its video and export.

The evaluated action is the policy's `evaluation_action(obs)` where it has one (pqn.py: epsilon-greedy, the DQN
protocol), else its deterministic one, `deterministic(obs)`, which is also what --export writes.

An evaluation keeps the run's progress promise (a line at least every PROGRESS_SECONDS: the episodes done and the
time left, said between two chunks) and answers a stop request (SIGINT, SIGTERM: the run's PreemptionGuard) at the
next chunk: it ends there, says so, is not logged, and the run saves and stops after it."""

from __future__ import annotations

import functools
import json
import math
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tensordict import TensorDict

from common import distributed, stats, video
from common.capture import captured, compiled
from common.checkpoint import export_run_policy
from common.args import eval_seed
from common.stats import duration, plural, train_return

if TYPE_CHECKING:
    from common.record import Run


EVAL_CHUNK = 64  # eval steps between two host reads ("has every env finished?"); one CUDA graph
EVAL_SHARE = 0.05  # an evaluation plays at most this share of the env steps a process trains between two of them
EVAL_FLOOR = 1_000  # and at least this many steps an episode: a whole classic-control, MuJoCo or mjlab episode


def eval_steps(run: Run) -> int:
    """The budget of an evaluation: the most steps each eval env plays in it, EVAL_SHARE of the steps this process
    trains between two evaluations spread over its eval envs, at least EVAL_FLOOR per episode, in whole chunks.
    --eval-only keeps the budget of the run's evaluations (its steps per iteration from its checkpoint's counters),
    so that it replays them."""
    args, per = run.args, run.steps_per_iteration / run.world_size
    if not per and run.checkpoint is not None:
        ckpt = run.checkpoint
        per = ckpt["global_step"] / max(ckpt["iteration"], 1) / ckpt.get("world_size", 1)
    steps = max(EVAL_FLOOR * args.eval_episodes, math.ceil(EVAL_SHARE * args.eval_interval * per / args.num_eval_envs))
    return -(-steps // EVAL_CHUNK) * EVAL_CHUNK


def _eval_step(eval_envs, model, episodes: int, acc: dict, obs: TensorDict) -> TensorDict:
    """One evaluated step of every eval env; each env's first `episodes` episodes summed into `acc` in place."""
    act = getattr(model, "evaluation_action", model.deterministic)
    obs, reward, terminated, truncated, info = eval_envs.step(act(obs["policy"]))
    if hasattr(model, "reset_state"):  # a recurrent policy: zero the hidden state of the envs whose episode ended
        model.reset_state(terminated | truncated)
    running, done_count = acc["running"], acc["done_count"]
    active = done_count < episodes
    # An episode is the game where the env reports one apart from the learner's (Atari's presets).
    reward, ended = info.get("game_reward", reward), info.get("game_over", terminated | truncated)
    running += torch.stack([reward.double(), torch.ones_like(running[1])]) * active
    done = ended & active
    ended = done.double().sum()
    success = info.get("success")  # per env, valid where an episode ended
    succeeded = (success.bool() & done).double().sum() if success is not None else torch.zeros_like(ended)
    reported = ended if success is not None else torch.zeros_like(ended)
    acc["sums"] += torch.stack([(running[0] * done).sum(), (running[1] * done).sum(), ended, succeeded, reported])
    done_count += done.long()
    running *= ~done
    return obs


def _eval_chunk(run: Run | None, eval_envs, model, episodes: int):
    """(EVAL_CHUNK eval steps as one function, its accumulators), compiled and captured once per model and envs."""
    n, dev = eval_envs.num_envs, eval_envs.device
    key = (id(eval_envs), id(model), episodes)
    cache = run.eval_chunks if run is not None else {}
    if key not in cache:
        acc = {
            "running": torch.zeros(2, n, device=dev, dtype=torch.float64),  # return, length
            "done_count": torch.zeros(n, device=dev, dtype=torch.long),
            "sums": torch.zeros(5, device=dev, dtype=torch.float64),
        }
        step = functools.partial(_eval_step, eval_envs, model, episodes, acc)
        capturable = getattr(eval_envs, "capturable", False)
        if run is not None and capturable:
            step = compiled(run, step)

        def chunk(obs: TensorDict) -> TensorDict:
            for _ in range(EVAL_CHUNK):
                obs = step(obs)
            return obs

        cache[key] = (captured(run, "evaluation", chunk, capture=capturable) if run is not None else chunk, acc)
    return cache[key]


@contextmanager
def seeded(seed: int, device: torch.device):
    """The random draws of an evaluation (an exploring policy's) from generators seeded by `seed`: it replays exactly,
    and the training's random streams, forked here, go on as if it had not run."""
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.default_generator.manual_seed(seed)
        for index in cuda:
            torch.cuda.default_generators[index].manual_seed(seed)
        yield


def stop_requested(run: Run | None) -> str | None:
    """The signal that asked the run to stop (the PreemptionGuard's, as the training loop reads it), else None."""
    guard = getattr(run, "guard", None)
    return None if guard is None else guard.received


class Watch:
    """Between two chunks of an evaluation: a progress line once PROGRESS_SECONDS have passed since the run's last line
    (rank 0 with --progress: run.progress, whose clock decides it), and whether a stop was requested. No host read but
    the progress line's own (the episodes done), one per PROGRESS_SECONDS at most; an evaluation that ends within its
    first chunk reads no clock."""

    def __init__(self, run: Run | None, total_steps: int, envs: int, episodes: int):
        self.run, self.total_steps, self.episodes = run, total_steps, envs * episodes
        self.progress = getattr(run, "progress", None)
        self.start = time.monotonic()  # for the time it has taken and the most that is left

    def after(self, steps: int, done_count: torch.Tensor, episodes: int) -> bool:
        """After `steps` steps of each eval env: the progress line if due; True where a stop was requested."""
        if self.progress is not None and self.progress.clock() - self.progress.last_line >= stats.PROGRESS_SECONDS:
            done = int(done_count.clamp(max=episodes).sum())  # one host read per progress line
            spent = time.monotonic() - self.start
            left = spent / steps * (self.total_steps - steps)
            print(
                f"evaluation at step {self.run.global_step:,}: {done} of {plural(self.episodes, 'episode')} done "
                f"after {duration(spent)} ({steps:,} of at most {self.total_steps:,} steps each), at most "
                f"{duration(left)} left",
                flush=True,
            )
            self.progress.shown()
        return stop_requested(self.run) is not None


@torch.no_grad()
def run_episodes(
    eval_envs,
    model: torch.nn.Module,
    episodes: int,
    seed: int,
    record: int = 0,
    run: Run | None = None,
    max_steps: int | None = None,
) -> dict:
    """The first `episodes` episodes of every eval env, reduced over all ranks (a collective): mean return and
    length, success rate and the first `record` envs' frames. A recurrent policy's `reset_state(done)` (bool
    [num_eval_envs]) zeroes those envs' state in place. One host read per EVAL_CHUNK steps (per step when recording).

    `max_steps` (whole chunks) is the budget of each eval env: where it runs out, the episodes still running count
    with their returns and lengths so far, as truncated ones (what a time limit does), and "unfinished" says how many
    (over all ranks); those it never started do not count. Between two chunks, a progress line where one is due
    (Watch) and, where the run was asked to stop, the end of the evaluation: "interrupted" (any rank's) says so, the
    episodes cut counted as the budget's are."""
    chunk, acc = _eval_chunk(run, eval_envs, model, episodes)
    for t in acc.values():
        t.zero_()
    with seeded(seed, eval_envs.device):
        obs, _ = eval_envs.reset(seed=seed)
        if hasattr(model, "reset_state"):
            model.reset_state(torch.ones(eval_envs.num_envs, dtype=torch.bool, device=eval_envs.device))
        recorded = list(range(min(record, eval_envs.num_envs)))
        frames = {i: [f] for i, f in zip(recorded, eval_envs.render(recorded))} if recorded else {}
        limit = (getattr(eval_envs, "max_episode_steps", None) or 10_000) * episodes + 1
        limit = limit if max_steps is None else min(limit, max_steps)
        watch = Watch(run, -(-limit // EVAL_CHUNK) * EVAL_CHUNK, eval_envs.num_envs, episodes)
        done_count, finished, interrupted = acc["done_count"], False, False
        for start in range(0, limit, EVAL_CHUNK):
            if not recorded:
                obs = chunk(obs)
            else:
                for _ in range(EVAL_CHUNK):
                    obs = _eval_step(eval_envs, model, episodes, acc, obs)
                    # the recorded envs that are still within their episodes: one host read per step
                    alive = [i for i, c in zip(recorded, done_count[recorded].tolist()) if c < episodes]
                    for i, f in zip(alive, eval_envs.render(alive) if alive else []):
                        frames[i].append(f)
                    recorded = alive
            if bool((done_count >= episodes).all()):  # one sync per chunk, not per step
                finished = True
                break
            if watch.after(start + EVAL_CHUNK, done_count, episodes):
                interrupted = True
                break
    sums = torch.cat([acc["sums"], torch.zeros_like(acc["sums"][:2])])  # the unfinished episodes, the interruption
    if not finished:
        running = acc["running"]
        cut = ((done_count < episodes) & (running[1] > 0)).double()
        sums[[0, 1, 2, 5]] += torch.stack([(running[0] * cut).sum(), (running[1] * cut).sum(), cut.sum(), cut.sum()])
    sums[6] = float(interrupted)
    ret, length, count, succ, rep, unfinished, stopped = distributed.all_reduce(sums).tolist()
    return {
        "return": ret / count if count else math.nan,
        "length": length / count if count else math.nan,
        "success_rate": succ / rep if rep > 0 else None,
        "frames": [frame for i in sorted(frames) for frame in frames[i]],
        "episodes": int(count),
        "unfinished": int(unfinished),
        "interrupted": stopped > 0,
    }


def say_cut(run: Run, result: dict, budget: int) -> None:
    """The line of an evaluation that its budget cut, and what its return counts."""
    if result["unfinished"]:
        run.say(
            f"notice: the evaluation at step {run.global_step:,} stopped at its budget of {plural(budget, 'step')} per "
            f"eval env ({EVAL_SHARE:.0%} of the steps trained between two evaluations, at least {EVAL_FLOOR:,} an "
            f"episode; a larger --eval-interval gives more): {plural(result['unfinished'], 'episode')} unfinished, "
            f"counted with {'its' if result['unfinished'] == 1 else 'their'} return so far as truncated"
        )


def record_video(run: Run, eval_envs, frames: list, writer=None) -> Path:
    """The recorded frames as videos/step_<global_step>.mp4 (and in TensorBoard and wandb)."""
    fps = getattr(eval_envs, "render_fps", 30)
    path = video.write_mp4(run.run_dir / "videos" / f"step_{run.global_step}.mp4", frames, fps)
    if writer is not None:
        video.add_video(writer, "videos/eval", frames, run.global_step, fps)
    if run.wandb_run is not None:
        import wandb

        run.wandb_run.log({"videos/eval": wandb.Video(str(path), format="mp4")}, step=run.global_step)
    return path


def evaluate(run: Run, eval_envs, model: torch.nn.Module) -> float:
    """Evaluate (a collective), log eval/, record a new best return, stop at --target-return; the mean return."""
    args = run.args
    record = args.video_envs if args.capture_video and run.is_main else 0  # rank 0's envs are the ones shown
    t0 = time.time()
    budget = eval_steps(run)
    result = run_episodes(
        eval_envs,
        model,
        args.eval_episodes,
        seed=eval_seed(run, run.iteration),
        record=record,
        run=run,
        max_steps=budget,
    )
    seconds = time.time() - t0
    run.seconds["evaluation"] = run.seconds.get("evaluation", 0.0) + seconds  # ends with a host read
    if result["interrupted"]:  # a stop requested on any rank: the same on every rank (a reduced flag)
        return interrupted(run, result, seconds)
    ret = result["return"]
    if run.is_main:
        run.writer.add_scalar("eval/episodic_return", ret, run.global_step)
        run.writer.add_scalar("eval/episodic_length", result["length"], run.global_step)
        if result["success_rate"] is not None:
            run.writer.add_scalar("eval/success_rate", result["success_rate"], run.global_step)
        if result["frames"]:
            record_video(run, eval_envs, result["frames"], run.writer)
        run.writer.flush()
    run.say(
        f"iteration {run.iteration} step {run.global_step:,}: eval return {ret:.2f}, train return "
        f"{train_return(run)}, SPS {run.sps:,.0f}"
    )
    say_cut(run, result, budget)
    if run.progress is not None:
        run.progress.shown()
    run.last_eval_return = ret
    if ret > run.best_eval_return:  # best.pt is due (common.run.checkpoints_to_write)
        run.best_eval_return, run.best_iteration = ret, run.iteration
    if args.target_return is not None and ret >= args.target_return:
        run.stop_reason = "target_return"
    return ret


def interrupted(run: Run, result: dict, seconds: float) -> float:
    """An evaluation a stop request cut short: said, not logged nor judged for best.pt (its episodes are partly
    played); the run stops after it, saving last.pt, as after an iteration (its stop reason is the signal's). NaN."""
    signal = stop_requested(run) or "a signal on another rank"
    finished = result["episodes"] - result["unfinished"]
    run.say(
        f"{signal}: the evaluation at step {run.global_step:,} cut short after {seconds:.0f} s ({finished} of its "
        f"episodes finished): not logged; saving last.pt and stopping"
    )
    if run.progress is not None:
        run.progress.shown()
    run.stop_reason = f"signal:{stop_requested(run) or 'peer'}"
    return math.nan


def eval_only(run: Run, eval_envs, model: torch.nn.Module) -> dict:
    """--eval-only: evaluate the resumed checkpoint's policy, print the result as JSON, and end. The seeds are the
    checkpoint iteration's evaluation's: best.pt gives back the return it was saved for (exactly, on CPU)."""
    args = run.args
    if getattr(args, "_eval_notice", None):  # the eval envs' implied preset (no start line here to follow)
        run.say(args._eval_notice)
    record = args.video_envs if args.capture_video and run.is_main else 0
    budget = eval_steps(run)
    result = run_episodes(
        eval_envs,
        model,
        args.eval_episodes,
        seed=eval_seed(run, run.iteration),
        record=record,
        run=run,
        max_steps=budget,
    )
    say_cut(run, result, budget)
    out = {
        "eval_episodic_return": result["return"],
        "eval_episodic_length": result["length"],
        "checkpoint": str(run.resume_path),
    }
    if result["success_rate"] is not None:
        out["eval_success_rate"] = result["success_rate"]
    if run.is_main and result["frames"]:
        run.run_dir = run.resume_path.resolve().parent.parent  # the checkpoint's run directory
        out["video"] = str(record_video(run, eval_envs, result["frames"]))
    if run.is_main and args.export is not None:
        out["export"] = str(export_run_policy(run, args.export, model, run.resume_path))
    if run.is_main:
        print(json.dumps(out))
    # closed by the script's closing(run), on this return as on any exit
    return {"eval_return": result["return"], "eval_length": result["length"], **out}
