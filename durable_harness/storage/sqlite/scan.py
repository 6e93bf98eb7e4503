"""Reading a stored session back as damage: each row decoded and shape-checked, every seq
accounted for (``design/storage.md``, "Every damage kind")."""

from __future__ import annotations

import sqlite3
from typing import Any

from durable_harness.storage.base import continuity_damage, damage
from durable_harness.storage.rows import bad_row, row_problem
from durable_harness.storage.sqlite.connection import read_snapshot


def scan_session(
    conn: sqlite3.Connection, session_id: str, location: str, schema: int
) -> list[dict[str, Any]]:
    """Check the whole of session ``session_id`` in one read snapshot of ``conn`` (the caller
    holds the connection's lock); return its damage, raising nothing on stored content.

    * every entry and record row is decoded and shape-checked (``storage/shapes.py``), and
      its body must name the row's own id and seq: else ``bad_row`` (``table``, ``id``,
      ``seq``);
    * every seq from ``checked_from`` + 1 to the session row's ``last_seq`` (the durable
      high-water mark, updated in the commit's own transaction) must be stored in exactly
      one row of ``entries``, ``records`` or ``lane_ops``: a hole is ``seq_gap`` (naming
      the row after it), missing last seqs are ``truncated`` (``expected``, ``found``), a
      seq in two rows is ``seq_regression``;
    * an entry whose parent is missing is ``orphan_parent``.

    ``schema`` is the database's schema version (lane ops have rows from version 2).
    """
    c, sid = conn, session_id
    out: list[dict[str, Any]] = []
    with read_snapshot(c):  # one snapshot: a writer's commit cannot split it
        head = c.execute(
            "SELECT last_seq"
            + (", checked_from" if schema >= 2 else "")
            + " FROM sessions WHERE id=?",
            (sid,),
        ).fetchone()
        last_seq = int(head[0])
        start = int(head[1]) if schema >= 2 else last_seq
        stored: list[tuple[int, str, str]] = []
        parents: list[tuple[int, str, str]] = []
        for rid, seq, parent, body in c.execute(
            "SELECT id, seq, parent_id, body FROM entries WHERE session_id=?", (sid,)
        ):
            stored.append((seq, "entries", rid))
            if parent is not None:
                parents.append((seq, rid, parent))
            problem = row_problem("entries", rid, seq, body)[1]
            if problem is not None:
                out.append(bad_row(location, "entries", rid, seq, problem))
        entry_ids = {rid for _seq, _table, rid in stored}
        for rid, seq, body in c.execute(
            "SELECT id, seq, body FROM records WHERE session_id=?", (sid,)
        ):
            stored.append((seq, "records", rid))
            problem = row_problem("records", rid, seq, body)[1]
            if problem is not None:
                out.append(bad_row(location, "records", rid, seq, problem))
        if schema >= 2:
            stored.extend(
                (seq, "lane_ops", lane)
                for seq, lane in c.execute(
                    "SELECT seq, lane FROM lane_ops WHERE session_id=?", (sid,)
                )
            )
        for seq, eid, parent in sorted(parents):
            if parent in entry_ids:
                continue
            out.append(
                damage(
                    "orphan_parent",
                    f"entry {eid} of {location} names parent {parent}, which is missing",
                    table="entries",
                    id=eid,
                    seq=seq,
                    parentId=parent,
                )
            )
    stored.sort()
    checked: list[tuple[int, dict[str, Any]]] = []
    for i, (seq, table, rid) in enumerate(stored):
        if i and stored[i - 1][0] == seq:
            out.append(
                damage(
                    "seq_regression",
                    f"seq {seq} is stored twice ({stored[i - 1][1]} and {table})",
                    table=table,
                    id=rid,
                    seq=seq,
                )
            )
        elif seq > start:
            key = "lane" if table == "lane_ops" else "id"
            checked.append((seq, {"table": table, key: rid}))
    out.extend(
        continuity_damage(
            checked, start, last_seq, {"table": "sessions", "id": sid, "seq": last_seq}
        )
    )
    return out
