"""Tail quarantine: a torn final line (never acknowledged) is moved aside to a side file and
cut off the session file on a writable open (``design/storage.md``)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from durable_harness.fs import fsync_dir
from durable_harness.storage.jsonl.framing import write_all
from durable_harness.storage.private import private_fd

if TYPE_CHECKING:
    from durable_harness.storage.jsonl.store import JsonlSessionStore


def quarantine_tail(store: JsonlSessionStore, data: bytes) -> None:
    """Move a torn final line to ``<path>.torn-<offset>`` and cut it off (writable opens)."""
    if store._torn is None or store._fd is None:
        return
    offset, tail = store._torn
    side = f"{store.path}.torn-{offset}"
    n = 1
    while os.path.exists(side):  # never overwrite bytes quarantined earlier
        n += 1
        side = f"{store.path}.torn-{offset}.{n}"
    fd = os.open(side, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        private_fd(fd)
        write_all(fd, tail)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.ftruncate(store._fd, offset)
    os.fsync(store._fd)
    fsync_dir(os.path.dirname(store.path) or ".")
    for item in store.damage:
        if item["kind"] == "torn_tail":
            item["quarantined_to"] = side
    store._torn = None
