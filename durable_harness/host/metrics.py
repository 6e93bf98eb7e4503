"""Prometheus metrics of a host, counted from the harness events of every session and from
storage timing (``design/observability.md``). Each :class:`HostMetrics` owns its own registry,
so two hosts (or two tests) in one process never share a series.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from durable_harness.harness.core import Event
from durable_harness.storage import timing

_log = logging.getLogger(__name__)

PREFIX = "durable_harness_"

# fmt: off
STORAGE_BUCKETS: tuple[float, ...] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5,
)
# fmt: on
"""Histogram buckets (seconds) for commits and fsyncs (50 µs on an SSD to seconds)."""

CALL_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
"""Histogram buckets (seconds) for tool calls and provider requests."""

MAX_TOOL_LABELS = 64
"""Distinct values of the ``tool`` label; later (or longer than 64) names count as ``other``."""

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
    """The host's metrics, rendered for ``/metrics``: feed :meth:`observe`
    (``manager.observe(metrics.observe)``), :meth:`start` it for storage timing, serve
    :meth:`render`. Thread-safe; :meth:`observe` never raises (a broken event is logged).

    Args:
        refresh: called with this object at the start of every :meth:`render`, to set the
            gauges whose truth lives elsewhere (an exception in it is logged).
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
        self.resumes_pending = Gauge(
            PREFIX + "resumes_pending",
            "Sessions whose start-up resume is queued and not begun (design/host.md).",
            registry=reg,
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
        """Listen to :mod:`durable_harness.storage.timing`; idempotent. Returns ``self``."""
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
        """Count one event of session ``session_id`` (harness or ``lifecycle``). Never raises."""
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
            self._set_count(self._live, (sid, lane), 0)
        elif etype == "run_end":
            self.runs.labels(outcome=str(event.get("outcome", "unknown"))).inc()
            awaiting = event.get("awaiting") or []
            waiting = len(awaiting) if event.get("outcome") == "suspended" else 0
            self._set_count(self._live, (sid, lane), waiting)
            self._drop_started(sid, run_id)
        elif etype == "turn_start":
            self.turns.inc()
        elif etype in ("tool_execution_start", "provider_request_start"):
            self._clock((sid, run_id, _call_key(event)), start=True)
        elif etype == "tool_execution_end":
            tool = self._tool_label(str(event.get("toolName", "unknown")))
            self.tool_calls.labels(tool=tool, outcome=str(event.get("outcome", "unknown"))).inc()
            if (took := self._clock((sid, run_id, _call_key(event)))) is not None:
                self.tool_call_seconds.labels(tool=tool).observe(took)
        elif etype == "provider_request_end":
            purpose = str(event.get("purpose", "turn"))
            outcome = str(event.get("outcome", "unknown"))
            self.provider_requests.labels(purpose=purpose, outcome=outcome).inc()
            if (took := self._clock((sid, run_id, _call_key(event)))) is not None:
                self.provider_request_seconds.labels(purpose=purpose).observe(took)
            for field, count in usage_counts(event).items():
                if count > 0:
                    self.tokens.labels(kind=_TOKEN_KINDS[field]).inc(count)
        elif etype == "lifecycle" and event.get("state") not in LIVE_STATES:
            # the generation is gone: its live suspensions are now the manager's plan to report
            with self._lock:
                for lane_key in [k for k in self._live if k[0] == sid]:
                    self._awaiting_add(-self._live.pop(lane_key))

    def _tool_label(self, name: str) -> str:
        """The ``tool`` label for a tool name: the name, or ``other`` once
        :data:`MAX_TOOL_LABELS` names are in use (a model may call any name)."""
        with self._lock:
            if name in self._tool_names:
                return name
            if len(self._tool_names) >= MAX_TOOL_LABELS or len(name) > 64:
                return "other"
            self._tool_names.add(name)
            return name

    def _clock(self, key: tuple[str, str, str], *, start: bool = False) -> float | None:
        """Note the start of ``key`` (``start``), else the seconds since it (``None``: unseen)."""
        with self._lock:
            if start:
                self._started[key] = time.monotonic()
                return None
            began = self._started.pop(key, None)
        return None if began is None else time.monotonic() - began

    def _drop_started(self, sid: str, run_id: str) -> None:
        """Forget the start times a run left behind (a call the run ended without settling)."""
        with self._lock:
            for key in [k for k in self._started if k[0] == sid and k[1] == run_id]:
                del self._started[key]

    # -- gauges set by the manager -----------------------------------------------------------

    def _awaiting_add(self, delta: int) -> None:
        """Move the awaiting total by ``delta`` (under the lock)."""
        if delta:
            self._awaiting_total += delta
            self.awaiting.set(self._awaiting_total)

    def _set_count(self, table: dict[Any, int], key: Any, count: int) -> None:
        with self._lock:
            old = table.pop(key, 0)
            if count:
                table[key] = count
            self._awaiting_add(count - old)

    def set_awaiting(self, session_id: str, count: int) -> None:
        """Set the plan-derived count of in-doubt calls of ``session_id`` (``0`` clears it);
        a live generation's are counted from its ``run_end`` events.

        Raises:
            ValueError: ``count`` is negative.
        """
        if count < 0:
            raise ValueError(f"awaiting count of session {session_id} is negative: {count}")
        self._set_count(self._planned, session_id, count)

    def set_awaiting_counts(self, counts: Mapping[str, int]) -> None:
        """Replace every plan-derived awaiting count with ``counts`` (``{session id: calls}``).

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
        """Drop the awaiting counts and start times kept for ``session_id``."""
        with self._lock:
            delta = -self._planned.pop(session_id, 0)
            for lane_key in [k for k in self._live if k[0] == session_id]:
                delta -= self._live.pop(lane_key)
            for key in [k for k in self._started if k[0] == session_id]:
                del self._started[key]
            self._awaiting_add(delta)

    def set_state_counts(self, counts: Mapping[str, int]) -> None:
        """Set ``sessions{state}`` to ``counts``; a state absent now reads 0."""
        with self._lock:
            for state in self._states - set(counts):
                self.sessions.labels(state=state).set(0)
            for state, count in counts.items():
                self.sessions.labels(state=state).set(count)
            self._states |= set(counts)

    # -- exposition --------------------------------------------------------------------------

    def set_worker_counts(self, claims: int, failures: int, lost: int) -> None:
        """Bring the worker counters up to the worker's own totals (they only move up)."""
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
        """The exposition for a scrape: ``(body, content type)``, OpenMetrics when ``accept``
        asks for it, else the Prometheus text format. Runs the ``refresh`` hook first."""
        if self._refresh is not None:
            try:
                self._refresh(self)
            except Exception:
                _log.exception("metrics: the refresh hook failed; rendering the last values")
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


def usage_counts(event: Event) -> dict[str, int]:
    """The token counts of an event's ``usage`` (``input``, ``output``, ``cacheRead``,
    ``cacheWrite``), those that are integers."""
    usage = event.get("usage")
    if not isinstance(usage, Mapping):
        return {}
    counts = {field: usage.get(field) for field in _TOKEN_KINDS}
    return {f: c for f, c in counts.items() if isinstance(c, int) and not isinstance(c, bool)}


def _call_key(event: Event) -> str:
    if str(event.get("type")).startswith("tool_"):
        return "tool:" + str(event.get("toolCallId"))
    return request_key(event)


def request_key(event: Event) -> str:
    """The key of a provider request attempt among its run's: purpose, turn and attempt."""
    return f"req:{event.get('purpose')}:{event.get('turn')}:{event.get('attempt')}"


__all__ = ["CALL_BUCKETS", "MAX_TOOL_LABELS", "STORAGE_BUCKETS", "HostMetrics"]
