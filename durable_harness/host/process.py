"""A session process: one runtime generation of a session, everything process-bound and
nothing persisted (``design/host.md``, "Two objects").
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from durable_harness.errors import InvalidRequest
from durable_harness.harness.core import Event
from durable_harness.harness.harness import Harness
from durable_harness.host.record import SessionRecord
from durable_harness.session.session import Session

#: Events a listener may fall behind by before it is dropped (its stream ends).
LISTENER_BUFFER = 1024

#: The last events of a generation kept for a listener that resumes after one it saw.
REPLAY_EVENTS = 1024


class SessionProcess:
    """One runtime generation of one session: its ``record`` (kept current), its ``session``
    open for writing (the writer lease), its ``harness`` once up, its control ``port``."""

    def __init__(self, record: SessionRecord, session: Session) -> None:
        self.record = record
        self.session = session
        self.harness: Harness | None = None
        self.generation = session.store.generation
        self.port: int | None = None
        self.scope = anyio.CancelScope()
        self.stopped = anyio.Event()
        self.releasing = False  # the generation's end has begun (``GenerationRunner.release``)
        self.accepting = False  # the turn lock: a prompt is being accepted
        self.running: set[str] = set()  # lanes with a live run (from the harness's events)
        self.ended: deque[str] = deque(maxlen=64)  # ids of the runs that ended last
        self._listeners: list[MemoryObjectSendStream[dict[str, Any]]] = []
        self._event_ids = itertools.count(1)
        self._recent: deque[dict[str, Any]] = deque(maxlen=REPLAY_EVENTS)
        self.last_event_id = 0  # the eventId of the last event published
        self._observers: list[Callable[[Event], None]] = []

    def observe(self, callback: Callable[[Event], None]) -> None:
        """Call ``callback(event)`` for every harness and lifecycle event of this generation."""
        self._observers.append(callback)

    def publish(self, event: Event) -> None:
        """Number ``event`` (``eventId``, rising per generation) and hand it to every observer
        and listener; a listener more than :data:`LISTENER_BUFFER` events behind is dropped."""
        event = {**event, "eventId": next(self._event_ids), "generation": self.generation}
        self.last_event_id = event["eventId"]
        self._recent.append(event)
        for callback in list(self._observers):
            callback(event)
        for stream in list(self._listeners):
            try:
                stream.send_nowait(event)
            except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._listeners.remove(stream)
                stream.close()

    def listen(self, after: tuple[int, int] | None = None) -> MemoryObjectReceiveStream[Event]:
        """A stream of this generation's events, in order, ending when the generation stops
        (or the reader falls too far behind). ``after``: the ``(generation, eventId)`` a reader
        saw last: the kept events after it first, with a ``gap`` notice when they cannot
        cover the rest (``design/http.md``, "Events").

        Raises:
            InvalidRequest: ``after`` names an event this generation has not sent.
        """
        replay: list[Event] = []
        if after is not None:
            generation, seen = after
            if generation > self.generation or (
                generation == self.generation and seen > self.last_event_id
            ):
                raise InvalidRequest(
                    f"event {generation}-{seen} was not sent by session {self.record.id} "
                    f"(generation {self.generation}, last event {self.last_event_id})",
                    session_id=self.record.id,
                )
            if generation < self.generation:
                seen = 0
            replay = [e for e in self._recent if e["eventId"] > seen]
            first = replay[0]["eventId"] if replay else self.last_event_id + 1
            if generation < self.generation or first > seen + 1:
                gap = {
                    "type": "gap",
                    "reason": "generation" if generation < self.generation else "dropped",
                    "after": list(after),
                    "resumes": [self.generation, first],
                }
                replay.insert(0, gap)
        send, receive = anyio.create_memory_object_stream[Event](LISTENER_BUFFER + len(replay))
        for event in replay:
            send.send_nowait(event)
        if self.stopped.is_set():
            send.close()
        else:
            self._listeners.append(send)
        return receive

    def end_listeners(self) -> None:
        """Close every listener's stream (the generation stopped)."""
        for stream in self._listeners:
            stream.close()
        self._listeners.clear()
