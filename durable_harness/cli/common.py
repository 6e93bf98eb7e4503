"""What the command modules share: :class:`Command`, the shared options, opening the store or
session, printing for a person or as JSON."""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio

from durable_harness.display import visible
from durable_harness.errors import UnknownEntry, UnknownLane, root_cause
from durable_harness.recovery.decide import POLICIES
from durable_harness.session import Session, open_session
from durable_harness.storage import DURABILITY_MODES, Store, open_store

Handler = Callable[[argparse.Namespace], int]
Options = Callable[[argparse.ArgumentParser], object]


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, help line, handler, options and examples (``design/cli.md``)."""

    name: str
    help: str
    run: Handler
    options: Options
    example: str = ""
    exits: tuple[tuple[int, str], ...] = ((0, "success"),)
    """The statuses this command returns besides the ones every command can
    (``main.COMMON_EXITS``), each with its meaning for this command."""


RUN_EXITS = (
    (0, "the run completed"),
    (1, "the run failed"),
    (3, "the run was aborted"),
    (4, "the run was declined"),
    (5, "the run is suspended, waiting for a decision (see `durable-harness recover`)"),
)
"""The statuses of a command that runs to an outcome (``run``; ``resume`` per lane, the worst)."""


def builtin(**kwargs: Any) -> dict[str, Any]:
    """:func:`~durable_harness.tools.builtin.builtin_tools` (same arguments), imported when a
    command uses the tools: their argument models are pydantic's, which the commands that only
    read never need (``design/cli.md``, "Start-up")."""
    from durable_harness.tools.builtin import builtin_tools

    return builtin_tools(**kwargs)


def command(
    name: str,
    *options: Options,
    example: str = "",
    exits: tuple[tuple[int, str], ...] = ((0, "success"),),
) -> Callable[[Handler], Command]:
    """Make the decorated handler a :class:`Command` with these options and exit statuses
    (``exits``: status and meaning, besides the common ones); its docstring is its help line
    (first paragraph) and examples (after ``example:``, else ``example``)."""

    def add(p: argparse.ArgumentParser) -> None:
        for option in options:
            option(p)

    def make(fn: Handler) -> Command:
        doc = inspect.cleandoc(fn.__doc__ or "")
        examples = doc.partition("\nexample:\n")[2].partition("\n\n")[0]
        summary = " ".join(doc.split("\n\n")[0].split())
        return Command(name, summary, fn, add, examples or example, exits)

    return make


def json_option(p: argparse.ArgumentParser) -> None:
    """``--json``: print JSON instead of lines for a person."""
    p.add_argument("--json", action="store_true", help="print JSON")


def session_argument(p: argparse.ArgumentParser) -> None:
    """The ``SESSION`` argument (:func:`open_named`)."""
    p.add_argument("session", help="session id, unique id prefix, or session file path")


def price_option(p: argparse.ArgumentParser) -> None:
    """``--price`` (``run``, ``resume``, ``serve``, ``acp``), read by :func:`price_of`."""
    p.add_argument(
        "--price",
        metavar="IN,OUT[,CACHE_READ[,CACHE_WRITE]]|TABLE.json",
        help="USD per million tokens, or a JSON price table (one price, or one per model); "
        "without it a network provider's cost is unknown, never $0",
    )


def policy_option(help_text: str) -> Options:
    """``--policy ask|retry-safe|fail-in-doubt`` (default ``ask``) with this help."""
    return lambda p: p.add_argument("--policy", choices=POLICIES, default="ask", help=help_text)


class _Deprecated(argparse.Action):
    """An old spelling of an option: stored as the option it names, with a warning."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        print(f"durable-harness: {option} is deprecated; use --{self.dest}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def durability_option(help_text: str, *, alias: bool = False) -> Options:
    """``--durability sync|batch|none`` (default ``sync``); with ``alias``, also the deprecated
    ``--mode`` (``design/cli.md``)."""

    def add(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--durability",
            choices=DURABILITY_MODES,
            default=None,
            help=help_text + " (default: durability in durable-harness.toml, else sync)",
        )
        if alias:
            p.add_argument(
                "--mode", dest="durability", choices=DURABILITY_MODES, action=_Deprecated,
                help=argparse.SUPPRESS,
            )  # fmt: skip

    return add


def price_of(args: argparse.Namespace) -> dict[str, Any] | None:
    """The parsed ``--price`` of a command, or ``None``; a malformed one is a ``FormatError``."""
    from durable_harness.providers import parse_price

    text = getattr(args, "price", None)
    return parse_price(text) if text else None


def catalogue_time(value: str) -> datetime:
    """A catalogue time (ISO 8601, or epoch seconds) as an aware datetime; unknown sorts last."""
    try:
        return datetime.fromtimestamp(float(value), UTC)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
"""Seconds per unit of a :func:`parse_duration` duration."""


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``90s``, ``15m``, ``1h30m``, ``30d``, ``2w`` or a plain
    number of seconds; the type of every ``DURATION`` option.

    Raises:
        argparse.ArgumentTypeError: not a duration (argparse reports it as a usage error).
    """
    value = text.strip().lower()
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhdw]?)", value)
    if (
        not value
        or "".join(n + u for n, u in parts) != value
        or (len(parts) > 1 and not all(u for _, u in parts))
    ):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration (a number of seconds, or like 90s, 15m, 1h30m, 30d, 2w)"
        )
    return sum(float(n) * DURATION_UNITS[u or "s"] for n, u in parts)


def out(data: Any) -> None:
    """Print JSON (pretty, UTF-8)."""
    print(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def line(text: str = "", *, multiline: bool = False, file: Any = None, **kw: Any) -> None:
    """Print ``text`` for a person, through :func:`~durable_harness.display.visible`
    (``multiline`` keeps newlines and tabs); every human-form line goes through here."""
    print(visible(text, multiline=multiline), file=file, **kw)


def json_text(value: Any) -> str:
    """A value as compact JSON for human output (never a Python repr)."""
    return json.dumps(value, ensure_ascii=False, default=str)


def or_dash(value: Any) -> str:
    """``-`` for a missing value, else its text."""
    return "-" if value is None or value == "" else str(value)


def store_spec(args: argparse.Namespace) -> str:
    """The store ``--store`` names, else ``$DURABLE_HARNESS_STORE``, else ``""`` (the default)."""
    return getattr(args, "store", None) or os.environ.get("DURABLE_HARNESS_STORE") or ""


def store_of(args: argparse.Namespace, *, create: bool = False) -> Store:
    """Open the store of :func:`store_spec`; with ``create=False`` a named store that does not
    exist is :class:`~durable_harness.errors.StoreNotFound`."""
    return open_store(store_spec(args), create=create)


def open_named(
    args: argparse.Namespace, *, write: bool = False, durability: str = "sync"
) -> Session:
    """Open the session ``args.session`` names (a session file path needs no store)."""
    ref = args.session
    store = open_store(None, create=False) if os.path.isfile(ref) else store_of(args)
    return open_session(ref, store, write=write, durability=durability)  # type: ignore[arg-type]


def require_lane(session: Session, lane: str) -> None:
    """Refuse a lane the session does not have (``UnknownLane``, naming the lanes it has)."""
    lanes = sorted(session.store.lanes())
    if lane not in lanes:
        raise UnknownLane(
            f"session {session.id} has no lane {lane!r}; its lanes: {', '.join(lanes)}",
            lane=lane,
            lanes=lanes,
        )


def resolve_entry(session: Session, given: str) -> str:
    """The id of the entry ``given`` names: the id itself, else the one entry whose id starts
    with it (as session ids take a unique prefix); ``UnknownEntry`` when none or several do."""
    if session.store.get_entry(given) is not None:
        return given
    found = [str(e["id"]) for e in session.store.iter_entries() if str(e["id"]).startswith(given)]
    if len(found) == 1:
        return found[0]
    if found:
        raise UnknownEntry(
            f"entry prefix {given} is ambiguous in session {session.id}: {', '.join(found[:5])}",
            entry_id=given,
        )
    raise UnknownEntry(f"no entry {given} in session {session.id}", entry_id=given)


def run_async(fn: Callable[..., Any], *args: Any) -> Any:
    """Run an async function to completion (asyncio); an exception group is reduced to its
    root cause (:func:`~durable_harness.errors.root_cause`)."""
    try:
        return anyio.run(fn, *args)
    except BaseExceptionGroup as group:
        raise root_cause(group) from group


def mcp_option(p: argparse.ArgumentParser) -> None:
    """``--mcp CONFIG``: the MCP servers whose tools the runs get (``design/mcp.md``)."""
    p.add_argument(
        "--mcp",
        metavar="CONFIG",
        help='a JSON file {"mcpServers": {NAME: {command, args, env} | {url, headers}}}: '
        "their tools join the built-in ones as mcp__NAME__TOOL",
    )


def mcp_config_of(args: argparse.Namespace) -> Any:
    """The checked :class:`~durable_harness.tools.mcp.McpConfig` of ``--mcp``, or ``None``.

    Raises:
        McpConfigError: the file is unreadable or malformed (names the path and server).
    """
    if not getattr(args, "mcp", None):
        return None
    from durable_harness.tools.mcp import load_mcp_config

    return load_mcp_config(args.mcp)


@asynccontextmanager
async def with_mcp(
    config: Any, tools: Mapping[str, Any], cwd: str | None, recorded: Any = ()
) -> AsyncIterator[dict[str, Any]]:
    """``tools`` plus the MCP tools of ``config`` (``None``: ``tools`` alone), connected for
    the block's length; a server that is down is reported on stderr, its tools answer with
    an error (``recorded``: the session's ``tool_started`` records, see
    :meth:`~durable_harness.tools.mcp.McpServers.tools`)."""
    if config is None:
        yield dict(tools)
        return
    from durable_harness.tools.mcp import McpServers

    async with McpServers(config, cwd=Path(cwd) if cwd else None) as servers:
        for server, why in servers.failures().items():
            line(f"MCP server {server} unavailable: {why}", file=sys.stderr)
        yield {**tools, **servers.tools(recorded)}
