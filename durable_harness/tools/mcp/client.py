"""The MCP connections of one process, through the official SDK (``design/mcp.md``): each
configured server is started (stdio) or reached (streamable HTTP), initialised, and its tools
listed, each as a durable-harness tool. A connection is runtime: opened when the run, resume,
host or ACP agent starts, closed (the stdio child stopped) when it ends, never persisted.

A server that fails to start, or goes away, does not fail the process: its tools answer with
an error result naming it (:class:`~durable_harness.errors.McpServerUnavailable`), the other
servers' tools work.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import anyio

from durable_harness.errors import McpConfigError, McpServerUnavailable
from durable_harness.tools.base import Replay, Tool
from durable_harness.tools.mcp.config import HttpServer, McpConfig, StdioServer
from durable_harness.tools.mcp.tool import McpTool, mcp_tool

__all__ = ["CONNECT_TIMEOUT", "McpServers"]

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 30.0
"""Seconds a server has to start, answer ``initialize`` and list its tools."""


@dataclass
class _Connection:
    """One server's live state: its SDK session (``None`` once down) and why it is down."""

    name: str
    spec: StdioServer | HttpServer
    session: Any = None
    server_info: dict[str, Any] | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    down: str | None = None
    closing: anyio.Event = field(default_factory=anyio.Event)

    @property
    def transport(self) -> str:
        return "stdio" if isinstance(self.spec, StdioServer) else "http"

    def unavailable(self) -> McpServerUnavailable:
        return McpServerUnavailable(
            f"MCP server {self.name} is unavailable: {self.down or 'not connected'}",
            server=self.name,
        )

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """``tools/call`` on this server, as wire JSON.

        Raises:
            McpServerUnavailable: the server is down, or the call failed at the protocol or
                transport level (the message names the server and the cause).
        """
        if self.session is None:
            raise self.unavailable()
        try:
            result = await self.session.call_tool(tool, arguments)
        except Exception as exc:
            raise McpServerUnavailable(
                f"MCP server {self.name}: tools/call {tool} failed: {_why(exc)}",
                server=self.name,
            ) from exc
        wire: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        return wire


def _leaf(exc: BaseException) -> BaseException:
    """``exc``, or an exception group's first leaf (the SDK's task groups wrap errors)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _why(exc: BaseException) -> str:
    """The innermost cause of ``exc`` in words."""
    exc = _leaf(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class McpServers:
    """An async context manager holding the connections of ``config``'s servers.

    ``async with McpServers(config, cwd=...) as servers: tools = servers.tools()``. Entering
    starts every server (each in its own task, at most :data:`CONNECT_TIMEOUT` seconds);
    leaving closes them. ``cwd`` is where a stdio server without its own ``cwd`` starts.
    """

    def __init__(
        self, config: McpConfig, *, cwd: Path | None = None, timeout: float = CONNECT_TIMEOUT
    ) -> None:
        self.config = config
        self.cwd = cwd
        self.timeout = timeout
        self.connections = [_Connection(n, s) for n, s in config.mcpServers.items()]
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> Self:
        tg = await self._stack.enter_async_context(anyio.create_task_group())
        for conn in self.connections:
            await tg.start(self._serve, conn)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        for conn in self.connections:
            conn.closing.set()
        await self._stack.aclose()

    async def _serve(self, conn: _Connection, *, task_status: Any) -> None:
        """Hold ``conn`` open until closing; report started once connected or down."""
        started = False
        try:
            # one deadline scope around the whole connection (the SDK's task groups open
            # inside it); lifted once connected
            with anyio.fail_after(self.timeout) as deadline:
                async with AsyncExitStack() as stack:
                    await self._connect(conn, stack)
                    deadline.deadline = math.inf
                    task_status.started()
                    started = True
                    await conn.closing.wait()
        except Exception as exc:
            leaf = _leaf(exc)
            if isinstance(leaf, McpConfigError):  # the caller's error: raised from start()
                started = True
                raise leaf from None
            conn.down = _why(exc)
            log.warning("MCP server %s: %s", conn.name, conn.down)
        finally:
            conn.session = None
            if conn.down is None and not conn.closing.is_set():
                conn.down = "the connection closed"
            if not started:
                task_status.started()

    async def _connect(self, conn: _Connection, stack: AsyncExitStack) -> None:
        from mcp.client.session import ClientSession
        from mcp.types import PaginatedRequestParams

        spec = conn.spec
        if isinstance(spec, StdioServer):
            from mcp.client.stdio import StdioServerParameters, stdio_client

            params = StdioServerParameters(
                command=spec.command,
                args=spec.args,
                env=spec.env or None,
                cwd=spec.cwd or self.cwd,
            )
            read, write = await stack.enter_async_context(stdio_client(params, errlog=sys.stderr))
        else:
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            client = await stack.enter_async_context(create_mcp_http_client(spec.headers))
            read, write = await stack.enter_async_context(
                streamable_http_client(spec.url, http_client=client)
            )
        session = await stack.enter_async_context(ClientSession(read, write))
        init = await session.initialize()
        info = init.server_info
        conn.server_info = {"name": info.name, "version": info.version}
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = await session.list_tools(
                params=PaginatedRequestParams(cursor=cursor) if cursor else None
            )
            tools += [
                t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in page.tools
            ]
            cursor = page.next_cursor
            if not cursor:
                break
        unknown = sorted(set(spec.tools) - {t["name"] for t in tools})
        if unknown:
            raise McpConfigError(
                f"{self.config.source}: MCP server {conn.name} has no tool "
                + ", ".join(repr(u) for u in unknown),
                path=self.config.source,
                server=conn.name,
            )
        conn.tools, conn.session = tools, session

    def tools(self, recorded: Iterable[Mapping[str, Any]] = ()) -> dict[str, Tool]:
        """Every connected server's tools, keyed by tool name (``mcp__SERVER__TOOL``).

        ``recorded``: ``tool_started`` records of the session being resumed; for a server that
        is down, each MCP tool they name is given back as a stand-in with its recorded replay
        class, answering every call with :class:`McpServerUnavailable` as an error result (so
        recovery decides its in-doubt calls the normal way, and a re-run says why it failed).
        """
        out: dict[str, Tool] = {}
        by_name = {c.name: c for c in self.connections}
        for conn in self.connections:
            for t in conn.tools:
                override = conn.spec.tools.get(t["name"])
                tool = mcp_tool(
                    server=conn.name,
                    tool=t,
                    server_info=conn.server_info,
                    transport=conn.transport,
                    override=override.replay if override else None,
                    call=conn.call,
                )
                out[tool.name] = tool
        for rec in recorded:
            mcp = rec.get("mcp")
            down = by_name.get(mcp.get("server", "")) if isinstance(mcp, dict) else None
            name = rec.get("toolName")
            if down is None or down.session is not None or not isinstance(name, str):
                continue
            if name not in out and isinstance(mcp, dict):
                out[name] = _stand_in(down, name, mcp, rec.get("replay"))
        return out

    def compose(
        self, inner: Callable[[Any], Mapping[str, Tool]]
    ) -> Callable[[Any], Mapping[str, Tool]]:
        """A host's tool factory (``runtime -> {name: tool}``) plus these servers' tools
        (none before entering): ``HostOptions.tools`` for ``serve --mcp`` and ``acp --mcp``."""
        return lambda runtime: {**inner(runtime), **self.tools()}

    def failures(self) -> dict[str, str]:
        """The servers that are down, with why: ``{server: cause}``."""
        return {c.name: c.down for c in self.connections if c.down is not None}


def _stand_in(conn: _Connection, name: str, mcp: Mapping[str, Any], replay: Any) -> Tool:
    """A tool named ``name`` of the down server ``conn``, from its recorded intent."""
    recorded: Replay = "safe" if replay == "safe" else "never"
    tool = mcp_tool(
        server=conn.name,
        tool={"name": str(mcp.get("tool", name)), "annotations": mcp.get("annotations")},
        server_info=mcp.get("serverInfo"),
        transport=conn.transport,
        override=recorded,
        call=conn.call,
    )
    if isinstance(tool, McpTool):
        tool.mcp["replaySource"] = mcp.get("replaySource", "annotation")
    return tool
