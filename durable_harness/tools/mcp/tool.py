"""One MCP server tool as a durable-harness :class:`~durable_harness.tools.base.Tool`
(``design/mcp.md``): its name, its replay class from its annotations (or the config's
override), what its ``tool_started`` intent records, and its result mapped onto a
:class:`~durable_harness.tools.base.ToolResult` without loss.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar, Literal, cast

from pydantic import BaseModel, ConfigDict

from durable_harness.errors import McpServerUnavailable
from durable_harness.tools.base import Replay, Tool, ToolContext, ToolResult

__all__ = [
    "McpArgs",
    "McpTool",
    "ReplaySource",
    "map_result",
    "mcp_tool",
    "replay_of",
    "tool_name",
    "unavailable_result",
]

ReplaySource = Literal["annotation", "override"]
"""Where a tool's replay class came from: its MCP annotations, or the config's ``replay``."""

Caller = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
"""Calls a server's tool: ``(MCP tool name, arguments) -> CallToolResult`` as wire JSON
(``content``, ``structuredContent``, ``isError``); raises :class:`McpServerUnavailable`."""

_UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9_-]")


def tool_name(server: str, tool: str) -> str:
    """The durable-harness name of ``server``'s tool ``tool``: ``mcp__SERVER__TOOL``, any
    character a provider refuses in a tool name (not ``[A-Za-z0-9_-]``) made ``_``, cut to 128
    characters (the providers' limit)."""
    return f"mcp__{server}__{_UNSAFE_CHARS.sub('_', tool)}"[:128]


def replay_of(
    annotations: Mapping[str, Any] | None, override: Replay | None
) -> tuple[Replay, ReplaySource]:
    """The replay class of an MCP tool, and where it came from.

    ``override`` (the config's ``replay``) wins; else ``safe`` when the wire annotations
    (``readOnlyHint``, ``idempotentHint``: MCP spec, "Tool annotations") say the tool is
    read-only or idempotent, and ``never`` otherwise: no annotations, ``destructiveHint``, or
    hints left out (the spec's defaults are not read-only, not idempotent).
    """
    if override is not None:
        return override, "override"
    hints = annotations or {}
    safe = hints.get("readOnlyHint") is True or hints.get("idempotentHint") is True
    return ("safe" if safe else "never"), "annotation"


class McpArgs(BaseModel):
    """The arguments of an MCP tool: any JSON object (the server validates it against its
    ``inputSchema``, which is what the provider is shown)."""

    model_config = ConfigDict(extra="allow")
    input_schema: ClassVar[dict[str, Any]] = {"type": "object"}

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The server's ``inputSchema`` (JSON Schema of the tool's arguments)."""
        return dict(cls.input_schema)


def _block(block: dict[str, Any]) -> dict[str, Any] | None:
    """A content block in the stored message shape (``models/messages.py``): text and images
    map one to one; anything else (audio, resources, links) is ``None`` (kept in details)."""
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        return {"type": "text", "text": block["text"]}
    if kind == "image" and isinstance(block.get("data"), str):
        return {"type": "image", "data": block["data"], "mimeType": block.get("mimeType", "")}
    return None


def _describe(block: dict[str, Any]) -> str:
    """A text stand-in for a block the transcript has no shape for (the model sees it)."""
    kind = block.get("type")
    if kind == "resource_link":
        return f"[resource link {block.get('name', '')} {block.get('uri', '')}]"
    if kind == "resource":
        res = block.get("resource") or {}
        if isinstance(res.get("text"), str):
            return f"[resource {res.get('uri', '')}]\n{res['text']}"
        return f"[resource {res.get('uri', '')} ({res.get('mimeType', 'binary')})]"
    return f"[{kind} content ({block.get('mimeType', 'unknown type')})]"


def map_result(result: Mapping[str, Any], identity: Mapping[str, Any]) -> ToolResult:
    """Map an MCP ``CallToolResult`` (wire JSON) onto a :class:`ToolResult`.

    ``text`` -> a text block; ``image`` -> an image block (``{"type": "image", "data",
    "mimeType"}``); audio, embedded resources and resource links -> a text stand-in, the
    block itself kept in ``details["mcp"]["content"]``; ``structuredContent`` -> kept in
    ``details["mcp"]["structuredContent"]`` and, when there is no text block, also sent as JSON
    text; ``isError`` -> ``is_error``. ``identity`` (server, tool) is stored beside them.
    """
    content: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []
    for raw in result.get("content") or []:
        block = _block(raw)
        if block is None:
            kept.append(raw)
            block = {"type": "text", "text": _describe(raw)}
        content.append(block)
    details: dict[str, Any] = {"mcp": dict(identity)}
    structured = result.get("structuredContent")
    if structured is not None:
        details["mcp"]["structuredContent"] = structured
        if not any(b["type"] == "text" for b in content):
            content.append({"type": "text", "text": json.dumps(structured, ensure_ascii=False)})
    if kept:
        details["mcp"]["content"] = kept
    if not content:
        content.append({"type": "text", "text": "(no content)"})
    return ToolResult(content, is_error=bool(result.get("isError")), details=details)


def unavailable_result(exc: McpServerUnavailable, identity: Mapping[str, Any]) -> ToolResult:
    """The error result of a call whose server is not there: the error's message and code."""
    details = {"mcp": dict(identity), "error": exc.code}
    return ToolResult.text(exc.message, is_error=True, details=details)


class McpTool(Tool):
    """Base of the tools :func:`mcp_tool` builds (one subclass per server tool)."""

    name: ClassVar[str] = "mcp"
    description: ClassVar[str] = "an MCP server's tool"
    Args: ClassVar[type[BaseModel]] = McpArgs
    replay: ClassVar[Replay] = "never"

    def __init__(self, call: Caller, intent: dict[str, Any]) -> None:
        self.call = call
        self.mcp = intent

    def intent_fields(self) -> dict[str, Any]:
        """``{"mcp": {server, serverInfo, transport, tool, annotations, replaySource}}``
        (``models/records.py``, ``ToolStarted.mcp``)."""
        return {"mcp": dict(self.mcp)}

    async def execute(self, args: Any, ctx: ToolContext) -> ToolResult:
        """Call the tool on its server; a server that is gone gives an error result naming
        it (:class:`McpServerUnavailable`), never an exception."""
        identity = {"server": self.mcp["server"], "tool": self.mcp["tool"]}
        arguments = args.model_dump() if isinstance(args, BaseModel) else dict(args)
        try:
            result = await self.call(self.mcp["tool"], arguments)
        except McpServerUnavailable as exc:
            return unavailable_result(exc, identity)
        return map_result(result, identity)


def mcp_tool(
    *,
    server: str,
    tool: Mapping[str, Any],
    server_info: Mapping[str, Any] | None,
    transport: str,
    override: Replay | None,
    call: Caller,
) -> McpTool:
    """Build the durable-harness tool for one entry of a server's ``tools/list`` (wire JSON:
    ``name``, ``description``, ``inputSchema``, ``annotations``), calling it through ``call``.
    Its name is :func:`tool_name`, its replay :func:`replay_of`."""
    annotations = tool.get("annotations")
    replay, source = replay_of(annotations, override)
    schema = tool.get("inputSchema") or {"type": "object"}
    args = type(f"McpArgs_{server}_{tool['name']}", (McpArgs,), {"input_schema": dict(schema)})
    attrs: dict[str, Any] = {
        "name": tool_name(server, str(tool["name"])),
        "description": tool.get("description") or f"{tool['name']} (MCP server {server})",
        "Args": args,
        "replay": replay,
        "__doc__": f"MCP tool {tool['name']} of server {server}.",
    }
    cls = cast(type[McpTool], type(f"Mcp_{server}_{tool['name']}", (McpTool,), attrs))
    intent = {
        "server": server,
        "serverInfo": dict(server_info or {}),
        "transport": transport,
        "tool": str(tool["name"]),
        "annotations": dict(annotations) if annotations is not None else None,
        "replaySource": source,
    }
    return cls(call, intent)
