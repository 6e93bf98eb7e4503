"""A stored SQL session read back as damage, for both dialects: each row decoded and
shape-checked, every seq accounted for (``design/storage.md``, "Every damage kind")."""

from __future__ import annotations

from typing import Any

from durable_harness.storage import codec
from durable_harness.storage.damage import continuity_damage, damage
from durable_harness.storage.shapes import entry_shape_error, record_shape_error


def blob(value: Any) -> bytes | str:
    """A stored body as :func:`codec.loads` reads it (not a driver's ``memoryview``)."""
    return value if isinstance(value, bytes | str) else bytes(value)


def row_problem(
    table: str, ident: str, seq: int, body: Any
) -> tuple[dict[str, Any] | None, str | None]:
    """Decode one stored body: ``(value, None)``, or ``(None, why it is damaged)``."""
    try:
        value = codec.loads(blob(body))
    except ValueError as exc:
        return None, f"not JSON: {exc}"
    if not isinstance(value, dict):
        return None, "not an object"
    problem = entry_shape_error(value) if table == "entries" else record_shape_error(value)
    if problem is None and (value.get("id") != ident or value.get("seq") != seq):
        problem = (
            f"the body names id {value.get('id')!r} seq {value.get('seq')!r}, the row id "
            f"{ident!r} seq {seq}"
        )
    return (None, problem) if problem is not None else (dict(value), None)


def bad_row(location: str, table: str, ident: str, seq: int, problem: str) -> dict[str, Any]:
    """The ``bad_row`` damage item of one stored row (``table``, ``id``, ``seq``)."""
    what = "entry" if table == "entries" else "record"
    return damage(
        "bad_row",
        f"{what} {ident} (seq {seq}) of {location}: {problem}; left out",
        table=table,
        id=ident,
        seq=seq,
    )


def scan_rows(
    location: str,
    session_id: str,
    head: tuple[int, int],
    entries: list[tuple[Any, ...]],
    records: list[tuple[Any, ...]],
    lane_ops: list[tuple[Any, ...]],
) -> list[dict[str, Any]]:
    """The damage of one session's rows, read in one snapshot: ``head`` is ``(last_seq,
    checked_from)``, ``entries`` rows ``(id, seq, parent_id, body)``, ``records`` rows ``(id,
    seq, body)``, ``lane_ops`` rows ``(seq, lane)``: ``bad_row``, ``orphan_parent``, and the
    continuity of seqs past ``checked_from`` (``design/storage.md`` "Every damage kind, every
    backend"). Raises nothing on stored content."""
    last_seq, start = head
    out: list[dict[str, Any]] = []
    stored: list[tuple[int, str, str]] = []
    parents: list[tuple[int, str, str]] = []
    for table, rows in (("entries", entries), ("records", records)):
        for row in rows:
            rid, seq, body = row[0], int(row[1]), row[-1]
            stored.append((seq, table, rid))
            if table == "entries" and row[2] is not None:
                parents.append((seq, rid, row[2]))
            problem = row_problem(table, rid, seq, body)[1]
            if problem is not None:
                out.append(bad_row(location, table, rid, seq, problem))
    entry_ids = {r[0] for r in entries}
    for seq, eid, parent in sorted(parents):
        if parent not in entry_ids:
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
    stored.extend((int(seq), "lane_ops", lane) for seq, lane in lane_ops)
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
            checked.append((seq, {"table": table, ("lane" if table == "lane_ops" else "id"): rid}))
    end = {"table": "sessions", "id": session_id, "seq": last_seq}
    out.extend(continuity_damage(checked, start, last_seq, end))
    return out
