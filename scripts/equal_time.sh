#!/bin/bash
# The ablation at equal wall-clock (docs/ablation.md): each variant at its own learning rate, trained for the
# seconds the baseline takes for the ablation's 300 steps, seeds 0-2. One run at a time with 2 threads, the seeds
# outermost, so that any drift of the machine falls on every variant alike; nothing else may run meanwhile.
# A run whose summary.json says it completed is kept, so the same command resumes a stopped study.
#
#   bash scripts/equal_time.sh multirun/equal_time baseline layernorm postnorm ...
#   python compare.py multirun/equal_time/runs --plot docs/ablation_time.png
set -u
cd "$(dirname "$0")/.."
OUT=$1; shift
export OMP_NUM_THREADS=2
mkdir -p "$OUT/reference"
ref=$OUT/reference/baseline_300_steps
if ! grep -qs '"stop_reason": "completed"' "$ref/summary.json"; then
  rm -rf "$ref"
  python train.py +experiment=ablation ablation=baseline train.seed=0 train.diagnostics=false \
    wandb.mode=disabled hydra.run.dir="$ref" > "$ref.log" 2>&1 || { echo "error: the reference run failed: $ref.log"; exit 2; }
fi
T=$(python -c "import json; print(round(json.load(open('$ref/summary.json'))['elapsed_s'], 1))")
echo "budget: the baseline's 300 steps took $T s of training ($ref)"
failed=0
for seed in 0 1 2; do
  for variant in "$@"; do
    run=$OUT/runs/$variant/seed$seed
    grep -qs '"stop_reason": "completed"' "$run/summary.json" && continue
    rm -rf "$run"; mkdir -p "$run"
    # the intervals' defaults follow train.max_steps, which a budgeted run leaves null: only at the end
    python train.py +experiment=ablation ablation="$variant" train.seed=$seed train.max_steps=null \
      train.time_budget="$T" train.diagnostics=false train.ckpt_interval=1000000 train.sample_interval=1000000 \
      wandb.mode=disabled hydra.run.dir="$run" > "$run/train.log" 2>&1 || { echo "error: $variant seed $seed failed: $run/train.log"; failed=1; }
    echo "$variant seed $seed: $(tail -n 1 "$run/train.log")"
  done
done
exit $((failed * 2))
