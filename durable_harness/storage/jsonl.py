"""The embedded default backend: one append-only JSONL file per session.

File format (``design/storage.md`` has the full description)::

    line 1   {"type":"session","version":3,"format":"durable-harness/1","id":..., "cwd":...}
    line 2.. {"gen":G,"ops":[{"op":"entry","lane":"main","entry":{...,"seq":N}},
                             {"op":"record","record":{...,"seq":N+1}},
                             {"op":"lane","lane":"main","seq":N+2,"leafId":...}]}

One line is one commit, written with one ``write`` of ``line + "\\n"``; the line is the unit of
atomicity. ``sync`` fsyncs before ``commit`` returns; ``batch`` shares one fsync among the
commits that arrive while another fsync runs (group commit); ``none`` never fsyncs.

On open, damage is reported, never raised: a final line without ``\\n`` is torn (never
acknowledged) and, on a writable open, moved to ``<file>.torn-<offset>`` and cut off; a bad
interior line is reported with its byte offset and skipped.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread

from durable_harness.errors import (
    CorruptSession,
    FormatError,
    ReadOnlySession,
    SessionExists,
    SessionNotFound,
    StaleGeneration,
    StorageError,
)
from durable_harness.ids import now_iso, uuid7
from durable_harness.storage import codec
from durable_harness.storage.base import (
    Durability,
    PendingCommit,
    SessionInfo,
    SessionStore,
    Store,
    damage,
    queued_commit,
)
from durable_harness.storage.indexed import IndexedSessionStore
from durable_harness.storage.lease import FileLease
from durable_harness.storage.shapes import entry_shape_error, record_shape_error

FORMAT = "durable-harness/1"
PAD = b"\n"
PAD_MIN = 64 * 1024
PAD_MAX = 1024 * 1024
"""Preallocation (``sync`` and ``batch``): the file is grown ahead of the data by a run of
empty lines, ``PAD_MIN`` to ``PAD_MAX`` bytes (as much as the data, within those bounds), and
each commit line overwrites the start of that run. An ``fdatasync`` that does not change the
file's size has no metadata to journal: measured 73 µs against 118 µs for an append of the
same 600-byte line on the development machine. Readers skip empty lines; ``close`` cuts the
padding off. See ``design/storage.md``."""
INLINE_FSYNC_S = 0.002
"""Async group commit runs ``fdatasync`` on the event loop's thread while its moving average
stays under this many seconds, and in a worker thread above it (see ``wait_durable_async``)."""
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def fsync_dir(path: str | Path) -> None:
    """fsync a directory so a created or renamed file's name is durable."""
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_own_format(header: dict[str, Any]) -> bool:
    """True when a parsed first line is a durable-harness header (not a pi file)."""
    return header.get("type") == "session" and header.get("format") == FORMAT


class JsonlSessionStore(IndexedSessionStore):
    """One session file. Open with :meth:`open_path` or :meth:`create`."""

    def __init__(
        self, path: str, header: dict[str, Any], *, read_only: bool, durability: Durability
    ) -> None:
        super().__init__(header, read_only=read_only, durability=durability, location=path)
        self.path = path
        self._fd: int | None = None
        self._lease: FileLease | None = None
        self._sync_cond = threading.Condition()
        self._written = 0
        self._end = 0  # where the next commit line goes: the end of the data
        self._size = 0  # the file's size: the data plus any preallocated padding after it
        self._single_op: dict[int, bool] = {}
        self._synced = 0
        self._syncing = False
        self._queue: list[PendingCommit] = []  # commit_async calls waiting for their group

    # -- creation and opening --------------------------------------------------------------
    @classmethod
    def create(
        cls, path: str, header: dict[str, Any], *, durability: Durability = "sync"
    ) -> JsonlSessionStore:
        """Create ``path`` exclusively (mode 0600) with ``header`` as line 1; open for writing.

        Raises:
            SessionExists: the file already exists (it is never overwritten).
        """
        header = {"type": "session", "version": 3, "format": FORMAT, **header}
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        except FileExistsError as exc:
            raise SessionExists(f"session file {path} already exists", path=path) from exc
        try:
            _write_all(fd, codec.dumps(header) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(os.path.dirname(path) or ".")
        return cls.open_path(path, write=True, durability=durability)

    @classmethod
    def open_path(
        cls,
        path: str,
        *,
        write: bool = True,
        durability: Durability = "sync",
        break_lease: bool = False,
    ) -> JsonlSessionStore:
        """Open a durable-harness session file.

        A writable open takes the lease first, then quarantines a torn tail. Damage never raises:
        it is listed in ``store.damage``.

        Raises:
            SessionNotFound: no file at ``path``.
            CorruptSession: line 1 is not a durable-harness header (use the pi importer for pi
                files).
            LeaseHeld: ``write=True`` and another live process holds the lease.
        """
        if not os.path.exists(path):
            raise SessionNotFound(f"no session file at {path}", path=path)
        lease = None
        if write:
            lease = FileLease(path + ".lock", f"session file {path}")
            lease.acquire(break_lease=break_lease)
        try:
            flags = os.O_RDWR if write else os.O_RDONLY
            fd = os.open(path, flags)
            data = _read_all(fd)
            store = cls._from_bytes(path, data, read_only=not write, durability=durability)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        store._fd = fd
        store._lease = lease
        if lease is not None:
            store.generation = lease.raise_floor(store._last_gen)
            store._quarantine_tail(data)
            store._size = os.fstat(store._fd).st_size
            if lease.contested:
                store._detach_old_writer(data[: store._end])
        return store

    def _detach_old_writer(self, content: bytes) -> None:
        """Move the session to a new inode holding ``content`` (the data, without padding).

        Called when the lease was taken from a writer that may still be alive (a broken lease,
        a removed or reset lock file). That writer checks the lease before each write, but a
        write can still slip in between its check and our takeover; its file descriptor now
        points at the old inode, so such a write, and a trim at its close, land there and can
        never overwrite or cut a line of ours. Costs one copy of the file, once per takeover.
        """
        tmp = f"{self.path}.takeover-{os.getpid()}-{time.monotonic_ns()}"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _write_all(fd, content)
            os.fsync(fd)
            os.rename(tmp, self.path)
        except BaseException:
            os.close(fd)
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        fsync_dir(os.path.dirname(self.path) or ".")
        assert self._fd is not None
        os.close(self._fd)
        self._fd = fd
        self._size = len(content)

    @classmethod
    def _from_bytes(
        cls, path: str, data: bytes, *, read_only: bool, durability: Durability
    ) -> JsonlSessionStore:
        first_end = data.find(b"\n")
        first = data if first_end < 0 else data[:first_end]
        try:
            header = codec.loads(first)
        except ValueError:
            header = None
        bad_header = not isinstance(header, dict) or not is_own_format(header)
        if bad_header:
            recovered = recover_header(
                path, header, data[first_end + 1 :] if first_end >= 0 else b""
            )
            if recovered is None:
                raise CorruptSession(
                    f"{path}: line 1 is not a durable-harness session header", path=path
                )
            header = recovered
        assert isinstance(header, dict)
        store = cls(path, header, read_only=read_only, durability=durability)
        if bad_header:
            store.damage.append(
                damage(
                    "bad_header",
                    "line 1 is damaged; the session id comes from the file name and "
                    "the commit lines that follow are read as usual",
                    offset=0,
                    line=1,
                )
            )
        store._scan(data, first_end + 1 if first_end >= 0 else len(data))
        return store

    def _scan(self, data: bytes, pos: int) -> None:
        """Index every commit line from byte ``pos``; report damage instead of raising."""
        line_no = 1
        max_gen = 0
        size = len(data)
        padding_from = len(data.rstrip(b" \t\r\n"))  # the padding: trailing blank lines
        self._end = pos
        while pos < size:
            if pos >= padding_from and data.endswith(b"\n"):
                break  # only whole blank lines remain (the padding): nothing to index or report
            line_no += 1
            end = data.find(b"\n", pos)
            if end < 0:
                self.damage.append(
                    damage(
                        "torn_tail",
                        f"final line has no newline ({size - pos} bytes); it was never "
                        "acknowledged",
                        offset=pos,
                        line=line_no,
                        length=size - pos,
                    )
                )
                self._torn = (pos, data[pos:])
                break
            raw = data[pos:end]
            if raw.strip():
                found = len(self.damage)
                self._scan_line(raw, pos, end - pos, line_no, max_gen)
                if (
                    end >= padding_from
                    and end + 1 < size
                    and len(self.damage) > found
                    and self.damage[-1]["kind"] == "bad_line"
                ):
                    # The last line, unparseable, with only padding after it: a write cut
                    # short (power loss mid-write). It is a torn tail, not interior damage.
                    self.damage[-1] = damage(
                        "torn_tail",
                        "final line is unparseable and only preallocated padding follows; "
                        "it was never acknowledged",
                        offset=pos,
                        line=line_no,
                        length=end - pos,
                    )
                    self._torn = (pos, raw)
                    break
                max_gen = max(max_gen, self._last_gen)
                self._end = end + 1
            pos = end + 1
        self._check_orphans()

    _torn: tuple[int, bytes] | None = None
    _last_gen = 0

    def _scan_line(self, raw: bytes, offset: int, length: int, line_no: int, max_gen: int) -> None:
        try:
            obj = codec.loads(raw)
            ops = obj["ops"]
            if not isinstance(ops, list):
                raise TypeError("ops is not a list")
            gen = int(obj.get("gen", 0))
        except (ValueError, KeyError, TypeError) as exc:
            self.damage.append(
                damage(
                    "bad_line",
                    f"unparseable commit line: {exc}"[:200],
                    offset=offset,
                    line=line_no,
                    length=length,
                )
            )
            return
        if gen < max_gen:
            self.damage.append(
                damage(
                    "stale_generation",
                    f"line written by generation {gen} after generation {max_gen}",
                    offset=offset,
                    line=line_no,
                )
            )
        self._last_gen = max(gen, max_gen)
        # A line is one commit: it is applied whole or not at all.
        problem: tuple[str, str, dict[str, Any]] | None = None
        seqs: list[int] = []
        new_ids: set[tuple[str, str]] = set()
        for idx, op in enumerate(ops):
            problem = (
                ("bad_line", f"op {idx} is not an object", {})
                if not isinstance(op, dict)
                else self._op_problem(op, new_ids)
            )
            if problem is not None:
                break
            body = op.get("entry") or op.get("record") or op
            seqs.append(body["seq"])
        if problem is not None:
            kind, detail, extra = problem
            self.damage.append(
                damage(
                    kind,
                    f"{detail}; the whole commit line is left out",
                    offset=offset,
                    line=line_no,
                    length=length,
                    **extra,
                )
            )
            return
        if seqs and seqs[0] > self._seq + 1:
            self.damage.append(
                damage(
                    "seq_gap",
                    f"seq jumps from {self._seq} to {seqs[0]}: commits are missing "
                    "before this line",
                    offset=offset,
                    line=line_no,
                )
            )
        for idx, op in enumerate(ops):
            self._apply(op, (offset, length, idx))

    def _op_problem(
        self, op: dict[str, Any], new_ids: set[tuple[str, str]]
    ) -> tuple[str, str, dict[str, Any]] | None:
        """Why one op of a line cannot be applied, as ``(damage kind, detail, extra)``, or
        ``None``."""
        kind = op.get("op")
        body = op.get("entry") if kind == "entry" else op.get("record") if kind == "record" else op
        if kind not in ("entry", "record", "lane") or not isinstance(body, dict):
            return ("bad_line", f"unknown op {kind!r}", {})
        shape = _shape_error(kind, op, body) or (
            entry_shape_error(body)
            if kind == "entry"
            else record_shape_error(body)
            if kind == "record"
            else None
        )
        if shape is not None:
            return ("bad_line", f"malformed {kind} op: {shape}", {})
        seq = body.get("seq")
        if not isinstance(seq, int) or seq <= self._seq:
            return ("seq_regression", f"seq {seq!r} after {self._seq}", {})
        if kind in ("entry", "record"):
            oid = body["id"]
            seen = self._meta if kind == "entry" else self._record_ids
            if oid in seen or (kind, oid) in new_ids:
                return (
                    "duplicate_id",
                    f"{kind} id {oid} appears again; the first is kept",
                    {"id": oid},
                )
            new_ids.add((kind, oid))
        return None

    def _check_orphans(self) -> None:
        for eid in self._order:
            parent, _, _seq, loc = self._meta[eid]
            if parent is not None and parent not in self._meta:
                self.damage.append(
                    damage(
                        "orphan_parent",
                        f"entry {eid} names parent {parent}, which is missing; it is "
                        "treated as a root",
                        offset=loc[0],
                        id=eid,
                        parentId=parent,
                    )
                )

    def _quarantine_tail(self, data: bytes) -> None:
        """Move a torn final line to ``<path>.torn-<offset>`` and cut it off (writable opens)."""
        if self._torn is None or self._fd is None:
            return
        offset, tail = self._torn
        side = f"{self.path}.torn-{offset}"
        n = 1
        while os.path.exists(side):  # never overwrite bytes quarantined earlier
            n += 1
            side = f"{self.path}.torn-{offset}.{n}"
        fd = os.open(side, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _write_all(fd, tail)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.ftruncate(self._fd, offset)
        os.fsync(self._fd)
        fsync_dir(os.path.dirname(self.path) or ".")
        for item in self.damage:
            if item["kind"] == "torn_tail":
                item["quarantined_to"] = side
        self._torn = None

    # -- the write path --------------------------------------------------------------------
    def _persist(self, numbered: list[dict[str, Any]], sync: bool) -> list[Any]:
        assert self._fd is not None and self._lease is not None
        self._lease.check()
        line = codec.dumps_line({"gen": self.generation, "ops": numbered})
        offset = self._end
        self._append(line, 1)
        if sync and self.durability == "sync":
            os.fdatasync(self._fd)
            self._synced = self._written
        length = len(line) - 1
        return [(offset, length, i) for i in range(len(numbered))]

    def _append(self, data: bytes, lines: int) -> None:
        """Write ``lines`` whole commit lines at the end of the data (inside the padding, or
        growing it). Raises the ``OSError`` of a failed write, after which the file and the
        index may disagree: the store then refuses every later commit."""
        fd = self._fd
        assert fd is not None
        if self._write_error is not None:
            raise self._write_error
        offset = self._end
        end = offset + len(data)
        try:
            if end <= self._size or self.durability == "none":
                _pwrite_all(fd, data, offset)
                self._size = max(self._size, end)
            else:  # grow: the lines plus fresh padding in one write
                pad = min(PAD_MAX, max(PAD_MIN, end))
                _pwrite_all(fd, data + PAD * pad, offset)
                self._size = end + pad
        except OSError as exc:
            self._write_error = StorageError(
                f"session file {self.path}: a write failed ({exc}); reopen the session to "
                "continue from what reached the file"
            )
            raise
        self._end = end
        self._written += lines

    _write_error: StorageError | None = None

    def commit(self, ops: list[Any], *, wait: bool = True) -> int:
        """Commit ``ops`` as one line (see :meth:`SessionStore.commit`).

        In ``batch`` mode the line is written under the lock and the fsync is shared with every
        other commit written meanwhile. With ``wait=False`` (``sync`` or ``batch``) the call
        returns before any fsync; :meth:`wait_durable` makes it durable later. The harness uses
        that for settlements, which the next intent's fsync covers (``design/run-loop.md``).
        """
        if self.durability != "batch" or not wait:
            return super().commit(ops, wait=wait)
        with self._lock:
            seq = super().commit(ops, wait=False)
            ticket = self._written
        self.wait_durable(ticket)
        return seq

    async def commit_async(self, ops: list[Any]) -> int:
        """Commit ``ops`` and await its durability (see :meth:`SessionStore.commit_async`).

        In ``batch`` mode this is group commit proper: the call queues its ops and yields once;
        the first queued task to resume then commits the whole queue, each call's ops as its
        own line (validated, numbered and indexed in queue order, a failing one failing alone),
        with one lease check, one write and one ``fdatasync`` for all of them. The others find
        their commit done when they resume. A call cancelled before its ops were taken is not
        committed; one cancelled later may have been. With slow fsyncs (see
        :meth:`wait_durable_async`) each call commits and then awaits the shared fsync.

        Raises:
            ReadOnlySession, IdConflict, UnknownEntry, StaleGeneration: as :meth:`commit`.
        """
        if self.durability != "batch" or self._fsync_avg_s >= INLINE_FSYNC_S:
            return await super().commit_async(ops)
        if self.read_only:
            raise ReadOnlySession(f"session {self.session_id} at {self.location} is open read-only")
        if not ops:
            return self._seq
        return await queued_commit(self._queue, ops, self._commit_group)

    def _commit_group(self, batch: list[PendingCommit]) -> None:
        """Commit queued :meth:`commit_async` calls: one line each, one write, one fsync."""
        with self._lock:
            try:
                assert self._lease is not None
                self._lease.check()  # before anything is indexed: a stale writer fails them all
                lines: list[bytes] = []
                offset = self._end
                for item in batch:
                    try:
                        self._check_ops(item.ops)
                        numbered = self._number(item.ops)
                        line = codec.dumps_line({"gen": self.generation, "ops": numbered})
                    except Exception as exc:  # nothing of this call is indexed yet
                        item.error = exc
                        continue
                    for i, op in enumerate(numbered):
                        self._apply(op, (offset, len(line) - 1, i))
                    item.seq = self._seq
                    lines.append(line)
                    offset += len(line)
                if lines:
                    self._append(b"".join(lines), len(lines))
                    covered = self._written
                    self._timed_fdatasync()
                    with self._sync_cond:
                        self._synced = max(self._synced, covered)
            except BaseException as exc:
                for item in batch:
                    item.error = item.error or exc
                if not isinstance(exc, Exception):
                    raise
            finally:
                for item in batch:
                    item.done = True

    def wait_durable(self, ticket: int | None = None) -> None:
        """Block until commit number ``ticket`` (default: every commit so far) is fsynced."""
        if self.durability == "none" or self._fd is None:
            return
        target_ticket = self._written if ticket is None else ticket
        with self._sync_cond:
            while self._synced < target_ticket:
                if self._syncing:
                    self._sync_cond.wait()
                    continue
                self._syncing = True
                covered = self._written
                self._sync_cond.release()
                try:
                    os.fdatasync(self._fd)
                finally:
                    self._sync_cond.acquire()
                    self._syncing = False
                    self._sync_cond.notify_all()
                self._synced = max(self._synced, covered)

    async def wait_durable_async(self) -> None:
        """Await an fsync covering every commit written so far (``batch`` mode).

        The async form of group commit. The caller yields once, so that every task ready to
        commit writes its line; the first task to resume then runs one ``fdatasync`` covering
        all of them, and the others find their line durable when they resume: one yield and
        one wakeup per commit, one fsync per batch.

        That fsync runs on the event loop's thread while fsyncs are fast (a moving average
        under :data:`INLINE_FSYNC_S`). Why: a worker-thread round trip costs about as much as
        a fast fsync (measured 120 µs against 160-200 µs on the development machine), and a
        thread that finished its fsync then waits for the GIL until the loop goes idle. Once
        fsyncs are slow, a leader runs them in a worker thread instead and the other tasks
        await its event, so a slow disk does not stall every task on the loop.
        """
        if self.durability == "sync":
            self.wait_durable()  # sync mode: fsync now, in the caller's thread
            return
        if self.durability != "batch" or self._fd is None:
            return
        target = self._written
        if self._synced >= target:
            return
        if self._fsync_avg_s < INLINE_FSYNC_S:
            await anyio.lowlevel.checkpoint()
            if self._synced < target and self._async_flush is None:
                covered = self._written
                self._timed_fdatasync()
                with self._sync_cond:
                    self._synced = max(self._synced, covered)
        while self._synced < target:
            leader = self._async_flush
            if leader is not None:
                await leader.wait()
                continue
            event = self._async_flush = anyio.Event()
            try:
                await anyio.lowlevel.checkpoint()  # let the tasks ready to commit write first
                covered = self._written
                await anyio.to_thread.run_sync(self._timed_fdatasync)
                with self._sync_cond:
                    self._synced = max(self._synced, covered)
            finally:
                self._async_flush = None
                event.set()

    def _timed_fdatasync(self) -> None:
        assert self._fd is not None
        started = time.perf_counter()
        os.fdatasync(self._fd)
        self._fsync_avg_s += (time.perf_counter() - started - self._fsync_avg_s) / 8

    _fsync_avg_s = 0.0  # moving average of the async leader's fsync time, seconds
    _async_flush: anyio.Event | None = None

    def lease_holder(self) -> dict[str, Any] | None:
        return (self._lease or FileLease(self.path + ".lock", self.path)).probe()

    _line_cache: tuple[int, list[Any]] | None = None

    def _load_entry(self, entry_id: str, location: Any) -> dict[str, Any]:
        offset, length, idx = location
        # One commit line can hold many entries (an import commits hundreds at once): keep the
        # last decoded line so a walk or a full read decodes each line once, not once per entry.
        fd = self._fd
        if fd is None:
            raise CorruptSession(f"session file {self.path} is closed")
        if idx == 0 and self._single_op.get(offset, True):
            ops = codec.loads(os.pread(fd, length, offset))["ops"]
            if len(ops) == 1:  # the common case: a fresh parse is already a private copy
                single: dict[str, Any] = ops[0]["entry"]
                return single
            self._single_op[offset] = False
            self._line_cache = (offset, ops)
        cached = self._line_cache
        if cached is not None and cached[0] == offset:
            ops = cached[1]
        else:
            ops = codec.loads(os.pread(fd, length, offset))["ops"]
            self._line_cache = (offset, ops)
        # A fresh copy per call: callers may mutate what they get.
        entry: dict[str, Any] = codec.loads(codec.dumps(ops[idx]["entry"]))
        return entry

    def _trim_padding(self) -> None:
        """Cut the preallocated padding off at close (the file is valid with or without it).

        Only while this writer still holds the lease and the padding is intact: a stale writer
        must never cut into lines a newer writer wrote over its padding.
        """
        fd = self._fd
        if fd is None or self.read_only or self._lease is None or self._size <= self._end:
            return
        try:
            self._lease.check()
        except StaleGeneration:
            return
        if os.fstat(fd).st_size == self._size and not os.pread(
            fd, self._size - self._end, self._end
        ).strip(PAD):
            os.ftruncate(fd, self._end)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._fd is not None:
            if not self.read_only and self.durability == "batch":
                self.wait_durable()
            self._trim_padding()
            os.close(self._fd)
            self._fd = None
        if self._lease is not None:
            self._lease.release()
            self._lease = None


def _shape_error(kind: str, op: dict[str, Any], body: dict[str, Any]) -> str | None:
    """Return why a parsed op cannot be indexed (a field of the wrong type), or ``None``.

    A single writer never produces these; they come from damage and are reported, not raised.
    """

    def opt_str(value: Any) -> bool:
        return value is None or isinstance(value, str)

    if kind == "entry" and not (opt_str(op.get("lane")) and opt_str(body.get("parentId"))):
        return "lane and parentId must be strings or null"
    if kind == "record" and not (opt_str(body.get("lane")) and opt_str(body.get("runId"))):
        return "lane and runId must be strings or null"
    if kind == "lane":
        if not isinstance(op.get("lane"), str):
            return "lane must be a string"
        if not opt_str(op.get("leafId")):
            return "leafId must be a string or null"
        if op.get("config") is not None and not isinstance(op.get("config"), dict):
            return "config must be an object"
    return None


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    written = os.pwrite(fd, data, offset)
    while written < len(data):
        written += os.pwrite(fd, data[written:], offset + written)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 22)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def cwd_dir_name(cwd: str) -> str:
    """Encode a working directory as one safe folder name (pi's scheme: ``--a-b-c--``)."""
    return "--" + cwd.strip("/\\").replace("/", "-").replace("\\", "-").replace(":", "-") + "--"


class JsonlStore(Store):
    """Session files under ``root/sessions/<encoded cwd>/<time>_<id>.jsonl``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser()
        self.spec = f"jsonl:{self.root}"

    @property
    def sessions_dir(self) -> Path:
        return self.root / "sessions"

    def create_session(
        self,
        cwd: str,
        *,
        session_id: str | None = None,
        parent_session: str | None = None,
        header_extra: dict[str, Any] | None = None,
        durability: Durability = "sync",
    ) -> SessionStore:
        sid = session_id or uuid7()
        if not _SAFE_ID.fullmatch(sid):
            raise FormatError(f"session id {sid!r} may hold only letters, digits, '.', '_', '-'")
        if session_id is not None and any(i.id == sid for i in self.list_sessions()):
            raise SessionExists(f"session {sid} already exists in {self.spec}", session_id=sid)
        folder = self.sessions_dir / cwd_dir_name(cwd)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        ts = now_iso()
        header: dict[str, Any] = {"id": sid, "timestamp": ts, "cwd": cwd}
        if parent_session:
            header["parentSession"] = parent_session
        header.update(header_extra or {})
        name = ts.replace(":", "-").replace(".", "-") + f"_{sid}.jsonl"
        return JsonlSessionStore.create(str(folder / name), header, durability=durability)

    def open_session(
        self,
        ref: str,
        *,
        write: bool = True,
        durability: Durability = "sync",
        break_lease: bool = False,
    ) -> SessionStore:
        path = ref if ref.endswith(".jsonl") and os.path.exists(ref) else self.resolve(ref).path
        return JsonlSessionStore.open_path(
            path, write=write, durability=durability, break_lease=break_lease
        )

    def list_sessions(self, cwd: str | None = None) -> list[SessionInfo]:
        if not self.sessions_dir.exists():
            return []
        folders = (
            [self.sessions_dir / cwd_dir_name(cwd)]
            if cwd is not None
            else sorted(p for p in self.sessions_dir.iterdir() if p.is_dir())
        )
        out: list[SessionInfo] = []
        for folder in folders:
            if not folder.is_dir():
                continue
            for path in folder.glob("*.jsonl"):
                header = _read_header(path)
                if header is None:
                    continue
                st = path.stat()
                out.append(
                    SessionInfo(
                        id=str(header["id"]),
                        cwd=str(header.get("cwd", "")),
                        path=str(path),
                        created=str(header.get("timestamp", "")),
                        modified=f"{st.st_mtime:.6f}",
                        parent_session=header.get("parentSession"),
                    )
                )
        out.sort(key=lambda i: float(i.modified), reverse=True)
        return out


def _read_header(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as fh:
            first = fh.readline(1 << 20)
            second = fh.readline(1 << 20)
    except OSError:
        return None
    try:
        header = codec.loads(first)
    except ValueError:
        header = None
    if isinstance(header, dict) and is_own_format(header):
        return header
    return recover_header(str(path), header, second)


_NAME_ID = re.compile(r"_([A-Za-z0-9][A-Za-z0-9._-]*)\.jsonl$")


def recover_header(path: str, header: Any, rest: bytes) -> dict[str, Any] | None:
    """A stand-in header for a session file whose line 1 is damaged, when the file is still
    recognisably ours (the next line is a commit line and the name ends ``_<id>.jsonl``):
    losing one header byte must not make a session, and an in-doubt run in it, disappear."""
    match = _NAME_ID.search(os.path.basename(path))
    line = rest.split(b"\n", 1)[0]
    try:
        commit = codec.loads(line) if line.strip() else None
    except ValueError:
        commit = None
    if match is None or not (isinstance(commit, dict) and "ops" in commit):
        return None
    old = header if isinstance(header, dict) else {}
    cwd = old.get("cwd") if isinstance(old.get("cwd"), str) else ""
    return {
        "type": "session",
        "version": 3,
        "format": FORMAT,
        "id": match.group(1),
        "timestamp": str(old.get("timestamp", "")),
        "cwd": cwd,
        "headerDamaged": True,
    }
