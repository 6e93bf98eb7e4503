"""The session lifecycle state machine: every legal move in one table (``design/host.md``).

States::

    creating   a runtime generation is being started (the first, or a resumed one)
    idle       a live generation, no run open on any lane
    running    a live generation with at least one run open
    closing    a staged close is under way (abort, grace period, kill, release)
    closed     no live generation, closed on purpose; record and transcript kept
    suspended  no live generation and not closed: its owner died (or a start needs a
               decision); the recovery plan says what resuming would do
    error      a generation failed to start or stopped on an error; can be resumed

A stored state is the last observation of a generation that may be gone: the manager turns a
stored ``creating``, ``idle`` or ``running`` whose lease is free into ``suspended``, and a
stored ``closing`` into ``closed`` (:func:`reconciled`).
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
"""``{state: the states it may move to}``. ``idle``/``running`` → ``suspended`` is taken only
by reconciliation (the owner died); ``creating`` → ``suspended`` when a resume finds an
in-doubt call that needs a decision (it then releases the lease)."""


def check(session_id: str, old: State, new: State) -> State:
    """Return ``new`` if ``old`` → ``new`` is legal (staying put is always legal).

    Raises:
        IllegalTransition: not in :data:`TRANSITIONS`; ``details`` name both states.
    """
    if new != old and new not in TRANSITIONS[old]:
        raise IllegalTransition(
            f"session {session_id} is {old}: it cannot become {new}",
            session_id=session_id,
            **{"from": old, "to": new},
        )
    return new


def reconciled(stored: State, owner_alive: bool) -> State:
    """The state a stored observation stands for now: unchanged while its owner (the holder
    of the writer lease) is alive; otherwise ``closing`` → ``closed`` (the close was asked
    for; an abort marker already written settles the run on the next resume) and any live
    or starting state → ``suspended``."""
    if owner_alive:
        return stored
    if stored == "closing":
        return "closed"
    if stored in ("creating", "idle", "running"):
        return "suspended"
    return stored
