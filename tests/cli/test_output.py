"""CLI output as people expect (issue 10): colour and progress only on a terminal with
``NO_COLOR`` honoured, an example and the exit statuses on every ``--help`` page (and in the
README), no Python reprs in human output, ISO 8601 ``modified`` on both backends, "started,
outcome unknown" for an in-doubt call, and a ``fork`` verb."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from durable_harness.cli.main import COMMANDS, EXIT_STATUS_HELP, main
from durable_harness.crashtest import forkserver
from durable_harness.storage import open_store
from durable_harness.terminal import MatrixProgress

from .conftest import REPO, Result

Cli = Callable[..., Result]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs without ``--cwd`` use the test's folder: their tools never write into the repo."""
    monkeypatch.chdir(tmp_path)


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
COLOUR = re.compile(r"\x1b\[(?:[0-9]+;)*(?:3[0-8]|9[0-7]|4[0-8])(?:;[0-9]+)*m")  # SGR colours
REPR = re.compile(r"\{'|\['|\bNone\b")
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


# -- colour and progress only on a terminal ------------------------------------------------------


def run_on_pty(args: list[str], env: dict[str, str]) -> str:
    """Run ``python -m durable_harness ARGS`` with stdout and stderr on a pseudo-terminal;
    return everything it wrote."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_harness", *args],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=str(REPO),
    )
    os.close(slave)
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: every writer of the terminal has gone
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    proc.wait(timeout=60)
    return b"".join(chunks).decode(errors="replace")


@pytest.fixture
def term_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env.update(TERM="xterm-256color", COLUMNS="120")
    env.pop("TTY_COMPATIBLE", None)
    return env


@pytest.mark.slow
def test_colour_only_on_a_terminal_and_no_color_honoured(term_env: dict[str, str]) -> None:
    args = ["show", "no-such-session"]
    on_terminal = run_on_pty(args, term_env)
    assert "error[session_not_found]" in ANSI.sub("", on_terminal)
    assert COLOUR.search(on_terminal), f"no colour on a terminal: {on_terminal!r}"
    no_color = run_on_pty(args, {**term_env, "NO_COLOR": "1"})
    assert "error[session_not_found]" in ANSI.sub("", no_color), no_color
    assert not COLOUR.search(no_color), no_color  # NO_COLOR: no colour (bold may stay)
    piped = forkserver.run_cli(args, env=term_env, cwd=str(REPO), timeout=60)
    assert piped.stderr.startswith("error[session_not_found]: ") and "\x1b" not in piped.stderr


def _cell(status: str, n: int) -> Any:
    return SimpleNamespace(status=status, scenario=f"sc{n}", label=f"point{n}", backend="jsonl")


def test_crash_test_progress_shows_counts_failures_and_time_left() -> None:
    buf = io.StringIO()
    terminal = Console(file=buf, force_terminal=True, width=160, color_system=None)
    with MatrixProgress(terminal) as progress:
        assert progress.enabled
        progress(_cell("pass", 1), 1, 4)
        progress(_cell("fail", 2), 2, 4)
        progress(_cell("pass", 3), 3, 4)
    shown = ANSI.sub("", buf.getvalue())
    assert "3/4" in shown and "1 failed" in shown, shown
    assert "left" in shown and re.search(r"\d+:\d\d:\d\d", shown), shown  # elapsed, remaining
    assert "FAIL jsonl sc2 point2" in shown, shown  # each failure as it happens


def test_crash_test_progress_is_silent_off_a_terminal() -> None:
    buf = io.StringIO()
    with MatrixProgress(Console(file=buf)) as progress:
        assert not progress.enabled
        progress(_cell("fail", 1), 1, 2)
        progress(_cell("pass", 2), 2, 2)
    assert buf.getvalue() == ""


def test_no_hand_written_escape_codes() -> None:
    package = REPO / "durable_harness"
    offenders = [
        str(p.relative_to(REPO))
        for p in package.rglob("*.py")
        if re.search(r"\\033\[|\\x1b\[|\\u001b\[", p.read_text())
    ]
    assert offenders == [], f"escape codes written by hand (use rich): {offenders}"


# -- help pages and exit statuses ----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_help_page_has_an_example_and_the_exit_statuses(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([name, "--help"])
    page = capsys.readouterr().out
    example = page.split("example:\n", 1)
    assert len(example) == 2, f"{name} --help has no example"
    assert re.search(rf"durable-harness {re.escape(name)}\b", example[1]), example[1]
    assert "exit status:" in page and "  70 " in page
    statuses = page.split("exit status:\n", 1)[1]
    listed = [int(c) for c in re.findall(r"^  (\d+) ", statuses, re.M)]
    assert listed == sorted({c for c, _ in COMMANDS[name].exits} | {2, 70, 130, 141})


# Each page lists the statuses that command returns, not one shared list (issue 24): a
# command that never runs an agent never says "suspended"; one that reports damage says 1.
PAGE_STATUSES = {
    "run": ({0, 1, 3, 4, 5}, set()),
    "resume": ({0, 1, 3, 4, 5}, set()),
    "fsck": ({0, 1}, {3, 4, 5}),
    "crash-test": ({0, 1}, {3, 4, 5}),
    "show": ({0}, {1, 3, 4, 5}),
    "label": ({0}, {1, 3, 4, 5}),
    "serve": ({0}, {1, 3, 4, 5}),
}


@pytest.mark.parametrize("name", sorted(PAGE_STATUSES))
def test_a_help_page_lists_that_command_s_own_statuses(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([name, "--help"])
    statuses = capsys.readouterr().out.split("exit status:\n", 1)[1]
    listed = {int(c) for c in re.findall(r"^  (\d+) ", statuses, re.M)}
    has, lacks = PAGE_STATUSES[name]
    assert has <= listed and not (lacks & listed), statuses


def test_exit_statuses_documented_in_top_help_and_readme(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    page = capsys.readouterr().out
    assert EXIT_STATUS_HELP in page and "examples:" in page
    codes = re.findall(r"^\s+(\d+)\s", EXIT_STATUS_HELP, re.M)
    assert codes == ["0", "1", "2", "3", "4", "5", "70", "130"]
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Exit status", 1)
    assert len(section) == 2, "README.md has no '## Exit status' section"
    body = section[1].split("\n## ", 1)[0]
    for code in [*codes, "141"]:
        assert re.search(rf"^\|\s*`?{code}`?\s*\|", body, re.M), f"exit status {code} not in README"


def test_internal_error_exits_70_without_traceback(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(args: Any) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setitem(COMMANDS, "crash-points", replace(COMMANDS["crash-points"], run=boom))
    res = cli("crash-points")
    assert res.code == 70
    assert res.err.startswith("error[internal]: RuntimeError: a bug") and "Traceback" not in res.err


# -- no Python reprs; wording of an in-doubt call ------------------------------------------------


@pytest.mark.slow
def test_human_output_has_no_python_reprs_and_in_doubt_reads_started_outcome_unknown(
    cli: Cli,
    sh: Callable[..., Result],
    script: Path,
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DURABLE_HARNESS_CRASH_AT", "after_tool_effect")
    crashed = sh("run", "go", "--provider", f"scripted:{script}", "--cwd", str(project))
    monkeypatch.delenv("DURABLE_HARNESS_CRASH_AT")
    assert crashed.code == -9, crashed.err
    assert '[tool] bash {"command": "echo ran >> effect.log"}' in crashed.out
    sid = cli("sessions", "--json").json()[0]["id"]
    plan = cli("recover", sid)
    assert plan.code == 0, plan.err
    assert "started, outcome unknown" in plan.out and " ran with" not in plan.out, plan.out
    assert "provider attempts turn 1: 1" in plan.out, plan.out
    outputs = {name: cli(name, sid) for name in ("recover", "log", "cost", "show", "context")}
    outputs["sessions"] = cli("sessions")
    for name, res in outputs.items():
        assert res.code == 0, (name, res.err)
        assert not REPR.search(res.out + res.err), (name, REPR.search(res.out + res.err), res.out)


def test_pi_import_cost_and_context_without_model_have_no_none(
    cli: Cli, pi_sessions: Path, tmp_path: Path
) -> None:
    imported = cli("import", str(pi_sessions / "v3-branched.jsonl"), "--json").json()
    for name in ("cost", "show", "log", "recover"):
        res = cli(name, imported["session_id"])
        assert res.code == 0 and not REPR.search(res.out), (name, res.out)
    bare = open_store(f"jsonl:{tmp_path / 's'}").create_session("/p")
    bare.close()
    res = cli("context", bare.session_id, "--store", f"jsonl:{tmp_path / 's'}")
    assert res.out.startswith("# model (none recorded) thinking off"), res.out


@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
def test_modified_is_iso_8601_on_both_backends(
    cli: Cli, script: Path, project: Path, tmp_path: Path, backend: str
) -> None:
    spec = f"jsonl:{tmp_path / 'j'}" if backend == "jsonl" else f"sqlite:{tmp_path / 'a.db'}"
    for prompt in ("one", "two"):
        run = cli("run", prompt, "--provider", f"scripted:{script}", "--cwd", str(project),
                  "--store", spec, "--quiet")  # fmt: skip
        assert run.code == 0, run.err
    listed = cli("sessions", "--json", "--store", spec).json()
    assert len(listed) == 2
    for info in listed:
        for key in ("created", "modified"):
            assert ISO.match(info[key]), (key, info[key])
            datetime.fromisoformat(info[key].replace("Z", "+00:00"))
    assert listed[0]["modified"] >= listed[1]["modified"]  # most recent first


# -- fork ----------------------------------------------------------------------------------------


def test_fork_copies_the_path_into_a_new_session(
    cli: Cli, script: Path, project: Path, tmp_path: Path
) -> None:
    assert cli("run", "go", "--provider", f"scripted:{script}", "--cwd", str(project)).code == 0
    sid = cli("sessions", "--json").json()[0]["id"]
    entries = cli("show", sid, "--tree", "--json").json()["tree"]
    ids = [e["id"] for e in entries]
    at = ids[3]
    forked = cli("fork", sid, "--entry", at, "--json")
    assert forked.code == 0, forked.err
    info = forked.json()
    assert info["parent_session"] == sid and info["entries"] == 4
    shown = cli("show", info["session_id"], "--json").json()
    assert shown["header"]["parentSession"] == sid
    assert [
        e["id"] for e in cli("show", info["session_id"], "--tree", "--json").json()["tree"]
    ] == ids[:4]
    before = cli("fork", sid, "--entry", at, "--before")
    assert before.code == 0 and "(3 entries)" in before.out, before.out
    whole = cli("fork", sid, "--json").json()  # default: the leaf of main
    assert whole["entries"] == len(ids)
    assert cli("show", sid, "--json").json()["entries"] == len(ids)  # the original is untouched
    # from a session file into another store, under another working directory
    path = cli("show", sid, "--json").json()["location"]
    other = tmp_path / "other.db"
    moved = cli("fork", path, "--store", f"sqlite:{other}", "--cwd", str(tmp_path), "--json")
    assert moved.code == 0, moved.err
    listed = cli("sessions", "--json", "--store", f"sqlite:{other}").json()
    assert [(i["id"], i["cwd"]) for i in listed] == [(moved.json()["session_id"], str(tmp_path))]


def test_fork_keeps_labels_and_a_cross_cwd_fork_copies_the_whole_tree(
    cli: Cli, script: Path, project: Path, tmp_path: Path, home: Path
) -> None:
    """Issue 20: ``fork`` keeps the labels of what it copies; ``fork --cwd OTHER`` copies the
    whole tree (every branch, label entries included) with the same leaf, as pi's forkFrom."""
    from durable_harness.session import Session
    from durable_harness.storage import open_store

    assert cli("run", "go", "--provider", f"scripted:{script}", "--cwd", str(project)).code == 0
    sid = cli("sessions", "--json").json()[0]["id"]
    with Session(open_store(f"jsonl:{home}").open_session(sid)) as s:
        first = str(s.path(s.leaf())[0]["id"])
        s.set_label(first, "the ask")
        s.navigate(first)
        s.append_message({"role": "user", "content": "a side branch", "timestamp": 1})
        ids, leaf = {str(e["id"]) for e in s.store.iter_entries()}, s.leaf()
    forked = cli("fork", sid, "--entry", first, "--json").json()
    shown = cli("show", forked["session_id"], "--json").json()
    assert shown["labels"] == {first: "the ask"}
    other = tmp_path / "other"
    other.mkdir()
    moved = cli("fork", sid, "--cwd", str(other), "--json")
    assert moved.code == 0, moved.err
    assert moved.json()["entries"] == len(ids)
    with Session(open_store(f"jsonl:{home}").open_session(moved.json()["session_id"])) as copy:
        assert {str(e["id"]) for e in copy.store.iter_entries()} == ids
        assert copy.leaf() == leaf and copy.labels() == {first: "the ask"}
        assert copy.cwd == str(other)


def test_fork_of_an_unknown_entry_is_refused_and_creates_nothing(
    cli: Cli, script: Path, project: Path
) -> None:
    cli("run", "go", "--provider", f"scripted:{script}", "--cwd", str(project))
    sid = cli("sessions", "--json").json()[0]["id"]
    res = cli("fork", sid, "--entry", "nope")
    assert res.code == 2 and res.err.startswith("error[unknown_entry]: "), res.err
    assert len(cli("sessions", "--json").json()) == 1
    assert json.loads(cli("fork", sid, "--entry", "nope", "--json").out)["error"]["code"] == (
        "unknown_entry"
    )
