#!/usr/bin/env bash
# The GPU run as one script, planned to fit 8 minutes of one H200 (a session is lent 15 in all): the pre-flight
# (bench/gpu_preflight.py: versions, compiled kernels against their references in bfloat16, the engine on both
# backends, a seeded sampled request; it stops the suite if anything fails), the Triton kernel benchmark
# (bench/kernels_gpu.py), the engine benchmark on a random Llama-3-8B shape in bfloat16 (eager steps, every
# workload against its roofline; no transformers peer: a random model has no checkpoint for it; the compiled
# variant's compile of an 8B step would take a minute of the eight, and is left to a second loan),
# then every study notebook at its `gpu` preset, run in-process from its jupytext twin (`lab run --in-process`:
# the device machine has no papermill or Jupyter kernel). Everything lands in results/gpu/ (or $OUT_DIR) with
# provenance; `--pack FILE` also writes it as one tar.gz, since at most 8 files come back from the device.
#
# The plan and its estimates are printed first, and a plan over the budget is refused before anything runs. The
# estimates are seconds on one H200, never yet measured there (no GPU has been lent; docs/gpu.md says how they
# were made): each step is therefore also stopped at 1.5x its estimate or at what is left of the budget,
# whichever comes first, so a wrong estimate costs that step's results, never the loan. suite.json records
# each step's estimate, measured time and status (ok, failed, timed out), for the next plan.
#
# On the device machine the script first installs what the call carried (bench/gpu_carry.sh prepares it): the
# project itself (editable, offline: `lab.kernels` lives in kernels/), the wheels in .whl/ and the SmolLM2
# GGUF reassembled from the parts in .gpu_model/ (98 MB: more than one call carries).
#
# --dry-run: the same steps on the CPU at toy sizes into results/gpu_dry_run/, the notebooks at their smoke
# preset (the tests run it); NOTEBOOKS="01_memory_accounting ..." picks the notebooks (default: all). --plan
# prints the plan and stops.
set -euo pipefail
# Paths a user gives (OUT_DIR, --pack, GPU_MODEL_DIR) are taken from where they stood, once, before the suite
# changes into the checkout; the defaults are the checkout's results/gpu and .gpu_model.
caller=$PWD
absolute() { [[ -z "$1" || "$1" == /* ]] && printf '%s' "$1" || printf '%s/%s' "$caller" "$1"; }
cd "$(dirname "$0")/.."
# The interpreter: $PYTHON, else the active virtual environment's, else python3 (said before any step runs).
if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON; py_from='$PYTHON'
elif [[ -n "${VIRTUAL_ENV:-}" ]]; then PY=$VIRTUAL_ENV/bin/python; py_from='the active virtual environment'
else PY=python3; py_from='python3 on PATH: no $PYTHON and no active virtual environment'; fi
BUDGET_S=${BUDGET_S:-480}
dry=0; plan_only=0; pack=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --plan) plan_only=1 ;;
    --pack) pack="$2"; shift ;;
    *) echo "usage: bench/gpu_suite.sh [--dry-run] [--plan] [--pack FILE.tar.gz]" >&2; exit 2 ;;
  esac
  shift
done
pack=$(absolute "$pack")
[[ -n "${OUT_DIR:-}" ]] && OUT_DIR=$(absolute "$OUT_DIR")
[[ -n "${GPU_MODEL_DIR:-}" ]] && export GPU_MODEL_DIR=$(absolute "$GPU_MODEL_DIR")
if (( dry )); then
  out=${OUT_DIR:-$PWD/results/gpu_dry_run}
  model=random:tiny; smoke=(--scale 0.02 --max-tokens 4); flag=(--dry-run); preset=smoke
else
  out=${OUT_DIR:-$PWD/results/gpu}
  model=random:llama-3-8b; smoke=(); flag=(); preset=gpu
fi

# name|estimated seconds on one H200|command. A notebook's estimate: its gpu preset's work counted (engine
# steps, tokens, models quantized, processes started) at assumed per-step costs, plus ~8 s to import and load
# (the table in docs/gpu.md; each gpu preset's comment gives its own).
steps=(
  "preflight|45|$PY bench/gpu_preflight.py ${flag[*]} --out $out"
  "kernels|90|$PY bench/kernels_gpu.py ${flag[*]} --out $out"
  "engine|45|$PY -m lab.cli bench engine --model $model --variants eager-auto --transformers '' ${smoke[*]} --json $out/bench_engine.json --plot $out/bench_engine.png"
)
declare -A nb_est=([00_engine_tour]=15 [01_memory_accounting]=20 [02_quantization_accuracy]=45
  [03_kv_quantization]=35 [04_replay_break_even]=20 [05_speculative_acceptance]=25 [06_serving_ttft]=45
  [07_structured_output]=20 [08_parallelism]=40 [09_ttft_claims]=35)
for nb in ${NOTEBOOKS:-$(printf '%s\n' "${!nb_est[@]}" | sort)}; do
  [[ -n "${nb_est[$nb]:-}" ]] || { echo "unknown notebook $nb; known: ${!nb_est[*]}" >&2; exit 2; }
  steps+=("$nb|${nb_est[$nb]}|$PY -m lab.cli run $nb --in-process --preset $preset --results-dir $out/notebooks")
done

total=0
echo "plan (estimated seconds on one H200; each step stopped at 1.5x its estimate):"
for s in "${steps[@]}"; do
  IFS='|' read -r name est cmd <<<"$s"
  total=$(( total + est ))
  printf '  %-26s %4d s  %s\n' "$name" "$est" "$cmd"
done
echo "  total      $total s of a $BUDGET_S s budget"
if (( total > BUDGET_S )); then
  echo "the plan's estimate ($total s) exceeds the budget ($BUDGET_S s): refused" >&2
  exit 3
fi
(( plan_only )) && exit 0
echo "python: $PY ($py_from)"
if (( ! dry )); then
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'CUDA is not available: use --dry-run')"
  source bench/gpu_prepare.sh
fi
# Every package a step imports, named before the first step spends any of the budget.
missing=$("$PY" -c "import importlib.util as u
names = ('torch', 'triton', 'numpy', 'transformers', 'safetensors', 'matplotlib', 'pandas', 'lab')
print(' '.join(n for n in names if u.find_spec(n) is None))") || missing="(the interpreter did not run)"
if [[ -n "$missing" ]]; then
  echo "$PY lacks what the suite imports: $missing (set \$PYTHON to the project's interpreter, e.g. .venv/bin/python)" >&2
  exit 4
fi
mkdir -p "$out"

start=$(date +%s)
timings=(); failed=0
declare -A case_logs=([preflight]=preflight [kernels]=kernels_gpu [engine]=bench_engine)  # a step's .jsonl
for s in "${steps[@]}"; do
  IFS='|' read -r name est cmd <<<"$s"
  left=$(( BUDGET_S - ($(date +%s) - start) ))
  limit=$(( est * 3 / 2 < left ? est * 3 / 2 : left ))
  (( dry )) && limit=600  # the CPU is no H200: its toy run is not held to the H200's estimates
  t=$(date +%s)
  echo "== $name (stopped after $limit s)"
  status=ok
  if (( limit <= 0 )); then
    status="not run: the budget was spent"
  else
    timeout --kill-after=10 "$limit" bash -c "$cmd" || { rc=$?; (( rc == 124 || rc == 137 )) && status="timed out" || status="failed ($rc)"; }
  fi
  [[ $status == ok ]] || failed=$(( failed + 1 ))
  # What a step kept case by case (lab.bench.caselog), so a step stopped at its limit still shows its cases.
  kept=""
  if [[ -n "${case_logs[$name]:-}" && -f "$out/${case_logs[$name]}.jsonl" ]]; then
    n=$(wc -l <"$out/${case_logs[$name]}.jsonl")
    kept=", \"case_log\": \"${case_logs[$name]}.jsonl\", \"cases_kept\": $n"
    [[ $status == ok ]] || echo "   $name: $n case(s) kept in $out/${case_logs[$name]}.jsonl; ${case_logs[$name]}.json (the whole result) is missing" >&2
  fi
  timings+=("\"$name\": {\"estimate_s\": $est, \"limit_s\": $limit, \"measured_s\": $(( $(date +%s) - t )), \"status\": \"$status\"$kept}")
  if [[ $name == preflight && $status != ok ]]; then
    echo "the pre-flight failed ($status): the suite stops here (see $out/preflight.json)" >&2
    break
  fi
done
# The versions the pre-flight found and what differed from those the tests pass with, for whoever reads suite.json.
versions=$("$PY" -c "import json, sys
try:
    c = next(c for c in map(json.loads, open(sys.argv[1])) if c.get('check') == 'versions')
    print(json.dumps({k: c.get(k) for k in ('torch', 'triton', 'transformers', 'cuda', 'differs', 'note') if k in c}))
except (OSError, StopIteration, ValueError):
    print('null')" "$out/preflight.jsonl" 2>/dev/null || echo null)
(IFS=,; echo "{\"dry_run\": $( (( dry )) && echo true || echo false ), \"budget_s\": $BUDGET_S, \"versions\": $versions, \"steps\": {${timings[*]}}}") \
  >"$out/suite.json"
echo "gpu suite: $(( $(date +%s) - start )) s (plan $total s), $failed step(s) not ok, results in $out"
if [[ -n "$pack" ]]; then
  tar -czf "$pack" -C "$(dirname "$out")" "$(basename "$out")"
  echo "packed into $pack"
fi
(( failed == 0 ))
