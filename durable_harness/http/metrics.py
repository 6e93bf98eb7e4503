"""``GET /metrics``: how the front reaches the host's metrics (``design/http.md``,
``design/observability.md``).

The front only wires: :class:`~durable_harness.host.metrics.HostMetrics` is subscribed to every
generation's events through :meth:`~durable_harness.host.manager.SessionManager.observe`, told
at each scrape the in-doubt calls awaiting a decision and the sessions by state
(:func:`refresh`), and, on a worker, its claim counts, and rendered.
"""

from __future__ import annotations

from collections import Counter

from durable_harness.host.lifecycle import STATES
from durable_harness.host.manager import SessionManager
from durable_harness.host.metrics import HostMetrics

MetricsSink = HostMetrics
"""What ``/metrics`` renders."""


def make_sink() -> HostMetrics:
    """A fresh :class:`HostMetrics` (its own registry)."""
    return HostMetrics()


async def refresh(manager: SessionManager, sink: HostMetrics, known: set[str]) -> None:
    """Bring the scrape-time values up to date: the awaiting decisions of every suspended
    session and the sessions by lifecycle state (``known`` is kept for the caller's
    bookkeeping of sessions reported awaiting)."""
    awaiting = manager.awaiting_decisions()
    sink.set_awaiting_counts(awaiting)
    known.clear()
    known.update(sid for sid, n in awaiting.items() if n)
    counts = Counter(rec.state for rec in await manager.list())
    sink.set_state_counts({state: counts.get(state, 0) for state in STATES})
    if manager.worker is not None:
        w = manager.worker
        sink.set_worker_counts(len(w.claimed), w.failures, w.lost)
