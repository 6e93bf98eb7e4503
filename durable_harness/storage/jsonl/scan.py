"""The scanner of a session file, pure: its bytes in; its header, the commits to index and the
damage out, reported instead of raised (``design/storage.md``). No file descriptor, no system
call, no store: the store's open applies the commits it yields to its index."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from durable_harness.errors import CorruptSession
from durable_harness.storage import codec
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

Problem = tuple[str, str, dict[str, Any]]  # (damage kind, detail, extra fields)
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
        data, pos, line_no, max_gen = self._data, self.end, self._line_no, 0
        size = len(data)
        padding_from = _text_end(data)  # the padding: trailing blank lines
        while pos < size:
            if pos >= padding_from and data.endswith(b"\n"):
                break  # only whole blank lines remain (the padding): nothing to index or report
            line_no += 1
            end = data.find(b"\n", pos)
            if end < 0:
                detail = (
                    f"final line has no newline ({size - pos} bytes); it was never acknowledged"
                )
                self._torn(pos, data[pos:], line_no, detail)
                break
            raw = data[pos:end]
            if raw and not raw.isspace():  # (strip() would copy every line to test it)
                found = len(self.damage)
                ops = self._read_line(raw, pos, line_no, max_gen)
                if (
                    end >= padding_from
                    and end + 1 < size
                    and len(self.damage) > found
                    and self.damage[-1]["kind"] == "bad_line"
                ):
                    # The last line, unparseable, with only padding after it: a write cut
                    # short (power loss mid-write). It is a torn tail, not interior damage.
                    self.damage.pop()
                    detail = (
                        "final line is unparseable and only preallocated padding follows; "
                        "it was never acknowledged"
                    )
                    self._torn(pos, raw, line_no, detail)
                    break
                if ops is not None:
                    yield pos, end - pos, ops
                max_gen = max(max_gen, self.generation)
                self.end, self.lines = end + 1, line_no
            pos = end + 1
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

    def _read_line(
        self, raw: bytes, offset: int, line_no: int, max_gen: int
    ) -> list[dict[str, Any]] | None:
        """The ops of one commit line (``raw``, at byte ``offset``, line ``line_no``) when it
        indexes whole; else ``None``, with why listed in :attr:`damage`."""
        try:
            obj, replaced = codec.loads_counted(raw)
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
        if gen < max_gen:
            detail = f"line written by generation {gen} after generation {max_gen}"
            self.damage.append(damage("stale_generation", detail, offset=offset, line=line_no))
        self.generation = max(gen, max_gen)
        problem: Problem | None = None
        new_ids: set[tuple[str, str]] = set()
        bodies: list[tuple[str, dict[str, Any]]] = []  # (kind, body) of each op, once checked
        for idx, op in enumerate(ops):
            problem = (
                ("bad_line", f"op {idx} is not an object", {})
                if not isinstance(op, dict)
                else self._op_problem(op, new_ids, bodies)
            )
            if problem is not None:
                kind, detail, extra = problem
                detail += "; the whole commit line is left out"
                self.damage.append(
                    damage(kind, detail, length=len(raw), offset=offset, line=line_no, **extra)
                )
                return None
        if bodies and bodies[0][1]["seq"] > self.seq + 1:
            self.damage.append(
                seq_gap_damage(self.seq, bodies[0][1]["seq"], offset=offset, line=line_no)
            )
        if replaced:
            self.damage.extend(surrogate_warnings(raw, ops, offset=offset, line=line_no))
        seq = self.seq
        for kind, body in bodies:
            if kind == "entry":
                self._parents[body["id"]] = (body.get("parentId"), offset)
            elif kind == "record":
                self._records.add(body["id"])
            seq = max(seq, body["seq"])
        self.seq = seq
        return ops

    def _op_problem(
        self,
        op: dict[str, Any],
        new_ids: set[tuple[str, str]],
        bodies: list[tuple[str, dict[str, Any]]],
    ) -> Problem | None:
        """Why one op of a line cannot be indexed, or ``None`` (its kind and body then join
        ``bodies``)."""
        kind = op.get("op")
        body = op.get("entry") if kind == "entry" else op.get("record") if kind == "record" else op
        if kind not in ("entry", "record", "lane") or not isinstance(body, dict):
            return ("bad_line", f"unknown op {kind!r}", {})
        shape = shape_error(kind, op, body) or (
            entry_shape_error(body)
            if kind == "entry"
            else record_shape_error(body)
            if kind == "record"
            else None
        )
        if shape is not None:
            return ("bad_line", f"malformed {kind} op: {shape}", {})
        seq = body.get("seq")
        if not isinstance(seq, int) or seq <= self.seq:
            return ("seq_regression", f"seq {seq!r} after {self.seq}", {})
        if kind in ("entry", "record"):
            oid = body["id"]
            seen = self._parents if kind == "entry" else self._records
            if oid in seen or (kind, oid) in new_ids:
                return (
                    "duplicate_id",
                    f"{kind} id {oid} appears again; the first is kept",
                    {"id": oid},
                )
            new_ids.add((kind, oid))
        bodies.append((kind, body))
        return None
