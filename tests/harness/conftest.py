"""Fixtures for the harness tests: every async test runs on asyncio and on trio, and every
test that takes ``store`` runs on the JSONL and on the SQLite backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_harness.storage import Store, open_store


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """The anyio backend name for the anyio pytest plugin."""
    return str(request.param)


@pytest.fixture(params=["jsonl", "sqlite"], ids=["jsonl", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh, empty store of each backend under ``tmp_path``."""
    if request.param == "jsonl":
        return open_store(f"jsonl:{tmp_path}/jsonl")
    return open_store(f"sqlite:{tmp_path}/s.db")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """The working directory the sessions and tools of a test use."""
    path = tmp_path / "work"
    path.mkdir()
    return path
