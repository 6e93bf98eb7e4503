"""A warm fork server for the crash matrix's children (``design/crash-matrix.md`` "Warm children").

One fresh interpreter (``python -m durable_harness.crashtest.forkserver SOCKET``) imports what a
matrix child needs once, stays single-threaded (no pool, no event loop, no open store) and serves
requests on a Unix socket. A request names a target (``"module:function"``, default
:data:`CHILD_TARGET`), its argv, the full environment, the working folder, ``sys.path`` and a file
for the child's stdout and stderr (or, with ``stderr`` set, one file each: a CLI child whose test
reads the two streams apart, ``tests/recovery``). With ``preload`` the server imports the
target's module itself before forking (once: every later child finds it warm; for a module
that starts no thread at import, such as the CLI's ``durable_harness.cli.main``). For each
request the server forks; the child resets its signals,
takes stdin from ``/dev/null``, sets ``os.environ``, re-arms :mod:`durable_harness.crash`, enters
the folder, calls ``target(argv)`` and leaves with ``os._exit`` (a traceback goes to the file,
exit 1). The server answers with the child's pid at once and its exit code when it ends
(``-9`` when SIGKILLed, as :mod:`subprocess` reports it), killing it at the request's timeout.

Wire format: each message is a 4-byte big-endian length and a JSON object; one connection per
request. The server exits when its stdin (a pipe from the process that started it) closes.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORK_ENV = "DURABLE_HARNESS_CRASHTEST_FORK"
"""``0``: every matrix child is a fresh interpreter instead (debugging; the bench's baseline)."""
CHILD_TARGET = "durable_harness.crashtest.child:main"
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

CLI_TARGET = "durable_harness.cli.main:main"
"""The CLI's ``main(argv)``: the code of the ``durable-harness`` console script."""


class ForkServerError(RuntimeError):
    """The fork server died, did not start or stopped answering; the message holds its pid,
    exit status and the end of its log. Test machinery, like the runner's ``RuntimeError`` for
    a failed child: not one of the library's typed errors (``durable_harness.errors``)."""


_REPLY_SLACK = 30.0  # seconds past a child's timeout before the server counts as hung


def available() -> bool:
    """True when this platform can run the server (``fork`` and ``pidfd_open``: Linux)."""
    return hasattr(os, "fork") and hasattr(os, "pidfd_open") and sys.platform.startswith("linux")


def enabled() -> bool:
    """True when matrix children should come from the fork server: :func:`available` and
    :data:`FORK_ENV` is not ``0``."""
    return available() and os.environ.get(FORK_ENV, "1") != "0"


def _send(sock: socket.socket, obj: dict[str, Any]) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv(sock: socket.socket) -> dict[str, Any] | None:
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
class Completed:
    """A finished child: ``returncode`` as :mod:`subprocess` gives it (``-N`` for signal N),
    its ``pid``, and what it wrote: ``output`` holds stdout and stderr together (one file,
    text), or stdout alone when the request asked for ``separate`` streams; then ``stderr``
    holds stderr (else it is empty)."""

    returncode: int
    pid: int
    output: str
    stderr: str = ""


class Spawned:
    """A child :meth:`ForkServer.spawn` left running, used as a :class:`subprocess.Popen`:
    ``pid``, ``returncode``, :meth:`poll`, :meth:`wait`, :meth:`send_signal`,
    :meth:`terminate`, :meth:`kill`. The server reaps it and sends its exit code
    (``-N`` for signal N, as :mod:`subprocess` gives it) on the spawn's connection."""

    def __init__(self, pid: int, sock: socket.socket, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._sock = sock

    def poll(self) -> int | None:
        """The exit code if the child has ended (else ``None``), without waiting."""
        return self._reply(0.0)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child's end (at most ``timeout`` seconds); its exit code.

        Raises:
            subprocess.TimeoutExpired: it is still running after ``timeout``.
        """
        code = self._reply(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def _reply(self, timeout: float | None) -> int | None:
        if self.returncode is not None:
            return self.returncode
        ready, _, _ = select.select([self._sock], [], [], timeout)
        if not ready:
            return None
        self._sock.settimeout(_REPLY_SLACK)
        try:
            done = _recv(self._sock)
        except OSError:
            done = None
        self._sock.close()
        # no reply: the server died, and with it (it kills its children) this child
        self.returncode = int(done["returncode"]) if done else -signal.SIGKILL
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the child unless it is known to have ended."""
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        """SIGTERM."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL."""
        self.send_signal(signal.SIGKILL)


@dataclass
class ForkServer:
    """The client side: starts the server process (:meth:`start`, or lazily in :meth:`run`),
    sends it requests from any thread, stops it (:meth:`stop`, or as a context manager)."""

    proc: subprocess.Popen[bytes] | None = None
    folder: Path | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def socket_path(self) -> Path:
        """The server's Unix socket (in a private temporary folder)."""
        assert self.folder is not None
        return self.folder / "sock"

    def start(self) -> None:
        """Start the server and wait until it listens (its imports done).

        Raises:
            ForkServerError: the server exited before it was ready (its log is in the message).
        """
        with self._lock:
            if self.proc is not None:
                return
            self.folder = Path(tempfile.mkdtemp(prefix="dh-forkserver-"))
            log = open(self.folder / "server.log", "wb")  # noqa: SIM115 - the child keeps it
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "durable_harness.crashtest.forkserver",
                    str(self.socket_path),
                ],
                stdin=subprocess.PIPE,  # the server exits when this closes (we are gone)
                stdout=subprocess.PIPE,
                stderr=log,
                cwd=os.getcwd(),
                start_new_session=True,  # a terminal's Ctrl-C reaches us, not the server
            )
            log.close()
            assert self.proc.stdout is not None
            ready = self.proc.stdout.readline()
            if ready.strip() != b"ready":
                self.proc.wait()
                raise ForkServerError(self._died("did not start"))

    def _died(self, what: str) -> str:
        log = ""
        if self.folder is not None and (self.folder / "server.log").exists():
            log = (self.folder / "server.log").read_text(errors="replace")[-2000:]
        status = self.proc.poll() if self.proc is not None else None
        pid = self.proc.pid if self.proc is not None else "?"
        return f"crash-matrix fork server (pid {pid}) {what} (exit {status}); its log: {log!r}"

    def stop(self) -> None:
        """Stop the server (closing its stdin ends it; its children are killed) and wait."""
        with self._lock:
            proc, self.proc = self.proc, None
        if proc is None:
            return
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if self.folder is not None:
            import shutil

            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> ForkServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: str,
        timeout: float,
        target: str = CHILD_TARGET,
        separate: bool = False,
        preload: bool = False,
    ) -> Completed:
        """Run ``target(argv)`` in a child forked by the server, in ``cwd`` with exactly ``env``
        and this process's ``sys.path``; wait for it at most ``timeout`` seconds. ``separate``:
        stdout and stderr go to two files (:class:`Completed`); ``preload``: the server imports
        the target's module before it forks, so this child and every later one start warm
        (only for a module that starts no thread when imported: the server stays
        single-threaded, or it exits naming the threads).

        Raises:
            subprocess.TimeoutExpired: the child ran past ``timeout`` (it was SIGKILLed).
            ForkServerError: the server is gone or stopped answering (the child is killed).
        """
        self.start()
        fd, out = tempfile.mkstemp(prefix="dh-child-", suffix=".log")
        os.close(fd)
        err: str | None = None
        if separate:
            fd, err = tempfile.mkstemp(prefix="dh-child-", suffix=".err")
            os.close(fd)
        pid: int | None = None  # set while the child may still run unreaped
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                try:
                    sock.connect(str(self.socket_path))
                    request: dict[str, Any] = {"target": target, "argv": argv, "env": env}
                    request |= {"cwd": cwd, "path": sys.path, "output": out, "timeout": timeout}
                    request |= {"stderr": err, "preload": preload}
                    _send(sock, request)
                    sock.settimeout(timeout + _REPLY_SLACK)
                    started = _recv(sock)
                    pid = int(started["pid"]) if started else None
                    done = _recv(sock) if started else None
                except OSError as exc:  # refused, reset, or no answer in time
                    raise ForkServerError(self._died(f"failed: {exc}")) from exc
            if started is None or done is None:
                self._settle()
                raise ForkServerError(self._died("closed the connection before the child ended"))
            child, pid = int(started["pid"]), None  # the server reaped it
            output = Path(out).read_text(errors="replace")
            errors = Path(err).read_text(errors="replace") if err else ""
            if done.get("timed_out"):
                raise subprocess.TimeoutExpired(
                    [target, *argv], timeout, output=output, stderr=errors or None
                )
            return Completed(int(done["returncode"]), child, output, errors)
        finally:
            if pid is not None:  # the server did not reap it: do not leave it running
                _kill(pid)
            os.unlink(out)
            if err:
                os.unlink(err)

    def spawn(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: str,
        stdout: str,
        stderr: str,
        timeout: float,
        target: str = CLI_TARGET,
        preload: tuple[str, ...] = (),
    ) -> Spawned:
        """Start ``target(argv)`` in a child forked by the server and return at once, the child
        left running (a server under test, say): stdout and stderr go to the files ``stdout``
        and ``stderr``; ``preload``: modules the server imports first (the target's own and
        these; only modules that start no thread when imported). The server kills the child
        after ``timeout`` seconds.

        Raises:
            ForkServerError: the server is gone or stopped answering.
        """
        self.start()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(self.socket_path))
            request: dict[str, Any] = {"target": target, "argv": argv, "env": env}
            request |= {"cwd": cwd, "path": sys.path, "output": stdout, "timeout": timeout}
            request |= {"stderr": stderr, "preload": True, "modules": list(preload)}
            _send(sock, request)
            sock.settimeout(_REPLY_SLACK)
            started = _recv(sock)
        except OSError as exc:
            sock.close()
            raise ForkServerError(self._died(f"failed: {exc}")) from exc
        if started is None:
            sock.close()
            self._settle()
            raise ForkServerError(self._died("closed the connection before the child started"))
        return Spawned(int(started["pid"]), sock, [target, *argv])

    def _settle(self) -> None:
        """Give a server that closed a connection a moment to exit, for its status."""
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


_shared = ForkServer()


def shared() -> ForkServer:
    """This process's server, started on first use and stopped at exit."""
    if _shared.proc is None:
        _shared.start()
    return _shared


def run_cli(
    argv: list[str], *, env: dict[str, str], cwd: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``durable-harness ARGV`` in a child forked from this process's :func:`shared` server,
    the CLI preloaded there: a process of its own (own pid, store handles and lease; a crash
    point SIGKILLs it) without a fresh interpreter's start and imports (the project's tests,
    issue 22). stdout and stderr come back apart, as :func:`subprocess.run` gives them. Where
    the server cannot run (:func:`available`: not Linux), a fresh interpreter instead.

    Raises:
        subprocess.TimeoutExpired: the child ran past ``timeout`` (it was SIGKILLed).
        ForkServerError: the server is gone or stopped answering.
    """
    if not available():
        return subprocess.run(
            [sys.executable, "-m", "durable_harness", *argv],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    done = shared().run(
        argv, env=env, cwd=cwd, timeout=timeout, target=CLI_TARGET, separate=True, preload=True
    )
    return subprocess.CompletedProcess(
        ["durable-harness", *argv], done.returncode, stdout=done.output, stderr=done.stderr
    )


atexit.register(_shared.stop)


# --- the server process ----------------------------------------------------------------------


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
                        _kill(job.pid)
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
                _kill(job.pid)


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


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _start(conn: socket.socket, close_all: Callable[[], None]) -> _Job | None:
    conn.settimeout(10.0)  # the client sends its request at once
    try:
        req = _recv(conn)
    except (OSError, ValueError):
        req = None
    if req is None:
        conn.close()
        return None
    if req.get("preload"):
        for module in [str(req["target"]).partition(":")[0], *req.get("modules", ())]:
            _preload(module)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        conn.close()
        _child(req, close_all)
    try:
        _send(conn, {"pid": pid})
    except OSError:
        pass  # the client is gone; the child still runs to its end or its timeout
    return _Job(pid, os.pidfd_open(pid), conn, time.monotonic() + float(req["timeout"]))


def _finish(job: _Job) -> None:
    _, status = os.waitpid(job.pid, 0)
    os.close(job.pidfd)
    reply = {"returncode": os.waitstatus_to_exitcode(status), "timed_out": job.timed_out}
    try:
        _send(job.conn, reply)
    except OSError:
        pass
    job.conn.close()


def _child(req: dict[str, Any], close_all: Callable[[], None]) -> None:
    """In the forked child: become the requested process, run the target, ``os._exit``."""
    rc = 1
    try:
        close_all()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        out = os.open(req["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1)
        os.close(out)
        if req.get("stderr"):
            out = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        else:
            out = 1
        os.dup2(out, 2)
        os.close(null)
        if out != 1:
            os.close(out)
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
