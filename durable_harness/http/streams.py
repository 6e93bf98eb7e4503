"""A cap on the event streams one server process holds open, across the API, the control
ports and the console: one more is 503 ``too_many_streams`` (``design/http.md``, "Events").
"""

from __future__ import annotations

from typing import Any

from sse_starlette import EventSourceResponse
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from durable_harness.http.errors import error_response

MAX_EVENT_STREAMS = 256
"""The most event streams one process serves at once."""


class StreamSlots:
    """A counter of open event streams with a limit (one per process: :data:`SLOTS`)."""

    def __init__(self, limit: int = MAX_EVENT_STREAMS) -> None:
        self.limit = limit
        self.open = 0

    def refusal(self) -> Response | None:
        """The 503 for one stream too many, or ``None`` when there is room."""
        if self.open < self.limit:
            return None
        return error_response(
            503,
            {
                "code": "too_many_streams",
                "message": f"this server already serves {self.open} event streams, its limit;"
                " try again later",
                "limit": self.limit,
            },
        )

    def response(self, content: Any, **kwargs: Any) -> EventSourceResponse:
        """An :class:`EventSourceResponse` of ``content`` holding one slot until it ends."""
        self.open += 1
        return _Counted(self, content, **kwargs)


class _Counted(EventSourceResponse):
    """An event stream that gives its slot back when it ends, however it ends."""

    def __init__(self, slots: StreamSlots, content: Any, **kwargs: Any) -> None:
        self._slots: StreamSlots | None = slots
        super().__init__(content, **kwargs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()

    def release(self) -> None:
        """Give the slot back (once)."""
        if self._slots is not None:
            self._slots.open -= 1
            self._slots = None

    def __del__(self) -> None:  # never sent (the request failed before): still give it back
        self.release()


SLOTS = StreamSlots()
"""This process's event streams."""
