"""Fixtures for the storage contract: every test taking ``store`` runs on JSONL and on SQLite."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from durable_harness.storage import Durability, SessionStore, Store, open_store

BACKENDS = ("jsonl", "sqlite")

Reopen = Callable[..., SessionStore]


def make_store(kind: str, tmp: Path) -> Store:
    """Open a fresh store of ``kind`` under ``tmp``."""
    if kind == "jsonl":
        return open_store(f"jsonl:{tmp}")
    return open_store(f"sqlite:{tmp}/s.db")


@pytest.fixture(params=BACKENDS, ids=list(BACKENDS))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh, empty store of each backend."""
    return make_store(str(request.param), tmp_path)


def reopen_session(
    store: Store,
    session: SessionStore,
    *,
    write: bool = True,
    durability: Durability = "sync",
) -> SessionStore:
    """Close ``session`` and open it again through a new store object (no shared state)."""
    session.close()
    return open_store(store.spec).open_session(
        session.session_id, write=write, durability=durability
    )


@pytest.fixture
def reopen() -> Reopen:
    """``reopen(store, session, write=True, durability="sync")``: close and open again."""
    return reopen_session
