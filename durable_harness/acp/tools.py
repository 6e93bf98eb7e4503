"""The tools an ACP session runs with: each built-in tool wrapped so that it asks the client
before an unsafe call and, where the client offers a file system, reads and writes through it
(``design/acp.md``).

The harness is not patched: a wrapper is an ordinary :class:`~durable_harness.tools.base.Tool`
with the inner tool's name, arguments, description and replay declaration (so recovery plans
exactly as it would for the bare tool), whose :meth:`~AcpTool.execute` first settles the
permission and then delegates. The harness writes a call's ``tool_started`` intent before it
calls ``execute``, so a call the client refuses settles as an error result ("the client
refused permission"), and one whose agent dies while the question is open is in doubt after
the crash, like any call that was started.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol, cast

from pydantic import BaseModel

from durable_harness.errors import PathEscape
from durable_harness.fs import resolve_path
from durable_harness.tools.base import OUTPUT_CAP_BYTES, Replay, Tool, ToolContext, ToolResult
from durable_harness.tools.bash import BashArgs
from durable_harness.tools.files import ReadFileArgs, WriteFileArgs

UNSAFE_TOOLS = frozenset({"bash", "write_file", "edit_file", "append_file"})
"""Tools that ask the client before they run (unless always allowed in the session)."""


class Gate(Protocol):
    """What a wrapped tool needs from the agent
    (:class:`~durable_harness.acp.agent.DurableAgent`)."""

    async def before_tool(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> str | None:
        """Settle the call's permission and announce it runs; returns ``None`` to go ahead,
        or the text of the error result the call settles with instead."""

    async def client_read(self, ctx: ToolContext, path: Path) -> str | None:
        """The file's text read through the client, or ``None`` when the client offers no
        ``fs/read_text_file`` (the tool then reads locally)."""

    async def client_write(self, ctx: ToolContext, path: Path, content: str) -> bool:
        """Write the file through the client; ``False`` when the client offers no
        ``fs/write_text_file`` (the tool then writes locally)."""

    async def client_bash(self, ctx: ToolContext, args: BashArgs) -> ToolResult | None:
        """Run the command in a client terminal, or ``None`` when the client offers no
        terminal (the tool then runs it locally)."""


class AcpTool(Tool):
    """Base of the wrappers :func:`acp_tools` builds (one subclass per inner tool, carrying
    its class attributes)."""

    name: ClassVar[str] = "acp"
    description: ClassVar[str] = "a tool asked through ACP"
    Args: ClassVar[type[BaseModel]] = BaseModel
    replay: ClassVar[Replay] = "never"

    def __init__(self, inner: Tool, gate: Gate) -> None:
        self.inner = inner
        self.gate = gate

    async def execute(self, args: Any, ctx: ToolContext) -> ToolResult:
        """Ask (an unsafe tool), then run through the client where it offers the capability
        (``read_file``, ``write_file``: its file system; ``bash``: its terminal), else the
        inner tool."""
        raw = args.model_dump() if isinstance(args, BaseModel) else {}
        refusal = await self.gate.before_tool(self.name, raw, ctx)
        if refusal is not None:
            return ToolResult.text(refusal, is_error=True, details={"error": "permission"})
        via_client = await self._via_client(args, ctx)
        if via_client is not None:
            return via_client
        return await self.inner.execute(args, ctx)

    async def _via_client(self, args: Any, ctx: ToolContext) -> ToolResult | None:
        """The call performed through the client's file system, or ``None`` to run locally."""
        if isinstance(args, ReadFileArgs) and self.name == "read_file":
            try:
                target = resolve_path(ctx.cwd, args.path)
            except PathEscape:
                return None  # the inner tool words the refusal
            text = await self.gate.client_read(ctx, target)
            if text is None:
                return None
            return _window(text, args, target)
        if isinstance(args, WriteFileArgs) and self.name == "write_file":
            try:
                target = resolve_path(ctx.cwd, args.path)
            except PathEscape:
                return None
            if not await self.gate.client_write(ctx, target, args.content):
                return None
            size = len(args.content.encode("utf-8"))
            return ToolResult.text(
                f"wrote {size} bytes to {args.path}",
                details={"path": str(target), "bytes": size, "via": "client"},
            )
        if isinstance(args, BashArgs) and self.name == "bash":
            return await self.gate.client_bash(ctx, args)
        return None


def _window(text: str, args: ReadFileArgs, target: Path) -> ToolResult:
    """``read_file``'s line window over text the client returned: whole lines, at most
    :data:`~durable_harness.tools.base.OUTPUT_CAP_BYTES` bytes, with the same note as the
    local tool when cut (a single line over the cap gives its head)."""
    lines = text.splitlines(keepends=True)
    first = args.offset or 1
    if lines and first > len(lines):
        return ToolResult.text(
            f"cannot read {args.path}: offset {first} is past the end of the file "
            f"({len(lines)} lines)",
            is_error=True,
            details={"error": "offset_out_of_range", "path": args.path, "total_lines": len(lines)},
        )
    window = lines[first - 1 :]
    if args.limit is not None:
        window = window[: args.limit]
    shown: list[str] = []
    used = 0
    for line in window:
        size = len(line.encode("utf-8"))
        if used + size > OUTPUT_CAP_BYTES:
            if not shown:  # one line over the cap: its head, as the local tool gives
                head = line.encode("utf-8")[:OUTPUT_CAP_BYTES].decode("utf-8", "ignore")
                shown.append(head)
            break
        shown.append(line)
        used += size
    truncated = len(shown) < len(window) or (bool(shown) and shown[-1] != window[len(shown) - 1])
    text = "".join(shown)
    if truncated:
        text += (
            f"{'' if text.endswith(chr(10)) or not text else chr(10)}[output truncated at "
            f"{OUTPUT_CAP_BYTES} bytes: showed lines {first}-{first + len(shown) - 1} of "
            f"{len(lines)}; continue with offset={first + len(shown)}]"
        )
    return ToolResult.text(
        text,
        details={
            "path": str(target),
            "offset": first,
            "lines": len(shown),
            "total_lines": len(lines),
            "truncated": truncated,
            "via": "client",
        },
    )


def wrap(inner: Tool, gate: Gate) -> AcpTool:
    """Wrap one tool: a subclass of :class:`AcpTool` with ``inner``'s name, description,
    argument model and replay declaration, and its ``reconcile`` when it has one."""
    attrs: dict[str, Any] = {
        "name": inner.name,
        "description": inner.description,
        "Args": inner.Args,
        "replay": inner.replay,
        "__doc__": f"``{inner.name}`` asked through ACP.",
    }
    if inner.can_reconcile:

        async def reconcile(self: AcpTool, args: Any, ctx: ToolContext) -> ToolResult | None:
            return await self.inner.reconcile(args, ctx)

        attrs["reconcile"] = reconcile
    cls = cast(type[AcpTool], type(f"Acp_{inner.name}", (AcpTool,), attrs))
    return cls(inner, gate)


def acp_tools(tools: Mapping[str, Tool], gate: Gate) -> dict[str, Tool]:
    """Every tool of ``tools`` wrapped by :func:`wrap`, by name."""
    return {name: wrap(tool, gate) for name, tool in tools.items()}
