# One command surface for people, hooks and CI.
# `make test` builds its own virtualenv (.venv) on first use, then runs everything.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test lint typecheck check bench stress soak demo worker load clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

bench: $(STAMP)
	$(BIN)/python -m bench.bench

stress: $(STAMP)
	$(BIN)/python -m bench.stress

load: $(STAMP)
	$(BIN)/python -m bench.load

soak: $(STAMP)
	$(BIN)/python -m bench.stress --total 200000
	$(BIN)/pytest -q -m soak

demo: $(STAMP)
	$(BIN)/python -m ctxstore.demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
