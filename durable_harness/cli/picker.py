"""The session picker of ``resume -r`` (as pi's ``--resume``): on a terminal, the working
directory's sessions numbered with their state, the calls they wait on, their title and age,
waiting ones first; the person types a number (``design/cli.md``, "The picker")."""

from __future__ import annotations

import sys
import time
from typing import Any

from durable_harness import terminal as ui
from durable_harness.cli.common import catalogue_time, line, run_async
from durable_harness.cli.session_commands import listed_rows
from durable_harness.errors import FormatError, SessionNotFound
from durable_harness.storage.base import Store

PICKER_ROWS = 20
"""Most sessions the picker lists (the most recent; ``sessions`` lists them all)."""


def age(modified: str, now: float | None = None) -> str:
    """How long ago a catalogue time was, for a person: ``42s``, ``5m``, ``3h``, ``2d``."""
    seconds = max(0.0, (now or time.time()) - catalogue_time(modified).timestamp())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def picker_rows(store: Store, cwd: str) -> list[dict[str, Any]]:
    """The sessions of ``cwd`` the picker offers (:func:`listed_rows`: the host's state and
    waiting calls, the title): those waiting for a decision first, then most recent first, at
    most :data:`PICKER_ROWS`; unreadable ones are left out (``sessions`` shows them)."""
    rows = [r for r in run_async(listed_rows, store, store.list_sessions(cwd)) if not r["error"]]
    rows.sort(key=lambda r: not r["waiting"])  # stable: recency kept within each group
    return rows[:PICKER_ROWS]


def pick_session(store: Store, cwd: str) -> str:
    """Ask the person at the terminal which session of ``cwd`` to resume; its id.

    Raises:
        FormatError: stdin or stdout is not a terminal (give SESSION or --latest instead),
            or the answer is not one of the numbers listed.
        SessionNotFound: ``cwd`` has no session.
    """
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise FormatError("resume -r picks on a terminal; give SESSION or --latest instead")
    rows = picker_rows(store, cwd)
    if not rows:
        raise SessionNotFound(f"no session of {cwd} to resume", cwd=cwd)
    for n, r in enumerate(rows, 1):
        waiting = f", {len(r['waiting'])} waiting" if r["waiting"] else ""
        ui.say_parts(
            (f"{n:>3}) ", "bold"),
            (f"{r['state']}{waiting}".ljust(22), "yellow" if r["waiting"] else None),
            f"{age(str(r['modified'])):>4} ago  {r['title'] or '-'}  ({str(r['id'])[:13]})",
        )
    answer = input(f"resume which session? [1-{len(rows)}] ").strip()
    if not answer.isdigit() or not 1 <= int(answer) <= len(rows):
        raise FormatError(f"{answer!r} is not one of the sessions listed (1-{len(rows)})")
    chosen = rows[int(answer) - 1]
    line(f"resuming session {chosen['id']}", file=sys.stderr)
    return str(chosen["id"])
