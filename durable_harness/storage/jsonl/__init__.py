"""The embedded default backend: one append-only JSONL file per session.

File format (``design/storage.md`` has the full description)::

    line 1   {"type":"session","version":3,"format":"durable-harness/1","id":..., "cwd":...}
    line 2.. {"gen":G,"ops":[{"op":"entry","lane":"main","entry":{...,"seq":N}},
                             {"op":"record","record":{...,"seq":N+1}},
                             {"op":"lane","lane":"main","seq":N+2,"leafId":...}]}

One line is one commit, written with one ``write`` of ``line + "\\n"``; the line is the unit of
atomicity. ``sync`` fsyncs before ``commit`` returns; ``batch`` shares one fsync among the
commits that arrive while another fsync runs (group commit); ``none`` never fsyncs.

On open, damage is reported, never raised: a final line without ``\\n`` is torn (never
acknowledged) and, on a writable open, moved to ``<file>.torn-<offset>`` and cut off; a bad
interior line is reported with its byte offset and skipped; a hole in the seqs is ``seq_gap``; a
deleted header line is ``missing_header``. Line 1 carries the durable high-water mark
(:data:`MARK_KEY`), moved after each fsync: data ending below it is ``truncated``.

The modules, each using only those before it: :mod:`.framing` (the format, pure),
:mod:`.scan` (bytes to header, commits and damage, pure), :mod:`.file` (the open file: every
system call on it, the lease, padding, barrier, mark, quarantine, takeover),
:mod:`.group_commit` (the fsyncs commits share), :mod:`.store` (the session store: the index
over the file), :mod:`.catalogue` (the store of many sessions).
"""

from __future__ import annotations

import os  # noqa: F401  (tests patch ``jsonl.os``: the os module itself)

from durable_harness.storage.jsonl.catalogue import JsonlStore, cwd_dir_name
from durable_harness.storage.jsonl.framing import (
    FORMAT,
    MARK_KEY,
    MARK_LEN,
    PAD,
    PAD_MAX,
    PAD_MIN,
    is_commit_line,
    is_own_format,
    mark_text,
    parse_mark,
    recover_header,
)
from durable_harness.storage.jsonl.group_commit import INLINE_FSYNC_S
from durable_harness.storage.jsonl.store import JsonlSessionStore

__all__ = [
    "FORMAT",
    "INLINE_FSYNC_S",
    "MARK_KEY",
    "MARK_LEN",
    "PAD",
    "PAD_MAX",
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
