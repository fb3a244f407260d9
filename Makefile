# Entry points: `make venv`, `make run`, `make test`, `make lint`.
# Reference data is read in place from ../shared/data/reference (never copied into the project).

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
REFERENCE := ../shared/data/reference
TRACE_NAME := 120_0.2_5_100_40_25_0,0.5,0.5_0.6,0.3,0.09,0.01_multigpu_dynamic
RUN_OUT := out/120jobs

.PHONY: venv run test test-slow e2e lint chaos

venv: $(VENV)/.installed

# Re-installs only when the project's dependencies change.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -e '.[dev]'
	touch $@

run: venv
	$(BIN)/shockwave simulate \
		--trace '$(REFERENCE)/traces/$(TRACE_NAME).trace' \
		--trajectories '$(REFERENCE)/trajectories/$(TRACE_NAME).tacc.trajectories.json' \
		--throughputs '$(REFERENCE)/throughputs/tacc_throughputs.json' \
		--gpus 32 --gpus-per-node 4 --policy all --out '$(RUN_OUT)'

test: venv
	scripts/services.sh
	$(BIN)/python -m pytest

# The runs `make test` leaves out (marker `slow`): the short chaos run (about a minute).
test-slow: venv
	scripts/services.sh
	$(BIN)/python -m pytest -m slow

# The end-to-end tests alone (real processes; `make test` runs them too).
e2e: venv
	scripts/services.sh
	$(BIN)/python -m pytest tests/e2e

# Fault injection (docs/reliability.md): kill -9 parts of a running deployment while jobs run,
# then check the invariants. Starts a private Postgres and Redis; exits non-zero on a violation.
chaos: venv
	$(BIN)/python -m bench.chaos --json out/chaos.json

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
