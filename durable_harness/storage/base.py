"""The storage interface: one session's tree, lanes and lane operation logs under one ``seq``
(:class:`SessionStore`), and a catalogue of sessions (:class:`Store`), implemented by every
backend; the guarantees are ``design/storage.md`` "Guarantee"."""

from __future__ import annotations

import abc
import errno
import os
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio.to_thread

from durable_harness.errors import (
    AmbiguousSessionPrefix,
    CorruptSession,
    SessionNotFound,
    SessionUnreadable,
    StorageError,
)
from durable_harness.ids import now_iso, uuid7
from durable_harness.models.header import new_header as new_header  # the backends' import
from durable_harness.storage.oserrors import boundary

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
    """Append an operation-log ``record`` (``type``, ``id``, ``lane``, ``runId``, ``timestamp``);
    ``run_started`` / ``run_finished`` open and close its lane's run in the same commit."""

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


@dataclass(frozen=True)
class RecordFilter:
    """Which records :meth:`SessionStore.records` returns: those of ``lane`` and ``run_id``
    (when set), after ``since_seq``, of ``types`` (when set)."""

    lane: str | None
    run_id: str | None
    since_seq: int
    types: tuple[str, ...] | None

    def __call__(self, rec: dict[str, Any]) -> bool:
        """True when the record ``rec`` (with its ``seq``) is selected."""
        return (
            rec["seq"] > self.since_seq
            and (self.lane is None or rec.get("lane") == self.lane)
            and (self.run_id is None or rec.get("runId") == self.run_id)
            and (self.types is None or rec.get("type") in self.types)
        )


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
    """A catalogue row: ``id``, ``cwd`` (from the header), ``path`` (file or ``sqlite:PATH#id``),
    ``created`` and ``modified`` (ISO 8601 for SQLite, epoch seconds for JSONL), ``name``,
    ``parent_session``. ``error`` is ``None``, or for a session that exists but cannot be read
    ``{"code": "session_unreadable", "errno", "message"}`` (``cwd`` then ``""``;
    ``design/storage.md`` "Finding a session by working directory")."""

    id: str
    cwd: str
    path: str
    created: str
    modified: str
    name: str | None = None
    parent_session: str | None = None
    error: dict[str, Any] | None = None

    @classmethod
    def unreadable(
        cls, path: str, exc: OSError, *, session_id: str = "", modified: str = ""
    ) -> SessionInfo:
        """The row of a session file or folder at ``path`` that raised ``exc`` when read."""
        code = errno_name(exc)
        reason = exc.strerror or str(exc)
        return cls(
            id=session_id,
            cwd="",
            path=path,
            created="",
            modified=modified,
            error={
                "code": "session_unreadable",
                "errno": code,
                "message": f"{path}: cannot be read: {reason} ({code})",
            },
        )


def errno_name(exc: OSError) -> str:
    """The symbolic name of ``exc``'s errno (``EACCES``, ``EIO``...); ``EIO`` when it has none."""
    return errno.errorcode.get(exc.errno, "EIO") if exc.errno else "EIO"


class CwdMatcher:
    """The one rule of session lookup by working directory ``query``: a recorded cwd matches when
    both resolve (:func:`os.path.realpath`) to the same path; a relative one only when spelled
    the same, an empty one never (``design/storage.md`` "Finding a session by working
    directory")."""

    def __init__(self, query: str) -> None:
        self.query = query
        absolute = os.path.abspath(query)
        self.real = os.path.realpath(absolute)
        self.spellings = frozenset({absolute, self.real})
        self._decided: dict[str, bool] = {}

    def __call__(self, recorded: str) -> bool:
        """True when a session whose header records ``recorded`` belongs to the query."""
        hit = self._decided.get(recorded)
        if hit is None:
            hit = self._decided[recorded] = self._decide(recorded)
        return hit

    def _decide(self, recorded: str) -> bool:
        if not recorded:
            return False
        if not os.path.isabs(recorded):
            return recorded == self.query
        return os.path.realpath(recorded) == self.real


class SessionStore(abc.ABC):
    """One open session. Not bound to an event loop; thread-safe for concurrent ``commit``.

    Attributes:
        session_id: the session's id (UUIDv7 for sessions created here).
        header: the header dict (``type="session"``, ``version``, ``id``, ``cwd``...).
        read_only: True when opened without the writer lease.
        generation: the lease's fencing generation (0 when read-only).
        durability: the :data:`Durability` mode of commits.
        damage: damage in the stored session (see :func:`damage`), never raised.
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
        """Apply ``ops`` atomically and durably (per :attr:`durability`); return the last seq. With
        ``wait=False`` it may return before the fsync (:meth:`wait_durable` then makes it
        durable).

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
        """Return every entry (or those of ``types``) in ``seq`` order."""

    @abc.abstractmethod
    def entry_count(self) -> int:
        """Return the number of entries in the tree."""

    @abc.abstractmethod
    def lanes(self) -> dict[str, LaneState]:
        """Return every lane by name (``main`` always exists)."""

    def lane(self, name: str) -> LaneState:
        """Return one lane (an unknown lane is empty); backends answer it without reading all."""
        return self.lanes().get(name) or LaneState(name)

    def lane_leaf(self, name: str) -> str | None:
        """Return the leaf entry id of lane ``name`` (``None`` before its first entry, or for an
        unknown lane): :meth:`lane`'s ``leaf_id``, which backends may answer without copying the
        lane (the harness asks for it twice a turn)."""
        return self.lane(name).leaf_id

    def records(
        self,
        lane: str | None = None,
        *,
        run_id: str | None = None,
        since_seq: int = 0,
        types: tuple[str, ...] | None = None,
    ) -> list[dict[str, Any]]:
        """Return operation-log records in ``seq`` order, filtered by lane, run, seq and type."""
        return self._records(RecordFilter(lane, run_id, since_seq, types))

    @abc.abstractmethod
    def _records(self, where: RecordFilter) -> list[dict[str, Any]]:
        """The records ``where`` selects, in ``seq`` order."""

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
        """Commit ``ops`` and await its durability (concurrent ``batch`` calls share fsyncs); return
        the commit's last seq.

        Raises:
            ReadOnlySession, IdConflict, UnknownEntry, StaleGeneration: as :meth:`commit`.
        """
        seq = self.commit(ops, wait=self.durability != "batch")
        await self.wait_durable_async()
        return seq

    def lease_holder(self) -> dict[str, Any] | None:
        """Return ``{"pid", "host", "generation"}`` of the live process holding the writer lease
        (this one included), or ``None``."""
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

    @boundary
    def create_session(
        self,
        cwd: str,
        *,
        session_id: str | None = None,
        parent_session: str | None = None,
        header_extra: dict[str, Any] | None = None,
        durability: Durability = "sync",
    ) -> SessionStore:
        """Create a new empty session (lane ``main``, header by :func:`new_header`, id
        ``session_id`` or a new UUIDv7), exclusively, and open it for writing.

        Raises:
            SessionExists: ``session_id`` is already taken.
        """
        header = new_header(session_id or uuid7(), now_iso(), cwd, parent_session, header_extra)
        return self._create(header, durability, fresh=session_id is None)

    @abc.abstractmethod
    def _create(self, header: dict[str, Any], durability: Durability, fresh: bool) -> SessionStore:
        """Store the new session ``header`` names and open it (``fresh``: a new id, no clash)."""

    @boundary
    def open_session(
        self,
        ref: str,
        *,
        write: bool = True,
        durability: Durability = "sync",
        break_lease: bool = False,
    ) -> SessionStore:
        """Open a session by id or unique id prefix; ``write`` takes the writer lease (generation
        bumped), ``break_lease`` even from a live holder (which then gets StaleGeneration).

        Raises:
            SessionNotFound, AmbiguousSessionPrefix, LeaseHeld.
        """
        return self._open(ref, write, durability, break_lease)

    @abc.abstractmethod
    def _open(
        self, ref: str, write: bool, durability: Durability, break_lease: bool
    ) -> SessionStore:
        """Open the session ``ref`` names (see :meth:`open_session`)."""

    @abc.abstractmethod
    def list_sessions(self, cwd: str | None = None) -> list[SessionInfo]:
        """Return sessions (of the working directory ``cwd`` by :class:`CwdMatcher`, or all), most
        recently modified first, unreadable ones included with their ``error``."""

    def delete_session(self, session_id: str) -> None:
        """Delete one session (by exact id) and everything stored beside it, under its writer lease.

        Raises:
            SessionNotFound: no session has this id.
            LeaseHeld: a live process holds the session.
            StorageError: the backend cannot delete sessions, or the deletion failed.
        """
        raise StorageError(f"{self.spec} cannot delete sessions", session_id=session_id)

    def resolve(self, ref: str) -> SessionInfo:
        """Find one session by exact id (:meth:`find_exact` first) or unique prefix
        (:meth:`find_prefixed`) (``design/storage.md`` "Finding a session by id").

        Raises:
            SessionNotFound: nothing matches.
            AmbiguousSessionPrefix: several match; ``details['candidates']`` lists their ids.
            SessionUnreadable: the one match is a session file that cannot be read.
        """
        hit = self.find_exact(ref) if ref else None
        if hit is not None:
            return _readable(hit)
        matches = self.find_prefixed(ref) if ref else []
        exact = [i for i in matches if i.id == ref]
        if exact:
            return _readable(exact[0])
        if not matches:
            raise SessionNotFound(f"no session matches {ref!r} in {self.where()}", ref=ref)
        if len(matches) > 1:
            ids = sorted(i.id for i in matches)
            raise AmbiguousSessionPrefix(
                f"session prefix {ref!r} is ambiguous: {', '.join(ids)}", ref=ref, candidates=ids
            )
        return _readable(matches[0])

    def where(self) -> str:
        """The store as error messages name it (never a credential)."""
        return self.spec

    def find_exact(self, session_id: str) -> SessionInfo | None:
        """The row of the session whose id is exactly ``session_id``, found without listing the
        store, or ``None`` (then :meth:`resolve` asks :meth:`find_prefixed`); this default finds
        nothing."""
        return None

    def find_prefixed(self, prefix: str) -> list[SessionInfo]:
        """The rows whose id starts with ``prefix``, in any order (at least two when several
        match)."""
        return [i for i in self.list_sessions() if i.id.startswith(prefix)]

    def most_recent(self, cwd: str) -> SessionInfo | None:
        """Return the most recently modified session of ``cwd`` (see :class:`CwdMatcher`), or
        ``None``.

        Raises:
            SessionUnreadable: the most recent candidate cannot be read (never skipped silently).
            CorruptSession: the most recent candidate's header is damaged and names no cwd.
        """
        infos = self.list_sessions(cwd)
        if not infos:
            return None
        latest = _readable(infos[0])
        if not latest.cwd:
            raise CorruptSession(
                f"the most recent session file for {cwd}, {latest.path}, has a damaged header "
                "that names no working directory",
                path=latest.path,
                cwd=cwd,
            )
        return latest


_HINT = "check its permissions and the disk, or move it out of the store"


def unreadable_error(path: str, exc: OSError, *, what: str = "cannot be read") -> SessionUnreadable:
    """The :class:`~durable_harness.errors.SessionUnreadable` for ``path``, which raised ``exc``
    (``what`` says how), returned for the caller to raise ``from exc``."""
    name = errno_name(exc)
    return SessionUnreadable(
        f"{path}: {what}: {exc.strerror or exc} ({name}); {_HINT}", path=path, errno=name
    )


def _readable(info: SessionInfo) -> SessionInfo:
    """``info`` itself, or SessionUnreadable for an error row."""
    if info.error is not None:
        raise SessionUnreadable(
            f"{info.error['message']}; {_HINT}",
            path=info.path,
            errno=info.error["errno"],
        )
    return info
