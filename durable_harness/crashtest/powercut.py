"""Power cuts for the crash matrix (``crash-test --power-cut``): at the crash the store is cut
back to what its own barriers made durable (traced by :mod:`durable_harness.storage.barrier_trace`
in the killed child), the losses are counted, then recovery runs as after any crash
(``design/crash-matrix.md`` "Power cuts": what is cut, and what each mode may lose)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from durable_harness.storage import open_store
from durable_harness.storage.barrier_trace import (
    TRACE_ENV,
    WAL_FRAME_HEADER,
    WAL_HEADER,
    read_trace,
    wal_commit_end,
)
from durable_harness.storage.base import Durability
from durable_harness.storage.jsonl import mark_text, parse_mark

DURABILITIES = ("sync", "batch", "none")
DURABILITY_ENV = "DURABLE_HARNESS_CRASH_DURABILITY"
"""The durability the matrix child opens its session with (default ``sync``)."""
ACKED_ENV = "DURABLE_HARNESS_CRASH_ACKED"
"""Comma-separated client keys the client holds acknowledgements for: the ``--continue`` child
never re-sends those, even when the store lost them."""
ACKS_ENV = "DURABLE_HARNESS_CRASH_ACKS"
"""A file the matrix child's client appends each client key to once the verb that sent it
returned (the acknowledgement): the client's memory, which a power cut of the store spares."""
LOSS_KINDS = ("inputs", "unacknowledged", "intents", "settlements")


def child_durability() -> Durability:
    """The durability the matrix child uses (:data:`DURABILITY_ENV`, default ``sync``).

    Raises:
        ValueError: the variable names no durability mode.
    """
    mode = os.environ.get(DURABILITY_ENV) or "sync"
    if mode not in DURABILITIES:
        raise ValueError(f"{DURABILITY_ENV}={mode!r}: expected one of {', '.join(DURABILITIES)}")
    return cast(Durability, mode)


def record_ack(key: str) -> None:
    """Note that the client got the acknowledgement for ``key`` (when :data:`ACKS_ENV` is set)."""
    path = os.environ.get(ACKS_ENV)
    if path:
        with open(path, "a") as fh:
            fh.write(key + "\n")


def acked_keys() -> set[str]:
    """The client keys the matrix child's client holds acknowledgements for (:data:`ACKED_ENV`)."""
    return {k for k in os.environ.get(ACKED_ENV, "").split(",") if k}


def _snapshot(spec: str, sid: str) -> dict[str, set[str]]:
    """A session's accepted client keys (``inputs``), intent and settlement record ids."""
    with open_store(spec, create=False).open_session(sid, write=False) as session:
        records = session.records()
    kinds = {"tool_started": "intents", "tool_finished": "settlements"}
    snap: dict[str, set[str]] = {"inputs": set(), "intents": set(), "settlements": set()}
    for rec in records:
        if rec.get("clientKey"):
            snap["inputs"].add(str(rec["clientKey"]))
        if rec.get("type") in kinds:
            snap[kinds[rec["type"]]].add(str(rec["id"]))
    return snap


def snapshot_copy(backend: str, root: Path, sid: str) -> dict[str, set[str]]:
    """Read the session ``sid`` of the matrix store under ``root`` from a copy of its files, so
    that reading changes nothing (a SQLite connection may checkpoint when it closes)."""
    with tempfile.TemporaryDirectory(prefix="dh-precut-") as tmp:
        if backend == "jsonl":
            shutil.copytree(root / "home", Path(tmp) / "home")
            return _snapshot(f"jsonl:{Path(tmp) / 'home'}", sid)
        for suffix in ("", "-wal"):
            src = root / f"store.db{suffix}"
            if src.exists():
                shutil.copyfile(src, Path(tmp) / f"store.db{suffix}")
        return _snapshot(f"sqlite:{Path(tmp) / 'store.db'}", sid)


def cut_jsonl(home: Path, trace_dir: str) -> list[str]:
    """Cut every traced session file under ``home/sessions`` back to its durable length and
    mark; returns one line per file cut (``path: size -> length``)."""
    done: list[str] = []
    for path in sorted((home / "sessions").glob("*/*.jsonl")):
        rec = read_trace(trace_dir, str(path))
        if rec is None:
            continue
        size = path.stat().st_size
        length = min(int(rec["length"]), size)
        with open(path, "r+b") as fh:
            fh.truncate(length)
            first = fh.readline(1 << 20)
            at, _ = parse_mark(first.rstrip(b"\n"))
            if at is not None:
                fh.seek(at)
                fh.write(mark_text(int(rec["mark"])).encode())
        done.append(f"{path.name}: {size} -> {length} bytes, mark {rec['mark']}")
    return done


def _backfilled_end(db: Path, wal_size: int) -> int:
    """The end of the WAL frames a checkpoint copied into the database (``nBackfill`` in the
    wal-index, https://www.sqlite.org/walformat.html), or 0. SQLite syncs the WAL before it
    backfills, so those frames are durable whatever the store's own trace says."""
    try:
        raw = (db.parent / f"{db.name}-shm").read_bytes()[96:100]
        header = (db.parent / f"{db.name}-wal").read_bytes()[:WAL_HEADER]
    except FileNotFoundError:
        return 0
    if len(raw) < 4 or len(header) < WAL_HEADER:
        return 0
    backfill = int.from_bytes(raw, sys.byteorder)
    page_size = int.from_bytes(header[8:12], "big")
    end = WAL_HEADER + backfill * (WAL_FRAME_HEADER + page_size) if backfill else 0
    return min(end, wal_size)


def cut_sqlite(db: Path, trace_dir: str) -> list[str]:
    """Cut the WAL of the database ``db`` back to what the last traced WAL fsync covered;
    remove ``-shm``. Returns one line describing the cut (empty when there is no WAL)."""
    wal = db.parent / f"{db.name}-wal"
    if not wal.exists():
        return []
    size = wal.stat().st_size
    rec = read_trace(trace_dir, str(db))
    _, salt = wal_commit_end(str(wal))
    durable = int(rec["length"]) if rec is not None and rec.get("salt") == salt else 0
    length = min(max(durable, _backfilled_end(db, size)), size)
    with open(wal, "r+b") as fh:
        fh.truncate(length)
        os.fsync(fh.fileno())
    shm = db.parent / f"{db.name}-shm"
    if shm.exists():
        shm.unlink()
    return [f"{wal.name}: {size} -> {length} bytes"]


@dataclass
class PowerCut:
    """The power-cut side of one matrix cell in durability ``mode`` (folder ``root``)."""

    mode: str
    root: Path
    lost: dict[str, list[str]] = field(default_factory=dict)
    acked: set[str] = field(default_factory=set)
    cuts: list[str] = field(default_factory=list)

    @property
    def trace_dir(self) -> str:
        """The folder the killed child's stores record their barriers in."""
        return str(self.root / "barriers")

    def crash_env(self) -> dict[str, str]:
        """Environment for the child that crashes: its durability, barrier tracing on, the
        client's acknowledgements noted."""
        return {
            DURABILITY_ENV: self.mode,
            TRACE_ENV: self.trace_dir,
            ACKS_ENV: str(self.root / "acks"),
        }

    def continue_env(self) -> dict[str, str]:
        """Environment for the ``--continue`` child: its durability and the client's acks."""
        return {DURABILITY_ENV: self.mode, ACKED_ENV: ",".join(sorted(self.acked))}

    def cut(self, backend: str, sid: str) -> None:
        """Snapshot the session, cut the store back to its durable state, snapshot again and
        record what was lost (``self.lost``, ids by kind: ``inputs`` the client was acknowledged,
        ``unacknowledged`` inputs, ``intents``, ``settlements``)."""
        before = snapshot_copy(backend, self.root, sid)
        acks = self.root / "acks"
        self.acked = set(acks.read_text().split()) if acks.exists() else set()
        if backend == "jsonl":
            self.cuts = cut_jsonl(self.root / "home", self.trace_dir)
        else:
            self.cuts = cut_sqlite(self.root / "store.db", self.trace_dir)
        after = snapshot_copy(backend, self.root, sid)
        lost = {k: sorted(before[k] - after[k]) for k in ("intents", "settlements")}
        # an accepted input is one the client was acknowledged; one the store had written but
        # not yet acknowledged is lost like any unsynced write (the client re-sends it)
        lost["inputs"] = sorted(self.acked - after["inputs"])
        lost["unacknowledged"] = sorted((before["inputs"] - self.acked) - after["inputs"])
        self.lost = {k: lost[k] for k in LOSS_KINDS if lost[k]}

    def failures(self) -> list[str]:
        """The power-cut invariant this cell broke: ``sync`` lost an accepted input."""
        if self.mode == "sync" and self.lost.get("inputs"):
            return [f"power cut: sync lost accepted inputs {self.lost['inputs']}"]
        return []


def summary_rows(cells: Iterable[Any]) -> list[dict[str, Any]]:
    """Per backend and durability mode: cells, cells that lost inputs / intents / settlements,
    cells with a doubled effect, cells that failed. ``cells`` are :class:`invariants.Cell` s."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for c in cells:
        if not getattr(c, "durability", None):
            continue
        row = rows.setdefault(
            (c.backend, c.durability),
            {"backend": c.backend, "durability": c.durability, "cells": 0, "failed": 0}
            | {f"lost_{k}": 0 for k in LOSS_KINDS}
            | {"doubled_effects": 0, "decisions": 0},
        )
        row["cells"] += 1
        row["failed"] += c.status != "pass"
        row["decisions"] += bool(c.decisions)
        row["doubled_effects"] += any(f.startswith("effects: applied twice") for f in c.failures)
        for k in LOSS_KINDS:
            row[f"lost_{k}"] += bool(c.lost.get(k))
    order = {m: i for i, m in enumerate(DURABILITIES)}
    return [rows[k] for k in sorted(rows, key=lambda k: (k[0], order.get(k[1], 9)))]


def summary_markdown(cells: Iterable[Any]) -> str:
    """:func:`summary_rows` as a Markdown table (counts of cells)."""
    head = (
        "| backend | durability | cells | lost accepted inputs | lost unacknowledged inputs "
        "| lost intents | lost settlements | doubled effects | decisions | failed |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    return head + "".join(
        f"| {r['backend']} | {r['durability']} | {r['cells']} | {r['lost_inputs']} | "
        f"{r['lost_unacknowledged']} | "
        f"{r['lost_intents']} | {r['lost_settlements']} | {r['doubled_effects']} | "
        f"{r['decisions']} | {r['failed']} |\n"
        for r in summary_rows(cells)
    )
