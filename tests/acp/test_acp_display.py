"""What the operator reads is what will run, over ACP (issue 20): the titles of tool calls and
of permission questions show bidi controls and invisible characters as ``\\u{HEX}``; the
call's ``rawInput`` and the store keep the exact command (``design/acp.md``)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from acp import text_block
from acp_helpers import RecordingClient, agent, script, workdir

from durable_harness.storage import open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

COMMAND = "echo \u202eok; rm -f ./x\u200b"
TITLE = "bash: echo \\u{202e}ok; rm -f ./x\\u{200b}"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def turns() -> list[dict[str, object]]:
    return [
        {
            "text": "Running it.",
            "tool_calls": [{"name": "bash", "arguments": {"command": COMMAND}}],
        },
        {"text": "Finished."},
    ]


@pytest.mark.slow
async def test_the_permission_question_before_bash_shows_the_escaped_command(
    tmp_path: Path,
) -> None:
    client = RecordingClient(lambda _call, _options: "reject_once")
    async with agent(tmp_path, script(tmp_path, turns()), client) as (conn, _proc):
        sid = (await conn.new_session(cwd=str(workdir(tmp_path)))).session_id
        done = await conn.prompt(session_id=sid, prompt=[text_block("go")])
    assert done.stop_reason == "end_turn"
    (start,) = client.updates("tool_call")
    assert start["title"] == TITLE
    assert start["rawInput"] == {"command": COMMAND}  # the arguments stay exact
    (question,) = client.questions()
    assert question["toolCall"]["title"] == TITLE
    assert question["toolCall"]["rawInput"]["command"] == COMMAND


@pytest.mark.crash
async def test_the_in_doubt_question_after_a_crash_shows_the_escaped_command(
    tmp_path: Path,
) -> None:
    provider = script(tmp_path, turns())
    work = workdir(tmp_path)
    async with agent(tmp_path, provider, RecordingClient(), crash_at="after_tool_started") as (
        conn,
        proc,
    ):
        sid = (await conn.new_session(cwd=str(work))).session_id
        with pytest.raises(ConnectionError):
            await conn.prompt(session_id=sid, prompt=[text_block("go")])
        assert await proc.wait() == -signal.SIGKILL

    client = RecordingClient(lambda _call, _options: "fail")
    async with agent(tmp_path, provider, client) as (conn, _proc):
        await conn.load_session(cwd=str(work), session_id=sid)
    (question,) = client.questions()
    assert question["toolCall"]["title"] == f"{TITLE} (interrupted: outcome unknown)"
    assert question["toolCall"]["rawInput"]["command"] == COMMAND
    # the replayed tool_call carries the same escaped title
    assert client.updates("tool_call")[0]["title"] == TITLE
    with open_store(f"jsonl:{tmp_path / 'store'}").open_session(sid, write=False) as store:
        (started,) = store.records("main", types=("tool_started",))
    assert started["arguments"]["command"] == COMMAND
