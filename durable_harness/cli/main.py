"""The ``durable-harness`` command: a thin shell over the library.

Each command parses its options, opens the store or session, calls one library function and
prints. Errors of the library print as ``error[<code>]: message`` (or JSON with ``--json``)
with exit status 2; a bad command line exits 2 from argparse.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import anyio

from durable_harness import __version__, crash
from durable_harness.errors import DurableHarnessError
from durable_harness.storage import DURABILITY_MODES, Store, open_store

Handler = Callable[[argparse.Namespace], int]
COMMANDS: dict[str, tuple[str, Handler]] = {}


def command(name: str, help_text: str) -> Callable[[Handler], Handler]:
    """Register a subcommand handler (the registry the docs test walks)."""

    def deco(fn: Handler) -> Handler:
        COMMANDS[name] = (help_text, fn)
        return fn

    return deco


def out(data: Any) -> None:
    """Print JSON (pretty, UTF-8)."""
    print(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def store_of(args: argparse.Namespace) -> Store:
    """Open the store named by ``--store`` (default: the embedded JSONL store)."""
    return open_store(getattr(args, "store", None) or os.environ.get("DURABLE_HARNESS_STORE"))


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every registered command."""
    from durable_harness.cli import commands

    parser = argparse.ArgumentParser(
        prog="durable-harness",
        description="Crash-durable runs for LLM agents: a session tree plus a write-ahead lane "
        "operation log; recovery never blindly replays a tool.",
    )
    parser.add_argument("--version", action="version", version=f"durable-harness {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, _fn) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument(
            "--store",
            help="jsonl:DIR or sqlite:PATH (default: JSONL under $DURABLE_HARNESS_HOME, "
            "else ~/.durable-harness)",
        )
        commands.configure(name, p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _help, fn = COMMANDS[args.command]
    try:
        status = fn(args)
        sys.stdout.flush()
        return status
    except DurableHarnessError as exc:
        if getattr(args, "json", False):
            out({"error": exc.to_json()})
        else:
            print(f"error[{exc.code}]: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (``| head``): stop quietly, as Unix tools do; stdout goes to
        # /dev/null so that the interpreter's final flush does not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:  # never a raw traceback: most likely damaged data
        message = (
            f"{type(exc).__name__}: {exc}"[:500] + "; the session or store may be "
            "damaged: run `durable-harness fsck PATH` (please report this if it is not)"
        )
        if getattr(args, "json", False):
            out({"error": {"code": "internal", "message": message}})
        else:
            print(f"error[internal]: {message}", file=sys.stderr)
        return 3


def run_async(fn: Callable[..., Any], *args: Any) -> Any:
    """Run an async function to completion (asyncio backend).

    A library error raised inside a task group (the harness's) arrives wrapped in an exception
    group; it is unwrapped so that :func:`main` prints it as ``error[<code>]`` instead of a
    traceback. A group holding anything else propagates unchanged.
    """
    try:
        return anyio.run(fn, *args)
    except BaseExceptionGroup as group:
        _match, rest = group.split(DurableHarnessError)
        if rest is not None:
            raise
        leaf: BaseException = group
        while isinstance(leaf, BaseExceptionGroup):
            leaf = leaf.exceptions[0]
        raise leaf from None


__all__ = ["COMMANDS", "DURABILITY_MODES", "crash", "main", "run_async"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
