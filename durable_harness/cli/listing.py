"""``durable-harness sessions``: one row per session with its state and the calls it waits
on (the reading rule is the host's, :mod:`durable_harness.host.listing`, so the CLI and
``GET /sessions`` say the same of a session).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any

from durable_harness.cli.main import out, run_async, store_of
from durable_harness.display import visible
from durable_harness.errors import DurableHarnessError
from durable_harness.host.listing import check_states, read_listed, waiting_calls
from durable_harness.storage.base import SessionInfo, Store
from durable_harness.tools.builtin import builtin_tools

HEADER = ("ID", "MODIFIED", "STATE", "WAITING", "CWD")
"""The columns of the human listing; rows are sorted by MODIFIED (as the catalogue gives it:
ISO 8601 UTC with milliseconds on every backend, ``design/cli.md``), most recent first."""


def _when(value: str) -> datetime:
    """A catalogue time (ISO 8601; seconds since the epoch in older catalogues) as an aware
    datetime, the sort key; an unknown one sorts last."""
    try:
        return datetime.fromtimestamp(float(value), UTC)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


async def _rows(store: Store, infos: list[SessionInfo]) -> list[dict[str, Any]]:
    """Each catalogue row with ``state`` and ``waiting`` (the in-doubt calls a suspended
    session waits on); an unreadable session (or one that fails to read now) keeps its
    ``error`` and has ``state`` ``None``."""
    rows: list[dict[str, Any]] = []
    for info in infos:
        row: dict[str, Any] = vars(info) | {"state": None, "waiting": []}
        if info.error is None:
            try:
                with store.open_session(info.id, write=False) as ss:
                    rec, plan = await read_listed(ss, store.spec, lambda _rt: builtin_tools())
                row["state"], row["waiting"] = rec.state, waiting_calls(plan)
            except DurableHarnessError as exc:
                row["error"] = exc.to_json()
        rows.append(row)
    rows.sort(key=lambda r: _when(str(r.get("modified") or "")), reverse=True)
    return rows


def list_sessions(args: argparse.Namespace) -> int:
    """The ``sessions`` command: ``--cwd`` narrows to one working directory, ``--state``
    (repeatable) to sessions in those lifecycle states (an unreadable session has no state:
    it is left out then, and still counted on stderr), ``--json`` prints the rows
    (``SessionInfo`` fields plus ``state`` and ``waiting``). Exit 1 when a session cannot be
    read, 2 for an unknown state.

    Raises:
        InvalidRequest: a ``--state`` value is no lifecycle state.
    """
    chosen = check_states(args.state)
    store = store_of(args)
    rows = run_async(_rows, store, store.list_sessions(args.cwd))
    broken = [r for r in rows if r.get("error") is not None]
    if chosen is not None:
        rows = [r for r in rows if r["state"] in chosen]
    if args.json:
        out(rows)
        return 1 if broken else 0
    if rows:
        table = [HEADER] + [
            tuple(
                visible(cell)  # the operator reads what is stored (design/cli.md)
                for cell in (
                    str(r["id"] or "-"),
                    str(r.get("modified") or "-"),
                    str(r["state"] or "UNREADABLE"),
                    "-" if r["state"] is None else str(len(r["waiting"])),
                    str(r["error"]["message"] if r.get("error") else r["cwd"]),
                )
            )
            for r in rows
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(HEADER) - 1)]
        for row in table:
            print("  ".join([c.ljust(w) for c, w in zip(row, widths, strict=False)] + [row[-1]]))
    else:
        print("no sessions", file=sys.stderr)
    if broken:
        print(f"{len(broken)} session file(s) cannot be read", file=sys.stderr)
    return 1 if broken else 0
