# The two commands of the README: `make demo` and `make test`. Both do all the set-up on a machine that has only Python.
PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.dlx-installed
# two pytest-xdist workers: the suite is mostly subprocesses and torchrun ranks waiting on each other
PYTEST_ARGS ?= -n 2

.PHONY: setup demo test unit lint bench clean

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

lint: setup
	$(BIN)/ruff check --fix src tests benchmarks && $(BIN)/ruff format src tests benchmarks

clean:
	rm -rf $(VENV) build src/*.egg-info
