"""Sessions: the tree verbs, context building, pi import, and opening by reference."""

from __future__ import annotations

import os

from durable_harness.errors import SessionNotFound
from durable_harness.session.context import Context, build_context
from durable_harness.session.pi import import_pi_file, is_pi_header, open_pi_file
from durable_harness.session.session import Session, TreeNode
from durable_harness.storage import codec
from durable_harness.storage.base import Durability, Store
from durable_harness.storage.jsonl import JsonlSessionStore
from durable_harness.storage.oserrors import storage_boundary

__all__ = [
    "Context",
    "Session",
    "TreeNode",
    "build_context",
    "import_pi_file",
    "open_session",
]


def open_session(
    ref: str,
    store: Store,
    *,
    write: bool = False,
    durability: Durability = "sync",
    break_lease: bool = False,
) -> Session:
    """Open a session by file path (ours or pi's), id or unique id prefix.

    A pi file opens read-only, migrated in memory. ``write=True`` takes the writer lease.

    Raises:
        SessionNotFound, AmbiguousSessionPrefix, LeaseHeld, CorruptSession; StorageIOError
        (unreadable file, full disk...) and DatabaseLocked from the storage boundary.
    """
    if os.path.isfile(ref):
        with storage_boundary(ref):  # an unreadable file is named, as inside a store
            with open(ref, "rb") as fh:
                first = fh.readline(1 << 20)
                second = fh.readline(1 << 20)
            try:
                header = codec.loads(first)
            except ValueError:
                header = None  # a damaged line 1: JsonlSessionStore may still recognise the file
            if is_pi_header(header) and b'"ops"' not in second:
                return Session(open_pi_file(ref))
        return Session(
            JsonlSessionStore.open_path(
                ref, write=write, durability=durability, break_lease=break_lease
            )
        )
    if os.sep in ref and not os.path.exists(ref):
        raise SessionNotFound(f"no session file at {ref}", path=ref)
    return Session(
        store.open_session(ref, write=write, durability=durability, break_lease=break_lease)
    )
