"""Reading a session file: the header (or a stand-in for a damaged one), every commit line
indexed into the store, damage reported instead of raised (``design/storage.md``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from durable_harness.errors import CorruptSession
from durable_harness.storage import codec
from durable_harness.storage.base import Durability
from durable_harness.storage.damage import (
    damage,
    seq_gap_damage,
    surrogate_warnings,
    truncated_damage,
)
from durable_harness.storage.jsonl.framing import (
    is_commit_line,
    is_own_format,
    recover_header,
    shape_error,
)
from durable_harness.storage.jsonl.mark import MARK_KEY, parse_mark
from durable_harness.storage.shapes import entry_shape_error, record_shape_error

if TYPE_CHECKING:
    from durable_harness.storage.jsonl.store import JsonlSessionStore


def read_session(
    cls: type[JsonlSessionStore], path: str, data: bytes, *, read_only: bool, durability: Durability
) -> JsonlSessionStore:
    """Build a ``cls`` store from the whole content ``data`` of the file at ``path``: header,
    mark, every commit line indexed, damage listed in ``store.damage``.

    Raises:
        CorruptSession: line 1 is not a durable-harness header and the file is not
            recognisably a session (see :func:`recover_header`).
    """
    first_end = data.find(b"\n")
    first = data if first_end < 0 else data[:first_end]
    try:
        header = codec.loads(first)
    except ValueError:
        header = None
    # Line 1 deleted: the first line is a commit. It is read as one, never taken for a
    # damaged header (which would drop the commit).
    missing = isinstance(header, dict) and is_commit_line(header)
    bad_header = not isinstance(header, dict) or not is_own_format(header)
    if bad_header:
        rest = data if missing else data[first_end + 1 :] if first_end >= 0 else b""
        recovered = recover_header(path, None if missing else header, rest)
        if recovered is None:
            raise CorruptSession(
                f"{path}: line 1 is not a durable-harness session header", path=path
            )
        header = recovered
    assert isinstance(header, dict)
    mark_at, mark = (None, None) if bad_header else parse_mark(first)
    header.pop(MARK_KEY, None)
    store = cls(path, header, read_only=read_only, durability=durability)
    if missing:
        store.damage.append(
            damage(
                "missing_header",
                "line 1 is a commit line, not the session header: the header was removed; "
                "the session id comes from the file name and every line is read as a "
                "commit",
                offset=0,
                line=1,
            )
        )
    elif bad_header:
        store.damage.append(
            damage(
                "bad_header",
                "line 1 is damaged; the session id comes from the file name and "
                "the commit lines that follow are read as usual",
                offset=0,
                line=1,
            )
        )
    if mark_at is not None and mark is None:
        store.damage.append(
            damage(
                "bad_mark",
                f"the {MARK_KEY} high-water mark in line 1 does not verify; a cut at the "
                "end of the file cannot be detected",
                offset=mark_at,
                line=1,
            )
        )
    store._mark_at = mark_at
    if missing:
        scan(store, data, 0, line_no=0)
    else:
        scan(store, data, first_end + 1 if first_end >= 0 else len(data))
    if mark is not None:
        if store._seq < mark:
            store.damage.append(
                truncated_damage(mark, store._seq, offset=store._end, line=store._lines + 1)
            )
        store._marked = mark
    return store


def scan(store: JsonlSessionStore, data: bytes, pos: int, line_no: int = 1) -> None:
    """Index every commit line from byte ``pos`` (after line ``line_no``); report damage
    instead of raising."""
    max_gen = 0
    size = len(data)
    padding_from = len(data.rstrip(b" \t\r\n"))  # the padding: trailing blank lines
    store._end = pos
    while pos < size:
        if pos >= padding_from and data.endswith(b"\n"):
            break  # only whole blank lines remain (the padding): nothing to index or report
        line_no += 1
        end = data.find(b"\n", pos)
        if end < 0:
            store.damage.append(
                damage(
                    "torn_tail",
                    f"final line has no newline ({size - pos} bytes); it was never acknowledged",
                    offset=pos,
                    line=line_no,
                    length=size - pos,
                )
            )
            store._torn = (pos, data[pos:])
            break
        raw = data[pos:end]
        if raw.strip():
            found = len(store.damage)
            scan_line(store, raw, pos, end - pos, line_no, max_gen)
            if (
                end >= padding_from
                and end + 1 < size
                and len(store.damage) > found
                and store.damage[-1]["kind"] == "bad_line"
            ):
                # The last line, unparseable, with only padding after it: a write cut
                # short (power loss mid-write). It is a torn tail, not interior damage.
                store.damage[-1] = damage(
                    "torn_tail",
                    "final line is unparseable and only preallocated padding follows; "
                    "it was never acknowledged",
                    offset=pos,
                    line=line_no,
                    length=end - pos,
                )
                store._torn = (pos, raw)
                break
            max_gen = max(max_gen, store._last_gen)
            store._end = end + 1
            store._lines = line_no
        pos = end + 1
    check_orphans(store)


def scan_line(
    store: JsonlSessionStore, raw: bytes, offset: int, length: int, line_no: int, max_gen: int
) -> None:
    """Index one commit line (``raw``, at byte ``offset``, line ``line_no``) whole, or list
    why it is left out in ``store.damage``."""
    try:
        obj, replaced = codec.loads_counted(raw)
        ops = obj["ops"]
        if not isinstance(ops, list):
            raise TypeError("ops is not a list")
        gen = int(obj.get("gen", 0))
    except (ValueError, KeyError, TypeError) as exc:
        store.damage.append(
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
        store.damage.append(
            damage(
                "stale_generation",
                f"line written by generation {gen} after generation {max_gen}",
                offset=offset,
                line=line_no,
            )
        )
    store._last_gen = max(gen, max_gen)
    # A line is one commit: it is applied whole or not at all.
    problem: tuple[str, str, dict[str, Any]] | None = None
    seqs: list[int] = []
    new_ids: set[tuple[str, str]] = set()
    for idx, op in enumerate(ops):
        problem = (
            ("bad_line", f"op {idx} is not an object", {})
            if not isinstance(op, dict)
            else op_problem(store, op, new_ids)
        )
        if problem is not None:
            break
        body = op.get("entry") or op.get("record") or op
        seqs.append(body["seq"])
    if problem is not None:
        kind, detail, extra = problem
        store.damage.append(
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
    if seqs and seqs[0] > store._seq + 1:
        store.damage.append(seq_gap_damage(store._seq, seqs[0], offset=offset, line=line_no))
    if replaced:
        store.damage.extend(surrogate_warnings(raw, ops, offset=offset, line=line_no))
    for idx, op in enumerate(ops):
        store._apply(op, (offset, length, idx))


def op_problem(
    store: JsonlSessionStore, op: dict[str, Any], new_ids: set[tuple[str, str]]
) -> tuple[str, str, dict[str, Any]] | None:
    """Why one op of a line cannot be applied, as ``(damage kind, detail, extra)``, or
    ``None``."""
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
    if not isinstance(seq, int) or seq <= store._seq:
        return ("seq_regression", f"seq {seq!r} after {store._seq}", {})
    if kind in ("entry", "record"):
        oid = body["id"]
        seen = store._meta if kind == "entry" else store._record_ids
        if oid in seen or (kind, oid) in new_ids:
            return (
                "duplicate_id",
                f"{kind} id {oid} appears again; the first is kept",
                {"id": oid},
            )
        new_ids.add((kind, oid))
    return None


def check_orphans(store: JsonlSessionStore) -> None:
    """List every indexed entry whose parent is missing as ``orphan_parent`` damage."""
    for eid in store._order:
        parent, _, _seq, loc = store._meta[eid]
        if parent is not None and parent not in store._meta:
            store.damage.append(
                damage(
                    "orphan_parent",
                    f"entry {eid} names parent {parent}, which is missing; it is treated as a root",
                    offset=loc[0],
                    id=eid,
                    parentId=parent,
                )
            )
