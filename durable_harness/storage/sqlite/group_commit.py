"""Group commit across the sessions of one store: concurrent calls of one session or many, from
tasks or threads (:class:`GroupQueues`), in one ``BEGIN IMMEDIATE`` transaction and one WAL sync
(:func:`run_group`; ``design/storage.md`` "SQLite")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from durable_harness.errors import SessionClosed
from durable_harness.ids import now_iso
from durable_harness.storage.base import Op
from durable_harness.storage.handoff import GroupLeader, PendingCommit, TaskQueue, settling
from durable_harness.storage.sql.catalogue import CHUNK
from durable_harness.storage.sqlite.connection import rollback

if TYPE_CHECKING:
    from durable_harness.errors import StorageError
    from durable_harness.storage.base import Durability
    from durable_harness.storage.sqlite.database import SharedDatabase


class Member(Protocol):
    """What a group asks of a session that queued a commit (a
    :class:`~.session.Member`)."""

    session_id: str
    generation: int
    location: str
    durability: Durability
    closed: bool

    def forget_txn(self) -> None:
        """Drop what it cached from a transaction that may have rolled back."""

    def stale_error(self, current: int | None) -> StorageError:
        """The error of a commit fenced by another holder (``current``: its generation)."""

    def apply_ops(self, ops: list[Op], seq: int) -> int:
        """Write ``ops`` after ``seq`` inside the open transaction; the new last seq."""

    def note_committed(self, ticket: int) -> None:
        """Remember the WAL ticket its last commit needs synced."""


class SessionCommit(PendingCommit):
    """One queued commit call of one session; ``ops == []`` is a barrier (durability only)."""

    __slots__ = ("session",)

    def __init__(self, session: Member, ops: list[Op]) -> None:
        super().__init__(ops)
        self.session = session


class _Retry(Exception):
    """A call failed in the optimistic pass: run the group again with savepoints."""


class GroupQueues:
    """The queues of one :class:`~.database.SharedDatabase`: tasks' and threads' calls."""

    def __init__(self) -> None:
        self.tasks: TaskQueue[SessionCommit] = TaskQueue()
        self.threads: GroupLeader[SessionCommit] = GroupLeader()


def run_group(db: SharedDatabase, queues: GroupQueues, batch: list[SessionCommit]) -> None:
    """Commit ``batch`` in one transaction, then sync the WAL once if any call needs it; set each
    call's ``seq`` or ``error`` and ``done`` (a closed session's: :class:`SessionClosed`)."""
    try:
        with settling(batch):
            writes = [item for item in batch if item.ops]
            with db.lock:
                for item in writes:
                    if item.session.closed:
                        item.error = SessionClosed(f"session {item.session.location} is closed")
                writes = [item for item in writes if item.error is None]
                if writes and not _transaction(db, writes, savepoints=False):
                    _transaction(db, writes, savepoints=True)
            if any(i.error is None and i.session.durability != "none" for i in batch):
                try:
                    db.sync_to(db.committed)
                except OSError as exc:  # committed, but not known to be durable
                    for item in batch:
                        item.error = item.error or exc
    finally:
        queues.tasks.ran()


def _transaction(db: SharedDatabase, writes: list[SessionCommit], *, savepoints: bool) -> bool:
    """One attempt at the group's transaction; without ``savepoints`` a failing call rolls all back
    and returns ``False``; with them it fails alone."""
    c = db.writer
    sessions = list(dict.fromkeys(item.session for item in writes))
    for item in writes:
        item.error = None
    c.execute("BEGIN IMMEDIATE")
    try:
        heads = _fence(c, sessions)
        seqs: dict[Any, int] = {}
        for s in sessions:
            s.forget_txn()
            generation, last_seq = heads.get(s.session_id, (None, 0))
            if generation == s.generation:
                seqs[s] = last_seq
        for i, item in enumerate(writes):
            s = item.session
            if s not in seqs:
                item.error = s.stale_error(heads.get(s.session_id, (None, 0))[0])
                continue
            if not savepoints:
                try:
                    item.seq = seqs[s] = s.apply_ops(item.ops, seqs[s])
                except Exception as exc:
                    raise _Retry from exc
                continue
            c.execute(f"SAVEPOINT c{i}")
            try:
                item.seq = seqs[s] = s.apply_ops(item.ops, seqs[s])
                c.execute(f"RELEASE c{i}")
            except Exception as exc:  # one bad call fails alone
                c.execute(f"ROLLBACK TO c{i}")
                c.execute(f"RELEASE c{i}")
                s.forget_txn()  # some of what it made was rolled back
                item.error = exc
        moved = [(seq, now_iso(), s.session_id) for s, seq in seqs.items()]
        c.executemany("UPDATE sessions SET last_seq=?, modified=? WHERE id=?", moved)
        c.execute("COMMIT")
    except _Retry:
        rollback(c)
        return False
    except BaseException as exc:
        rollback(c)
        for item in writes:
            item.error = item.error or exc
        if not isinstance(exc, Exception):
            raise
        return True
    ticket = db.note_commit(sum(item.error is None for item in writes))
    for s in seqs:
        s.note_committed(ticket)
    return True


def _fence(c: Any, sessions: list[Member]) -> dict[str, tuple[int, int]]:
    """``{session id: (generation, last_seq)}`` read inside the open transaction."""
    out: dict[str, tuple[int, int]] = {}
    ids = [s.session_id for s in sessions]
    for start in range(0, len(ids), CHUNK):
        part = ids[start : start + CHUNK]
        marks = ",".join("?" * len(part))
        for sid, generation, last_seq in c.execute(
            f"SELECT id, generation, last_seq FROM sessions WHERE id IN ({marks})", part
        ):
            out[sid] = (int(generation), int(last_seq))
    return out
