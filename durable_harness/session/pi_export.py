"""Export a session as a pi session file (format version 3) that pi opens as the same
conversation (``design/pi.md``, "Export").

pi reads a file as: line 1 the header ``{"type": "session", "version": 3, "id", "timestamp",
"cwd", "parentSession"?}``, then one entry per line; the conversation's leaf is the **last line**
(pi keeps no leaf pointer), and each entry's context is the walk from it to the root through
``parentId``. Our entries already follow pi's v3 shapes, so an entry is written as stored,
without our storage's ``seq``. Three rules make pi see the lane's conversation:

* the lane's leaf is the last entry: written as is;
* the leaf has no children: it is written last (its parents still come before it);
* otherwise (the leaf has children on other branches, or the lane is before the first entry):
  one ``custom`` entry (:data:`LEAF_TYPE`) is appended under the leaf (a root when there is no
  leaf). pi gives ``custom`` entries no context, so the conversation is the leaf's.

An unknown cost (``usage.cost = None``: no price known) is written as zeros with
``usage.costUnknown = true`` (pi adds costs up and would fail on ``null``); import reads it back
as ``None``. The operation log stays out unless asked for; then it is one ``custom`` entry
(:data:`LOG_TYPE`, the records in ``data.records``), written last under the leaf, which also
marks the leaf.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from durable_harness.fs import atomic_write
from durable_harness.ids import now_iso
from durable_harness.models.header import VERSION
from durable_harness.session.pi import LEAF_TYPE, LOG_TYPE
from durable_harness.session.session import Session
from durable_harness.storage import codec

HEADER_KEYS = ("type", "version", "id", "timestamp", "cwd", "parentSession")
"""The header keys pi defines; ours (``format``, ``importedFrom``...) are left out so that pi
and our reader both take the file for pi's."""


def pi_header(session: Session) -> dict[str, Any]:
    """The pi header of ``session``: pi's keys only, ``version`` 3."""
    src = session.store.header
    header = {k: src[k] for k in HEADER_KEYS if src.get(k) is not None}
    header.update(type="session", version=VERSION, id=session.id, cwd=session.cwd)
    header.setdefault("timestamp", now_iso())
    return header


def _pi_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """One stored entry as pi writes it: without ``seq``, an unknown cost as zeros."""
    out = {k: v for k, v in entry.items() if k != "seq"}
    msg = out.get("message")
    if isinstance(msg, dict) and isinstance(msg.get("usage"), dict):
        usage = msg["usage"]
        if usage.get("cost") is None:
            zero = {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}
            out["message"] = {**msg, "usage": {**usage, "cost": zero, "costUnknown": True}}
    return out


def pi_entries(
    session: Session, lane: str = "main", *, with_log: bool = False
) -> list[dict[str, Any]]:
    """The lines of the pi file of ``session`` seen from ``lane``: header first, then entries,
    ordered so that pi's leaf (the last line) is the lane's leaf (rules in the module doc).

    Raises:
        UnknownLane: ``lane`` does not exist (from the store).
    """
    entries = [_pi_entry(e) for e in session.store.iter_entries()]
    leaf = session.leaf(lane)
    has_children = {e.get("parentId") for e in entries}
    marker: dict[str, Any] | None = None
    if with_log:
        records = [dict(r) for r in session.store.records()]
        marker = _marker(LOG_TYPE, leaf, {"lane": lane, "records": records}, entries)
    elif entries and entries[-1].get("id") != leaf:
        if leaf is not None and leaf not in has_children:
            at = next(i for i, e in enumerate(entries) if e.get("id") == leaf)
            entries.append(entries.pop(at))
        else:
            marker = _marker(LEAF_TYPE, leaf, {"lane": lane}, entries)
    if marker is not None:
        entries.append(marker)
    return [pi_header(session), *entries]


def _marker(
    kind: str, leaf: str | None, data: dict[str, Any], entries: list[dict[str, Any]]
) -> dict[str, Any]:
    """A ``custom`` entry under ``leaf`` with an id no entry has."""
    taken = {e.get("id") for e in entries}
    n = 0
    while f"dhleaf{n:02x}" in taken:
        n += 1
    return {
        "type": "custom",
        "id": f"dhleaf{n:02x}",
        "parentId": leaf,
        "timestamp": now_iso(),
        "customType": kind,
        "data": data,
    }


def pi_text(lines: list[dict[str, Any]]) -> bytes:
    """The file's bytes: one compact JSON object per line, each ended by ``\\n``."""
    return b"".join(codec.dumps(obj) + b"\n" for obj in lines)


def export_pi(session: Session, path: str, lane: str = "main", *, with_log: bool = False) -> int:
    """Write ``session`` as a pi file at ``path`` (atomically: a temporary file renamed into
    place); return the number of lines written (header included).

    Raises:
        OSError: the file cannot be written.
    """
    lines = pi_entries(session, lane, with_log=with_log)
    atomic_write(Path(path), pi_text(lines))
    return len(lines)
