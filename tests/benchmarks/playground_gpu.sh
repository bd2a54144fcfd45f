#!/usr/bin/env bash
# The GPU comparison of docs/playground.md in one command, on one GPU, in under ten minutes: Go1JoystickFlatTerrain
# with the task's own configs, algos/ppo.py (its `task` set: Playground's rsl_rl config, rsl_rl's update) beside
# Playground's rsl_rl path (RSLRLBraxWrapper under rsl_rl's OnPolicyRunner, the same config) and brax's own PPO
# (ppo.train with wrap_for_brax_training and the task's brax_ppo_config, as learning/train_jax_ppo.py builds it), and
# the env alone through both torch paths. Everything lands in one folder: report.md (the table), playground.json (the
# figures, the machine, the commands), benchmark.log (what the runs said).
#
#     bash tests/benchmarks/playground_gpu.sh [DIR]        # DIR: default playground-gpu-<UTC time>
#
# Needs, installed beforehand (the machine may reach no package index): the project with its playground extra,
# JAX's CUDA build (pip install -U "jax[cuda12]"), rsl-rl-lib and GitPython (pip install --no-deps rsl-rl-lib
# GitPython), and mujoco_menagerie where Playground looks for it (docs/playground.md: Go1's model is read from it).
# Budget: each learner's run is its start-up (Warp's and XLA's compiles, a minute or two each on a first run; JAX's
# persistent cache in DIR/../jax-cache keeps them for the next) plus 3 + 10 iterations; --timeout bounds each at 150 s.
set -euo pipefail
cd "$(dirname "$0")/../.."

out=${1:-playground-gpu-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$(dirname "$out")/jax-cache}
task=Go1JoystickFlatTerrain

python - <<'EOF'
import sys

import torch

if not torch.cuda.is_available():
    sys.exit("error: torch sees no CUDA device: this comparison is a GPU's (the CPU one: docs/playground.md)")
import jax

if not any(d.platform == "gpu" for d in jax.devices()):
    sys.exit('error: JAX sees no GPU; pip install -U "jax[cuda12]"')
from mujoco_playground._src import mjx_env

if not mjx_env.MENAGERIE_PATH.exists():
    sys.exit(f"error: mujoco_menagerie is missing at {mjx_env.MENAGERIE_PATH}: copy it there (docs/playground.md)")
print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}, jax {jax.__version__}", flush=True)
EOF

# the td3.py row (FastTD3's 1,024 envs) is left out: its start-up would not fit the ten minutes beside these
python -m tests.benchmarks.playground --task "$task" --device cuda --num-envs 4096 --warmup-iterations 3 \
    --iterations 10 --env-steps 100 --repeats 3 --no-td3 --timeout 150 --out "$out" 2> >(tee "$out/benchmark.log" >&2)
echo "results: $out/report.md, $out/playground.json, $out/benchmark.log"
