# The two set-up commands of the README: `make demo` (Airflow on a simulated fleet) and `make test`.
# Each creates the virtual environment .venv on first use.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/gpu-pool: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[test]' 2>&1 | { grep -v '^WARNING: Location' || true; }
	touch $(BIN)/gpu-pool

.PHONY: install demo demo-engine test bench lint
install: $(BIN)/gpu-pool

demo: install
	$(BIN)/gpu-pool demo --airflow

demo-engine: install
	$(BIN)/gpu-pool demo

test: install
	$(BIN)/python -m pytest tests

lint: install
	$(BIN)/ruff check plugins tests bench dags

bench: install
	$(BIN)/python bench/placement_scale.py
