"""The host-level signal the console's list listens to (``durable_harness/host/changes.py``):
a reader owes one number however many changes it missed, and waking is immediate."""

from __future__ import annotations

import anyio
import pytest

from durable_harness.host.changes import KEPT, Changes

pytestmark = pytest.mark.anyio


async def test_a_slow_reader_is_owed_one_version_and_a_bounded_set() -> None:
    changes = Changes()
    seen = changes.version
    for i in range(KEPT * 3):  # far more changes than are kept, while nobody reads
        changes.bump(f"s{i % (KEPT * 2)}")
    assert await changes.wait(seen) == KEPT * 3  # at once: one number, no queue
    assert len(changes.since(seen)) == KEPT  # the kept ids are bounded
    assert changes.since(changes.version) == []


async def test_a_waiting_reader_wakes_on_the_next_change() -> None:
    changes = Changes()
    got: list[int] = []

    async def reader() -> None:
        got.append(await changes.wait(changes.version))

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        await anyio.wait_all_tasks_blocked()
        assert got == []
        changes.bump("a")
    assert got == [1]
    assert changes.since(0) == ["a"]
    changes.bump("b")
    changes.bump("a")  # the latest change of a session is the one kept
    assert changes.since(1) == ["b", "a"]
