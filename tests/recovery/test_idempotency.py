"""``bash`` sees ``DURABLE_HARNESS_IDEMPOTENCY_KEY`` = ``<run_id>:<call key>``, and the key
is the same when the call is executed again after a crash (decision ``retry``), so an external
service can deduplicate the retry."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from .helpers import dh, main_lane, plan_json, read_session, session_id, store_spec, write_script

TURNS = [
    {
        "text": "Calling the service.",
        "tool_calls": [
            {
                "name": "bash",
                "arguments": {"command": 'echo "$DURABLE_HARNESS_IDEMPOTENCY_KEY" >> keys.log'},
            }
        ],
    },
    {"text": "Called."},
]


@pytest.mark.crash
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("point", "executions"),
    # after_tool_started: the effect never began, the retry is the only execution;
    # after_tool_effect: the effect ran, the retry runs it again with the same key
    [("after_tool_started", 1), ("after_tool_effect", 2)],
)
def test_idempotency_key_stable_across_retry(point: str, executions: int, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    spec = store_spec("jsonl", tmp_path)
    script = write_script(tmp_path / "script.json", TURNS)
    first = dh(
        "run", "call once", "--provider", f"scripted:{script}", "--store", spec,
        "--cwd", str(work), crash_at=point,
    )  # fmt: skip
    assert first.returncode == -signal.SIGKILL, first.stderr
    sid = session_id(first)

    lane = main_lane(plan_json(sid, spec))
    (call,) = lane["tool_calls"]
    assert (call["status"], call["action"]) == ("in_doubt", "await_decision")
    resumed = dh("resume", sid, "--store", spec, "--decide", f"{call['tool_call_id']}=retry")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr

    keys = (work / "keys.log").read_text().splitlines()
    assert len(keys) == executions
    expected = f"{lane['run_id']}:{call['call_key']}"
    assert set(keys) == {expected}

    records, _entries, _loc = read_session(spec, sid)
    intents = [r for r in records if r["type"] == "tool_started"]
    assert [r["attempt"] for r in intents] == [1, 2]
    assert {r["idempotencyKey"] for r in intents} == {expected}
    assert {r["toolCallId"] for r in intents} == {call["tool_call_id"]}
    # the retry's intent is written after the durable decision that allowed it
    (decision,) = [r for r in records if r["type"] == "decision"]
    assert intents[0]["seq"] < decision["seq"] < intents[1]["seq"]
