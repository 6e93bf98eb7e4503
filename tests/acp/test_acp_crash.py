"""The agent process SIGKILLed mid-tool, then a new one given ``session/load``: the history
comes back, the in-doubt call is put to the client as a permission request, the answer is
the durable decision, and the run finishes (``design/acp.md``)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest
from acp import RequestError, text_block
from acp_helpers import RecordingClient, agent, script, until, workdir

from durable_harness.acp.agent import SKIPPED_RESULT
from durable_harness.storage import open_store

pytestmark = [pytest.mark.anyio, pytest.mark.crash, pytest.mark.timeout(120)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def bash_turns(command: str) -> list[dict[str, Any]]:
    return [
        {
            "text": "Running it.",
            "tool_calls": [{"name": "bash", "arguments": {"command": command}}],
        },
        {"text": "Finished."},
    ]


def process_records(tmp_path: Path, sid: str) -> list[dict[str, Any]]:
    with open_store(f"jsonl:{tmp_path / 'store'}").open_session(sid, write=False) as store:
        return store.records("main", types=("tool_process",))


def alive(pgid: int) -> bool:
    """Whether the process group has a live (not zombie) member."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


async def crashed_prompt(tmp_path: Path, provider: str, client: RecordingClient, **kw: Any) -> str:
    """New session, a prompt whose agent process dies mid-tool; returns the session id."""
    async with agent(tmp_path, provider, client, **kw) as (conn, proc):
        sid = (await conn.new_session(cwd=str(workdir(tmp_path)))).session_id
        with pytest.raises(ConnectionError):
            await conn.prompt(session_id=sid, prompt=[text_block("go")])
        assert await proc.wait() == -signal.SIGKILL
    return sid


@pytest.mark.parametrize("answer", ["retry", "fail", "skip"])
async def test_an_in_doubt_call_is_asked_and_the_answer_is_honoured(
    tmp_path: Path, answer: str
) -> None:
    work = workdir(tmp_path)
    effects = work / "effects.txt"
    provider = script(tmp_path, bash_turns(f"echo x >> {effects}"))
    sid = await crashed_prompt(tmp_path, provider, RecordingClient(), crash_at="after_tool_started")
    assert not effects.exists()  # the intent was durable; the effect never began

    client = RecordingClient(lambda _call, _options: answer)
    async with agent(tmp_path, provider, client) as (conn, _proc):
        loaded = await conn.load_session(cwd=str(work), session_id=sid)
        # the history came back first: the prompt, the answer, the call (no result)
        first = client.trace[:3]
        assert [t["params"]["update"]["sessionUpdate"] for t in first] == [
            "user_message_chunk",
            "agent_message_chunk",
            "tool_call",
        ]
        assert first[0]["params"]["update"]["content"]["text"] == "go"
        call_id = first[2]["params"]["update"]["toolCallId"]
        # then the interruption is reported and the call put to the client
        (plan,) = client.updates("plan")[:1]
        assert any(call_id in e["content"] for e in plan["entries"])
        (question,) = client.questions()
        assert question["toolCall"]["toolCallId"] == call_id
        assert [o["optionId"] for o in question["options"]] == ["retry", "fail", "skip"]
        # the run finished by the answer
        meta = loaded.field_meta or {}
        (recovered,) = meta["durableHarness"]["recovered"]
        assert (recovered["outcome"], recovered["stopReason"]) == ("completed", "end_turn")
        settled = [
            u
            for u in client.updates("tool_call_update")
            if u["toolCallId"] == call_id and u["status"] in ("completed", "failed")
        ]
        (last,) = settled
        text = last["content"][0]["content"]["text"]
        if answer == "retry":
            assert effects.read_text() == "x\n"
            assert last["status"] == "completed"
        else:
            assert not effects.exists()
            assert last["status"] == ("failed" if answer == "fail" else "completed")
            if answer == "skip":
                assert text == SKIPPED_RESULT
        chunks = [u["content"]["text"] for u in client.updates("agent_message_chunk")]
        assert chunks[-1] == "Finished." or "".join(chunks).endswith("Finished.")
        # a retried call was asked once (the decision), not a second time before it ran
        assert len(client.questions()) == 1
        # the session is live: it takes the next prompt
        done = await conn.prompt(session_id=sid, prompt=[text_block("again")])
        assert done.stop_reason == "end_turn"
    with open_store(f"jsonl:{tmp_path / 'store'}").open_session(sid, write=False) as store:
        (decision,) = store.records("main", types=("decision",))
    assert decision["toolCallId"] == call_id and decision["author"] == "acp"
    assert decision["decision"] == {"retry": "retry", "fail": "fail", "skip": "result"}[answer]


async def test_a_bash_killed_with_its_agent_is_not_rerun_when_skipped(tmp_path: Path) -> None:
    """The agent is SIGKILLed from outside while its bash waits on a file: the effect before
    the wait happened once; recovery kills the leftover process group and, on "skip", never
    runs the command again."""
    work = workdir(tmp_path)
    effects = work / "effects.txt"
    gate = tmp_path / "gate"
    command = (
        f"echo x >> {effects}; while [ ! -e {gate} ]; do sleep 0.05; done; echo y >> {effects}"
    )
    provider = script(tmp_path, bash_turns(command))
    first = RecordingClient()
    async with agent(tmp_path, provider, first) as (conn, proc):
        sid = (await conn.new_session(cwd=str(work))).session_id

        async def prompt() -> None:
            with pytest.raises(ConnectionError):
                await conn.prompt(session_id=sid, prompt=[text_block("go")])

        async with anyio.create_task_group() as tg:
            tg.start_soon(prompt)
            await until(lambda: effects.exists() and effects.read_text() == "x\n", "the effect")
            # the harness records the bash's process group just after spawning it
            await until(lambda: bool(process_records(tmp_path, sid)), "the tool_process record")
            os.kill(proc.pid, signal.SIGKILL)
        assert await proc.wait() == -signal.SIGKILL
    assert len(first.questions()) == 1  # bash asked before it ran
    (leftover,) = process_records(tmp_path, sid)
    assert alive(leftover["pgid"])  # the bash outlived its agent, still waiting on the gate

    client = RecordingClient(lambda _call, _options: "skip")
    async with agent(tmp_path, provider, client) as (conn, _proc):
        loaded = await conn.load_session(cwd=str(work), session_id=sid)
        (recovered,) = (loaded.field_meta or {})["durableHarness"]["recovered"]
        assert recovered["outcome"] == "completed"
    assert not alive(leftover["pgid"])  # recovery killed the group before deciding
    assert effects.read_text() == "x\n"
    (question,) = client.questions()
    assert question["toolCall"]["_meta"]["durableHarness"]["inDoubt"] is True


async def test_a_cancelled_question_leaves_the_session_suspended(tmp_path: Path) -> None:
    work = workdir(tmp_path)
    effects = work / "effects.txt"
    provider = script(tmp_path, bash_turns(f"echo x >> {effects}"))
    sid = await crashed_prompt(tmp_path, provider, RecordingClient(), crash_at="after_tool_started")
    undecided = RecordingClient(lambda _call, _options: None)
    async with agent(tmp_path, provider, undecided) as (conn, _proc):
        loaded = await conn.load_session(cwd=str(work), session_id=sid)
        (call,) = undecided.updates("tool_call")
        assert (loaded.field_meta or {})["durableHarness"] == {"awaiting": [call["toolCallId"]]}
        with pytest.raises(RequestError) as refused:
            await conn.prompt(session_id=sid, prompt=[text_block("go on")])
        assert refused.value.code == -32010
        assert "suspended" in str(refused.value)
    with open_store(f"jsonl:{tmp_path / 'store'}").open_session(sid, write=False) as store:
        assert store.records("main", types=("decision",)) == []
    # asked again on the next load, and this time decided
    client = RecordingClient(lambda _call, _options: "retry")
    async with agent(tmp_path, provider, client) as (conn, _proc):
        loaded = await conn.load_session(cwd=str(work), session_id=sid)
        (recovered,) = (loaded.field_meta or {})["durableHarness"]["recovered"]
        assert recovered["outcome"] == "completed"
    assert effects.read_text() == "x\n"
