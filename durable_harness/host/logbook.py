"""The host's structured log of its sessions' lives (``design/observability.md``, "Logs"):
:class:`HostLog` turns the manager's events into :func:`~durable_harness.logs.event` records
(lifecycle changes, runs started and ended, suspensions), each with session id, generation,
lane and run id. Every :class:`~durable_harness.host.manager.SessionManager` feeds one; the
claims, resumes, decisions and kills are logged where they happen."""

from __future__ import annotations

import logging
import threading
from typing import Any

from durable_harness import logs
from durable_harness.harness.core import Event

log = logging.getLogger("durable_harness.host")

_LOGGED = frozenset({"lifecycle", "run_start", "run_end", "suspended"})


class HostLog:
    """A manager observer (``manager.observe(HostLog().observe)``) logging on the
    ``durable_harness.host`` logger. A lifecycle event is logged only when the state changes
    (the manager republishes the state after each harness event). Never raises; costs one
    set lookup and one level check per event when nothing listens."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, str] = {}

    def observe(self, session_id: str, event: Event) -> None:
        """Log ``event`` of ``session_id`` if it is one of the logged kinds."""
        etype = event.get("type")
        if etype not in _LOGGED or not log.isEnabledFor(logging.INFO):
            return
        if etype == "lifecycle" and self._states.get(session_id) == event.get("state"):
            return  # republished after every harness event: the common case, kept cheap
        try:
            self._log(session_id, str(etype), event)
        except Exception:  # a logging bug must not break the run that emitted the event
            log.exception("cannot log event %r of session %s", etype, session_id)

    def forget(self, session_id: str) -> None:
        """Drop what is kept for ``session_id`` (its last state)."""
        with self._lock:
            self._states.pop(session_id, None)

    def _log(self, sid: str, etype: str, event: Event) -> None:
        ids: dict[str, Any] = {
            "session_id": sid,
            "generation": event.get("generation"),
            "lane": event.get("lane"),
            "run_id": event.get("runId") or None,
        }
        if etype == "lifecycle":
            state = str(event.get("state"))
            with self._lock:
                before = self._states.get(sid)
                if before == state:
                    return
                self._states[sid] = state
                if state == "closed":
                    self._states.pop(sid, None)
            logs.event(
                log,
                "lifecycle",
                "session %s: %s",
                sid,
                state if before is None else f"{before} -> {state}",
                state=state,
                previous=before,
                **ids,
            )
        elif etype == "run_start":
            logs.event(log, "run_start", "session %s: run %s started", sid, ids["run_id"], **ids)
        elif etype == "run_end":
            outcome = str(event.get("outcome", "unknown"))
            awaiting = [str(a) for a in event.get("awaiting") or []] or None
            logs.event(
                log,
                "run_end",
                "session %s: run %s %s",
                sid,
                ids["run_id"],
                outcome,
                level=logging.WARNING if outcome == "failed" else logging.INFO,
                outcome=outcome,
                awaiting=awaiting,
                **ids,
            )
        else:  # suspended: a call in doubt waits for a decision
            awaiting = [str(a) for a in event.get("awaiting") or []]
            logs.event(
                log,
                "suspended",
                "session %s: suspended, %s call(s) awaiting a decision",
                sid,
                len(awaiting),
                announce=True,
                reason=event.get("reason"),
                awaiting=awaiting,
                **ids,
            )


__all__ = ["HostLog"]
