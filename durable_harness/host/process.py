"""A session process: one runtime generation of a session, everything process-bound and
nothing persisted (``design/host.md``, "Two objects").
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio

from durable_harness.errors import InvalidRequest
from durable_harness.harness.core import Event
from durable_harness.harness.harness import Harness
from durable_harness.host.record import SessionRecord
from durable_harness.session.session import Session

#: The last events of a generation kept for its readers: a reader resuming after one it saw
#: starts from them, and a live reader more than this many events behind is dropped.
REPLAY_EVENTS = 1024

#: Events a listener may fall behind by before it is dropped (its stream ends): the kept ones.
LISTENER_BUFFER = REPLAY_EVENTS


def _nothing() -> None:
    """Nothing to take back."""


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
        self._event_ids = itertools.count(1)
        self._recent: deque[dict[str, Any]] = deque(maxlen=REPLAY_EVENTS)
        self.last_event_id = 0  # the eventId of the last event published
        self._published: anyio.Event | None = None  # set at the next publish (readers wait)
        self._reaching: dict[int, list[Callable[[], None]]] = {}  # called at that eventId
        self._thresholds: list[int] = []  # the keys of ``_reaching``, a heap
        self._ended = False  # no more events: the generation stopped
        self._observers: list[Callable[[Event], None]] = []

    def observe(self, callback: Callable[[Event], None]) -> None:
        """Call ``callback(event)`` for every harness and lifecycle event of this generation."""
        self._observers.append(callback)

    def publish(self, event: Event) -> None:
        """Number ``event`` (``eventId``, rising per generation), keep it for the readers and
        hand it to every observer. Costs the same whatever the number of readers: each
        :class:`Listener` takes the kept events after its own place when it reads, and one
        event wakes those waiting (``design/http.md``, "Events")."""
        event = {**event, "eventId": next(self._event_ids), "generation": self.generation}
        self.last_event_id = event["eventId"]
        self._recent.append(event)
        for callback in list(self._observers):
            callback(event)
        self._wake()

    def _wake(self) -> None:
        published, self._published = self._published, None
        if published is not None:
            published.set()
        thresholds = self._thresholds
        while thresholds and (thresholds[0] <= self.last_event_id or self._ended):
            for callback in self._reaching.pop(heapq.heappop(thresholds)):
                callback()

    def on_reaching(self, event_id: int, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` once eventId ``event_id`` is published or the generation has no
        more events (at once if so already). A publish calls only the callbacks it reaches:
        what a reader pausing for a backlog is woken by (:meth:`Listener.on_behind`).

        Returns a function that takes the callback back if it was not called yet (what a
        reader woken otherwise calls, so the callbacks kept are those of the readers still
        waiting, and at most one list per eventId ahead)."""
        if event_id <= self.last_event_id or self._ended:
            callback()
            return _nothing
        waiting = self._reaching.get(event_id)
        if waiting is None:
            waiting = self._reaching[event_id] = []
            heapq.heappush(self._thresholds, event_id)
        waiting.append(callback)

        def take_back() -> None:
            with contextlib.suppress(ValueError):  # called already
                waiting.remove(callback)

        return take_back

    async def wait_after(self, seen: int) -> None:
        """Return once an event after eventId ``seen`` is published, or the generation has
        no more events; at once if so already."""
        while seen >= self.last_event_id and not self._ended:
            if self._published is None:
                self._published = anyio.Event()
            await self._published.wait()

    @property
    def events_ended(self) -> bool:
        """Whether the generation publishes no more events (its readers end once caught up)."""
        return self._ended

    def kept_after(self, seen: int, limit: int) -> list[Event] | None:
        """The kept events after eventId ``seen``, oldest first, at most ``limit``;
        ``None`` when some of them are no longer kept (more than :data:`REPLAY_EVENTS`
        were published since)."""
        behind = self.last_event_id - seen
        recent = self._recent
        if behind > len(recent):
            return None
        start = len(recent) - behind
        # a deque is walked from one of its ends: from the nearer one
        if start + limit <= behind:
            return list(itertools.islice(recent, start, start + limit))
        newest = list(itertools.islice(reversed(recent), behind))
        newest.reverse()
        return newest[:limit]

    @property
    def first_kept(self) -> int:
        """The eventId of the oldest event kept (``last_event_id + 1`` when none is)."""
        return self.last_event_id - len(self._recent) + 1

    def listen(self, after: tuple[int, int] | None = None) -> Listener:
        """A stream of this generation's events, in order, ending when the generation stops
        (or the reader falls too far behind). ``after``: the ``(generation, eventId)`` a reader
        saw last: the kept events after it first, with a ``gap`` notice when they cannot
        cover the rest (``design/http.md``, "Events").

        Raises:
            InvalidRequest: ``after`` names an event this generation has not sent.
        """
        seen, prefix = self.last_event_id, []
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
            first = self.first_kept
            if generation < self.generation or first > seen + 1:
                gap = {
                    "type": "gap",
                    "reason": "generation" if generation < self.generation else "dropped",
                    "after": list(after),
                    "resumes": [self.generation, first],
                }
                prefix.append(gap)
                seen = max(seen, first - 1)
        listener = Listener(self, seen, prefix)
        if self.stopped.is_set():
            self._ended = True
        return listener

    def end_listeners(self) -> None:
        """End every listener's stream once it has read what was published (the generation
        stopped)."""
        self._ended = True
        self._wake()


class Listener:
    """One reader's place in a generation's events (:meth:`SessionProcess.listen`): the
    events after the last one it took, read from the generation's kept events, so a reader
    costs the writer nothing and holds no events of its own. Read it with :meth:`batch`
    (every event available at once), or one event at a time (``async for``,
    :meth:`receive`, :meth:`receive_nowait`); it ends (``anyio.EndOfStream``) when the
    generation has stopped and it has read everything, or right after a ``dropped`` notice
    when it fell more than :data:`REPLAY_EVENTS` events behind (``design/http.md``,
    "Events")."""

    def __init__(self, proc: SessionProcess, seen: int, prefix: list[Event]) -> None:
        self.proc = proc
        self.seen = seen  # the eventId of the last event taken
        self._pending: deque[Event] = deque(prefix)
        self._done = False

    def take(self, limit: int = REPLAY_EVENTS) -> list[Event]:
        """Every event available now (at most ``limit``; ``[]`` if none).

        Raises:
            anyio.EndOfStream: the stream has ended.
        """
        if self._pending:
            return [self._pending.popleft() for _ in range(min(limit, len(self._pending)))]
        if self._done:
            raise anyio.EndOfStream
        proc = self.proc
        events = proc.kept_after(self.seen, limit)
        if events is None:  # fell too far behind: a last notice, then the end
            self._done = True
            return [
                {
                    "type": "dropped",
                    "reason": "behind",
                    "after": [proc.generation, self.seen],
                    "kept_from": [proc.generation, proc.first_kept],
                    "limit": REPLAY_EVENTS,
                }
            ]
        if events:
            self.seen = events[-1]["eventId"]
        elif proc.events_ended:
            self._done = True
            raise anyio.EndOfStream
        return events

    async def batch(self, limit: int = REPLAY_EVENTS) -> list[Event]:
        """Every event available (at least one, at most ``limit``), waiting for one if none is.

        Raises:
            anyio.EndOfStream: the stream has ended.
        """
        while True:
            events = self.take(limit)
            if events:
                return events
            await self.proc.wait_after(self.seen)

    def on_behind(self, events: int, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` once this reader is ``events`` events behind its place now, or
        the generation has no more events: a reader pausing between writes is woken before
        it is dropped. Returns the function taking it back (:meth:`SessionProcess.
        on_reaching`)."""
        return self.proc.on_reaching(self.seen + events, callback)

    def receive_nowait(self) -> Event:
        """The next event if one is available.

        Raises:
            anyio.WouldBlock: none is yet. anyio.EndOfStream: the stream has ended.
        """
        events = self.take(1)
        if not events:
            raise anyio.WouldBlock
        return events[0]

    async def receive(self) -> Event:
        """The next event, waiting for it.

        Raises:
            anyio.EndOfStream: the stream has ended.
        """
        return (await self.batch(1))[0]

    def close(self) -> None:
        """Stop reading: the stream ends here."""
        self._done = True
        self._pending.clear()

    def __aiter__(self) -> Listener:
        return self

    async def __anext__(self) -> Event:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Listener:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
