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
