# Every target bootstraps .venv from nothing, so `make demo` and `make test` work on a fresh clone.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_WORKERS ?= 4
# Bytecode caching on, whatever the shell says: with PYTHONDONTWRITEBYTECODE every process the
# suite starts (CLI children, servers, crash cells) recompiles the package from source and
# pytest re-rewrites every test module in each worker (collection took 18 s instead of 8 s).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test suite check lint bench crash-test clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/durable-harness demo

lint: $(STAMP)
	$(BIN)/ruff format --check durable_harness tests bench
	$(BIN)/ruff check durable_harness tests bench
	$(BIN)/mypy

# `make test` runs lint and types beside the suite (mypy's 30 CPU-s fill the suite's waits; a
# failure of either fails the target once both have ended). TEST_WORKERS: four xdist workers
# on 2 cores, because about a third of a worker's time is waiting (pip's downloads, fsyncs,
# servers' outages, grace sleeps): 4:31 against 5:41 with two, back to back (design/
# architecture.md, "Suite time, fifth pass").
# --no-loadscope-reorder: xdist otherwise hands files out biggest-count first, which put the
# matrix's file (a few tests, most of the suite's CPU) near the end, where it ran alone; in
# collection order it goes first (tests/crashtest/conftest.py sorts it there).
test: $(STAMP)
	$(MAKE) --no-print-directory -j2 --output-sync=line lint suite

suite: $(STAMP)
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -p no:cacheprovider \
	  --hypothesis-profile=ci

# The edit loop's fast lane (under a minute on 2 quiet cores): lint and types, the tests not
# marked slow/crash/postgres/browser with fewer hypothesis examples and on asyncio alone (the
# harness, provider and tool tests run on asyncio and trio in `make test`), and a sample of the
# matrix (the cells of single_tool at its in-doubt and stream points and at its second request,
# the commit that settles the tool (design/crash-matrix.md, "Merged commits"), on JSONL).
CHECK_POINTS := --point after_tool_started --point mid_provider_stream \
  --point after_provider_request_started:2
check: lint
	$(BIN)/pytest -n 2 -p no:cacheprovider -q --hypothesis-profile=dev --anyio-backends=asyncio \
	  -m "not slow and not crash and not postgres and not browser"
	$(BIN)/durable-harness crash-test --scenario single_tool --backend jsonl $(CHECK_POINTS)

crash-test: $(STAMP)
	$(BIN)/durable-harness crash-test
	$(BIN)/durable-harness crash-test --backend postgres
	$(BIN)/durable-harness crash-test --power-cut

bench: $(STAMP)
	$(BIN)/pip install -q -e '.[dev,bench]' || true
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
