"""The storage interface: one session's tree, lanes and lane operation logs under one ``seq``.

Every backend (``memory``, ``jsonl``, ``sqlite``; later ``postgres``) implements
:class:`SessionStore` for one session and :class:`Store` for a catalogue of sessions.

Guarantees a caller can check at the call site:

* :meth:`SessionStore.commit` is atomic: all of its ops become visible and durable together, or
  none does (one JSONL line, one SQL transaction).
* When ``commit`` returns, the ops are durable per the store's :data:`Durability` mode.
* ``seq`` strictly rises across every op of a session, whatever its kind.
* Entries are never edited or deleted; lanes only move their leaf.
* A commit is refused with :class:`~durable_harness.errors.StaleGeneration` once another writer
  has taken the lease, and with :class:`~durable_harness.errors.ReadOnlySession` on a read-only
  open.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import anyio.lowlevel
import anyio.to_thread

Durability = Literal["sync", "batch", "none"]
DURABILITY_MODES: tuple[Durability, ...] = ("sync", "batch", "none")


@dataclass(frozen=True)
class EntryOp:
    """Append ``entry`` (a dict with ``type``, ``id``, ``parentId``) to the tree.

    When ``lane`` is set, the lane's leaf moves to this entry in the same commit.
    """

    entry: dict[str, Any]
    lane: str | None = None


@dataclass(frozen=True)
class RecordOp:
    """Append an operation-log ``record`` (``type``, ``id``, ``lane``, ``runId``, ``timestamp``).

    ``run_started`` opens a run on its lane and ``run_finished`` closes it; the store keeps the
    lane's open run in step with these records in the same commit.
    """

    record: dict[str, Any]


_UNSET: Any = object()


@dataclass(frozen=True)
class LaneOp:
    """Create a lane or change it: move its leaf (``leaf_id``; ``None`` means before the root),
    and/or merge ``config`` (model, thinking level, active tools) into its configuration."""

    lane: str
    leaf_id: Any = _UNSET
    config: dict[str, Any] | None = None

    def sets_leaf(self) -> bool:
        """True when this op moves the leaf."""
        return self.leaf_id is not _UNSET


Op = EntryOp | RecordOp | LaneOp


@dataclass
class LaneState:
    """A lane: ``name``, ``leaf_id`` (``None`` before the first entry), ``config``, and the open
    run (``run_id`` and the ``seq`` of its ``run_started`` record) if any."""

    name: str
    leaf_id: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    run_id: str | None = None
    run_seq: int | None = None


@dataclass
class SessionInfo:
    """A catalogue row: ``id``, ``cwd``, ``path`` (file or ``sqlite:PATH#id``), ``created`` and
    ``modified`` (ISO 8601), ``name`` if set, and ``entries`` when cheaply known."""

    id: str
    cwd: str
    path: str
    created: str
    modified: str
    name: str | None = None
    parent_session: str | None = None


def damage(
    kind: str, detail: str, *, offset: int | None = None, line: int | None = None, **extra: Any
) -> dict[str, Any]:
    """Build one damage item ``{kind, detail, offset?, line?, ...}``.

    Kinds (the table with each backend's detection and location fields is in
    ``design/storage.md``): ``torn_tail`` (quarantined), ``bad_line``, ``bad_header``,
    ``missing_header``, ``bad_mark``, ``bad_row``, ``orphan_parent``, ``duplicate_id``,
    ``seq_regression``, ``seq_gap``, ``truncated``, ``stale_generation``. ``offset`` is a byte
    offset into the file; ``line`` is 1-based; SQLite damage names ``table``, ``id``, ``seq``.
    """
    item: dict[str, Any] = {"kind": kind, "detail": detail}
    if offset is not None:
        item["offset"] = offset
    if line is not None:
        item["line"] = line
    item.update(extra)
    return item


def seq_gap_damage(after: int, seq: int, **location: Any) -> dict[str, Any]:
    """A ``seq_gap`` item: the op numbered ``seq`` follows ``after`` with numbers missing between
    (a deleted line or row). ``location`` names where the op after the gap is stored."""
    return damage(
        "seq_gap",
        f"seq jumps from {after} to {seq}: {seq - after - 1} op(s) are missing before it",
        after=after,
        seq=seq,
        missing=seq - after - 1,
        **location,
    )


def truncated_damage(expected: int, found: int, **location: Any) -> dict[str, Any]:
    """A ``truncated`` item: the durable high-water mark says seq ``expected`` was committed
    but the stored ops end at ``found`` (the last commits are gone). ``location`` names where
    the data ends."""
    return damage(
        "truncated",
        f"the high-water mark says seq {expected} was committed but the stored ops end at "
        f"seq {found}: the last {expected - found} op(s) are missing",
        expected=expected,
        found=found,
        **location,
    )


def continuity_damage(
    ops: list[tuple[int, dict[str, Any]]],
    start: int,
    mark: int | None,
    end: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Check that stored seqs run on without a gap: ``ops`` are ``(seq, location)`` pairs in
    the order stored, ``start`` is the seq known to precede the first (0 for a whole session),
    ``mark`` the durable high-water mark (``None`` when the backend keeps none), ``end`` the
    location where the stored data ends (for a ``truncated`` item).

    Returns ``seq_gap`` items (a seq more than one past the one before it; a repeated or falling
    seq is another backend check's ``seq_regression``) and a ``truncated`` item when the last
    seq is below ``mark``. The one continuity rule of every backend.
    """
    out: list[dict[str, Any]] = []
    prev = start
    for seq, location in ops:
        if seq > prev + 1:
            out.append(seq_gap_damage(prev, seq, **location))
        prev = max(prev, seq)
    if mark is not None and prev < mark:
        out.append(truncated_damage(mark, prev, **(end or {})))
    return out


class PendingCommit:
    """One commit waiting in a group-commit queue: its ops, then its outcome (``seq`` or
    ``error``) once ``done``."""

    __slots__ = ("done", "error", "ops", "seq")

    def __init__(self, ops: list[Op]) -> None:
        self.ops = ops
        self.done = False
        self.seq = 0
        self.error: BaseException | None = None


async def queued_commit(
    queue: list[PendingCommit], ops: list[Op], run: Callable[[list[PendingCommit]], None]
) -> int:
    """Group commit for tasks on one event loop: queue ``ops`` and yield once; the first queued
    task to resume hands the whole queue to ``run`` (which commits it and marks every item
    done), and the others find their outcome when they resume.

    A call cancelled before its ops were taken leaves the queue and is not committed.

    Raises:
        whatever ``run`` recorded as this call's error.
    """
    item = PendingCommit(ops)
    queue.append(item)
    try:
        await anyio.lowlevel.checkpoint()
    except BaseException:
        if not item.done:
            queue.remove(item)
        raise
    if not item.done:
        batch = queue[:]
        queue.clear()
        run(batch)
    if item.error is not None:
        raise item.error
    return item.seq


class SessionStore(abc.ABC):
    """One open session. Not bound to an event loop; thread-safe for concurrent ``commit``.

    Attributes:
        session_id: the session's id (UUIDv7 for sessions created here).
        header: the header dict (``type="session"``, ``version``, ``id``, ``cwd``...).
        read_only: True when opened without the writer lease.
        generation: the lease's fencing generation (0 when read-only).
        durability: the :data:`Durability` mode of commits.
        damage: damage in the stored session (see :func:`damage`), never raised: found on
            open (JSONL), or by a full scan the first time it is read (SQLite). ``fsck`` and
            recovery both read this list.
        location: a human-readable location (file path or ``sqlite:PATH#id``).
    """

    session_id: str
    header: dict[str, Any]
    read_only: bool
    generation: int
    durability: Durability
    damage: list[dict[str, Any]]
    location: str

    @abc.abstractmethod
    def commit(self, ops: list[Op], *, wait: bool = True) -> int:
        """Apply ``ops`` atomically and durably (per :attr:`durability`); return the last seq.

        With ``wait=False`` (``sync`` or ``batch``) the call may return once the commit is
        written, before its fsync; :meth:`wait_durable` makes every earlier commit durable.
        Backends whose commit is its own durability point (SQLite) ignore ``wait``.

        Raises:
            ReadOnlySession: opened read-only.
            StaleGeneration: another writer took the lease since this one was opened.
            IdConflict: an entry or record id is already present.
            UnknownEntry: a parent or leaf names an entry that does not exist.
        """

    @abc.abstractmethod
    def get_entry(self, entry_id: str) -> dict[str, Any] | None:
        """Return the entry dict (with its ``seq``) or ``None``."""

    @abc.abstractmethod
    def iter_entries(self, types: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        """Return every entry (or those of ``types``) in ``seq`` order: a full read, for
        listings, facts, fsck and export."""

    @abc.abstractmethod
    def entry_count(self) -> int:
        """Return the number of entries in the tree."""

    @abc.abstractmethod
    def lanes(self) -> dict[str, LaneState]:
        """Return every lane by name (``main`` always exists)."""

    def lane(self, name: str) -> LaneState:
        """Return one lane (an unknown lane is empty). Backends answer it without reading
        every lane: it is on the hot path (each append reads its lane's leaf)."""
        return self.lanes().get(name) or LaneState(name)

    @abc.abstractmethod
    def records(
        self,
        lane: str | None = None,
        *,
        run_id: str | None = None,
        since_seq: int = 0,
        types: tuple[str, ...] | None = None,
    ) -> list[dict[str, Any]]:
        """Return operation-log records in ``seq`` order, filtered by lane, run, seq and type."""

    @abc.abstractmethod
    def last_seq(self) -> int:
        """Return the highest committed seq (0 for an empty session)."""

    def wait_durable(self) -> None:
        """Block until every commit made so far is durable (a no-op unless ``batch``)."""
        return None

    async def wait_durable_async(self) -> None:
        """Await :meth:`wait_durable`: in ``batch`` mode without blocking the event loop."""
        if self.durability == "batch":
            await anyio.to_thread.run_sync(self.wait_durable)
        else:
            self.wait_durable()

    async def commit_async(self, ops: list[Op]) -> int:
        """Commit ``ops`` and await its durability; return the commit's last seq.

        In ``batch`` mode concurrent tasks share fsyncs (group commit); the JSONL and SQLite
        backends go further and share one write or one transaction per group (see theirs).
        A fast fsync may run on the event loop's thread, as a ``sync`` commit's does.

        Raises:
            ReadOnlySession, IdConflict, UnknownEntry, StaleGeneration: as :meth:`commit`.
        """
        seq = self.commit(ops, wait=self.durability != "batch")
        await self.wait_durable_async()
        return seq

    def lease_holder(self) -> dict[str, Any] | None:
        """Return ``{"pid", "host", "generation"}`` of the live process holding the writer lease
        (this one included), or ``None`` when no live process holds it."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Flush nothing more, release the lease and close files. Idempotent."""

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Store(abc.ABC):
    """A catalogue of sessions grouped by working directory.

    Attributes:
        spec: the store's spec string (``jsonl:DIR`` or ``sqlite:PATH``).
    """

    spec: str

    @abc.abstractmethod
    def create_session(
        self,
        cwd: str,
        *,
        session_id: str | None = None,
        parent_session: str | None = None,
        header_extra: dict[str, Any] | None = None,
        durability: Durability = "sync",
    ) -> SessionStore:
        """Create a new empty session (lane ``main``), exclusively, and open it for writing.

        Raises:
            SessionExists: ``session_id`` is already taken.
        """

    @abc.abstractmethod
    def open_session(
        self,
        ref: str,
        *,
        write: bool = True,
        durability: Durability = "sync",
        break_lease: bool = False,
    ) -> SessionStore:
        """Open a session by id or unique id prefix.

        With ``write=True`` the writer lease is taken (generation bumped); ``break_lease=True``
        takes it even from a live holder, whose later commits then fail with StaleGeneration.

        Raises:
            SessionNotFound, AmbiguousSessionPrefix, LeaseHeld.
        """

    @abc.abstractmethod
    def list_sessions(self, cwd: str | None = None) -> list[SessionInfo]:
        """Return sessions (of one working directory, or all), most recently modified first."""

    def resolve(self, ref: str) -> SessionInfo:
        """Find one session by exact id or unique prefix.

        Raises:
            SessionNotFound: nothing matches.
            AmbiguousSessionPrefix: several match; ``details['candidates']`` lists their ids.
        """
        from durable_harness.errors import AmbiguousSessionPrefix, SessionNotFound

        infos = self.list_sessions()
        exact = [i for i in infos if i.id == ref]
        if exact:
            return exact[0]
        matches = [i for i in infos if i.id.startswith(ref)] if ref else []
        if not matches:
            raise SessionNotFound(f"no session matches {ref!r} in {self.spec}", ref=ref)
        if len(matches) > 1:
            ids = sorted(i.id for i in matches)
            raise AmbiguousSessionPrefix(
                f"session prefix {ref!r} is ambiguous: {', '.join(ids)}", candidates=ids
            )
        return matches[0]

    def most_recent(self, cwd: str) -> SessionInfo | None:
        """Return the most recently modified session of ``cwd``, or ``None``."""
        infos = self.list_sessions(cwd)
        return infos[0] if infos else None
