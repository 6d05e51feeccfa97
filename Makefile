# Quick start: `make demo` runs every pipeline stage on CPU; `make test` runs the test suite.
# Both create .venv and install what they need (torch pinned to the 2.13.0 CPU build).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
DEMO   ?= demo-out

.PHONY: demo test lint typecheck bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test,gpu,plots,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/dspark-calibrate demo --out $(DEMO)
	$(BIN)/dspark-verify $(DEMO)/cost-table.parquet $(DEMO)/bundle --trust-root $(DEMO)/trust-root.json --allow-synthetic

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(DEMO) .pytest_cache .mypy_cache .hypothesis
