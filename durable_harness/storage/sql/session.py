"""One session in a SQL database, read the same way in every dialect: the queries, the decoding of
rows (a damaged row reported, never raised) and the damage scan; a dialect's subclass runs a
query, reads the scan's snapshot, and commits (the schema: ``design/storage.md`` "SQLite",
``design/postgres.md`` "Schema")."""

from __future__ import annotations

import abc
import threading
from collections.abc import Sequence
from typing import Any, ClassVar

from durable_harness.errors import InvalidOp, SessionNotFound
from durable_harness.storage import codec
from durable_harness.storage.base import LaneState, Op, RecordFilter, SessionStore
from durable_harness.storage.shapes import op_shape_error
from durable_harness.storage.sql.scan import bad_row, blob, row_problem, scan_rows


class Dialect:
    """What differs between the dialects in the shared queries; the default is SQLite's."""

    def sql(self, text: str) -> str:
        """``text`` (written with ``?`` placeholders) in this dialect."""
        return text

    def one_of(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """The condition "``column`` is one of ``values``" and its parameters."""
        return f"{column} IN ({','.join('?' * len(values))})", list(values)


class PostgresDialect(Dialect):
    """PostgreSQL's: ``%s`` placeholders, ``= ANY(%s)`` with the list as one parameter."""

    def sql(self, text: str) -> str:
        return text.replace("?", "%s")

    def one_of(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        return f"{column} = ANY(%s)", [list(values)]


LANES = "SELECT name, leaf_id, config, run_id, run_seq FROM lanes WHERE session_id=?"


def lane_row(r: Sequence[Any]) -> LaneState:
    """A ``lanes`` row ``(name, leaf_id, config, run_id, run_seq)`` as a :class:`LaneState`."""
    return LaneState(r[0], r[1], codec.loads(blob(r[2])), r[3], None if r[4] is None else int(r[4]))


class SqlSessionStore(SessionStore):
    """The reads, decoding and damage scan of one SQL session. A subclass sets :attr:`dialect`,
    ``_lock`` (an ``RLock``) and ``_damage = None``, and implements :meth:`_rows` and
    :meth:`_snapshot`."""

    dialect: ClassVar[Dialect] = Dialect()
    _lock: threading.RLock
    _damage: list[dict[str, Any]] | None

    @abc.abstractmethod
    def _rows(self, sql: str, args: Sequence[Any]) -> list[Any]:
        """Every row of one read (``sql`` in the dialect) of committed data."""

    @abc.abstractmethod
    def _snapshot(self, queries: list[str]) -> list[list[Any]]:
        """The rows of each of ``queries`` (one parameter: the session id), in one snapshot."""

    def _scan_queries(self) -> list[str]:
        """The scan's queries: the head ``(last_seq, checked_from)``, then entry, record, lane op
        rows."""
        return [
            "SELECT last_seq, checked_from FROM sessions WHERE id=?",
            "SELECT id, seq, parent_id, body FROM entries WHERE session_id=?",
            "SELECT id, seq, body FROM records WHERE session_id=?",
            "SELECT seq, lane FROM lane_ops WHERE session_id=?",
        ]

    def _query(self, text: str, args: Sequence[Any]) -> list[Any]:
        return self._rows(self.dialect.sql(text), args)

    def _filtered(self, table: str, where: str, args: list[Any], types: Any) -> list[Any]:
        """The decoded ``table`` bodies matching ``where`` and ``types``, in seq order."""
        sql = f"SELECT id, seq, body FROM {table} WHERE session_id=?{where}"
        if types is not None:
            clause, more = self.dialect.one_of("type", list(types))
            sql, args = f"{sql} AND {clause}", [*args, *more]
        rows = self._rows(self.dialect.sql(sql + " ORDER BY seq"), args)
        return [d for r in rows if (d := self._decode(table, *r)) is not None]

    def get_entry(self, entry_id: str) -> dict[str, Any] | None:
        rows = self._query(
            "SELECT id, seq, body FROM entries WHERE session_id=? AND id=?",
            (self.session_id, entry_id),
        )
        return self._decode("entries", *rows[0]) if rows else None

    def iter_entries(self, types: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        return self._filtered("entries", "", [self.session_id], types)

    def entry_count(self) -> int:
        rows = self._query("SELECT COUNT(*) FROM entries WHERE session_id=?", (self.session_id,))
        return int(rows[0][0])

    def lanes(self) -> dict[str, LaneState]:
        out = {r[0]: lane_row(r) for r in self._query(LANES, (self.session_id,))}
        out.setdefault("main", LaneState("main"))
        return out

    def lane(self, name: str) -> LaneState:
        rows = self._query(LANES + " AND name=?", (self.session_id, name))
        return lane_row(rows[0]) if rows else LaneState(name)

    def _records(self, where: RecordFilter) -> list[dict[str, Any]]:
        sql, args = " AND seq>?", [self.session_id, where.since_seq]
        for column, value in (("lane", where.lane), ("run_id", where.run_id)):
            if value is not None:
                sql += f" AND {column}=?"
                args.append(value)
        return self._filtered("records", sql, args, where.types)

    def last_seq(self) -> int:
        rows = self._query("SELECT last_seq FROM sessions WHERE id=?", (self.session_id,))
        if not rows:
            raise SessionNotFound(
                f"session {self.location} was deleted", session_id=self.session_id
            )
        return int(rows[0][0])

    def _check_shapes(self, ops: list[Op]) -> None:
        """Refuse ``ops`` that would read back as damage (InvalidOp), before anything is written."""
        for op in ops:
            problem = op_shape_error(op)
            if problem is not None:
                raise InvalidOp(f"{self.location}: {problem}", op=type(op).__name__)

    def _decode(self, table: str, ident: str, seq: Any, body: Any) -> dict[str, Any] | None:
        """Decode a stored body; a damaged one is reported in ``damage`` (``bad_row``) and left
        out."""
        value, problem = row_problem(table, ident, int(seq), body)
        if problem is not None:
            item = bad_row(self.location, table, ident, int(seq), problem)
            with self._lock:
                if item not in self.damage:
                    self.damage.append(item)
            return None
        return value

    @property
    def damage(self) -> list[dict[str, Any]]:
        """Damage in this session: one full :meth:`scan` on first use, plus damaged rows met
        later."""
        with self._lock:
            if self._damage is None:
                self._damage = self.scan()
            return self._damage

    @damage.setter
    def damage(self, value: list[dict[str, Any]]) -> None:
        self._damage = value

    def scan(self) -> list[dict[str, Any]]:
        """Check the whole session in one snapshot; return its damage (raises nothing on
        content)."""
        head, entries, records, lane_ops = self._snapshot(
            [self.dialect.sql(q) for q in self._scan_queries()]
        )
        last, start = (int(head[0][0]), int(head[0][1])) if head else (0, 0)
        return scan_rows(self.location, self.session_id, (last, start), entries, records, lane_ops)
