# Entry points: `make venv`, `make run`, `make test`, `make lint`.
# Reference data is read in place from ../shared/data/reference (never copied into the project).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
REFERENCE := ../shared/data/reference
TRACE_NAME := 120_0.2_5_100_40_25_0,0.5,0.5_0.6,0.3,0.09,0.01_multigpu_dynamic
RUN_OUT := out/120jobs

.PHONY: venv run test test-slow e2e lint docs chaos images compose-check

# `make test` runs the suite on two pytest-xdist workers where the machine has two cores or more
# (TEST_WORKERS=0: one process, as a plain `pytest`; TEST_WORKERS=N: N workers): all of tests/e2e
# is one unit of work (tests/conftest.py), run one test after another on one worker while the
# other runs the rest. The end-to-end tests in which no node dies run with a 60 s node TTL, so
# that an agent restarted beside the other worker on a loaded machine still finds its node READY
# (tests/e2e/test_training_e2e.py, NO_NODE_DEATHS); timings in docs/benchmarks.md.
TEST_WORKERS ?= $(shell [ "$$(nproc 2>/dev/null || echo 1)" -ge 2 ] && echo 2 || echo 0)
PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS))

venv: $(VENV)/.installed

# Re-installs only when the project's dependencies change.
$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "make venv: needs Python 3.11 or newer (PYTHON=$(PYTHON) is older; set PYTHON=...)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -e '.[dev]'
	touch $@

run: venv
	$(BIN)/shockwave simulate \
		--trace '$(REFERENCE)/traces/$(TRACE_NAME).trace' \
		--trajectories '$(REFERENCE)/trajectories/$(TRACE_NAME).tacc.trajectories.json' \
		--throughputs '$(REFERENCE)/throughputs/tacc_throughputs.json' \
		--gpus 32 --gpus-per-node 4 --policy all --out '$(RUN_OUT)'

# What the tests need beyond the venv is installed and started here (scripts/ say how): PostgreSQL
# and Redis, the Docker engine (Debian's docker.io, installed with apt when missing, as root),
# the project's image, built without a registry (the Docker-runtime test runs jobs in it), and
# headless Chromium with its WebDriver (Debian's chromium, chromium-driver: the dashboard's test).
test: venv
	scripts/services.sh
	scripts/images.sh
	scripts/browser.sh
	$(BIN)/python -m pytest $(PARALLEL)

# The runs `make test` leaves out: the compose stack running two jobs (make compose-check, about
# two minutes) and the tests marked `slow` (the short chaos run, the two node deaths of the
# training e2e and the demo: about a minute each).
test-slow: venv compose-check
	scripts/services.sh
	$(BIN)/python -m pytest -m slow

# The end-to-end tests alone (real processes; `make test` runs them too).
e2e: venv
	scripts/services.sh
	scripts/images.sh
	scripts/browser.sh
	$(BIN)/python -m pytest tests/e2e

# Fault injection (docs/reliability.md): kill -9 parts of a running deployment while jobs run,
# then check the invariants. Starts a private Postgres and Redis; exits non-zero on a violation.
chaos: venv
	$(BIN)/python -m bench.chaos --json out/chaos.json

# Every image docker-compose.yml runs, built locally (debootstrap base; docs/service.md).
images:
	scripts/images.sh compose

# docker-compose.yml for real: build, up, two example jobs through the agent container, down.
compose-check: venv
	scripts/compose_check.sh

# The documentation site (mkdocs.yml) into site/, with --strict: a broken link, a page missing
# from the navigation, or a command, setting or API operation without a description fails it.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# ruff, mypy, and the import rules of docs/architecture.md (import-linter, pyproject.toml).
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache --no-logo
