"""Driving ``durable-harness acp`` as a child process with the SDK's client side."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from acp import PROTOCOL_VERSION
from acp.client.connection import ClientSideConnection
from acp.interfaces import Agent
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    CreateTerminalResponse,
    DeniedOutcome,
    EnvVariable,
    FileSystemCapabilities,
    PermissionOption,
    ReadTextFileResponse,
    RequestPermissionResponse,
    TerminalOutputResponse,
    ToolCallUpdate,
    WaitForTerminalExitResponse,
    WriteTextFileResponse,
)
from acp.stdio import spawn_agent_process

from durable_harness.crashtest import forkserver

Answer = Callable[[ToolCallUpdate, list[PermissionOption]], str | None]


def dump(model: Any) -> dict[str, Any]:
    """A schema model as the JSON the wire carries."""
    out: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    return out


class RecordingClient:
    """An ACP client that records every ``session/update`` and permission request, in order,
    answers permission requests with ``answer`` and, when ``fs`` is set, serves
    ``fs/read_text_file`` and ``fs/write_text_file`` from the local disk (recording them)."""

    def __init__(
        self, answer: Answer | None = None, *, fs: bool = False, terminal: bool = False
    ) -> None:
        self.answer: Answer = answer or (lambda _call, _options: "allow_once")
        self.fs = fs
        self.terminal = terminal
        self.trace: list[dict[str, Any]] = []
        self.terminals: dict[str, dict[str, Any]] = {}

    def updates(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The recorded update payloads (of one ``sessionUpdate`` kind)."""
        ups = [t["params"]["update"] for t in self.trace if t["method"] == "session/update"]
        return [u for u in ups if kind is None or u.get("sessionUpdate") == kind]

    def questions(self) -> list[dict[str, Any]]:
        """The recorded permission requests' params."""
        return [t["params"] for t in self.trace if t["method"] == "session/request_permission"]

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.trace.append(
            {
                "method": "session/update",
                "params": {"sessionId": session_id, "update": dump(update)},
            }
        )

    async def request_permission(
        self,
        session_id: str,
        tool_call: ToolCallUpdate,
        options: list[PermissionOption],
        **kwargs: Any,
    ) -> RequestPermissionResponse:
        self.trace.append(
            {
                "method": "session/request_permission",
                "params": {
                    "sessionId": session_id,
                    "toolCall": dump(tool_call),
                    "options": [dump(o) for o in options],
                },
            }
        )
        chosen = self.answer(tool_call, options)
        if chosen is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=chosen)
        )

    async def read_text_file(self, session_id: str, path: str, **kwargs: Any) -> Any:
        self.trace.append({"method": "fs/read_text_file", "params": {"path": path}})
        return ReadTextFileResponse(content=Path(path).read_text())

    async def write_text_file(
        self, session_id: str, path: str, content: str, **kwargs: Any
    ) -> WriteTextFileResponse:
        self.trace.append({"method": "fs/write_text_file", "params": {"path": path}})
        Path(path).write_text(content)
        return WriteTextFileResponse()

    async def create_terminal(
        self,
        session_id: str,
        command: str,
        args: list[str] | None = None,
        env: list[EnvVariable] | None = None,
        cwd: str | None = None,
        output_byte_limit: int | None = None,
        **kwargs: Any,
    ) -> CreateTerminalResponse:
        """A real process, as an editor's terminal would run it."""
        self.trace.append(
            {"method": "terminal/create", "params": {"command": command, "args": args, "cwd": cwd}}
        )
        extra = {v.name: v.value for v in env or []}
        proc = await asyncio.create_subprocess_exec(
            command,
            *(args or []),
            cwd=cwd,
            env={**os.environ, **extra},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        terminal_id = f"term-{len(self.terminals) + 1}"
        self.terminals[terminal_id] = {"proc": proc, "output": b"", "released": False}
        return CreateTerminalResponse(terminal_id=terminal_id)

    async def wait_for_terminal_exit(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> WaitForTerminalExitResponse:
        term = self.terminals[terminal_id]
        proc = term["proc"]
        assert proc.stdout is not None
        term["output"] = await proc.stdout.read()
        code = await proc.wait()
        return WaitForTerminalExitResponse(exit_code=code if code >= 0 else None)

    async def terminal_output(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> TerminalOutputResponse:
        term = self.terminals[terminal_id]
        return TerminalOutputResponse(output=term["output"].decode(), truncated=False)

    async def kill_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> None:
        self.trace.append({"method": "terminal/kill", "params": {"terminalId": terminal_id}})
        proc = self.terminals[terminal_id]["proc"]
        if proc.returncode is None:
            proc.kill()

    async def release_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> None:
        self.trace.append({"method": "terminal/release", "params": {"terminalId": terminal_id}})
        self.terminals[terminal_id]["released"] = True

    def on_connect(self, conn: Agent) -> None:
        pass


def script(tmp_path: Path, turns: list[dict[str, Any]], name: str = "script.json") -> str:
    """A scripted provider spec playing ``turns``."""
    path = tmp_path / name
    path.write_text(json.dumps({"turns": turns}))
    return f"scripted:{path}"


def workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir(parents=True, exist_ok=True)
    return work


ACP_PRELOAD = (
    "durable_harness.cli.host_commands",
    "durable_harness.acp",
    "durable_harness.acp.agent",
)
"""What the fork server imports before it forks an agent (the ACP SDK's models among them)."""


def forkable(env: dict[str, str]) -> bool:
    """True when an agent with environment ``env`` is forked from the warm fork server: it can
    run here, and no ``OTEL_*`` is set (a forked child leaves with ``os._exit``, which skips
    the OpenTelemetry SDK's flush at exit)."""
    return forkserver.available() and not any(k.startswith("OTEL_") for k in env)


def start_agent(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: str,
    stderr: str,
    stdout: int = subprocess.PIPE,
) -> subprocess.Popen[bytes] | forkserver.Spawned:
    """``durable-harness ARGV`` with its stdin a pipe, its stdout a pipe (or the descriptor
    ``stdout``) and its stderr the file ``stderr``: forked from the warm fork server where
    :func:`forkable` (a process of its own, without a fresh interpreter's second of imports,
    issue 22), else a fresh interpreter."""
    if forkable(env):
        return forkserver.shared().spawn(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=stdout,
            stderr=stderr,
            timeout=600,
            preload=ACP_PRELOAD,
        )
    with open(stderr, "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "durable_harness", *argv],
            stdin=subprocess.PIPE,
            stdout=stdout,
            stderr=err,
            cwd=cwd,
            env=env,
        )


class ForkedAgent:
    """A forked agent as :class:`asyncio.subprocess.Process` offers it: ``pid``, ``returncode``,
    ``stdin`` (a stream writer), ``stdout`` (a stream reader), :meth:`wait`, :meth:`kill`,
    :meth:`terminate`, :meth:`send_signal`."""

    def __init__(
        self, child: forkserver.Spawned, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.child = child
        self.pid = child.pid
        self.stdin = writer
        self.stdout = reader

    @property
    def returncode(self) -> int | None:
        return self.child.poll()

    async def wait(self) -> int:
        while (code := self.child.poll()) is None:
            await asyncio.sleep(0.01)
        return code

    def kill(self) -> None:
        self.child.kill()

    def terminate(self) -> None:
        self.child.terminate()

    def send_signal(self, sig: int) -> None:
        self.child.send_signal(sig)


@asynccontextmanager
async def _forked(
    client: RecordingClient, child: forkserver.Spawned
) -> AsyncIterator[tuple[ClientSideConnection, Any]]:
    """The SDK's client connection over a forked agent's pipes, shut down as the SDK's
    ``spawn_agent_process`` does: stdin closed, 2 s to exit, SIGTERM, 2 s, SIGKILL."""
    assert child.stdin is not None and child.stdout is not None
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), child.stdout)
    # the protocol asyncio's own subprocess stdin has under its writer: flow control
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, child.stdin
    )
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    proc = ForkedAgent(child, reader, writer)
    conn = ClientSideConnection(client, writer, reader)
    try:
        yield conn, proc
    finally:
        await conn.close()
        with contextlib.suppress(Exception):
            writer.close()
        try:
            await asyncio.wait_for(proc.wait(), timeout=2.0)
        except TimeoutError:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), timeout=2.0)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        transport.close()
        reader_transport = getattr(reader, "_transport", None)
        if reader_transport is not None:
            reader_transport.close()


@asynccontextmanager
async def agent(
    tmp_path: Path,
    provider: str,
    client: RecordingClient,
    *,
    crash_at: str | None = None,
    extra: tuple[str, ...] = (),
    env_extra: dict[str, str] | None = None,
) -> AsyncIterator[tuple[ClientSideConnection, Any]]:
    """Start ``durable-harness acp`` (store ``jsonl:<tmp>/store``; stderr to
    ``<tmp>/agent-N.log``; :func:`start_agent`), connect ``client`` and initialize; yields the
    connection and the process; ``env_extra``: more environment (``OTEL_*``...)."""
    env = {k: v for k, v in os.environ.items() if k != "DURABLE_HARNESS_CRASH_AT"}
    if crash_at:
        env["DURABLE_HARNESS_CRASH_AT"] = crash_at
    env.update(env_extra or {})
    logs = sorted(tmp_path.glob("agent-*.log"))
    log = tmp_path / f"agent-{len(logs)}.log"
    argv = ["acp", "--store", f"jsonl:{tmp_path / 'store'}", "--provider", provider, *extra]
    if forkable(env):
        started = start_agent(argv, env=env, cwd=str(tmp_path), stderr=str(log))
        assert isinstance(started, forkserver.Spawned)
        connected = _forked(client, started)
    else:  # the SDK's own spawn, in a fresh interpreter
        connected = _sdk_spawned(client, argv, env, tmp_path, log)
    async with connected as (conn, proc):
        await conn.initialize(
            protocol_version=PROTOCOL_VERSION,
            client_capabilities=ClientCapabilities(
                fs=FileSystemCapabilities(read_text_file=client.fs, write_text_file=client.fs),
                terminal=client.terminal,
            ),
        )
        yield conn, proc


@asynccontextmanager
async def _sdk_spawned(
    client: RecordingClient, argv: list[str], env: dict[str, str], cwd: Path, log: Path
) -> AsyncIterator[tuple[ClientSideConnection, Any]]:
    with log.open("wb") as err:
        async with spawn_agent_process(
            client,
            sys.executable,
            "-m",
            "durable_harness",
            *argv,
            env=env,
            cwd=str(cwd),
            transport_kwargs={"stderr": err.fileno()},
        ) as (conn, proc):
            yield conn, proc


async def until(check: Callable[[], bool | Awaitable[bool]], what: str, limit: float = 30) -> None:
    """Poll ``check`` until true; fail after ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = check()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        await anyio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


_CALL_ID = re.compile(r"call_[0-9A-Za-z]{4}_")
_RUN_ID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")


def normalise(trace: list[dict[str, Any]], replace: dict[str, str]) -> list[dict[str, Any]]:
    """The trace with run-dependent text made stable: the strings of ``replace`` (session
    id, temporary paths) by their names, the run part of tool call ids, and UUIDs."""
    text = json.dumps(trace, sort_keys=True)
    for old, new in sorted(replace.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(old, new)
    text = _CALL_ID.sub("call_RUN_", text)
    text = _RUN_ID.sub("<uuid>", text)
    out: list[dict[str, Any]] = json.loads(text)
    return out
