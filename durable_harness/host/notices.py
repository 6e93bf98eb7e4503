"""The notices a host owes its operators, derived from a session's durable facts
(``design/notify.md``): a call waiting for a decision, a decision given, a session that
entered ``error``, a run that ended after a crash recovery.

Pure functions of what the store holds (its records, and the recovery plan's waiting calls),
so a host that crashed before sending a notice derives the same notice, with the same event
id, after its restart. Delivery and receipts are :mod:`durable_harness.host.notify`'s.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any, Literal
from urllib.parse import quote

from durable_harness.host.listing import arguments_digest

NoticeKind = Literal["decision_due", "decided", "session_error", "run_recovered"]
"""What a notice is about (``design/notify.md``, "Events")."""

NOTICE_RECORD_TYPES = (
    "run_started",
    "tool_started",
    "decision",
    "run_finished",
    "session_lifecycle",
)
"""The record types :func:`derive_notices` reads."""


def event_id(kind: str, session_id: str, fact: str) -> str:
    """The stable id of a notice: 32 hex characters of SHA-256 over ``kind``, the session id
    and the durable ``fact`` it is about (a record id, or a call key and attempt), so a
    re-send, by this host or by the next one, carries the same id."""
    raw = "\0".join((kind, session_id, fact)).encode("utf-8", "surrogatepass")
    return hashlib.sha256(raw).hexdigest()[:32]


def console_link(base_url: str | None, session_id: str) -> str | None:
    """The console page of a session under ``base_url`` (``None`` when none is known)."""
    if not base_url:
        return None
    return f"{base_url.rstrip('/')}/console/sessions/{quote(session_id, safe='')}"


def _notice(kind: NoticeKind, session_id: str, fact: str, **fields: Any) -> dict[str, Any]:
    return {
        "event_id": event_id(kind, session_id, fact),
        "kind": kind,
        "session_id": session_id,
        "lane": None,
        "run_id": None,
        "call_id": None,
        "call_key": None,
        "tool": None,
        "arguments_digest": None,
        "doubt": None,
        **fields,
    }


def derive_notices(
    session_id: str,
    records: Iterable[Mapping[str, Any]],
    waiting: Iterable[Mapping[str, Any]] = (),
    base_url: str | None = None,
) -> list[dict[str, Any]]:
    """Every notice one session's facts call for, oldest fact first.

    Args:
        session_id: the session.
        records: its records of :data:`NOTICE_RECORD_TYPES` in ``seq`` order.
        waiting: the calls its recovery plan waits on
            (:func:`~durable_harness.host.listing.waiting_calls`).
        base_url: the console's base URL, for ``link``.

    Returns:
        notices: ``{"event_id", "kind", "session_id", "lane", "run_id", "call_id",
        "call_key", "tool", "arguments_digest", "doubt", "at", "link", ...}`` plus
        ``decision`` (``{"decision", "result", "author"}``) on ``decided``, ``error`` on
        ``session_error``, ``outcome`` on ``run_recovered``.
    """
    link = console_link(base_url, session_id)
    out: list[dict[str, Any]] = []
    intents: dict[tuple[str | None, str | None], Mapping[str, Any]] = {}
    run_start: dict[str | None, int] = {}
    generations: list[int] = []  # seqs of the `idle` records: a generation began there
    decided_runs: set[Any] = set()  # runs a decision was given in (only after a crash)
    for rec in records:
        rtype, seq = rec.get("type"), int(rec.get("seq") or 0)
        if rtype == "run_started":
            run_start[rec.get("runId")] = seq
        elif rtype == "tool_started":
            intents[(rec.get("runId"), rec.get("callKey"))] = rec
        elif rtype == "session_lifecycle" and rec.get("state") == "idle":
            generations.append(seq)
        elif rtype == "session_lifecycle" and rec.get("state") == "error":
            out.append(
                _notice(
                    "session_error",
                    session_id,
                    str(rec.get("id")),
                    error=rec.get("error"),
                    generation=rec.get("generation"),
                    at=rec.get("timestamp"),
                    link=link,
                )
            )
        elif rtype == "decision":
            decided_runs.add(rec.get("runId"))
            intent = intents.get((rec.get("runId"), rec.get("callKey"))) or {}
            out.append(
                _notice(
                    "decided",
                    session_id,
                    str(rec.get("id")),
                    lane=rec.get("lane"),
                    run_id=rec.get("runId"),
                    call_id=rec.get("toolCallId"),
                    call_key=rec.get("callKey"),
                    tool=intent.get("toolName"),
                    arguments_digest=arguments_digest(intent.get("arguments")) if intent else None,
                    attempt=rec.get("attempt"),
                    decision={
                        "decision": rec.get("decision"),
                        "result": rec.get("result"),
                        "author": rec.get("author") or "unknown",
                    },
                    at=rec.get("timestamp"),
                    link=link,
                )
            )
        elif rtype == "run_finished":
            began = run_start.get(rec.get("runId"))
            taken_over = began is not None and any(began < g < seq for g in generations)
            if taken_over or rec.get("runId") in decided_runs:
                out.append(
                    _notice(
                        "run_recovered",
                        session_id,
                        str(rec.get("id")),
                        lane=rec.get("lane"),
                        run_id=rec.get("runId"),
                        outcome=rec.get("outcome"),
                        reason=rec.get("reason"),
                        at=rec.get("timestamp"),
                        link=link,
                    )
                )
    for call in waiting:
        args = call.get("arguments")
        digest = call.get("arguments_digest") or arguments_digest(args)
        intent = intents.get((call.get("run_id"), call.get("call_key"))) or {}
        out.append(
            _notice(
                "decision_due",
                session_id,
                f"{call.get('call_key')}#{call.get('attempt')}",
                lane=call.get("lane"),
                run_id=call.get("run_id"),
                call_id=call.get("tool_call_id"),
                call_key=call.get("call_key"),
                tool=call.get("tool_name"),
                arguments_digest=digest,
                attempt=call.get("attempt"),
                doubt={"code": call.get("doubt"), "text": call.get("why")},
                at=intent.get("timestamp"),
                link=link,
            )
        )
    return out


def slack_text(notice: Mapping[str, Any]) -> str:
    """The one-paragraph text of a notice in a Slack incoming-webhook body."""
    sid, tool, call = notice.get("session_id"), notice.get("tool"), notice.get("call_id")
    link = notice.get("link")
    where = f"<{link}|session {sid}>" if link else f"session {sid}"
    kind = notice.get("kind")
    if kind == "decision_due":
        doubt = notice.get("doubt") or {}
        text = f"A decision is needed: {tool} call {call} in {where} — {doubt.get('text')}"
    elif kind == "decided":
        d = notice.get("decision") or {}
        text = f"Decided {d.get('decision')} by {d.get('author')}: {tool} call {call} in {where}"
    elif kind == "session_error":
        text = f"{where} entered error: {notice.get('error')}"
    else:
        text = f"A run of {where} ended {notice.get('outcome')} after a crash recovery"
    return text
