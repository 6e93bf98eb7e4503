"""The MCP servers config: the ``{"mcpServers": {NAME: SERVER}}`` file editors use
(``design/mcp.md``), parsed and checked with pydantic.

A SERVER is either a local process spoken to over stdio,
``{"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}}``, or a remote one over
streamable HTTP, ``{"url": "https://host/mcp", "headers": {"Authorization": "Bearer ..."}}``
(``"type"``: ``"stdio"``, ``"http"`` or ``"streamable-http"``, optional, must agree with the
keys given). Either kind may carry ``"tools": {TOOL: {"replay": "safe" | "never"}}``: a per-tool
override of the replay class its annotations give, recorded in the intent.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from durable_harness.errors import McpConfigError

__all__ = [
    "SERVER_NAME",
    "HttpServer",
    "McpConfig",
    "StdioServer",
    "ToolOverride",
    "load_mcp_config",
    "parse_mcp_config",
]

SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""What a server's name may be: it becomes part of its tools' names (``mcp__NAME__TOOL``)."""


class ToolOverride(BaseModel):
    """A per-tool setting: ``replay`` wins over what the tool's annotations give."""

    model_config = ConfigDict(extra="forbid")
    replay: Literal["safe", "never"]


class StdioServer(BaseModel):
    """A server started as a child process, spoken to over its stdin/stdout."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["stdio"] | None = None
    command: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    tools: dict[str, ToolOverride] = Field(default_factory=dict)


class HttpServer(BaseModel):
    """A server reached over streamable HTTP at ``url``, sending ``headers`` with each
    request."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["http", "streamable-http", "streamableHttp"] | None = None
    url: str = Field(pattern=r"^https?://")
    headers: dict[str, str] = Field(default_factory=dict)
    tools: dict[str, ToolOverride] = Field(default_factory=dict)


class McpConfig(BaseModel):
    """The whole file: ``{"mcpServers": {name: StdioServer | HttpServer}}``; ``source`` is
    where it came from (a path, or ``"ACP session/new"``), for error messages."""

    model_config = ConfigDict(extra="allow")
    mcpServers: dict[str, StdioServer | HttpServer] = Field(default_factory=dict)
    source: str = ""


def _server(source: str, name: str, raw: Any) -> StdioServer | HttpServer:
    if not SERVER_NAME.match(name):
        raise McpConfigError(
            f"{source}: MCP server name {name!r} must be 1-64 letters, digits, '_' or '-'",
            path=source,
            server=name,
        )
    if not isinstance(raw, dict):
        raise McpConfigError(
            f"{source}: MCP server {name!r} must be an object", path=source, server=name
        )
    kind: type[StdioServer | HttpServer]
    if "command" in raw and "url" not in raw:
        kind = StdioServer
    elif "url" in raw and "command" not in raw:
        kind = HttpServer
    else:
        raise McpConfigError(
            f"{source}: MCP server {name!r} needs either 'command' (stdio) or 'url' (HTTP)",
            path=source,
            server=name,
        )
    try:
        return kind.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "server"
        raise McpConfigError(
            f"{source}: MCP server {name!r}: {where}: {first['msg']}", path=source, server=name
        ) from exc


def parse_mcp_config(data: Any, source: str) -> McpConfig:
    """Check a decoded config (``{"mcpServers": {...}}``) from ``source`` (named in errors).

    Raises:
        McpConfigError: not an object, ``mcpServers`` not an object, a bad server name, a
            server with neither or both of ``command``/``url``, a field of the wrong shape or
            unknown, a ``replay`` override other than ``safe``/``never`` (message names
            ``source`` and the server).
    """
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers", {}), dict):
        raise McpConfigError(
            f"{source}: an MCP config must be an object with an 'mcpServers' object",
            path=source,
        )
    servers = {name: _server(source, name, raw) for name, raw in data["mcpServers"].items()}
    return McpConfig(mcpServers=servers, source=source)


def load_mcp_config(path: str | Path) -> McpConfig:
    """Read and check the config file at ``path`` (JSON, ``{"mcpServers": {...}}``).

    Raises:
        McpConfigError: the file cannot be read, is not JSON, or :func:`parse_mcp_config`
            refuses it (message names the path).
    """
    source = str(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise McpConfigError(
            f"{source}: cannot read the MCP config: {exc.strerror or exc}", path=source
        ) from exc
    except ValueError as exc:
        raise McpConfigError(f"{source}: the MCP config is not JSON: {exc}", path=source) from exc
    return parse_mcp_config(data, source)
