"""A throw-away PostgreSQL cluster for tests and benchmarks: ``initdb`` into a temporary folder,
``pg_ctl start`` on a free loopback port, stopped and removed at the end. Under root the server
runs as ``postgres`` (else ``nobody``) through ``setpriv``; authentication is ``trust`` on
127.0.0.1 only (``design/postgres.md``)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any


def find_bindir() -> str | None:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``, or ``None``: ``pg_ctl``'s
    real folder when it is on ``PATH``, else the newest ``/usr/lib/postgresql/*/bin``."""
    candidates: list[str] = []
    found = shutil.which("pg_ctl")
    if found:
        candidates.append(os.path.dirname(os.path.realpath(found)))

    def version(path: str) -> tuple[int, ...]:
        part = Path(path).parent.name
        return tuple(int(x) for x in part.split(".") if x.isdigit())

    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    for folder in candidates:
        if all(os.access(os.path.join(folder, b), os.X_OK) for b in ("initdb", "pg_ctl")):
            return folder
    return None


def missing_postgres(reason: str) -> None:
    """In a pytest fixture: skip for want of PostgreSQL (``reason``), or fail under ``CI=true``
    (CI never skips a PostgreSQL test)."""
    import pytest

    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TemporaryCluster:
    """One throw-away cluster from the binaries in ``bindir`` (:func:`find_bindir`), with extra
    server ``settings`` (``-c name=value``); ``start()`` then ``spec``; ``cleanup()`` removes it."""

    def __init__(self, bindir: str, settings: dict[str, str] | None = None) -> None:
        self.bindir = bindir
        self.settings = settings or {}
        self.root = tempfile.mkdtemp(prefix="dh-pg-")
        self.data = os.path.join(self.root, "data")
        self.log = os.path.join(self.root, "server.log")
        self.port = 0
        self._prefix: list[str] = []
        self._env = {"PATH": "/usr/bin:/bin", "LANG": "C", "LC_ALL": "C", "TZ": "UTC"}
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                user = pwd.getpwnam("nobody")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            setpriv = shutil.which("setpriv") or "setpriv"
            ids = [f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}"]
            self._prefix = [setpriv, *ids, "--clear-groups", "--"]
            self._env["HOME"] = self.root

    @property
    def spec(self) -> str:
        """The URL of the cluster's ``postgres`` database."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self._prefix, *args],
            env=self._env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(self) -> TemporaryCluster:
        """``initdb`` (first time) and start the server on a free port; returns ``self``.

        Raises:
            RuntimeError: ``initdb`` or ``pg_ctl start`` failed (the message holds their
                output and the server log's tail).
        """
        if not os.path.isdir(self.data):
            flags = ["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync"]
            proc = self._run(os.path.join(self.bindir, "initdb"), "-D", self.data, *flags)
            if proc.returncode != 0:
                raise RuntimeError(f"initdb failed: {proc.stdout}{proc.stderr}")
        last = ""
        for _attempt in range(5):  # a port picked free may be taken before the server binds it
            port = self.port or free_port()
            opts = [
                f"-p {port}",
                "-c listen_addresses=127.0.0.1",
                "-c unix_socket_directories=''",
                "-c max_connections=200",
                *(f"-c {k}={v}" for k, v in self.settings.items()),
            ]
            args = ["-D", self.data, "-l", self.log, "-w", "-t", "60", "-o", " ".join(opts)]
            proc = self._run(os.path.join(self.bindir, "pg_ctl"), *args, "start")
            if proc.returncode == 0:
                self.port = port
                return self
            last = f"{proc.stdout}{proc.stderr}{self.log_tail()}"
            if "already in use" not in last:
                break
            self.port = 0
        raise RuntimeError(f"pg_ctl start failed: {last}")

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the server log."""
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m MODE`` (``fast``, or ``immediate``: a crash, WAL replay on start)."""
        self._run(os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-m", mode, "-w", "stop")

    def restart(self, mode: str = "fast") -> None:
        """Stop the server and start it again on the same port."""
        self.stop(mode)
        self.start()

    def execute(self, query: str, spec: str | None = None) -> list[tuple[Any, ...]]:
        """Run one statement on the cluster (autocommit); return its rows (``[]`` if none)."""
        import psycopg

        with psycopg.connect(spec or self.spec, autocommit=True) as conn:
            cur = conn.execute(query)
            return list(cur.fetchall()) if cur.description else []

    def cleanup(self) -> None:
        """Stop the server (waiting for it) and remove the folder."""
        deadline = time.monotonic() + 60
        if os.path.isfile(os.path.join(self.data, "postmaster.pid")):
            self.stop()
        while os.path.isfile(os.path.join(self.data, "postmaster.pid")):
            if time.monotonic() > deadline:
                self.stop("immediate")
                break
            time.sleep(0.05)
        shutil.rmtree(self.root, ignore_errors=True)
