# Two entry points (see README): `make repro` and `make test`. Both build their own venv.
PYTHON ?= python3
VENV ?= .venv
# The CPU wheel of torch; a GPU user sets e.g. TORCH_SPEC="torch==2.13.0" with a CUDA index.
TORCH_SPEC ?= torch==2.13.0
PROFILE ?=
# make test's pytest workers (pytest-xdist; tests/conftest.py keeps each test file, and the smoke pipeline's files, on one)
TEST_WORKERS ?= 2
BIN := $(VENV)/bin
export DVC_NO_ANALYTICS := 1
export MLFLOW_DISABLE_TELEMETRY := true
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup repro test test-unit test-e2e bench mlflow-server external-data

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, pinned: anything that pulls torch later finds it satisfied (no CUDA build download)
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[test,minilm,cluster]"
	touch $@

setup: $(BIN)/.installed

# Runs the whole pipeline on the default profile (params.yaml).
repro: $(BIN)/.installed
	test -d .dvc || $(BIN)/dvc init -q
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/lopd repro

# CI runs this: the import contracts (lint-imports), unit suite, the recorded and the warm smoke repro, golden digests,
# determinism, report rerun, adding a seed, kill-anywhere, lopd verify, lopd launch fanning out a toy pipeline and its
# failure paths (a killed job retried, an interrupt, the exclusive lock, the resource check, stale worktrees).
test: $(BIN)/.installed
	$(BIN)/lint-imports  # the layering contracts in pyproject.toml
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -q -m "not slow" -n $(TEST_WORKERS)

# The unit tests only (tests/unit: no workspace, no pipeline), in under a minute.
test-unit: $(BIN)/.installed
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -q -n $(TEST_WORKERS) tests/unit

# The longest end-to-end tests: the smoke matrix through lopd launch against a serial repro, the lora_r rerun, plots diff.
test-e2e: $(BIN)/.installed
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -q -m slow

bench: $(BIN)/.installed
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python bench/rollouts.py
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python bench/step.py

mlflow-server: $(BIN)/.installed
	$(BIN)/mlflow server --backend-store-uri sqlite:///mlflow.db --artifacts-destination ./mlartifacts --host 127.0.0.1 --port $${PORT:-5000}

# BFCL data files only (the bfcl-eval wheel is downloaded, never installed: it downgrades numpy)
external-data: $(BIN)/.installed
	$(BIN)/python -m lopd.envs.external data/external/bfcl
