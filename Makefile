# pdctl developer targets. `make test` is the README's test command and what CI runs.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
PYTEST := $(PYTHON) -m pytest
DEFAULT_MARKERS := not slow and not benchmark and not train and not chaos

.PHONY: install install-dev test test-all check lint format type imports bench chaos demo clean

install:
	# torch is pinned first: pip takes the 2.13.0 CPU build from local disk; GPU users install a CUDA torch instead.
	$(PIP) install -q 'torch==2.13.0'
	$(PIP) install -q -e .

install-dev:
	$(PIP) install -q 'torch==2.13.0'
	$(PIP) install -q -e '.[dev]'

## The README's test command: install what the tests need, run the lint/type/layering checks and the suite.
test: install-dev check
	PYTHONHASHSEED=0 $(PYTEST) -m "$(DEFAULT_MARKERS)" -q

test-all: install-dev
	PYTHONHASHSEED=0 $(PYTEST) -q -m "not benchmark"

check: lint type imports

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

format:
	$(PYTHON) -m ruff format .
	$(PYTHON) -m ruff check --fix .

type:
	$(PYTHON) -m mypy

imports:
	lint-imports

bench: install-dev
	PYTHONHASHSEED=0 $(PYTEST) -m benchmark -q -s benchmarks tests

chaos: install-dev
	PYTHONHASHSEED=0 $(PYTEST) -m chaos -q

demo: install
	pdctl demo

clean:
	rm -rf build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache
