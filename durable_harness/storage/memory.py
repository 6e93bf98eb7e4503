"""The ``memory:`` store: in-memory sessions for one-off scripts and tests, nothing durable."""

from __future__ import annotations

from typing import Any

from durable_harness.errors import SessionExists, SessionNotFound
from durable_harness.storage.base import (
    CwdMatcher,
    Durability,
    SessionInfo,
    SessionStore,
    Store,
)
from durable_harness.storage.indexed import MemorySessionStore


class MemoryStore(Store):
    """Sessions kept in this process only (spec ``memory:``): no lease; ``open_session`` hands back
    the session's one object, or with ``write=False`` a read-only view; ``durability`` and
    ``break_lease`` are ignored. Each ``open_store("memory:")`` makes a new, empty store."""

    def __init__(self) -> None:
        self.spec = "memory:"
        self._sessions: dict[str, MemorySessionStore] = {}

    def _create(self, header: dict[str, Any], durability: Durability, fresh: bool) -> SessionStore:
        sid = header["id"]
        if sid in self._sessions:
            raise SessionExists(f"session {sid} already exists in {self.spec}", session_id=sid)
        store = MemorySessionStore(header, location=f"{self.spec}#{sid}")
        self._sessions[sid] = store
        return store

    def _open(
        self, ref: str, write: bool, durability: Durability, break_lease: bool
    ) -> SessionStore:
        session = self._sessions[self.resolve(ref).id]
        return session if write else session.reader()

    def delete_session(self, session_id: str) -> None:
        """Drop the session from this store (SessionNotFound: no session has this id)."""
        if self._sessions.pop(session_id, None) is None:
            raise SessionNotFound(f"no session {session_id} in {self.spec}", ref=session_id)

    def find_exact(self, session_id: str) -> SessionInfo | None:
        """The row of ``session_id``, or ``None``: no such id."""
        session = self._sessions.get(session_id)
        return self._info(session_id, session) if session is not None else None

    def _info(self, sid: str, s: MemorySessionStore) -> SessionInfo:
        return SessionInfo(
            id=sid,
            cwd=str(s.header.get("cwd", "")),
            path=f"{self.spec}#{sid}",
            created=str(s.header.get("timestamp", "")),
            modified=str(s.header.get("timestamp", "")),
            parent_session=s.header.get("parentSession"),
        )

    def list_sessions(self, cwd: str | None = None) -> list[SessionInfo]:
        """This store's sessions (of ``cwd`` by :class:`CwdMatcher`), newest first."""
        match = CwdMatcher(cwd) if cwd is not None else None
        rows = [
            self._info(sid, s)
            for sid, s in self._sessions.items()
            if match is None or match(str(s.header.get("cwd", "")))
        ]
        return rows[::-1]
