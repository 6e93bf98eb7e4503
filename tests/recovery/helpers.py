"""Helpers for the recovery tests: run ``durable-harness`` in a child process (forked from the
warm fork server: :func:`dh`) or, for a read, in this process; write scripted-provider files,
and read a session back read-only."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from durable_harness.cli.main import main as cli_main
from durable_harness.crashtest import forkserver
from durable_harness.recovery.resume import recover
from durable_harness.session.session import Session
from durable_harness.storage import open_store
from durable_harness.tools.builtin import builtin_tools

BACKENDS = ("jsonl", "sqlite")

_SCRIPT = Path(sys.executable).with_name("durable-harness")
DH: list[str] = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "durable_harness"]


def store_spec(backend: str, root: Path) -> str:
    """A fresh store spec of ``backend`` under ``root``."""
    return f"jsonl:{root / 'home'}" if backend == "jsonl" else f"sqlite:{root / 'store.db'}"


def env(crash_at: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of a child: no inherited crash settings, ``crash_at`` if given."""
    out = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DURABLE_HARNESS_CRASH_AT", "DURABLE_HARNESS_CRASH_TRACE")
    }
    if crash_at:
        out["DURABLE_HARNESS_CRASH_AT"] = crash_at
    out.update(extra)
    return out


def dh_console(
    *args: str,
    crash_at: str | None = None,
    cwd: Path | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """Run ``durable-harness ARGS`` through the console script, in a fresh interpreter, and
    return the completed process."""
    return subprocess.run(
        [*DH, *args],
        env=env(crash_at),
        cwd=str(cwd) if cwd else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def dh(
    *args: str,
    crash_at: str | None = None,
    cwd: Path | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """Run ``durable-harness ARGS`` (the CLI's ``main(argv)``, the console script's code) in a
    child process forked from the crash matrix's warm fork server
    (``durable_harness/crashtest/forkserver.py``), the CLI already imported there: a process
    of its own, with exactly :func:`env` and stdin from ``/dev/null``, that a crash point
    SIGKILLs, holding its own lease and store handles; only the interpreter's start and the
    CLI's imports (about 0.7 s of CPU per child) are not paid again (issue 22). stdout and
    stderr come back apart (a fresh interpreter where the server cannot run)."""
    return forkserver.run_cli(
        list(args), env=env(crash_at), cwd=str(cwd) if cwd else os.getcwd(), timeout=timeout
    )


class Started:
    """A ``durable-harness`` child left running by :func:`popen`, used as the
    :class:`subprocess.Popen` it replaces: ``pid``, ``returncode``, :meth:`poll` and
    :meth:`communicate` (its stdout and stderr, as text, from the files it wrote)."""

    def __init__(self, child: forkserver.Spawned, folder: Path) -> None:
        self._child = child
        self._folder = folder
        self.pid = child.pid

    @property
    def returncode(self) -> int | None:
        return self._child.returncode

    def poll(self) -> int | None:
        return self._child.poll()

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for the end (at most ``timeout`` seconds, else ``subprocess.TimeoutExpired``);
        what it wrote on stdout and on stderr."""
        self._child.wait(timeout)
        out, err = ((self._folder / n).read_text(errors="replace") for n in ("out", "err"))
        shutil.rmtree(self._folder, ignore_errors=True)
        return out, err


def popen(*args: str, crash_at: str | None = None) -> subprocess.Popen[str] | Started:
    """Start ``durable-harness ARGS`` without waiting: forked from the warm fork server (a
    process of its own, its own pid and lease, without a fresh interpreter's imports), or,
    where the server cannot run, a fresh interpreter."""
    if not forkserver.available():
        return subprocess.Popen(
            [*DH, *args],
            env=env(crash_at),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    folder = Path(tempfile.mkdtemp(prefix="dh-popen-"))
    child = forkserver.shared().spawn(
        list(args),
        env=env(crash_at),
        cwd=os.getcwd(),
        stdout=str(folder / "out"),
        stderr=str(folder / "err"),
        timeout=600,
    )
    return Started(child, folder)


def write_script(path: Path, turns: list[dict[str, Any]], **extra: Any) -> Path:
    """Write a scripted-provider file (``extra``: other top-level fields, e.g.
    ``context_window``) and return its absolute path."""
    path.write_text(json.dumps({"turns": turns, **extra}))
    return path.resolve()


def session_id(proc: subprocess.CompletedProcess[str]) -> str:
    """The session id ``durable-harness run`` prints on stderr (``session <id>``)."""
    m = re.search(r"^session (\S+)$", proc.stderr, re.M)
    assert m, f"no session id in stderr: {proc.stderr!r}"
    return m.group(1)


def plan_json(sid: str, spec: str, *extra: str) -> dict[str, Any]:
    """``durable-harness recover SID --json``, parsed: run in this process through the CLI's
    ``main(argv)`` (the same code as the console script). Reading a plan changes nothing and
    takes no lease, so it needs no process of its own; the processes that crash, resume or
    hold a lease stay real children (:func:`dh`). An in-process read saves a fresh
    interpreter per plan (about 0.4 s of CPU; issue 22, design/architecture.md "Suite time")."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(["recover", sid, "--json", "--store", spec, *extra])
    assert code == 0, err.getvalue()
    return dict(json.loads(out.getvalue()))


def main_lane(plan: dict[str, Any]) -> dict[str, Any]:
    """The ``main`` lane of a plan's JSON."""
    (lane,) = [lp for lp in plan["lanes"] if lp["lane"] == "main"]
    return dict(lane)


def effects(work: Path, name: str = "effects.log") -> Counter[str]:
    """Tag counts in ``work/effects.log``."""
    log = work / name
    if not log.exists():
        return Counter()
    return Counter(line.strip() for line in log.read_text().splitlines() if line.strip())


def read_session(spec: str, sid: str) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    """Open the session read-only: ``(records, {entry id: entry}, location)``."""
    with Session(open_store(spec).open_session(sid, write=False)) as s:
        records = s.store.records()
        entries = {str(e["id"]): e for e in s.store.iter_entries()}
        return records, entries, s.store.location


def plan_in_process(spec: str, sid: str) -> dict[str, Any]:
    """The recovery plan computed in this process over a read-only open, as JSON."""
    with Session(open_store(spec).open_session(sid, write=False)) as s:
        return recover(s.store, builtin_tools()).to_json()


def context_json(sid: str, spec: str) -> list[dict[str, Any]]:
    """``durable-harness context SID --json``, parsed: a read, run in this process through the
    CLI's ``main(argv)`` as :func:`plan_json` is."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(["context", sid, "--json", "--store", spec])
    assert code == 0, err.getvalue()
    return list(json.loads(out.getvalue()))


def results_per_call(messages: list[dict[str, Any]]) -> dict[str, int]:
    """``{tool call id: number of toolResult messages for it}`` over a context's messages."""
    calls = [
        str(b["id"])
        for m in messages
        if m.get("role") == "assistant"
        for b in m.get("content") or []
        if isinstance(b, dict) and b.get("type") == "toolCall"
    ]
    counts = Counter(str(m.get("toolCallId")) for m in messages if m.get("role") == "toolResult")
    return {c: counts[c] for c in calls}
