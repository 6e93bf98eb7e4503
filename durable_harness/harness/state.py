"""The state of a lane and of its open run, folded from the operation log.

The harness keeps a :class:`RunState` up to date by applying each record it commits; recovery
rebuilds the same state from storage with :func:`fold_run`. One fold for both means a resumed
run continues exactly where the live one would have.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from durable_harness.models.messages import text_of

ToolStatus = Literal["not_started", "in_doubt", "completed"]


@dataclass
class ToolCallState:
    """One tool call of the current turn.

    ``status``: ``not_started`` (no intent), ``in_doubt`` (intent without settlement) or
    ``completed`` (settled). ``replay`` is the intent's recorded declaration (``None`` before
    the intent). ``attempts`` counts ``tool_started`` intents for this call.
    """

    tool_call_id: str
    tool_name: str
    arguments: dict[str, Any]
    status: ToolStatus = "not_started"
    replay: str | None = None
    result_entry_id: str | None = None
    attempts: int = 0
    decision: dict[str, Any] | None = None
    process: dict[str, Any] | None = None


@dataclass
class PendingRequest:
    """A provider attempt whose intent is durable and whose settlement is not."""

    turn: int
    attempt: int
    response_entry_id: str
    purpose: str = "turn"


@dataclass
class RunState:
    """An open run, as its records say.

    Attributes:
        run_id, lane: identity.
        prompt_entry_id: the user entry the run started from.
        turns: number of assistant entries settled in this run.
        attempts: provider attempts per turn (counts ``provider_request_started``).
        pending: the in-flight provider attempt, if any.
        last_assistant_id: the latest assistant entry of the run.
        last_stop_reason: its ``stopReason``.
        tool_calls: the tool calls of the latest assistant entry, in order.
        save_point_after: True once a save point follows the latest assistant entry.
        abort_requested: an ``abort_requested`` record exists.
        cost_unknown_attempts: attempts whose outcome (and cost) is unknown (lost in a crash).
        outcome: set once ``run_finished`` is recorded.
    """

    run_id: str
    lane: str
    prompt_entry_id: str | None = None
    turns: int = 0
    attempts: dict[int, int] = field(default_factory=dict)
    pending: PendingRequest | None = None
    last_assistant_id: str | None = None
    last_stop_reason: str | None = None
    tool_calls: list[ToolCallState] = field(default_factory=list)
    save_point_after: bool = False
    abort_requested: bool = False
    cost_unknown_attempts: int = 0
    failed_attempts: int = 0
    outcome: str | None = None
    last_seq: int = 0
    prompt_text: str = ""

    def call(self, tool_call_id: str) -> ToolCallState | None:
        """Return the state of one tool call of the current turn."""
        for c in self.tool_calls:
            if c.tool_call_id == tool_call_id:
                return c
        return None

    def apply(self, rec: dict[str, Any], assistant: dict[str, Any] | None = None) -> None:
        """Fold one record into the state. ``assistant`` is the assistant message a
        ``provider_request_finished`` record settled (needed for its tool calls)."""
        rtype = rec.get("type")
        self.last_seq = max(self.last_seq, int(rec.get("seq", 0) or 0))
        if rtype == "run_started":
            self.prompt_entry_id = rec.get("promptEntryId")
            self.prompt_text = text_of((rec.get("prompt") or {}).get("content"))
        elif rtype == "provider_request_started":
            turn = int(rec.get("turn", self.turns + 1))
            if self.pending is not None:
                self.cost_unknown_attempts += 1
            self.attempts[turn] = self.attempts.get(turn, 0) + 1
            self.pending = PendingRequest(
                turn,
                int(rec.get("attempt", 1)),
                str(rec.get("responseEntryId")),
                str(rec.get("purpose", "turn")),
            )
        elif rtype == "provider_request_failed":
            self.pending = None
            self.failed_attempts += 1
        elif rtype == "provider_request_finished":
            self.pending = None
            if rec.get("purpose", "turn") != "turn":
                return
            self.turns += 1
            self.last_assistant_id = rec.get("entryId")
            self.last_stop_reason = rec.get("stopReason")
            self.save_point_after = False
            calls = []
            for block in (assistant or {}).get("content") or []:
                if isinstance(block, dict) and block.get("type") == "toolCall":
                    calls.append(
                        ToolCallState(
                            str(block.get("id")),
                            str(block.get("name")),
                            dict(block.get("arguments") or {}),
                        )
                    )
            self.tool_calls = calls
        elif rtype == "tool_started":
            c = self.call(str(rec.get("toolCallId")))
            if c is not None and c.status != "completed":
                c.status = "in_doubt"
                c.replay = rec.get("replay")
                c.result_entry_id = rec.get("resultEntryId")
                c.attempts += 1
                # a decision covers the intent it was given for: a new intent (the retry it
                # allowed) that is in doubt again needs a new decision
                c.decision = None
                c.process = None
        elif rtype == "tool_process":
            c = self.call(str(rec.get("toolCallId")))
            if c is not None and c.status == "in_doubt":
                c.process = {"pgid": rec.get("pgid"), "startTime": rec.get("startTime")}
        elif rtype == "tool_finished":
            c = self.call(str(rec.get("toolCallId")))
            if c is not None:
                c.status = "completed"
                c.result_entry_id = rec.get("resultEntryId")
        elif rtype == "decision":
            c = self.call(str(rec.get("toolCallId")))
            if c is not None:
                c.decision = {"decision": rec.get("decision"), "result": rec.get("result")}
        elif rtype == "save_point":
            self.save_point_after = True
        elif rtype == "abort_requested":
            self.abort_requested = True
        elif rtype == "run_finished":
            self.outcome = str(rec.get("outcome"))


@dataclass
class QueueItem:
    """An accepted queue item: ``queue`` (steer, follow_up, next_run), ``item_id``, ``message``
    (the user message to deliver), the ``seq`` of its receipt."""

    queue: str
    item_id: str
    message: dict[str, Any]
    seq: int


@dataclass
class LaneLog:
    """Lane-wide pending state: queue items and deferred writes not yet settled."""

    queue: list[QueueItem] = field(default_factory=list)
    deferred: list[dict[str, Any]] = field(default_factory=list)

    def apply(self, rec: dict[str, Any]) -> None:
        """Fold one record."""
        rtype = rec.get("type")
        if rtype == "queue_enqueued":
            self.queue.append(
                QueueItem(
                    str(rec.get("queue")),
                    str(rec.get("itemId")),
                    dict(rec.get("message") or {}),
                    int(rec.get("seq", 0)),
                )
            )
        elif rtype in ("queue_consumed", "queue_cancelled"):
            gone = set(rec.get("itemIds") or [])
            self.queue = [q for q in self.queue if q.item_id not in gone]
        elif rtype == "write_deferred":
            self.deferred.append(rec)
        elif rtype in ("save_point", "run_finished"):
            applied = set(rec.get("appliedWrites") or [])
            self.deferred = [d for d in self.deferred if d["id"] not in applied]

    def pending(self, queue: str) -> list[QueueItem]:
        """Items still waiting in one queue, oldest first."""
        return [q for q in self.queue if q.queue == queue]


def fold_lane(records: list[dict[str, Any]]) -> LaneLog:
    """Fold a lane's whole log into its pending queue items and deferred writes."""
    log = LaneLog()
    for rec in records:
        log.apply(rec)
    return log


def fold_run(run_id: str, lane: str, records: list[dict[str, Any]], get_entry: Any) -> RunState:
    """Rebuild a :class:`RunState` from the run's records (``get_entry`` fetches the assistant
    entries that ``provider_request_finished`` records point at)."""
    state = RunState(run_id, lane)
    for rec in records:
        assistant = None
        if rec.get("type") == "provider_request_finished" and rec.get("entryId"):
            entry = get_entry(rec["entryId"]) or {}
            assistant = entry.get("message")
        state.apply(rec, assistant)
    return state
