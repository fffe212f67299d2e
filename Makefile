# Two commands for a newcomer: `make train` and `make test`. Each creates the virtual
# environment and installs what is missing first (re-installs when pyproject.toml changes).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup train test test-fast lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

train: $(STAMP)
	$(BIN)/spotrl train $(ARGS)

# two workers, a test file each (module fixtures, such as a finished run, are made once): most tests
# wait on servers, subprocesses and compilers, so two cores finish the suite in ~60% of the time
PYTEST_ARGS ?= -n 2 --dist loadfile

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# the edit loop: everything but the tests marked `slow` (end to end: whole flows, chaos, resume,
# anything that starts a Prefect server or runs `train`; and the compile-heavy checks), in under
# 3 minutes on two cores. `make test` (and CI) still runs them all
test-fast: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS) -m "not slow"

# style and layering: ruff (lint + format) and import-linter's contracts (pyproject.toml)
lint: $(STAMP)
	$(BIN)/ruff check spotrl tests benchmarks tools
	$(BIN)/ruff format --check spotrl tests benchmarks tools
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) runs .pytest_cache
