# pdctl developer targets. `make demo` and `make test` are the README's two commands; `.ci/run` runs `make test`
# in a fresh virtual environment.
#
# Which Python: the active virtual environment if there is one, else `.venv` in the checkout, created on first use.
# Installs are constrained by the lock (requirements/constraints.txt), so a fresh machine gets the versions CI tested.
ifdef VIRTUAL_ENV
PYTHON ?= python3
BIN :=
else
VENV ?= .venv
CREATE_VENV := 1
PYTHON ?= $(VENV)/bin/python
BIN := $(VENV)/bin/
# Commands the recipes start (tests spawn `pdctl`, `prometheus` helpers…) see the environment as if activated.
export VIRTUAL_ENV := $(abspath $(VENV))
export PATH := $(abspath $(VENV))/bin:$(PATH)
endif
PIP := $(PYTHON) -m pip
PYTEST := $(PYTHON) -m pytest
CONSTRAINTS := requirements/constraints.txt
DEFAULT_MARKERS := not slow and not benchmark and not train and not chaos

.PHONY: venv install install-dev lock test test-all check lint format type imports bench chaos docs demo clean

venv:
ifdef CREATE_VENV
	@test -x $(PYTHON) || python3 -m venv $(VENV)
endif

install: venv
	# torch first: pip takes the 2.13.0 CPU build from local disk; GPU users install a CUDA torch of that version first.
	$(PIP) install -q -c $(CONSTRAINTS) 'torch==2.13.0'
	$(PIP) install -q -c $(CONSTRAINTS) -e .

install-dev: venv
	$(PIP) install -q -c $(CONSTRAINTS) 'torch==2.13.0'
	$(PIP) install -q -c $(CONSTRAINTS) -e '.[dev]'

## Regenerate the lock from pyproject.toml (and requirements/torch.in); see requirements/README.md.
lock: venv
	$(PIP) install -q 'pip-tools>=7.4'
	$(PYTHON) -m piptools compile -q --strip-extras --no-emit-find-links --no-emit-index-url --no-emit-trusted-host \
		--extra dev -o $(CONSTRAINTS) pyproject.toml requirements/torch.in
	# A local CPU wheel resolves as 2.13.0+cpu; the lock names the public version, which the CPU build satisfies.
	sed -i 's/^torch==\([0-9.]*\)+cpu$$/torch==\1/' $(CONSTRAINTS)

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
	$(BIN)lint-imports

bench: install-dev
	PYTHONHASHSEED=0 $(PYTEST) -m benchmark -q -s benchmarks tests
	$(PYTHON) benchmarks/readme_figures.py

## The chaos suite; writes benchmarks/results/chaos.{md,json} (an ordinary test run never does: it needs the variable).
chaos: install-dev
	PDCTL_CHAOS_RESULTS=benchmarks/results PYTHONHASHSEED=0 $(PYTEST) -m chaos -q
	$(PYTHON) benchmarks/readme_figures.py

## The README's benchmark figures, regenerated from benchmarks/results (never typed by hand).
docs:
	$(PYTHON) benchmarks/readme_figures.py

demo: install
	$(PYTHON) -m pdctl demo

clean:
	rm -rf build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache
