"""The ``durable-harness`` command: the list of commands, the parser, and :func:`main`, the
CLI's one error boundary (``design/cli.md``, "Errors"); exit statuses: :data:`EXIT_STATUS_HELP`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import textwrap
from collections.abc import Iterator, MutableMapping, Sequence
from importlib import import_module

from durable_harness import __version__, logs
from durable_harness.cli import observability
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


COMMAND_SOURCES: dict[str, tuple[str, str]] = {
    "sessions": ("session_commands", "sessions"),
    "show": ("session_commands", "show"),
    "context": ("session_commands", "context"),
    "fsck": ("session_commands", "fsck"),
    "import": ("session_commands", "import_"),
    "export": ("export_commands", "export"),
    "run": ("run_commands", "run"),
    "log": ("session_commands", "log"),
    "cost": ("session_commands", "cost"),
    "recover": ("run_commands", "recover"),
    "resume": ("run_commands", "resume"),
    "crash-points": ("run_commands", "crash_points"),
    "demo": ("run_commands", "demo"),
    "crash-test": ("run_commands", "crash_test"),
    "fork": ("session_commands", "fork"),
    "label": ("tree_commands", "label"),
    "name": ("tree_commands", "name"),
    "navigate": ("tree_commands", "navigate"),
    "branch-summary": ("tree_commands", "branch_summary"),
    "forget": ("tree_commands", "forget"),
    "prune": ("tree_commands", "prune"),
    "serve": ("host_commands", "serve"),
    "acp": ("host_commands", "acp"),
    "migrate": ("host_commands", "migrate"),
}
"""Every subcommand but ``completion``, in ``--help`` order: the module of
``durable_harness.cli`` that defines it and the name there (``design/cli.md``, "Start-up")."""


COMMAND_MODULES = tuple(
    dict.fromkeys(f"durable_harness.cli.{m}" for m, _ in COMMAND_SOURCES.values())
)
"""Every command's module, for a process that runs many commands and imports them up front (the
fork server's CLI children: ``crashtest/forkserver.py`` :func:`run_cli`)."""


class _Commands(MutableMapping[str, Command]):
    """The commands by name, each module imported when one of its commands is first asked for:
    a command starts without importing the others' dependencies (the harness, the providers,
    the host), about 0.2 s of a read-only command's start (``design/cli.md``, "Start-up")."""

    def __init__(self) -> None:
        self._loaded: dict[str, Command] = {}
        self._names = [*COMMAND_SOURCES, "completion"]

    def __getitem__(self, name: str) -> Command:
        if name not in self._loaded:
            if name not in COMMAND_SOURCES:
                raise KeyError(name)
            module, attr = COMMAND_SOURCES[name]
            self._loaded[name] = getattr(import_module(f"durable_harness.cli.{module}"), attr)
        return self._loaded[name]

    def __setitem__(self, name: str, value: Command) -> None:
        if name not in self._names:
            self._names.append(name)
        self._loaded[name] = value

    def __delitem__(self, name: str) -> None:
        self._names.remove(name)
        self._loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._names))

    def __len__(self) -> int:
        return len(self._names)


COMMANDS: MutableMapping[str, Command] = _Commands()
"""Every subcommand by name, in ``--help`` order (``design/cli.md``, "Commands")."""
COMMANDS["completion"] = completion


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


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of every command in :data:`COMMANDS`, or with ``only`` (a command's
    name) of that command alone: the same options, help and errors for it, without importing
    the others."""
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
    for c in [COMMANDS[only]] if only is not None and only in COMMANDS else COMMANDS.values():
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
    words = sys.argv[1:] if argv is None else list(argv)
    # the command is the first word (the top level takes no option with a value): its parser
    # alone, unless help, the version or a mistyped name needs the whole list
    first = words[0] if words else None
    parser = build_parser(first if first in COMMANDS else None)
    args = parser.parse_args(words)
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
