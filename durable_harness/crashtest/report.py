"""The crash matrix's reports: the JSON document (``--report FILE.json``, ``--json``), Markdown
(``--report FILE.md``) and a self-contained HTML picture of the matrix (``--report FILE.html``);
``design/testing-kit.md`` "Reports" says what each holds and why."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from durable_harness.crash import CRASH_POINTS
from durable_harness.crashtest.invariants import INVARIANTS, Cell
from durable_harness.crashtest.powercut import summary_markdown

OUTCOMES: dict[str, tuple[str, str]] = {
    "passed": ("#b7e1b9", "every invariant held; recovery needed nothing from anyone"),
    "reconciled": ("#b9d7f5", "passed; a tool's own reconcile established a call's result"),
    "decision": ("#ffe08a", "passed; an in-doubt call waited for an operator's decision"),
    "failed": ("#f4a3a3", "an invariant broke, or the cell could not run (error)"),
}
"""Outcome of a cell -> (background colour, meaning): the HTML report's cells and legend."""

NOT_REACHED = "#eeeeee"
"""The background of a table cell whose scenario never reaches that crash point."""

FORMATS = (".json", ".md", ".html")
"""The ``--report`` file suffixes; anything else is written as Markdown (as before)."""


def outcome(c: Cell) -> str:
    """A cell's outcome for the picture: ``failed`` (status ``fail`` or ``error``), else
    ``decision`` when an operator (or the policy) decided a call, else ``reconciled`` when a
    tool's reconcile settled one, else ``passed``."""
    if c.status != "pass":
        return "failed"
    if c.decisions:
        return "decision"
    return "reconciled" if c.reconciled else "passed"


def document(cells: list[Cell], summary: dict[str, Any]) -> dict[str, Any]:
    """The report as one JSON-ready object: ``summary`` (the counts ``run_matrix`` returns),
    ``invariants`` (name -> what a passing cell proves) and ``cells`` (every :class:`Cell`'s
    fields, exactly: ``Cell(**row)`` reads a row back). ``--json`` prints it, ``--report
    FILE.json`` writes it."""
    return {"summary": summary, "invariants": INVARIANTS, "cells": [vars(c) for c in cells]}


def _short(c: Cell) -> str:
    """A table cell: the status, and what recovery needed."""
    if c.status != "pass":
        return c.status.upper() + (" (doubled)" if c.doubled else "")
    tags = [t for t, on in (("decision", c.decisions), ("reconciled", c.reconciled)) if on]
    return "pass" + (f" ({', '.join(tags)})" if tags else "")


def _groups(cells: list[Cell]) -> list[tuple[str, str, list[Cell]]]:
    """``(backend, durability or "", cells)`` per table, sorted."""
    keys = sorted({(c.backend, c.durability or "") for c in cells})
    return [
        (b, m, [c for c in cells if c.backend == b and (c.durability or "") == m]) for b, m in keys
    ]


def _point_order(label: str) -> tuple[int, int, str]:
    """Crash points in the order a run reaches them (``crash.CRASH_POINTS``), then by hit."""
    point, _, hit = label.partition(":")
    names = list(CRASH_POINTS)
    return (names.index(point) if point in names else len(names), int(hit or 1), point)


def markdown(cells: list[Cell], summary: dict[str, Any]) -> str:
    """The report as Markdown: what each cell proves, a crash point x scenario table per
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
    for backend, mode, mine in _groups(cells):
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


def cell_id(c: Cell) -> str:
    """The HTML anchor of a cell's details: ``cell-<backend>[-<mode>]-<scenario>-<point>-<n>``
    (characters outside ``[A-Za-z0-9_-]`` become ``-``)."""
    raw = "-".join(["cell", c.backend, *([c.durability] if c.durability else []), c.scenario])
    return re.sub(r"[^A-Za-z0-9_-]", "-", f"{raw}-{c.point}-{c.hit}")


_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
th,td{border:1px solid #999;padding:.25em .5em;font-size:.85em}
th.point{writing-mode:vertical-rl;transform:rotate(180deg);text-align:left;font-weight:normal}
td.cell a{color:#222;text-decoration:none;display:block}
td.cell a:hover{text-decoration:underline}
.legend span{display:inline-block;padding:.15em .6em;margin-right:.5em;border:1px solid #999}
details{margin:.3em 0;padding:.3em .6em;border-left:.4em solid #999}
details:target{outline:2px solid #333}
summary{cursor:pointer}
pre{white-space:pre-wrap;margin:.3em 0}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _glyph(c: Cell) -> str:
    """A matrix cell's text, short so twenty columns fit a screen (the full verdict is its
    ``title`` and its details): ``ok``, ``rec``, ``dec``, ``FAIL`` or ``ERR`` (``x2`` added
    when an effect was doubled)."""
    short = {"passed": "ok", "reconciled": "rec", "decision": "dec"}
    text = short.get(outcome(c)) or ("ERR" if c.status == "error" else "FAIL")
    return text + (" x2" if c.doubled else "")


def _table(backend: str, mode: str, mine: list[Cell]) -> list[str]:
    """One backend's (and power-cut mode's) matrix: scenarios as rows, crash points as columns."""
    points = sorted({c.label for c in mine}, key=_point_order)
    scen = sorted({c.scenario for c in mine})
    title = f"{backend}" + (f", power cut, durability {mode}" if mode else "")
    out = [
        f"<h2>{_e(title)}</h2>",
        f'<table class="matrix" data-backend="{_e(backend)}" data-durability="{_e(mode)}">',
        "<thead><tr><th>scenario</th>"
        + "".join(f'<th class="point" title="{_e(p)}">{_e(p)}</th>' for p in points)
        + "</tr></thead><tbody>",
    ]
    by_key = {(c.scenario, c.label): c for c in mine}
    for s in scen:
        row = [f'<tr><th scope="row">{_e(s)}</th>']
        for p in points:
            c = by_key.get((s, p))
            if c is None:
                row.append(
                    f'<td class="cell not-reached" style="background:{NOT_REACHED}" '
                    f'title="{_e(s)} does not reach {_e(p)}"></td>'
                )
                continue
            kind = outcome(c)
            colour = OUTCOMES[kind][0]
            row.append(
                f'<td class="cell {kind}" data-outcome="{kind}" style="background:{colour}" '
                f'title="{_e(s)} at {_e(p)}: {_e(_short(c))}">'
                f'<a href="#{cell_id(c)}">{_e(_glyph(c))}</a></td>'
            )
        out.append("".join(row) + "</tr>")
    out.append("</tbody></table>")
    return out


def _details(c: Cell) -> str:
    """A cell's full record, as a ``<details>`` element (open for a failed cell)."""
    kind = outcome(c)
    parts = [
        ("failures", c.failures),
        ("decisions", c.decisions),
        ("reconciled", c.reconciled),
        ("doubled effects", c.doubled),
        ("recovery plan", c.plan),
        ("notes", c.notes),
        ("lost by the power cut", [f"{k}: {', '.join(v)}" for k, v in c.lost.items() if v]),
    ]
    body = "".join(
        f"<p><b>{_e(name)}</b></p><pre>{_e(chr(10).join(items))}</pre>"
        for name, items in parts
        if items
    )
    where = f"{c.backend}" + (f", durability {c.durability}" if c.durability else "")
    return (
        f'<details id="{cell_id(c)}" class="{kind}" data-outcome="{kind}"'
        f' style="border-left-color:{OUTCOMES[kind][0]}"{" open" if kind == "failed" else ""}>'
        f"<summary>{_e(c.scenario)} at {_e(c.label)} ({_e(where)}): {_e(_short(c))}"
        f", {c.seconds:.1f} s</summary>{body or '<p>nothing to report</p>'}</details>"
    )


def html_report(cells: list[Cell], summary: dict[str, Any]) -> str:
    """The matrix as one self-contained HTML page (inline CSS, no script, no external asset):
    per backend (and power-cut mode) a table of scenarios (rows) by crash points (columns, in
    the order a run reaches them), each cell coloured by :func:`outcome` (:data:`OUTCOMES`)
    and linked to its ``<details>`` below (failed ones open), plus the invariants."""
    head = (
        f"{summary['cells']} cells, {summary['passed']} passed, {summary['failed']} failed, "
        f"{summary['errors']} errors; {summary['decisions']} needed a decision, "
        f"{summary.get('reconciled', 0)} reconciled, {summary.get('doubled', 0)} with a doubled "
        f"effect; {summary['wall_seconds']} s with {summary['jobs']} jobs."
    )
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>Crash matrix</title>',
        f"<style>{_CSS}</style></head><body>",
        "<h1>Crash matrix</h1>",
        f'<p class="summary">{_e(head)}</p>',
        '<p class="legend">'
        + "".join(
            f'<span class="{k}" style="background:{colour}" title="{_e(meaning)}">{k}</span>'
            for k, (colour, meaning) in OUTCOMES.items()
        )
        + f'<span style="background:{NOT_REACHED}">not reached</span></p>',
    ]
    for backend, mode, mine in _groups(cells):
        out += _table(backend, mode, mine)
    out.append("<h2>Cells</h2>")
    ordered = sorted(
        cells,
        key=lambda c: (
            outcome(c) != "failed",
            c.backend,
            c.durability or "",
            c.scenario,
            *_point_order(c.label),
        ),
    )
    out += [_details(c) for c in ordered]
    out += ["<h2>What a passing cell proves</h2>", "<ul>"]
    out += [f"<li><b>{_e(k)}</b>: {_e(v)}</li>" for k, v in INVARIANTS.items()]
    out += ["</ul>", "</body></html>"]
    return "\n".join(out) + "\n"


def write(path: Path, cells: list[Cell], summary: dict[str, Any]) -> None:
    """Write the report in the format ``path``'s suffix names (:data:`FORMATS`; Markdown for
    any other suffix)."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        path.write_text(json.dumps(document(cells, summary), indent=2, ensure_ascii=False))
    elif suffix in (".html", ".htm"):
        path.write_text(html_report(cells, summary), encoding="utf-8")
    else:
        path.write_text(markdown(cells, summary))
