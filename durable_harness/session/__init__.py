"""Sessions: the tree verbs, context building, pi import, and opening by reference."""

from __future__ import annotations

import os

from durable_harness.errors import SessionNotFound
from durable_harness.session.context import Context, build_context
from durable_harness.session.pi import import_pi_file, open_pi_file, read_head
from durable_harness.session.session import Session, TreeNode
from durable_harness.storage.base import Durability, Store, unreadable_error
from durable_harness.storage.jsonl import JsonlSessionStore

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
        SessionNotFound, AmbiguousSessionPrefix, LeaseHeld, CorruptSession, SessionUnreadable.
    """
    if os.path.isfile(ref):
        try:
            _, pi = read_head(ref)  # a damaged line 1: JsonlSessionStore may still know it
        except OSError as exc:
            raise unreadable_error(ref, exc) from exc
        if pi:
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
