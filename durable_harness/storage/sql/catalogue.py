"""The catalogue of a SQL store, for both dialects: lookups by id, prefix and cwd, and a new
session's rows."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, ClassVar

from durable_harness.storage import codec
from durable_harness.storage.base import CwdMatcher, SessionInfo, Store
from durable_harness.storage.sql.session import Dialect

INFO = "SELECT id, cwd, created, modified, parent_session FROM sessions"
CHUNK = 500
"""Values per ``IN (...)`` list (under SQLite's bound-parameter limit)."""


def new_session(header: dict[str, Any]) -> list[tuple[str, tuple[Any, ...]]]:
    """The statements (``?`` placeholders) and parameters storing the new session's row and
    ``main`` lane."""
    sid, ts = header["id"], header["timestamp"]
    return [
        (
            "INSERT INTO sessions (id, cwd, created, modified, header, parent_session) "
            "VALUES (?,?,?,?,?,?)",
            (sid, header["cwd"], ts, ts, codec.dumps(header), header.get("parentSession")),
        ),
        ("INSERT INTO lanes (session_id, name, config) VALUES (?, 'main', '{}')", (sid,)),
    ]


class SqlStore(Store):
    """A catalogue in one SQL database; a subclass sets :attr:`dialect`, implements the two
    below."""

    dialect: ClassVar[Dialect]

    @abc.abstractmethod
    def _catalogue(self, sql: str, args: Sequence[Any]) -> list[Any]:
        """Every row of one catalogue query (``sql`` in the dialect)."""

    @abc.abstractmethod
    def _prefix(self, prefix: str) -> tuple[str, list[Any]]:
        """The condition "``id`` starts with ``prefix``" (in the dialect) and its parameters."""

    def _info(self, r: Sequence[Any]) -> SessionInfo:
        return SessionInfo(
            id=r[0],
            cwd=r[1],
            path=f"{self.where()}#{r[0]}",
            created=r[2],
            modified=r[3],
            parent_session=r[4],
        )

    def find_exact(self, session_id: str) -> SessionInfo | None:
        """The session row of ``session_id`` by its primary key, or ``None`` (no such id)."""
        rows = self._catalogue(self.dialect.sql(INFO + " WHERE id = ?"), (session_id,))
        return self._info(rows[0]) if rows else None

    def find_prefixed(self, prefix: str) -> list[SessionInfo]:
        """The rows whose id starts with ``prefix``, by the primary key's index, at most 50."""
        clause, args = self._prefix(prefix)
        return [
            self._info(r)
            for r in self._catalogue(f"{INFO} WHERE {clause} ORDER BY id LIMIT 50", args)
        ]

    def list_sessions(self, cwd: str | None = None) -> list[SessionInfo]:
        """Every session (of ``cwd`` by :class:`CwdMatcher`, each distinct recorded cwd resolved
        once), most recently modified first, then by id."""
        if cwd is None:
            rows = self._catalogue(INFO + " ORDER BY modified DESC, id", [])
        else:
            match = CwdMatcher(cwd)
            found = self._catalogue("SELECT DISTINCT cwd FROM sessions", [])
            spellings = [r[0] for r in found if match(r[0])]
            rows = []
            for i in range(0, len(spellings), CHUNK):
                clause, args = self.dialect.one_of("cwd", spellings[i : i + CHUNK])
                rows += self._catalogue(f"{INFO} WHERE {clause}", args)
            rows.sort(key=lambda r: r[0])
            rows.sort(key=lambda r: r[3], reverse=True)
        return [self._info(r) for r in rows]
