"""The ``pty`` command runtime of ``bash`` (issue 12): the command's stdin, stdout and stderr
are a pseudo-terminal; the process group, timeouts, cleanup, output cap and the
``tool_process`` record are those of the ``pipe`` runtime (design/providers-and-tools.md)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest

from durable_harness.harness.harness import Harness
from durable_harness.providers.scripted import ScriptedProvider
from durable_harness.session.session import Session
from durable_harness.storage import open_store
from durable_harness.tools.base import ToolContext
from durable_harness.tools.builtin import OUTPUT_CAP_BYTES, BashTool, builtin_tools

from .test_builtin import PROMPTLY, call, group_gone, pid_gone, text_of, wait_until

pytestmark = pytest.mark.anyio

PTY = BashTool(runtime="pty")


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    work = tmp_path / "work"
    work.mkdir()
    return ToolContext(cwd=work, run_id="run-1", tool_call_id="call-1", idempotency_key="k")


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def test_the_command_sees_a_terminal(ctx: ToolContext) -> None:
    probe = "test -t 0 && test -t 1 && test -t 2 && echo tty"
    result = await call(PTY, ctx, command=probe)
    assert text_of(result) == "tty\n" and not result.is_error
    assert result.details is not None and result.details["runtime"] == "pty"
    piped = await call(BashTool(), ctx, command=probe)
    assert piped.is_error and piped.details is not None and piped.details["runtime"] == "pipe"


async def test_output_exit_code_and_newlines_as_in_the_pipe_runtime(ctx: ToolContext) -> None:
    command = "echo out; echo err >&2; printf 'a\\tb\\n'; exit 3"
    result = await call(PTY, ctx, command=command)
    assert text_of(result) == "out\nerr\na\tb\nexit code 3"  # no \r\n, no echo
    assert result.is_error and result.details is not None
    assert result.details["exit_code"] == 3 and result.details["output_bytes"] == 12
    assert text_of(await call(BashTool(), ctx, command=command)) == text_of(result)


@pytest.mark.slow
async def test_a_command_reading_its_terminal_gets_end_of_input(ctx: ToolContext) -> None:
    """One end of input is queued: the first read sees it (instead of waiting for the
    timeout); a second read waits, as on a terminal nobody types to."""
    with anyio.fail_after(PROMPTLY):
        result = await call(PTY, ctx, command="read line; echo read=$?", timeout=300)
    assert text_of(result) == "read=1\n"
    with anyio.fail_after(PROMPTLY):
        result = await call(PTY, ctx, command="cat; echo after; cat", timeout=1)
    assert result.details is not None and result.details["timed_out"] is True
    assert text_of(result).startswith("after\n")


async def test_window_size_and_controlling_terminal(ctx: ToolContext) -> None:
    result = await call(PTY, ctx, command="stty size; echo via-tty > /dev/tty")
    assert text_of(result) == "24 80\nvia-tty\n"  # the default: a classic 24x80 terminal
    sized = BashTool(runtime="pty", pty_size=(50, 132))
    assert text_of(await call(sized, ctx, command="stty size")) == "50 132\n"
    with pytest.raises(ValueError):
        BashTool(runtime="pty", pty_size=(0, 80))


async def appears(path: Path) -> None:
    with anyio.fail_after(PROMPTLY):
        while not path.exists():
            await anyio.sleep(0.01)


async def test_a_resize_reaches_the_running_command_as_sigwinch(
    ctx: ToolContext, tmp_path: Path
) -> None:
    tool = BashTool(runtime="pty")
    ready = tmp_path / "ready"
    command = (
        f"trap 'stty size > {tmp_path / 'winch'}; exit 0' WINCH; touch {ready}; "
        "while :; do sleep 0.05; done"
    )
    async with anyio.create_task_group() as tg:
        results: list[Any] = []

        async def run() -> None:
            results.append(await call(tool, ctx, command=command, timeout=30))

        tg.start_soon(run)
        await appears(ready)
        tool.resize(30, 100)
    assert results and results[0].is_error is False
    assert (tmp_path / "winch").read_text() == "30 100\n"
    assert text_of(await call(tool, ctx, command="stty size")) == "30 100\n"


@pytest.mark.slow
@pytest.mark.parametrize("host_ignores_sigint", [False, True], ids=["default", "ignored"])
async def test_cancellation_sends_sigint_first_then_sigterm(
    ctx: ToolContext, tmp_path: Path, host_ignores_sigint: bool
) -> None:
    """As a terminal's ^C would: the foreground group gets SIGINT; a command that traps it
    and goes on gets SIGTERM next, then SIGKILL. Also under a host that ignores SIGINT (a
    background job's lot, ``nohup ... &``): the command starts with SIGINT at its default,
    so its trap still works (bash cannot trap a signal ignored when it started)."""
    ready = tmp_path / "ready"
    log = tmp_path / "signals"
    command = (
        f"trap 'echo INT >> {log}' INT; trap 'echo TERM >> {log}' TERM; touch {ready}; "
        "while :; do sleep 0.05; done"
    )
    before = signal.getsignal(signal.SIGINT)
    if host_ignores_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with anyio.fail_after(PROMPTLY):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: call(PTY, ctx, command=command, timeout=300))
                await appears(ready)
                tg.cancel_scope.cancel()
    finally:
        if host_ignores_sigint:
            signal.signal(signal.SIGINT, before)
    assert log.read_text() == "INT\nTERM\n"


async def test_output_keeps_the_tail(ctx: ToolContext) -> None:
    result = await call(PTY, ctx, command="head -c 400000 /dev/zero | tr '\\0' a; echo END")
    text = text_of(result)
    assert text.endswith("aEND\n") and "truncated" in text
    assert len(text.encode()) <= OUTPUT_CAP_BYTES + 200
    assert result.details is not None and result.details["output_bytes"] == 400004


@pytest.mark.slow
async def test_timeout_kills_the_group(ctx: ToolContext) -> None:
    command = "trap '' TERM HUP; sleep 300 & echo $! > pid; echo started; wait"
    with anyio.fail_after(PROMPTLY):
        result = await call(PTY, ctx, command=command, timeout=1)
    assert result.is_error and "timed out" in text_of(result) and "started" in text_of(result)
    assert result.details is not None and result.details["timed_out"] is True
    pid = int((ctx.cwd / "pid").read_text())
    assert wait_until(lambda: pid_gone(pid)), f"background child {pid} survived"


async def test_leftover_background_process_is_stopped(ctx: ToolContext) -> None:
    command = "(trap '' HUP; exec sleep 300) & echo $! > pid; echo done"
    with anyio.fail_after(PROMPTLY):
        result = await call(PTY, ctx, command=command)
    assert text_of(result) == "done\n"
    pid = int((ctx.cwd / "pid").read_text())
    assert wait_until(lambda: pid_gone(pid))


async def test_cancellation_kills_the_group(ctx: ToolContext) -> None:
    with anyio.fail_after(PROMPTLY), anyio.move_on_after(0.5) as scope:
        await call(PTY, ctx, command="echo $$ > pgid; sleep 300 & echo $! > pid; wait")
    assert scope.cancelled_caught
    pgid, pid = int((ctx.cwd / "pgid").read_text()), int((ctx.cwd / "pid").read_text())
    assert wait_until(lambda: group_gone(pgid) and pid_gone(pid))


@pytest.mark.slow
async def test_a_terminal_held_outside_the_group_does_not_hang(ctx: ToolContext) -> None:
    command = "setsid sh -c 'echo $$ > pid; exec sleep 300' & sleep 0.2; echo hi"
    try:
        with anyio.fail_after(PROMPTLY):
            result = await call(PTY, ctx, command=command)
        assert text_of(result) == "hi\n"
    finally:
        pid_file = ctx.cwd / "pid"  # the detached shell may write it after the tool returned
        assert wait_until(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
        pid = int(pid_file.read_text())
        if not pid_gone(pid):
            os.kill(pid, signal.SIGKILL)


async def test_no_descriptor_leaks_even_when_the_spawn_fails(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    ok = ToolContext(cwd=work, run_id="r", tool_call_id="c", idempotency_key="k")
    gone = ToolContext(cwd=tmp_path / "missing", run_id="r", tool_call_id="c", idempotency_key="k")
    await call(PTY, ok, command="true")  # the event loop's own descriptors exist from here on
    before = open_fds()
    for _ in range(3):
        assert not (await call(PTY, ok, command="echo hi")).is_error
        failed = await call(PTY, gone, command="echo hi")
        assert failed.is_error and failed.details == {"error": "spawn_failed", "runtime": "pty"}
    with anyio.move_on_after(0.3):
        await call(PTY, ok, command="sleep 300")
    assert open_fds() == before


def test_the_runtime_is_a_checked_choice() -> None:
    assert builtin_tools(runtime="pty")["bash"].runtime == "pty"  # type: ignore[attr-defined]
    assert builtin_tools()["bash"].runtime == "pipe"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"bash runtime must be one of \('pipe', 'pty'\)"):
        builtin_tools(runtime="tty")  # type: ignore[arg-type]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_in_the_harness_the_group_is_recorded(tmp_path: Path, anyio_backend: str) -> None:
    """A run's pty ``bash`` call writes the same ``tool_process`` record as the pipe runtime
    (pgid and start time, before the output is read), and its result entry says
    which runtime ran."""
    store = open_store(f"jsonl:{tmp_path / 'home'}")
    session = Session(store.create_session(str(tmp_path)))
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": "test -t 1 && echo $$"}}]},
        {"text": "ok"},
    ]
    async with Harness(
        session, ScriptedProvider(turns), builtin_tools(runtime="pty"), cwd=tmp_path
    ) as h:
        assert await (await h.prompt("go")).wait() == "completed"
    (proc,) = session.store.records(types=("tool_process",))
    result = [e for e in session.path(session.leaf("main")) if e["type"] == "message"][-2]
    assert result["message"]["content"][0]["text"] == f"{proc['pgid']}\n"
    assert result["message"]["details"]["runtime"] == "pty"
    assert "startTime" in proc  # null when the command was reaped before it could be read
