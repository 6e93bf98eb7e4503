"""A warm fork server for the crash matrix's children (``design/crash-matrix.md`` "Warm children").

One fresh interpreter (``python -m durable_harness.crashtest.forkproc SOCKET``: the server's
side, and the wire format, live in :mod:`~durable_harness.crashtest.forkproc`) imports what a
matrix child needs once, stays single-threaded (no pool, no event loop, no open store) and serves
requests on a Unix socket. A request names a target (``"module:function"``, default
:data:`CHILD_TARGET`), its argv, the full environment, the working folder, ``sys.path`` and a file
for the child's stdout and stderr (or, with ``stderr`` set, one file each: a CLI child whose test
reads the two streams apart, ``tests/recovery``); :meth:`ForkServer.spawn` may instead hand the
child open file descriptors for its stdin, stdout and stderr (pipes, as :class:`subprocess.Popen`
makes with ``PIPE``), passed over the socket as ``SCM_RIGHTS`` after the request (its ``pass``
field names them in order). With ``preload`` the server imports the target's module itself
before forking (once: every later child finds it warm; for a module that starts no thread at
import, such as the CLI's ``durable_harness.cli.main``). For each request the server forks; the
child resets its signals, takes stdin from ``/dev/null`` (or the passed descriptor), sets
``os.environ``, re-arms :mod:`durable_harness.crash`, enters the folder, calls ``target(argv)``
and leaves with ``os._exit`` (a traceback goes to the file, exit 1). The server answers with the
child's pid at once and its exit code when it ends (``-9`` when SIGKILLed, as :mod:`subprocess`
reports it), killing it at the request's timeout.

The server exits when its stdin (a pipe from the process that started it) closes.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from durable_harness.crashtest.forkproc import kill, recv_message, send_message

FORK_ENV = "DURABLE_HARNESS_CRASHTEST_FORK"
"""``0``: every matrix child is a fresh interpreter instead (debugging; the bench's baseline)."""
CHILD_TARGET = "durable_harness.crashtest.child:main"
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
    ``pid``, ``returncode``, ``stdin`` and ``stdout`` (pipes, when asked for), :meth:`poll`,
    :meth:`wait`, :meth:`send_signal`, :meth:`terminate`, :meth:`kill`. The server reaps it
    and sends its exit code (``-N`` for signal N, as :mod:`subprocess` gives it) on the spawn's
    connection. Safe to poll and wait from several threads (as ``Popen`` is): one reads the
    exit code, the others see it; a poll while another thread waits answers ``None``."""

    def __init__(
        self,
        pid: int,
        sock: socket.socket,
        args: list[str],
        stdin: IO[bytes] | None = None,
        stdout: IO[bytes] | None = None,
    ) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        #: our end of the child's stdin / stdout when :meth:`ForkServer.spawn` made a pipe
        #: (binary, buffered, as :class:`subprocess.Popen` gives them), else ``None``
        self.stdin = stdin
        self.stdout = stdout
        self._sock = sock
        self._lock = threading.Lock()  # held while a thread waits on the socket

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
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            return None  # another thread is waiting for it
        try:
            if self.returncode is not None:  # that thread read it meanwhile
                return self.returncode
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._sock], [], [], left)
            if not ready:
                return None
            self._sock.settimeout(_REPLY_SLACK)
            try:
                done = recv_message(self._sock)
            except OSError:
                done = None
            self._sock.close()
            # no reply: the server died, and with it (it kills its children) this child
            self.returncode = int(done["returncode"]) if done else -signal.SIGKILL
            return self.returncode
        finally:
            self._lock.release()

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
                    "durable_harness.crashtest.forkproc",
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
        modules: tuple[str, ...] = (),
    ) -> Completed:
        """Run ``target(argv)`` in a child forked by the server, in ``cwd`` with exactly ``env``
        and this process's ``sys.path``; wait for it at most ``timeout`` seconds. ``separate``:
        stdout and stderr go to two files (:class:`Completed`); ``preload``: the server imports
        the target's module (and ``modules``) before it forks, so this child and every later one
        start warm
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
            request: dict[str, Any] = {"target": target, "argv": argv, "env": env}
            request |= {"cwd": cwd, "path": sys.path, "output": out, "timeout": timeout}
            request |= {"stderr": err, "preload": preload, "modules": list(modules)}
            child, sock = self._start_child(request, [])
            pid = child
            with sock:
                try:
                    sock.settimeout(timeout + _REPLY_SLACK)
                    done = recv_message(sock)
                except OSError as exc:  # reset, or no answer in time
                    raise ForkServerError(self._died(f"failed: {exc}")) from exc
            if done is None:
                self._settle()
                raise ForkServerError(self._died("closed the connection before the child ended"))
            pid = None  # the server reaped it
            output = Path(out).read_text(errors="replace")
            errors = Path(err).read_text(errors="replace") if err else ""
            if done.get("timed_out"):
                raise subprocess.TimeoutExpired(
                    [target, *argv], timeout, output=output, stderr=errors or None
                )
            return Completed(int(done["returncode"]), child, output, errors)
        finally:
            if pid is not None:  # the server did not reap it: do not leave it running
                kill(pid)
            os.unlink(out)
            if err:
                os.unlink(err)

    def spawn(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: str,
        stdout: str | int,
        stderr: str | int,
        timeout: float,
        target: str = CLI_TARGET,
        preload: tuple[str, ...] = (),
        stdin: int | None = None,
    ) -> Spawned:
        """Start ``target(argv)`` in a child forked by the server and return at once, the child
        left running (a server under test, say). ``stdout`` and ``stderr``: a file's path, an
        open file descriptor the child gets a copy of, or (``stdout`` only)
        :data:`subprocess.PIPE` for a pipe read through :attr:`Spawned.stdout`; ``stdin``:
        ``None`` (``/dev/null``), a descriptor, or :data:`subprocess.PIPE` (written through
        :attr:`Spawned.stdin`). ``preload``: modules the server imports first (the target's own
        and these; only modules that start no thread when imported). The server kills the child
        after ``timeout`` seconds.

        Raises:
            ForkServerError: the server is gone or stopped answering.
            ValueError: a stream given as something else (nothing is started).
        """
        self.start()
        passed: dict[str, int] = {}  # what the child gets, by stream, in the order sent
        ours: dict[str, IO[bytes]] = {}  # our ends of the pipes
        try:
            for name, spec in (("stdin", stdin), ("stdout", stdout), ("stderr", stderr)):
                if spec == subprocess.PIPE and name != "stderr":
                    r, w = os.pipe()
                    child_end, our_end = (r, w) if name == "stdin" else (w, r)
                    passed[name] = child_end
                    ours[name] = os.fdopen(our_end, "wb" if name == "stdin" else "rb")
                elif isinstance(spec, int) and spec >= 0:
                    passed[name] = os.dup(spec)
                elif spec is not None and not isinstance(spec, str):
                    raise ValueError(f"spawn: {name} must be a path, a descriptor or PIPE")
            request: dict[str, Any] = {"target": target, "argv": argv, "env": env, "cwd": cwd}
            request |= {"path": sys.path, "timeout": timeout, "preload": True}
            request |= {"output": stdout if isinstance(stdout, str) else None}
            request |= {"stderr": stderr if isinstance(stderr, str) else None}
            request |= {"modules": list(preload), "pass": list(passed)}
            pid, sock = self._start_child(request, list(passed.values()))
            return Spawned(pid, sock, [target, *argv], ours.get("stdin"), ours.get("stdout"))
        except BaseException:
            for f in ours.values():
                f.close()
            raise
        finally:
            for fd in passed.values():  # the child has its copies (or failed to start)
                os.close(fd)

    def _start_child(self, request: dict[str, Any], fds: list[int]) -> tuple[int, socket.socket]:
        """Send ``request`` (and ``fds``) on a new connection; the child's pid and the
        connection its exit code will come on.

        Raises:
            ForkServerError: the server is gone or did not answer with the child's pid.
        """
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(self.socket_path))
            send_message(sock, request)
            if fds:
                socket.send_fds(sock, [b"F"], fds)
            sock.settimeout(_REPLY_SLACK)
            started = recv_message(sock)
        except OSError as exc:
            sock.close()
            raise ForkServerError(self._died(f"failed: {exc}")) from exc
        if started is None:
            sock.close()
            self._settle()
            raise ForkServerError(self._died("closed the connection before the child started"))
        return int(started["pid"]), sock

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
    from durable_harness.cli.main import COMMAND_MODULES  # the CLI imports a command's own

    done = shared().run(
        argv,
        env=env,
        cwd=cwd,
        timeout=timeout,
        target=CLI_TARGET,
        separate=True,
        preload=True,
        modules=COMMAND_MODULES,
    )
    return subprocess.CompletedProcess(
        ["durable-harness", *argv], done.returncode, stdout=done.output, stderr=done.stderr
    )


atexit.register(_shared.stop)
