"""The built-in ``bash`` tool: one command line, its own process group, nothing outlives it
(:class:`BashTool` says how each way out stops the group). Whether the group is still alive
is decided by :func:`~durable_harness.tools.processes.group_alive` (zombies do not count); the
environment the command sees by :func:`~durable_harness.tools.env.tool_environment`. Two
command runtimes (:data:`Runtime`): ``pipe`` and ``pty``; everything else is the same.

**The start gate.** The shell is spawned behind a gate (:func:`_gate`): it waits on a pipe
before it runs the command, and the harness opens the gate only once the ``tool_process``
record naming the new process group has been committed (``ToolContext.on_process``). If the
harness dies in between (crash point ``after_tool_spawned``), the pipe's write end closes with
it, the gate reads end of file and exits with status 125 without running anything, so no
command ever runs that recovery cannot find by its recorded group (``design/recovery.md``).
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import subprocess
import termios
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, ClassVar

import anyio
import anyio.abc
import anyio.to_thread
from pydantic import Field

from durable_harness import crash
from durable_harness.models.records import COMMAND_RUNTIMES as RUNTIMES
from durable_harness.models.records import CommandRuntime as Runtime
from durable_harness.tools.base import (
    OUTPUT_CAP_BYTES,
    StrictArgs,
    Tool,
    ToolContext,
    ToolResult,
)
from durable_harness.tools.env import tool_environment
from durable_harness.tools.processes import group_alive, signal_group


def _gate(fd: int) -> str:
    """The start gate's script, run as ``bash -c SCRIPT bash COMMAND`` with the gate pipe's
    read end as ``fd``: wait for a line (exit 125 at end of file), then ``exec bash -c --
    COMMAND`` in the same process and group, ``fd`` closed (so it is a plain ``bash -c``;
    ``--``: a command beginning with ``-`` is a command, not an option of bash's)."""
    return f'read -r -u {fd} _ || exit 125; exec bash -c -- "$1" {fd}<&-'


def _default_signals() -> list[str]:
    """The prefix that starts the command with SIGINT and SIGQUIT at their default action
    when this process ignores them: an ignored signal stays ignored across ``exec``, and bash
    cannot trap a signal ignored when it started (POSIX, "trap"), so under a host started as
    a background job (``nohup ... &``) a command's ``trap ... INT`` was silently void and the
    ^C stage of a cancellation (:func:`_stop_cancelled`) reached nothing. The prefix is GNU
    ``env --default-signal`` (coreutils 8.31+), checked once; without it, nothing changes."""
    names = [
        name
        for sig, name in ((signal.SIGINT, "INT"), (signal.SIGQUIT, "QUIT"))
        if signal.getsignal(sig) == signal.SIG_IGN
    ]
    if not names or not _env_resets_signals():
        return []
    return ["env", f"--default-signal={','.join(names)}"]


@functools.cache
def _env_resets_signals() -> bool:
    try:
        probe = subprocess.run(
            ["env", "--default-signal=INT", "true"], capture_output=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


PTY_SIZE = (24, 80)
"""The default window size of the ``pty`` runtime's terminal: (rows, columns), a terminal's
classic 24x80."""

_READ_CHUNK = 65536

_TERM_GRACE_SECONDS = 1.0
"""Seconds a process group gets between SIGTERM and SIGKILL."""

_DRAIN_GRACE_SECONDS = 1.0
"""Seconds to wait for the output pipe to close once the group is gone (a process outside
the group may still hold it)."""

_REAP_LIMIT_SECONDS = 5.0
"""Upper bound, in seconds, on waiting for a SIGKILLed shell to be reaped during cleanup."""


def _checked_size(size: tuple[int, int]) -> tuple[int, int]:
    rows, columns = size
    if not all(type(n) is int and 0 < n < 65536 for n in (rows, columns)):
        raise ValueError(f"a terminal size is two positive integers, not {size!r}")
    return rows, columns


def command_env(ctx: ToolContext) -> dict[str, str]:
    """What a command sees beyond its inherited environment, wherever it runs (here, or in an
    ACP client's terminal): ``ctx.env``, then ``DURABLE_HARNESS_IDEMPOTENCY_KEY``,
    ``DURABLE_HARNESS_RUN_ID`` and ``DURABLE_HARNESS_TOOL_CALL_ID``."""
    return {
        **ctx.env,
        "DURABLE_HARNESS_IDEMPOTENCY_KEY": ctx.idempotency_key,
        "DURABLE_HARNESS_RUN_ID": ctx.run_id,
        "DURABLE_HARNESS_TOOL_CALL_ID": ctx.tool_call_id,
    }


def command_result(
    output: str,
    details: dict[str, Any],
    *,
    exit_code: int | None,
    timed_out: bool,
    timeout: float,
    signal_name: str | None = None,
    killed: str = "its process group",
) -> ToolResult:
    """A command's result, wherever it ran: the output (``"(no output)"`` when empty) on exit
    0; else an error result, the output then ``command timed out after N seconds; KILLED was
    killed`` or ``exit code N`` (``(killed by SIGNAME)`` when a signal ended it: a negative
    ``exit_code`` or ``signal_name``; ``killed by SIGNAME`` alone without an exit code)."""
    if exit_code == 0 and not timed_out:
        return ToolResult.text(output or "(no output)", details=details)
    if timed_out:
        note = f"command timed out after {timeout:g} seconds; {killed} was killed"
    else:
        if signal_name is None and exit_code is not None and exit_code < 0:
            try:
                signal_name = signal.Signals(-exit_code).name
            except ValueError:
                pass
        note = "" if exit_code is None and signal_name else f"exit code {exit_code}"
        if signal_name:
            note = f"{note} (killed by {signal_name})" if note else f"killed by {signal_name}"
    text = f"{output.rstrip(chr(10))}\n{note}" if output else note
    return ToolResult.text(text, is_error=True, details=details)


class BashArgs(StrictArgs):
    """Arguments of ``bash``."""

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


async def _stop_cancelled(
    process: anyio.abc.Process, pgid: int, grace: float, master: int | None
) -> None:
    """Stop a cancelled command in stages, as a terminal and then an init would: with a
    pseudo-terminal (``master``), SIGINT to the terminal's foreground process group first
    (up to ``min(0.5, grace / 2)`` seconds to exit); then SIGTERM to the whole group; SIGKILL
    when ``grace`` seconds (from the cancellation) have passed. Returns once the group is
    gone (zombies do not count) or killed."""
    deadline = anyio.current_time() + grace
    if master is not None:
        try:
            fg = os.tcgetpgrp(master)
        except OSError:
            fg = pgid
        if fg > 1 and signal_group(fg, signal.SIGINT):
            with anyio.move_on_after(min(0.5, grace / 2)):
                while await anyio.to_thread.run_sync(group_alive, pgid):
                    await anyio.sleep(0.02)
    await _stop_group(process, pgid, max(0.0, deadline - anyio.current_time()))


async def _pump(stream: anyio.abc.ByteReceiveStream, tail: _Tail, done: anyio.Event) -> None:
    """Read ``stream`` to end of file into ``tail``, then set ``done``."""
    try:
        async for chunk in stream:
            tail.add(chunk)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        pass
    finally:
        done.set()


async def _pump_pty(master: int, tail: _Tail, done: anyio.Event) -> None:
    """Read the pseudo-terminal ``master`` (non-blocking) into ``tail`` until every slave end
    is closed (Linux reports that as ``EIO``, after the buffered output), then set ``done``."""
    try:
        while True:
            await anyio.wait_readable(master)
            try:
                chunk = os.read(master, _READ_CHUNK)
            except BlockingIOError:
                continue
            except OSError as exc:
                if exc.errno == errno.EIO:
                    return
                raise
            if not chunk:
                return
            tail.add(chunk)
    finally:
        done.set()


def _open_pty(size: tuple[int, int] = PTY_SIZE) -> tuple[int, int]:
    """A pseudo-terminal for one command: ``(master, slave)`` file descriptors, the master
    non-blocking; the slave set up for a program nobody types to: no echo, output bytes as
    written (no ``\n`` to ``\r\n``), window ``size`` (rows, columns), and one end-of-file
    queued as input (a command reading its terminal ends at once, as from ``/dev/null``).

    Raises:
        OSError: no pseudo-terminal could be opened.
    """
    master, slave = os.openpty()
    try:
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.ONLCR  # oflag
        attrs[3] &= ~(termios.ECHO | termios.ECHONL)  # lflag
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        termios.tcsetwinsize(slave, size)
        os.write(master, attrs[6][termios.VEOF])  # cc[VEOF]: end of input, once
        os.set_blocking(master, False)
    except BaseException:
        os.close(master)
        os.close(slave)
        raise
    return master, slave


class BashTool(Tool):
    """``bash``: run a command line with ``bash -c`` in the working directory.

    Args model: :class:`BashArgs` (``command``, ``timeout`` seconds, default 120).

    Args:
        allow_env: names or shell-style patterns of variables that look like credentials but
            may still reach the command (default none; see :func:`tool_environment`).
        runtime: ``"pipe"`` (default) or ``"pty"`` (:data:`Runtime`).
        pty_size: the pty runtime's window size, ``(rows, columns)`` (default 24x80,
            :data:`PTY_SIZE`); :meth:`resize` changes it, also for running commands.

    Raises:
        ValueError: ``runtime`` is not one of :data:`RUNTIMES`, or a size is not positive.

    The command runs in a new session and process group, with stdin from ``/dev/null`` (pipe
    runtime) or a pseudo-terminal as stdin, stdout and stderr (pty runtime, :func:`_open_pty`:
    ``isatty`` is true, and bash, leading the new session, takes it as its controlling
    terminal), and the environment ``os.environ`` without credentials
    (:func:`tool_environment`) + ``ctx.env`` (kept whole) + ``DURABLE_HARNESS_IDEMPOTENCY_KEY``,
    ``DURABLE_HARNESS_RUN_ID`` and ``DURABLE_HARNESS_TOOL_CALL_ID``. stdout and stderr are
    combined; the result keeps the last :data:`OUTPUT_CAP_BYTES` bytes. A non-zero exit appends
    ``"exit code N"`` and sets ``is_error`` (N is negative when a signal killed the shell).
    ``details``: ``{"exit_code", "timed_out", "output_bytes", "truncated", "runtime"}``.

    Process lifetime: when the shell exits, processes still in its group are stopped
    (SIGTERM, grace, SIGKILL); on timeout the whole group is, and the result is an error saying
    so, with the output captured until then. On cancellation (abort, close) the stop is staged
    (:func:`_stop_cancelled`) over ``ctx.grace()`` seconds (1 s for an abort, the host's
    ``close_grace`` for a close) and the shell is reaped (shielded) before the cancellation
    propagates. A process that leaves the group on purpose (``setsid``) is not tracked.

    Error results: timeout, non-zero exit, ``bash`` or the working directory missing.
    """

    name = "bash"
    description = (
        "Run a bash command in the working directory and return its combined stdout and "
        "stderr (the last 256 KiB) and exit code. Commands are killed, with every process "
        "they started, after timeout seconds (default 120). Background processes do not "
        "outlive the command."
    )
    Args = BashArgs

    default_timeout: ClassVar[float] = 120.0
    """Seconds allowed when ``args.timeout`` is not given."""

    def __init__(
        self,
        *,
        allow_env: Iterable[str] = (),
        runtime: Runtime = "pipe",
        pty_size: tuple[int, int] = PTY_SIZE,
    ) -> None:
        if runtime not in RUNTIMES:
            raise ValueError(f"bash runtime must be one of {RUNTIMES}, got {runtime!r}")
        self.allow_env: tuple[str, ...] = tuple(allow_env)
        self.runtime: Runtime = runtime
        self.pty_size = _checked_size(pty_size)
        self._masters: set[int] = set()  # the terminals of the commands running now

    def resize(self, rows: int, columns: int) -> None:
        """Set the pty runtime's window size to ``rows`` x ``columns`` for the commands
        running now (the kernel sends their terminal's foreground group SIGWINCH, as a
        terminal emulator's resize does) and for those started later. A no-op for running
        commands in the pipe runtime.

        Raises:
            ValueError: a size is not a positive integer.
        """
        self.pty_size = _checked_size((rows, columns))
        for master in list(self._masters):
            try:
                termios.tcsetwinsize(master, self.pty_size)
            except OSError:
                pass  # the command has just ended

    async def execute(self, args: Any, ctx: ToolContext) -> ToolResult:
        """Run ``args.command`` (see the class docstring).

        Raises:
            The backend's cancellation exception, re-raised after the process group has been
            killed, when the surrounding cancel scope is cancelled.
        """
        assert isinstance(args, BashArgs)
        timeout = args.timeout if args.timeout is not None else self.default_timeout
        env = {**tool_environment(os.environ, self.allow_env), **command_env(ctx)}
        master: int | None = None
        gate, opener = os.pipe()  # both close-on-exec; only the read end is passed (pass_fds)
        try:
            # Shielded: a cancel landing mid-spawn would make asyncio kill the shell alone and
            # leave its children running; unshielded, it lands below, where the group is killed.
            with anyio.CancelScope(shield=True):
                if self.runtime == "pty":
                    master, slave = _open_pty(self.pty_size)
                    self._masters.add(master)
                    try:
                        process = await self._spawn(args.command, ctx, env, slave, slave, gate)
                    finally:
                        os.close(slave)  # the command holds it now; EOF once it lets go
                else:
                    process = await self._spawn(
                        args.command, ctx, env, subprocess.DEVNULL, subprocess.PIPE, gate
                    )
        except OSError as exc:
            os.close(opener)
            if master is not None:
                self._masters.discard(master)
                os.close(master)
            return ToolResult.text(
                f"cannot start bash in {ctx.cwd}: {exc.strerror or exc}",
                is_error=True,
                details={"error": "spawn_failed", "runtime": self.runtime},
            )
        finally:
            os.close(gate)
        pgid = process.pid  # start_new_session: the shell leads its own group
        tail = _Tail(OUTPUT_CAP_BYTES)
        if master is not None:
            pump = functools.partial(_pump_pty, master, tail)
        else:
            assert process.stdout is not None
            pump = functools.partial(_pump, process.stdout, tail)

        finished = False
        try:
            crash.crash_point("after_tool_spawned")
            if ctx.on_process is not None:
                ctx.on_process(pgid)  # committed before the gate opens
            os.write(opener, b"\n")
            os.close(opener)
            opener = -1
            timed_out = await self._run(process, pgid, pump, timeout)
            finished = True
        finally:
            if opener >= 0:
                os.close(opener)  # not opened: the gate exits without running the command
            if not finished:
                # Cancelled (abort, close) or failed: SIGTERM, a grace, SIGKILL; reap the
                # shell, and let the exception propagate.
                with anyio.CancelScope(shield=True):
                    await _stop_cancelled(process, pgid, ctx.grace(), master)
                    signal_group(pgid, signal.SIGKILL)  # a failure, or a straggler
                    with anyio.move_on_after(_REAP_LIMIT_SECONDS):
                        await process.wait()
                    await self._close(process)
            if master is not None:
                self._masters.discard(master)
                os.close(master)
        await self._close(process)
        return self._result(process.returncode, timed_out, timeout, tail, self.runtime)

    @staticmethod
    async def _spawn(
        command: str, ctx: ToolContext, env: dict[str, str], stdin: int, stdout: int, gate: int
    ) -> anyio.abc.Process:
        """Start ``bash -c command`` behind the start gate (:func:`_gate`, reading the pipe
        end ``gate``) in a new session (so a new process group it leads), stderr joined to
        stdout, SIGINT and SIGQUIT at their defaults (:func:`_default_signals`)."""
        return await anyio.open_process(
            [*_default_signals(), "bash", "-c", _gate(gate), "bash", command],
            pass_fds=(gate,),
            stdin=stdin,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            cwd=ctx.cwd,
            env=env,
            start_new_session=True,
        )

    @staticmethod
    async def _run(
        process: anyio.abc.Process,
        pgid: int,
        pump: Callable[[anyio.Event], Coroutine[Any, Any, None]],
        timeout: float,
    ) -> bool:
        """Wait for the shell and its output (``pump(done)`` reads it, then sets ``done``);
        return True when ``timeout`` (seconds) hit."""
        eof = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(pump, eof)
            with anyio.move_on_after(timeout) as deadline:
                await process.wait()
            # Either the shell exited (stop its leftovers) or time ran out (stop it all).
            await _stop_group(process, pgid, _TERM_GRACE_SECONDS)
            with anyio.move_on_after(_REAP_LIMIT_SECONDS):
                await process.wait()
            # The output closes once no process holds it; one that left the group might.
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
    def _result(
        returncode: int | None, timed_out: bool, timeout: float, tail: _Tail, runtime: Runtime
    ) -> ToolResult:
        """Build the result from the exit status, the timeout flag and the output."""
        details: dict[str, Any] = {
            "exit_code": returncode,
            "timed_out": timed_out,
            "output_bytes": tail.total,
            "truncated": tail.total > len(tail.buffer),
            "runtime": runtime,
        }
        return command_result(
            tail.text(), details, exit_code=returncode, timed_out=timed_out, timeout=timeout
        )
