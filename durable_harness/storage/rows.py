"""Rows of the database backends (SQLite, PostgreSQL) read back: each stored body decoded and
shape-checked, a damaged one reported as ``bad_row`` damage (``design/storage.md``, "Every
damage kind")."""

from __future__ import annotations

from typing import Any

from durable_harness.storage import codec
from durable_harness.storage.base import SessionInfo, damage
from durable_harness.storage.shapes import entry_shape_error, record_shape_error


def row_problem(
    table: str, ident: str, seq: int, body: bytes
) -> tuple[dict[str, Any] | None, str | None]:
    """Decode one stored body: ``(value, None)``, or ``(None, why it is damaged)``."""
    try:
        value = codec.loads(body)
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


def session_info(location: str, row: tuple[Any, ...]) -> SessionInfo:
    """A catalogue row ``(id, cwd, created, modified, parent_session)`` of the store at
    ``location`` (its spec) as a :class:`SessionInfo` whose path is ``LOCATION#ID``."""
    return SessionInfo(
        id=row[0],
        cwd=row[1],
        path=f"{location}#{row[0]}",
        created=row[2],
        modified=row[3],
        parent_session=row[4],
    )
