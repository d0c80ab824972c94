# The two commands of the README: `make demo` and `make test`. Both do all the set-up on a machine that has only Python.
PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.dlx-installed
# two pytest-xdist workers (an idle one takes tests queued for the other: the long journeys do not end the run alone):
# the suite is mostly subprocesses and torchrun ranks waiting on each other; the file order; the slowest 15 named
PYTEST_ARGS ?= -n 2 --dist worksteal -p no:randomly --durations=15
# `make test-random SEED=N`: the same tests in pytest-randomly's order for seed N (a new one each time by default)
SEED ?= $(shell date +%s)

.PHONY: setup demo test unit test-random test-loaded lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	PYTHON=$(PYTHON) VENV=$(VENV) TORCH_VERSION=$(TORCH_VERSION) bash scripts/setup.sh
	touch $(STAMP)

demo: setup
	$(BIN)/dlx pretrain

# every tier: tests/unit, tests/integration, tests/journeys (what CI runs)
test: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# the quick loop: tests that start no process and train nothing
unit: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS) tests/unit

# checks that find the next flaky test: a random order, and the suite beside two CPU-bound processes (a busy CI machine)
test-random: setup
	$(BIN)/python -m pytest -n 2 -p randomly --randomly-seed=$(SEED)

test-loaded: setup
	bash scripts/under_load.sh $(BIN)/python -m pytest $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check --fix src tests benchmarks && $(BIN)/ruff format src tests benchmarks

clean:
	rm -rf $(VENV) build src/*.egg-info
