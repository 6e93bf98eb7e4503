"""The ``durable-harness`` command: the list of commands, the parser, and :func:`main`, the
CLI's one error boundary (``design/cli.md``, "Errors"); exit statuses: :data:`EXIT_STATUS_HELP`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import textwrap
from collections.abc import Sequence

from durable_harness import __version__, logs
from durable_harness.cli import export_commands as exports
from durable_harness.cli import host_commands as host
from durable_harness.cli import observability
from durable_harness.cli import run_commands as runs
from durable_harness.cli import session_commands as sessions
from durable_harness.cli import tree_commands as tree
from durable_harness.cli.advice import advised
from durable_harness.cli.common import Command, command, out
from durable_harness.cli.settings import apply_settings, print_settings
from durable_harness.errors import DurableHarnessError, root_cause
from durable_harness.storage.oserrors import translate

_log = logging.getLogger("durable_harness.cli")


def _completion_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete in")


@command("completion", _completion_options)
def completion(args: argparse.Namespace) -> int:
    """Print a shell completion script for every command and option (generated from the
    parser by shtab, so it cannot drift from the commands).

    example:
      durable-harness completion bash > ~/.local/share/bash-completion/completions/durable-harness
      durable-harness completion zsh > "${fpath[1]}/_durable-harness"
    """
    import shtab

    sys.stdout.write(shtab.complete(build_parser(), shell=args.shell))
    return 0


COMMANDS: dict[str, Command] = {
    c.name: c
    for c in (
        sessions.sessions,
        sessions.show,
        sessions.context,
        sessions.fsck,
        sessions.import_,
        exports.export,
        runs.run,
        sessions.log,
        sessions.cost,
        runs.recover,
        runs.resume,
        runs.crash_points,
        runs.demo,
        runs.crash_test,
        sessions.fork,
        tree.label,
        tree.name,
        tree.navigate,
        tree.branch_summary,
        tree.forget,
        tree.prune,
        host.serve,
        host.acp,
        host.migrate,
        completion,
    )
}
"""Every subcommand, in ``--help`` order (``design/cli.md``, "Commands")."""

COMMON_EXITS = (
    (2, "bad command line, or an error named as error[CODE] (no such session or store, "
     "storage error, locked database, missing API key, unknown lane...)"),
    (70, "internal error (a bug: please report it)"),
    (130, "interrupted (Ctrl-C)"),
    (141, "stdout closed early (e.g. `| head`)"),
)  # fmt: skip
"""The statuses every command can return (:func:`report_failure`)."""


def exit_status_help(exits: tuple[tuple[int, str], ...]) -> str:
    """The ``exit status:`` block of a ``--help`` page: ``exits`` and :data:`COMMON_EXITS` in
    numeric order, one status a line, meanings wrapped at 100 columns."""
    lines = ["exit status:"]
    for code, meaning in sorted((*exits, *COMMON_EXITS)):
        wrapped = textwrap.wrap(meaning, 92) or [""]
        lines.append(f"  {code:<5}{wrapped[0]}")
        lines.extend(f"       {more}" for more in wrapped[1:])
    return "\n".join(lines)


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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command in :data:`COMMANDS`."""
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
    for c in COMMANDS.values():
        p = sub.add_parser(
            c.name,
            help=c.help,
            description=c.help,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            epilog=(f"example:\n{c.example}\n\n" if c.example else "") + exit_status_help(c.exits),
        )
        p.add_argument(
            "--store",
            help="jsonl:DIR, sqlite:PATH or postgresql://USER@HOST/DB (default: "
            "$DURABLE_HARNESS_STORE, else store in durable-harness.toml, else JSONL under "
            "$DURABLE_HARNESS_HOME, else ~/.durable-harness)",
        )
        p.add_argument(
            "--verbose",
            action="store_true",
            help="print the configuration files read and where each setting came from "
            "(flag, environment, durable-harness.toml, default) on stderr",
        )
        observability.log_format_option(p)
        c.options(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status (:data:`EXIT_STATUS_HELP`)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        observability.start(args)  # logs, and the traces OTEL_* asks for
        settings = apply_settings(args)
        if args.verbose:
            print_settings(settings)
        status = COMMANDS[args.command].run(args)
        sys.stdout.flush()
        return status
    except BaseException as exc:  # the one boundary: every failure is reported here
        return report_failure(exc, json_output=bool(getattr(args, "json", False)))
    finally:
        observability.finish()


def report_failure(exc: BaseException, *, json_output: bool = False) -> int:
    """Print ``exc`` (its root cause; an OS or database error translated; anything else
    ``error[internal]``) for a person or as JSON, and return the exit status."""
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
        elif logs.json_enabled():  # stderr stays one JSON object per line
            logs.event(_log, "error", "%s", advised(cause), level=logging.ERROR, code=cause.code)
        else:
            ui.error_line(cause.code, advised(cause))
        return EXIT_ERROR
    message = (
        f"{type(cause).__name__}: {cause}"[:500] + " (a bug in durable-harness: please report "
        "it; if a session was involved, `durable-harness fsck PATH` checks it)"
    )
    if json_output:
        out({"error": {"code": "internal", "message": message}})
    elif logs.json_enabled():
        logs.event(_log, "error", "%s", message, level=logging.ERROR, code="internal")
    else:
        ui.error_line("internal", message)
    return EXIT_INTERNAL


__all__ = [
    "COMMANDS",
    "COMMON_EXITS",
    "EXIT_STATUS_HELP",
    "build_parser",
    "exit_status_help",
    "main",
    "report_failure",
]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
