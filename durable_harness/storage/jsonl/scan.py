"""The scanner of a session file, pure: its bytes in; its header, the commits to index and the
damage out, reported instead of raised (``design/storage.md``). No file descriptor, no system
call, no store: the store's open applies the commits it yields to its index."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from durable_harness.errors import CorruptSession
from durable_harness.storage.codec import loads_counted
from durable_harness.storage.damage import (
    damage,
    seq_gap_damage,
    surrogate_warnings,
    truncated_damage,
)
from durable_harness.storage.jsonl.framing import (
    MARK_KEY,
    parse_mark,
    read_header,
    shape_error,
)
from durable_harness.storage.shapes import entry_shape_error, record_shape_error

HEADER_DAMAGE = {
    "missing_header": "line 1 is a commit line, not the session header: the header was removed; "
    "the session id comes from the file name and every line is read as a commit",
    "bad_header": "line 1 is damaged; the session id comes from the file name and the commit "
    "lines that follow are read as usual",
}


def _text_end(data: bytes) -> int:
    """``len(data.rstrip(b" \\t\\r\\n"))`` without copying the whole file: only its end, taken
    in growing pieces until one holds more than blanks (the padding is at most about 1 MiB)."""
    piece = 1 << 16
    while True:
        start = max(0, len(data) - piece)
        end = len(data[start:].rstrip(b" \t\r\n"))
        if end or not start:
            return start + end
        piece *= 4


class Scan:
    """One reading of ``data``, the whole content of the session file at ``path``.

    Attributes (those after ``mark`` final once :meth:`commits` is exhausted):
        header: line 1 (or a stand-in for a damaged one, see ``framing.recover_header``),
            without the mark field.
        damage: what was found, in file order (see :func:`~durable_harness.storage.damage.damage`).
        mark_at: the byte offset of the mark's text in line 1 (``None``: the file has none).
        mark: the seq the mark holds (``None``: no mark, or its text fails its check).
        seq: the last seq indexed. generation: the highest generation of a line read.
        end: where the data ends (the next commit line goes there). lines: the number of the
            last line read (header included).
        torn: ``(offset, bytes)`` of a torn final line (never acknowledged), else ``None``.

    Raises:
        CorruptSession: line 1 is not a durable-harness header and the file is not
            recognisably a session.
    """

    def __init__(self, path: str, data: bytes) -> None:
        self._data = data
        first_end = data.find(b"\n")
        first = data if first_end < 0 else data[:first_end]
        start = len(data) if first_end < 0 else first_end + 1
        second_end = data.find(b"\n", start)
        header, kind = read_header(
            path, first, data[start : second_end if second_end >= 0 else None]
        )
        if header is None:
            raise CorruptSession(
                f"{path}: line 1 is not a durable-harness session header", path=path
            )
        self.header = header
        self.damage: list[dict[str, Any]] = []
        if kind is not None:
            self.damage.append(damage(kind, HEADER_DAMAGE[kind], offset=0, line=1))
        self.mark_at, self.mark = (None, None) if kind else parse_mark(first)
        if self.mark_at is not None and self.mark is None:
            detail = (
                f"the {MARK_KEY} high-water mark in line 1 does not verify; a cut at the end of "
                "the file cannot be detected"
            )
            self.damage.append(damage("bad_mark", detail, offset=self.mark_at, line=1))
        # Line 1 deleted: it is a commit, read as one (never taken for a damaged header).
        self._line_no = 0 if kind == "missing_header" else 1
        self.end = 0 if kind == "missing_header" else start
        self.seq = self.generation = 0
        self.lines = 1
        self.torn: tuple[int, bytes] | None = None
        self._parents: dict[str, tuple[str | None, int]] = {}  # entry id: (parent, offset)
        self._records: set[str] = set()

    def commits(self) -> Iterator[tuple[int, int, list[dict[str, Any]]]]:
        """Every commit line that indexes whole, in file order, as ``(offset, length, ops)``;
        what cannot is listed in :attr:`damage` (a line is one commit: whole or not at all)."""
        data, pos, line_no = self._data, self.end, self._line_no
        size = len(data)
        padding_from = _text_end(data)  # the padding: trailing blank lines
        # Only whole blank lines remain past ``padding_from`` when the data ends in a newline
        # (the padding): nothing there to index or report.
        stop = padding_from if data.endswith(b"\n") else size
        find, read_line, found = data.find, self._read_line, self.damage
        last_end, last_line = self.end, self.lines
        try:
            while pos < stop:
                line_no += 1
                end = find(b"\n", pos)
                if end < 0:
                    detail = (
                        f"final line has no newline ({size - pos} bytes); it was never acknowledged"
                    )
                    self._torn(pos, data[pos:], line_no, detail)
                    break
                raw = data[pos:end]
                if raw and not raw.isspace():  # (strip() would copy every line to test it)
                    ops = read_line(raw, pos, line_no)
                    if ops is not None:
                        yield pos, end - pos, ops
                    elif end >= padding_from and end + 1 < size and found[-1]["kind"] == "bad_line":
                        # The last line, unparseable, with only padding after it: a write cut
                        # short (power loss mid-write). It is a torn tail, not interior damage.
                        found.pop()
                        detail = (
                            "final line is unparseable and only preallocated padding follows; "
                            "it was never acknowledged"
                        )
                        self._torn(pos, raw, line_no, detail)
                        break
                    last_end, last_line = end + 1, line_no
                pos = end + 1
        finally:
            self.end, self.lines = last_end, last_line
        for eid, (parent, offset) in self._parents.items():
            if parent is not None and parent not in self._parents:
                detail = (
                    f"entry {eid} names parent {parent}, which is missing; it is treated as a root"
                )
                self.damage.append(
                    damage("orphan_parent", detail, offset=offset, id=eid, parentId=parent)
                )
        if self.mark is not None and self.seq < self.mark:
            self.damage.append(
                truncated_damage(self.mark, self.seq, offset=self.end, line=self.lines + 1)
            )

    def _torn(self, offset: int, tail: bytes, line_no: int, detail: str) -> None:
        self.damage.append(
            damage("torn_tail", detail, offset=offset, line=line_no, length=len(tail))
        )
        self.torn = (offset, tail)

    def _read_line(self, raw: bytes, offset: int, line_no: int) -> list[dict[str, Any]] | None:
        """The ops of one commit line (``raw``, at byte ``offset``, line ``line_no``) when it
        indexes whole; else ``None``, with why listed in :attr:`damage`. Lines are read in
        file order, so :attr:`generation` is the highest generation before this one."""
        try:
            obj, replaced = loads_counted(raw)
            ops = obj["ops"]
            if not isinstance(ops, list):
                raise TypeError("ops is not a list")
            gen = int(obj.get("gen", 0))
        except (ValueError, KeyError, TypeError) as exc:
            detail = f"unparseable commit line: {exc}"[:200]
            self.damage.append(
                damage("bad_line", detail, length=len(raw), offset=offset, line=line_no)
            )
            return None
        if gen < self.generation:
            detail = f"line written by generation {gen} after generation {self.generation}"
            self.damage.append(damage("stale_generation", detail, offset=offset, line=line_no))
        else:
            self.generation = gen
        try:
            if len(ops) == 1:  # the common case: no op of the line to compare ids with
                checked = [self._checked(ops[0], 0, None)]
            else:
                new_ids: set[tuple[str, str]] = set()
                checked = [self._checked(op, idx, new_ids) for idx, op in enumerate(ops)]
        except _LeftOut as bad:
            detail = f"{bad.detail}; the whole commit line is left out"
            self.damage.append(
                damage(bad.kind, detail, length=len(raw), offset=offset, line=line_no, **bad.extra)
            )
            return None
        seq = self.seq
        if checked and checked[0][2] > seq + 1:
            self.damage.append(seq_gap_damage(seq, checked[0][2], offset=offset, line=line_no))
        if replaced:
            self.damage.extend(surrogate_warnings(raw, ops, offset=offset, line=line_no))
        for kind, body, op_seq in checked:
            if kind == "entry":
                self._parents[body["id"]] = (body.get("parentId"), offset)
            elif kind == "record":
                self._records.add(body["id"])
            if op_seq > seq:
                seq = op_seq
        self.seq = seq
        return ops

    def _checked(
        self, op: Any, idx: int, new_ids: set[tuple[str, str]] | None
    ) -> tuple[str, dict[str, Any], int]:
        """``(kind, body, seq)`` of op ``idx`` of a line, when it can be indexed; ``new_ids``:
        the ``(kind, id)`` of the line's ops before it (``None``: it is the line's only op).

        Raises:
            _LeftOut: why it cannot (the line is then left out whole).
        """
        if not isinstance(op, dict):
            raise _LeftOut("bad_line", f"op {idx} is not an object")
        kind: Any = op.get("op")
        if kind == "entry":
            body = op.get("entry")
            seen: dict[str, Any] | set[str] | None = self._parents
            check: Callable[[dict[str, Any]], str | None] | None = entry_shape_error
        elif kind == "record":
            body = op.get("record")
            seen, check = self._records, record_shape_error
        elif kind == "lane":
            body, seen, check = op, None, None
        else:
            body = None
        if not isinstance(body, dict):
            raise _LeftOut("bad_line", f"unknown op {kind!r}")
        shape = shape_error(kind, op, body) or (check(body) if check is not None else None)
        if shape is not None:
            raise _LeftOut("bad_line", f"malformed {kind} op: {shape}")
        seq = body.get("seq")
        if not isinstance(seq, int) or seq <= self.seq:
            raise _LeftOut("seq_regression", f"seq {seq!r} after {self.seq}")
        if seen is not None:
            oid = body["id"]
            if oid in seen or (new_ids is not None and (kind, oid) in new_ids):
                detail = f"{kind} id {oid} appears again; the first is kept"
                raise _LeftOut("duplicate_id", detail, id=oid)
            if new_ids is not None:
                new_ids.add((kind, oid))
        return kind, body, seq


class _LeftOut(Exception):
    """Why an op of a commit line cannot be indexed: the damage ``kind``, its ``detail`` and
    ``extra`` fields (raised by :meth:`Scan._checked`, reported by :meth:`Scan._read_line`)."""

    def __init__(self, kind: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.kind, self.detail, self.extra = kind, detail, extra
