"""The same scripted conversation, driven twice through two agent processes, gives the same
protocol trace, and that trace is kept as a regression fixture (``tests/acp/data``).

Regenerate the fixture after an intended change with
``DURABLE_HARNESS_UPDATE_FIXTURES=1 pytest tests/acp/test_acp_trace.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from acp import text_block
from acp_helpers import RecordingClient, agent, normalise, workdir

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

FIXTURE = Path(__file__).parent / "data" / "trace.json"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def conversation(tmp_path: Path) -> str:
    """Two prompts: a read then a bash (asked, always allowed), then a second bash (not
    asked); one tool call per turn, so the order on the wire is fixed."""
    work = workdir(tmp_path)
    (work / "notes.txt").write_text("alpha\nbeta\n")
    path = tmp_path / "script.json"
    path.write_text(
        json.dumps(
            {
                "turns": [{"text": "(unscripted)"}],
                "by_prompt": {
                    "read the notes": [
                        {
                            "text": "Reading the notes.",
                            "chunks": 3,
                            "tool_calls": [
                                {"name": "read_file", "arguments": {"path": "notes.txt"}}
                            ],
                        },
                        {
                            "text": "Counting lines.",
                            "tool_calls": [
                                {"name": "bash", "arguments": {"command": "wc -l < notes.txt"}}
                            ],
                        },
                        {"text": "There are 2 lines."},
                    ],
                    "append a line": [
                        {
                            "text": "",
                            "tool_calls": [
                                {
                                    "name": "bash",
                                    "arguments": {"command": "echo gamma >> notes.txt"},
                                }
                            ],
                        },
                        {"text": "Appended.", "chunks": 1},
                    ],
                },
            }
        )
    )
    return f"scripted:{path}"


async def drive(tmp_path: Path) -> list[dict[str, Any]]:
    """Drive the conversation in a fresh store, then load it in a new agent process; return
    the normalised trace (what the client received, and the responses)."""
    provider = conversation(tmp_path)
    client = RecordingClient(lambda _call, _options: "allow_always")
    steps: list[dict[str, Any]] = []
    async with agent(tmp_path, provider, client) as (conn, _proc):
        sid = (await conn.new_session(cwd=str(workdir(tmp_path)))).session_id
        for text in ("read the notes", "append a line"):
            done = await conn.prompt(session_id=sid, prompt=[text_block(text)])
            client.trace.append({"method": "response", "params": {"stopReason": done.stop_reason}})
        steps = client.trace
    # a second agent process replays the session on session/load
    reader = RecordingClient(lambda _call, _options: pytest.fail("nothing to ask"))
    async with agent(tmp_path, provider, reader) as (conn, _proc):
        await conn.load_session(cwd=str(workdir(tmp_path)), session_id=sid)
        reader.trace.append({"method": "response", "params": {"loaded": True}})
    steps = [*steps, *reader.trace]
    assert (workdir(tmp_path) / "notes.txt").read_text() == "alpha\nbeta\ngamma\n"
    return normalise(steps, {sid: "<session>", str(tmp_path): "<tmp>"})


@pytest.mark.slow
async def test_the_same_conversation_gives_the_same_trace(tmp_path: Path) -> None:
    first = await drive(tmp_path / "one")
    second = await drive(tmp_path / "two")
    assert first == second
    if os.environ.get("DURABLE_HARNESS_UPDATE_FIXTURES"):
        FIXTURE.parent.mkdir(exist_ok=True)
        FIXTURE.write_text(json.dumps(first, indent=1, ensure_ascii=False) + "\n")
    assert first == json.loads(FIXTURE.read_text()), (
        "the protocol trace changed; if intended, regenerate "
        "(DURABLE_HARNESS_UPDATE_FIXTURES=1) and review the diff"
    )
    methods = [step["method"] for step in first]
    assert methods.count("session/request_permission") == 1  # always allowed after
    assert methods.count("response") == 3
    # the replay shows the same tool calls, settled, as the live run did
    ends = [i for i, m in enumerate(methods) if m == "response"]
    live, replayed = first[: ends[1]], first[ends[1] + 1 :]

    def titles(steps: list[dict[str, Any]]) -> list[str]:
        ups = [s["params"]["update"] for s in steps if s["method"] == "session/update"]
        return [u["title"] for u in ups if "title" in u]

    assert (
        titles(replayed)
        == titles(live)
        == [
            "read_file: notes.txt",
            "bash: wc -l < notes.txt",
            "bash: echo gamma >> notes.txt",
        ]
    )
