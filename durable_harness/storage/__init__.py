"""Storage: one interface (:mod:`.base`) and its backends; :func:`open_store` turns a spec into a
:class:`~.base.Store`: ``None`` or ``""`` (JSONL under :func:`default_home`), ``jsonl:DIR``,
``sqlite:PATH``, ``postgresql://...`` (imported only when named) or ``memory:`` (nothing
durable)."""

from __future__ import annotations

import os

from durable_harness.errors import FormatError, StoreNotFound
from durable_harness.storage.base import (
    DURABILITY_MODES,
    Durability,
    EntryOp,
    LaneOp,
    LaneState,
    Op,
    RecordOp,
    SessionInfo,
    SessionStore,
    Store,
)
from durable_harness.storage.indexed import MemorySessionStore
from durable_harness.storage.jsonl import JsonlSessionStore, JsonlStore
from durable_harness.storage.memory import MemoryStore
from durable_harness.storage.sqlite import SqliteSessionStore, SqliteStore

__all__ = [
    "DURABILITY_MODES",
    "Durability",
    "EntryOp",
    "JsonlSessionStore",
    "JsonlStore",
    "LaneOp",
    "LaneState",
    "MemorySessionStore",
    "MemoryStore",
    "Op",
    "RecordOp",
    "SessionInfo",
    "SessionStore",
    "SqliteSessionStore",
    "SqliteStore",
    "Store",
    "default_home",
    "open_store",
]


def default_home() -> str:
    """Return ``$DURABLE_HARNESS_HOME`` or ``~/.durable-harness``."""
    return os.environ.get("DURABLE_HARNESS_HOME") or os.path.expanduser("~/.durable-harness")


def open_store(spec: str | None = None, *, create: bool = True) -> Store:
    """Open the store named by ``spec``; with ``create=False`` nothing is created (a named store
    must exist; the default one, when missing, reads as empty).

    Raises:
        FormatError: the spec's scheme is not ``jsonl``, ``sqlite``, ``memory`` or
            ``postgresql``, or a ``memory:`` spec carries a path.
        StoreNotFound: ``create=False`` and the named store does not exist.
    """
    if not spec:
        return JsonlStore(default_home())
    if spec.startswith(("postgresql://", "postgres://")):
        from durable_harness.storage.postgres import PostgresStore

        return PostgresStore(spec, create=create)
    scheme, sep, rest = spec.partition(":")
    if scheme == "memory" and sep:
        if rest.strip():
            raise FormatError(f"store spec {spec!r}: a memory store takes no path (use memory:)")
        return MemoryStore()
    if sep and not rest.strip():
        raise FormatError(
            f"store spec {spec!r} names no path: use jsonl:DIR, sqlite:PATH or memory:"
        )
    if sep and scheme == "sqlite":
        return SqliteStore(rest, create=create)
    if sep and scheme == "jsonl":
        root = os.path.expanduser(rest)
        if not create and not os.path.isdir(root):
            raise StoreNotFound(
                f"no such store: {root} is not a folder (nothing was created)", path=root
            )
        return JsonlStore(rest)
    raise FormatError(
        f"unknown store spec {spec!r}: use jsonl:DIR, sqlite:PATH, postgresql://... or memory:"
    )
