"""The crash matrix (``durable-harness crash-test``): scenarios as data in ``crashtest/scenarios/``,
crossed with every crash point they reach, on each backend (see :mod:`.runner`)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from durable_harness.crashtest.invariants import INVARIANTS
from durable_harness.crashtest.powercut import DURABILITIES, summary_markdown
from durable_harness.crashtest.report import document, write
from durable_harness.crashtest.report import markdown as markdown
from durable_harness.crashtest.runner import DEFAULT_JOBS, Cell, run_matrix
from durable_harness.crashtest.scenario import load_all
from durable_harness.errors import FormatError


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Add the crash-test options."""

    def repeatable(flag: str, help: str, **kw: Any) -> None:
        p.add_argument(flag, action="append", default=[], help=help, **kw)

    repeatable("--scenario", "only this scenario (repeatable; default: all)", metavar="NAME")
    repeatable(
        "--backend",
        "only this backend (repeatable; default: jsonl and sqlite; postgres starts a "
        "throw-away PostgreSQL cluster unless $DURABLE_HARNESS_CRASHTEST_PG names a database)",
        choices=("jsonl", "sqlite", "postgres"),
    )
    repeatable(
        "--point",
        "only cells at this crash point, or its n-th hit (repeatable; default: every point "
        "a scenario reaches)",
        metavar="POINT[:N]",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=DEFAULT_JOBS,
        help=f"cells run at once (default: four per CPU, at most 16; {DEFAULT_JOBS} here: a "
        "cell mostly waits)",
    )
    p.add_argument(
        "--report",
        metavar="FILE",
        help="write the report to FILE: .json (the --json document), .html (the matrix as a "
        "coloured picture, one self-contained page) or .md (Markdown; any other suffix too)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the report as one JSON document on stdout (progress and lines for a "
        "person go to stderr)",
    )
    p.add_argument(
        "--scenarios",
        metavar="DIR",
        help='scenario folder (default: the built-in scenarios); a scenario\'s "tools" and '
        "\"provider\" import paths ('module:function') resolve from the current folder",
    )
    p.add_argument(
        "--power-cut",
        action="store_true",
        help="cut the store back to what was durable at each crash (a power cut, not only a "
        "process kill), once per durability mode",
    )
    repeatable(
        "--durability",
        "with --power-cut: only this durability mode (repeatable; default: all three)",
        choices=DURABILITIES,
    )
    p.add_argument(
        "--broken-intent-order",
        action="store_true",
        help="deliberately run tool effects before their intent, to see the matrix catch it",
    )


def _verdict(c: Cell) -> str:
    extra = []
    if c.decisions:
        extra.append(f"decision needed ({', '.join(d.split('=')[1] for d in c.decisions)})")
    if c.reconciled:
        extra.append(f"reconciled ({', '.join(c.reconciled)})")
    if c.doubled:
        extra.append(f"doubled: {', '.join(c.doubled)}")
    if c.status != "pass":
        return f"{c.status.upper()}: {'; '.join(c.failures)}" + "".join(f"; {e}" for e in extra)
    return ", ".join(["pass", *extra])


def run_cli(args: argparse.Namespace) -> int:
    """Run the matrix from the command line; exit 0 when every cell passed."""
    from durable_harness.crashtest.scenario import import_path

    import_path()  # scenarios' custom tools and providers import from this folder
    scenarios = load_all(args.scenarios, args.scenario or None)
    backends = args.backend or ["jsonl", "sqlite"]
    if args.durability and not args.power_cut:
        raise FormatError(
            "crash-test: --durability chooses the modes of a power-cut run; add --power-cut"
        )
    modes = (args.durability or list(DURABILITIES)) if args.power_cut else None
    if modes and "postgres" in backends:
        raise FormatError(
            "crash-test: --power-cut cuts files (JSONL, SQLite); PostgreSQL's own WAL is "
            "the server's to keep: run the postgres backend without --power-cut"
        )
    with _postgres_for(backends):
        return _run_cli(args, scenarios, backends, modes)


@contextlib.contextmanager
def _postgres_for(backends: list[str]) -> Iterator[None]:
    """A throw-away cluster for a ``postgres`` run without ``$DURABLE_HARNESS_CRASHTEST_PG``."""
    from durable_harness.crashtest.runner import PG_ENV

    if "postgres" not in backends or os.environ.get(PG_ENV):
        yield
        return
    from durable_harness.testing.pgcluster import TemporaryCluster, find_bindir

    bindir = find_bindir()
    if bindir is None:
        raise FormatError(
            "crash-test --backend postgres: no PostgreSQL server binaries (initdb, pg_ctl) "
            f"found; install the server or set ${PG_ENV} to a database URL"
        )
    cluster = TemporaryCluster(bindir)
    try:
        cluster.start()
        os.environ[PG_ENV] = cluster.spec
        yield
    finally:
        os.environ.pop(PG_ENV, None)
        cluster.cleanup()


def _run_cli(
    args: argparse.Namespace,
    scenarios: list[Any],
    backends: list[str],
    modes: list[str] | None,
) -> int:
    from durable_harness.terminal import MatrixProgress

    # live on a terminal (stderr); plain lines at least every 10 s when stdout is not one.
    # With --json stdout holds the document alone: the plain lines go to stderr (unless the
    # live display is already there), and so does everything printed for a person.
    plain: Any = None
    if args.json:
        plain = io.StringIO() if sys.stderr.isatty() else sys.stderr
    human = sys.stderr if args.json else sys.stdout
    with MatrixProgress(plain=plain) as progress:
        cells, summary = run_matrix(
            scenarios,
            backends,
            jobs=args.jobs,
            broken=args.broken_intent_order,
            progress=progress,
            durabilities=modes,
            points=args.point or None,
        )
    width = max(len(f"{c.scenario} {c.label}") for c in cells) if cells else 10
    for backend in backends:
        for mode in [*modes] if modes else [None]:
            title = f", power cut, durability {mode}:" if mode else ":"
            print(f"\n{backend}{title}", file=human)
            for c in sorted(
                (c for c in cells if c.backend == backend and c.durability == mode),
                key=lambda c: (c.scenario, c.label),
            ):
                lost = "; lost " + str(c.lost) if c.lost else ""
                label = (c.scenario + " " + c.label).ljust(width)
                print(f"  {label}  {_verdict(c)}{lost}", file=human)
    if modes:
        cuts = summary_markdown(cells)
        print("\npower cuts (cells per backend and mode):\n" + cuts, file=human)
    print(
        f"\n{summary['cells']} cells: {summary['passed']} passed, {summary['failed']} failed, "
        f"{summary['errors']} errors, {summary['decisions']} needed a decision, "
        f"{summary['reconciled']} reconciled, {summary['doubled']} with a doubled effect; "
        f"{summary['wall_seconds']} s with {summary['jobs']} jobs",
        file=human,
    )
    print(
        "Each passing cell proves, for that crash point: "
        + "; ".join(INVARIANTS.values())
        + ". 'decision needed' means an in-doubt replay-never call waited for an operator, who "
        "supplied the result when its effect was visible (result), re-ran a built-in tool "
        "(retry), or failed a custom tool's call whose effect it cannot see (fail); "
        "'reconciled' means the tool's own reconcile established the call's result; "
        "'doubled' lists effects counted twice.",
        file=human,
    )
    if args.report:
        path = Path(args.report)
        write(path, cells, summary)
        print(f"report written to {path}", file=human)
    if args.json:  # one document, as `run --json` prints one object (design/cli.md, "Output")
        print(json.dumps(document(cells, summary), indent=2, ensure_ascii=False, default=str))
    return 0 if summary["passed"] == summary["cells"] else 1
