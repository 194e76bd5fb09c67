#!/usr/bin/env bash
# The CUDA path in one go, on a machine with a GPU, in under 5 minutes: the CUDA checks, bench.py on cuda,
# and a 50-step training run. Results land in ${OUT:-gpu_check}/.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu_check}"
mkdir -p "$out"
export WANDB_MODE=disabled PYTHONPATH="$PWD"
python scripts/cuda_checks.py 2>&1 | tee "$out/cuda_checks.txt"
python bench.py --device cuda --repeats 3 --json "$out/bench.json" 2>&1 | tee "$out/bench.txt"
python train.py train.device=cuda train.time_budget=null train.max_steps=50 train.eval_interval=25 \
    train.sample_interval=50 train.ckpt_interval=50 latest_link=null hydra.run.dir="$out/train" 2>&1 | tail -20
