"""The embedded default backend: one append-only JSONL file per session, line 1 its header
(with the durable high-water mark, :data:`MARK_KEY`), every later line one commit, written with
one ``write``: the unit of atomicity. Damage is reported on open, never raised. The format,
the write path and every damage kind: ``design/storage.md``.

The modules, each using only those before it: :mod:`.framing` (the format, pure),
:mod:`.scan` (bytes to header, commits and damage, pure), :mod:`.file` (the open file: every
system call on it, the lease, padding, barrier, mark, quarantine, takeover), :mod:`.store`
(the session store: the index over the file, group commit), :mod:`.catalogue` (the store of
many sessions).
"""

from __future__ import annotations

import os  # noqa: F401  (tests patch ``jsonl.os``: the os module itself)

from durable_harness.storage.jsonl.catalogue import JsonlStore, cwd_dir_name
from durable_harness.storage.jsonl.framing import (
    FORMAT,
    MARK_KEY,
    PAD_MIN,
    is_commit_line,
    is_own_format,
    mark_text,
    parse_mark,
    recover_header,
)
from durable_harness.storage.jsonl.store import JsonlSessionStore

__all__ = [
    "FORMAT",
    "MARK_KEY",
    "PAD_MIN",
    "JsonlSessionStore",
    "JsonlStore",
    "cwd_dir_name",
    "is_commit_line",
    "is_own_format",
    "mark_text",
    "parse_mark",
    "recover_header",
]
