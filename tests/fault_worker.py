"""Entry point for torchrun in the multi-node tests: runs an algos/ script with this rank's envs wrapped.

    python tests/fault_worker.py [--step-seconds S] [--fault raise|nan --fault-rank R --fault-after N] \
        algos/ppo.py ARGS...

--step-seconds paces every env step (a sleep), so that a test can place a kill, a join or a signal
within the run on any machine without a long run; --fault makes rank R's envs raise (an
exception in the training loop) or return NaN rewards from their N-th step on.
"""

import os
import runpy
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common.run  # noqa: E402


class Wrapped:
    """Forwards everything to the env; its step sleeps first and turns faulty from a step on."""

    capturable = False  # Python state per step: never inside a CUDA graph

    def __init__(self, env, step_seconds: float, fault: str | None, after: int):
        self.env, self.step_seconds, self.fault, self.after, self.steps = env, step_seconds, fault, after, 0

    def __getattr__(self, name):
        return getattr(self.env, name)

    def step(self, action):
        time.sleep(self.step_seconds)
        out = list(self.env.step(action))
        self.steps += 1
        if self.fault is not None and self.steps >= self.after:
            if self.steps == self.after:
                print(f"fault: {self.fault} on rank {os.environ.get('RANK')} at {time.time():.3f}", flush=True)
            if self.fault == "raise":
                raise RuntimeError(f"injected fault on rank {os.environ.get('RANK')}")
            out[1] = out[1] * float("nan")
        return tuple(out)


def main():
    argv = sys.argv[1:]
    opts = {"--step-seconds": "0", "--fault": None, "--fault-rank": "-1", "--fault-after": "0"}
    while argv and argv[0] in opts:
        opts[argv[0]], argv = argv[1], argv[2:]
    fault = opts["--fault"] if int(opts["--fault-rank"]) == int(os.environ.get("RANK", "0")) else None
    step_seconds, after = float(opts["--step-seconds"]), int(opts["--fault-after"])
    real_make_env = common.run.make_env
    common.run.make_env = lambda *a, **k: Wrapped(real_make_env(*a, **k), step_seconds, fault, after)
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
