"""Plans first, then serve, then resume (issue 22, ``design/host.md``, "Start-up
reconciliation"): entering the manager plans every crashed session and returns; the resumes
that need no decision then run in the background, each visible (``resume_pending`` in status
and listing, ``lifecycle`` events), consistent with a client's close, resume or send, and
stopped cleanly by a shutdown.

A session whose generation was stopped without a close (``shutdown``, as a crash leaves it)
reads ``suspended`` with an empty plan at the next start: the case the queue resumes. The
background is held on a gate: the generation's control endpoint (``HostOptions.control``)
waits for an event before the generation is up, so the resume that took the queue's first
session holds the manager's lock until the test lets it go.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from durable_harness.errors import SessionNotLive
from durable_harness.host import HostOptions, SessionManager
from durable_harness.http import models
from durable_harness.storage import open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def provider(tmp_path: Path) -> str:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"turns": [{"text": "ok"}]}))
    return f"scripted:{path}"


async def until(check: Callable[[], bool], what: str, limit: float = 60.0) -> None:
    """Wait for ``check`` (a state, polled), failing after a generous ``limit``."""
    with anyio.fail_after(limit):
        while not check():
            await anyio.sleep(0.01)
    assert check(), what


def idle_records(spec: str, sid: str) -> list[int]:
    """The generations that wrote an ``idle`` record (one per generation started)."""
    with open_store(spec).open_session(sid, write=False) as s:
        recs = s.records(None, types=["session_lifecycle"])
    return [int(r.get("generation", 0)) for r in recs if r.get("state") == "idle"]


async def crashed_sessions(spec: str, tmp_path: Path, n: int) -> list[str]:
    """``n`` sessions whose generations stopped without a close."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    async with SessionManager(spec, HostOptions(provider=provider(tmp_path))) as m:
        return [(await m.create(str(work))).id for _ in range(n)]


class Gate:
    """A control endpoint that holds each generation's start until :attr:`open` is set."""

    def __init__(self) -> None:
        self.open = anyio.Event()
        self.entered: list[str] = []

    @asynccontextmanager
    async def __call__(self, manager: Any, session_id: str) -> AsyncIterator[int | None]:
        self.entered.append(session_id)
        await self.open.wait()
        yield None


async def test_resumes_run_after_entering_visible_and_consistent_with_clients(
    tmp_path: Path,
) -> None:
    spec = f"sqlite:{tmp_path / 'host.db'}"
    ids = await crashed_sessions(spec, tmp_path, 5)
    gate = Gate()
    events: list[tuple[str, dict[str, Any]]] = []
    options = HostOptions(provider=provider(tmp_path), control=gate, resume_concurrency=2)
    manager = SessionManager(spec, options)
    manager.observe(lambda sid, e: events.append((sid, e)) if e["type"] == "lifecycle" else None)
    async with manager as m, anyio.create_task_group() as tg:
        # entered with every session planned and none resumed yet: all queued
        queued = [(sid, e["resume_pending"]) for sid, e in events if "resume_pending" in e]
        assert sorted(sid for sid, _ in queued) == sorted(ids)
        assert sorted(p for _, p in queued) == [1, 2, 3, 4, 5]
        await until(lambda: len(gate.entered) == 1, "the first resume to hold at the gate")
        first = gate.entered[0]
        rest = [sid for sid in ids if sid != first]
        positions = m.resume_positions()
        assert sorted(positions) == sorted(rest) and sorted(positions.values()) == [1, 2, 3, 4]

        # visible: status and the listing say suspended, with the place in the queue
        pending = max(positions, key=positions.__getitem__)
        status = await m.status(pending)
        assert status["state"] == "suspended" and status["resume_pending"] == positions[pending]
        models.Status.model_validate(status)
        listing = await m.listing()
        shown = models.SessionList.model_validate(listing)  # what GET /sessions answers
        assert shown.resumes_pending == 4
        by_id = {s.id: s for s in shown.sessions}
        assert {sid: by_id[sid].resume_pending for sid in rest} == positions
        assert all(by_id[sid].state == "suspended" for sid in rest)

        # send: a consistent refusal naming the queue
        with pytest.raises(SessionNotLive) as refused:
            await m.send(pending, "hello")
        assert refused.value.details["resume_pending"] == positions[pending]

        # close wins over the pending resume; an explicit resume does it now (both wait for
        # the lock the held resume has)
        to_close, to_resume = rest[-1], rest[-2]
        closed: dict[str, Any] = {}
        resumed: dict[str, Any] = {}

        async def close() -> None:
            closed["rec"] = await m.close(to_close)

        async def resume() -> None:
            resumed["rec"] = await m.resume(to_resume)

        tg.start_soon(close)
        tg.start_soon(resume)
        # both leave the queue as soon as asked, then wait behind the held resume
        queue = m.resume_positions
        await until(lambda: to_close not in queue() and to_resume not in queue(), "them asked")
        assert len(queue()) == 2 and not closed and not resumed
        gate.open.set()
        with anyio.fail_after(60):
            await m.wait_resumed()
        await until(lambda: "rec" in closed and "rec" in resumed, "the client's close and resume")
        assert closed["rec"].state == "closed"
        assert resumed["rec"].state in ("idle", "running")
        assert m.resume_positions() == {}
        assert to_close not in m.live
        for sid in ids:
            if sid != to_close:
                assert (await m.get(sid)).state == "idle", sid
        # no double resume: each session's generation 2 started exactly once
        for sid in ids:
            assert idle_records(spec, sid).count(2) == (0 if sid == to_close else 1), sid
        # every queued session left the queue, said so, and (but the closed one) went live
        left = {sid for sid, e in events if e.get("resume_pending", 0) is None}
        assert left == set(ids)
        went_idle = {sid for sid, e in events if e.get("state") == "idle"}
        assert went_idle == set(ids) - {to_close}
        status = await m.status(to_resume)
        assert status["resume_pending"] is None


async def test_a_shutdown_during_the_resumes_stops_cleanly(tmp_path: Path) -> None:
    spec = f"sqlite:{tmp_path / 'host.db'}"
    ids = await crashed_sessions(spec, tmp_path, 4)
    gate = Gate()
    options = HostOptions(provider=provider(tmp_path), control=gate, resume_concurrency=1)
    with anyio.fail_after(60):
        async with SessionManager(spec, options) as m, anyio.create_task_group() as tg:
            await until(lambda: len(gate.entered) == 1, "the first resume to hold at the gate")
            assert len(m.resume_positions()) == 3
            tg.start_soon(m.shutdown)
            await until(lambda: m.resume_positions() == {}, "the shutdown to drop the queue")
            gate.open.set()  # the resume in progress finishes; shutdown then stops it
            await m.wait_resumed()
    first = gate.entered[0]
    assert gate.entered == [first]  # nothing begun after the shutdown
    async with SessionManager(spec, HostOptions(auto_resume="never")) as after:
        for sid in ids:
            assert (await after.get(sid)).state == "suspended", sid
            assert idle_records(spec, sid).count(2) == (1 if sid == first else 0), sid
