"""ACP ``session/new`` with ``mcpServers``: the server (the MCP tests' own, over stdio) is
started by the agent and its tools are the session's, asked like any unsafe tool."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from acp import text_block
from acp.schema import EnvVariable, McpServerStdio
from acp_helpers import RecordingClient, agent, script, workdir

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def anyio_backend() -> str:
    """The ACP SDK's client side runs on asyncio."""
    return "asyncio"


SERVER = Path(__file__).resolve().parents[1] / "tools" / "mcp" / "notes_server.py"


async def test_session_new_mcp_servers_give_the_session_their_tools(tmp_path: Path) -> None:
    work = workdir(tmp_path)
    notes = tmp_path / "notes.txt"
    call = {"name": "mcp__notes__append_line", "arguments": {"line": "from acp"}}
    provider = script(tmp_path, [{"text": "", "tool_calls": [call]}, {"text": "noted"}])
    client = RecordingClient()
    server = McpServerStdio(
        name="notes",
        command=sys.executable,
        args=[str(SERVER), "stdio"],
        env=[EnvVariable(name="NOTES_FILE", value=str(notes))],
    )
    async with agent(tmp_path, provider, client) as (conn, _proc):
        new = await conn.new_session(cwd=str(work), mcp_servers=[server])
        done = await conn.prompt(session_id=new.session_id, prompt=[text_block("note it")])
    assert done.stop_reason == "end_turn"
    assert notes.read_text() == "from acp\n"
    (asked,) = client.questions()  # destructive (replay never): put to the client first
    assert asked["toolCall"]["title"].startswith("mcp__notes__append_line")
    finished = [u for u in client.updates("tool_call_update") if u.get("status") == "completed"]
    assert finished and "appended from acp" in str(finished[-1].get("content"))
