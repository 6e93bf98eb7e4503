"""Abort: during a provider stream and during a running ``bash`` tool."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from durable_harness.errors import NoOpenRun
from durable_harness.harness.harness import Harness
from durable_harness.providers.scripted import ScriptedProvider
from durable_harness.storage import Store
from durable_harness.tools.builtin import builtin_tools

from .util import (
    EchoTool,
    GatedProvider,
    assert_same_commit,
    collect_events,
    messages_on_path,
    new_session,
    of_type,
    one_result_per_call,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

SLOW = {"text": "one two three four five", "chunks": 5}

# An abort must not wait for the stream or the tool it interrupts (the stream waits at a gate the
# test never opens, the tool sleeps 300 s); it gets this long, far above what it needs.
PROMPTLY = 20.0


def process_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


async def wait_gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if process_gone(pid):
            return True
        await anyio.sleep(0.02)
    return process_gone(pid)


async def prompt_abort(h: Harness, lane: str = "main") -> list[dict[str, Any]]:
    """Abort; fails when the abort waits for what it interrupts (see ``PROMPTLY``)."""
    with anyio.fail_after(PROMPTLY):
        return await h.abort(lane=lane)


async def test_abort_before_any_text_stores_no_assistant_message(
    store: Store, workdir: Path
) -> None:
    session = new_session(store, workdir)
    provider = GatedProvider([SLOW], stall_after=0)
    async with Harness(session, provider, [EchoTool()], cwd=workdir) as h:
        handle = await h.prompt("talk slowly")
        await provider.wait_stalled()  # the stream is open, no text yet
        returned = await prompt_abort(h)
        assert returned == []
        assert await handle.wait() == "aborted"
    recs = session.store.records("main")
    types = [r["type"] for r in recs]
    assert types == [
        "run_started",
        "provider_request_started",
        "abort_requested",
        "provider_request_failed",
        "run_finished",
    ]
    assert recs[-1]["outcome"] == "aborted"
    assert recs[3]["error"] == "aborted" and recs[3]["retryable"] is False
    # Never an empty assistant message, in the tree or in the context.
    assert [e["message"]["role"] for e in messages_on_path(session)] == ["user"]
    assert session.store.get_entry(recs[1]["responseEntryId"]) is None
    assert session.lane("main").run_id is None


async def test_abort_mid_stream_keeps_the_partial_text(store: Store, workdir: Path) -> None:
    session = new_session(store, workdir)
    got_text = anyio.Event()
    provider = GatedProvider([SLOW], stall_after=1)
    async with Harness(session, provider, [EchoTool()], cwd=workdir) as h:
        events, _ = collect_events(h)
        h.subscribe(lambda e: got_text.set() if e["type"] == "message_update" else None)
        handle = await h.prompt("talk slowly")
        await provider.wait_stalled()  # one chunk streamed, the rest never comes
        with anyio.fail_after(PROMPTLY):
            await got_text.wait()
        returned = await prompt_abort(h)
        assert returned == []
        assert await handle.wait() == "aborted"
    recs = session.store.records("main")
    intent = of_type(recs, "provider_request_started")[0]
    entry = session.store.get_entry(intent["responseEntryId"])
    assert entry is not None, "the partial answer was not stored under its provisioned id"
    msg = entry["message"]
    assert msg["role"] == "assistant" and msg["stopReason"] == "aborted"
    text = "".join(b["text"] for b in msg["content"])
    assert text and "one two three four five".startswith(text)
    assert text != "one two three four five"
    failed = of_type(recs, "provider_request_failed")[0]
    finished = of_type(recs, "run_finished")[0]
    assert_same_commit(session, entry["seq"], failed["seq"], finished["seq"])
    assert of_type(recs, "abort_requested")[0]["seq"] < entry["seq"]
    assert events[-1]["type"] == "run_end" and events[-1]["outcome"] == "aborted"
    # observers see the request end too (the host closes its span with it)
    ends = [e for e in events if e["type"] == "provider_request_end"]
    assert [(e["turn"], e["attempt"], e["outcome"]) for e in ends] == [(1, 1, "cancelled")]
    one_result_per_call(session.context().messages)


async def test_abort_returns_steers_and_keeps_next_run_and_deferred_writes(
    store: Store, workdir: Path
) -> None:
    session = new_session(store, workdir)
    provider = GatedProvider(
        [SLOW], only_prompts={"talk slowly"}, by_prompt={"later please": [{"text": "later done"}]}
    )
    runs_ended: list[dict[str, Any]] = []
    second_done = anyio.Event()

    def on_event(e: dict[str, Any]) -> None:
        if e["type"] == "run_end":
            runs_ended.append(e)
            if len(runs_ended) == 2:
                second_done.set()

    async with Harness(session, provider, [EchoTool()], cwd=workdir) as h:
        h.subscribe(on_event)
        handle = await h.prompt("talk slowly")
        steer_id = await h.steer("change course")
        follow_id = await h.follow_up("and then this")
        next_id = await h.next_run("later please")
        await h.set_model("other", "model-x")
        await provider.wait_stalled()
        returned = await prompt_abort(h)
        assert await handle.wait() == "aborted"
        # Steering and follow-up items die with the run and come back to the caller.
        assert [(r["queue"], r["itemId"]) for r in returned] == [
            ("steer", steer_id),
            ("follow_up", follow_id),
        ]
        assert returned[0]["message"]["content"][0]["text"] == "change course"
        with anyio.fail_after(PROMPTLY):
            await second_done.wait()
        with pytest.raises(NoOpenRun):
            await h.abort()

    recs = session.store.records("main")
    first = [r for r in recs if r.get("runId") == handle.run_id]
    types = [r["type"] for r in first]
    assert types.index("abort_requested") < types.index("run_finished")
    cancelled = of_type(first, "queue_cancelled")
    assert len(cancelled) == 1
    assert sorted(cancelled[0]["itemIds"]) == sorted([steer_id, follow_id])
    finished = of_type(first, "run_finished")[0]
    assert finished["outcome"] == "aborted"

    # The deferred write survived the abort: applied as a model_change entry by run_finished.
    deferred = of_type(first, "write_deferred")
    assert len(deferred) == 1
    assert finished["appliedWrites"] == [deferred[0]["id"]]
    changes = session.store.iter_entries(("model_change",))
    assert [(c["provider"], c["modelId"]) for c in changes] == [("other", "model-x")]
    assert_same_commit(session, changes[0]["seq"], finished["seq"])

    # The next-run item survived: it started the following run, once.
    second = runs_ended[1]
    assert second["runId"] != handle.run_id and second["outcome"] == "completed"
    consumed = [r for r in of_type(recs, "queue_consumed") if r["queue"] == "next_run"]
    assert len(consumed) == 1 and consumed[0]["itemIds"] == [next_id]
    started2 = next(r for r in of_type(recs, "run_started") if r["runId"] == second["runId"])
    assert started2["seq"] > finished["seq"]
    assert_same_commit(session, started2["seq"] - 1, started2["seq"], consumed[0]["seq"])
    assert started2["prompt"]["content"][0]["text"] == "later please"
    # Cancelled items are never delivered.
    texts = [
        "".join(b.get("text", "") for b in e["message"]["content"])
        for e in messages_on_path(session)
    ]
    assert "change course" not in texts and "and then this" not in texts
    assert texts[-2:] == ["later please", "later done"]
    assert session.context().model == {"provider": "scripted", "modelId": "scripted-1"}


BASH_COMMAND = "echo $$ > pid; sleep 300 & echo $! > child; wait"
BASH_TURNS = [
    {
        "text": "Running it.",
        "tool_calls": [{"name": "bash", "arguments": {"command": BASH_COMMAND}}],
    },
    {"text": "never reached"},
]


async def bash_pids(workdir: Path) -> tuple[int, int]:
    """Wait until the command wrote the shell's pid and its background ``sleep``'s pid."""
    pid_file = workdir / "pid"
    child_file = workdir / "child"
    with anyio.fail_after(10):
        while not (pid_file.exists() and child_file.exists()):
            await anyio.sleep(0.01)
        while not (pid_file.read_text().strip() and child_file.read_text().strip()):
            await anyio.sleep(0.01)
    return int(pid_file.read_text()), int(child_file.read_text())


async def test_abort_kills_a_running_bash_tool(store: Store, workdir: Path) -> None:
    session = new_session(store, workdir)
    async with Harness(session, ScriptedProvider(BASH_TURNS), builtin_tools(), cwd=workdir) as h:
        events, _ = collect_events(h)
        handle = await h.prompt("run the slow command")
        await h.set_model("other", "model-y")
        pid, child = await bash_pids(workdir)
        assert not process_gone(pid) and not process_gone(child)
        returned = await prompt_abort(h)
        assert returned == []
        assert await handle.wait() == "aborted"
        assert await wait_gone(pid, PROMPTLY), f"bash {pid} outlived the abort"
        assert await wait_gone(child, PROMPTLY), f"sleep {child} outlived the abort"

    recs = session.store.records("main")
    types = [r["type"] for r in recs]
    assert types.index("abort_requested") < types.index("run_finished")
    started = of_type(recs, "tool_started")
    assert len(started) == 1 and started[0]["toolName"] == "bash"
    assert started[0]["replay"] == "never"
    finished = of_type(recs, "tool_finished")
    assert len(finished) == 1
    assert finished[0]["toolCallId"] == started[0]["toolCallId"]
    assert finished[0]["outcome"] == "aborted" and finished[0]["isError"] is True
    tool_events = [
        (e["type"], e["toolCallId"], e.get("outcome")) for e in events if "toolCallId" in e
    ]
    call_id = started[0]["toolCallId"]
    assert tool_events == [
        ("tool_execution_start", call_id, None),
        ("tool_execution_end", call_id, "aborted"),
    ]
    result = session.store.get_entry(finished[0]["resultEntryId"])
    assert result["id"] == started[0]["resultEntryId"]
    assert result["message"]["isError"] is True
    assert "abort" in result["message"]["content"][0]["text"].lower()
    # The deferred write was applied with the aborted settlement.
    run_finished = of_type(recs, "run_finished")[0]
    assert run_finished["outcome"] == "aborted"
    assert len(run_finished["appliedWrites"]) == 1
    assert session.context().model == {"provider": "other", "modelId": "model-y"}
    # Only one provider turn happened; every tool call has exactly one result.
    assert len(of_type(recs, "provider_request_started")) == 1
    ctx = session.context()
    one_result_per_call(ctx.messages)
    assert [m["role"] for m in ctx.messages] == ["user", "assistant", "toolResult"]


async def test_abort_without_a_run_raises(store: Store, workdir: Path) -> None:
    session = new_session(store, workdir)
    async with Harness(session, ScriptedProvider([]), [], cwd=workdir) as h:
        with pytest.raises(NoOpenRun):
            await h.abort()
    assert session.store.records() == []


@pytest.mark.slow
async def test_abort_racing_the_bash_spawn_leaves_no_process(tmp_path: Path, store: Store) -> None:
    """Abort as soon as the command runs: the cancel may land while the tool is still inside
    ``open_process`` (on asyncio it used to kill the shell alone, orphaning its children)."""
    for attempt in range(8):
        workdir = tmp_path / f"race{attempt}"
        workdir.mkdir()
        session = new_session(store, workdir)
        provider = ScriptedProvider(BASH_TURNS)
        async with Harness(session, provider, builtin_tools(), cwd=workdir) as h:
            handle = await h.prompt("run the slow command")
            pid, child = await bash_pids(workdir)
            await h.abort()  # at once: the tool may still be inside open_process
            assert await handle.wait() == "aborted"
            gone = await wait_gone(pid, PROMPTLY) and await wait_gone(child, PROMPTLY)
            if not gone:
                for leftover in (pid, child):
                    try:
                        os.kill(leftover, 9)
                    except ProcessLookupError:
                        pass
            assert gone, f"attempt {attempt}: a process of the aborted command outlived it"
        session.close()
