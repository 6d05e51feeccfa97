# Quick start: `make demo` runs every pipeline stage on CPU; `make test` runs the fast test tier
# (every test not marked `slow`); `make test-slow` runs the `slow` tier (end-to-end runs, coverage
# over many seeds). CI (.ci/run) runs both.
# Both create .venv and install what they need (torch pinned to the 2.13.0 CPU build).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
DEMO   ?= demo-out
# Wall-clock minutes of `make fuzz` (every fuzz target, round-robin).
FUZZ_MINUTES ?= 10

.PHONY: demo test test-slow test-durations fuzz lint typecheck bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test,gpu,plots,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/dspark-calibrate demo --out $(DEMO)
	$(BIN)/dspark-verify $(DEMO)/cost-table.parquet $(DEMO)/bundle --trust-root $(DEMO)/trust-root.json --allow-synthetic

# pytest keeps its assertion-rewritten test modules in __pycache__ between runs (a shell that sets
# PYTHONDONTWRITEBYTECODE would otherwise make every run rewrite all of them: about 8 s a worker).
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -n 2 -q

test: $(STAMP)
	$(PYTEST) -m "not slow"

test-slow: $(STAMP)
	$(PYTEST) -m slow

# Re-measure which tests take over 0.5 s on an idle machine (tests/slow_tests.txt, the slow tier).
test-durations: $(STAMP)
	$(BIN)/python tests/measure_durations.py

# Long fuzz run (tests/fuzz/targets.py): results in benchmarks/results/fuzz.json; exits 1 on any
# crash, hang or accepted mutant. `make test` runs the same targets briefly with fixed seeds.
fuzz: $(STAMP)
	$(BIN)/python benchmarks/fuzz.py --minutes $(FUZZ_MINUTES)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(DEMO) .pytest_cache .mypy_cache .hypothesis
