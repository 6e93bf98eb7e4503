# Every target bootstraps .venv from nothing, so `make demo` and `make test` work on a fresh clone.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench crash-test clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/durable-harness demo

lint: $(STAMP)
	$(BIN)/ruff format --check durable_harness tests bench crash_scenarios
	$(BIN)/ruff check durable_harness tests bench crash_scenarios
	$(BIN)/mypy

test: lint
	$(BIN)/pytest -n 2 --dist loadfile -p no:cacheprovider --hypothesis-profile=ci

crash-test: $(STAMP)
	$(BIN)/durable-harness crash-test --jobs 2
	$(BIN)/durable-harness crash-test --backend postgres --jobs 2
	$(BIN)/durable-harness crash-test --power-cut --jobs 2

bench: $(STAMP)
	$(BIN)/pip install -q -e '.[dev,bench]' || true
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
