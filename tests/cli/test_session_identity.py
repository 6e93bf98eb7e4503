"""A session has one identity: ``sessions --cwd`` and ``run --continue`` find the sessions of a
working directory by the cwd recorded in each session, as real paths, on JSONL and SQLite.

Real directories and symlinks under ``tmp_path``; the scripted provider runs one ``bash`` call
per run that appends to ``where.log`` in the directory it runs in, so where that file appears
shows where the tool ran.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from durable_harness.crashtest import forkserver
from durable_harness.storage import Store, open_store
from durable_harness.storage.jsonl import cwd_dir_name

from .conftest import REPO, Result

Cli = Callable[..., Result]

BASH_SCRIPT: dict[str, Any] = {
    "turns": [
        {
            "text": "Noting where I am.",
            "tool_calls": [{"name": "bash", "arguments": {"command": "pwd -P >> where.log"}}],
        },
        {"text": "Done."},
    ]
}


@pytest.fixture(params=["jsonl", "sqlite"])
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store of each backend under ``tmp_path``."""
    if request.param == "jsonl":
        return f"jsonl:{tmp_path / 'home'}"
    return f"sqlite:{tmp_path / 'store.db'}"


@pytest.fixture
def bash_script(tmp_path: Path) -> Path:
    """The scripted provider file (:data:`BASH_SCRIPT`)."""
    path = tmp_path / "bash-script.json"
    path.write_text(json.dumps(BASH_SCRIPT))
    return path


def _run(cli: Cli, spec: str, script: Path, prompt: str, *extra: str) -> Result:
    res = cli("run", prompt, "--provider", f"scripted:{script}", "--store", spec, *extra)
    assert res.code == 0, res.err
    return res


def _sessions(cli: Cli, spec: str, *extra: str) -> list[dict[str, Any]]:
    res = cli("sessions", "--json", "--store", spec, *extra)
    assert res.code == 0, res.err
    rows = res.json()
    assert isinstance(rows, list)
    return rows


def _prompts(store: Store, sid: str) -> list[str]:
    with store.open_session(sid, write=False) as s:
        return [
            e["message"]["content"][0]["text"]
            for e in s.iter_entries()
            if e["type"] == "message" and e["message"]["role"] == "user"
        ]


def _state(store: Store, sid: str) -> tuple[int, int]:
    """(entry count, last seq) of a session: any write to it changes the second."""
    with store.open_session(sid, write=False) as s:
        return s.entry_count(), s.last_seq()


def _ran_in(where: Path) -> list[str]:
    log = where / "where.log"
    return log.read_text().splitlines() if log.exists() else []


def test_continue_in_x_dash_y_never_touches_the_session_of_x_slash_y(
    cli: Cli, store_spec: str, bash_script: Path, tmp_path: Path
) -> None:
    xy, x_y = tmp_path / "r" / "x" / "y", tmp_path / "r" / "x-y"
    xy.mkdir(parents=True)
    x_y.mkdir()
    assert cwd_dir_name(str(xy)) == cwd_dir_name(str(x_y))
    store = open_store(store_spec)
    _run(cli, store_spec, bash_script, "first in x/y", "--cwd", str(xy))
    [xy_row] = _sessions(cli, store_spec)
    before = _state(store, xy_row["id"])
    jsonl = store_spec.startswith("jsonl:")
    digest = hashlib.sha256(Path(xy_row["path"]).read_bytes()).hexdigest() if jsonl else ""

    res = _run(cli, store_spec, bash_script, "first in x-y", "--cwd", str(x_y), "--continue")
    assert "no session of" in res.err and "starting a new one" in res.err

    assert _state(store, xy_row["id"]) == before, "continue in x-y wrote to the x/y session"
    if jsonl:
        assert hashlib.sha256(Path(xy_row["path"]).read_bytes()).hexdigest() == digest
    assert _ran_in(xy) == [str(xy)], "bash of the x-y run ran in x/y"
    assert _ran_in(x_y) == [str(x_y)]
    [x_y_row] = _sessions(cli, store_spec, "--cwd", str(x_y))
    assert x_y_row["id"] != xy_row["id"] and x_y_row["cwd"] == str(x_y)
    assert [r["id"] for r in _sessions(cli, store_spec, "--cwd", str(xy))] == [xy_row["id"]]

    # each directory continues its own session
    _run(cli, store_spec, bash_script, "again in x/y", "--cwd", str(xy), "--continue")
    _run(cli, store_spec, bash_script, "again in x-y", "--cwd", str(x_y), "--continue")
    assert _prompts(store, xy_row["id"]) == ["first in x/y", "again in x/y"]
    assert _prompts(store, x_y_row["id"]) == ["first in x-y", "again in x-y"]
    assert _ran_in(xy) == [str(xy)] * 2 and _ran_in(x_y) == [str(x_y)] * 2
    assert len(_sessions(cli, store_spec)) == 2


@pytest.mark.parametrize("started_via", ["link", "real"])
def test_a_symlinked_project_is_listed_and_continued(
    cli: Cli, store_spec: str, bash_script: Path, tmp_path: Path, started_via: str
) -> None:
    real = tmp_path / "disk" / "proj"
    real.mkdir(parents=True)
    link = tmp_path / "proj-link"
    link.symlink_to(real, target_is_directory=True)
    start, other = (link, real) if started_via == "link" else (real, link)
    _run(cli, store_spec, bash_script, "one", "--cwd", str(start))
    [row] = _sessions(cli, store_spec)
    assert row["cwd"] == str(start)  # recorded as the user spelled it

    assert [r["id"] for r in _sessions(cli, store_spec, "--cwd", str(other))] == [row["id"]]
    _run(cli, store_spec, bash_script, "two", "--cwd", str(other), "--continue")
    assert [r["id"] for r in _sessions(cli, store_spec)] == [row["id"]]
    assert _prompts(open_store(store_spec), row["id"]) == ["one", "two"]
    assert _ran_in(real) == [str(real)] * 2


def _child(
    args: list[str], cwd: Path, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """``durable-harness ARGS`` in a child whose working directory is ``cwd`` (no ``--cwd``: the
    child's own ``os.getcwd()``, which names the physical directory): forked from the warm fork
    server (``forkserver.run_cli``), or, with a ``prefix`` (``setpriv`` dropping capabilities,
    which must exec), ``python -m durable_harness`` in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if not prefix:
        return forkserver.run_cli(args, env=env, cwd=str(cwd), timeout=60)
    return subprocess.run(
        [*prefix, sys.executable, "-m", "durable_harness", *args],
        cwd=str(cwd),
        env=env,
        text=True,
        capture_output=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_a_project_moved_behind_a_symlink_is_continued(
    cli: Cli, store_spec: str, bash_script: Path, tmp_path: Path
) -> None:
    old = tmp_path / "home-dir" / "proj"
    old.mkdir(parents=True)
    _run(cli, store_spec, bash_script, "before the move", "--cwd", str(old))
    [row] = _sessions(cli, store_spec)
    new = tmp_path / "data" / "proj"
    new.parent.mkdir()
    old.rename(new)
    old.symlink_to(new, target_is_directory=True)

    listed = _child(["sessions", "--json", "--store", store_spec, "--cwd", "."], new)
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout)] == [row["id"]]
    run = ["run", "after the move", "--provider", f"scripted:{bash_script}", "--continue"]
    res = _child([*run, "--store", store_spec, "--quiet"], new)
    assert res.returncode == 0, res.stderr
    assert [r["id"] for r in _sessions(cli, store_spec)] == [row["id"]]
    assert _prompts(open_store(store_spec), row["id"]) == ["before the move", "after the move"]
    assert _ran_in(new) == [str(old), str(new)]  # pwd -P before and after the move


def test_continue_in_a_fresh_directory_starts_a_session_there(
    cli: Cli, store_spec: str, bash_script: Path, tmp_path: Path
) -> None:
    parent = tmp_path / "work"
    fresh = parent / "fresh"
    fresh.mkdir(parents=True)
    sibling = tmp_path / "sibling"
    sibling.mkdir()
    _run(cli, store_spec, bash_script, "parent", "--cwd", str(parent))
    _run(cli, store_spec, bash_script, "sibling", "--cwd", str(sibling))
    store = open_store(store_spec)
    before = {r["id"]: _state(store, r["id"]) for r in _sessions(cli, store_spec)}

    _run(cli, store_spec, bash_script, "fresh", "--cwd", str(fresh), "--continue")
    rows = _sessions(cli, store_spec)
    assert len(rows) == 3
    [new] = [r for r in rows if r["id"] not in before]
    assert new["cwd"] == str(fresh)
    assert _prompts(store, new["id"]) == ["fresh"]
    assert {sid: _state(store, sid) for sid in before} == before
    assert _ran_in(fresh) == [str(fresh)]
    assert _ran_in(parent) == [str(parent)] and _ran_in(sibling) == [str(sibling)]


@pytest.mark.slow
def test_an_unreadable_session_file_is_listed_and_blocks_a_blind_continue(
    cli: Cli, bash_script: Path, tmp_path: Path, unprivileged: list[str]
) -> None:
    spec = f"jsonl:{tmp_path / 'home'}"
    proj = tmp_path / "proj"
    proj.mkdir()
    _run(cli, spec, bash_script, "older", "--cwd", str(proj))
    _run(cli, spec, bash_script, "newer", "--cwd", str(proj))
    rows = _sessions(cli, spec)
    newest = Path(rows[0]["path"])
    newest.chmod(0)
    prefix = tuple(unprivileged)

    for extra in ([], ["--cwd", str(proj)]):
        listed = _child(["sessions", "--json", "--store", spec, *extra], tmp_path, prefix)
        assert listed.returncode == 1, listed.stderr
        by_id = {r["id"]: r for r in json.loads(listed.stdout)}
        assert set(by_id) == {r["id"] for r in rows}
        bad = by_id[rows[0]["id"]]
        assert bad["path"] == str(newest)
        assert bad["error"]["code"] == "session_unreadable"
        assert bad["error"]["errno"] == "EACCES"
        assert by_id[rows[1]["id"]]["error"] is None

    text = _child(["sessions", "--store", spec], tmp_path, prefix)
    assert text.returncode == 1
    # the state column says UNREADABLE, the calls waiting and the cwd are unknown (-), then why
    assert re.search(rf"UNREADABLE +- +- +{re.escape(str(newest))}: cannot be read", text.stdout)
    assert "1 session file(s) cannot be read" in text.stderr

    # the newest session of proj cannot be read: continuing an older one, or a new one, would
    # hide it; the run is refused with the path, and nothing is written
    res = _child(
        ["run", "hi", "--provider", f"scripted:{bash_script}", "--store", spec, "--continue"],
        proj,
        prefix,
    )
    assert res.returncode == 2
    assert "error[session_unreadable]" in res.stderr and str(newest) in res.stderr
    newest.chmod(0o600)
    assert len(_sessions(cli, spec)) == 2
    assert _ran_in(proj) == [str(proj)] * 2


@pytest.mark.slow
def test_an_unreadable_sqlite_store_names_its_path(
    cli: Cli, bash_script: Path, tmp_path: Path, unprivileged: list[str]
) -> None:
    db = tmp_path / "store.db"
    _run(cli, f"sqlite:{db}", bash_script, "one", "--cwd", str(tmp_path))
    db.chmod(0)
    res = _child(["sessions", "--json", "--store", f"sqlite:{db}"], tmp_path, tuple(unprivileged))
    assert res.returncode == 2
    error = json.loads(res.stdout)["error"]
    assert error["code"] == "session_unreadable"
    assert error["path"] == str(db) and error["errno"] == "EACCES"
