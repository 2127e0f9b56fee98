#!/usr/bin/env bash
# The GPU checks as one script, under 5 minutes on one H200: the engine benchmark on a random Llama-3-8B shape in
# bfloat16 (eager and compiled steps, every workload, its roofline fractions; no transformers peer: a random
# model has no checkpoint for it) and the Triton kernel benchmark (bench/kernels_gpu.py), JSON and PNG into
# results/gpu/. `--dry-run` runs the same code paths on the CPU at toy sizes (the tests run it) and writes to
# results/gpu_dry_run/ (or $OUT_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ "${1:-}" == "--dry-run" ]]; then
  out=${OUT_DIR:-results/gpu_dry_run}
  model=random:tiny; smoke=(--scale 0.02 --max-tokens 4); kernels=(--dry-run)
else
  out=${OUT_DIR:-results/gpu}
  model=random:llama-3-8b; smoke=(); kernels=()
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'CUDA is not available: use --dry-run')"
fi
mkdir -p "$out"
start=$(date +%s)
"$PY" -m lab.cli bench engine --model "$model" --variants eager-auto,compiled-auto --transformers "" \
  "${smoke[@]}" --json "$out/bench_engine.json" --plot "$out/bench_engine.png"
"$PY" bench/kernels_gpu.py "${kernels[@]}" --out "$out"
echo "gpu suite: $(( $(date +%s) - start )) s, results in $out"
