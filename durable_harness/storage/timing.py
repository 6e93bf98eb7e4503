"""Commit and fsync latency, reported by the backends to registered observers (the host's metrics):
``(what, seconds)``, ``what`` ``"commit"`` (a call, its fsync included when it waits) or
``"fsync"`` (one sync of the store's data). Without observers nothing is timed."""

from __future__ import annotations

import time
from collections.abc import Callable

Observer = Callable[[str, float], None]
"""Receives ``(what, seconds)``; must be fast and must not raise."""

_observers: list[Observer] = []


def enabled() -> bool:
    """True when at least one observer is registered."""
    return bool(_observers)


def add_observer(observer: Observer) -> Callable[[], None]:
    """Register ``observer`` for every later commit and fsync; return its remover."""
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
