"""The event streams of one server process (``design/http.md``, "Events"): a cap on how many
it holds open, across the API, the control ports and the console (one more is 503
``too_many_streams``), and the SSE frames of a reader, written in batches at a pace that keeps
the writers' turns fast however many readers there are.
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import orjson
from sse_starlette import EventSourceResponse
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from durable_harness.harness.core import Event
from durable_harness.host.process import REPLAY_EVENTS, Listener
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


WRITES_PER_SECOND = 512
"""The writes per second all of a process's event streams share: after each write a stream
pauses until the next tick of a clock beating every ``open streams / WRITES_PER_SECOND``
seconds (no pause below :data:`MIN_PAUSE`), and what was published meanwhile goes out in its
next write. On a shared tick the streams that keep up take the same events, so the bytes of
one write are joined once for all of them (:class:`FrameCache`). One stream writes within
2 ms; 256 write twice a second each, so the readers' share of the event loop stays bounded
however fast the run publishes. Why a budget of writes rather than of bytes: the ``bench
streams`` profile showed a write costing the loop about the same whatever its size (the
ASGI send path, and the socket send that wakes the reader), so the number of writes is
what readers cost a run."""

_LINE_BREAKS = re.compile(r"\r\n|\r|\n")

MIN_PAUSE = 0.002
"""Seconds below which a stream does not pause between writes."""

BEHIND = REPLAY_EVENTS // 2
"""Events behind at which a pausing stream takes what is available (to write at its tick):
half the kept events, so the other half covers what the run publishes before the stream's
task runs again (a provider's turn publishes the deltas of one read of its stream without a
pause of the event loop between them; ``tests/http_api/test_stream_fanout.py`` pins bursts
of just over 512)."""

HELD_EVENTS = 4 * REPLAY_EVENTS
"""Events a pausing stream holds (references to the kept ones) before it writes them without
waiting for its tick: what bounds its memory in a run faster than the clock."""

FRAMES_KEPT = 4096
"""Encoded events kept for the other readers of the same event (each is encoded once)."""

BATCHES_KEPT = 64
"""Joined writes kept for the other readers of the same run of events (readers woken by the
same event mostly take the same ones)."""

BATCH_BYTES_KEPT = 16 * 1024 * 1024
"""Bytes of joined writes kept at most, whatever their number (a write may join up to
:data:`HELD_EVENTS` events)."""


def event_id(event: dict[str, Any]) -> str:
    """The SSE ``id`` of a generation's event, ``GENERATION-EVENTID`` (``design/http.md``,
    "Events"); ``""`` for a ``gap`` or ``dropped`` notice."""
    if "eventId" not in event:
        return ""
    return f"{event.get('generation', 0)}-{event['eventId']}"


def sse_frame(event: dict[str, Any]) -> bytes:
    """One event as an SSE frame: ``id`` (:func:`event_id`, left out when empty), ``event`` =
    its type (line breaks removed), ``data`` = the event as JSON (one line: JSON escapes line
    breaks), then the blank line."""
    ident = event_id(event)
    etype = _LINE_BREAKS.sub("", str(event.get("type", "message")))
    head = f"id: {ident}\r\nevent: {etype}\r\n" if ident else f"event: {etype}\r\n"
    return b"".join((head.encode(), b"data: ", orjson.dumps(event, default=str), b"\r\n\r\n"))


class FrameCache:
    """The SSE frames of the last :data:`FRAMES_KEPT` events, and the last
    :data:`BATCHES_KEPT` writes joined from them (at most :data:`BATCH_BYTES_KEPT`), by
    session, generation and eventIds: every reader of an event writes the same bytes, encoded
    and joined once."""

    def __init__(self, size: int = FRAMES_KEPT, batches: int = BATCHES_KEPT) -> None:
        self.size = size
        self.batches = batches
        self._frames: OrderedDict[tuple[str, int, int], bytes] = OrderedDict()
        self._batches: OrderedDict[tuple[str, int, int, int], bytes] = OrderedDict()
        self._batch_bytes = 0

    def frame(self, session_id: str, event: dict[str, Any]) -> bytes:
        """:func:`sse_frame` of ``event`` (of session ``session_id``), from the cache when
        another reader encoded it; a notice without ``eventId`` is encoded each time."""
        if "eventId" not in event:
            return sse_frame(event)
        key = (session_id, int(event.get("generation", 0)), int(event["eventId"]))
        found = self._frames.get(key)
        if found is None:
            found = self._frames[key] = sse_frame(event)
            if len(self._frames) > self.size:
                self._frames.popitem(last=False)
        return found

    def write(self, session_id: str, events: list[dict[str, Any]]) -> bytes:
        """The frames of ``events`` (consecutive events of one generation, or one notice)
        joined, from the cache when another reader took the same ones."""
        first, last = events[0], events[-1]
        if "eventId" not in first or "eventId" not in last:
            return b"".join([self.frame(session_id, event) for event in events])
        key = (session_id, int(first["generation"]), int(first["eventId"]), int(last["eventId"]))
        found = self._batches.get(key)
        if found is None:
            found = b"".join([self.frame(session_id, event) for event in events])
            self._batches[key] = found
            self._batch_bytes += len(found)
            while len(self._batches) > self.batches or self._batch_bytes > BATCH_BYTES_KEPT:
                self._batch_bytes -= len(self._batches.popitem(last=False)[1])
        return found


FRAMES = FrameCache()
"""This process's encoded events."""


async def sse_batches(
    listener: Listener, session_id: str, slots: StreamSlots | None = None
) -> AsyncIterator[bytes]:
    """The SSE frames of ``listener``'s events, one write per batch of :func:`paced`; ends
    with the listener (the generation stopped, or the reader was dropped)."""
    with listener:
        async for events in paced(listener, slots):
            yield FRAMES.write(session_id, events)


async def paced(listener: Listener, slots: StreamSlots | None = None) -> AsyncIterator[list[Event]]:
    """``listener``'s events in batches, each every event available (at least one), a pause
    after each (:func:`pause`: to the next tick of the clock ``slots``' open streams share,
    :data:`WRITES_PER_SECOND`), what the pause took first in the next; ends with the
    listener. What the event streams and the console's live stream write."""
    events: list[Event] = []
    while True:
        try:
            if events:
                events += listener.take()
            else:
                events = await listener.batch()
        except anyio.EndOfStream:
            if events:
                yield events
            return
        yield events
        events = await pause(listener, slots)


async def pause(listener: Listener, slots: StreamSlots | None = None) -> list[Event]:
    """The pause of ``listener``'s stream after a write: until the next tick of the clock all
    of ``slots``' (default :data:`SLOTS`) open streams share (:data:`WRITES_PER_SECOND`).
    Each time the reader is :data:`BEHIND` events behind meanwhile, it takes what is
    available (so it is never dropped for the pause), and writes it at the tick, or at once
    once it holds :data:`HELD_EVENTS`. Returns the events taken."""
    period = (slots or SLOTS).open / WRITES_PER_SECOND
    held: list[Event] = []
    if period < MIN_PAUSE:
        return held
    waiting = _Pause()
    TICKS.call_at_next(period, waiting.tick)  # to the next tick: the streams write together
    while True:
        take_back = listener.on_behind(BEHIND, waiting.wake)
        try:
            await waiting.woken.wait()
        finally:
            take_back()
        if waiting.ticked:
            return held
        try:
            held += listener.take()
        except anyio.EndOfStream:
            return held
        if len(held) >= HELD_EVENTS or (held and "eventId" not in held[-1]):
            return held  # enough held, or a ``dropped`` notice: write now
        waiting.woken = anyio.Event()


class _Pause:
    """One stream's pause: woken by its tick (:attr:`ticked`) or by its backlog."""

    def __init__(self) -> None:
        self.ticked = False
        self.woken = anyio.Event()

    def tick(self) -> None:
        self.ticked = True
        self.woken.set()

    def wake(self) -> None:
        self.woken.set()


class Ticks:
    """The clock a process's event streams pause to: a tick every ``period`` seconds of the
    event loop's clock, one timer per tick for all the streams waiting for it (a timer and a
    cancel scope per stream cost the run's event loop about what the writes did: ``bench
    streams``). The HTTP server runs on asyncio (uvicorn), whose loop keeps the timers; a
    tick belongs to the loop that asked for it first, so a stream of another loop of the same
    process (a test's, an embedding's) never waits for a timer its own loop does not hold."""

    def __init__(self) -> None:
        self._waiting: dict[float, tuple[asyncio.AbstractEventLoop, list[Callable[[], None]]]]
        self._waiting = {}

    def call_at_next(self, period: float, callback: Callable[[], None]) -> None:
        """Call ``callback()`` at the next multiple of ``period`` (seconds, > 0) of the
        running event loop's clock."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        tick = (now // period + 1) * period
        entry = self._waiting.get(tick)
        if entry is None or entry[0] is not loop:
            # ticks past whose loop stopped before they fired: nothing will call them
            for stale in [t for t in self._waiting if t < now - 1.0]:
                del self._waiting[stale]
            entry = self._waiting[tick] = (loop, [])
            loop.call_at(tick, self._fire, tick, entry)
        entry[1].append(callback)

    def _fire(
        self, tick: float, entry: tuple[asyncio.AbstractEventLoop, list[Callable[[], None]]]
    ) -> None:
        if self._waiting.get(tick) is entry:
            del self._waiting[tick]
        for callback in entry[1]:
            callback()


TICKS = Ticks()
"""This process's stream clock."""
