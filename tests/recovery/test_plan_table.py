"""Table-driven tests of the pure recovery planner: hand-written lane logs, folded with the
harness's own fold, planned with :func:`durable_harness.recovery.plan.plan`.

Each row is one situation a crash (or a corrupt store) can leave; it names the expected lane
``state``, ``next_action``, and per tool call ``status`` and ``action``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from durable_harness.recovery.decide import (
    RecoveryPlan,
    ToolDeclaration,
    plan,
)
from durable_harness.recovery.snapshot import Snapshot, build_snapshot
from durable_harness.storage.base import LaneState

RUN = "run-0001"

TOOLS = {
    "read_file": ToolDeclaration("safe"),
    "write_file": ToolDeclaration("never", can_reconcile=True),
    "append_file": ToolDeclaration("never"),
    "bash": ToolDeclaration("never"),
}


class Log:
    """A lane's operation log and the entries it points at, with a shared rising ``seq``."""

    def __init__(self, lane: str = "main") -> None:
        self.lane = lane
        self.seq = 0
        self.records: list[dict[str, Any]] = []
        self.entries: dict[str, dict[str, Any]] = {}
        self.leaf: str | None = None
        self.run_seq: int | None = None
        self.run_id: str | None = None

    def rec(self, rtype: str, run_id: str | None = RUN, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        r: dict[str, Any] = {"type": rtype, "id": f"r{self.seq}", "seq": self.seq}
        r["lane"] = self.lane
        if run_id is not None:
            r["runId"] = run_id
        r.update(fields)
        self.records.append(r)
        if rtype == "run_started":
            self.run_seq, self.run_id = self.seq, run_id
        elif rtype == "run_finished":
            self.run_seq, self.run_id = None, None
        return r

    def entry(self, eid: str, message: dict[str, Any]) -> dict[str, Any]:
        self.seq += 1
        e = {"type": "message", "id": eid, "parentId": self.leaf, "seq": self.seq}
        e["message"] = message
        self.entries[eid] = e
        self.leaf = eid
        return e

    # -- building blocks ---------------------------------------------------------------
    def start(self, run_id: str = RUN, **limits: int) -> Log:
        prompt = {"role": "user", "content": [{"type": "text", "text": "go"}]}
        self.entry(f"u-{run_id}", prompt)
        extra = {"limits": limits} if limits else {}
        self.rec("run_started", run_id, promptEntryId=f"u-{run_id}", prompt=prompt, **extra)
        return self

    def request(self, turn: int = 1, attempt: int = 1) -> Log:
        self.rec("provider_request_started", turn=turn, attempt=attempt, responseEntryId=f"a{turn}")
        return self

    def failed(self, turn: int = 1, attempt: int = 1) -> Log:
        self.rec("provider_request_failed", turn=turn, attempt=attempt, error="503")
        return self

    def answer(self, *calls: tuple[str, str], turn: int = 1) -> Log:
        """Settle turn ``turn`` with an assistant entry asking for ``(call id, tool)`` calls."""
        self.request(turn)
        content: list[dict[str, Any]] = [{"type": "text", "text": f"turn {turn}"}]
        content += [
            {"type": "toolCall", "id": cid, "name": name, "arguments": {"path": f"{cid}.txt"}}
            for cid, name in calls
        ]
        stop = "toolUse" if calls else "stop"
        self.entry(f"a{turn}", {"role": "assistant", "content": content, "stopReason": stop})
        self.rec(
            "provider_request_finished", turn=turn, attempt=1, entryId=f"a{turn}", stopReason=stop
        )
        return self

    def started(self, cid: str, name: str, replay: str, result_id: str | None = None) -> Log:
        self.rec(
            "tool_started",
            toolCallId=cid,
            toolName=name,
            arguments={"path": f"{cid}.txt"},
            resultEntryId=result_id or f"res-{cid}",
            replay=replay,
            idempotencyKey=f"{RUN}:{cid}",
        )
        return self

    def finished(self, cid: str, outcome: str = "ok", with_entry: bool = True) -> Log:
        if with_entry:
            self.entry(
                f"res-{cid}",
                {"role": "toolResult", "toolCallId": cid, "content": [{"type": "text"}]},
            )
        self.rec("tool_finished", toolCallId=cid, resultEntryId=f"res-{cid}", outcome=outcome)
        return self

    def snapshot(
        self, lease: dict[str, Any] | None = None, damage: list[dict[str, Any]] | None = None
    ) -> Snapshot:
        state = LaneState(self.lane, self.leaf, {}, self.run_id, self.run_seq)
        return build_snapshot(
            "sess-1",
            [state],
            {self.lane: self.records},
            self.entries.get,
            damage=damage,
            lease=lease,
        )


@dataclass
class Row:
    """One situation: how to build it, how to plan it, what the plan must say."""

    id: str
    build: Callable[[], Log]
    state: str
    next_action: str
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (id, status, action)
    kwargs: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    lease: dict[str, Any] | None = None
    extra: Callable[[RecoveryPlan], None] | None = None


def _queued_steer(p: RecoveryPlan) -> None:
    assert p.lane("main").queued == [{"queue": "steer", "itemId": "q1"}]


def _no_queue(p: RecoveryPlan) -> None:
    assert p.lane("main").queued == []


def _lost_attempt(p: RecoveryPlan) -> None:
    lp = p.lane("main")
    assert lp.attempts == {"turn 1": 1}
    assert lp.cost_unknown_attempts == 1


def _at_cap(p: RecoveryPlan) -> None:
    lp = p.lane("main")
    assert lp.attempts == {"turn 1": 5}
    assert lp.attempt_cap == 5


def _declared(p: RecoveryPlan) -> None:
    (c,) = p.lane("main").tool_calls
    assert (c.replay, c.declared_replay) == ("safe", "never")


def _decision_kept(p: RecoveryPlan) -> None:
    (c,) = p.lane("main").tool_calls
    assert c.decision == {"decision": "result", "result": "done by hand"}


ROWS = [
    Row("idle", lambda: Log(), "idle", "none"),
    Row(
        "idle_next_run_queued",
        lambda: _rec(
            Log(), "queue_enqueued", run_id=None, queue="next_run", itemId="n1", message={}
        ),
        "idle",
        "start_next_run",
    ),
    Row("run_started_only", lambda: Log().start(), "suspended", "issue_provider_request"),
    Row(
        "provider_request_in_flight",
        lambda: Log().start().request(),
        "suspended",
        "reissue_provider_request",
        reason="crash",
        extra=_lost_attempt,
    ),
    Row(
        "provider_attempt_cap_in_flight",
        lambda: _attempts(Log().start(), 4).request(attempt=5),
        "suspended",
        "park_failed_attempt_cap",
        extra=_at_cap,
    ),
    Row(
        "provider_attempt_cap_all_failed",
        lambda: _attempts(Log().start(), 5),
        "suspended",
        "park_failed_attempt_cap",
        extra=_at_cap,
    ),
    Row(
        "below_custom_cap",
        lambda: _attempts(Log().start(attemptCap=3), 1).request(attempt=2),
        "suspended",
        "reissue_provider_request",
    ),
    Row(
        "at_custom_cap",
        lambda: _attempts(Log().start(attemptCap=3), 2).request(attempt=3),
        "suspended",
        "park_failed_attempt_cap",
    ),
    Row(
        "no_intent",
        lambda: Log().start().answer(("c1", "bash")),
        "suspended",
        "resume_tool_calls",
        [("c1", "not_started", "execute")],
        reason="crash",
    ),
    Row(
        "in_doubt_replay_safe",
        lambda: Log().start().answer(("c1", "read_file")).started("c1", "read_file", "safe"),
        "suspended",
        "resume_tool_calls",
        [("c1", "in_doubt", "re-execute")],
        reason="crash",
    ),
    Row(
        "in_doubt_replay_never",
        lambda: Log().start().answer(("c1", "bash")).started("c1", "bash", "never"),
        "suspended",
        "await_decision",
        [("c1", "in_doubt", "await_decision")],
        reason="awaiting_decision",
    ),
    Row(
        "in_doubt_never_reconcile_can_tell",
        lambda: Log().start().answer(("c1", "write_file")).started("c1", "write_file", "never"),
        "suspended",
        "resume_tool_calls",
        [("c1", "in_doubt", "reconcile")],
        kwargs={"reconciled": {"a1/0": True}},
    ),
    Row(
        "in_doubt_never_reconcile_cannot_tell",
        lambda: Log().start().answer(("c1", "write_file")).started("c1", "write_file", "never"),
        "suspended",
        "await_decision",
        [("c1", "in_doubt", "await_decision")],
        kwargs={"reconciled": {"c1": False}},
        reason="awaiting_decision",
    ),
    Row(
        "recorded_safe_declared_never_today",
        lambda: Log().start().answer(("c1", "read_file")).started("c1", "read_file", "safe"),
        "suspended",
        "await_decision",
        [("c1", "in_doubt", "await_decision")],
        kwargs={"tools": {**TOOLS, "read_file": ToolDeclaration("never")}},
        extra=_declared,
    ),
    Row(
        "recorded_never_declared_safe_today",
        lambda: Log().start().answer(("c1", "read_file")).started("c1", "read_file", "never"),
        "suspended",
        "await_decision",
        [("c1", "in_doubt", "await_decision")],
    ),
    Row(
        "unknown_tool_today",
        lambda: Log().start().answer(("c1", "gone")).started("c1", "gone", "safe"),
        "suspended",
        "await_decision",
        [("c1", "in_doubt", "await_decision")],
    ),
    Row(
        "recorded_decision_retry",
        lambda: _rec(
            Log().start().answer(("c1", "bash")).started("c1", "bash", "never"),
            "decision",
            toolCallId="c1",
            decision="retry",
        ),
        "suspended",
        "resume_tool_calls",
        [("c1", "in_doubt", "re-execute")],
    ),
    Row(
        "recorded_decision_result",
        lambda: _rec(
            Log().start().answer(("c1", "bash")).started("c1", "bash", "never"),
            "decision",
            toolCallId="c1",
            decision="result",
            result="done by hand",
        ),
        "suspended",
        "resume_tool_calls",
        [("c1", "in_doubt", "apply_decision")],
        extra=_decision_kept,
    ),
    Row(
        # the retry a decision allowed was itself interrupted: a new intent in doubt needs a
        # new decision, the old one does not authorise a third execution
        "decision_retry_then_new_intent_in_doubt",
        lambda: _rec(
            Log().start().answer(("c1", "bash")).started("c1", "bash", "never"),
            "decision",
            toolCallId="c1",
            decision="retry",
        ).started("c1", "bash", "never"),
        "suspended",
        "await_decision",
        [("c1", "in_doubt", "await_decision")],
        reason="awaiting_decision",
    ),
    Row(
        "given_decision_fail",
        lambda: Log().start().answer(("c1", "bash")).started("c1", "bash", "never"),
        "suspended",
        "resume_tool_calls",
        [("c1", "in_doubt", "apply_decision")],
        kwargs={"decisions": {"c1": {"decision": "fail"}}},
    ),
    Row(
        "given_decision_retry",
        lambda: Log().start().answer(("c1", "bash")).started("c1", "bash", "never"),
        "suspended",
        "resume_tool_calls",
        [("c1", "in_doubt", "re-execute")],
        kwargs={"decisions": {"c1": {"decision": "retry"}}},
    ),
    Row(
        "policy_fail_in_doubt_never",
        lambda: Log().start().answer(("c1", "bash")).started("c1", "bash", "never"),
        "suspended",
        "resume_tool_calls",
        [("c1", "in_doubt", "fail")],
        kwargs={"policy": "fail-in-doubt"},
    ),
    Row(
        "policy_fail_in_doubt_safe",
        lambda: Log().start().answer(("c1", "read_file")).started("c1", "read_file", "safe"),
        "suspended",
        "resume_tool_calls",
        [("c1", "in_doubt", "fail")],
        kwargs={"policy": "fail-in-doubt"},
    ),
    Row(
        "policy_retry_safe_never",
        lambda: Log().start().answer(("c1", "bash")).started("c1", "bash", "never"),
        "suspended",
        "resume_tool_calls",
        [("c1", "in_doubt", "fail")],
        kwargs={"policy": "retry-safe"},
    ),
    Row(
        "policy_retry_safe_safe",
        lambda: Log().start().answer(("c1", "read_file")).started("c1", "read_file", "safe"),
        "suspended",
        "resume_tool_calls",
        [("c1", "in_doubt", "re-execute")],
        kwargs={"policy": "retry-safe"},
    ),
    Row(
        "policy_retry_safe_reconcile",
        lambda: Log().start().answer(("c1", "write_file")).started("c1", "write_file", "never"),
        "suspended",
        "resume_tool_calls",
        [("c1", "in_doubt", "reconcile")],
        kwargs={"policy": "retry-safe", "reconciled": {"a1/0": True}},
    ),
    Row(
        "mixed_batch",
        lambda: (
            Log()
            .start()
            .answer(("c1", "read_file"), ("c2", "bash"), ("c3", "append_file"))
            .started("c1", "read_file", "safe")
            .finished("c1")
            .started("c2", "bash", "never")
        ),
        "suspended",
        "await_decision",
        [
            ("c1", "completed", "none"),
            ("c2", "in_doubt", "await_decision"),
            ("c3", "not_started", "execute"),
        ],
        reason="awaiting_decision",
    ),
    Row(
        "abort_requested_in_doubt",
        lambda: _rec(
            Log().start().answer(("c1", "bash"), ("c2", "bash")).started("c1", "bash", "never"),
            "abort_requested",
        ),
        "suspended",
        "settle_aborted",
        [("c1", "in_doubt", "abort"), ("c2", "not_started", "abort")],
    ),
    Row(
        "abort_requested_in_flight",
        lambda: _rec(Log().start().request(), "abort_requested"),
        "suspended",
        "settle_aborted",
    ),
    Row(
        "completed_calls_no_save_point",
        lambda: Log().start().answer(("c1", "bash")).started("c1", "bash", "never").finished("c1"),
        "suspended",
        "save_point",
        [("c1", "completed", "none")],
    ),
    Row(
        "after_save_point",
        lambda: _rec(
            Log().start().answer(("c1", "bash")).started("c1", "bash", "never").finished("c1"),
            "save_point",
            turn=1,
        ),
        "suspended",
        "issue_provider_request",
        [("c1", "completed", "none")],
    ),
    Row(
        "final_answer_stored",
        lambda: Log().start().answer(),
        "suspended",
        "finish_run",
    ),
    Row(
        "steer_enqueued_not_consumed",
        lambda: _rec(
            Log().start().answer(("c1", "bash")).started("c1", "bash", "never").finished("c1"),
            "queue_enqueued",
            queue="steer",
            itemId="q1",
            message={"role": "user", "content": "steer"},
        ),
        "suspended",
        "save_point",
        [("c1", "completed", "none")],
        extra=_queued_steer,
    ),
    Row(
        "steer_enqueued_final_answer",
        lambda: _rec(
            Log().start().answer(),
            "queue_enqueued",
            queue="steer",
            itemId="q1",
            message={"role": "user", "content": "steer"},
        ),
        "suspended",
        "deliver_queued",
        extra=_queued_steer,
    ),
    Row(
        "steer_consumed",
        lambda: _rec(
            _rec(
                Log().start().answer(("c1", "bash")).started("c1", "bash", "never").finished("c1"),
                "queue_enqueued",
                queue="steer",
                itemId="q1",
                message={"role": "user", "content": "steer"},
            ),
            "queue_consumed",
            queue="steer",
            itemIds=["q1"],
        ),
        "suspended",
        "save_point",
        [("c1", "completed", "none")],
        extra=_no_queue,
    ),
    Row(
        "lease_held_by_live_process",
        lambda: Log().start().answer(("c1", "bash")).started("c1", "bash", "never"),
        "running",
        "none_held_by_live_process",
        [("c1", "in_doubt", "await_decision")],
        lease={"pid": 4242, "host": "h", "generation": 3},
    ),
]


def _rec(log: Log, rtype: str, **fields: Any) -> Log:
    log.rec(rtype, **fields)
    return log


def _attempts(log: Log, n: int) -> Log:
    for i in range(1, n + 1):
        log.request(attempt=i).failed(attempt=i)
    return log


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_plan_row(row: Row) -> None:
    log = row.build()
    kwargs = dict(row.kwargs)
    tools = kwargs.pop("tools", TOOLS)
    p = plan(log.snapshot(row.lease), tools, **kwargs)
    lp = p.lane("main")
    assert (lp.state, lp.next_action) == (row.state, row.next_action)
    assert [(c.tool_call_id, c.status, c.action) for c in lp.tool_calls] == row.calls
    if row.reason is not None:
        assert lp.reason == row.reason
    if row.state == "idle":
        assert lp.run_id is None
    else:
        assert lp.run_id == RUN
    assert lp.abort_requested == (row.next_action == "settle_aborted")
    if row.lease is not None:
        assert p.lease == row.lease
        assert lp.reason is None
    assert p.damage == []
    if row.extra:
        row.extra(p)


def test_plan_is_pure_and_repeatable() -> None:
    log = Log().start().answer(("c1", "bash"), ("c2", "read_file"))
    log.started("c1", "bash", "never").started("c2", "read_file", "safe")
    before = copy.deepcopy((log.records, log.entries))
    snap = log.snapshot()
    first = plan(snap, TOOLS).to_json()
    second = plan(snap, TOOLS).to_json()
    assert first == second
    assert (log.records, log.entries) == before


def test_decisions_given_do_not_leak_into_other_calls() -> None:
    log = Log().start().answer(("c1", "bash"), ("c2", "bash"))
    log.started("c1", "bash", "never").started("c2", "bash", "never")
    p = plan(log.snapshot(), TOOLS, decisions={"c1": {"decision": "result", "result": "x"}})
    actions = {c.tool_call_id: c.action for c in p.lane("main").tool_calls}
    assert actions == {"c1": "apply_decision", "c2": "await_decision"}
    assert p.lane("main").next_action == "await_decision"


def test_deferred_write_listed_until_applied() -> None:
    log = Log().start().answer(("c1", "bash")).started("c1", "bash", "never").finished("c1")
    log.rec("write_deferred", write={"type": "model_change"})
    wid = log.records[-1]["id"]
    assert plan(log.snapshot(), TOOLS).lane("main").deferred_writes == [wid]
    log.rec("save_point", turn=1, appliedWrites=[wid])
    assert plan(log.snapshot(), TOOLS).lane("main").deferred_writes == []


# -- corruption: reported in damage, never repaired ---------------------------------------


def _two_open_runs() -> Log:
    log = Log().start()
    # a second run_started with the same run id while the first is open: a single writer
    # cannot produce it
    log.rec("run_started", promptEntryId="u-x", prompt={"role": "user", "content": "again"})
    log.run_seq = 1
    return log


def _finished_without_started() -> Log:
    return Log().start().answer(("c1", "bash")).finished("c1", outcome="ok")


def _result_id_holds_other_content() -> Log:
    log = Log().start().answer(("c1", "bash"), ("c2", "bash"))
    log.started("c1", "bash", "never").finished("c1")
    # c2's intent provisions the id already used by c1's result
    log.started("c2", "bash", "never", result_id="res-c1")
    return log


CORRUPT = [
    ("two_open_runs", _two_open_runs, "two_open_runs"),
    ("tool_finished_without_tool_started", _finished_without_started, "settlement_without_intent"),
    ("provisioned_id_other_content", _result_id_holds_other_content, "id_conflict"),
]


@pytest.mark.parametrize(("build", "kind"), [c[1:] for c in CORRUPT], ids=[c[0] for c in CORRUPT])
def test_corruption_reported_never_repaired(build: Callable[[], Log], kind: str) -> None:
    log = build()
    before = copy.deepcopy((log.records, log.entries))
    p = plan(log.snapshot(), TOOLS)
    kinds = [d["kind"] for d in p.damage]
    assert kind in kinds
    item = next(d for d in p.damage if d["kind"] == kind)
    assert item["lane"] == "main"
    assert isinstance(item.get("seq"), int)
    assert item["detail"]
    assert (log.records, log.entries) == before  # nothing repaired, nothing rewritten
    json.dumps(p.to_json())


def test_settled_error_without_intent_is_not_corruption() -> None:
    # an unknown tool or bad arguments settle with outcome "error" and no intent
    log = Log().start().answer(("c1", "bash")).finished("c1", outcome="error")
    assert plan(log.snapshot(), TOOLS).damage == []


def test_storage_damage_passes_through() -> None:
    log = Log().start()
    snap = log.snapshot(damage=[{"kind": "torn_tail", "offset": 123, "detail": "cut"}])
    assert plan(snap, TOOLS).damage == [{"kind": "torn_tail", "offset": 123, "detail": "cut"}]


# -- the JSON contract of ``recover --json`` ---------------------------------------------


def test_json_contract() -> None:
    log = Log().start().answer(("c1", "read_file"), ("c2", "bash"), ("c3", "append_file"))
    log.started("c1", "read_file", "safe").finished("c1").started("c2", "bash", "never")
    data = json.loads(json.dumps(plan(log.snapshot(), TOOLS).to_json()))
    assert {"session_id", "lanes", "damage"} <= set(data)
    assert data["session_id"] == "sess-1"
    assert isinstance(data["damage"], list)
    (lane,) = data["lanes"]
    assert {"lane", "state", "run_id", "abort_requested", "next_action", "tool_calls"} <= set(lane)
    assert lane["lane"] == "main"
    assert lane["run_id"] == RUN
    assert lane["abort_requested"] is False
    calls = lane["tool_calls"]
    assert [c["tool_call_id"] for c in calls] == ["c1", "c2", "c3"]
    for c in calls:
        assert {"tool_call_id", "tool_name", "status", "replay"} <= set(c)
        assert c["status"] in ("not_started", "in_doubt", "completed")
    assert [c["status"] for c in calls] == ["completed", "in_doubt", "not_started"]
    assert [c["replay"] for c in calls] == ["safe", "never", "never"]
    assert [c["tool_name"] for c in calls] == ["read_file", "bash", "append_file"]


@pytest.mark.parametrize("build", [c[1] for c in CORRUPT], ids=[c[0] for c in CORRUPT])
def test_json_contract_damage_items_have_kind_and_offset_or_line(
    build: Callable[[], Log],
) -> None:
    # brief section 4: "Each damage item has `kind` and `offset` or `line`" -- the planner's
    # corruption items too (their exact position is the record's ``seq``)
    snap = build().snapshot(damage=[{"kind": "bad_line", "line": 7, "detail": "not JSON"}])
    data = plan(snap, TOOLS).to_json()
    assert len(data["damage"]) >= 2
    for d in data["damage"]:
        assert "kind" in d
        assert "offset" in d or "line" in d, d
