"""The crash matrix (``durable-harness crash-test``): scenarios as data in ``crash_scenarios/``,
crossed with every crash point they reach, on each backend (see :mod:`.runner`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from durable_harness.crashtest.invariants import INVARIANTS
from durable_harness.crashtest.powercut import DURABILITIES, summary_markdown
from durable_harness.crashtest.runner import Cell, run_matrix
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
    p.add_argument("--jobs", type=int, default=2, help="cells run at once (default 2)")
    p.add_argument("--report", metavar="FILE", help="write the report to FILE (.md or .json)")
    p.add_argument(
        "--scenarios",
        metavar="DIR",
        help='scenario folder (default: crash_scenarios/); a scenario\'s "tools" and '
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


def _short(c: Cell) -> str:
    """A table cell: the status, and what recovery needed."""
    if c.status != "pass":
        return c.status.upper() + (" (doubled)" if c.doubled else "")
    tags = [t for t, on in (("decision", c.decisions), ("reconciled", c.reconciled)) if on]
    return "pass" + (f" ({', '.join(tags)})" if tags else "")


def markdown(cells: list[Cell], summary: dict[str, Any]) -> str:
    """The report as Markdown: what each cell proves, a scenario x crash point table per
    backend, then every failure in full."""
    lines = [
        "# Crash matrix",
        "",
        f"{summary['cells']} cells, {summary['passed']} passed, {summary['failed']} failed, "
        f"{summary['errors']} errors; {summary['decisions']} needed an operator decision, "
        f"{summary.get('reconciled', 0)} were settled by a tool's reconcile, "
        f"{summary.get('doubled', 0)} found an effect doubled; "
        f"{summary['wall_seconds']} s with {summary['jobs']} jobs.",
        "",
        "Each cell runs a scenario in a real child process that SIGKILLs itself at the "
        "named crash point (the n-th hit for `point:n`), then recovers, resumes and checks:",
        "",
    ]
    lines += [f"- **{k}**: {v}" for k, v in INVARIANTS.items()]
    if "power_cut" in summary:
        lines += ["", "## Power cuts", "", "Cells per backend and durability mode:", ""]
        lines.append(summary_markdown(cells))
    groups = sorted({(c.backend, c.durability or "") for c in cells})
    for backend, mode in groups:
        mine = [c for c in cells if c.backend == backend and (c.durability or "") == mode]
        points = sorted({c.label for c in mine})
        scen = sorted({c.scenario for c in mine})
        lines += [
            "",
            f"## {backend}" + (f", power cut, durability {mode}" if mode else ""),
            "",
            "| crash point | " + " | ".join(scen) + " |",
            "|---|" + "---|" * len(scen),
        ]
        for point in points:
            row = []
            for s in scen:
                hit = [c for c in mine if c.scenario == s and c.label == point]
                row.append(_short(hit[0]) if hit else "")
            lines.append(f"| {point} | " + " | ".join(row) + " |")
    decided = [c for c in cells if c.decisions]
    if decided:
        lines += ["", "## Cells that needed a decision", ""]
        lines += [
            f"- {c.backend} {c.scenario} {c.label}: {', '.join(c.decisions)}" for c in decided
        ]
    doubled = [c for c in cells if c.doubled]
    if doubled:
        lines += ["", "## Effects found doubled", ""]
        lines += [f"- {c.backend} {c.scenario} {c.label}: {', '.join(c.doubled)}" for c in doubled]
    bad = [c for c in cells if c.status != "pass"]
    if bad:
        lines += ["", "## Failures", ""]
        lines += [f"- {c.backend} {c.scenario} {c.label}: {'; '.join(c.failures)}" for c in bad]
    return "\n".join(lines) + "\n"


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

    # live on a terminal (stderr); plain lines at least every 10 s when stdout is not one
    with MatrixProgress() as progress:
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
            print(f"\n{backend}" + (f", power cut, durability {mode}:" if mode else ":"))
            for c in sorted(
                (c for c in cells if c.backend == backend and c.durability == mode),
                key=lambda c: (c.scenario, c.label),
            ):
                lost = "; lost " + str(c.lost) if c.lost else ""
                print(f"  {(c.scenario + ' ' + c.label).ljust(width)}  {_verdict(c)}{lost}")
    if modes:
        print("\npower cuts (cells per backend and mode):\n" + summary_markdown(cells))
    print(
        f"\n{summary['cells']} cells: {summary['passed']} passed, {summary['failed']} failed, "
        f"{summary['errors']} errors, {summary['decisions']} needed a decision, "
        f"{summary['reconciled']} reconciled, {summary['doubled']} with a doubled effect; "
        f"{summary['wall_seconds']} s with {summary['jobs']} jobs"
    )
    print(
        "Each passing cell proves, for that crash point: "
        + "; ".join(INVARIANTS.values())
        + ". 'decision needed' means an in-doubt replay-never call waited for an operator, who "
        "supplied the result when its effect was visible (result), re-ran a built-in tool "
        "(retry), or failed a custom tool's call whose effect it cannot see (fail); "
        "'reconciled' means the tool's own reconcile established the call's result; "
        "'doubled' lists effects counted twice."
    )
    if args.report:
        path = Path(args.report)
        if path.suffix == ".json":
            report = {"summary": summary, "invariants": INVARIANTS, "cells": list(map(vars, cells))}
            path.write_text(json.dumps(report, indent=2))
        else:
            path.write_text(markdown(cells, summary))
        print(f"report written to {path}")
    return 0 if summary["passed"] == summary["cells"] else 1
