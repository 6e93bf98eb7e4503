"""Commit and fsync latency, reported by the backends to whoever listens (the host's metrics).

Storage knows nothing of Prometheus: a backend calls :func:`observe` with what it timed, and
each registered observer receives ``(what, seconds)``. With no observer registered (the CLI,
most library use) :func:`observe` returns at once and :func:`enabled` is False, so a backend
may skip reading the clock.

``what`` is one of:

- ``"commit"``: one commit call, from its start to its return (its fsync included when the
  commit waits for it);
- ``"fsync"``: one ``fsync``/``fdatasync`` (or SQLite WAL sync) of the store's data.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Observer = Callable[[str, float], None]
"""Receives ``(what, seconds)``; must be fast and must not raise."""

_observers: list[Observer] = []


def enabled() -> bool:
    """True when at least one observer is registered (backends may skip timing otherwise)."""
    return bool(_observers)


def add_observer(observer: Observer) -> Callable[[], None]:
    """Register ``observer`` for every later commit and fsync in this process; returns the
    function that removes it."""
    _observers.append(observer)

    def remove() -> None:
        if observer in _observers:
            _observers.remove(observer)

    return remove


def observe(what: str, seconds: float) -> None:
    """Report one timed ``commit`` or ``fsync`` of ``seconds`` to every observer."""
    for observer in _observers:
        observer(what, seconds)


def start() -> float:
    """``time.perf_counter()`` when an observer listens, else ``0.0`` (nothing to time)."""
    return time.perf_counter() if _observers else 0.0


def since(what: str, started: float) -> None:
    """Report ``what`` that began at ``started`` (from :func:`start`; ``0.0``: nothing)."""
    if started:
        observe(what, time.perf_counter() - started)
