# One command surface for people, hooks and CI.
# `make test` builds its virtualenvs (.venv, .venv-sdk, .venv-pod) on first use, then runs the suite.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# A pod's environment: the SDK without the worker extra (no arq, no anthropic, no
# hiredis), with the newest redis-py and the frameworks it plugs into.
SDK_VENV := .venv-sdk
SDK_BIN := $(SDK_VENV)/bin
SDK_STAMP := $(SDK_VENV)/.installed
# A pod as pip installs it: the same, with the hiredis parser ctxstore depends on
# (redis[hiredis]), whose replies the store reads past redis-py.
POD_VENV := .venv-pod
POD_BIN := $(POD_VENV)/bin
POD_STAMP := $(POD_VENV)/.installed

.PHONY: install test lint typecheck check bench bench-instructions bench-tracking eval stress soak demo worker load clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

$(SDK_STAMP): pyproject.toml
	$(PYTHON) -m venv $(SDK_VENV)
	$(SDK_BIN)/pip install --quiet --upgrade pip
	$(SDK_BIN)/pip install --quiet -e ".[test,openai-agents,langchain]" "openai-agents[redis]"
	$(SDK_BIN)/pip uninstall --quiet --yes hiredis
	touch $(SDK_STAMP)

$(POD_STAMP): pyproject.toml
	$(PYTHON) -m venv $(POD_VENV)
	$(POD_BIN)/pip install --quiet --upgrade pip
	$(POD_BIN)/pip install --quiet -e ".[test,openai-agents,langchain,langgraph]" "openai-agents[redis]"
	touch $(POD_STAMP)

install: $(STAMP) $(SDK_STAMP) $(POD_STAMP)

# The whole suite once, in the worker environment (every extra but the frameworks'). Then
# what depends on the redis-py version or its reply parser, the Redis edge (tests/redis), in
# a pod's two environments: the newest redis-py without hiredis, and with it (as pip installs
# a pod), where the framework adapters (tests/integrations) run too. Each runs whatever an
# earlier one found; the target fails at the end if one did.
# PYTEST_JOBS: parallel workers (pytest-xdist). Twice the CPUs: most tests wait on Redis,
# on servers they start or on subprocesses, so four workers on two cores ran the suite in
# 2 min 37 s where one per CPU took 6 min 14 s.
PYTEST_JOBS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 2) * 2 )))
PYTEST := pytest -q -n $(PYTEST_JOBS) --dist loadfile

test: $(STAMP) $(SDK_STAMP) $(POD_STAMP)
	@failed=""; \
	$(BIN)/$(PYTEST) || failed="$$failed worker"; \
	$(SDK_BIN)/$(PYTEST) tests/redis || failed="$$failed sdk"; \
	$(POD_BIN)/$(PYTEST) tests/redis tests/integrations || failed="$$failed pod"; \
	if [ -n "$$failed" ]; then echo "failed in:$$failed"; exit 1; fi

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

# Every benchmark runs, whatever an earlier one found; the run fails at the end if one did.
BENCHES := bench metrics_bench turns search_bench fork_bench archive_bench

bench: $(STAMP)
	@failed=""; for name in $(BENCHES); do \
		echo "$(BIN)/python -m bench.$$name"; \
		$(BIN)/python -m bench.$$name || failed="$$failed $$name"; \
	done; \
	if [ -n "$$failed" ]; then echo "failed:$$failed"; exit 1; fi

# The turn benchmark's per-operation table in redis-server instructions (needs valgrind):
# exact where INFO cpu moves 2x between runs.
bench-instructions: $(STAMP)
	$(BIN)/python -m bench.turns --instructions

# What CLIENT TRACKING would cost each append (needs redis-py 6+: the pod environment's).
bench-tracking: $(SDK_STAMP)
	$(SDK_BIN)/python -m bench.tracking

eval: $(STAMP)
	$(BIN)/python -m bench.eval

stress: $(STAMP)
	$(BIN)/python -m bench.stress

load: $(STAMP)
	$(BIN)/python -m bench.load

soak: $(STAMP)
	$(BIN)/python -m bench.stress --total 200000
	$(BIN)/pytest -q -m soak

demo: $(STAMP)
	$(BIN)/ctxstore demo

clean:
	rm -rf $(VENV) $(SDK_VENV) $(POD_VENV) .pytest_cache .mypy_cache .ruff_cache
