"""What the CLI adds to a library error it prints: advice that names CLI commands and options.

The library's messages name the store and the cause and stop there (a library caller has no
``--session`` to pass); the CLI appends, per error code, what its user can do next
(``design/cli.md``, "Errors")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from durable_harness.errors import DurableHarnessError

ADVICE: dict[str, Callable[[dict[str, Any]], str]] = {
    # Store.most_recent: the newest session of a directory has a header that names no cwd
    "corrupt_session": lambda d: (
        f": pick a session with --session, or run `durable-harness fsck {d['path']}`"
        if "cwd" in d and "path" in d
        else ""
    ),
    "session_unreadable": lambda d: ", or pick another session with --session",
    # a PostgreSQL database without the tables (SQLite's foreign file must not be migrated)
    "store_not_found": lambda d: (
        f"; `durable-harness migrate --store {d['path']}` makes them"
        if str(d.get("path", "")).startswith("postgresql://")
        else ""
    ),
}
"""Per error code: the advice appended to the message, from the error's ``details``."""


def advised(error: DurableHarnessError) -> str:
    """``error``'s message with the CLI's advice for its code (:data:`ADVICE`) appended."""
    advice = ADVICE.get(error.code)
    return error.message + (advice(error.details) if advice else "")
