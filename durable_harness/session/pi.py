"""Sessions written by the pi coding agent: format versions 1, 2 and 3, migrated in memory.

pi's format (``packages/coding-agent/docs/session.md`` in pi-mono): line 1 is a header
``{"type": "session", "version"?, "id", "timestamp", "cwd"}``; each later line is one entry.

* v1 has no ``id``/``parentId``: entries form a chain in file order, and a compaction names its
  first kept entry by ``firstKeptEntryIndex`` (an index into the file's lines, header = 0).
* v2 adds ``id``/``parentId`` and ``firstKeptEntryId``.
* v3 renames the message role ``hookMessage`` to ``custom``.

Migration never modifies the file. v1 ids are derived from the session id and the line number
(8 hex digits of SHA-256), so opening the same file twice gives the same ids. The leaf is the
last entry, as in pi.
"""

from __future__ import annotations

import hashlib
from typing import Any

from durable_harness.errors import CorruptSession, SessionNotFound
from durable_harness.models.header import VERSION
from durable_harness.session.session import copy_ops
from durable_harness.storage import codec
from durable_harness.storage.base import LaneOp, Store
from durable_harness.storage.damage import damage
from durable_harness.storage.indexed import MemorySessionStore
from durable_harness.storage.shapes import entry_shape_error


def read_lines(data: bytes) -> tuple[list[tuple[int, int, Any]], list[dict[str, Any]]]:
    """Split on ``\\n`` only and parse each line; return ``([(offset, line_no, obj)], damage)``.

    A line holding a lone UTF-16 surrogate escape loads with U+FFFD in its place and adds a
    ``replaced_surrogate`` warning (``line``, ``offset``, ``paths``: where in the line);
    :func:`open_pi_file` names the entry.
    """
    out: list[tuple[int, int, Any]] = []
    dmg: list[dict[str, Any]] = []
    pos, line_no = 0, 0
    while pos < len(data):
        line_no += 1
        end = data.find(b"\n", pos)
        raw = data[pos:] if end < 0 else data[pos:end]
        if raw.strip():
            try:
                obj, replaced = codec.loads_counted(raw)
                out.append((pos, line_no, obj))
                if replaced:
                    where = [codec.format_path(p) for p in codec.lone_surrogate_paths(raw)]
                    dmg.append(
                        damage(
                            "replaced_surrogate",
                            f"line {line_no}: lone UTF-16 surrogate in {', '.join(where)} read "
                            "as U+FFFD; the file is unchanged",
                            offset=pos,
                            line=line_no,
                            paths=where,
                        )
                    )
            except ValueError as exc:
                kind = "torn_tail" if end < 0 else "bad_line"
                dmg.append(
                    damage(
                        kind,
                        f"unparseable line: {exc}"[:200],
                        offset=pos,
                        line=line_no,
                        length=len(raw),
                    )
                )
        if end < 0:
            break
        pos = end + 1
    return out, dmg


def _short_id(session_id: str, line_no: int) -> str:
    return hashlib.sha256(f"{session_id}:{line_no}".encode()).hexdigest()[:8]


def migrate(header: dict[str, Any], lines: list[tuple[int, int, Any]]) -> list[dict[str, Any]]:
    """Return the entries of a pi file as version 3 dicts (copies; the input is not changed)."""
    version = int(header.get("version") or 1)
    sid = str(header.get("id", ""))
    entries = [
        dict(obj) for _, _, obj in lines if isinstance(obj, dict) and obj.get("type") != "session"
    ]
    line_nos = [n for _, n, obj in lines if isinstance(obj, dict) and obj.get("type") != "session"]
    if version < 2:
        by_index: dict[int, str] = {}
        prev: str | None = None
        for entry, line_no in zip(entries, line_nos, strict=True):
            entry["id"] = _short_id(sid, line_no)
            entry["parentId"] = prev
            prev = entry["id"]
            by_index[line_no - 1] = entry["id"]
        for entry in entries:
            if entry.get("type") == "compaction" and "firstKeptEntryIndex" in entry:
                index = entry.pop("firstKeptEntryIndex")
                if isinstance(index, int) and index in by_index:
                    entry["firstKeptEntryId"] = by_index[index]
    if version < 3:
        for entry in entries:
            msg = entry.get("message")
            if (
                entry.get("type") == "message"
                and isinstance(msg, dict)
                and msg.get("role") == "hookMessage"
            ):
                entry["message"] = {**msg, "role": "custom"}
    return entries


LEAF_TYPE = "durable-harness/leaf"
"""``customType`` of the entry our export adds to mark a leaf that cannot be the last line."""

LOG_TYPE = "durable-harness/log"
"""``customType`` of the entry our export adds to carry the operation log (``--with-log``)."""


def read_back(entries: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """Undo what our pi export added (``session/pi_export.py``): return the entries and the leaf.

    The leaf is the last entry (pi's rule), except that a last ``custom`` entry of ours
    (:data:`LEAF_TYPE`, dropped, or :data:`LOG_TYPE`, kept as data) names the leaf by its
    ``parentId``. ``usage.costUnknown`` (an unknown cost written as zeros) reads back as
    ``cost: None``.
    """
    out = [_cost_back(e) for e in entries]
    leaf = out[-1].get("id") if out else None
    last = out[-1] if out else {}
    if last.get("type") == "custom" and last.get("customType") in (LEAF_TYPE, LOG_TYPE):
        leaf = last.get("parentId")
        if last["customType"] == LEAF_TYPE:
            out.pop()
    return out, leaf if isinstance(leaf, str) else None


def _cost_back(entry: dict[str, Any]) -> dict[str, Any]:
    msg = entry.get("message")
    usage = msg.get("usage") if isinstance(msg, dict) else None
    if not isinstance(usage, dict) or usage.get("costUnknown") is not True:
        return entry
    usage = {k: v for k, v in usage.items() if k != "costUnknown"} | {"cost": None}
    return {**entry, "message": {**msg, "usage": usage}}  # type: ignore[dict-item]


def is_pi_header(obj: Any) -> bool:
    """True for a pi header line (``type == "session"`` without our ``format`` marker)."""
    return isinstance(obj, dict) and obj.get("type") == "session" and "format" not in obj


def read_head(path: str) -> tuple[Any, bool]:
    """Line 1 of a session file, parsed (``None`` when it does not parse), and whether the
    file is pi's: a pi header whose next line is no commit of ours.

    Raises:
        OSError: the file cannot be read.
    """
    with open(path, "rb") as fh:
        first = fh.readline(1 << 20)
        second = fh.readline(1 << 20)
    try:
        header = codec.loads(first)
    except ValueError:
        header = None
    return header, is_pi_header(header) and b'"ops"' not in second


def open_pi_file(path: str) -> MemorySessionStore:
    """Open a pi session file read-only, migrated in memory, with lane ``main`` at the last
    entry. Damage (bad lines, torn tail, orphans, duplicate ids) is in ``store.damage``.

    Raises:
        SessionNotFound: no file at ``path``.
        CorruptSession: line 1 is not a pi session header.
    """
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError as exc:
        raise SessionNotFound(f"no session file at {path}", path=path) from exc
    lines, dmg = read_lines(data)
    if not lines or not is_pi_header(lines[0][2]):
        raise CorruptSession(f"{path}: line 1 is not a pi session header", path=path)
    version = lines[0][2].get("version")
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        raise CorruptSession(
            f"{path}: line 1 has a version that is not a number: {version!r}", path=path
        )
    header = dict(lines[0][2])
    entries, leaf = read_back(migrate(header, lines[1:]))
    header["version"] = VERSION
    header["migratedFrom"] = int(lines[0][2].get("version") or 1)
    store = MemorySessionStore(header, read_only=True, location=path)
    _name_surrogate_entries(dmg, lines)
    store.damage = dmg
    numbered: list[dict[str, Any]] = []
    seen: set[str] = set()
    for seq, entry in enumerate(entries, start=1):
        eid = entry.get("id")
        if not isinstance(eid, str) or eid in seen:
            store.damage.append(
                damage("duplicate_id", f"entry id {eid!r} missing or repeated", id=eid)
            )
            continue
        parent, shape = entry.get("parentId"), entry_shape_error(entry)
        if parent is not None and not isinstance(parent, str):
            shape = " has a parentId that is not a string"
        elif shape is not None:
            shape = f": {shape}"
        if shape is not None:
            store.damage.append(damage("bad_line", f"entry {eid}{shape}; skipped", id=eid))
            continue
        seen.add(eid)
        numbered.append({"op": "entry", "lane": "main", "entry": {**entry, "seq": seq}})
    moved = numbered and leaf != numbered[-1]["entry"]["id"]
    store.load(numbered)
    if moved:
        store.load([{"op": "lane", "lane": "main", "leafId": leaf, "seq": len(entries) + 1}])
    for e in numbered:
        parent = e["entry"].get("parentId")
        if parent is not None and parent not in seen:
            store.damage.append(
                damage(
                    "orphan_parent",
                    f"entry {e['entry']['id']} names missing parent {parent}; treated as a root",
                    id=e["entry"]["id"],
                )
            )
    return store


def _name_surrogate_entries(dmg: list[dict[str, Any]], lines: list[tuple[int, int, Any]]) -> None:
    """Name the entry in each ``replaced_surrogate`` warning of :func:`read_lines` (the id after
    migration: v1 ids are derived from the line number, as :func:`migrate` derives them)."""
    if not any(d["kind"] == "replaced_surrogate" for d in dmg):
        return
    header = lines[0][2] if lines else {}
    v1 = int(header.get("version") or 1) < 2
    ids: dict[int, Any] = {}
    for _, line_no, obj in lines[1:]:
        if isinstance(obj, dict):
            ids[line_no] = _short_id(str(header.get("id", "")), line_no) if v1 else obj.get("id")
    for item in dmg:
        if item["kind"] == "replaced_surrogate":
            line_no = item["line"]
            eid = ids.get(line_no)
            label = "session header" if line_no == lines[0][1] else f"entry {eid}"
            item["id"] = eid
            item["detail"] = (
                f"{label} (line {line_no}): lone UTF-16 surrogate in {', '.join(item['paths'])} "
                "read as U+FFFD; the file is unchanged"
            )


def import_pi_file(path: str, target: Store, *, chunk: int = 500) -> str:
    """Write a pi file into ``target`` as a new session; return the new session id.

    Entry ids are kept; the original file is not modified. The main lane's leaf is the file's
    last entry. Commits ``chunk`` entries per commit.

    Raises:
        SessionNotFound, CorruptSession: as :func:`open_pi_file`.
    """
    src = open_pi_file(path)
    extra = {
        "importedFrom": path,
        "piSessionId": src.header.get("id"),
        "piVersion": src.header.get("migratedFrom"),
    }
    dst = target.create_session(str(src.header.get("cwd", "")), header_extra=extra)
    try:
        ops = copy_ops(src.iter_entries())
        for start in range(0, len(ops), chunk):
            dst.commit(ops[start : start + chunk])
        leaf = src.lane("main").leaf_id
        if ops and dst.lane("main").leaf_id != leaf:
            dst.commit([LaneOp("main", leaf_id=leaf)])
        return dst.session_id
    finally:
        dst.close()
