"""Fixtures for the session tests: ``store`` runs each test on JSONL and on SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_harness.storage import Store, open_store


@pytest.fixture(params=["jsonl", "sqlite"], ids=["jsonl", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh, empty store of each backend (the same fixture as ``tests/storage``)."""
    if request.param == "jsonl":
        return open_store(f"jsonl:{tmp_path}/jsonl")
    return open_store(f"sqlite:{tmp_path}/s.db")
