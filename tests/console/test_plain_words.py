"""The plain words of a waiting call (``durable_harness/recovery/explain.py``), which the
console's decision panel and confirmation, and the HTTP API's listing, show."""

from __future__ import annotations

from datetime import datetime

from durable_harness.recovery.decide import ToolCallPlan
from durable_harness.recovery.explain import choice, choices, clock, why_in_doubt


def call(**fields: object) -> ToolCallPlan:
    base: dict[str, object] = {
        "tool_call_id": "c1",
        "tool_name": "bash",
        "status": "in_doubt",
        "replay": "never",
        "action": "await_decision",
        "call_key": "e/0",
        "doubt": "intent_unsettled",
        "attempts": 1,
    }
    return ToolCallPlan(**(base | fields))  # type: ignore[arg-type]


def test_an_unsettled_intent_reads_as_a_sentence_with_the_local_hour() -> None:
    stamp = "2026-03-01T14:02:31.120Z"
    hour = datetime.fromisoformat(stamp.replace("Z", "+00:00")).astimezone().strftime("%H:%M")
    assert clock(stamp) == hour
    assert why_in_doubt(call(), stamp) == (
        f"started before the crash at {hour}; no result was recorded; "
        "this tool is not safe to run twice"
    )
    assert why_in_doubt(call()) == (
        "started before the crash; no result was recorded; this tool is not safe to run twice"
    )
    assert clock("not a time") is None and clock(None) is None


def test_other_reasons_replay_attempts_and_processes_are_said() -> None:
    damaged = why_in_doubt(call(doubt="damaged_log", replay=None, declared_replay="safe"))
    assert damaged.startswith("the log lost records, so it may have started before the crash")
    assert "this tool says it is safe to run again" in damaged
    unknown = why_in_doubt(call(replay=None, attempts=3))
    assert "does not say whether it is safe to run twice" in unknown
    assert unknown.endswith("it was started 3 times")
    running = why_in_doubt(call(process={"pgid": 4242, "alive": True}))
    assert running.endswith("its process (group 4242) is still running")
    elsewhere = why_in_doubt(call(process={"pgid": 7, "alive": None, "host": "box-2"}))
    assert elsewhere.endswith("its process may still run on host box-2")


def test_each_choice_says_what_it_will_do() -> None:
    labels = [(c.decision, c.label) for c in choices(call())]
    assert labels == [
        ("retry", "Run bash again"),
        ("fail", "Mark bash failed"),
        ("result", "Give bash a result"),
    ]
    assert choice(call(), "retry").summary.startswith("Run bash again with the same arguments")  # type: ignore[union-attr]
    assert choice(call(), "nonsense") is None


def test_a_still_running_process_is_stopped_first_and_another_hosts_can_be_overridden() -> None:
    alive = call(process={"pgid": 4242, "alive": True})
    for c in choices(alive):
        assert c.summary.startswith("Stop its still-running process first, then "), c
    elsewhere = call(process={"pgid": 7, "alive": None, "host": "box-2"})
    assert [c.decision for c in choices(elsewhere)] == ["retry", "retry!", "fail", "result"]
    assert choice(elsewhere, "retry!").label == "Run bash again anyway"  # type: ignore[union-attr]
