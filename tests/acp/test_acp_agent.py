"""``durable-harness acp`` as a child process, driven by the ACP SDK's client side
(``design/acp.md``): sessions, prompts with tool calls, permissions, cancel, client fs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from acp import RequestError, text_block
from acp_helpers import RecordingClient, agent, script, until, workdir

from durable_harness.storage import open_store
from durable_harness.tools.base import ToolContext
from durable_harness.tools.files import ReadFileArgs, ReadFileTool

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def tool_turns(work: Path) -> list[dict[str, Any]]:
    return [
        {
            "text": "I'll look.",
            "tool_calls": [
                {"name": "read_file", "arguments": {"path": "notes.txt"}},
                {"name": "write_file", "arguments": {"path": "out.txt", "content": "hello\n"}},
            ],
        },
        {"text": "Done: notes read, out.txt written."},
    ]


@pytest.mark.slow
async def test_a_prompt_streams_its_tool_calls_and_ends_the_turn(tmp_path: Path) -> None:
    work = workdir(tmp_path)
    (work / "notes.txt").write_text("remember the milk\n")
    client = RecordingClient()
    async with agent(tmp_path, script(tmp_path, tool_turns(work)), client) as (conn, _proc):
        new = await conn.new_session(cwd=str(work))
        (info,) = open_store(f"jsonl:{tmp_path / 'store'}").list_sessions()
        assert new.session_id == info.id  # the ACP session id is the durable session id
        done = await conn.prompt(session_id=new.session_id, prompt=[text_block("go")])
    assert done.stop_reason == "end_turn"
    assert (work / "out.txt").read_text() == "hello\n"
    text = "".join(u["content"]["text"] for u in client.updates("agent_message_chunk"))
    assert text == "I'll look.Done: notes read, out.txt written."
    starts = client.updates("tool_call")
    assert [(s["title"], s["kind"], s["status"]) for s in starts] == [
        ("read_file: notes.txt", "read", "pending"),
        ("write_file: out.txt", "edit", "pending"),
    ]
    assert starts[0]["rawInput"] == {"path": "notes.txt"}
    assert starts[0]["locations"] == [{"path": str(work / "notes.txt")}]
    read_id, write_id = (s["toolCallId"] for s in starts)
    # the calls of one turn run concurrently: each call's own updates are in order, the
    # two calls' updates may interleave
    progress = [(u["toolCallId"], u["status"]) for u in client.updates("tool_call_update")]
    for call_id in (read_id, write_id):
        assert [s for c, s in progress if c == call_id] == ["in_progress", "completed"]
    assert len(progress) == 4
    (read_done,) = (
        u
        for u in client.updates("tool_call_update")
        if u["status"] == "completed" and u["toolCallId"] == read_id
    )
    assert read_done["content"][0]["content"]["text"] == "remember the milk\n"
    # only the unsafe tool asked, after its tool_call and before it ran
    (question,) = client.questions()
    assert question["toolCall"]["toolCallId"] == write_id
    assert [o["optionId"] for o in question["options"]] == [
        "allow_once",
        "allow_always",
        "reject_once",
    ]
    # the question comes after the call's tool_call and before it runs (the calls of one
    # turn run concurrently, so the read may settle on either side of it)
    order = [
        (
            t["method"],
            t["params"].get("update", {}).get("toolCallId"),
            t["params"].get("update", {}).get("status"),
        )
        for t in client.trace
    ]
    asked = order.index(("session/request_permission", None, None))
    assert order.index(("session/update", write_id, "pending")) < asked
    assert order.index(("session/update", write_id, "in_progress")) > asked


@pytest.mark.slow
async def test_a_refused_tool_does_not_run_and_settles_as_an_error(tmp_path: Path) -> None:
    work = workdir(tmp_path)
    (work / "notes.txt").write_text("x\n")
    client = RecordingClient(lambda _call, _options: "reject_once")
    async with agent(tmp_path, script(tmp_path, tool_turns(work)), client) as (conn, _proc):
        new = await conn.new_session(cwd=str(work))
        done = await conn.prompt(session_id=new.session_id, prompt=[text_block("go")])
    assert done.stop_reason == "end_turn"
    assert not (work / "out.txt").exists()
    failed = [u for u in client.updates("tool_call_update") if u["status"] == "failed"]
    (refusal,) = failed
    assert "refused permission to run write_file" in refusal["content"][0]["content"]["text"]


@pytest.mark.slow
async def test_always_allow_is_remembered_in_the_session(tmp_path: Path) -> None:
    work = workdir(tmp_path)
    out = work / "log.txt"
    bash = {"name": "bash", "arguments": {"command": f"echo x >> {out}"}}
    provider = script(tmp_path, [{"text": "", "tool_calls": [bash]}, {"text": "ok"}])
    client = RecordingClient(lambda _call, _options: "allow_always")
    async with agent(tmp_path, provider, client) as (conn, _proc):
        sid = (await conn.new_session(cwd=str(work))).session_id
        for _ in range(2):
            done = await conn.prompt(session_id=sid, prompt=[text_block("go")])
            assert done.stop_reason == "end_turn"
    assert out.read_text() == "x\nx\n"
    assert len(client.questions()) == 1  # the second run did not ask
    # a new agent process loading the session still does not ask
    again = RecordingClient(lambda _call, _options: pytest.fail("asked again"))
    async with agent(tmp_path, provider, again) as (conn, _proc):
        await conn.load_session(cwd=str(work), session_id=sid)
        done = await conn.prompt(session_id=sid, prompt=[text_block("go")])
        assert done.stop_reason == "end_turn"
    assert out.read_text() == "x\nx\nx\n"
    assert again.questions() == []
    with open_store(f"jsonl:{tmp_path / 'store'}").open_session(sid, write=False) as store:
        grants = store.records("main", types=("tool_permission",))
    assert [(g["toolName"], g["permission"]) for g in grants] == [("bash", "allow_always")]


@pytest.mark.slow
async def test_cancel_mid_turn_ends_the_prompt_cancelled(tmp_path: Path) -> None:
    work = workdir(tmp_path)
    never = tmp_path / "never"
    path = tmp_path / "script.json"
    path.write_text(
        json.dumps(
            {
                "turns": [{"text": "ok"}],
                "by_prompt": {"hold": [{"text": "thinking", "chunks": 2, "wait_for": str(never)}]},
            }
        )
    )
    client = RecordingClient()
    async with agent(tmp_path, f"scripted:{path}", client) as (conn, _proc):
        sid = (await conn.new_session(cwd=str(work))).session_id
        result: dict[str, Any] = {}

        async def prompt() -> None:
            result["done"] = await conn.prompt(session_id=sid, prompt=[text_block("hold")])

        async with anyio.create_task_group() as tg:
            tg.start_soon(prompt)
            await until(lambda: bool(client.updates("agent_message_chunk")), "the first chunk")
            # one run at a time: a second prompt meanwhile is refused, the first goes on
            with pytest.raises(RequestError) as refused:
                await conn.prompt(session_id=sid, prompt=[text_block("next")])
            assert refused.value.code == -32010
            assert refused.value.data["code"] == "run_in_progress"
            await conn.cancel(session_id=sid)
        assert result["done"].stop_reason == "cancelled"
        # the abort was durable and settled: the session takes the next prompt
        done = await conn.prompt(session_id=sid, prompt=[text_block("next")])
        assert done.stop_reason == "end_turn"
    with open_store(f"jsonl:{tmp_path / 'store'}").open_session(sid, write=False) as store:
        outcomes = [r["outcome"] for r in store.records("main", types=("run_finished",))]
    assert outcomes == ["aborted", "completed"]


@pytest.mark.slow
async def test_file_tools_use_the_client_file_system_where_offered(tmp_path: Path) -> None:
    work = workdir(tmp_path)
    (work / "notes.txt").write_text("line 1\nline 2\n")
    client = RecordingClient(fs=True)
    async with agent(tmp_path, script(tmp_path, tool_turns(work)), client) as (conn, _proc):
        sid = (await conn.new_session(cwd=str(work))).session_id
        done = await conn.prompt(session_id=sid, prompt=[text_block("go")])
    assert done.stop_reason == "end_turn"
    fs_calls = [(t["method"], t["params"]["path"]) for t in client.trace if "fs/" in t["method"]]
    # the two calls run concurrently: either may reach the client first
    assert sorted(fs_calls) == [
        ("fs/read_text_file", str(work / "notes.txt")),
        ("fs/write_text_file", str(work / "out.txt")),
    ]
    assert (work / "out.txt").read_text() == "hello\n"
    read_id = client.updates("tool_call")[0]["toolCallId"]
    (read,) = (
        u
        for u in client.updates("tool_call_update")
        if u["status"] == "completed" and u["toolCallId"] == read_id
    )
    assert read["content"][0]["content"]["text"] == "line 1\nline 2\n"


@pytest.mark.slow
async def test_a_long_file_read_through_the_client_is_capped_like_the_local_tool(
    tmp_path: Path,
) -> None:
    work = workdir(tmp_path)
    (work / "big.txt").write_text("".join(f"{i:07d} {'x' * 92}\n" for i in range(3000)))
    turns = [
        {"text": "", "tool_calls": [{"name": "read_file", "arguments": {"path": "big.txt"}}]},
        {"text": "ok"},
    ]
    client = RecordingClient(fs=True)
    async with agent(tmp_path, script(tmp_path, turns), client) as (conn, _proc):
        sid = (await conn.new_session(cwd=str(work))).session_id
        await conn.prompt(session_id=sid, prompt=[text_block("go")])
    read = next(u for u in client.updates("tool_call_update") if u["status"] == "completed")
    text = read["content"][0]["content"]["text"]
    assert ("fs/read_text_file", str(work / "big.txt")) in [
        (t["method"], t["params"].get("path")) for t in client.trace
    ]
    local = await ReadFileTool().execute(
        ReadFileArgs(path="big.txt"),
        ToolContext(cwd=work, run_id="r", tool_call_id="c", idempotency_key="k"),
    )
    assert text == local.content[0]["text"]
    assert text.endswith("of 3000; continue with offset=2596]")


class SlowToAnswer(RecordingClient):
    """Records the question, then never answers it (the test cancels the turn)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = anyio.Event()

    async def request_permission(
        self, session_id: str, tool_call: Any, options: Any, **kw: Any
    ) -> Any:
        self.trace.append({"method": "session/request_permission", "params": {}})
        self.asked.set()
        await anyio.sleep_forever()


@pytest.mark.slow
async def test_cancel_while_a_permission_question_is_open(tmp_path: Path) -> None:
    work = workdir(tmp_path)
    out = work / "never.txt"
    bash = {"name": "bash", "arguments": {"command": f"echo x > {out}"}}
    provider = script(tmp_path, [{"text": "", "tool_calls": [bash]}, {"text": "ok"}])
    client = SlowToAnswer()
    async with agent(tmp_path, provider, client) as (conn, _proc):
        sid = (await conn.new_session(cwd=str(work))).session_id
        result: dict[str, Any] = {}

        async def prompt() -> None:
            result["done"] = await conn.prompt(session_id=sid, prompt=[text_block("go")])

        async with anyio.create_task_group() as tg:
            tg.start_soon(prompt)
            with anyio.fail_after(30):
                await client.asked.wait()
            await conn.cancel(session_id=sid)
        assert result["done"].stop_reason == "cancelled"
    assert not out.exists()
    (call,) = client.updates("tool_call")
    settled = [u for u in client.updates("tool_call_update") if u["status"] == "failed"]
    assert [u["toolCallId"] for u in settled] == [call["toolCallId"]]


@pytest.mark.slow
async def test_bash_runs_in_the_client_terminal_where_offered(tmp_path: Path) -> None:
    work = workdir(tmp_path)
    calls = [
        {
            "name": "bash",
            "arguments": {"command": 'echo "in $PWD for $DURABLE_HARNESS_TOOL_CALL_ID"'},
        },
    ]
    turns = [
        {"text": "", "tool_calls": calls},
        {"text": "", "tool_calls": [{"name": "bash", "arguments": {"command": "exit 3"}}]},
        {"text": "ok"},
    ]
    client = RecordingClient(lambda _call, _options: "allow_always", terminal=True)
    async with agent(tmp_path, script(tmp_path, turns), client) as (conn, _proc):
        sid = (await conn.new_session(cwd=str(work))).session_id
        done = await conn.prompt(session_id=sid, prompt=[text_block("go")])
    assert done.stop_reason == "end_turn"
    first, second = client.updates("tool_call")
    created = [t["params"] for t in client.trace if t["method"] == "terminal/create"]
    assert created == [
        {"command": "bash", "args": ["-c", calls[0]["arguments"]["command"]], "cwd": str(work)},
        {"command": "bash", "args": ["-c", "exit 3"], "cwd": str(work)},
    ]
    shown = [u for u in client.updates("tool_call_update") if "content" in u]
    assert shown[0]["content"] == [{"type": "terminal", "terminalId": "term-1"}]
    settled = {u["toolCallId"]: u for u in shown if u.get("status") in ("completed", "failed")}
    ok = settled[first["toolCallId"]]
    assert ok["status"] == "completed"
    assert ok["content"][0]["content"]["text"] == f"in {work} for {first['toolCallId']}\n"
    bad = settled[second["toolCallId"]]
    assert (bad["status"], bad["content"][0]["content"]["text"]) == ("failed", "exit code 3")
    assert all(t["released"] for t in client.terminals.values())


@pytest.mark.slow
async def test_a_client_terminal_past_its_timeout_is_killed_and_released(tmp_path: Path) -> None:
    work = workdir(tmp_path)
    slow = {"name": "bash", "arguments": {"command": "echo started; sleep 60", "timeout": 0.5}}
    turns = [{"text": "", "tool_calls": [slow]}, {"text": "ok"}]
    client = RecordingClient(terminal=True)
    async with agent(tmp_path, script(tmp_path, turns), client) as (conn, _proc):
        sid = (await conn.new_session(cwd=str(work))).session_id
        assert (
            await conn.prompt(session_id=sid, prompt=[text_block("go")])
        ).stop_reason == "end_turn"
    methods = [t["method"] for t in client.trace if t["method"].startswith("terminal/")]
    assert methods == ["terminal/create", "terminal/kill", "terminal/release"]
    failed = next(u for u in client.updates("tool_call_update") if u.get("status") == "failed")
    assert "timed out after 0.5 seconds" in failed["content"][0]["content"]["text"]
