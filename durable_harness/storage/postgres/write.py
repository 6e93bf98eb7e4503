"""The statement a PostgreSQL writer sends and its parameters, for both ways of sending it
(waited through psycopg, unwaited on a pipeline): :data:`WRITE` (``dh_write``, migration 4;
``design/postgres.md`` "Commit"). Every parameter is a ``str`` (or ``None``) in PostgreSQL's
text input format, cast in the statement itself."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg

from durable_harness.errors import InvalidOp, SessionNotFound, UnknownEntry
from durable_harness.ids import now_iso
from durable_harness.storage import codec
from durable_harness.storage.base import EntryOp, LaneState, Op
from durable_harness.storage.fold import number
from durable_harness.storage.shapes import checked_id, id_conflict

_WRITE_TYPES = (
    *("text", "bigint", "bigint", "boolean", "text"),
    *("text[]", "text[]", "text[]", "text[]", "text[]", "text[]", "bytea[]", "boolean[]"),
    *("text[]", "text[]"),
)
"""The parameters of ``dh_write`` (migration 4), in order."""


def _cast(placeholders: Sequence[str], types: Sequence[str]) -> str:
    return ", ".join(f"{p}::{t}" for p, t in zip(placeholders, types, strict=True))


WRITE = f"SELECT dh_write({_cast(['%s'] * len(_WRITE_TYPES), _WRITE_TYPES)})"
"""``dh_write`` with psycopg's placeholders."""
WRITE_PIPELINED = (
    f"SELECT dh_write({_cast([f'${i + 1}' for i in range(len(_WRITE_TYPES))], _WRITE_TYPES)})"
).encode()
"""``dh_write`` with libpq's placeholders (:mod:`.unwaited`)."""


def text_array(values: Sequence[str | None]) -> str:
    """A ``text[]`` literal (elements double-quoted, ``\\`` and ``"`` escaped; ``None`` as
    ``NULL``)."""
    return (
        "{"
        + ",".join(
            "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
            for v in values
        )
        + "}"
    )


def write_params(
    session_id: str,
    generation: int,
    last_seq: int,
    sync: bool,
    ops: Sequence[Op],
    lanes_known: Mapping[str, LaneState],
) -> list[str | None]:
    """The parameters of :data:`WRITE` for ``ops`` after ``last_seq``: the session, ``generation``,
    ``last_seq``, ``sync``, the time, the ops as parallel arrays, and the lanes ``lanes_known``
    (the writer's cached lanes) lacks. UnknownEntry: an entry or record without a string id;
    InvalidOp: an id, parent, type, lane or run id holding a NUL."""
    rows: list[tuple[Any, ...]] = []  # kind, id, parent, type, lane, run, body, leaf?, config
    merged: dict[str, dict[str, Any]] = {}  # lane configs as this commit leaves them
    for op in number(list(ops), last_seq):
        kind = op["op"]
        if kind != "lane":
            body = op[kind]
            parent, lane = (
                body.get("parentId"),
                op.get("lane") if kind == "entry" else body.get("lane"),
            )
            run = None if kind == "entry" else body.get("runId")
            rows.append((kind[0], checked_id(kind, body), _text(parent), str(body.get("type", "")),
                         _text(lane), _text(run), codec.dumps(body), False, None))  # fmt: skip
            continue
        config = None
        if op.get("config"):
            known = lanes_known.get(op["lane"])
            base = merged.get(op["lane"], known.config if known is not None else {})
            merged[op["lane"]] = {**base, **op["config"]}
            config = codec.dumps(merged[op["lane"]]).decode()
        lane_body = {k: v for k, v in op.items() if k != "op"}
        rows.append(("l", None, op.get("leafId"), None, op["lane"], None, codec.dumps(lane_body),
                     "leafId" in op, config))  # fmt: skip
    kinds, idents, parents, types, lanes, runs, bodies, set_leaf, configs = (
        [row[i] for row in rows] for i in range(9)
    )
    for name, values in (("id", idents), ("parent", parents), ("type", types), ("lane", lanes),
                         ("run id", runs)):  # fmt: skip
        if any(v is not None and "\x00" in v for v in values):
            raise InvalidOp(f"an op's {name} holds a NUL character, which PostgreSQL text "
                            "cannot store", op=name)  # fmt: skip
    new_lanes = sorted({x for x in lanes if x is not None} - lanes_known.keys())
    return [
        session_id,
        str(generation),
        str(last_seq),
        "t" if sync else "f",
        now_iso(),
        text_array(kinds),
        text_array(idents),
        text_array(parents),
        text_array(types),
        text_array(lanes),
        text_array(runs),
        "{" + ",".join('"\\\\x' + v.hex() + '"' for v in bodies) + "}",  # bytea[], hex
        "{" + ",".join("t" if v else "f" for v in set_leaf) + "}",
        text_array(configs),
        text_array(new_lanes) if new_lanes else None,
    ]


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


class StaleState(Exception):
    """The writer's cached ``last_seq`` was behind the database (``DH003``): reload, resend."""


def resend_cures(exc: psycopg.Error) -> bool:
    """True for a refusal that sending again cures: ``DH003``, or a lost prepared statement."""
    return exc.sqlstate in ("DH003", "26000")


def refusal(
    exc: psycopg.Error,
    ops: list[Op],
    session_id: str,
    where: str,
    stale: Callable[[int], Exception],
) -> Exception:
    """The typed error for a ``dh_write`` of ``ops`` the server refused (a fence's ``DH00x``, a key
    by its constraint's name), or ``exc`` itself when no op can cause it."""
    if not isinstance(exc, psycopg.errors.IntegrityError):
        number = re.search(r"(\d+)\s*$", exc.diag.message_primary or "")
        if exc.sqlstate == "DH002":
            return stale(int(number.group(1)) if number else -1)
        if exc.sqlstate == "DH001":
            return SessionNotFound(f"session {where} was deleted", session_id=session_id)
        return StaleState() if exc.sqlstate == "DH003" else exc
    name = exc.diag.constraint_name or ""
    found = re.search(r"=\((.*)\) (?:already exists|is not present)", exc.diag.message_detail or "")
    value = found.group(1) if found else "?"
    value = value.removeprefix(f"{session_id}, ")
    if name in ("entries_pkey", "records_pkey"):
        return id_conflict("entry" if name == "entries_pkey" else "record", value, where)
    if name == "entries_parent":
        child = next(
            (
                op.entry.get("id")
                for op in ops
                if isinstance(op, EntryOp) and op.entry.get("parentId") == value
            ),
            "?",
        )
        return UnknownEntry(
            f"parent {value} of entry {child} does not exist in {where}", entry_id=value
        )
    if name == "lanes_leaf":
        return UnknownEntry(f"leaf {value} does not exist in {where}", entry_id=value)
    return exc
