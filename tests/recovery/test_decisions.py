"""Decisions and policies for an in-doubt tool call, in process.

The in-doubt state is written by hand with ``store.commit`` (what a crash after
``tool_started`` leaves): ``run_started`` + the user entry, a settled provider turn whose
assistant entry asks for one tool call, and that call's ``tool_started`` with no
``tool_finished``. Then ``Harness.resume`` applies a decision or a policy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from durable_harness.errors import RecoveryError
from durable_harness.harness.harness import Harness
from durable_harness.harness.records import idempotency_key, record
from durable_harness.harness.tool_calls import FAILED_BY_DECISION
from durable_harness.ids import new_id, uuid7
from durable_harness.providers.scripted import ScriptedProvider
from durable_harness.recovery.resume import parse_decision, plan_recovery, recover, resume_lane
from durable_harness.session.context import INTERRUPTED_TEXT
from durable_harness.session.session import Session
from durable_harness.storage import EntryOp, RecordOp, Store, open_store
from durable_harness.tools.builtin import builtin_tools

CALL = "call_1"
FINAL = "Finished after the decision."


@pytest.fixture(params=["jsonl", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "jsonl":
        return open_store(f"jsonl:{tmp_path / 'home'}")
    return open_store(f"sqlite:{tmp_path / 'store.db'}")


@pytest.fixture
def work(tmp_path: Path) -> Path:
    w = tmp_path / "work"
    w.mkdir()
    return w


def craft(
    store: Store, work: Path, tool: str, args: dict[str, Any], replay: str
) -> tuple[str, str]:
    """Write an interrupted run whose only tool call is in doubt; return (session, run) ids."""
    ss = store.create_session(str(work))
    session = Session(ss)
    run_id = uuid7()
    prompt = {"role": "user", "content": [{"type": "text", "text": "do it"}], "timestamp": 1}
    user = session.make_entry({"type": "message", "message": prompt}, parent_id=None)
    ss.commit(
        [
            EntryOp(user, lane="main"),
            RecordOp(
                record(
                    "run_started",
                    "main",
                    run_id,
                    promptEntryId=user["id"],
                    prompt=prompt,
                    provider="scripted",
                    model="scripted-1",
                )
            ),
        ]
    )
    resp = new_id()
    ss.commit(
        [
            RecordOp(
                record(
                    "provider_request_started",
                    "main",
                    run_id,
                    turn=1,
                    attempt=1,
                    responseEntryId=resp,
                )
            )
        ]
    )
    assistant = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Running it."},
            {"type": "toolCall", "id": CALL, "name": tool, "arguments": args},
        ],
        "provider": "scripted",
        "model": "scripted-1",
        "stopReason": "toolUse",
        "timestamp": 2,
    }
    entry = session.make_entry(
        {"type": "message", "id": resp, "message": assistant}, parent_id=user["id"]
    )
    ss.commit(
        [
            EntryOp(entry, lane="main"),
            RecordOp(
                record(
                    "provider_request_finished",
                    "main",
                    run_id,
                    turn=1,
                    attempt=1,
                    entryId=resp,
                    stopReason="toolUse",
                )
            ),
        ]
    )
    ss.commit(
        [
            RecordOp(
                record(
                    "tool_started",
                    "main",
                    run_id,
                    toolCallId=CALL,
                    toolName=tool,
                    arguments=args,
                    resultEntryId=new_id(),
                    replay=replay,
                    idempotencyKey=idempotency_key(run_id, CALL),
                    attempt=1,
                )
            )
        ]
    )
    sid = ss.session_id
    ss.close()
    return sid, run_id


def resume(
    store: Store,
    sid: str,
    work: Path,
    *,
    decisions: dict[str, dict[str, Any]] | None = None,
    policy: Any = None,
) -> tuple[str, list[str]]:
    """Open the session as its writer and resume the lane; return (outcome, awaiting)."""
    provider = ScriptedProvider([{"text": "(turn 1 is already stored)"}, {"text": FINAL}])

    async def go() -> tuple[str, list[str]]:
        with Session(store.open_session(sid)) as s:
            tools = builtin_tools()
            rec = await plan_recovery(s.store, tools, policy or "ask", decisions, str(work))
            async with Harness(s, provider, tools, cwd=work) as h:
                handle = await resume_lane(h, rec)
                assert handle is not None
                return await handle.wait(), handle.awaiting

    return anyio.run(go)


def snapshot(store: Store, sid: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(records, context messages) read back read-only."""
    with Session(store.open_session(sid, write=False)) as s:
        return s.store.records(), s.context().messages


def results_for(messages: list[dict[str, Any]], call: str = CALL) -> list[dict[str, Any]]:
    return [m for m in messages if m.get("role") == "toolResult" and m.get("toolCallId") == call]


def text(message: dict[str, Any]) -> str:
    return "".join(b.get("text", "") for b in message["content"] if isinstance(b, dict))


def of_type(records: list[dict[str, Any]], rtype: str) -> list[dict[str, Any]]:
    return [r for r in records if r["type"] == rtype]


BASH = {"command": "echo d1 >> effects.log"}


def test_in_doubt_call_shows_interrupted_result_before_decision(store: Store, work: Path) -> None:
    sid, _run = craft(store, work, "bash", BASH, "never")
    _records, messages = snapshot(store, sid)
    (result,) = results_for(messages)
    assert text(result) == INTERRUPTED_TEXT
    assert result["isError"] is True
    assert messages[-1] is result  # the transcript is well-formed for a provider


@pytest.mark.parametrize(
    ("decide", "want_text", "is_error", "outcome"),
    [
        ("retry", None, False, "ok"),
        ("fail", FAILED_BY_DECISION, True, "decided_fail"),
        ("result:deployed by hand at 10:02", "deployed by hand at 10:02", False, "decided_result"),
    ],
    ids=["retry", "fail", "result"],
)
def test_decision(
    store: Store,
    work: Path,
    decide: str,
    want_text: str | None,
    is_error: bool,
    outcome: str,
) -> None:
    sid, run_id = craft(store, work, "bash", BASH, "never")
    call_id, decision = parse_decision(f"{CALL}={decide}")
    assert call_id == CALL
    got, awaiting = resume(store, sid, work, decisions={call_id: decision})
    assert (got, awaiting) == ("completed", [])

    records, messages = snapshot(store, sid)
    (rec,) = of_type(records, "decision")
    assert rec["toolCallId"] == CALL
    assert rec["runId"] == run_id
    assert rec["decision"] == decision["decision"]
    (fin,) = of_type(records, "tool_finished")
    assert fin["outcome"] == outcome
    assert fin["isError"] is is_error
    # the decision is durable before it acts
    assert rec["seq"] < fin["seq"]
    intents = of_type(records, "tool_started")
    if decide == "retry":
        assert [i["attempt"] for i in intents] == [1, 2]
        assert rec["seq"] < intents[1]["seq"]
        assert (work / "effects.log").read_text() == "d1\n"
    else:
        assert len(intents) == 1
        assert not (work / "effects.log").exists()  # fail / result never run the tool
    # after the decision the real result replaces the synthetic one: exactly one result
    (result,) = results_for(messages)
    assert INTERRUPTED_TEXT not in text(result)
    assert result["isError"] is is_error
    if want_text is not None:
        assert text(result) == want_text
    assert result["toolCallId"] == CALL
    assert messages[-1]["role"] == "assistant"
    assert text(messages[-1]) == FINAL
    assert [r["outcome"] for r in of_type(records, "run_finished")] == ["completed"]


def test_ask_without_decision_suspends_and_runs_nothing(store: Store, work: Path) -> None:
    sid, run_id = craft(store, work, "bash", BASH, "never")
    got, awaiting = resume(store, sid, work)
    assert (got, awaiting) == ("suspended", [CALL])
    records, messages = snapshot(store, sid)
    assert not of_type(records, "tool_finished")
    assert not of_type(records, "run_finished")
    assert len(of_type(records, "tool_started")) == 1
    assert not (work / "effects.log").exists()
    (result,) = results_for(messages)
    assert text(result) == INTERRUPTED_TEXT
    with Session(store.open_session(sid, write=False)) as s:
        assert s.lane().run_id == run_id
        lp = recover(s.store, builtin_tools(), cwd=str(work)).lane("main")
    assert (lp.state, lp.reason, lp.next_action) == (
        "suspended",
        "awaiting_decision",
        "await_decision",
    )
    # a later decision still settles it
    got, _ = resume(store, sid, work, decisions={CALL: {"decision": "result", "result": "ok"}})
    assert got == "completed"
    _records, messages = snapshot(store, sid)
    (result,) = results_for(messages)
    assert text(result) == "ok"


def test_retry_interrupted_again_needs_a_new_decision(store: Store, work: Path) -> None:
    sid, run_id = craft(store, work, "bash", BASH, "never")
    # what a resume with ``retry`` leaves when it is killed after the retry's intent
    with Session(store.open_session(sid)) as s:
        s.store.commit(
            [RecordOp(record("decision", "main", run_id, toolCallId=CALL, decision="retry"))]
        )
        s.store.commit(
            [
                RecordOp(
                    record(
                        "tool_started",
                        "main",
                        run_id,
                        toolCallId=CALL,
                        toolName="bash",
                        arguments=BASH,
                        resultEntryId=new_id(),
                        replay="never",
                        idempotencyKey=idempotency_key(run_id, CALL),
                        attempt=2,
                    )
                )
            ]
        )
        (c,) = recover(s.store, builtin_tools(), cwd=str(work)).lane("main").tool_calls
    assert (c.status, c.attempts, c.action) == ("in_doubt", 2, "await_decision")
    got, awaiting = resume(store, sid, work)
    assert (got, awaiting) == ("suspended", [CALL])
    records, _messages = snapshot(store, sid)
    assert len(of_type(records, "tool_started")) == 2  # no third execution
    assert not (work / "effects.log").exists()


@pytest.mark.parametrize("policy", ["fail-in-doubt", "retry-safe"])
def test_policy_fails_replay_never_call(store: Store, work: Path, policy: str) -> None:
    sid, _run = craft(store, work, "bash", BASH, "never")
    got, _ = resume(store, sid, work, policy=policy)
    assert got == "completed"
    records, messages = snapshot(store, sid)
    (fin,) = of_type(records, "tool_finished")
    assert fin["outcome"] == "failed_by_policy"
    assert fin["isError"] is True
    assert len(of_type(records, "tool_started")) == 1
    assert not (work / "effects.log").exists()
    (result,) = results_for(messages)
    assert result["isError"] is True
    assert text(result) == FAILED_BY_DECISION


def test_retry_safe_policy_reexecutes_safe_call(store: Store, work: Path) -> None:
    (work / "in.txt").write_text("payload\n")
    sid, _run = craft(store, work, "read_file", {"path": "in.txt"}, "safe")
    got, _ = resume(store, sid, work, policy="retry-safe")
    assert got == "completed"
    records, messages = snapshot(store, sid)
    assert [i["attempt"] for i in of_type(records, "tool_started")] == [1, 2]
    (fin,) = of_type(records, "tool_finished")
    assert fin["outcome"] == "ok"
    (result,) = results_for(messages)
    assert "payload" in text(result)


def test_fail_in_doubt_policy_fails_even_a_safe_call(store: Store, work: Path) -> None:
    (work / "in.txt").write_text("payload\n")
    sid, _run = craft(store, work, "read_file", {"path": "in.txt"}, "safe")
    got, _ = resume(store, sid, work, policy="fail-in-doubt")
    assert got == "completed"
    records, _messages = snapshot(store, sid)
    assert len(of_type(records, "tool_started")) == 1
    (fin,) = of_type(records, "tool_finished")
    assert fin["outcome"] == "failed_by_policy"


def test_write_file_reconciled_when_content_matches(store: Store, work: Path) -> None:
    (work / "out.txt").write_text("new content\n")
    args = {"path": "out.txt", "content": "new content\n"}
    sid, _run = craft(store, work, "write_file", args, "never")
    with Session(store.open_session(sid, write=False)) as s:
        (c,) = recover(s.store, builtin_tools(), cwd=str(work)).lane("main").tool_calls
    assert (c.status, c.action) == ("in_doubt", "reconcile")
    got, awaiting = resume(store, sid, work)
    assert (got, awaiting) == ("completed", [])
    records, messages = snapshot(store, sid)
    (fin,) = of_type(records, "tool_finished")
    assert fin["outcome"] == "reconciled"
    assert fin["isError"] is False
    assert len(of_type(records, "tool_started")) == 1  # reconciled, not re-run
    (result,) = results_for(messages)
    assert INTERRUPTED_TEXT not in text(result)
    assert (work / "out.txt").read_text() == "new content\n"


@pytest.mark.parametrize("present", ["other content\n", None], ids=["differs", "missing"])
def test_write_file_waits_when_content_differs(
    store: Store, work: Path, present: str | None
) -> None:
    if present is not None:
        (work / "out.txt").write_text(present)
    args = {"path": "out.txt", "content": "new content\n"}
    sid, _run = craft(store, work, "write_file", args, "never")
    with Session(store.open_session(sid, write=False)) as s:
        lp = recover(s.store, builtin_tools(), cwd=str(work)).lane("main")
    assert (lp.next_action, lp.tool_calls[0].action) == ("await_decision", "await_decision")
    got, awaiting = resume(store, sid, work)
    assert (got, awaiting) == ("suspended", [CALL])
    records, _messages = snapshot(store, sid)
    assert not of_type(records, "tool_finished")
    # the file is left as it was: reconcile only looks
    if present is None:
        assert not (work / "out.txt").exists()
    else:
        assert (work / "out.txt").read_text() == present


def test_opening_a_session_runs_nothing(store: Store, work: Path) -> None:
    sid, _run = craft(store, work, "bash", BASH, "never")
    before, _ = snapshot(store, sid)
    location = Session(store.open_session(sid, write=False)).store.location
    raw = Path(location).read_bytes() if location.endswith(".jsonl") else None

    async def open_only(s: Session) -> None:
        provider = ScriptedProvider([{"text": "never asked"}])
        async with Harness(s, provider, builtin_tools(), cwd=work):
            await anyio.sleep(0.2)

    with Session(store.open_session(sid)) as s:  # opened as the writer
        plan = recover(s.store, builtin_tools(), cwd=str(work))  # the plan only looks
        assert plan.lane("main").next_action == "await_decision"
        anyio.run(open_only, s)  # a harness over it, but no resume()
    after, _ = snapshot(store, sid)
    assert json.dumps(after, sort_keys=True) == json.dumps(before, sort_keys=True)
    assert not (work / "effects.log").exists()
    if raw is not None:
        assert Path(location).read_bytes() == raw


@pytest.mark.parametrize("bad", ["retry", "=retry", f"{CALL}=maybe", f"{CALL}"])
def test_parse_decision_rejects_malformed(bad: str) -> None:
    with pytest.raises(RecoveryError):
        parse_decision(bad)


def test_parse_decision_forms() -> None:
    assert parse_decision("c=retry") == ("c", {"decision": "retry"})
    assert parse_decision("c=fail") == ("c", {"decision": "fail"})
    assert parse_decision("c=retry!") == ("c", {"decision": "retry", "force": True})
    assert parse_decision("c=result:a=b:c") == ("c", {"decision": "result", "result": "a=b:c"})
