"""The MCP servers an ACP client names in ``session/new`` and ``session/load``
(``mcpServers``: ``design/mcp.md``, "ACP"): converted to the config shape, connected for the
agent's life (each set held by a task of the agent's task group), and their tools given to the
generation the call starts.

A host's tool factory is ``runtime -> tools`` with no session in it, so the servers of the call
being handled are *pending* while that call starts its generation; :meth:`SessionMcp.starting`
serialises the calls that start generations so a pending set is only ever seen by its own.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc

from durable_harness.tools.base import Tool
from durable_harness.tools.mcp import McpServers, parse_mcp_config

__all__ = ["ACP_SOURCE", "SessionMcp", "config_of"]

log = logging.getLogger(__name__)

ACP_SOURCE = "ACP mcpServers"
"""What errors name as the config's source."""


def _pairs(items: Any) -> dict[str, str]:
    """ACP's ``[{"name", "value"}]`` (env variables, headers) as a mapping."""
    return {str(i["name"]): str(i["value"]) for i in items or ()}


def config_of(servers: list[Any]) -> dict[str, Any]:
    """ACP ``McpServer`` objects (stdio: ``name, command, args, env``; http: ``type, name, url,
    headers``) as ``{"mcpServers": {...}}``; another kind (SSE, deprecated by MCP; ACP's own)
    is left out, with a warning."""
    out: dict[str, Any] = {}
    for server in servers:
        raw = server.model_dump() if hasattr(server, "model_dump") else dict(server)
        name = str(raw.get("name", ""))
        if raw.get("command") is not None:
            out[name] = {
                "command": raw["command"],
                "args": list(raw.get("args") or []),
                "env": _pairs(raw.get("env")),
            }
        elif raw.get("url") is not None and raw.get("type") != "sse":
            out[name] = {"url": raw["url"], "headers": _pairs(raw.get("headers"))}
        else:
            log.warning("MCP server %s: only stdio and streamable HTTP are supported", name)
    return {"mcpServers": out}


class SessionMcp:
    """The ACP sessions' own MCP servers."""

    def __init__(self) -> None:
        self.pending: McpServers | None = None
        self._lock = anyio.Lock()

    def compose(
        self, inner: Callable[[Any], Mapping[str, Tool]]
    ) -> Callable[[Any], Mapping[str, Tool]]:
        """``inner`` plus the tools of the pending servers (the generation being started)."""

        def tools(runtime: Any) -> Mapping[str, Tool]:
            extra = self.pending.tools() if self.pending is not None else {}
            return {**inner(runtime), **extra}

        return tools

    async def open(
        self, tg: anyio.abc.TaskGroup | None, servers: list[Any] | None
    ) -> McpServers | None:
        """Connect ``servers`` (ACP objects) for the agent's life; ``None`` when there are none.

        Raises:
            McpConfigError: a server entry the config refuses (names ``ACP mcpServers``).
        """
        if not servers or tg is None:
            return None
        held = McpServers(parse_mcp_config(config_of(servers), ACP_SOURCE))

        async def hold(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            async with held:
                task_status.started()
                await anyio.sleep_forever()

        await tg.start(hold)
        for name, why in held.failures().items():
            log.warning("MCP server %s unavailable: %s", name, why)
        return held

    @asynccontextmanager
    async def starting(self, servers: McpServers | None) -> AsyncIterator[None]:
        """Hold the start of one generation: ``servers`` pending for its tools, alone."""
        async with self._lock:
            self.pending = servers
            try:
                yield
            finally:
                self.pending = None
