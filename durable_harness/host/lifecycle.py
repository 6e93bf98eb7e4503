"""The session lifecycle state machine: every legal move in one table (``design/host.md``,
"One state machine").
"""

from __future__ import annotations

from typing import Literal, get_args

from durable_harness.errors import IllegalTransition

State = Literal["creating", "idle", "running", "closing", "closed", "suspended", "error"]
"""A session's lifecycle state."""

STATES: tuple[State, ...] = get_args(State)

LIVE: frozenset[State] = frozenset({"idle", "running"})
"""The states in which a generation is live and takes input."""

TRANSITIONS: dict[State, frozenset[State]] = {
    "creating": frozenset({"idle", "running", "suspended", "error", "closing"}),
    "idle": frozenset({"running", "closing", "error", "suspended"}),
    "running": frozenset({"idle", "closing", "error", "suspended"}),
    "closing": frozenset({"closed"}),
    "closed": frozenset({"creating"}),
    "suspended": frozenset({"creating", "closed"}),
    "error": frozenset({"creating", "closed"}),
}
"""``{state: the states it may move to}``."""


def check(session_id: str, old: State, new: State) -> State:
    """Return ``new`` if ``old`` → ``new`` is in :data:`TRANSITIONS` (staying put is always
    legal), else raise :class:`IllegalTransition`."""
    if new != old and new not in TRANSITIONS[old]:
        raise IllegalTransition(
            f"session {session_id} is {old}: it cannot become {new}",
            session_id=session_id,
            **{"from": old, "to": new},
        )
    return new


def reconciled(stored: State, owner_alive: bool) -> State:
    """The state a stored observation stands for now: unchanged while the lease holder lives,
    else ``closing`` → ``closed`` and a live or starting state → ``suspended``."""
    if owner_alive:
        return stored
    if stored == "closing":
        return "closed"
    if stored in ("creating", "idle", "running"):
        return "suspended"
    return stored
