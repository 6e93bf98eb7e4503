"""Damage: the items a backend reports for what it finds wrong in a stored session (never
raised), their kinds, and the one continuity rule of every backend (``design/storage.md``,
"Every damage kind")."""

from __future__ import annotations

from typing import Any

from durable_harness.storage import codec


def damage(
    kind: str, detail: str, *, offset: int | None = None, line: int | None = None, **extra: Any
) -> dict[str, Any]:
    """Build one damage item ``{kind, detail, offset?, line?, ...}`` (``offset`` a byte offset,
    ``line`` 1-based; the kinds: ``design/storage.md`` "Every damage kind, every backend")."""
    item: dict[str, Any] = {"kind": kind, "detail": detail}
    if offset is not None:
        item["offset"] = offset
    if line is not None:
        item["line"] = line
    item.update(extra)
    return item


WARNING_KINDS = frozenset({"replaced_surrogate"})
"""Damage kinds that lose nothing (warnings): they never make a log "damaged"."""


def surrogate_warnings(
    raw: bytes, ops: list[Any], *, offset: int | None = None, line: int | None = None
) -> list[dict[str, Any]]:
    """One ``replaced_surrogate`` warning per op of the commit line ``raw`` (decoded into ``ops``)
    that held a lone surrogate, naming the op and where in it."""
    by_op: dict[int, list[str]] = {}
    for path in codec.lone_surrogate_paths(raw):
        if len(path) >= 2 and path[0] == "ops" and isinstance(path[1], int):
            by_op.setdefault(path[1], []).append(codec.format_path(path[3:] or path[2:]))
        else:
            by_op.setdefault(-1, []).append(codec.format_path(path))
    out: list[dict[str, Any]] = []
    for idx, where in sorted(by_op.items()):
        op = ops[idx] if 0 <= idx < len(ops) and isinstance(ops[idx], dict) else {}
        body = op.get("entry") or op.get("record")
        what, oid = (
            (op.get("op"), body.get("id"))
            if isinstance(body, dict)
            else ("lane", op.get("lane"))
            if op
            else ("commit line", None)
        )
        out.append(
            damage(
                "replaced_surrogate",
                f"{what}{'' if oid is None else ' ' + str(oid)}: lone UTF-16 surrogate in "
                f"{', '.join(where)} read as U+FFFD; the file is unchanged",
                offset=offset,
                line=line,
                id=oid,
            )
        )
    return out


def seq_gap_damage(after: int, seq: int, **location: Any) -> dict[str, Any]:
    """A ``seq_gap`` item: ``seq`` follows ``after`` with numbers missing; ``location`` of the op
    after."""
    return damage(
        "seq_gap",
        f"seq jumps from {after} to {seq}: {seq - after - 1} op(s) are missing before it",
        after=after,
        seq=seq,
        missing=seq - after - 1,
        **location,
    )


def truncated_damage(expected: int, found: int, **location: Any) -> dict[str, Any]:
    """A ``truncated`` item: the mark says ``expected`` but the stored ops end at ``found``."""
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
    """The one continuity rule of every backend: ``seq_gap`` items for ``ops`` (``(seq, location)``
    in stored order, after ``start``), and ``truncated`` (at ``end``) when the last seq is below
    the high-water ``mark`` (``None``: none kept)."""
    out: list[dict[str, Any]] = []
    prev = start
    for seq, location in ops:
        if seq > prev + 1:
            out.append(seq_gap_damage(prev, seq, **location))
        prev = max(prev, seq)
    if mark is not None and prev < mark:
        out.append(truncated_damage(mark, prev, **(end or {})))
    return out
