"""MCP tools against real servers: the test server (SDK server API) over stdio and over
streamable HTTP, and ``mcp-server-time`` from PyPI over stdio; results mapped without loss; a
server that is down or goes away gives an error result naming it."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from durable_harness.errors import McpConfigError
from durable_harness.tools.base import Tool, ToolContext, ToolResult
from durable_harness.tools.mcp import McpServers, parse_mcp_config

from .conftest import stdio_server
from .notes_png import PNG_1X1

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(cwd=tmp_path, run_id="run", tool_call_id="call", idempotency_key="run:c")


async def call(tool: Tool, tmp_path: Path, **arguments: Any) -> ToolResult:
    return await tool.execute(tool.parse_args(arguments), ctx(tmp_path))


def assert_notes_tools(tools: dict[str, Tool], transport: str) -> None:
    replay = {n: t.replay for n, t in tools.items()}
    assert replay == {
        "mcp__notes__peek": "safe",
        "mcp__notes__put": "safe",
        "mcp__notes__append_line": "never",
        "mcp__notes__shrug": "never",
        "mcp__notes__picture": "safe",
        "mcp__notes__fail": "safe",
    }
    intent = tools["mcp__notes__append_line"].intent_fields()["mcp"]
    assert intent == {
        "server": "notes",
        "serverInfo": {"name": "notes", "version": "1.2.3"},
        "transport": transport,
        "tool": "append_line",
        "annotations": {"readOnlyHint": False, "destructiveHint": True},
        "replaySource": "annotation",
    }
    schema = tools["mcp__notes__put"].spec()
    assert schema.parameters["required"] == ["key", "value"]  # the server's inputSchema


async def test_stdio_server_tools_calls_and_results(tmp_path: Path, notes: Path) -> None:
    config = parse_mcp_config({"mcpServers": {"notes": stdio_server(notes)}}, "test")
    async with McpServers(config) as servers:
        tools = servers.tools()
        assert_notes_tools(tools, "stdio")
        done = await call(tools["mcp__notes__append_line"], tmp_path, line="one")
        assert done.content == [{"type": "text", "text": "appended one"}] and not done.is_error
        assert notes.read_text() == "one\n"
        pic = await call(tools["mcp__notes__picture"], tmp_path)
        assert pic.content == [
            {"type": "text", "text": "a dot"},
            {"type": "image", "data": PNG_1X1, "mimeType": "image/png"},
        ]
        assert pic.details is not None
        assert pic.details["mcp"]["structuredContent"] == {"width": 1, "height": 1}
        failed = await call(tools["mcp__notes__fail"], tmp_path)
        assert failed.is_error and failed.content == [{"type": "text", "text": "it broke"}]
        put = await call(tools["mcp__notes__put"], tmp_path, key="k", value="v")
        assert put.details is not None and put.details["mcp"]["structuredContent"] == {
            "key": "k",
            "value": "v",
        }
        assert (notes.parent / "k.value").read_text() == "v"


async def test_http_server_with_an_override(tmp_path: Path, notes: Path, http_notes: str) -> None:
    servers_json = {
        "notes": {
            "url": http_notes,
            "headers": {"X-Test": "1"},
            "tools": {"peek": {"replay": "never"}},
        }
    }
    config = parse_mcp_config({"mcpServers": servers_json}, "test")
    async with McpServers(config) as servers:
        tools = servers.tools()
        assert tools["mcp__notes__peek"].replay == "never"
        assert tools["mcp__notes__peek"].intent_fields()["mcp"]["replaySource"] == "override"
        tools["mcp__notes__peek"].replay = "safe"  # only for the shared shape check below
        assert_notes_tools(tools, "http")
        await call(tools["mcp__notes__append_line"], tmp_path, line="over http")
        peeked = await call(tools["mcp__notes__peek"], tmp_path)
        assert peeked.content == [{"type": "text", "text": "over http\n"}]


async def test_pypi_time_server(tmp_path: Path) -> None:
    time_server = {"command": sys.executable, "args": ["-m", "mcp_server_time"]}
    config = parse_mcp_config({"mcpServers": {"time": time_server}}, "test")
    async with McpServers(config) as servers:
        tools = servers.tools()
        now = tools["mcp__time__get_current_time"]
        assert now.replay == "safe"  # readOnlyHint and idempotentHint
        assert now.intent_fields()["mcp"]["serverInfo"]["name"] == "mcp-time"
        result = await call(now, tmp_path, timezone="UTC")
        assert not result.is_error and "UTC" in result.content[0]["text"]
        assert result.details is not None
        assert result.details["mcp"]["structuredContent"]["timezone"] == "UTC"


async def test_an_override_for_an_unknown_tool_is_a_config_error(notes: Path) -> None:
    entry = stdio_server(notes, tools={"nope": {"replay": "safe"}})
    config = parse_mcp_config({"mcpServers": {"notes": entry}}, "cfg.json")
    with pytest.raises(McpConfigError, match=r"cfg\.json: MCP server notes has no tool 'nope'"):
        async with McpServers(config):
            pass


async def test_a_server_that_cannot_start_leaves_the_others_working(
    tmp_path: Path, notes: Path
) -> None:
    servers_json = {
        "gone": {"command": str(tmp_path / "no-such-server")},
        "notes": stdio_server(notes),
    }
    config = parse_mcp_config({"mcpServers": servers_json}, "test")
    recorded = [
        {
            "type": "tool_started",
            "toolName": "mcp__gone__lookup",
            "replay": "safe",
            "mcp": {"server": "gone", "tool": "lookup", "annotations": {"readOnlyHint": True}},
        }
    ]
    async with McpServers(config) as servers:
        assert "no-such-server" in servers.failures()["gone"]
        tools = servers.tools(recorded)
        stand_in = tools["mcp__gone__lookup"]
        assert stand_in.replay == "safe"  # as recorded: recovery decides it the normal way
        result = await call(stand_in, tmp_path)
        assert result.is_error and result.details is not None
        assert result.details["error"] == "mcp_server_unavailable"
        assert "MCP server gone is unavailable" in result.content[0]["text"]
        assert not (await call(tools["mcp__notes__peek"], tmp_path)).is_error


async def test_a_server_that_dies_mid_session_gives_an_error_result(
    tmp_path: Path, notes: Path
) -> None:
    pidfile = tmp_path / "pid"
    entry = {
        "command": "/bin/sh",
        "args": [
            "-c",
            f'echo $$ > {pidfile}; exec {sys.executable} "$@"',
            "sh",
            *stdio_server(notes)["args"],
        ],
        "env": {"NOTES_FILE": str(notes)},
    }
    config = parse_mcp_config({"mcpServers": {"notes": entry}}, "test")
    async with McpServers(config) as servers:
        tools = servers.tools()
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
        result = await call(tools["mcp__notes__append_line"], tmp_path, line="late")
        assert result.is_error and "MCP server notes" in result.content[0]["text"]
    assert not notes.exists()


async def test_a_host_holds_the_servers_and_offers_their_tools(tmp_path: Path, notes: Path) -> None:
    import anyio

    from durable_harness.host import HostOptions, SessionManager

    script = tmp_path / "script.json"
    turn = {
        "text": "",
        "tool_calls": [{"name": "mcp__notes__append_line", "arguments": {"line": "h"}}],
    }
    script.write_text(json.dumps({"turns": [turn, {"text": "Done."}]}))
    servers = McpServers(parse_mcp_config({"mcpServers": {"notes": stdio_server(notes)}}, "t"))
    options = HostOptions(provider=f"scripted:{script}")
    options.tools, options.mcp = servers.compose(options.tools), servers
    ended = anyio.Event()
    async with SessionManager(f"sqlite:{tmp_path / 'h.db'}", options) as manager:
        manager.observe(lambda sid, event: event["type"] == "run_end" and ended.set())
        session = await manager.create(str(tmp_path))
        await manager.send(session.id, "note h")
        with anyio.fail_after(30):
            await ended.wait()
        await manager.close(session.id)
    assert notes.read_text() == "h\n"
    closed = await call(servers.tools()["mcp__notes__peek"], tmp_path)  # closed with the manager
    assert closed.is_error and "MCP server notes is unavailable" in closed.content[0]["text"]
