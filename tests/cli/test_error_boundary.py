"""Every OS and database error is named (issue 10): a full disk, a read-only or unreadable store,
a locked SQLite database, an I/O error reach the user as ``error[CODE]: PATH: CAUSE`` with exit
status 2, never as "unhandled errors in a TaskGroup"; read-only commands create nothing; an
unknown lane and a missing API key are refused before anything is written.

CI runs as root: the permission tests run their child with ``CAP_DAC_OVERRIDE`` and
``CAP_DAC_READ_SEARCH`` dropped (``setpriv``), after checking that the drop works. A full disk is
a small tmpfs where mounting works, and always also a fault injected at the store's write call.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_harness.cli.main import report_failure
from durable_harness.errors import (
    CorruptSession,
    DatabaseLocked,
    FormatError,
    SessionUnreadable,
    StorageIOError,
    StoreNotFound,
    UnknownLane,
    root_cause,
)
from durable_harness.storage import jsonl as jsonl_module
from durable_harness.storage import open_store
from durable_harness.storage.oserrors import BUSY_TIMEOUT_ENV, translate
from durable_harness.storage.sqlite import connection as sqlite_connection

from .conftest import REPO, Result

Cli = Callable[..., Result]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs without ``--cwd`` use the test's folder: their tools never write into the repo."""
    monkeypatch.chdir(tmp_path)


# One turn whose bash call prints ~300 KB: its result alone overflows a 128 KiB tmpfs.
BIG_OUTPUT = {
    "turns": [
        {
            "text": "Printing.",
            "tool_calls": [
                {"name": "bash", "arguments": {"command": "head -c 300000 /dev/zero | tr '\\0' a"}}
            ],
        },
        {"text": "Done."},
    ]
}
NO_TRACE = ("TaskGroup", "Traceback", "error[internal]", "ExceptionGroup")


def write_script(tmp_path: Path, data: dict[str, Any], name: str = "script.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def assert_named(res: Result, code: str, *needles: str) -> None:
    """Exit 2, one ``error[code]:`` line naming every needle, and no traceback or group."""
    assert res.code == 2, (res.code, res.out, res.err)
    assert f"error[{code}]: " in res.err, res.err
    for needle in needles:
        assert needle in res.err, (needle, res.err)
    for bad in NO_TRACE:
        assert bad not in res.err, res.err


# -- full disk ---------------------------------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 128 KiB tmpfs, where this sandbox lets us mount one (root in a user namespace or VM)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount(8): the full disk is covered by the injected fault tests")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=128k,mode=0700", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()}): see the injected tests")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
def test_full_disk_on_a_real_tmpfs_is_a_storage_error_naming_the_path(
    cli: Cli, tmp_path: Path, small_tmpfs: Path, backend: str
) -> None:
    script = write_script(tmp_path, BIG_OUTPUT)
    spec = f"jsonl:{small_tmpfs}/store" if backend == "jsonl" else f"sqlite:{small_tmpfs}/a.db"
    res = cli("run", "print", "--provider", f"scripted:{script}", "--store", spec, "--quiet")
    assert_named(res, "storage", str(small_tmpfs), "No space left on device")


@pytest.fixture
def enospc_on_store_writes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Make every ``os.write``/``os.pwrite`` to a file under ``tmp_path/store`` fail with ENOSPC
    (the JSONL backend's write calls), once the session file exists: a full disk, injected."""
    root = tmp_path / "store"
    real_write, real_pwrite = os.write, os.pwrite

    def on_store(fd: int) -> bool:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return False
        return target.startswith(str(root)) and target.endswith(".jsonl")

    def write(fd: int, data: Any) -> int:
        if on_store(fd) and os.fstat(fd).st_size > 0:  # the header line went in: now full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if on_store(fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(jsonl_module.os, "write", write)
    monkeypatch.setattr(jsonl_module.os, "pwrite", pwrite)
    return root


def test_full_disk_injected_at_the_jsonl_write_names_the_session_file(
    cli: Cli, tmp_path: Path, script: Path, enospc_on_store_writes: Path
) -> None:
    res = cli("run", "hi", "--provider", f"scripted:{script}", "--store", "jsonl:" + str(
        enospc_on_store_writes
    ), "--quiet")  # fmt: skip
    assert_named(res, "storage", str(enospc_on_store_writes), ".jsonl: No space left on device")


def test_full_disk_injected_in_sqlite_is_a_storage_error_naming_the_database(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite's own "database or disk is full" (SQLITE_FULL), produced by capping the number of
    pages a session's connection may use: the fault SQLite reports for a full disk."""
    db = tmp_path / "a.db"
    real_connect = sqlite_connection.connect

    def capped(path: str, synchronous: str = "FULL") -> sqlite3.Connection:
        conn = real_connect(path, synchronous)
        if synchronous != "FULL":  # a session's connection (the store's own use FULL)
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count={pages}")
        return conn

    monkeypatch.setattr(sqlite_connection, "connect", capped)
    script = write_script(tmp_path, BIG_OUTPUT)
    res = cli("run", "x", "--provider", f"scripted:{script}", "--store", f"sqlite:{db}", "--quiet")
    assert_named(res, "storage", f"{db}: No space left on device")


def test_io_error_at_fsync_is_named(
    cli: Cli, tmp_path: Path, script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(root)):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)

    monkeypatch.setattr(jsonl_module.os, "fdatasync", fdatasync)
    res = cli("run", "hi", "--provider", f"scripted:{script}", "--store", f"jsonl:{root}")
    assert_named(res, "storage", str(root), "Input/output error")


# -- read-only and unreadable stores (CAP_DAC_OVERRIDE dropped) ---------------------------------

SETPRIV = [
    "setpriv",
    "--inh-caps=-dac_override,-dac_read_search",
    "--bounding-set=-dac_override,-dac_read_search",
]


def unprivileged(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` so that file modes apply to it: as root, without the two capabilities that
    bypass them."""
    prefix = SETPRIV if os.geteuid() == 0 else []
    return subprocess.run(prefix + cmd, text=True, capture_output=True, check=False, **kw)


@pytest.fixture
def modes_apply(tmp_path: Path) -> None:
    """Skip unless a child can be made subject to file modes (and prove it is)."""
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv(1): cannot drop CAP_DAC_OVERRIDE")
    probe = tmp_path / "probe"
    probe.write_text("secret")
    probe.chmod(0)
    assert unprivileged(["cat", str(probe)]).returncode != 0, "file modes do not apply"


def dh(*args: str) -> list[str]:
    return [sys.executable, "-m", "durable_harness", *args]


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.mark.slow
@pytest.mark.usefixtures("modes_apply")
def test_read_only_jsonl_store_names_the_path_and_permission(
    cli: Cli, tmp_path: Path, script: Path, project: Path
) -> None:
    root = tmp_path / "ro-store"
    assert cli("run", "hi", "--provider", f"scripted:{script}", "--cwd", str(project),
               "--store", f"jsonl:{root}", "--quiet").code == 0  # fmt: skip
    sid = cli("sessions", "--json", "--store", f"jsonl:{root}").json()[0]["id"]
    for path in [*sorted(root.rglob("*"), reverse=True), root]:
        path.chmod(0o500 if path.is_dir() else 0o400)
    # a new session: its file cannot be created
    new = unprivileged(
        dh("run", "hi", "--provider", f"scripted:{script}", "--store", f"jsonl:{root}"),
        env=child_env(),
    )
    res = Result(new.returncode, new.stdout, new.stderr)
    assert_named(res, "storage", str(root), "Permission denied")
    # continuing the session: its lock file cannot be created
    more = unprivileged(
        dh("run", "more", "--session", sid, "--provider", f"scripted:{script}",
           "--store", f"jsonl:{root}"),
        env=child_env(),
    )  # fmt: skip
    assert_named(Result(more.returncode, more.stdout, more.stderr), "storage", "Permission denied")
    # reading still works
    shown = unprivileged(dh("show", sid, "--store", f"jsonl:{root}"), env=child_env())
    assert shown.returncode == 0, shown.stderr


@pytest.mark.slow
@pytest.mark.usefixtures("modes_apply")
def test_unreadable_session_file_names_the_path(
    cli: Cli, tmp_path: Path, script: Path, project: Path
) -> None:
    root = tmp_path / "store"
    cli("run", "hi", "--provider", f"scripted:{script}", "--cwd", str(project),
        "--store", f"jsonl:{root}", "--quiet")  # fmt: skip
    (path,) = root.rglob("*.jsonl")
    path.chmod(0)
    sid = path.name.rsplit("_", 1)[1].removesuffix(".jsonl")
    for ref in (str(path), sid):  # by path, and by id (the file stays listed)
        proc = unprivileged(dh("show", ref, "--store", f"jsonl:{root}"), env=child_env())
        res = Result(proc.returncode, proc.stdout, proc.stderr)
        assert_named(res, "session_unreadable", f"{path}: cannot be read: Permission denied")


@pytest.mark.slow
@pytest.mark.usefixtures("modes_apply")
@pytest.mark.parametrize("mode", [0o444, 0o000])
def test_read_only_or_unreadable_sqlite_store_is_named(
    cli: Cli, tmp_path: Path, script: Path, mode: int
) -> None:
    db = tmp_path / "db" / "a.db"
    assert cli("run", "hi", "--provider", f"scripted:{script}", "--store", f"sqlite:{db}",
               "--quiet").code == 0  # fmt: skip
    for extra in db.parent.iterdir():
        extra.chmod(mode if extra.is_file() else 0o500)
    db.parent.chmod(0o500)
    try:
        proc = unprivileged(
            dh("run", "again", "--provider", f"scripted:{script}", "--store", f"sqlite:{db}"),
            env=child_env(),
        )
    finally:
        db.parent.chmod(0o700)
    cause = "Read-only" if mode else "Permission denied"
    code = "storage" if mode else "session_unreadable"  # an unreadable file is named as such
    assert_named(Result(proc.returncode, proc.stdout, proc.stderr), code, str(db), cause)


# -- a locked SQLite database ------------------------------------------------------------------

HOLD_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()
conn.execute("ROLLBACK")
"""


def test_locked_sqlite_database_is_named_and_bounded(
    cli: Cli, tmp_path: Path, script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "a.db"
    open_store(f"sqlite:{db}")  # the store exists, with its schema
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdin is not None
    try:
        assert holder.stdout.readline().strip() == "locked"
        monkeypatch.setenv(BUSY_TIMEOUT_ENV, "0.2")
        res = cli("run", "hi", "--provider", f"scripted:{script}", "--store", f"sqlite:{db}")
        assert_named(res, "database_locked", f"{db}: database is locked", "(waited 0.2 s)")
        assert cli("sessions", "--json", "--store", f"sqlite:{db}").json() == []  # none made
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    ok = cli("run", "hi", "--provider", f"scripted:{script}", "--store", f"sqlite:{db}")
    assert ok.code == 0, ok.err


def test_sqlite_busy_timeout_is_bounded_and_configurable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = sqlite_connection.connect(str(tmp_path / "a.db"))
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 10_000  # the default, 10 s
    conn.close()
    monkeypatch.setenv(BUSY_TIMEOUT_ENV, "1.5")
    conn = sqlite_connection.connect(str(tmp_path / "a.db"))
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 1_500
    conn.close()


# -- task groups and the one translation -------------------------------------------------------


def test_task_group_wrappers_are_reduced_to_the_root_cause(
    capsys: pytest.CaptureFixture[str],
) -> None:
    disk_full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/data/s.jsonl")
    group = BaseExceptionGroup(
        "unhandled errors in a TaskGroup",
        [ExceptionGroup("inner", [ValueError("later"), disk_full])],
    )
    assert root_cause(group) is disk_full  # an OS error outranks an arbitrary one
    typed = StorageIOError("x")
    assert root_cause(ExceptionGroup("g", [ValueError("v"), typed])) is typed  # ours first
    assert report_failure(group) == 2
    err = capsys.readouterr().err
    assert err == "error[storage]: /data/s.jsonl: No space left on device\n"


def test_translate_names_the_cause_of_os_and_sqlite_errors() -> None:
    full = translate(OSError(errno.ENOSPC, "No space left on device"), "/s/x.jsonl")
    assert isinstance(full, StorageIOError) and full.code == "storage"
    assert full.message == "/s/x.jsonl: No space left on device"
    assert full.details["errno"] == "ENOSPC"
    locked = translate(sqlite3.OperationalError("database is locked"), "/d/a.db")
    assert isinstance(locked, DatabaseLocked)
    assert locked.message.startswith("/d/a.db: database is locked")
    other = ValueError("not an OS error")
    assert translate(other) is other


# -- bad values in a scripted turn -------------------------------------------------------------


@pytest.mark.parametrize(
    ("turn", "field"),
    [
        ({"text": "x", "usage": {"input": "lots"}}, "usage.input"),
        ({"text": "x", "usage": {"cost": {"total": "free"}}}, "usage.cost.total"),
        ({"text": "x", "chunks": "two"}, "chunks"),
        ({"text": "x", "delay": -1}, "delay"),
        ({"text": "x", "tool_calls": [{"name": 3}]}, "tool_calls[0].name"),
    ],
)
def test_bad_value_in_a_scripted_turn_is_a_format_error_naming_the_field(
    cli: Cli, tmp_path: Path, home: Path, turn: dict[str, Any], field: str
) -> None:
    script = write_script(tmp_path, {"turns": [{"text": "ok"}, turn]})
    res = cli("run", "hi", "--provider", f"scripted:{script}")
    assert_named(res, "format_error", str(script), f"turn 2: {field}:")
    assert not home.exists(), "a session was created for a script that cannot run"


def test_scripted_provider_library_raises_format_error() -> None:
    from durable_harness.providers.scripted import ScriptedProvider

    with pytest.raises(FormatError, match=r"turn 1: usage\.output"):
        ScriptedProvider([{"usage": {"output": 1.5}}])


# -- read-only commands create nothing -----------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["sessions"],
        ["show", "01a2"],
        ["context", "01a2"],
        ["log", "01a2"],
        ["cost", "01a2"],
        ["recover", "01a2"],
        ["fork", "01a2"],
    ],
)
@pytest.mark.parametrize("scheme", ["sqlite", "jsonl"])
def test_read_only_command_on_a_missing_store_creates_nothing(
    cli: Cli, tmp_path: Path, argv: list[str], scheme: str
) -> None:
    folder = tmp_path / "nothing-here"
    target = folder / ("a.db" if scheme == "sqlite" else "store")
    res = cli(*argv, "--store", f"{scheme}:{target}")
    assert_named(res, "store_not_found", str(target), "no such store")
    assert not folder.exists()


def test_fsck_on_a_missing_sqlite_path_creates_nothing(cli: Cli, tmp_path: Path) -> None:
    folder = tmp_path / "nothing-here"
    res = cli("fsck", f"sqlite:{folder / 'a.db'}")
    assert res.code == 2 and "error[" in res.err
    assert not folder.exists()


def test_read_only_command_leaves_a_foreign_sqlite_file_untouched(cli: Cli, tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE mine (x)")
    conn.commit()
    conn.close()
    before = (db.read_bytes(), sorted(p.name for p in tmp_path.iterdir()))
    res = cli("sessions", "--store", f"sqlite:{db}")
    assert_named(res, "store_not_found", str(db), "not a durable-harness store")
    assert (db.read_bytes(), sorted(p.name for p in tmp_path.iterdir())) == before


def test_missing_default_store_reads_as_empty_and_is_not_created(cli: Cli, home: Path) -> None:
    res = cli("sessions")
    assert res.code == 0 and res.out == "" and "no sessions" in res.err
    assert not home.exists()


# -- unknown lanes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv", [["context", "--lane", "nope"], ["log", "--lane", "nope"], ["fork", "--lane", "nope"]]
)
def test_unknown_lane_is_an_error_listing_the_lanes(
    cli: Cli, script: Path, project: Path, argv: list[str]
) -> None:
    assert cli("run", "hi", "--provider", f"scripted:{script}", "--cwd", str(project)).code == 0
    sid = cli("sessions", "--json").json()[0]["id"]
    res = cli(argv[0], sid, *argv[1:])
    assert_named(res, "unknown_lane", "'nope'", "its lanes: main")
    as_json = cli(argv[0], sid, *argv[1:], "--json")
    assert as_json.code == 2 and as_json.json()["error"]["lanes"] == ["main"]


def test_unknown_lane_on_resume_is_refused(cli: Cli, script: Path, project: Path) -> None:
    cli("run", "hi", "--provider", f"scripted:{script}", "--cwd", str(project))
    sid = cli("sessions", "--json").json()[0]["id"]
    res = cli("resume", sid, "--lane", "side")
    assert_named(res, "unknown_lane", "'side'", "main")
    assert UnknownLane.code == "unknown_lane"


# -- a missing API key ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "env"),
    [("openai:gpt-4o-mini", "OPENAI_API_KEY"), ("anthropic:claude-x", "ANTHROPIC_API_KEY")],
)
def test_network_provider_without_key_is_refused_before_a_session_exists(
    cli: Cli, home: Path, monkeypatch: pytest.MonkeyPatch, spec: str, env: str
) -> None:
    monkeypatch.delenv(env, raising=False)
    res = cli("run", "hi", "--provider", spec)
    assert_named(res, "missing_credential", env)
    assert res.err.count("\n") == 1, res.err  # one message
    assert not home.exists(), "a session was created before the key was checked"
    monkeypatch.setenv(env, "  ")  # blank is missing too
    assert cli("run", "hi", "--provider", spec).code == 2
    assert not home.exists()


@pytest.mark.slow
def test_resume_of_a_run_recorded_with_a_network_provider_needs_its_key_first(
    cli: Cli, sh: Callable[..., Result], project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run started with ``openai:`` (killed right after ``run_started``, before any request)
    resumes with its recorded provider: without the key, ``resume`` refuses before writing."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # never reached
    monkeypatch.setenv("DURABLE_HARNESS_CRASH_AT", "after_run_started")
    crashed = sh("run", "hi", "--provider", "openai:gpt-test", "--cwd", str(project))
    assert crashed.code == -9, crashed.err
    monkeypatch.delenv("DURABLE_HARNESS_CRASH_AT")
    monkeypatch.delenv("OPENAI_API_KEY")
    sid = cli("sessions", "--json").json()[0]["id"]
    before = cli("log", sid, "--json").json()
    res = cli("resume", sid)
    assert_named(res, "missing_credential", "OPENAI_API_KEY")
    assert cli("log", sid, "--json").json() == before  # nothing was written


# -- advice about CLI commands is the CLI's -------------------------------------------------------


def test_storage_errors_carry_no_cli_advice() -> None:
    """No error the storage layer raises names a CLI command or option: that advice is the
    CLI's (cli/advice.py), so a library or HTTP caller never reads about ``--session``."""
    import ast

    offenders = []
    for path in sorted((REPO / "durable_harness" / "storage").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                texts = [c.value for c in ast.walk(node.exc) if isinstance(c, ast.Constant)]
                offenders += [
                    f"{path.name}:{node.lineno}"
                    for t in texts
                    if isinstance(t, str) and ("--session" in t or "`durable-harness" in t)
                ]
    assert not offenders, offenders


@pytest.mark.parametrize(
    ("error", "printed"),
    [
        (
            CorruptSession(
                "newest, /s/x.jsonl, names no working directory", path="/s/x.jsonl", cwd="/w"
            ),
            "newest, /s/x.jsonl, names no working directory: pick a session with --session, "
            "or run `durable-harness fsck /s/x.jsonl`",
        ),
        (
            SessionUnreadable(
                "/s/x.jsonl: cannot be read: Permission denied (EACCES); check it",
                path="/s/x.jsonl",
            ),
            "/s/x.jsonl: cannot be read: Permission denied (EACCES); check it, or pick another "
            "session with --session",
        ),
        (
            StoreNotFound(
                "no such store: postgresql://a@h/db holds no durable-harness tables",
                path="postgresql://a@h/db",
            ),
            "no such store: postgresql://a@h/db holds no durable-harness tables; "
            "`durable-harness migrate --store postgresql://a@h/db` makes them",
        ),
        (StoreNotFound("no such store: /x/a.db", path="/x/a.db"), "no such store: /x/a.db"),
    ],
)
def test_the_cli_prints_its_advice_after_the_librarys_message(
    capsys: pytest.CaptureFixture[str], error: Any, printed: str
) -> None:
    assert report_failure(error) == 2
    assert capsys.readouterr().err == f"error[{error.code}]: {printed}\n"
    assert report_failure(error, json_output=True) == 2
    assert json.loads(capsys.readouterr().out)["error"]["message"] == printed
