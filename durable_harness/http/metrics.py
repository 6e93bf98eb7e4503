"""``GET /metrics``: how the front reaches the host's metrics (``design/http.md``).

The front only wires: a sink with ``observe(session_id, event)``, ``set_awaiting(session_id,
n)`` and ``render() -> (body, content type)`` is subscribed to every generation's events
through :meth:`~durable_harness.host.manager.SessionManager.observe`, told the in-doubt calls
awaiting a decision at each scrape, and rendered. The sink is the host's
``durable_harness.host.metrics.HostMetrics`` when that module exists; otherwise
:class:`FrontMetrics`, a small stand-in with the session-level series.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from durable_harness.harness.core import Event
from durable_harness.host.lifecycle import STATES
from durable_harness.host.manager import SessionManager


class MetricsSink(Protocol):
    """What ``/metrics`` needs of the host's metrics."""

    def observe(self, session_id: str, event: Event) -> None:
        """Count one harness or lifecycle event of a session."""

    def set_awaiting(self, session_id: str, n: int) -> None:
        """Set the number of the session's in-doubt calls awaiting a decision."""

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition and its content type."""


class FrontMetrics:
    """The stand-in sink: a private registry with ``durable_harness_sessions{state}``
    (refreshed from the store at each scrape by :func:`refresh`),
    ``durable_harness_in_doubt_awaiting_decision``, ``durable_harness_runs_total{outcome}``
    and ``durable_harness_tool_calls_total{outcome}``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.sessions = Gauge(
            "durable_harness_sessions",
            "Sessions of the store by lifecycle state",
            ["state"],
            registry=self.registry,
        )
        self.awaiting = Gauge(
            "durable_harness_in_doubt_awaiting_decision",
            "In-doubt tool calls of suspended sessions waiting for a decision",
            registry=self.registry,
        )
        self.runs = PromCounter(
            "durable_harness_runs",
            "Runs ended, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.tools = PromCounter(
            "durable_harness_tool_calls",
            "Tool calls settled, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self._awaiting: dict[str, int] = {}

    def observe(self, session_id: str, event: Event) -> None:
        """Count ``run_end`` by outcome and ``tool_execution_end`` by outcome."""
        etype = event.get("type")
        if etype == "run_end":
            self.runs.labels(str(event.get("outcome"))).inc()
        elif etype == "tool_execution_end":
            self.tools.labels(str(event.get("outcome"))).inc()

    def set_awaiting(self, session_id: str, n: int) -> None:
        """Record ``n`` calls awaiting a decision in ``session_id`` (0 forgets it)."""
        if n:
            self._awaiting[session_id] = n
        else:
            self._awaiting.pop(session_id, None)
        self.awaiting.set(sum(self._awaiting.values()))

    def set_states(self, states: Counter[str]) -> None:
        """Set the sessions-by-state gauge (every state listed, absent ones 0)."""
        for state in STATES:
            self.sessions.labels(state).set(states.get(state, 0))

    def render(self) -> tuple[bytes, str]:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def make_sink() -> MetricsSink:
    """The host's ``HostMetrics`` if it is installed, else :class:`FrontMetrics`."""
    try:
        from durable_harness.host.metrics import (  # type: ignore[import-not-found,unused-ignore]
            HostMetrics,
        )
    except ImportError:
        return FrontMetrics()
    sink: MetricsSink = HostMetrics()
    return sink


async def refresh(manager: SessionManager, sink: MetricsSink, known: set[str]) -> None:
    """Bring the scrape-time values up to date: the awaiting decisions of every suspended
    session (``known``: the sessions reported awaiting last time, zeroed when no longer),
    and, for :class:`FrontMetrics`, the sessions by state."""
    awaiting = manager.awaiting_decisions()
    for sid in known - awaiting.keys():
        sink.set_awaiting(sid, 0)
    for sid, n in awaiting.items():
        sink.set_awaiting(sid, n)
    known.clear()
    known.update(sid for sid, n in awaiting.items() if n)
    if isinstance(sink, FrontMetrics):
        sink.set_states(Counter(rec.state for rec in await manager.list()))
