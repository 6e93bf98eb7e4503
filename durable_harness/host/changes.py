"""A host-level signal of session state changes, for fronts that show many sessions at once
(the console's session list: ``design/console.md``, "Live updates").

A reader holds nothing but the last version it saw: each wait returns the newest version
and the sessions changed since, so however many changes happen while a reader is slow, what
it is owed stays one number and a bounded set (bounded per reader by construction).
"""

from __future__ import annotations

import anyio

KEPT = 1024
"""How many of the latest changed session ids are kept to say which changed."""


class Changes:
    """Versioned state changes: :meth:`bump` after a session's state (or whether it waits for
    a decision) changed; :meth:`wait` until the version passes the one a reader saw."""

    def __init__(self) -> None:
        self.version = 0
        self._recent: dict[str, int] = {}  # session id -> version of its latest change
        self._event: anyio.Event | None = None  # made in the event loop, by the first wait

    def bump(self, session_id: str) -> None:
        """Record that ``session_id`` changed and wake every waiting reader."""
        self.version += 1
        self._recent.pop(session_id, None)
        self._recent[session_id] = self.version
        while len(self._recent) > KEPT:
            self._recent.pop(next(iter(self._recent)))
        event, self._event = self._event, None
        if event is not None:
            event.set()

    def since(self, version: int) -> list[str]:
        """The ids changed after ``version`` (oldest first; all kept ones when too old)."""
        return [sid for sid, v in self._recent.items() if v > version]

    async def wait(self, after: int) -> int:
        """Return the current version once it is above ``after`` (at once if it is)."""
        while self.version <= after:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()
        return self.version
