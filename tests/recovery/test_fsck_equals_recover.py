"""``fsck`` and ``recover`` report the same damage, always (issue 20: an intent naming no
tool call of its run was kept in doubt by recovery while ``fsck`` said "no damage").

Hand-made logs (a run's intent with a call key of the run but another provider id; an intent
in a settled run naming no call of it) and a property over generated logs: runs of turns
with tool calls, tool records naming a real call, a call of no run, or a real key with
another id, some runs settled, some bytes damaged. For each: the damage ``fsck_path``
lists equals the plan's ``damage``, and its ``unknown_call`` findings are exactly the
records the generator made wrong."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable_harness.harness.records import record
from durable_harness.recovery.fsck import fsck_path
from durable_harness.recovery.resume import recover
from durable_harness.session.session import Session
from durable_harness.storage import EntryOp, RecordOp, open_store
from durable_harness.tools.builtin import builtin_tools

# a tool record per (run, turn, call): "ok" names the call, "ghost" a key of no call,
# "wrong_id" the call's key with another provider id
Ref = st.sampled_from(["ok", "ok", "ghost", "wrong_id"])
Run = st.fixed_dictionaries(
    {
        "calls": st.lists(st.lists(Ref, min_size=0, max_size=3), min_size=1, max_size=3),
        "settled": st.booleans(),
    }
)


def _build(root: Path, runs: list[dict[str, Any]]) -> tuple[str, set[int]]:
    """Write the log of ``runs`` into a fresh JSONL store; return the session file and the
    seqs of the records that name no call of their run."""
    store = open_store(f"jsonl:{root}")
    session = Session(store.create_session(str(root)))
    bad: set[int] = set()
    open_run = False
    for n, run in enumerate(runs):
        if open_run:  # one open run per lane: only the last run may stay open
            break
        rid = f"run{n}"
        prompt = session.make_entry(
            {"type": "message", "message": {"role": "user", "content": "go", "timestamp": 1}},
            parent_id=session.leaf(),
        )
        session.store.commit(
            [EntryOp(prompt, lane="main"), RecordOp(record("run_started", "main", rid))]
        )
        for turn, refs in enumerate(run["calls"], start=1):
            content: list[dict[str, Any]] = [{"type": "text", "text": "t"}]
            content += [
                {
                    "type": "toolCall",
                    "id": f"c{n}_{turn}_{i}",
                    "name": "read_file",
                    "arguments": {"path": "x"},
                }
                for i in range(len(refs))
            ]
            answer = session.make_entry(
                {
                    "type": "message",
                    "message": {
                        "role": "assistant",
                        "content": content,
                        "provider": "scripted",
                        "model": "m",
                        "stopReason": "toolUse" if refs else "stop",
                        "timestamp": 2,
                    },
                },
                parent_id=session.leaf(),
            )
            session.store.commit(
                [
                    RecordOp(
                        record(
                            "provider_request_started",
                            "main",
                            rid,
                            turn=turn,
                            attempt=1,
                            responseEntryId=answer["id"],
                        )
                    ),
                    EntryOp(answer, lane="main"),
                    RecordOp(
                        record(
                            "provider_request_finished",
                            "main",
                            rid,
                            turn=turn,
                            attempt=1,
                            entryId=answer["id"],
                            responseEntryId=answer["id"],
                        )
                    ),
                ]
            )
            for i, ref in enumerate(refs):
                key, cid = f"{answer['id']}/{i}", f"c{n}_{turn}_{i}"
                if ref == "ghost":
                    key, cid = "nowhere/0", "ghost"
                elif ref == "wrong_id":
                    cid = "not-the-call"
                session.store.commit(
                    [
                        RecordOp(
                            record(
                                "tool_started",
                                "main",
                                rid,
                                toolCallId=cid,
                                callKey=key,
                                toolName="read_file",
                                replay="safe",
                            )
                        )
                    ]
                )
                if ref != "ok":
                    bad.add(session.store.last_seq())
        if run["settled"]:
            session.store.commit(
                [RecordOp(record("run_finished", "main", rid, outcome="completed"))]
            )
        else:
            open_run = True
    path = str(session.store.location)
    session.close()
    return path, bad


def _both(path: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    checked = fsck_path(path)["damage"]
    store = open_store(f"jsonl:{Path(path).parents[2]}")
    sid = fsck_path(path)["session_id"]
    with store.open_session(sid, write=False) as s:
        planned = recover(s, builtin_tools()).damage
    return checked, planned


def test_an_intent_with_a_real_key_and_another_id_is_damage_in_both(tmp_path: Path) -> None:
    path, bad = _build(tmp_path, [{"calls": [["wrong_id"]], "settled": False}])
    checked, planned = _both(path)
    assert checked == planned
    assert {d["seq"] for d in checked if d["kind"] == "unknown_call"} == bad != set()


def test_an_intent_naming_no_call_of_a_settled_run_is_damage_in_both(tmp_path: Path) -> None:
    path, bad = _build(
        tmp_path,
        [{"calls": [["ghost"]], "settled": True}, {"calls": [["ok"]], "settled": False}],
    )
    checked, planned = _both(path)
    assert checked == planned
    assert {d["seq"] for d in checked if d["kind"] == "unknown_call"} == bad != set()


@pytest.mark.slow
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(runs=st.lists(Run, min_size=1, max_size=3), cut=st.integers(0, 60))
def test_fsck_and_recover_list_the_same_damage(runs: list[dict[str, Any]], cut: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path, bad = _build(Path(tmp), runs)
        if cut:  # a torn tail: the last bytes of the file lost
            data = Path(path).read_bytes()
            Path(path).write_bytes(data[: max(len(data) - cut, len(data) // 2)])
        checked, planned = _both(path)
        assert checked == planned
        found = {d["seq"] for d in checked if d["kind"] == "unknown_call"}
        if not cut:
            assert found == bad
        else:
            assert found <= bad  # a cut record names nothing any more
