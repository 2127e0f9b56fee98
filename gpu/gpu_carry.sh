#!/usr/bin/env bash
# Prepares here what the device machine lacks, for gpu/gpu_suite.sh there (docs/gpu.md): the wheels of
# gpu/gpu_wheels.txt in .whl/ (for its CPython 3.12 on x86-64, the device README's recipe) and the SmolLM2
# GGUF (98 MB) cut into parts in .gpu_model/ with its name and sha256, since one call carries at most 64 MiB
# with the working tree (35 MiB on 3 December): as few parts as fit beside the tree and the wheels, unless PARTS
# is given. Both folders are git-ignored; each call carries what the printed plan says, and the last one runs the
# suite's carried plan (the optional second run: the first carries nothing, docs/gpu.md). Prints each call's
# size against the 64 MiB limit, and refuses one over it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
LIMIT=$(( 64 * 1024 * 1024 ))
rm -rf .whl .gpu_model && mkdir -p .whl .gpu_model
platforms=(); for n in 28 27 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  -r <(grep -v '^#' gpu/gpu_wheels.txt)
gguf=$("$PY" -c "from lab.models.loader import embedded_gguf_path; print(embedded_gguf_path('smollm2-135m'))")
basename "$gguf" >.gpu_model/NAME
(cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") >.gpu_model/SHA256
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1)
whl=$(du -cb .whl/*.whl | tail -1 | cut -f1)
room=$(( LIMIT - tree - whl - 2 * 4096 ))  # a part's room in the last call, the fullest (it carries the wheels)
(( room > 0 )) || { echo "the working tree and wheels alone fill a call's 64 MiB" >&2; exit 3; }
PARTS=${PARTS:-$(( ($(stat -c %s "$gguf") + room - 1) / room ))}
split -n "$PARTS" -d "$gguf" ".gpu_model/$(basename "$gguf").part-"
parts=(.gpu_model/*.part-*)
echo "working tree $(( tree / 1024 / 1024 )) MiB, wheels $(( whl / 1024 / 1024 )) MiB, $PARTS model parts; the calls:"
for i in "${!parts[@]}"; do
  size=$(( tree + $(stat -c %s "${parts[$i]}") + 2 * 4096 ))
  carry="\"${parts[$i]}\", \".gpu_model/NAME\", \".gpu_model/SHA256\""
  cmd="mkdir -p /tmp/gpu_model && cp .gpu_model/* /tmp/gpu_model/"
  if (( i == ${#parts[@]} - 1 )); then
    size=$(( size + whl )); carry="$carry, \".whl\""
    cmd="$cmd && GPU_MODEL_DIR=/tmp/gpu_model bash gpu/gpu_suite.sh --carried --pack \$OUT/gpu_carried.tar.gz"
  fi
  printf '  call %d: %3d MiB  carry [%s]\n          command: %s\n' $(( i + 1 )) $(( size / 1024 / 1024 )) "$carry" "$cmd"
  if (( size > LIMIT )); then
    echo "call $(( i + 1 )) would carry $(( size / 1024 / 1024 )) MiB, over the 64 MiB limit: raise PARTS" >&2
    exit 3
  fi
done
echo "call them back to back: a machine idle for 30 s is given back, and /tmp/gpu_model with it"
