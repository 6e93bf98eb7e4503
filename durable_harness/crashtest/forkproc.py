"""The fork server's own process (``python -m durable_harness.crashtest.forkproc SOCKET``): the
server side of :mod:`durable_harness.crashtest.forkserver` (its client side and the behaviour it
promises are documented there), and the wire format both speak.

Wire format: each message is a 4-byte big-endian length and a JSON object; one connection per
request. A request whose ``pass`` field names streams (``stdin``, ``stdout``, ``stderr``, in that
order) is followed by one byte carrying that many file descriptors as ``SCM_RIGHTS``
(:func:`socket.send_fds`): the child's ends of the pipes or files, dup'ed onto its 0, 1 and 2.
The server answers ``{"pid": N}`` once it has forked and ``{"returncode": N, "timed_out": B}``
when the child ends. It exits when its stdin (a pipe from the process that started it) closes,
killing the children still running.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

WARM_MODULES = (
    "durable_harness.crashtest.child",
    "durable_harness.crashtest.broken",
    "durable_harness.storage.jsonl",
    "durable_harness.storage.sqlite",
    "durable_harness.providers.scripted",
    "durable_harness.tools.builtin",
    "anyio._backends._asyncio",
    "asyncio.unix_events",
    "ssl",
)
"""What the server imports before serving; PostgreSQL's backend too when psycopg imports."""
_HEADER = struct.Struct(">I")


def send_message(sock: socket.socket, obj: dict[str, Any]) -> None:
    """Send ``obj`` as one message."""
    data = json.dumps(obj).encode()
    sock.sendall(_HEADER.pack(len(data)) + data)


def recv_message(sock: socket.socket) -> dict[str, Any] | None:
    """One message, or ``None`` at end of stream."""
    head = _exact(sock, _HEADER.size)
    if head is None:
        return None
    body = _exact(sock, _HEADER.unpack(head)[0])
    if body is None:
        return None
    msg: dict[str, Any] = json.loads(body)
    return msg


def _exact(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


@dataclass
class _Job:
    pid: int
    pidfd: int
    conn: socket.socket
    deadline: float
    timed_out: bool = False


def _warm() -> None:
    for name in WARM_MODULES:
        importlib.import_module(name)
    try:
        importlib.import_module("durable_harness.storage.postgres")
    except ImportError:  # psycopg is an optional extra
        pass
    if threading.active_count() != 1:  # fork copies only the forking thread
        raise RuntimeError(f"fork server: imports started threads: {threading.enumerate()}")
    _freeze()


def _freeze() -> None:
    """Move what the server holds out of the collector's reach: a child's collections then
    skip it, so they neither spend CPU on it nor write to (and copy) its pages."""
    gc.collect()
    gc.freeze()


def serve(path: str) -> None:
    """Run the server on the Unix socket ``path`` until stdin closes (see the module doc)."""
    _warm()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
    jobs: dict[int, _Job] = {}  # by pidfd
    sys.stdout.write("ready\n")
    sys.stdout.flush()

    def close_all() -> None:  # in a forked child: nothing of the server's stays open
        sel.close()
        listener.close()
        for job in jobs.values():
            job.conn.close()
            os.close(job.pidfd)

    while True:
        deadlines = [j.deadline for j in jobs.values() if not j.timed_out]
        wait = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        for key, _ in sel.select(wait):
            if key.data == "parent":
                if not os.read(sys.stdin.fileno(), 4096):
                    for job in jobs.values():
                        kill(job.pid)
                    return
            elif key.data == "accept":
                conn, _ = listener.accept()
                new = _start(conn, close_all)
                if new is not None:
                    jobs[new.pidfd] = new
                    sel.register(new.pidfd, selectors.EVENT_READ, "child")
            else:
                job = jobs.pop(key.fd)
                sel.unregister(key.fd)
                _finish(job)
        now = time.monotonic()
        for job in jobs.values():
            if not job.timed_out and job.deadline <= now:
                job.timed_out = True
                kill(job.pid)


def _preload(module: str) -> None:
    """Import ``module`` in the server (a request's ``preload``); a module that fails to import
    is left to the child, which reports the traceback in its output."""
    if module in sys.modules:
        return
    try:
        importlib.import_module(module)
    except Exception:
        return
    if threading.active_count() != 1:  # fork copies only the forking thread
        raise RuntimeError(f"fork server: preloading {module} started threads")
    _freeze()


def kill(pid: int) -> None:
    """SIGKILL ``pid`` if it still exists."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _start(conn: socket.socket, close_all: Callable[[], None]) -> _Job | None:
    conn.settimeout(10.0)  # the client sends its request at once
    try:
        req = recv_message(conn)
    except (OSError, ValueError):
        req = None
    if req is None:
        conn.close()
        return None
    fds: dict[str, int] = {}
    names = req.get("pass") or []
    if names:
        try:
            _, got, _, _ = socket.recv_fds(conn, 1, len(names))
        except OSError:
            got = []
        if len(got) != len(names):
            for fd in got:
                os.close(fd)
            conn.close()
            return None
        fds = dict(zip(names, got, strict=True))
    if req.get("preload"):
        for module in [str(req["target"]).partition(":")[0], *req.get("modules", ())]:
            _preload(module)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        conn.close()
        _child(req, close_all, fds)
    for fd in fds.values():
        os.close(fd)
    try:
        send_message(conn, {"pid": pid})
    except OSError:
        pass  # the client is gone; the child still runs to its end or its timeout
    return _Job(pid, os.pidfd_open(pid), conn, time.monotonic() + float(req["timeout"]))


def _finish(job: _Job) -> None:
    _, status = os.waitpid(job.pid, 0)
    os.close(job.pidfd)
    reply = {"returncode": os.waitstatus_to_exitcode(status), "timed_out": job.timed_out}
    try:
        send_message(job.conn, reply)
    except OSError:
        pass
    job.conn.close()


def _child(req: dict[str, Any], close_all: Callable[[], None], fds: dict[str, int]) -> None:
    """In the forked child: become the requested process, run the target, ``os._exit``."""
    rc = 1
    try:
        close_all()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        stdin = fds["stdin"] if "stdin" in fds else os.open(os.devnull, os.O_RDONLY)
        stdout = fds.get("stdout")
        if stdout is None:
            stdout = os.open(req["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        stderr = fds.get("stderr")
        if stderr is None and req.get("stderr"):
            stderr = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(stdin, 0)
        os.dup2(stdout, 1)
        os.dup2(stdout if stderr is None else stderr, 2)
        for fd in {stdin, stdout, stderr if stderr is not None else stdout} - {0, 1, 2}:
            os.close(fd)
        os.environ.clear()
        os.environ.update(req["env"])
        sys.path[:] = [req["cwd"], *(p for p in req["path"] if p != req["cwd"])]
        os.chdir(req["cwd"])
        from durable_harness import crash

        crash.rearm()
        module, _, name = str(req["target"]).partition(":")
        sys.argv = [module, *req["argv"]]
        result = getattr(importlib.import_module(module), name)(list(req["argv"]))
        rc = int(result or 0)
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        rc = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc)


if __name__ == "__main__":
    serve(sys.argv[1])
