"""``crash-test --report FILE.html`` and ``crash-test --json``.

The HTML report is read back with ``html.parser`` (as a reader who cannot see colours would
read it): one table per backend, scenarios as rows and crash points as columns, each cell's
outcome in its class and its background colour, and a failing cell's link leading to an open
``<details>`` that holds its failure text. The page loads nothing from elsewhere.

The real run is the deliberately broken build (``--broken-intent-order``, the tool's effect
before its intent, ``crashtest/broken.py``) at two points of ``single_tool``: the crash after
the effect doubles it (a failed cell), the crash after the late intent waits for a decision.
Its ``--json`` document is the ``--report FILE.json`` one, alone on stdout.
"""

from __future__ import annotations

import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from durable_harness.crashtest.report import NOT_REACHED, OUTCOMES, html_report, outcome
from durable_harness.crashtest.runner import Cell

_SCRIPT = Path(sys.executable).with_name("durable-harness")
DH = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "durable_harness"]


class Page(HTMLParser):
    """What a report page holds: the matrix cells, the details elements, external references."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[dict[str, Any]] = []  # {"backend", "columns", "rows": {scen: [td]}}
        self.details: dict[str, dict[str, Any]] = {}  # id -> {"attrs", "text"}
        self.external: list[str] = []
        self._row: str | None = None
        self._in_th_row = False
        self._cell: dict[str, Any] | None = None
        self._detail: str | None = None
        self._header: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        for key in ("src", "href"):
            if key in a and not a[key].startswith("#"):
                self.external.append(a[key])
        if tag in ("link", "script", "img", "iframe"):
            self.external.append(tag)
        if tag == "table":
            self.tables.append({"backend": a.get("data-backend"), "columns": [], "rows": {}})
        elif tag == "tr":
            self._row, self._in_th_row = None, False
        elif tag == "th" and self.tables:
            if "point" in a.get("class", ""):
                self.tables[-1]["columns"].append(a["title"])
            elif a.get("scope") == "row":
                self._in_th_row = True
        elif tag == "td" and self._row is not None:
            self._cell = {"class": a.get("class", ""), "style": a.get("style", ""), "href": ""}
            self.tables[-1]["rows"][self._row].append(self._cell)
        elif tag == "a" and self._cell is not None:
            self._cell["href"] = a.get("href", "")
        elif tag == "details":
            self._detail = a["id"]
            self.details[a["id"]] = {"attrs": a, "text": ""}

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._cell = None
        elif tag == "th":
            self._in_th_row = False
        elif tag == "details":
            self._detail = None

    def handle_data(self, data: str) -> None:
        if self._in_th_row and self.tables:
            self._row = data.strip()
            self.tables[-1]["rows"][self._row] = []
        if self._cell is not None:
            self._cell["text"] = self._cell.get("text", "") + data
        if self._detail is not None:
            self.details[self._detail]["text"] += data


def parse(text: str) -> Page:
    page = Page()
    page.feed(text)
    page.close()
    return page


def background(style: str) -> str:
    return style.split("background:", 1)[1].split(";")[0].strip()


def test_each_outcome_has_its_colour_and_a_missing_cell_is_grey() -> None:
    cells = [
        Cell("alpha", "jsonl", "after_run_started", 1),
        Cell("alpha", "jsonl", "after_tool_started", 1, decisions=["call_1=retry"]),
        Cell("beta", "jsonl", "after_tool_effect", 1, reconciled=["call_2"]),
        Cell("beta", "jsonl", "after_tool_started", 1, status="error", failures=["boom <x>"]),
        Cell("beta", "jsonl", "after_run_started", 2, status="fail", failures=["effects: x2"]),
    ]
    assert [outcome(c) for c in cells] == ["passed", "decision", "reconciled", "failed", "failed"]
    summary = {"cells": 5, "passed": 3, "failed": 1, "errors": 1, "decisions": 1}
    page = parse(html_report(cells, summary | {"wall_seconds": 1.0, "jobs": 2}))
    (table,) = page.tables
    # columns in the order a run reaches the points, then the n-th hit
    assert table["columns"] == [
        "after_run_started",
        "after_run_started:2",
        "after_tool_started",
        "after_tool_effect",
    ]
    seen = {
        scen: [(td["class"].split()[-1], background(td["style"])) for td in tds]
        for scen, tds in table["rows"].items()
    }
    grey = ("not-reached", NOT_REACHED)
    colour = {k: v[0] for k, v in OUTCOMES.items()}
    assert seen == {
        "alpha": [("passed", colour["passed"]), grey, ("decision", colour["decision"]), grey],
        "beta": [
            grey,
            ("failed", colour["failed"]),
            ("failed", colour["failed"]),
            ("reconciled", colour["reconciled"]),
        ],
    }
    assert len(set(colour.values()) | {NOT_REACHED}) == 5  # five tellable colours
    # every coloured cell links to its details; failed ones are open, text escaped
    for tds in table["rows"].values():
        for td in tds:
            if "not-reached" not in td["class"]:
                detail = page.details[td["href"][1:]]
                assert ("open" in detail["attrs"]) == ("failed" in td["class"])
    (err,) = [d for d in page.details.values() if "boom <x>" in d["text"]]
    assert err["attrs"]["data-outcome"] == "failed"
    assert page.external == []


@pytest.mark.crash
@pytest.mark.timeout(300)
def test_broken_build_as_html_and_json(tmp_path: Path) -> None:
    html_file, json_file = tmp_path / "matrix.html", tmp_path / "matrix.json"
    base = [*DH, "crash-test", "--scenario", "single_tool", "--backend", "jsonl"]
    base += ["--point", "after_tool_effect", "--point", "after_tool_started"]
    base += ["--broken-intent-order"]
    proc = subprocess.run(
        [*base, "--json", "--report", str(html_file)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=280,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]  # a cell failed
    doc = json.loads(proc.stdout)  # the whole of stdout is the one document
    assert set(doc) == {"summary", "invariants", "cells"}
    assert "report written to" in proc.stderr and "2 cells" in proc.stderr
    cells = {c["point"]: Cell(**c) for c in doc["cells"]}
    assert cells["after_tool_effect"].status == "fail" and cells["after_tool_effect"].doubled
    assert outcome(cells["after_tool_started"]) == "decision"
    assert doc["summary"]["cells"] == 2 and doc["summary"]["failed"] == 1

    page = parse(html_file.read_text())
    assert page.external == []  # self-contained: no script, stylesheet or image to fetch
    (table,) = page.tables
    assert table["backend"] == "jsonl"
    assert table["columns"] == ["after_tool_started", "after_tool_effect"]
    started, effect = table["rows"]["single_tool"]
    assert "decision" in started["class"]
    assert background(started["style"]) == OUTCOMES["decision"][0]
    assert "failed" in effect["class"] and background(effect["style"]) == OUTCOMES["failed"][0]
    # one click away: the failing cell's link opens onto its details, open, with its failures
    detail = page.details[effect["href"].removeprefix("#")]
    assert "open" in detail["attrs"]
    for failure in cells["after_tool_effect"].failures:
        assert failure in detail["text"]

    # the same run's --report FILE.json is the --json document (timings aside)
    again = subprocess.run(
        [*base, "--report", str(json_file)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=280,
        check=False,
    )
    assert again.returncode == 1 and "report written to" in again.stdout
    stored = json.loads(json_file.read_text())
    assert set(stored) == set(doc)
    assert [(c["point"], c["status"]) for c in stored["cells"]] == [
        (c["point"], c["status"]) for c in doc["cells"]
    ]


def test_json_error_is_a_document_too(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*DH, "crash-test", "--scenario", "no_such_scenario", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    error = json.loads(proc.stdout)["error"]
    assert error["code"] == "format_error" and "single_tool" in error["message"]  # built-ins
