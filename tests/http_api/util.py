"""Helpers of the HTTP API tests: a real ``durable-harness serve --port 0`` child, polling
with a deadline, on-disk snapshots, operation-log reads."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from durable_harness.crashtest import forkserver

T = TypeVar("T")

START_TIMEOUT = 30.0  # seconds for a server to print its URL on a loaded machine
SERVER_TIMEOUT = 1800.0  # seconds after which the fork server kills a server it forked
# Imported once in the fork server, not by each server it forks (they start no thread).
SERVER_MODULES = ("durable_harness.http.app", "durable_harness.cli.host_commands", "uvicorn")


def _forked(env: dict[str, str]) -> bool:
    """Whether a server with ``env`` is forked from the warm fork server
    (``crashtest/forkserver.py``: its own pid, signals and files, without a fresh interpreter's
    imports) rather than started fresh: where the platform has one, and not when OpenTelemetry
    exports are configured (its SDK flushes at interpreter exit, which a forked child, leaving
    by ``os._exit``, skips)."""
    return forkserver.available() and not any(k.startswith("OTEL_") for k in env)


_URL = re.compile(r"serving on (http://\S+)")


def poll(check: Callable[[], T | None], what: str, timeout: float = 30.0) -> T:
    """Call ``check`` until it returns something truthy; fail naming ``what`` after
    ``timeout`` seconds (never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class Server:
    """A ``durable-harness serve`` child process on a free loopback port.

    Attributes:
        url: the URL it printed once it answers. proc: the child.
    """

    def __init__(
        self,
        store: str,
        *args: str,
        env: dict[str, str] | None = None,
        home: Path,
        token: str | None = None,
    ) -> None:
        self.store = store
        self.token = token
        child_env = {
            k: v
            for k, v in os.environ.items()
            if not k.endswith("_API_KEY") and not k.startswith("DURABLE_HARNESS")
        }
        child_env["DURABLE_HARNESS_HOME"] = str(home)
        child_env.update(env or {})
        argv = ["serve", "--port", "0", "--store", store, *args]
        if token is not None:
            argv += ["--token", token]
        home.mkdir(parents=True, exist_ok=True)
        self.log = home / f"server-{os.getpid()}-{id(self)}.log"
        self.out = home / f"server-{os.getpid()}-{id(self)}.out"
        self.proc: subprocess.Popen[bytes] | forkserver.Spawned
        if _forked(child_env):
            self.proc = forkserver.shared().spawn(
                argv, env=child_env, cwd=os.getcwd(), stdout=str(self.out),
                stderr=str(self.log), timeout=SERVER_TIMEOUT, preload=SERVER_MODULES,
            )  # fmt: skip
        else:
            with self.out.open("wb") as out, self.log.open("wb") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "durable_harness", *argv],
                    env=child_env,
                    stdout=out,
                    stderr=log,
                )
        self.url = self._read_url()

    def _read_url(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT
        text = ""
        while time.monotonic() < deadline:
            text = self.out.read_text(errors="replace") if self.out.exists() else ""
            m = _URL.search(text)
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        self.proc.kill()
        self.proc.wait(timeout=10)
        raise AssertionError(f"server did not start: {text!r} {self.stderr()}")

    def client(self, token: str | None = None) -> httpx.Client:
        """An httpx client of this server (with its bearer token unless one is given)."""
        token = token if token is not None else self.token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30.0)

    def stop(self) -> None:
        """SIGTERM and wait (SIGKILL after 15 s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def stderr(self) -> str:
        """What the child wrote to stderr so far."""
        return self.log.read_text(errors="replace")


def snapshot(root: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``root`` (what "nothing changed on
    disk" compares)."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def wait_state(
    client: httpx.Client, sid: str, *states: str, timeout: float = 30.0
) -> dict[str, Any]:
    """Poll ``GET /sessions/{sid}/agent/status`` until its state is one of ``states``."""

    def check() -> dict[str, Any] | None:
        body: dict[str, Any] = client.get(f"/sessions/{sid}/agent/status").json()
        return body if body.get("state") in states else None

    return poll(check, f"session {sid} to be {'/'.join(states)}", timeout)


def run_records(client: httpx.Client, sid: str, rtype: str) -> list[dict[str, Any]]:
    """The session's operation-log records of type ``rtype`` (all pages)."""
    out: list[dict[str, Any]] = []
    since = 0
    while True:
        page = client.get(f"/sessions/{sid}/agent/log", params={"since_seq": since}).json()
        out += [r for r in page["records"] if r["type"] == rtype]
        if page["next_since_seq"] is None:
            return out
        since = page["next_since_seq"]


def make_sessions(server: Server, n: int, tmp_path: Path, provider: str) -> dict[str, Path]:
    """Create ``n`` sessions on ``server``, each in its own folder ``tmp_path/sI``, and prompt
    each; returns ``{session id: folder}``."""
    dirs: dict[str, Path] = {}
    with server.client() as c:
        for i in range(n):
            cwd = tmp_path / f"s{i}"
            cwd.mkdir()
            resp = c.post("/sessions", json={"cwd": str(cwd), "provider": provider})
            assert resp.status_code == 201, resp.text
            dirs[resp.json()["id"]] = cwd
        for sid in dirs:
            assert c.post(f"/sessions/{sid}/agent/send", json={"message": "go"}).status_code == 202
    return dirs


def open_raw_stream(url: str, path: str, rcvbuf: int | None = None) -> tuple[socket.socket, bytes]:
    """Open a raw event-stream request (``rcvbuf``: the socket's receive buffer, set before
    it connects) and read no more than its status line; the socket and that line."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(30)
    sock.connect((host, int(port)))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    head = b""
    while b"\r\n" not in head:
        chunk = sock.recv(64)
        assert chunk, "the server closed the connection"
        head += chunk
    return sock, head.split(b"\r\n", 1)[0]
