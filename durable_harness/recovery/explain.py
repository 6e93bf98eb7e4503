"""Plain-language words for a call that waits for a decision: why it is in doubt and what
each decision will do (``design/console.md``, "The decision panel speaks plainly").

Written once, from the plan's own fields (``doubt``, ``replay``, ``attempts``, ``process``),
so the console, the HTTP API's listing and the notices say the same thing. Pure: no I/O; the
clock only turns a recorded timestamp into the reader's local hour.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from durable_harness.recovery.decide import ToolCallPlan


def clock(timestamp: str | None) -> str | None:
    """``HH:MM`` (the machine's local time) of an ISO 8601 ``timestamp``, or ``None``."""
    if not timestamp:
        return None
    try:
        moment = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.astimezone().strftime("%H:%M")


def why_in_doubt(call: ToolCallPlan, started_at: str | None = None) -> str:
    """Why ``call`` waits, in plain words, e.g. ``"started before the crash at 14:02; no
    result was recorded; this tool is not safe to run twice"``.

    ``started_at``: the timestamp of the call's latest ``tool_started`` record (``None``:
    unknown; the hour is then left out). The reasons come from ``call.doubt`` (the codes of
    :func:`~durable_harness.recovery.decide.in_doubt`), its replay declaration (recorded, else
    today's), its attempts and its recorded process group.
    """
    parts: list[str] = []
    at = clock(started_at)
    if call.doubt == "damaged_log":
        parts.append("the log lost records, so it may have started before the crash")
    else:
        parts.append(f"started before the crash at {at}" if at else "started before the crash")
    parts.append("no result was recorded")
    replay = call.replay or call.declared_replay
    if replay == "never":
        parts.append("this tool is not safe to run twice")
    elif replay == "safe":
        parts.append("this tool says it is safe to run again")
    else:
        parts.append("this tool does not say whether it is safe to run twice")
    if call.attempts > 1:
        parts.append(f"it was started {call.attempts} times")
    process: Mapping[str, Any] = call.process or {}
    if call.kills_group:
        parts.append(f"its process (group {process.get('pgid')}) is still running")
    elif process.get("alive") is None and process.get("host"):
        parts.append(f"its process may still run on host {process.get('host')}")
    return "; ".join(parts)


@dataclass(frozen=True)
class Choice:
    """One decision the operator can take on a waiting call: ``decision`` (the form value:
    ``retry``, ``retry!``, ``fail``, ``result``), ``label`` (the button: what it will do) and
    ``summary`` (the confirmation page's sentence)."""

    decision: str
    label: str
    summary: str


def choices(call: ToolCallPlan) -> list[Choice]:
    """The decisions offered for ``call``, each saying what it will do. A process group
    alive here is stopped first (the host kills a dead generation's group before it runs
    anything: ``design/host.md``), and the words say so; ``retry!`` is offered only when the
    group was started on another machine and may still run there."""
    tool = call.tool_name
    process: Mapping[str, Any] = call.process or {}
    alive = call.kills_group

    def first(text: str) -> str:
        return (
            f"Stop its still-running process first, then {text}"
            if alive
            else (text[0].upper() + text[1:])
        )

    out = [
        Choice(
            "retry",
            f"Run {tool} again",
            first(f"run {tool} again with the same arguments (it may have taken effect already)."),
        )
    ]
    if process.get("alive") is None and process.get("host"):
        out.append(
            Choice(
                "retry!",
                f"Run {tool} again anyway",
                f"Run {tool} again although its process may still run on host "
                f"{process.get('host')} (it may run twice at once).",
            )
        )
    out.append(
        Choice(
            "fail",
            f"Mark {tool} failed",
            first(
                f"mark the {tool} call failed: it is not run again and the model is told it "
                "did not complete."
            ),
        )
    )
    out.append(
        Choice(
            "result",
            f"Give {tool} a result",
            first(
                f"settle the {tool} call with the text below, as if the tool had returned it; "
                "it is not run again."
            ),
        )
    )
    return out


def choice(call: ToolCallPlan, decision: str) -> Choice | None:
    """The :class:`Choice` of ``call`` whose form value is ``decision``, or ``None``."""
    return next((c for c in choices(call) if c.decision == decision), None)
