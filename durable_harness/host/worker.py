"""The host as a worker of a shared store: the claim loop, and letting go of a session
whose writer was fenced out or lost its database (``design/host.md``, "Workers";
``design/postgres.md``, "Worker claims").
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol, cast, runtime_checkable

import anyio
import anyio.abc
import anyio.to_thread

from durable_harness import logs
from durable_harness.errors import (
    DurableHarnessError,
    SessionUnreadable,
    StaleGeneration,
    StorageIOError,
    root_cause,
)
from durable_harness.storage.base import Durability, SessionStore, Store

if TYPE_CHECKING:
    from durable_harness.host.record import SessionRecord

log = logging.getLogger("durable_harness.host.worker")

CLAIM_BATCH = 16
"""Sessions claimed per statement; a full batch is followed at once by the next one."""

DEFAULT_CLAIM_INTERVAL_S = 5.0
"""Seconds between two claim rounds when ``HostOptions.claim_interval`` is not given."""

RETRY_FAILED_S = 1.0
"""Seconds after a failed claim round before the next (at most the interval): a server that
comes back is claimed from within about a second, not a whole interval later."""


@runtime_checkable
class ClaimingStore(Protocol):
    """A store whose crashed sessions a worker can claim (``PostgresStore``)."""

    def claim_expired(
        self, limit: int = 10, *, durability: Durability = "sync"
    ) -> list[SessionStore]:
        """Take over up to ``limit`` sessions whose writer's lease expired, each open for
        writing under a new generation."""
        ...


@runtime_checkable
class HandsBack(Protocol):
    """A session store whose writer can be fenced out and can hand its session over
    (``PostgresSessionStore``)."""

    @property
    def writer_lost(self) -> bool:
        """True once another writer took the lease."""
        ...

    def hand_back(self, *, flush: bool = False) -> None:
        """Stop writing, leave the session claimable at once (``flush``: barrier first)."""
        ...


class Host(Protocol):
    """What the claim loop needs of its manager."""

    @property
    def store(self) -> Store:
        """The store claimed from."""
        ...

    async def adopt(self, store: SessionStore) -> SessionRecord:
        """Recover a claimed session (open for writing, lease held); takes ``store`` over."""
        ...

    def stop_fenced(self) -> list[str]:
        """Stop the generations whose lease another writer took; returns their ids."""
        ...


def can_claim(store: Store) -> bool:
    """Whether ``store`` supports claims (so the host runs the worker loop on it)."""
    return isinstance(store, ClaimingStore)


def writer_lost(exc: BaseException, store: SessionStore) -> bool:
    """Whether ``exc``, which ended a generation on ``store``, means the writer lost the
    session (fenced out: ``StaleGeneration``; or, on a store that hands sessions back, the
    database lost: ``StorageIOError``) rather than that the session failed
    (``design/host.md``, "Workers": "Fenced out", "Database lost")."""
    cause = root_cause(exc)
    if isinstance(cause, StaleGeneration):
        return True
    return (
        isinstance(store, HandsBack)
        and isinstance(cause, StorageIOError)
        and not isinstance(cause, SessionUnreadable)
    )


def fenced_out(store: SessionStore) -> bool:
    """Whether another writer took ``store``'s lease (only a :class:`HandsBack` store can)."""
    return isinstance(store, HandsBack) and store.writer_lost


async def let_go(store: SessionStore, *, lost: bool = False, hand_over: bool = False) -> None:
    """Let go of a session open for writing: close it; when ``lost``, hand it back without a
    barrier; when ``hand_over`` (a worker shutting down), barrier then hand it back. On a
    :class:`HandsBack` store this runs on a worker thread and never raises (a failing close
    hands back too); on another, both flags mean a plain close."""
    if not isinstance(store, HandsBack):
        store.close()
        return
    with anyio.CancelScope(shield=True):  # also on the way out of a cancelled task
        await anyio.to_thread.run_sync(_let_go_blocking, store, lost, hand_over)


def _let_go_blocking(store: HandsBack, lost: bool, hand_over: bool) -> None:
    if lost or hand_over:
        store.hand_back(flush=hand_over and not lost)
        return
    try:
        cast(SessionStore, store).close()
    except Exception as exc:
        log.warning(
            "session %s: closing failed (%s); left for the next claim",
            cast(SessionStore, store).session_id,
            root_cause(exc),
        )
        store.hand_back()


class Worker:
    """The claim loop of one manager (started by the manager when its store can claim).

    Args:
        manager: the :class:`Host` (the manager). interval: seconds between claim rounds.

    Attributes:
        claimed: ids of the sessions this worker claimed, in order.
        failures: claim rounds that failed (the database unreachable).
    """

    def __init__(self, manager: Host, interval: float) -> None:
        self.manager = manager
        self.interval = interval
        self.claimed: list[str] = []
        self.failures = 0
        self._scope = anyio.CancelScope()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Claim once (before ``task_status.started()``), then every :attr:`interval` seconds
        (:data:`RETRY_FAILED_S` after a failed round) until :meth:`stop`."""
        with self._scope:
            ok = await self.tick()
            task_status.started()
            while True:
                await anyio.sleep(self.interval if ok else min(self.interval, RETRY_FAILED_S))
                ok = await self.tick()

    def stop(self) -> None:
        """End the loop."""
        self._scope.cancel()

    async def tick(self) -> bool:
        """One round: stop the generations fenced out, then claim until none is left (a
        failure is logged and counted); returns whether it succeeded."""
        self.manager.stop_fenced()
        try:
            while await self.claim_once() == CLAIM_BATCH:
                pass
        except DurableHarnessError as exc:
            self.failures += 1
            logs.event(
                log,
                "claim_round_failed",
                "claiming crashed sessions failed: %s (retrying)",
                exc.message,
                level=logging.WARNING,
                code=exc.code,
            )
            return False
        return True

    async def claim_once(self) -> int:
        """Claim up to :data:`CLAIM_BATCH` sessions and hand each to :meth:`Host.adopt`;
        returns how many were claimed (``StorageIOError``: the claim failed, none was)."""
        store = self.manager.store
        assert isinstance(store, ClaimingStore)
        # off the event loop: an unreachable server blocks for its connect timeout
        stores = await anyio.to_thread.run_sync(store.claim_expired, CLAIM_BATCH)
        for claimed in stores:
            self.claimed.append(claimed.session_id)
            try:
                rec = await self.manager.adopt(claimed)
            except DurableHarnessError as exc:
                logs.event(
                    log,
                    "claim_failed",
                    "session %s: claimed but not recovered: %s",
                    claimed.session_id,
                    exc,
                    level=logging.WARNING,
                    session_id=claimed.session_id,
                    code=exc.code,
                )
                continue
            logs.event(
                log,
                "claim",
                "session %s: claimed from a crashed worker (generation %s), now %s",
                rec.id,
                rec.generation,
                rec.state,
                announce=True,
                session_id=rec.id,
                generation=rec.generation,
                state=rec.state,
            )
        return len(stores)
