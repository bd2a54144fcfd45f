"""Launch a script whose envs' rewards turn NaN from their AFTER-th step on (the NaN guard's fault, in
a process of its own, also under torchrun):

    python tests/nan_launch.py AFTER algos/ppo.py [flags ...]
    torchrun --nproc-per-node 2 tests/nan_launch.py AFTER algos/ppo.py [flags ...]
"""

import runpy
import sys

import common.run
from tests.helpers import NaNRewardsAfter

if __name__ == "__main__":
    after, script = int(sys.argv[1]), sys.argv[2]
    real_make_env = common.run.make_env
    common.run.make_env = lambda *a, **k: NaNRewardsAfter(real_make_env(*a, **k), after)
    sys.argv = sys.argv[2:]
    runpy.run_path(script, run_name="__main__")
