#!/usr/bin/env bash
# The GPU run in one call that carries nothing but the tree (docs/gpu.md gives the exact device calls). Two plans:
#
# tree (the default, the first call): needs only the checkout and the device image's packages (torch, Triton,
#   transformers, pandas, matplotlib). The pre-flight (gpu/gpu_preflight.py: versions, compiled kernels against
#   their references, the engine on both backends, a seeded request; it stops the suite if the lab's code fails),
#   the Triton kernel benchmark (gpu/kernels_gpu.py), the engine against transformers on random weights of
#   SmolLM2-135M's shape and of Llama-3-8B's (bfloat16, eager steps, the torch and Triton attention backends;
#   token ids, no tokenizer; transformers gets the engine's own random weights, lab.models.hf_export), and the
#   notebooks whose gpu preset runs on random weights once the one real-model check in each is given random weights
#   of the same shape: 04 (its float32 lossless check) and 08 (its process-group measurements).
# carried (--carried, an optional second call): the pre-flight again (a fresh machine) and the notebooks that need
#   SmolLM2's weights or tokenizer (98 MB: gpu/gpu_carry.sh cuts it into parts for three calls) and the wheels
#   the image lacks (.whl/): 00, 01, 02, 03, 05, 06, 07, 09 at their gpu presets; with GPU_USER_MODEL=DIR (a
#   checkpoint on the device machine, docs/your_model.md) the same notebooks on that model instead.
#
# Each step has an estimate on one H200 (never yet measured there: the work counted at assumed rates plus 8 s to
# start, docs/gpu.md) and is stopped at 1.5x it or at what is left of the 8-minute budget, so a wrong estimate
# costs that step, never the loan; a plan whose stop times sum past the budget is refused before anything runs.
# Every step writes as it goes (a JSON line per case, or a notebook's run directory); suite.json records each
# step's estimate, limit, time, status and cases kept, the versions found and what differed.
#
# --dry-run: the same plan on the CPU at toy sizes (notebooks at their smoke preset) into results/gpu_dry_run/;
# the tree plan's dry run hides what the device image lacks (gpu/device_image/), so a step that would need a
# carry fails here, and suite.json gets the plan scaled from the dry run's times (`margin`). --plan prints the
# plan and stops. NOTEBOOKS="04_replay_break_even ..." replaces the plan's notebooks. --pack FILE.tar.gz packs
# the results into one file (at most 8 files come back from the device). Paths may be relative to where the
# suite is called from; the results directory's default is relative to the checkout.
set -euo pipefail
caller=$PWD
absolute() { [[ -z "$1" || "$1" == /* ]] && printf '%s' "$1" || printf '%s/%s' "$caller" "$1"; }
cd "$(dirname "$0")/.."
if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON; py_from='$PYTHON'
elif [[ -n "${VIRTUAL_ENV:-}" ]]; then PY=$VIRTUAL_ENV/bin/python; py_from='the active virtual environment'
else PY=python3; py_from='python3 on PATH: no $PYTHON and no active virtual environment'; fi
BUDGET_S=${BUDGET_S:-480}
START_S=8      # of each estimate: interpreter, imports, loads (assumed; a dry run measures this machine's)
HOST_FACTOR=1  # dry-run seconds -> the device host's share of a step (docs/gpu.md: why 1)
dry=0; plan_only=0; pack=""; plan=tree
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --plan) plan_only=1 ;;
    --carried) plan=carried ;;
    --pack) pack="$2"; shift ;;
    *) echo "usage: gpu/gpu_suite.sh [--carried] [--dry-run] [--plan] [--pack FILE.tar.gz]" >&2; exit 2 ;;
  esac
  shift
done
pack=$(absolute "$pack")
[[ -n "${GPU_MODEL_DIR:-}" ]] && export GPU_MODEL_DIR=$(absolute "$GPU_MODEL_DIR")
suffix=$([[ $plan == carried ]] && echo _carried || true)
if (( dry )); then
  out=$(absolute "${OUT_DIR:-}"); out=${out:-results/gpu_dry_run$suffix}
  # toy sizes; the engine steps leave out offline-32x128: its 32 sequences in Triton's interpreter took 33 s of a
  # step's 88 here, for no path the other two workloads do not take
  small=random:tiny; large=random:tiny; flag=(--dry-run); preset=smoke
  toy=(--scale 0.02 --max-tokens 4 --workloads decode-1,prefill-2k)
else
  out=$(absolute "${OUT_DIR:-}"); out=${out:-results/gpu$suffix}
  small=random:smollm2-135m; large=random:llama-3-8b; toy=(); flag=(); preset=gpu
fi

# name|estimate on one H200 (s)|command. Estimates: docs/gpu.md's table; a notebook's gpu preset comment gives its.
steps=("preflight|45|$PY gpu/gpu_preflight.py ${flag[*]} --out $out")
declare -A case_logs=([preflight]=preflight)  # a step's .jsonl, kept case by case (lab.bench.caselog)
if [[ $plan == tree ]]; then
  steps+=("kernels|90|$PY gpu/kernels_gpu.py ${flag[*]} --out $out")
  for e in "smollm2|45|$small" "llama-3-8b|65|$large"; do
    IFS='|' read -r tag est m <<<"$e"
    steps+=("engine-$tag|$est|$PY -m lab.cli bench engine --model $m --variants eager-auto --rounds 1 --backend torch,triton \
--transformers auto ${toy[*]} --json $out/bench_engine_$tag.json --plot $out/bench_engine_$tag.png")
    case_logs[engine-$tag]=bench_engine_$tag
  done
  case_logs[kernels]=kernels_gpu
fi
declare -A nb_est=([00_engine_tour]=15 [01_memory_accounting]=20 [02_quantization_accuracy]=45
  [03_kv_quantization]=35 [04_replay_break_even]=25 [05_speculative_acceptance]=25 [06_serving_ttft]=45
  [07_structured_output]=20 [08_parallelism]=40 [09_ttft_claims]=35)
# The tree plan's notebooks on random weights: 04's gpu preset runs random:llama-3-8b throughout (its float32
# lossless check too), 08's process-group measurements get random weights of SmolLM2's shape.
declare -A nb_tree=([04_replay_break_even]="" [08_parallelism]="--model $small")
if [[ $plan == tree ]]; then default_nbs="${!nb_tree[*]}"
else default_nbs="00_engine_tour 01_memory_accounting 02_quantization_accuracy 03_kv_quantization
  05_speculative_acceptance 06_serving_ttft 07_structured_output 09_ttft_claims"; fi
# GPU_USER_MODEL (the carried plan): a checkpoint directory on the device machine that every notebook runs on
# instead of the carried SmolLM2 (`lab run --model`, docs/your_model.md); the estimates stay SmolLM2's.
user_model=$(absolute "${GPU_USER_MODEL:-}")
for nb in $(printf '%s\n' ${NOTEBOOKS:-$default_nbs} | sort); do
  [[ -n "${nb_est[$nb]:-}" ]] || { echo "unknown notebook $nb; known: ${!nb_est[*]}" >&2; exit 2; }
  model=${nb_tree[$nb]:-}; [[ $plan == carried && -n "$user_model" ]] && model="--model $user_model"
  steps+=("$nb|${nb_est[$nb]}|$PY -m lab.cli run $nb --in-process --preset $preset $model \
--results-dir $out/notebooks")
done

total=0; caps=0
echo "plan '$plan' (estimated seconds on one H200; each step stopped at 1.5x its estimate):"
for s in "${steps[@]}"; do
  IFS='|' read -r name est cmd <<<"$s"
  total=$(( total + est )); caps=$(( caps + est * 3 / 2 ))
  printf '  %-26s %4d s  %s\n' "$name" "$est" "$cmd"
done
echo "  total      $total s, stopped by $caps s at the latest, of a $BUDGET_S s budget"
if (( caps > BUDGET_S )); then
  echo "the plan's stop times ($caps s) exceed the budget ($BUDGET_S s): refused" >&2
  exit 3
fi
(( plan_only )) && exit 0
echo "python: $PY ($py_from)"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # the checkout's lab and gpu/, installed or not
if (( dry )) && [[ $plan == tree ]]; then
  export PYTHONPATH=$PWD/gpu/device_image:$PYTHONPATH  # what the image lacks, hidden (sitecustomize)
fi
if (( ! dry )); then
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'CUDA is not available: use --dry-run')"
  PLAN=$plan source gpu/gpu_prepare.sh
fi
# Every package a step imports, named before the first step spends any of the budget (the carried plan: also
# what .whl/ brings, and the SmolLM2 model).
missing=$("$PY" - "$plan" <<'PYCHECK'
import importlib.util as u, sys
names = ['torch', 'triton', 'numpy', 'transformers', 'safetensors', 'matplotlib', 'pandas', 'lab']
if sys.argv[1] == 'carried':
    names += ['fastapi', 'uvicorn', 'xgrammar', 'gguf', 'datasets', 'jsonschema']
lacks = [n for n in names if u.find_spec(n) is None]
if sys.argv[1] == 'carried' and not lacks:
    from lab.models.loader import embedded_gguf_path
    try:
        embedded_gguf_path('smollm2-135m').stat()
    except OSError:
        lacks.append('the SmolLM2 model (gpu/gpu_carry.sh)')
print(' '.join(lacks))
PYCHECK
) || missing="(the interpreter did not run)"
if [[ -n "$missing" ]]; then
  echo "$PY lacks what the suite imports: $missing (set \$PYTHON to the project's interpreter, e.g. .venv/bin/python)" >&2
  exit 4
fi
mkdir -p "$out"

start=$(date +%s)
timings=(); failed=0; scaled=0
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
  took=$(( $(date +%s) - t ))
  [[ $status == ok ]] || failed=$(( failed + 1 ))
  kept=""
  if [[ -n "${case_logs[$name]:-}" && -f "$out/${case_logs[$name]}.jsonl" ]]; then
    n=$(wc -l <"$out/${case_logs[$name]}.jsonl")
    kept=", \"case_log\": \"${case_logs[$name]}.jsonl\", \"cases_kept\": $n"
    [[ $status == ok ]] || echo "   $name: $n case(s) kept in $out/${case_logs[$name]}.jsonl; ${case_logs[$name]}.json (the whole result) is missing" >&2
  fi
  # A dry run's time here stands for the step's host share on the device (start, imports, builds: HOST_FACTOR);
  # the rest of its estimate is the device work counted at the gpu sizes.
  (( dry )) && { scaled=$(( scaled + est - START_S + took * HOST_FACTOR )); kept="$kept, \"scaled_s\": $(( est - START_S + took * HOST_FACTOR ))"; }
  timings+=("\"$name\": {\"estimate_s\": $est, \"limit_s\": $limit, \"measured_s\": $took, \"status\": \"$status\"$kept}")
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
margin=null
if (( dry )); then
  margin="{\"host_factor\": $HOST_FACTOR, \"start_s\": $START_S, \"scaled_total_s\": $scaled, \"margin_s\": $(( BUDGET_S - scaled ))}"
  echo "scaled to one H200: $scaled s of $BUDGET_S (each step's estimate less its $START_S s start, plus its time here x$HOST_FACTOR)"
fi
(IFS=,; echo "{\"plan\": \"$plan\", \"dry_run\": $( (( dry )) && echo true || echo false ), \"budget_s\": $BUDGET_S, \
\"plan_s\": $total, \"stop_times_s\": $caps, \"margin\": $margin, \"versions\": $versions, \"steps\": {${timings[*]}}}") \
  >"$out/suite.json"
echo "gpu suite: $(( $(date +%s) - start )) s (plan $total s), $failed step(s) not ok, results in $out"
if [[ -n "$pack" ]]; then
  tar -czf "$pack" -C "$(dirname "$out")" "$(basename "$out")"
  echo "packed into $pack"
fi
(( failed == 0 ))
