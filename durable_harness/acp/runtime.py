"""The tools' runtime of an ACP session: its permission questions, the client's file system
and terminal, through a wrapper of each tool (:func:`wrap`; ``design/acp.md``, "Asking before
a tool runs", "Client capabilities")."""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol, cast

import anyio
from acp import RequestError, tool_terminal_ref, update_tool_call
from acp.interfaces import Client
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    EnvVariable,
    PermissionOption,
    ToolCallUpdate,
)
from pydantic import BaseModel

from durable_harness.acp.updates import TOOL_KINDS, Update, tool_title
from durable_harness.errors import PathEscape
from durable_harness.fs import resolve_path
from durable_harness.host.manager import SessionManager
from durable_harness.host.record import CommandRuntime
from durable_harness.tools.base import OUTPUT_CAP_BYTES, Replay, Tool, ToolContext, ToolResult
from durable_harness.tools.bash import BashArgs, BashTool, command_env, command_result
from durable_harness.tools.files import ReadFileArgs, WriteFileArgs, read_window

log = logging.getLogger(__name__)

UNSAFE_TOOLS = frozenset({"bash", "write_file", "edit_file", "append_file"})
"""Tools that ask the client before they run (unless always allowed in the session)."""

TOOL_OPTIONS = [
    PermissionOption(option_id="allow_once", name="Allow", kind="allow_once"),
    PermissionOption(option_id="allow_always", name="Always allow", kind="allow_always"),
    PermissionOption(option_id="reject_once", name="Reject", kind="reject_once"),
]
"""The question before an unsafe tool runs; ``allow_always`` is remembered in the session."""


def question(
    tool_call_id: str, tool: str, args: dict[str, Any], note: str = "", **meta: Any
) -> ToolCallUpdate:
    """The tool call a permission question is about: its title (with ``note``), kind and
    arguments, ``pending``; ``meta`` goes to ``_meta.durableHarness``."""
    return ToolCallUpdate(
        tool_call_id=tool_call_id,
        title=tool_title(tool, args) + note,
        kind=TOOL_KINDS.get(tool, "other"),
        status="pending",
        raw_input=args,
        field_meta={"durableHarness": meta} if meta else None,
    )


class Outbox(Protocol):
    """Where the runtime queues a session's updates (the adapter's per-session channel)."""

    def push(self, session_id: str, update: Update) -> None:
        """Queue ``update`` after what the session's channel holds."""

    async def flush(self, session_id: str) -> None:
        """Wait until the session's channel has sent everything queued before this call."""


class ToolRuntime:
    """The client's side of the tools of an agent's sessions. The adapter sets :attr:`manager`,
    :attr:`client` and :attr:`capabilities`, maps runs to sessions (:attr:`run_sessions`) and
    marks the in-doubt calls decided ``retry`` (:attr:`approved`: asked once, not twice)."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self.manager: SessionManager | None = None
        self.client: Client | None = None
        self.capabilities = ClientCapabilities()
        self.run_sessions: dict[str, str] = {}  # run id -> session id
        self.approved: set[tuple[str, str]] = set()  # (session, tool call) retried by decision
        self._ask_locks: dict[str, anyio.Lock] = {}

    def tools(
        self, inner: Callable[[CommandRuntime], Mapping[str, Tool]]
    ) -> Callable[[CommandRuntime], Mapping[str, Tool]]:
        """The host's tool factory with every tool wrapped for ACP (:func:`wrap`)."""
        return lambda runtime: {n: wrap(t, self) for n, t in inner(runtime).items()}

    async def ask(
        self, session_id: str, asked: ToolCallUpdate, options: list[PermissionOption]
    ) -> str | None:
        """Ask the client ``session/request_permission``; the option chosen, or ``None``."""
        if self.client is None:
            return None
        await self.outbox.flush(session_id)
        async with self._ask_locks.setdefault(session_id, anyio.Lock()):
            response = await self.client.request_permission(
                session_id=session_id, tool_call=asked, options=options
            )
        outcome = response.outcome
        if not isinstance(outcome, AllowedOutcome):
            return None
        chosen = outcome.option_id
        return chosen if chosen in {o.option_id for o in options} else None

    async def before_tool(
        self, tool: str, args: dict[str, Any], ctx: ToolContext, *, unsafe: bool | None = None
    ) -> str | None:
        """Ask before an unsafe tool runs (unless always allowed, or retried by decision), then
        announce it ``in_progress``; ``None`` to go ahead, else the error result's text."""
        session_id = self.run_sessions.get(ctx.run_id)
        if session_id is None or self.manager is None:
            return None  # not a run of this agent's sessions
        approved = (session_id, ctx.tool_call_id) in self.approved
        self.approved.discard((session_id, ctx.tool_call_id))
        allowed = approved or not (tool in UNSAFE_TOOLS if unsafe is None else unsafe)
        if not allowed and tool not in (await self.manager.get(session_id)).allowed_tools:
            asked = question(ctx.tool_call_id, tool, args)
            answer = await self.ask(session_id, asked, TOOL_OPTIONS)
            if answer is None:
                return f"permission to run {tool} was cancelled; the call did not run"
            if answer == "reject_once":
                return f"the user refused permission to run {tool}; the call did not run"
            if answer == "allow_always":
                await self.manager.allow_tool(session_id, tool)
        self.outbox.push(session_id, update_tool_call(ctx.tool_call_id, status="in_progress"))
        return None

    def _client_for(self, ctx: ToolContext, offered: bool | None) -> tuple[Client, str] | None:
        session_id = self.run_sessions.get(ctx.run_id)
        if session_id is None or self.client is None or not offered:
            return None
        return self.client, session_id

    async def read(self, ctx: ToolContext, path: Path) -> str | None:
        """The file's text through the client's ``fs/read_text_file`` (``None``: not offered)."""
        fs = self.capabilities.fs
        found = self._client_for(ctx, fs is not None and fs.read_text_file)
        if found is None:
            return None
        client, session_id = found
        return (await client.read_text_file(session_id=session_id, path=str(path))).content

    async def write(self, ctx: ToolContext, path: Path, content: str) -> bool:
        """Write through the client's ``fs/write_text_file`` (``False``: not offered)."""
        fs = self.capabilities.fs
        found = self._client_for(ctx, fs is not None and fs.write_text_file)
        if found is None:
            return False
        client, session_id = found
        await client.write_text_file(session_id=session_id, path=str(path), content=content)
        return True

    async def bash(self, ctx: ToolContext, args: BashArgs) -> ToolResult | None:
        """Run ``bash -c COMMAND`` in a client terminal (``None``: not offered), with the bash
        tool's environment and result wording (``design/acp.md``, "Client capabilities")."""
        found = self._client_for(ctx, bool(self.capabilities.terminal))
        if found is None:
            return None
        client, session_id = found
        timeout = args.timeout or BashTool.default_timeout
        created = await client.create_terminal(
            session_id=session_id,
            command="bash",
            args=["-c", args.command],
            cwd=str(ctx.cwd),
            env=[EnvVariable(name=k, value=v) for k, v in command_env(ctx).items()],
            output_byte_limit=OUTPUT_CAP_BYTES,
        )
        terminal = created.terminal_id
        ref = update_tool_call(ctx.tool_call_id, content=[tool_terminal_ref(terminal)])
        self.outbox.push(session_id, ref)
        exit_code: int | None = None
        signal_name: str | None = None
        finished = False
        try:
            with anyio.move_on_after(timeout) as waited:
                status = await client.wait_for_terminal_exit(
                    session_id=session_id, terminal_id=terminal
                )
                exit_code, signal_name = status.exit_code, status.signal
            if waited.cancelled_caught:
                await client.kill_terminal(session_id=session_id, terminal_id=terminal)
            output = await client.terminal_output(session_id=session_id, terminal_id=terminal)
            finished = True
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    if not finished:
                        await client.kill_terminal(session_id=session_id, terminal_id=terminal)
                    await client.release_terminal(session_id=session_id, terminal_id=terminal)
                except (ConnectionError, RequestError) as exc:
                    log.warning("releasing terminal %s: %s", terminal, exc)
        details: dict[str, Any] = {
            "exit_code": exit_code,
            "signal": signal_name,
            "timed_out": waited.cancelled_caught,
            "truncated": output.truncated,
            "terminal_id": terminal,
            "via": "client",
        }
        return command_result(
            output.output,
            details,
            exit_code=exit_code,
            timed_out=waited.cancelled_caught,
            timeout=timeout,
            signal_name=signal_name,
            killed="its terminal",
        )


class AcpTool(Tool):
    """Base of the wrappers :func:`wrap` builds (one subclass per inner tool)."""

    name: ClassVar[str] = "acp"
    description: ClassVar[str] = "a tool asked through ACP"
    Args: ClassVar[type[BaseModel]] = BaseModel
    replay: ClassVar[Replay] = "never"

    def __init__(self, inner: Tool, runtime: ToolRuntime) -> None:
        self.inner = inner
        self.runtime = runtime

    def intent_fields(self) -> dict[str, Any]:
        """The inner tool's extra intent fields (an MCP tool's ``mcp``)."""
        return self.inner.intent_fields()

    async def execute(self, args: Any, ctx: ToolContext) -> ToolResult:
        """Ask (an unsafe tool), then run through the client where it can, else the inner tool."""
        raw = args.model_dump() if isinstance(args, BaseModel) else {}
        # an MCP tool asks unless its replay class says it is read-only or idempotent
        mcp = "mcp" in self.inner.intent_fields()
        unsafe = self.replay == "never" if mcp else None
        refusal = await self.runtime.before_tool(self.name, raw, ctx, unsafe=unsafe)
        if refusal is not None:
            return ToolResult.text(refusal, is_error=True, details={"error": "permission"})
        via_client = await self._via_client(args, ctx)
        return via_client if via_client is not None else await self.inner.execute(args, ctx)

    async def _via_client(self, args: Any, ctx: ToolContext) -> ToolResult | None:
        """The call performed through the client, or ``None`` to run it locally."""
        if isinstance(args, BashArgs) and self.name == "bash":
            return await self.runtime.bash(ctx, args)
        kind = _FILE_TOOLS.get(self.name)
        if kind is None or not isinstance(args, kind):
            return None
        try:
            target = resolve_path(ctx.cwd, args.path)
        except PathEscape:
            return None
        if isinstance(args, ReadFileArgs):
            text = await self.runtime.read(ctx, target)
            if text is None:
                return None
            result = read_window(io.StringIO(text, newline=""), args, target)
            if result.details is not None and not result.is_error:
                result.details["via"] = "client"
            return result
        if not await self.runtime.write(ctx, target, args.content):
            return None
        size = len(args.content.encode("utf-8"))
        return ToolResult.text(
            f"wrote {size} bytes to {args.path}",
            details={"path": str(target), "bytes": size, "via": "client"},
        )


_FILE_TOOLS: dict[str, type[ReadFileArgs | WriteFileArgs]] = {
    "read_file": ReadFileArgs,
    "write_file": WriteFileArgs,
}


def wrap(inner: Tool, runtime: ToolRuntime) -> AcpTool:
    """Wrap one tool: an :class:`AcpTool` subclass with ``inner``'s attributes and reconcile."""
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
    return cls(inner, runtime)
