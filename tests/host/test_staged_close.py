"""The staged close, bounded (``host/runner.py``, ``design/host.md`` "Closing"): real bash
process groups get SIGTERM at the start of the grace and SIGKILL at its end; a Python tool
that ignores cancellation neither holds the close nor has its late result recorded."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.to_thread
import pytest
from pydantic import BaseModel

from durable_harness.crashtest import forkserver
from durable_harness.host import HostOptions, SessionManager
from durable_harness.host.options import default_tools
from durable_harness.host.record import CommandRuntime
from durable_harness.tools.base import Tool, ToolContext, ToolResult
from durable_harness.tools.processes import group_alive

from .test_manager import records, script, state_is, workdir

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def bash_call(command: str) -> dict[str, Any]:
    return {"text": "", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]}


async def wait_file(path: Path, limit: float = 20.0) -> None:
    """Wait until ``path`` is written, not only created (``echo $$ > pid`` creates it first)."""
    deadline = time.monotonic() + limit
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        await anyio.sleep(0.01)


@pytest.mark.slow
async def test_bash_gets_sigterm_at_the_start_of_the_grace_and_sigkill_at_its_end(
    tmp_path: Path,
) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    work = Path(workdir(tmp_path))
    command = (
        f"echo $$ > {work / 'pid'}; trap 'date +%s.%N > {work / 'term'}' TERM; "
        "while :; do sleep 0.05; done"
    )
    provider = script(tmp_path, [bash_call(command), {"text": "never"}])
    grace = 2.0
    async with SessionManager(spec, HostOptions(provider=provider, close_grace=grace)) as m:
        rec = await m.create(str(work))
        await m.send(rec.id, "go")
        await wait_file(work / "pid")
        pgid = int((work / "pid").read_text())
        started = time.monotonic()
        wall = time.time()
        closed = await m.close(rec.id)
        took = time.monotonic() - started
        assert closed.state == "closed"
        assert not group_alive(pgid)
    term_at = float((work / "term").read_text()) - wall
    assert term_at < 1.0, f"SIGTERM came {term_at:.2f} s into the grace"
    assert grace - 0.2 <= took <= grace + 2.0, f"close took {took:.2f} s"
    log = records(spec, rec.id)
    assert [r["outcome"] for r in log if r["type"] == "run_finished"] == ["aborted"]
    assert [r["outcome"] for r in log if r["type"] == "tool_finished"] == ["aborted"]


async def test_bash_that_exits_on_sigterm_ends_the_close_early(tmp_path: Path) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    work = Path(workdir(tmp_path))
    provider = script(tmp_path, [bash_call(f"echo up > {work / 'up'}; sleep 60"), {"text": "no"}])
    grace = 6.0
    async with SessionManager(spec, HostOptions(provider=provider, close_grace=grace)) as m:
        rec = await m.create(str(work))
        await m.send(rec.id, "go")
        await wait_file(work / "up")
        started = time.monotonic()
        await m.close(rec.id)
        took = time.monotonic() - started
    assert took < grace - 2.0, f"close took {took:.2f} s"
    log = records(spec, rec.id)
    assert [r["outcome"] for r in log if r["type"] == "run_finished"] == ["aborted"]


class _StubbornArgs(BaseModel):
    seconds: float


class StubbornTool(Tool):
    """Blocks a worker thread that cancellation cannot stop, then answers."""

    name: ClassVar[str] = "stubborn"
    description: ClassVar[str] = "sleep in a thread"
    Args: ClassVar[type[BaseModel]] = _StubbornArgs
    started: ClassVar[anyio.Event | None] = None

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    async def execute(self, args: Any, ctx: ToolContext) -> ToolResult:
        self.marker.write_text("started")
        await anyio.to_thread.run_sync(time.sleep, args.seconds)  # not cancellable
        self.marker.write_text("answered")
        return ToolResult.text("LATE RESULT")


@pytest.mark.slow
async def test_a_tool_ignoring_cancellation_neither_holds_close_nor_is_recorded(
    tmp_path: Path,
) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    work = Path(workdir(tmp_path))
    marker = work / "marker"
    call = {"text": "", "tool_calls": [{"name": "stubborn", "arguments": {"seconds": 6}}]}
    provider = script(tmp_path, [call, {"text": "never"}])

    def tools(runtime: CommandRuntime) -> Mapping[str, Tool]:
        return {**default_tools(runtime), "stubborn": StubbornTool(marker)}

    grace = 1.0
    options = HostOptions(provider=provider, close_grace=grace, tools=tools)
    async with SessionManager(spec, options) as m:
        rec = await m.create(str(work))
        await m.send(rec.id, "go")
        await state_is(m, rec.id, "running")
        await wait_file(marker)
        started = time.monotonic()
        closed = await m.close(rec.id)
        took = time.monotonic() - started
        assert closed.state == "closed"
        assert took <= grace + 2.0, f"close took {took:.2f} s"
        assert (await m.get(rec.id)).state == "closed"
        deadline = time.monotonic() + 20
        while marker.read_text() != "answered":  # the late answer comes; nothing records it
            assert time.monotonic() < deadline
            await anyio.sleep(0.05)
    log = records(spec, rec.id)
    assert [r["type"] for r in log if r["type"].startswith("tool_")] == ["tool_started"]
    assert not any(r["type"] == "run_finished" for r in log)
    assert log[-1]["type"] == "session_lifecycle" and log[-1]["state"] == "closed"
    assert "LATE RESULT" not in store_text(spec)
    # recovery sees the call in doubt, as after a crash
    recovered = forkserver.run_cli(
        ["recover", "--store", spec, "--json", rec.id],
        env=dict(os.environ),
        cwd=os.getcwd(),
        timeout=60,
    )
    recovered.check_returncode()
    out = recovered.stdout
    plan = json.loads(out)
    calls = plan["lanes"][0]["tool_calls"]
    assert [c["status"] for c in calls] == ["in_doubt"], plan


def store_text(spec: str) -> str:
    """Every file of the JSONL store, as one string."""
    root = Path(spec.split(":", 1)[1])
    return "".join(p.read_text() for p in root.rglob("*") if p.is_file())


@pytest.mark.slow
async def test_close_of_a_pty_session_sends_sigint_then_sigterm_then_sigkill(
    tmp_path: Path,
) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    work = Path(workdir(tmp_path))
    log = work / "signals"
    command = (
        f"echo $$ > {work / 'pid'}; trap 'echo INT >> {log}' INT; "
        f"trap 'echo TERM >> {log}' TERM; while :; do sleep 0.05; done"
    )
    provider = script(tmp_path, [bash_call(command), {"text": "never"}])
    async with SessionManager(spec, HostOptions(provider=provider, close_grace=2.0)) as m:
        rec = await m.create(str(work), command_runtime="pty")
        await m.send(rec.id, "go")
        await wait_file(work / "pid")
        await m.close(rec.id)
        assert not group_alive(int((work / "pid").read_text()))
    assert log.read_text() == "INT\nTERM\n"
