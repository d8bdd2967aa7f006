# The two set-up commands of the README: `make demo` (Airflow on a simulated fleet) and `make test`.
# Each creates the virtual environment .venv on first use; `make test` first makes sure of what
# the suite needs from the machine (tests/prereqs.sh: installs it when run as root).
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Debian puts sshd in /usr/sbin, which a non-root user's PATH often lacks.
export PATH := $(PATH):/usr/sbin:/sbin

$(BIN)/gpu-pool: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[test]' 2>&1 | { grep -v '^WARNING: Location' || true; }
	touch $(BIN)/gpu-pool

.PHONY: install prereqs demo demo-engine test bench lint
install: $(BIN)/gpu-pool

prereqs:
	PY=$(PY) bash tests/prereqs.sh

demo: install
	$(BIN)/gpu-pool demo --airflow

demo-engine: install
	$(BIN)/gpu-pool demo

# The machine's prerequisites come first, so a missing one stops the run before any test.
test: prereqs
	$(MAKE) --no-print-directory install
	$(BIN)/python -m pytest tests

lint: install
	$(BIN)/ruff check plugins tests bench dags

bench: install
	$(BIN)/python bench/placement_scale.py
