"""Write-ahead checks made from a second reader: :func:`assert_intent_durable`."""

from __future__ import annotations

import os
from typing import Any

from durable_harness.storage import JsonlSessionStore, SessionStore, open_store


def open_reader(store_location: str) -> SessionStore:
    """Open a second, read-only view of a session from its ``store.location`` (a JSONL file
    path, ``sqlite:PATH#SESSION_ID`` or ``postgresql://...#SESSION_ID``).

    Raises:
        AssertionError: a JSONL location that is not a file.
        StorageError: the session cannot be opened (see :mod:`durable_harness.errors`).
    """
    if store_location.startswith(("postgresql://", "postgres://", "sqlite:")):
        spec, _, session_id = store_location.rpartition("#")
        store = open_store(spec, create=spec.startswith("sqlite:"))
        return store.open_session(session_id, write=False)
    assert os.path.isfile(store_location), f"no session file at {store_location}"
    return JsonlSessionStore.open_path(store_location, write=False)


def assert_intent_durable(store_location: str, tool_call_id: str) -> dict[str, Any]:
    """Assert, from a fresh read-only open of the session on disk, that a ``tool_started``
    record for ``tool_call_id`` is already stored and no ``tool_finished`` yet; return the
    latest such ``tool_started`` record. Called from a tool's ``execute`` (``store_location``:
    the writing session's ``store.location``), it proves the write-ahead rule.

    Raises:
        AssertionError: no durable ``tool_started`` for the call, or a ``tool_finished`` is
            already stored (the message names the call and the location).
        StorageError: the session cannot be opened for reading.
    """
    with open_reader(store_location) as reader:
        records = reader.records(types=("tool_started", "tool_finished"))
    mine = [r for r in records if r.get("toolCallId") == tool_call_id]
    found = [r for r in mine if r["type"] == "tool_started"]
    assert found, f"no durable tool_started for {tool_call_id} in {store_location}"
    assert len(found) == len(mine), f"tool_finished for {tool_call_id} stored before the effect ran"
    return found[-1]
