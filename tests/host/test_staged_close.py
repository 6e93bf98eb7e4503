"""``close`` of a live session whose ``bash`` call ignores SIGTERM: the group gets SIGTERM at
the start of the grace period and SIGKILL at its end, and ``close`` returns within grace + 2 s
(issue 20, "Staged close is bounded"; ``design/host.md``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import pytest

from durable_harness.host import HostOptions, SessionManager
from durable_harness.storage import open_store
from durable_harness.tools.processes import group_alive

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

GRACE = 1.5
COMMAND = "trap 'echo term >> got' TERM; echo started > started; while :; do sleep 0.05; done"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_close_sends_sigterm_then_sigkill_after_the_grace(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    call = {"name": "bash", "arguments": {"command": COMMAND}}
    script.write_text(json.dumps({"turns": [{"text": "", "tool_calls": [call]}, {"text": "."}]}))
    work = tmp_path / "work"
    work.mkdir()
    spec = f"sqlite:{tmp_path}/host.db"
    options = HostOptions(provider=f"scripted:{script}", close_grace=GRACE)
    async with SessionManager(spec, options) as manager:
        sid = (await manager.create(str(work))).id
        await manager.send(sid, "go")
        with anyio.fail_after(30):
            while not (work / "started").exists():
                await anyio.sleep(0.02)
        with open_store(spec).open_session(sid, write=False) as store:
            (proc,) = store.records(None, types=("tool_process",))
        began = time.monotonic()
        assert (await manager.close(sid)).state == "closed"
        took = time.monotonic() - began
        assert "term" in (work / "got").read_text()  # SIGTERM came first, and was ignored
        assert not group_alive(proc["pgid"], proc["startTime"])  # SIGKILL ended it
        # it outlived SIGTERM until the grace ran out, and close did not wait much longer
        assert GRACE - 0.1 <= took <= GRACE + 2.0, took
