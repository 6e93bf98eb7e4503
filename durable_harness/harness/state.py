"""The state of a lane and of its open run, folded from the operation log.

The harness keeps a :class:`RunState` up to date by applying each record it commits; recovery
rebuilds the same state from storage with :func:`fold_run`. One fold for both means a resumed
run continues exactly where the live one would have.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from durable_harness.models.content import text_of, tool_call_blocks

if TYPE_CHECKING:
    from durable_harness.storage.base import LaneState, SessionStore

ToolStatus = Literal["not_started", "in_doubt", "completed"]

#: What a provider request is for: a run's turn, or a summary the run loop asks for.
Purpose = Literal["turn", "compaction", "branch_summary"]


def call_key(entry_id: str, index: int) -> str:
    """The identity of a tool call inside its run: ``"<assistant entry id>/<index>"``, the
    entry that asked for it and the call's position among its tool calls. Unique in the run
    whatever ids the provider gave (providers do repeat ids)."""
    return f"{entry_id}/{index}"


def attempt_key(purpose: str, turn: int) -> str:
    """The counter a provider attempt counts against: ``"turn 3"``, ``"compaction 3"`` (the
    compaction before turn 3), ``"branch_summary 0"``. The attempt cap applies per key."""
    return f"{purpose} {turn}"


@dataclass(frozen=True)
class RunLimits:
    """The bounds a run was started with, recorded in its ``run_started`` (``limits``) so a
    resumed run is held to the same ones (``design/run-loop.md``).

    Attributes:
        attempt_cap: provider attempts per turn (and per summary), across restarts.
        max_turns: assistant turns per run; the run fails when it would take one more.
        max_tool_calls: tool calls per run; a turn that asks for more fails the run before
            any of its calls starts.
    """

    attempt_cap: int = 5
    max_turns: int = 50
    max_tool_calls: int = 500

    def to_record(self) -> dict[str, int]:
        """The ``limits`` field of ``run_started``."""
        return {
            "attemptCap": self.attempt_cap,
            "maxTurns": self.max_turns,
            "maxToolCalls": self.max_tool_calls,
        }

    @classmethod
    def from_record(cls, value: Any, default: RunLimits | None = None) -> RunLimits:
        """Read ``limits`` back; a field missing (older logs) or not a positive integer
        takes the value of ``default``."""
        base = default or cls()
        data = value if isinstance(value, dict) else {}

        def pick(name: str, fallback: int) -> int:
            v = data.get(name)
            return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else fallback

        return cls(
            pick("attemptCap", base.attempt_cap),
            pick("maxTurns", base.max_turns),
            pick("maxToolCalls", base.max_tool_calls),
        )


@dataclass
class ToolCallState:
    """One tool call of the current turn.

    ``key``: the call's identity in the run (:func:`call_key`); ``tool_call_id``: the id the
    provider sees; ``status``: ``not_started`` (no intent), ``in_doubt`` (intent without
    settlement) or ``completed``; ``replay``: the intent's recorded declaration; ``attempts``:
    its ``tool_started`` intents; ``decision`` (``{"decision", "result"}``) and
    ``decided_seq``: the decision on record for the current attempt (a new intent clears them:
    ``design/recovery.md``, "Attempts").
    """

    key: str
    tool_call_id: str
    tool_name: str
    arguments: dict[str, Any]
    status: ToolStatus = "not_started"
    replay: str | None = None
    result_entry_id: str | None = None
    attempts: int = 0
    decision: dict[str, Any] | None = None
    decided_seq: int | None = None
    process: dict[str, Any] | None = None


@dataclass
class PendingRequest:
    """A provider attempt whose intent is durable and whose settlement is not."""

    turn: int
    attempt: int
    response_entry_id: str
    purpose: str = "turn"
    #: the attempt counter it counts against (:func:`attempt_key`)
    key: str = field(init=False)

    def __post_init__(self) -> None:
        self.key = attempt_key(self.purpose, self.turn)


@dataclass
class RunState:
    """An open run, as its records say.

    Attributes:
        run_id, lane: identity.
        prompt_entry_id: the user entry the run started from.
        turns: number of assistant entries settled in this run.
        attempts: provider attempts per :func:`attempt_key` (counts
            ``provider_request_started``).
        limits: the bounds recorded in ``run_started``.
        tool_calls_total: tool calls asked for by every turn of the run so far.
        unknown_refs: records of the run that name a tool call the run does not have
            (``{"seq", "type", "toolCallId"}``): damage, reported by recovery.
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
    attempts: dict[str, int] = field(default_factory=dict)
    limits: RunLimits = field(default_factory=RunLimits)
    tool_calls_total: int = 0
    unknown_refs: list[dict[str, Any]] = field(default_factory=list)
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

    def call(self, key: str) -> ToolCallState | None:
        """Return one tool call of the current turn by its key, or by its provider id when
        that id names exactly one call."""
        for c in self.tool_calls:
            if c.key == key:
                return c
        same = [c for c in self.tool_calls if c.tool_call_id == key]
        return same[0] if len(same) == 1 else None

    def _target(self, rec: dict[str, Any], statuses: tuple[str, ...]) -> ToolCallState | None:
        """The call a tool record is about: by ``callKey``; for records written before call
        keys existed, the first call with the record's ``toolCallId`` in the first of
        ``statuses`` (in order of preference) that has one.
        A record naming no call of the turn, or whose ``toolCallId`` is not the provider id
        of the call its ``callKey`` names, is kept in :attr:`unknown_refs`."""
        key = rec.get("callKey")
        found: ToolCallState | None = None
        if isinstance(key, str):
            for c in self.tool_calls:
                if c.key == key:
                    found = c
                    break
        else:
            same = [c for c in self.tool_calls if c.tool_call_id == str(rec.get("toolCallId"))]
            ranked = [c for status in statuses for c in same if c.status == status]
            found = next(iter(ranked or same), None)
        given = rec.get("toolCallId")
        if found is None or (given is not None and str(given) != found.tool_call_id):
            # no such call, or a call key and a provider id naming different calls: a single
            # writer writes neither (the record still applies to the call its key names)
            ref = {"seq": rec.get("seq"), "type": rec.get("type")}
            self.unknown_refs.append({**ref, "toolCallId": given})
        return found

    def apply(self, rec: dict[str, Any], assistant: dict[str, Any] | None = None) -> None:
        """Fold one record into the state. ``assistant`` is the assistant message a
        ``provider_request_finished`` record settled (needed for its tool calls)."""
        seq = rec.get("seq")
        if seq:  # records the harness folds as it commits them have none yet
            self.last_seq = max(self.last_seq, int(seq))
        rtype = rec.get("type")
        fold = _RUN_FOLDS.get(rtype) if type(rtype) is str else None
        if fold is not None:  # one lookup, not a chain of comparisons: 5 records a turn
            fold(self, rec, assistant)

    def _run_started(self, rec: dict[str, Any], assistant: dict[str, Any] | None) -> None:
        self.limits = RunLimits.from_record(rec.get("limits"), self.limits)
        self.prompt_entry_id = rec.get("promptEntryId")
        self.prompt_text = text_of((rec.get("prompt") or {}).get("content"))

    def _request_started(self, rec: dict[str, Any], assistant: dict[str, Any] | None) -> None:
        turn = int(rec.get("turn", self.turns + 1))
        if self.pending is not None:
            self.cost_unknown_attempts += 1
        pending = PendingRequest(
            turn,
            int(rec.get("attempt", 1)),
            str(rec.get("responseEntryId")),
            str(rec.get("purpose", "turn")),
        )
        self.attempts[pending.key] = self.attempts.get(pending.key, 0) + 1
        self.pending = pending

    def _request_failed(self, rec: dict[str, Any], assistant: dict[str, Any] | None) -> None:
        self.pending = None
        self.failed_attempts += 1

    def _request_finished(self, rec: dict[str, Any], assistant: dict[str, Any] | None) -> None:
        self.pending = None
        if rec.get("purpose", "turn") != "turn":
            return
        self.turns += 1
        self.last_assistant_id = rec.get("entryId")
        self.last_stop_reason = rec.get("stopReason")
        self.save_point_after = False
        entry_id = str(rec.get("entryId"))
        blocks = tool_call_blocks((assistant or {}).get("content"))
        self.tool_calls = [
            ToolCallState(
                call_key(entry_id, i),
                str(b.get("id")),
                str(b.get("name")),
                dict(b.get("arguments") or {}),
            )
            for i, b in enumerate(blocks)
        ]
        self.tool_calls_total += len(blocks)

    def _tool_started(self, rec: dict[str, Any], assistant: dict[str, Any] | None) -> None:
        c = self._target(rec, ("not_started", "in_doubt"))
        if c is not None and c.status != "completed":
            c.status = "in_doubt"
            c.replay = rec.get("replay")
            c.result_entry_id = rec.get("resultEntryId")
            c.attempts += 1
            # a decision covers the intent it was given for: a new intent (the retry it
            # allowed) that is in doubt again needs a new decision
            c.decision = None
            c.decided_seq = None
            c.process = None

    def _tool_process(self, rec: dict[str, Any], assistant: dict[str, Any] | None) -> None:
        c = self._target(rec, ("in_doubt",))
        if c is not None and c.status == "in_doubt":
            c.process = {"pgid": rec.get("pgid"), "startTime": rec.get("startTime")}
            if isinstance(rec.get("host"), str):
                c.process["host"] = rec["host"]

    def _tool_process_killed(self, rec: dict[str, Any], assistant: dict[str, Any] | None) -> None:
        # the group is known dead: nothing is left to kill, report or wait for; the call
        # stays in doubt (its effect may have landed before the kill)
        c = self._target(rec, ("in_doubt",))
        process = c.process if c is not None and c.status == "in_doubt" else None
        if c is not None and process is not None and process.get("pgid") == rec.get("pgid"):
            c.process = None

    def _tool_finished(self, rec: dict[str, Any], assistant: dict[str, Any] | None) -> None:
        c = self._target(rec, ("in_doubt", "not_started"))
        if c is not None:
            c.status = "completed"
            c.result_entry_id = rec.get("resultEntryId")

    def _decision(self, rec: dict[str, Any], assistant: dict[str, Any] | None) -> None:
        c = self._target(rec, ("in_doubt", "not_started"))
        # a decision decides the attempt it names (``attempt``; records written before
        # attempts were named decide the current one)
        if c is not None and rec.get("attempt", c.attempts) == c.attempts:
            c.decision = {"decision": rec.get("decision"), "result": rec.get("result")}
            c.decided_seq = rec.get("seq")

    def _save_point(self, rec: dict[str, Any], assistant: dict[str, Any] | None) -> None:
        self.save_point_after = True

    def _abort_requested(self, rec: dict[str, Any], assistant: dict[str, Any] | None) -> None:
        self.abort_requested = True

    def _run_finished(self, rec: dict[str, Any], assistant: dict[str, Any] | None) -> None:
        self.outcome = str(rec.get("outcome"))


_RUN_FOLDS: dict[str, Callable[[RunState, dict[str, Any], dict[str, Any] | None], None]] = {
    "run_started": RunState._run_started,
    "provider_request_started": RunState._request_started,
    "provider_request_failed": RunState._request_failed,
    "provider_request_finished": RunState._request_finished,
    "tool_started": RunState._tool_started,
    "tool_process": RunState._tool_process,
    "tool_process_killed": RunState._tool_process_killed,
    "tool_finished": RunState._tool_finished,
    "decision": RunState._decision,
    "save_point": RunState._save_point,
    "abort_requested": RunState._abort_requested,
    "run_finished": RunState._run_finished,
}
"""What :meth:`RunState.apply` does with each record type it reads (any other: nothing)."""


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
    """Lane-wide pending state: queue items and deferred writes not yet settled, and the
    attempts of summaries asked for outside any run (``summary_attempts``: attempts per purpose
    since that purpose's last finished request; a crash loop counts up to the cap)."""

    queue: list[QueueItem] = field(default_factory=list)
    deferred: list[dict[str, Any]] = field(default_factory=list)
    summary_attempts: dict[str, int] = field(default_factory=dict)

    #: the record types :meth:`apply` reads; any other leaves the lane log as it is
    FOLDED: ClassVar[frozenset[str]] = frozenset(
        {
            "provider_request_started",
            "provider_request_finished",
            "provider_request_failed",
            "queue_enqueued",
            "queue_consumed",
            "queue_cancelled",
            "write_deferred",
            "save_point",
            "run_finished",
        }
    )

    def apply(self, rec: dict[str, Any]) -> None:
        """Fold one record (of a type in :attr:`FOLDED`; any other changes nothing)."""
        rtype = rec.get("type")
        if rec.get("runId") is None and rtype in (
            "provider_request_started",
            "provider_request_finished",
            "provider_request_failed",
        ):
            purpose = str(rec.get("purpose", "turn"))
            used = self.summary_attempts.get(purpose, 0)
            if rtype == "provider_request_started":
                self.summary_attempts[purpose] = used + 1
            elif rtype == "provider_request_finished":
                self.summary_attempts[purpose] = 0
        elif rtype == "queue_enqueued":
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


def open_run(store: SessionStore, lane: LaneState) -> RunState | None:
    """The lane's open run, folded from ``store`` (``None`` when the lane has none).

    Raises:
        StorageError: the session cannot be read.
    """
    if lane.run_id is None or lane.run_seq is None:
        return None
    recs = store.records(lane.name, run_id=lane.run_id, since_seq=lane.run_seq - 1)
    return fold_run(lane.run_id, lane.name, recs, store.get_entry)


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
