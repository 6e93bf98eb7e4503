"""The ``durable-harness`` command: a thin shell over the library.

Each command parses its options, opens the store or session, calls one library function and
prints. Every failure leaves through :func:`main`, the CLI's one error boundary
(``design/cli.md``): an exception group is reduced to its root cause
(:func:`~durable_harness.errors.root_cause`), an ``OSError`` or database error is named by
:func:`~durable_harness.storage.oserrors.translate`, and the result prints as
``error[<code>]: message`` (``{"error": {...}}`` with ``--json``). Exit statuses:
:data:`EXIT_STATUS_HELP`.
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
from durable_harness.cli.advice import advised
from durable_harness.errors import DurableHarnessError, root_cause
from durable_harness.storage import DURABILITY_MODES, Store, open_store
from durable_harness.storage.oserrors import translate

Handler = Callable[[argparse.Namespace], int]
COMMANDS: dict[str, tuple[str, Handler]] = {}
EXAMPLES: dict[str, str] = {}
"""Per command: example invocations shown at the end of its ``--help`` (one per line,
``durable-harness ...  # what it does``)."""

EXIT_ERROR = 2
EXIT_INTERNAL = 70  # EX_SOFTWARE (sysexits.h): a bug, not a user error
EXIT_STATUS_HELP = """\
exit status:
  0    success (a run completed; fsck found no damage)
  1    a run failed; fsck found damage
  2    bad command line, or an error named as error[CODE] (no such session or store,
       storage error, locked database, missing API key, unknown lane...)
  3    a run was aborted
  4    a run was declined
  5    a run is suspended, waiting for a decision (see `durable-harness recover`)
  70   internal error (a bug: please report it)
  130  interrupted (Ctrl-C); 141: stdout closed early (e.g. `| head`)"""


def command(name: str, help_text: str, example: str = "") -> Callable[[Handler], Handler]:
    """Register a subcommand handler (the registry the docs test walks), with the example
    lines its ``--help`` ends with."""

    def deco(fn: Handler) -> Handler:
        COMMANDS[name] = (help_text, fn)
        EXAMPLES[name] = example
        return fn

    return deco


def add_price_argument(p: argparse.ArgumentParser) -> None:
    """Add ``--price`` (``run``, ``resume``, ``serve``, ``acp``): what the provider's tokens
    cost, read by :func:`~durable_harness.providers.parse_price` when the command runs (a
    bad value is a ``format_error`` naming it)."""
    p.add_argument(
        "--price",
        metavar="IN,OUT[,CACHE_READ[,CACHE_WRITE]]|TABLE.json",
        help="USD per million tokens, or a JSON price table (one price, or one per model); "
        "without it a network provider's cost is unknown, never $0",
    )


def price_of(args: argparse.Namespace) -> dict[str, Any] | None:
    """The parsed ``--price`` of a command, or ``None``.

    Raises:
        FormatError: a malformed value or table (:func:`~durable_harness.providers.parse_price`).
    """
    from durable_harness.providers import parse_price

    text = getattr(args, "price", None)
    return parse_price(text) if text else None


def out(data: Any) -> None:
    """Print JSON (pretty, UTF-8)."""
    print(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def store_of(args: argparse.Namespace, *, create: bool = False) -> Store:
    """Open the store named by ``--store`` (default: the embedded JSONL store).

    Commands that only read pass ``create=False`` (the default): a named store that does not
    exist is :class:`~durable_harness.errors.StoreNotFound` and nothing is created.
    """
    spec = getattr(args, "store", None) or os.environ.get("DURABLE_HARNESS_STORE")
    return open_store(spec, create=create)


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every registered command."""
    from durable_harness.cli import commands

    parser = argparse.ArgumentParser(
        prog="durable-harness",
        description="Crash-durable runs for LLM agents: a session tree plus a write-ahead lane "
        "operation log; recovery never blindly replays a tool.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  durable-harness run 'fix the tests' --provider anthropic:claude-sonnet-4-5\n"
        "  durable-harness sessions\n"
        "  durable-harness recover SESSION\n"
        "  durable-harness resume SESSION --decide CALL_ID=retry\n"
        "  durable-harness COMMAND --help   # options and examples of one command\n\n"
        + EXIT_STATUS_HELP,
    )
    parser.add_argument("--version", action="version", version=f"durable-harness {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, _fn) in COMMANDS.items():
        example = EXAMPLES.get(name, "")
        p = sub.add_parser(
            name,
            help=help_text,
            description=help_text,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            epilog=(f"example:\n{example}\n\n" if example else "") + EXIT_STATUS_HELP,
        )
        p.add_argument(
            "--store",
            help="jsonl:DIR, sqlite:PATH or postgresql://USER@HOST/DB (default: JSONL under "
            "$DURABLE_HARNESS_HOME, "
            "else ~/.durable-harness)",
        )
        commands.configure(name, p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status (see
    :data:`EXIT_STATUS_HELP`)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _help, fn = COMMANDS[args.command]
    try:
        status = fn(args)
        sys.stdout.flush()
        return status
    except BaseException as exc:  # the one boundary: every failure is reported here
        return report_failure(exc, json_output=bool(getattr(args, "json", False)))


def report_failure(exc: BaseException, *, json_output: bool = False) -> int:
    """Print ``exc`` for a person (or as JSON) and return the exit status.

    A task group's exception group is reduced to its root cause; an ``OSError`` or database
    error becomes a typed error naming its path; anything else is an internal error
    (``error[internal]``, exit 70), printed without a traceback.
    """
    from durable_harness import terminal as ui

    root = root_cause(exc)
    cause = root if isinstance(root, BrokenPipeError) else translate(root)
    if isinstance(cause, KeyboardInterrupt):
        return 130
    if isinstance(cause, BrokenPipeError):
        # the reader went away (``| head``): stop quietly, as Unix tools do; stdout goes to
        # /dev/null so that the interpreter's final flush does not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    if isinstance(cause, SystemExit):
        return cause.code if isinstance(cause.code, int) else 1
    if isinstance(cause, DurableHarnessError):
        if json_output:
            out({"error": {**cause.to_json(), "message": advised(cause)}})
        else:
            ui.error_line(cause.code, advised(cause))
        return EXIT_ERROR
    message = (
        f"{type(cause).__name__}: {cause}"[:500] + " (a bug in durable-harness: please report "
        "it; if a session was involved, `durable-harness fsck PATH` checks it)"
    )
    if json_output:
        out({"error": {"code": "internal", "message": message}})
    else:
        ui.error_line("internal", message)
    return EXIT_INTERNAL


def run_async(fn: Callable[..., Any], *args: Any) -> Any:
    """Run an async function to completion (asyncio backend).

    An error raised inside a task group (the harness's) arrives wrapped in an exception group;
    it is reduced to its root cause (:func:`~durable_harness.errors.root_cause`) so that the
    caller, and :func:`main`, see the error itself.
    """
    try:
        return anyio.run(fn, *args)
    except BaseExceptionGroup as group:
        raise root_cause(group) from group


__all__ = [
    "COMMANDS",
    "DURABILITY_MODES",
    "EXAMPLES",
    "crash",
    "main",
    "report_failure",
    "run_async",
]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
