#!/usr/bin/env bash
# The GPU run as one script, planned to fit 8 minutes of one H200 (a session is lent 15 in all): the pre-flight
# (bench/gpu_preflight.py: versions, compiled kernels against their references in bfloat16, the engine on both
# backends, a seeded sampled request; it stops the suite if anything fails), the Triton kernel benchmark
# (bench/kernels_gpu.py) and the engine benchmark on a random Llama-3-8B shape in bfloat16 (eager and compiled
# steps, every workload against its roofline; no transformers peer: a random model has no checkpoint for it).
# Everything lands in results/gpu/ (or $OUT_DIR) with provenance; `--pack FILE` also writes it as one tar.gz,
# since at most 8 files come back from the device machine.
#
# The plan and its estimate are printed first; the estimates are seconds on one H200 (the kernel benchmark's
# sweep and the engine benchmark's compile times dominate), and a plan over the budget is refused before
# anything runs. `--dry-run` runs the same steps on the CPU at toy sizes into results/gpu_dry_run/ (the tests
# run it). Notebooks have no `gpu` preset yet (issue 24): they are not in the plan.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-480}
dry=0; pack=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --pack) pack="$2"; shift ;;
    *) echo "usage: bench/gpu_suite.sh [--dry-run] [--pack FILE.tar.gz]" >&2; exit 2 ;;
  esac
  shift
done
if (( dry )); then
  out=${OUT_DIR:-results/gpu_dry_run}
  model=random:tiny; smoke=(--scale 0.02 --max-tokens 4); flag=(--dry-run)
else
  out=${OUT_DIR:-results/gpu}
  model=random:llama-3-8b; smoke=(); flag=()
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'CUDA is not available: use --dry-run')"
fi
mkdir -p "$out"

# name|estimated seconds on one H200|command
steps=(
  "preflight|60|$PY bench/gpu_preflight.py ${flag[*]} --out $out"
  "kernels|180|$PY bench/kernels_gpu.py ${flag[*]} --out $out"
  "engine|150|$PY -m lab.cli bench engine --model $model --variants eager-auto,compiled-auto --transformers '' ${smoke[*]} --json $out/bench_engine.json --plot $out/bench_engine.png"
)
total=0
echo "plan (estimated seconds on one H200):"
for s in "${steps[@]}"; do
  IFS='|' read -r name est cmd <<<"$s"
  total=$(( total + est ))
  printf '  %-10s %4d s  %s\n' "$name" "$est" "$cmd"
done
echo "  total      $total s of a $BUDGET_S s budget"
if (( total > BUDGET_S )); then
  echo "the plan's estimate ($total s) exceeds the budget ($BUDGET_S s): refused" >&2
  exit 3
fi

start=$(date +%s)
timings=()
for s in "${steps[@]}"; do
  IFS='|' read -r name est cmd <<<"$s"
  t=$(date +%s)
  echo "== $name"
  eval "$cmd"
  timings+=("\"$name\": {\"estimate_s\": $est, \"measured_s\": $(( $(date +%s) - t ))}")
done
(IFS=,; echo "{\"dry_run\": $( (( dry )) && echo true || echo false ), \"budget_s\": $BUDGET_S, \"steps\": {${timings[*]}}}") \
  >"$out/suite.json"
echo "gpu suite: $(( $(date +%s) - start )) s (plan $total s), results in $out"
if [[ -n "$pack" ]]; then
  tar -czf "$pack" -C "$(dirname "$out")" "$(basename "$out")"
  echo "packed into $pack"
fi
