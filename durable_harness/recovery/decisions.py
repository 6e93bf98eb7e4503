"""Decision records: the one function that writes them, used by the harness (a resume that
acts on decisions) and the host (decisions kept while other calls still wait).

A ``decision`` record names the call (``toolCallId``, ``callKey``) and the **attempt** it
decides (``attempt``: the number of ``tool_started`` intents of the call when it was given,
0 for a call whose intent a damaged log may have lost). What a decision may name, and that a
decision on record for an attempt is never replaced, is decided before anything is written, by
:func:`durable_harness.recovery.decide.resolve_decisions` (``design/recovery.md``,
"Attempts").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from durable_harness.harness.records import BuiltRecord, CallRef, record
from durable_harness.storage.base import RecordOp, SessionStore

if TYPE_CHECKING:
    from durable_harness.recovery.decide import RecoveryPlan


class DecidableCall(CallRef, Protocol):
    """What a decision record needs to know of a call (:class:`~durable_harness.harness.
    records.CallRef`, and its attempts)."""

    @property
    def attempts(self) -> int:
        """The call's ``tool_started`` intents so far: the attempt a decision decides."""


def decision_record(
    lane: str, run_id: str, call: DecidableCall, decision: Mapping[str, Any]
) -> BuiltRecord:
    """The ``decision`` record (declared in :mod:`durable_harness.models.records`) of
    ``decision`` (``{"decision": "retry"|"fail"|"result", "result": text, "force": bool,
    "author": text}``)
    for the current attempt of ``call`` in run ``run_id`` of ``lane``; ``force`` (a ``retry!``
    of a call whose group may run on another machine, ``design/recovery.md``) is written only
    when true, ``author`` when given (``design/notify.md``)."""
    return record(
        "decision",
        lane,
        run_id,
        toolCallId=call.tool_call_id,
        callKey=call.key,
        attempt=call.attempts,
        decision=decision.get("decision"),
        result=decision.get("result"),
        **({"force": True} if decision.get("force") else {}),
        **({"author": str(decision["author"])} if decision.get("author") else {}),
    )


def decision_ops(
    lane: str,
    run_id: str,
    calls: Iterable[DecidableCall],
    decisions: Mapping[str, Mapping[str, Any]],
) -> list[RecordOp]:
    """The record operations that make ``decisions`` (``{call key: decision}``, as
    :func:`~durable_harness.recovery.decide.resolve_decisions` returned them) durable for the
    ``calls`` of one run, in the calls' order. A key that names none of ``calls`` is left out
    (it belongs to another lane's run). Committing them is the caller's (one commit: every
    decision of a request is durable together, or none is)."""
    return [
        RecordOp(decision_record(lane, run_id, c, decisions[c.key]))
        for c in calls
        if c.key in decisions
    ]


def commit_decisions(
    store: SessionStore, plan: RecoveryPlan, decisions: Mapping[str, Mapping[str, Any]]
) -> None:
    """Make ``decisions`` (by call key, as resolved for ``plan``) durable in one commit on
    ``store`` (open for writing) without acting on them: the host's way to keep a decision
    given while other calls still wait (the plan reads recorded decisions back from the log).

    Raises:
        StorageError: the commit failed (then nothing of it is stored).
    """
    ops = [
        op
        for lp in plan.lanes
        if lp.run_id is not None
        for op in decision_ops(lp.lane, lp.run_id, lp.tool_calls, decisions)
    ]
    if ops:
        store.commit(list(ops))
