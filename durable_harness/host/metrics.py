"""Prometheus metrics of a host (``design/observability.md``): runs, turns, tool calls, provider
requests and tokens counted from the harness events of every session, in-doubt calls awaiting a
decision, sessions by lifecycle state, and commit/fsync latency from
:mod:`durable_harness.storage.timing`.

Each :class:`HostMetrics` owns its own :class:`prometheus_client.CollectorRegistry`, never the
process-wide default one, so two hosts (or two tests) in one process never share a series.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from durable_harness.storage import timing

Event = dict[str, Any]

_log = logging.getLogger(__name__)

PREFIX = "durable_harness_"

# fmt: off
STORAGE_BUCKETS: tuple[float, ...] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5,
)
# fmt: on
"""Histogram buckets (seconds) for commits and fsyncs: an fsync on a local SSD takes 50 µs to
a few ms, on a loaded or networked disk up to seconds."""

CALL_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
"""Histogram buckets (seconds) for tool calls and provider requests."""

MAX_TOOL_LABELS = 64
"""Distinct values of the ``tool`` label; later names (and names over 64 characters) are
counted as ``other``."""

LIVE_STATES = frozenset({"creating", "idle", "running"})
"""Lifecycle states in which a session's generation (and its live suspensions) still exists."""

# fmt: off
_COUNTED = frozenset({
    "run_start", "run_end", "turn_start", "tool_execution_start", "tool_execution_end",
    "provider_request_start", "provider_request_end", "lifecycle",
})
_TOKEN_KINDS = {
    "input": "input", "output": "output", "cacheRead": "cache_read", "cacheWrite": "cache_write"
}
# fmt: on


class HostMetrics:
    """The host's metrics, fed by harness events and storage timing, rendered for ``/metrics``.

    Feed it with :meth:`observe` (``manager.observe(metrics.observe)``: the callback takes
    ``(session_id, event)``), start it (:meth:`start`, or ``with HostMetrics() as m``) so it
    hears commit and fsync latency, and serve :meth:`render`. Every method is safe to call from
    any thread, and :meth:`observe` never raises (a broken event is logged and skipped: a
    metrics bug must not break a run).

    Series: each one below with its help text, all prefixed ``durable_harness_``
    (``design/observability.md`` lists their labels and values); ``sessions{state}``,
    ``tool_calls_awaiting_decision`` and the ``worker_*`` counters are set by the manager
    (:meth:`set_state_counts`, :meth:`set_awaiting_counts`, :meth:`set_worker_counts`).

    Args:
        refresh: called with this object at the start of every :meth:`render` (a scrape), to
            set the gauges whose truth lives elsewhere (:meth:`set_state_counts`,
            :meth:`set_awaiting_counts` from the manager). An exception in it is logged and the
            rest of the exposition still rendered.
    """

    def __init__(self, refresh: Callable[[HostMetrics], None] | None = None) -> None:
        self.registry = reg = CollectorRegistry(auto_describe=True)

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(PREFIX + name, doc, labels, registry=reg)

        def histogram(name: str, doc: str, label: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(
                PREFIX + name, doc, [label] if label else [], buckets=buckets, registry=reg
            )

        self.runs_started = counter("runs_started", "Runs started (new or resumed) by this host.")
        self.runs = counter(
            "runs", "Runs that ended or suspended in this host, by outcome.", "outcome"
        )
        self.turns = counter("turns", "Provider turns begun.")
        self.tool_calls = counter(
            "tool_calls", "Tool calls settled, by tool and outcome.", "tool", "outcome"
        )
        self.tool_call_seconds = histogram(
            "tool_call_seconds",
            "Duration of the tool calls this host ran, from start to settlement.",
            "tool",
            CALL_BUCKETS,
        )
        self.provider_requests = counter(
            "provider_requests",
            "Provider request attempts, by purpose and outcome.",
            "purpose",
            "outcome",
        )
        self.provider_request_seconds = histogram(
            "provider_request_seconds",
            "Duration of provider request attempts (streaming included).",
            "purpose",
            CALL_BUCKETS,
        )
        self.tokens = counter("tokens", "Tokens reported by the provider's usage, by kind.", "kind")
        self.awaiting = Gauge(
            PREFIX + "tool_calls_awaiting_decision",
            "In-doubt tool calls waiting for a decision, over all sessions.",
            registry=reg,
        )
        self.sessions = Gauge(
            PREFIX + "sessions", "Sessions by lifecycle state.", ["state"], registry=reg
        )
        self.worker_claims = counter("worker_claims", "Crashed sessions this worker claimed.")
        self.worker_claim_failures = counter(
            "worker_claim_failures", "Claim rounds that failed (the store unreachable)."
        )
        self.worker_sessions_lost = counter(
            "worker_sessions_lost",
            "Generations stopped because their writer lost the session (fenced out, or the "
            "database lost).",
        )
        self._worker_seen = (0, 0, 0)
        self.commit_seconds = histogram(
            "commit_seconds",
            "Storage commit latency (the write, and its fsync when the commit waits for it).",
            "",
            STORAGE_BUCKETS,
        )
        self.fsync_seconds = histogram(
            "fsync_seconds",
            "Storage fsync latency (one fsync/fdatasync or WAL sync of a store's data).",
            "",
            STORAGE_BUCKETS,
        )
        self._refresh = refresh
        self._lock = threading.Lock()
        self._planned: dict[str, int] = {}  # session -> awaiting calls (manager, from the plan)
        self._live: dict[tuple[str, str], int] = {}  # (session, lane) -> awaiting (events)
        self._awaiting_total = 0
        self._states: set[str] = set()
        self._tool_names: set[str] = set()  # the values the ``tool`` label has taken
        # (session, run id, key) -> start time (monotonic s): tool calls and provider requests
        self._started: dict[tuple[str, str, str], float] = {}
        self._remove_observer: Callable[[], None] | None = None

    # -- lifetime ----------------------------------------------------------------------------

    def start(self) -> HostMetrics:
        """Listen to :mod:`durable_harness.storage.timing` (commit and fsync latency of every
        store in this process); idempotent. Returns ``self``."""
        with self._lock:
            if self._remove_observer is None:
                self._remove_observer = timing.add_observer(self._on_timing)
        return self

    def close(self) -> None:
        """Stop listening to storage timing (the series keep their values); idempotent."""
        with self._lock:
            remove, self._remove_observer = self._remove_observer, None
        if remove is not None:
            remove()

    def __enter__(self) -> HostMetrics:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _on_timing(self, what: str, seconds: float) -> None:
        if what == "commit":
            self.commit_seconds.observe(seconds)
        elif what == "fsync":
            self.fsync_seconds.observe(seconds)

    # -- harness events ----------------------------------------------------------------------

    def observe(self, session_id: str, event: Event) -> None:
        """Count one harness event of session ``session_id`` (or a manager ``lifecycle`` event
        ``{"type": "lifecycle", "state": ...}``). Never raises."""
        if event.get("type") not in _COUNTED:  # most events (stream deltas) count nothing
            return
        try:
            self._observe(session_id, event)
        except Exception:  # a metrics bug must not break the run that emitted the event
            _log.exception("metrics: cannot count event %r of session %s", event, session_id)

    def listener(self, session_id: str) -> Callable[[Event], None]:
        """A ``Harness.subscribe`` callback counting that harness's events as ``session_id``."""
        return lambda event: self.observe(session_id, event)

    def _observe(self, sid: str, event: Event) -> None:
        etype = event.get("type")
        run_id = str(event.get("runId", ""))
        lane = str(event.get("lane", "main"))
        if etype == "run_start":
            self.runs_started.inc()
            self._set_live(sid, lane, 0)
        elif etype == "run_end":
            self.runs.labels(outcome=str(event.get("outcome", "unknown"))).inc()
            awaiting = event.get("awaiting") or []
            self._set_live(sid, lane, len(awaiting) if event.get("outcome") == "suspended" else 0)
            self._drop_started(sid, run_id)
        elif etype == "turn_start":
            self.turns.inc()
        elif etype == "tool_execution_start":
            key = (sid, run_id, "tool:" + str(event.get("toolCallId")))
            with self._lock:
                self._started[key] = time.monotonic()
        elif etype == "tool_execution_end":
            tool = self._tool_label(str(event.get("toolName", "unknown")))
            self.tool_calls.labels(tool=tool, outcome=str(event.get("outcome", "unknown"))).inc()
            with self._lock:
                began = self._started.pop(
                    (sid, run_id, "tool:" + str(event.get("toolCallId"))), None
                )
            if began is not None:
                self.tool_call_seconds.labels(tool=tool).observe(time.monotonic() - began)
        elif etype == "provider_request_start":
            with self._lock:
                self._started[(sid, run_id, _request_key(event))] = time.monotonic()
        elif etype == "provider_request_end":
            purpose = str(event.get("purpose", "turn"))
            outcome = str(event.get("outcome", "unknown"))
            self.provider_requests.labels(purpose=purpose, outcome=outcome).inc()
            with self._lock:
                began = self._started.pop((sid, run_id, _request_key(event)), None)
            if began is not None:
                self.provider_request_seconds.labels(purpose=purpose).observe(
                    time.monotonic() - began
                )
            usage = event.get("usage")
            if isinstance(usage, Mapping):
                for field, kind in _TOKEN_KINDS.items():
                    count = usage.get(field)
                    if isinstance(count, int) and not isinstance(count, bool) and count > 0:
                        self.tokens.labels(kind=kind).inc(count)
        elif etype == "lifecycle" and event.get("state") not in LIVE_STATES:
            # the generation is gone: its live suspensions are now the manager's plan to report
            with self._lock:
                for lane_key in [k for k in self._live if k[0] == sid]:
                    self._awaiting_add(-self._live.pop(lane_key))

    def _tool_label(self, name: str) -> str:
        """The ``tool`` label for a tool name: the name, or ``other`` once
        :data:`MAX_TOOL_LABELS` names are in use (a model may call a tool that does not exist,
        under any name: it must not grow the number of series without bound)."""
        with self._lock:
            if name in self._tool_names:
                return name
            if len(self._tool_names) >= MAX_TOOL_LABELS or len(name) > 64:
                return "other"
            self._tool_names.add(name)
            return name

    def _drop_started(self, sid: str, run_id: str) -> None:
        """Forget the start times a run left behind (a call the run ended without settling)."""
        with self._lock:
            for key in [k for k in self._started if k[0] == sid and k[1] == run_id]:
                del self._started[key]

    # -- gauges set by the manager -----------------------------------------------------------

    def _awaiting_add(self, delta: int) -> None:
        """Move the awaiting total by ``delta`` (called under the lock)."""
        if delta:
            self._awaiting_total += delta
            self.awaiting.set(self._awaiting_total)

    def _set_live(self, sid: str, lane: str, count: int) -> None:
        with self._lock:
            old = self._live.pop((sid, lane), 0)
            if count:
                self._live[(sid, lane)] = count
            self._awaiting_add(count - old)

    def set_awaiting(self, session_id: str, count: int) -> None:
        """Set the in-doubt calls of session ``session_id`` that wait for a decision according
        to its recovery plan (a session with no live generation; ``0`` clears it). Calls a live
        generation suspended on are counted from its ``run_end`` events, apart from this.

        Raises:
            ValueError: ``count`` is negative.
        """
        if count < 0:
            raise ValueError(f"awaiting count of session {session_id} is negative: {count}")
        with self._lock:
            old = self._planned.pop(session_id, 0)
            if count:
                self._planned[session_id] = count
            self._awaiting_add(count - old)

    def set_awaiting_counts(self, counts: Mapping[str, int]) -> None:
        """Replace every plan-derived awaiting count with ``counts`` (``{session id: calls}``,
        e.g. ``SessionManager.awaiting_decisions()``); sessions absent from it count 0.

        Raises:
            ValueError: a count is negative.
        """
        for sid, count in counts.items():
            if count < 0:
                raise ValueError(f"awaiting count of session {sid} is negative: {count}")
        with self._lock:
            old = sum(self._planned.values())
            self._planned = {sid: n for sid, n in counts.items() if n}
            self._awaiting_add(sum(self._planned.values()) - old)

    def forget_session(self, session_id: str) -> None:
        """Drop everything kept for ``session_id`` (its awaiting counts, pending start times):
        for a forgotten or closed session. Counters keep their totals."""
        with self._lock:
            delta = -self._planned.pop(session_id, 0)
            for lane_key in [k for k in self._live if k[0] == session_id]:
                delta -= self._live.pop(lane_key)
            for key in [k for k in self._started if k[0] == session_id]:
                del self._started[key]
            self._awaiting_add(delta)

    def set_state_counts(self, counts: Mapping[str, int]) -> None:
        """Set ``sessions{state}`` to ``counts`` (``{state: sessions}``); a state reported
        before and absent now reads 0."""
        with self._lock:
            for state in self._states - set(counts):
                self.sessions.labels(state=state).set(0)
            for state, count in counts.items():
                self.sessions.labels(state=state).set(count)
            self._states |= set(counts)

    # -- exposition --------------------------------------------------------------------------

    def set_worker_counts(self, claims: int, failures: int, lost: int) -> None:
        """Bring the worker counters up to the worker's own totals (counts since the host
        started; the counters only ever move up by the difference)."""
        with self._lock:
            seen = self._worker_seen
            for counter, now, before in zip(
                (self.worker_claims, self.worker_claim_failures, self.worker_sessions_lost),
                (claims, failures, lost),
                seen,
                strict=True,
            ):
                if now > before:
                    counter.inc(now - before)
            self._worker_seen = (max(claims, seen[0]), max(failures, seen[1]), max(lost, seen[2]))

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition for a scrape: ``(body, content type)``. ``accept`` is the request's
        ``Accept`` header: OpenMetrics when it asks for it, else the Prometheus text format
        0.0.4. Runs the ``refresh`` hook first."""
        if self._refresh is not None:
            try:
                self._refresh(self)
            except Exception:
                _log.exception("metrics: the refresh hook failed; rendering the last values")
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


def _request_key(event: Event) -> str:
    return f"req:{event.get('purpose')}:{event.get('turn')}:{event.get('attempt')}"


__all__ = ["CALL_BUCKETS", "MAX_TOOL_LABELS", "STORAGE_BUCKETS", "HostMetrics"]
