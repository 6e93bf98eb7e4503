"""The built-in ``bash`` tool: one command line, its own process group, nothing outlives it.

``bash`` runs each command in its own process group and never lets any process of that
group outlive the call: on normal exit stragglers get SIGTERM then SIGKILL, on timeout the
whole group gets SIGTERM, a short grace, then SIGKILL, and on cancellation (abort) the group
gets SIGKILL before the cancellation propagates. A process that leaves the group on purpose
(``setsid``, ``nohup setsid ...``) is not tracked. Whether the group is still alive is decided
by :func:`~durable_harness.tools.processes.group_alive` (zombies do not count); the
environment the command sees by :func:`~durable_harness.tools.env.tool_environment`.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable
from typing import Any, ClassVar

import anyio
import anyio.abc
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field

from durable_harness.tools.base import OUTPUT_CAP_BYTES, Replay, Tool, ToolContext, ToolResult
from durable_harness.tools.env import tool_environment
from durable_harness.tools.processes import group_alive, signal_group

__all__ = ["BashArgs", "BashTool"]

_TERM_GRACE_SECONDS = 1.0
"""Seconds a process group gets between SIGTERM and SIGKILL."""

_DRAIN_GRACE_SECONDS = 1.0
"""Seconds to wait for the output pipe to close once the group is gone (a process outside
the group may still hold it)."""

_REAP_LIMIT_SECONDS = 5.0
"""Upper bound, in seconds, on waiting for a SIGKILLed shell to be reaped during cleanup."""


class BashArgs(BaseModel):
    """Arguments of ``bash``."""

    model_config = ConfigDict(extra="forbid")

    command: str = Field(
        description="Bash command line, run with `bash -c` in the working "
        "directory. stdout and stderr are combined."
    )
    timeout: float | None = Field(
        default=None,
        gt=0,
        description="Seconds before the command and every process "
        "it started are killed; defaults to 120.",
    )


class _Tail:
    """The last ``cap`` bytes of a byte stream, plus the total byte count."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.total = 0
        self.buffer = bytearray()

    def add(self, chunk: bytes) -> None:
        """Append ``chunk``, dropping the oldest bytes beyond ``cap``."""
        self.total += len(chunk)
        self.buffer += chunk
        if len(self.buffer) > self.cap:
            del self.buffer[: len(self.buffer) - self.cap]

    def text(self) -> str:
        """Decode the kept bytes as UTF-8 (replacing bad bytes), with a note if cut."""
        data = bytes(self.buffer)
        if self.total <= len(data):
            return data.decode("utf-8", errors="replace")
        start = 0
        while start < min(len(data), 3) and (data[start] & 0xC0) == 0x80:
            start += 1  # do not begin inside a multi-byte character
        return (
            f"[output truncated: showing the last {len(data) - start} of {self.total} "
            f"bytes]\n" + data[start:].decode("utf-8", errors="replace")
        )


async def _stop_group(process: anyio.abc.Process, pgid: int, grace: float) -> None:
    """Stop process group ``pgid`` led by ``process``: SIGTERM, up to ``grace`` seconds for
    its members to exit (reaping ``process`` meanwhile), then SIGKILL."""
    if not signal_group(pgid, signal.SIGTERM):
        return
    deadline = anyio.current_time() + grace
    while anyio.current_time() < deadline:
        if process.returncode is None:
            with anyio.move_on_after(0.02):
                await process.wait()
        else:
            await anyio.sleep(0.02)
        if not await anyio.to_thread.run_sync(group_alive, pgid):
            return
    signal_group(pgid, signal.SIGKILL)


async def _pump(stream: anyio.abc.ByteReceiveStream, tail: _Tail, done: anyio.Event) -> None:
    """Read ``stream`` to end of file into ``tail``, then set ``done``."""
    try:
        async for chunk in stream:
            tail.add(chunk)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        pass
    finally:
        done.set()


class BashTool(Tool):
    """``bash``: run a command line with ``bash -c`` in the working directory.

    Args model: :class:`BashArgs` (``command``, ``timeout`` seconds, default 120).

    Args:
        allow_env: names or shell-style patterns of variables that look like credentials but
            may still reach the command (default none; see :func:`tool_environment`).

    The command runs in a new session and process group, with stdin from ``/dev/null`` and
    the environment ``os.environ`` without credentials (:func:`tool_environment`: ``*_KEY``,
    ``*_TOKEN``, ``*_SECRET``, ``*PASSWORD*`` are removed unless allowed) + ``ctx.env`` (given
    explicitly, kept whole) + ``DURABLE_HARNESS_IDEMPOTENCY_KEY``, ``DURABLE_HARNESS_RUN_ID``
    and ``DURABLE_HARNESS_TOOL_CALL_ID``. stdout and stderr are
    combined; the result keeps the last :data:`OUTPUT_CAP_BYTES` bytes. A non-zero exit
    appends ``"exit code N"`` and sets ``is_error`` (N is negative when a signal killed the
    shell). ``details``: ``{"exit_code", "timed_out", "output_bytes", "truncated"}``.

    Process lifetime: when the shell exits, processes still in its group are stopped
    (SIGTERM, grace, SIGKILL). On timeout the group is stopped the same way and the result
    is an error saying so, with the output captured until then. On cancellation the group
    gets SIGKILL and the shell is reaped (shielded) before the cancellation propagates.

    Error results: timeout, non-zero exit, ``bash`` or the working directory missing.
    """

    name: ClassVar[str] = "bash"
    description: ClassVar[str] = (
        "Run a bash command in the working directory and return its combined stdout and "
        "stderr (the last 256 KiB) and exit code. Commands are killed, with every process "
        "they started, after timeout seconds (default 120). Background processes do not "
        "outlive the command."
    )
    Args: ClassVar[type[BaseModel]] = BashArgs
    replay: ClassVar[Replay] = "never"

    default_timeout: ClassVar[float] = 120.0
    """Seconds allowed when ``args.timeout`` is not given."""

    def __init__(self, *, allow_env: Iterable[str] = ()) -> None:
        self.allow_env: tuple[str, ...] = tuple(allow_env)

    async def execute(self, args: Any, ctx: ToolContext) -> ToolResult:
        """Run ``args.command`` (see the class docstring).

        Raises:
            The backend's cancellation exception, re-raised after the process group has been
            killed, when the surrounding cancel scope is cancelled.
        """
        assert isinstance(args, BashArgs)
        timeout = args.timeout if args.timeout is not None else self.default_timeout
        env = {
            **tool_environment(os.environ, self.allow_env),
            **ctx.env,
            "DURABLE_HARNESS_IDEMPOTENCY_KEY": ctx.idempotency_key,
            "DURABLE_HARNESS_RUN_ID": ctx.run_id,
            "DURABLE_HARNESS_TOOL_CALL_ID": ctx.tool_call_id,
        }
        try:
            # Shielded: a cancel landing mid-spawn would make asyncio kill the shell alone and
            # leave its children running; unshielded, it lands below, where the group is killed.
            with anyio.CancelScope(shield=True):
                process = await anyio.open_process(
                    ["bash", "-c", args.command],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    cwd=ctx.cwd,
                    env=env,
                    start_new_session=True,
                )
        except OSError as exc:
            return ToolResult.text(
                f"cannot start bash in {ctx.cwd}: {exc.strerror or exc}",
                is_error=True,
                details={"error": "spawn_failed"},
            )
        pgid = process.pid  # start_new_session: the shell leads its own group
        if ctx.on_process is not None:
            ctx.on_process(pgid)
        tail = _Tail(OUTPUT_CAP_BYTES)
        finished = False
        try:
            timed_out = await self._run(process, pgid, tail, timeout)
            finished = True
        finally:
            if not finished:
                # Cancelled (abort) or failed: kill everything now, reap the shell, and let
                # the exception propagate.
                with anyio.CancelScope(shield=True):
                    signal_group(pgid, signal.SIGKILL)
                    with anyio.move_on_after(_REAP_LIMIT_SECONDS):
                        await process.wait()
                    await self._close(process)
        await self._close(process)
        return self._result(process.returncode, timed_out, timeout, tail)

    @staticmethod
    async def _run(process: anyio.abc.Process, pgid: int, tail: _Tail, timeout: float) -> bool:
        """Wait for the shell and its output; return True when ``timeout`` (seconds) hit."""
        assert process.stdout is not None
        stdout = process.stdout
        eof = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_pump, stdout, tail, eof)
            with anyio.move_on_after(timeout) as deadline:
                await process.wait()
            # Either the shell exited (stop its leftovers) or time ran out (stop it all).
            await _stop_group(process, pgid, _TERM_GRACE_SECONDS)
            with anyio.move_on_after(_REAP_LIMIT_SECONDS):
                await process.wait()
            # The pipe closes once no process holds it; one that left the group might.
            with anyio.move_on_after(_DRAIN_GRACE_SECONDS):
                await eof.wait()
            tg.cancel_scope.cancel()
        return deadline.cancelled_caught

    @staticmethod
    async def _close(process: anyio.abc.Process) -> None:
        """Release the shell's pipe (shielded); never waits on a shell that is still running."""
        with anyio.CancelScope(shield=True):
            if process.returncode is not None:
                await process.aclose()  # closes streams and transports; the shell is reaped
            elif process.stdout is not None:
                await process.stdout.aclose()

    @staticmethod
    def _result(returncode: int | None, timed_out: bool, timeout: float, tail: _Tail) -> ToolResult:
        """Build the result from the exit status, the timeout flag and the output."""
        output = tail.text()
        details: dict[str, Any] = {
            "exit_code": returncode,
            "timed_out": timed_out,
            "output_bytes": tail.total,
            "truncated": tail.total > len(tail.buffer),
        }
        if timed_out:
            note = f"command timed out after {timeout:g} seconds; its process group was killed"
            text = f"{output.rstrip(chr(10))}\n{note}" if output else note
            return ToolResult.text(text, is_error=True, details=details)
        if returncode == 0:
            return ToolResult.text(output or "(no output)", details=details)
        status = f"exit code {returncode}"
        if returncode is not None and returncode < 0:
            try:
                status += f" (killed by {signal.Signals(-returncode).name})"
            except ValueError:
                pass
        text = f"{output.rstrip(chr(10))}\n{status}" if output else status
        return ToolResult.text(text, is_error=True, details=details)
