"""A generation's kept events (``SessionProcess.listen(after=...)``): a reader resuming after
the event it saw gets the rest, in order, once; a ``gap`` notice first when the kept events no
longer reach back to it (``design/http.md``, "Events")."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from durable_harness.errors import InvalidRequest
from durable_harness.host.process import REPLAY_EVENTS, SessionProcess
from durable_harness.host.record import SessionRecord
from durable_harness.session.session import Session
from durable_harness.storage import open_store

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _process() -> SessionProcess:
    store = open_store("memory:").create_session("/p")
    return SessionProcess(SessionRecord(id=store.session_id, cwd="/p"), Session(store))


def _drain(stream: Any) -> list[dict[str, Any]]:
    out = []
    while True:
        try:
            out.append(stream.receive_nowait())
        except anyio.WouldBlock:  # nothing more queued
            return out


async def test_a_reader_resumes_after_the_event_it_saw() -> None:
    proc = _process()
    for i in range(10):
        proc.publish({"type": "tick", "i": i})
    stream = proc.listen((proc.generation, 4))
    proc.publish({"type": "tick", "i": 10})
    got = _drain(stream)
    assert [e["eventId"] for e in got] == list(range(5, 12))
    up_to_date = proc.listen((proc.generation, proc.last_event_id))
    assert _drain(up_to_date) == []
    proc.publish({"type": "tick", "i": 11})
    assert [e["eventId"] for e in _drain(up_to_date)] == [12]


async def test_events_no_longer_kept_are_announced_as_a_gap() -> None:
    proc = _process()
    for i in range(REPLAY_EVENTS + 10):
        proc.publish({"type": "tick", "i": i})
    got = _drain(proc.listen((proc.generation, 3)))
    gap, *events = got
    assert gap == {
        "type": "gap",
        "reason": "dropped",
        "after": [proc.generation, 3],
        "resumes": [proc.generation, 11],
    }
    assert [e["eventId"] for e in events] == list(range(11, REPLAY_EVENTS + 11))


async def test_an_event_not_sent_is_refused() -> None:
    proc = _process()
    proc.publish({"type": "tick"})
    for after in [(proc.generation, 2), (proc.generation + 1, 1)]:
        with pytest.raises(InvalidRequest):
            proc.listen(after)


async def test_a_reader_more_than_the_kept_events_behind_is_dropped_with_a_notice() -> None:
    proc = _process()
    proc.publish({"type": "tick"})
    stream = proc.listen()  # from now on: after event 1
    for i in range(REPLAY_EVENTS + 1):
        proc.publish({"type": "tick", "i": i})
    assert stream.receive_nowait() == {
        "type": "dropped",
        "reason": "behind",
        "after": [proc.generation, 1],
        "kept_from": [proc.generation, 3],
        "limit": REPLAY_EVENTS,
    }
    with pytest.raises(anyio.EndOfStream):
        stream.receive_nowait()
    up_to_the_limit = proc.listen()
    for i in range(REPLAY_EVENTS):  # exactly the kept events behind: not dropped
        proc.publish({"type": "tick", "i": i})
    assert len(_drain(up_to_the_limit)) == REPLAY_EVENTS


async def test_a_batch_is_every_event_available_and_the_stream_ends_with_the_generation() -> None:
    proc = _process()
    stream = proc.listen()
    got: list[list[int]] = []

    async def read() -> None:
        while True:
            try:
                batch = await stream.batch()
            except anyio.EndOfStream:
                return
            got.append([e["eventId"] for e in batch])

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        await anyio.wait_all_tasks_blocked()  # the reader waits: nothing published yet
        for i in range(5):
            proc.publish({"type": "tick", "i": i})
        await anyio.wait_all_tasks_blocked()
        proc.publish({"type": "tick", "i": 5})
        proc.end_listeners()
    assert got == [[1, 2, 3, 4, 5], [6]]
    late = proc.listen((proc.generation, 4))  # after the end: what is kept, then the end
    assert [e["eventId"] async for e in late] == [5, 6]


async def test_a_reader_is_woken_at_the_event_that_puts_it_the_given_count_behind() -> None:
    proc = _process()
    proc.publish({"type": "tick"})
    stream = proc.listen()  # after event 1
    woken: list[int] = []
    stream.on_behind(5, lambda: woken.append(proc.last_event_id))
    stream.on_behind(5, lambda: woken.append(-proc.last_event_id))  # same place: same wake
    for i in range(4):
        proc.publish({"type": "tick", "i": i})
    assert woken == []  # 4 behind
    proc.publish({"type": "tick"})
    assert woken == [6, -6]
    proc.publish({"type": "tick"})
    assert woken == [6, -6]  # once
    stream.on_behind(1, lambda: woken.append(0))  # already that far behind: at once
    assert woken == [6, -6, 0]
    _drain(stream)  # caught up: its place is the last event
    take_back = stream.on_behind(3, lambda: woken.append(3))
    take_back()  # woken otherwise (its tick): not called, not kept
    take_back()
    stream.on_behind(100, lambda: woken.append(100))
    for _ in range(3):
        proc.publish({"type": "tick"})
    assert woken == [6, -6, 0]
    assert sum(len(callbacks) for callbacks in proc._reaching.values()) == 1
    proc.end_listeners()  # no more events: woken too
    assert woken == [6, -6, 0, 100]
    assert proc._reaching == {}


@pytest.mark.parametrize("behind", [1, 2, 300, 511, 512, 513, 900, REPLAY_EVENTS])
@pytest.mark.parametrize("limit", [1, 7, 512, REPLAY_EVENTS])
async def test_kept_events_are_taken_in_order_from_either_end(behind: int, limit: int) -> None:
    proc = _process()
    for i in range(REPLAY_EVENTS + 50):
        proc.publish({"type": "tick", "i": i})
    seen = proc.last_event_id - behind
    got = proc.kept_after(seen, limit)
    assert got is not None
    assert [e["eventId"] for e in got] == list(range(seen + 1, seen + 1 + min(behind, limit)))
    assert proc.kept_after(proc.first_kept - 2, limit) is None  # one more than kept


async def test_streams_pausing_for_one_tick_share_one_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio
    import functools

    from durable_harness.http.streams import Ticks

    ticks = Ticks()
    loop = asyncio.get_running_loop()
    timers: list[float] = []
    call_at = loop.call_at

    def counted(when: float, callback: Any, *args: Any, **kwargs: Any) -> Any:
        if callback == ticks._fire:  # not anyio.sleep's own
            timers.append(when)
        return call_at(when, callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_at", counted)
    fired: list[str] = []
    start = loop.time()
    # the three ask within one tick: the clock held mid-tick while they ask (a loaded machine
    # can otherwise pass a tick's edge between two of them)
    held = (start // 0.05) * 0.05 + 0.025
    with monkeypatch.context() as clock:
        clock.setattr(loop, "time", lambda: held)
        for name in ("a", "b", "c"):
            ticks.call_at_next(0.05, functools.partial(fired.append, name))
    assert len(timers) == 1  # one timer for the three
    assert start < timers[0] <= start + 0.05
    assert timers[0] / 0.05 == pytest.approx(round(timers[0] / 0.05))  # on the clock's beat
    await anyio.sleep(0.12)
    assert fired == ["a", "b", "c"]
    ticks.call_at_next(0.05, lambda: fired.append("d"))  # a later tick: a new timer
    assert len(timers) == 2
    await anyio.sleep(0.12)
    assert fired == ["a", "b", "c", "d"]


async def test_a_paused_stream_holds_what_a_fast_run_publishes_and_writes_it_at_its_tick() -> None:
    from durable_harness.http.streams import BEHIND, StreamSlots, paced

    proc = _process()
    slots = StreamSlots()
    slots.open = 256  # the cap: a tick every half second
    stream = proc.listen()
    batches: list[list[int]] = []

    async def read() -> None:
        async for batch in paced(stream, slots):
            batches.append([e["eventId"] for e in batch])

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        await anyio.wait_all_tasks_blocked()
        started = anyio.current_time()
        for i in range(2500):  # five times what is kept, in bursts under half of it
            proc.publish({"type": "tick", "i": i})
            if i % 100 == 99:
                await anyio.sleep(0)
        ticks = int((anyio.current_time() - started) / 0.5) + 1  # a stalled machine's ticks
        proc.end_listeners()
    taken = [i for batch in batches for i in batch]
    assert taken == list(range(1, 2501))  # every event once, in order: none dropped
    # the first write at once, then what came before the tick in one write (the stream took
    # it each time it was BEHIND events behind), not a write per backlog
    assert len(batches) <= 2 + ticks, [len(b) for b in batches]
    assert max(len(b) for b in batches) > 2 * BEHIND


def test_a_tick_of_a_loop_that_stopped_does_not_hold_a_stream_of_the_next_loop() -> None:
    """The streams' clock is the process's; a tick asked for on an event loop that stopped
    before it fired is not the next loop's: a stream there gets a timer of its own."""
    import asyncio
    import time

    from durable_harness.http.streams import Ticks

    ticks = Ticks()
    fired: list[str] = []

    async def ask(name: str) -> None:  # a second's period: both ask for the same tick
        ticks.call_at_next(1.0, lambda: fired.append(name))

    asyncio.run(ask("first"))  # its loop closes before the tick
    started = time.monotonic()

    async def second() -> None:
        await ask("second")
        while not fired and time.monotonic() - started < 3:
            await asyncio.sleep(0.01)

    asyncio.run(second())
    assert fired == ["second"], fired
    assert time.monotonic() - started < 2.9  # its own tick, not the end of the wait
