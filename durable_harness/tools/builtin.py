"""The built-in tools: ``read_file``, ``write_file``, ``edit_file``, ``append_file`` and ``bash``.

Every path argument is resolved with :func:`~durable_harness.tools.base.resolve_path`, so it
must stay inside the session's working directory (``ToolContext.cwd``); a path that escapes,
directly or through a symlink, yields an ``is_error`` result naming the path, never an
exception. Other expected failures (missing file, text not found, non-zero exit) are
``is_error`` results too, so the model can see and correct them.

Durability: ``write_file`` and ``edit_file`` replace the target atomically (temporary file in
the same directory, ``fsync``, ``os.replace``, ``fsync`` of the directory), so after a crash
the file holds either the old or the new content, which is what lets their ``reconcile``
decide an in-doubt call from the file alone. ``append_file`` and ``bash`` cannot be told
apart from the outside and offer no ``reconcile``.

``bash`` runs each command in its own process group and never lets any process of that
group outlive the call: on normal exit stragglers get SIGTERM then SIGKILL, on timeout the
whole group gets SIGTERM, a short grace, then SIGKILL, and on cancellation (abort) the group
gets SIGKILL before the cancellation propagates. A process that leaves the group on purpose
(``setsid``, ``nohup setsid ...``) is not tracked.

File I/O runs in worker threads (:func:`anyio.to_thread.run_sync`), so the tools work on both
asyncio and trio.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import os
import secrets
import signal
import subprocess
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.abc
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field

from durable_harness.errors import PathEscape
from durable_harness.tools.base import Replay, Tool, ToolContext, ToolResult, resolve_path

__all__ = [
    "OUTPUT_CAP_BYTES",
    "AppendFileArgs",
    "AppendFileTool",
    "BashArgs",
    "BashTool",
    "EditFileArgs",
    "EditFileTool",
    "ReadFileArgs",
    "ReadFileTool",
    "WriteFileArgs",
    "WriteFileTool",
    "builtin_tools",
]

OUTPUT_CAP_BYTES = 256 * 1024
"""Most bytes (UTF-8) of file text or command output a single tool result carries: 256 KiB."""

_TERM_GRACE_SECONDS = 1.0
"""Seconds a process group gets between SIGTERM and SIGKILL."""

_DRAIN_GRACE_SECONDS = 1.0
"""Seconds to wait for the output pipe to close once the group is gone (a process outside
the group may still hold it)."""

_REAP_LIMIT_SECONDS = 5.0
"""Upper bound, in seconds, on waiting for a SIGKILLed shell to be reaped during cleanup."""


# --------------------------------------------------------------------------------------------
# helpers


def _escape_result(exc: PathEscape) -> ToolResult:
    """Turn a :class:`PathEscape` into an ``is_error`` result naming the path."""
    return ToolResult.text(
        f"refused: {exc.message}",
        is_error=True,
        details={"error": exc.code, "path": exc.details.get("path")},
    )


def _os_error_result(action: str, path: str, exc: OSError) -> ToolResult:
    """Turn an :class:`OSError` from file I/O on ``path`` into an ``is_error`` result."""
    if isinstance(exc, FileNotFoundError):
        text = f"{action} {path}: file not found"
    elif isinstance(exc, IsADirectoryError):
        text = f"{action} {path}: is a directory"
    elif isinstance(exc, NotADirectoryError):
        text = f"{action} {path}: a parent of the path is not a directory"
    elif isinstance(exc, PermissionError):
        text = f"{action} {path}: permission denied"
    else:
        text = f"{action} {path}: {exc.strerror or exc}"
    return ToolResult.text(
        text,
        is_error=True,
        details={"error": errno.errorcode.get(exc.errno or 0, "EIO"), "path": path},
    )


def _fsync_dir(directory: Path) -> None:
    """``fsync`` a directory so a rename or create inside it is durable.

    Raises:
        OSError: the directory cannot be opened or synced.
    """
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_parents(target: Path) -> None:
    """Create the missing parent directories of ``target`` and make their entries durable.

    Raises:
        OSError: a directory cannot be created (for example a parent is a regular file).
    """
    missing: list[Path] = []
    parent = target.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            if not directory.is_dir():
                raise
        _fsync_dir(directory.parent)


def _atomic_write(target: Path, data: bytes) -> None:
    """Replace ``target`` with ``data`` (bytes) so a crash leaves either old or new content.

    Writes a temporary file next to ``target``, ``fsync``s it, ``os.replace``s it over the
    target and ``fsync``s the directory. Missing parent directories are created. An existing
    target keeps its permission bits; a new one gets the default mode (``0o666`` minus umask).

    Raises:
        OSError: any step failed; the temporary file is removed and ``target`` is unchanged.
    """
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
    _make_parents(target)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            try:
                os.fchmod(fd, os.stat(target).st_mode & 0o7777)
            except FileNotFoundError:
                pass
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(target.parent)


def _sha256(data: bytes) -> str:
    """Return the hex SHA-256 digest of ``data``."""
    return hashlib.sha256(data).hexdigest()


def _read_bytes_or_none(target: Path) -> bytes | None:
    """Return the bytes of the regular file ``target``, or ``None`` when it cannot be read."""
    try:
        return target.read_bytes()
    except OSError:
        return None


def _cut_utf8(data: bytes, limit: int) -> bytes:
    """Return the longest prefix of ``data`` of at most ``limit`` bytes not splitting a
    UTF-8 character."""
    if len(data) <= limit:
        return data
    end = limit
    while end > 0 and (data[end] & 0xC0) == 0x80:
        end -= 1
    return data[:end]


# --------------------------------------------------------------------------------------------
# read_file


class ReadFileArgs(BaseModel):
    """Arguments of ``read_file``."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(
        description="Path of the file to read, relative to the working "
        "directory (absolute paths must lie inside it)."
    )
    offset: int | None = Field(
        default=None, ge=1, description="1-based number of the first line to return; defaults to 1."
    )
    limit: int | None = Field(
        default=None,
        ge=1,
        description="Most lines to return; defaults to all remaining "
        "lines (output is capped at 256 KiB).",
    )


class ReadFileTool(Tool):
    """``read_file``: return a file's text, optionally a window of lines.

    Args model: :class:`ReadFileArgs` (``path``, ``offset`` 1-based line, ``limit`` lines).
    The file is decoded as UTF-8 with invalid bytes replaced. The output holds whole lines and
    at most :data:`OUTPUT_CAP_BYTES` bytes; when it is cut, a note at the end gives the
    ``offset`` to continue from. ``details``: ``{"path", "offset", "lines", "total_lines",
    "truncated"}``.

    Error results (``is_error``): path outside the working directory, file missing, a
    directory, unreadable, or ``offset`` past the end of a non-empty file.
    """

    name: ClassVar[str] = "read_file"
    description: ClassVar[str] = (
        "Read a text file inside the working directory. Optionally give offset (1-based first "
        "line) and limit (number of lines) to read a window of a large file. Output is capped "
        "at 256 KiB; a note says where to continue."
    )
    Args: ClassVar[type[BaseModel]] = ReadFileArgs
    replay: ClassVar[Replay] = "safe"

    async def execute(self, args: Any, ctx: ToolContext) -> ToolResult:
        """Read ``args.path`` and return its text (see the class docstring)."""
        assert isinstance(args, ReadFileArgs)
        return await _file_op(ctx, args.path, "cannot read", lambda t: self._read(t, args))

    @staticmethod
    def _read(target: Path, args: ReadFileArgs) -> ToolResult:
        """Blocking body of :meth:`execute`; raises :class:`OSError` on I/O failure."""
        first = args.offset or 1
        chunks: list[str] = []
        used = 0
        shown = 0
        total = 0
        truncated = False
        with open(target, encoding="utf-8", errors="replace", newline="") as handle:
            for number, line in enumerate(handle, start=1):
                total = number
                if number < first or truncated:
                    continue
                if args.limit is not None and shown >= args.limit:
                    continue
                size = len(line.encode("utf-8"))
                if used + size > OUTPUT_CAP_BYTES:
                    truncated = True
                    if shown == 0:
                        # A single line longer than the cap: return its head.
                        head = _cut_utf8(line.encode("utf-8"), OUTPUT_CAP_BYTES)
                        chunks.append(head.decode("utf-8"))
                        shown = 1
                    continue
                chunks.append(line)
                used += size
                shown += 1
        if total > 0 and first > total:
            return ToolResult.text(
                f"cannot read {args.path}: offset {first} is past the end of the file "
                f"({total} lines)",
                is_error=True,
                details={"error": "offset_out_of_range", "path": args.path, "total_lines": total},
            )
        text = "".join(chunks)
        if truncated:
            next_line = first + shown
            if not text.endswith("\n"):
                text += "\n"
            text += (
                f"[output truncated at {OUTPUT_CAP_BYTES} bytes: showed lines {first}-"
                f"{first + shown - 1} of {total}; continue with offset={next_line}]"
            )
        return ToolResult.text(
            text,
            details={
                "path": str(target),
                "offset": first,
                "lines": shown,
                "total_lines": total,
                "truncated": truncated,
            },
        )


# --------------------------------------------------------------------------------------------
# write_file


class WriteFileArgs(BaseModel):
    """Arguments of ``write_file``."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(
        description="Path of the file to write, relative to the working "
        "directory; missing parent directories are created."
    )
    content: str = Field(
        description="The complete new content of the file (UTF-8 text); "
        "an existing file is replaced."
    )


class WriteFileTool(Tool):
    """``write_file``: create or replace a file atomically.

    Args model: :class:`WriteFileArgs` (``path``, ``content``). Result text
    ``"wrote N bytes to PATH"`` (N = UTF-8 bytes of ``content``); ``details``:
    ``{"path": absolute path, "bytes": N, "sha256": hex digest}``.

    Error results: path outside the working directory, the path is a directory, a parent is a
    file, permission denied, disk full.
    """

    name: ClassVar[str] = "write_file"
    description: ClassVar[str] = (
        "Create or overwrite a file inside the working directory with the given content. "
        "Parent directories are created. The write is atomic."
    )
    Args: ClassVar[type[BaseModel]] = WriteFileArgs
    replay: ClassVar[Replay] = "never"

    async def execute(self, args: Any, ctx: ToolContext) -> ToolResult:
        """Write ``args.content`` to ``args.path`` (see the class docstring)."""
        assert isinstance(args, WriteFileArgs)
        data = args.content.encode("utf-8")

        def write(target: Path) -> ToolResult:
            _atomic_write(target, data)
            return self._success(args.path, target, data, reconciled=False)

        return await _file_op(ctx, args.path, "cannot write", write)

    async def reconcile(self, args: Any, ctx: ToolContext) -> ToolResult | None:
        """Decide an in-doubt ``write_file`` from the file.

        Returns the success result (``details["reconciled"] = True``) when the file exists
        and holds exactly the intended content; ``None`` otherwise (it may never have been
        written, or been overwritten since), including when the path now escapes.
        """
        assert isinstance(args, WriteFileArgs)
        try:
            target = resolve_path(ctx.cwd, args.path)
        except PathEscape:
            return None
        data = args.content.encode("utf-8")
        current = await anyio.to_thread.run_sync(_read_bytes_or_none, target)
        if current is None or current != data:
            return None
        return self._success(args.path, target, data, reconciled=True)

    @staticmethod
    def _success(path: str, target: Path, data: bytes, *, reconciled: bool) -> ToolResult:
        """Build the success result for writing ``data`` to ``target``."""
        details: dict[str, Any] = {"path": str(target), "bytes": len(data), "sha256": _sha256(data)}
        if reconciled:
            details["reconciled"] = True
        return ToolResult.text(f"wrote {len(data)} bytes to {path}", details=details)


# --------------------------------------------------------------------------------------------
# edit_file


class EditFileArgs(BaseModel):
    """Arguments of ``edit_file``."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(
        description="Path of an existing text file, relative to the working directory."
    )
    old_text: str = Field(
        min_length=1,
        description="Exact text to replace; it must occur exactly once in "
        "the file (include surrounding lines to make it unique).",
    )
    new_text: str = Field(description="Text that replaces old_text.")


class EditFileTool(Tool):
    """``edit_file``: replace the single occurrence of ``old_text`` with ``new_text``.

    Args model: :class:`EditFileArgs` (``path``, ``old_text``, ``new_text``). The file is
    rewritten atomically like ``write_file``. Result text ``"edited PATH: replaced 1
    occurrence (N bytes)"``; ``details``: ``{"path", "bytes", "sha256"}`` of the new content.

    Error results: path outside the working directory, file missing or not UTF-8,
    ``old_text`` absent or occurring more than once (the count is given).
    """

    name: ClassVar[str] = "edit_file"
    description: ClassVar[str] = (
        "Edit a text file inside the working directory by replacing old_text, which must "
        "occur exactly once, with new_text. The write is atomic."
    )
    Args: ClassVar[type[BaseModel]] = EditFileArgs
    replay: ClassVar[Replay] = "never"

    async def execute(self, args: Any, ctx: ToolContext) -> ToolResult:
        """Apply the edit (see the class docstring)."""
        assert isinstance(args, EditFileArgs)
        return await _file_op(ctx, args.path, "cannot edit", lambda t: self._edit(t, args))

    @classmethod
    def _edit(cls, target: Path, args: EditFileArgs) -> ToolResult:
        """Blocking body of :meth:`execute`; raises :class:`OSError` on I/O failure."""
        raw = target.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return ToolResult.text(
                f"cannot edit {args.path}: the file is not UTF-8 text",
                is_error=True,
                details={"error": "not_utf8", "path": args.path},
            )
        count = text.count(args.old_text)
        if count != 1:
            found = "was not found" if count == 0 else f"occurs {count} times"
            return ToolResult.text(
                f"cannot edit {args.path}: old_text {found}; it must occur exactly once",
                is_error=True,
                details={"error": "old_text_count", "path": args.path, "count": count},
            )
        data = text.replace(args.old_text, args.new_text, 1).encode("utf-8")
        _atomic_write(target, data)
        return cls._success(args.path, target, data, reconciled=False)

    async def reconcile(self, args: Any, ctx: ToolContext) -> ToolResult | None:
        """Decide an in-doubt ``edit_file`` from the file.

        Returns the success result (``details["reconciled"] = True``, size and digest of the
        current file) when the file contains ``new_text`` and no longer contains
        ``old_text``; ``None`` otherwise, including when the file is missing, not UTF-8, or
        the path now escapes.
        """
        assert isinstance(args, EditFileArgs)
        try:
            target = resolve_path(ctx.cwd, args.path)
        except PathEscape:
            return None
        raw = await anyio.to_thread.run_sync(_read_bytes_or_none, target)
        if raw is None:
            return None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if args.new_text in text and args.old_text not in text:
            return self._success(args.path, target, raw, reconciled=True)
        return None

    @staticmethod
    def _success(path: str, target: Path, data: bytes, *, reconciled: bool) -> ToolResult:
        """Build the success result for a file now holding ``data``."""
        details: dict[str, Any] = {"path": str(target), "bytes": len(data), "sha256": _sha256(data)}
        if reconciled:
            details["reconciled"] = True
        return ToolResult.text(
            f"edited {path}: replaced 1 occurrence ({len(data)} bytes)", details=details
        )


# --------------------------------------------------------------------------------------------
# append_file


class AppendFileArgs(BaseModel):
    """Arguments of ``append_file``."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(
        description="Path of the file to append to, relative to the working "
        "directory; created (with parents) if missing."
    )
    content: str = Field(description="Text (UTF-8) to add at the end of the file.")


class AppendFileTool(Tool):
    """``append_file``: add text at the end of a file (``O_APPEND``, then ``fsync``).

    Args model: :class:`AppendFileArgs` (``path``, ``content``). Result text
    ``"appended N bytes to PATH"`` (N = UTF-8 bytes); ``details``: ``{"path", "bytes"}``.
    No ``reconcile``: whether an append happened cannot be told from the file alone.

    Error results: path outside the working directory, the path is a directory, permission
    denied, disk full.
    """

    name: ClassVar[str] = "append_file"
    description: ClassVar[str] = (
        "Append text to the end of a file inside the working directory, creating the file "
        "(and parent directories) if needed."
    )
    Args: ClassVar[type[BaseModel]] = AppendFileArgs
    replay: ClassVar[Replay] = "never"

    async def execute(self, args: Any, ctx: ToolContext) -> ToolResult:
        """Append ``args.content`` to ``args.path`` (see the class docstring)."""
        assert isinstance(args, AppendFileArgs)
        data = args.content.encode("utf-8")

        def append(target: Path) -> ToolResult:
            self._append(target, data)
            return ToolResult.text(
                f"appended {len(data)} bytes to {args.path}",
                details={"path": str(target), "bytes": len(data)},
            )

        return await _file_op(ctx, args.path, "cannot append to", append)

    @staticmethod
    def _append(target: Path, data: bytes) -> None:
        """Blocking body of :meth:`execute`; raises :class:`OSError` on I/O failure."""
        _make_parents(target)
        created = not target.exists()
        fd = os.open(
            target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666
        )
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            _fsync_dir(target.parent)


# --------------------------------------------------------------------------------------------
# bash


class BashArgs(BaseModel):
    """Arguments of ``bash``."""

    model_config = ConfigDict(extra="forbid")

    command: str = Field(
        description="Bash command line, run with `bash -c` in the working "
        "directory. stdout and stderr are combined."
    )
    timeout: float | None = Field(
        default=None,
        gt=0,
        description="Seconds before the command and every process "
        "it started are killed; defaults to 120.",
    )


class _Tail:
    """The last ``cap`` bytes of a byte stream, plus the total byte count."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.total = 0
        self.buffer = bytearray()

    def add(self, chunk: bytes) -> None:
        """Append ``chunk``, dropping the oldest bytes beyond ``cap``."""
        self.total += len(chunk)
        self.buffer += chunk
        if len(self.buffer) > self.cap:
            del self.buffer[: len(self.buffer) - self.cap]

    def text(self) -> str:
        """Decode the kept bytes as UTF-8 (replacing bad bytes), with a note if cut."""
        data = bytes(self.buffer)
        if self.total <= len(data):
            return data.decode("utf-8", errors="replace")
        start = 0
        while start < min(len(data), 3) and (data[start] & 0xC0) == 0x80:
            start += 1  # do not begin inside a multi-byte character
        return (
            f"[output truncated: showing the last {len(data) - start} of {self.total} "
            f"bytes]\n" + data[start:].decode("utf-8", errors="replace")
        )


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; return False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        # Only possible if the id now names a group we do not own: treat it as gone.
        return False
    return True


def _group_alive(pgid: int) -> bool:
    """Return True while process group ``pgid`` has a member that is not a zombie.

    Orphaned members are reaped by init, which may be slow or absent in a container, so a
    zombie does not count. Without ``/proc`` any member, zombie or not, counts.
    """
    if not _signal_group(pgid, 0):
        return False
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


async def _stop_group(process: anyio.abc.Process, pgid: int, grace: float) -> None:
    """Stop process group ``pgid`` led by ``process``: SIGTERM, up to ``grace`` seconds for
    its members to exit (reaping ``process`` meanwhile), then SIGKILL."""
    if not _signal_group(pgid, signal.SIGTERM):
        return
    deadline = anyio.current_time() + grace
    while anyio.current_time() < deadline:
        if process.returncode is None:
            with anyio.move_on_after(0.02):
                await process.wait()
        else:
            await anyio.sleep(0.02)
        if not await anyio.to_thread.run_sync(_group_alive, pgid):
            return
    _signal_group(pgid, signal.SIGKILL)


async def _pump(stream: anyio.abc.ByteReceiveStream, tail: _Tail, done: anyio.Event) -> None:
    """Read ``stream`` to end of file into ``tail``, then set ``done``."""
    try:
        async for chunk in stream:
            tail.add(chunk)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        pass
    finally:
        done.set()


SECRET_NAME_PATTERNS: tuple[str, ...] = ("*_KEY", "*_TOKEN", "*_SECRET", "*PASSWORD*")
"""Environment variable names (shell-style, matched upper-cased) that look like credentials.
Provider keys (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``) match ``*_KEY``."""


def is_secret_name(name: str) -> bool:
    """True when the environment variable ``name`` looks like a credential
    (:data:`SECRET_NAME_PATTERNS`, case-insensitive)."""
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern) for pattern in SECRET_NAME_PATTERNS)


def tool_environment(base: Mapping[str, str], allow: Iterable[str] = ()) -> dict[str, str]:
    """The environment a tool process inherits from ``base`` (normally ``os.environ``): every
    variable except those that look like credentials (:func:`is_secret_name`), unless a name
    or shell-style pattern in ``allow`` (matched exactly, case-sensitive) lets it through.

    ``design/providers-and-tools.md`` ("Credentials") explains the rule.
    """
    allowed = tuple(allow)
    return {
        name: value
        for name, value in base.items()
        if not is_secret_name(name) or any(fnmatch.fnmatchcase(name, a) for a in allowed)
    }


class BashTool(Tool):
    """``bash``: run a command line with ``bash -c`` in the working directory.

    Args model: :class:`BashArgs` (``command``, ``timeout`` seconds, default 120).

    Args:
        allow_env: names or shell-style patterns of variables that look like credentials but
            may still reach the command (default none; see :func:`tool_environment`).

    The command runs in a new session and process group, with stdin from ``/dev/null`` and
    the environment ``os.environ`` without credentials (:func:`tool_environment`: ``*_KEY``,
    ``*_TOKEN``, ``*_SECRET``, ``*PASSWORD*`` are removed unless allowed) + ``ctx.env`` (given
    explicitly, kept whole) + ``DURABLE_HARNESS_IDEMPOTENCY_KEY``, ``DURABLE_HARNESS_RUN_ID``
    and ``DURABLE_HARNESS_TOOL_CALL_ID``. stdout and stderr are
    combined; the result keeps the last :data:`OUTPUT_CAP_BYTES` bytes. A non-zero exit
    appends ``"exit code N"`` and sets ``is_error`` (N is negative when a signal killed the
    shell). ``details``: ``{"exit_code", "timed_out", "output_bytes", "truncated"}``.

    Process lifetime: when the shell exits, processes still in its group are stopped
    (SIGTERM, grace, SIGKILL). On timeout the group is stopped the same way and the result
    is an error saying so, with the output captured until then. On cancellation the group
    gets SIGKILL and the shell is reaped (shielded) before the cancellation propagates.

    Error results: timeout, non-zero exit, ``bash`` or the working directory missing.
    """

    name: ClassVar[str] = "bash"
    description: ClassVar[str] = (
        "Run a bash command in the working directory and return its combined stdout and "
        "stderr (the last 256 KiB) and exit code. Commands are killed, with every process "
        "they started, after timeout seconds (default 120). Background processes do not "
        "outlive the command."
    )
    Args: ClassVar[type[BaseModel]] = BashArgs
    replay: ClassVar[Replay] = "never"

    default_timeout: ClassVar[float] = 120.0
    """Seconds allowed when ``args.timeout`` is not given."""

    def __init__(self, *, allow_env: Iterable[str] = ()) -> None:
        self.allow_env: tuple[str, ...] = tuple(allow_env)

    async def execute(self, args: Any, ctx: ToolContext) -> ToolResult:
        """Run ``args.command`` (see the class docstring).

        Raises:
            The backend's cancellation exception, re-raised after the process group has been
            killed, when the surrounding cancel scope is cancelled.
        """
        assert isinstance(args, BashArgs)
        timeout = args.timeout if args.timeout is not None else self.default_timeout
        env = {
            **tool_environment(os.environ, self.allow_env),
            **ctx.env,
            "DURABLE_HARNESS_IDEMPOTENCY_KEY": ctx.idempotency_key,
            "DURABLE_HARNESS_RUN_ID": ctx.run_id,
            "DURABLE_HARNESS_TOOL_CALL_ID": ctx.tool_call_id,
        }
        try:
            # Shielded: a cancel landing mid-spawn would make asyncio kill the shell alone and
            # leave its children running; unshielded, it lands below, where the group is killed.
            with anyio.CancelScope(shield=True):
                process = await anyio.open_process(
                    ["bash", "-c", args.command],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    cwd=ctx.cwd,
                    env=env,
                    start_new_session=True,
                )
        except OSError as exc:
            return ToolResult.text(
                f"cannot start bash in {ctx.cwd}: {exc.strerror or exc}",
                is_error=True,
                details={"error": "spawn_failed"},
            )
        pgid = process.pid  # start_new_session: the shell leads its own group
        if ctx.on_process is not None:
            ctx.on_process(pgid)
        tail = _Tail(OUTPUT_CAP_BYTES)
        finished = False
        try:
            timed_out = await self._run(process, pgid, tail, timeout)
            finished = True
        finally:
            if not finished:
                # Cancelled (abort) or failed: kill everything now, reap the shell, and let
                # the exception propagate.
                with anyio.CancelScope(shield=True):
                    _signal_group(pgid, signal.SIGKILL)
                    with anyio.move_on_after(_REAP_LIMIT_SECONDS):
                        await process.wait()
                    await self._close(process)
        await self._close(process)
        return self._result(process.returncode, timed_out, timeout, tail)

    @staticmethod
    async def _run(process: anyio.abc.Process, pgid: int, tail: _Tail, timeout: float) -> bool:
        """Wait for the shell and its output; return True when ``timeout`` (seconds) hit."""
        assert process.stdout is not None
        stdout = process.stdout
        eof = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_pump, stdout, tail, eof)
            with anyio.move_on_after(timeout) as deadline:
                await process.wait()
            # Either the shell exited (stop its leftovers) or time ran out (stop it all).
            await _stop_group(process, pgid, _TERM_GRACE_SECONDS)
            with anyio.move_on_after(_REAP_LIMIT_SECONDS):
                await process.wait()
            # The pipe closes once no process holds it; one that left the group might.
            with anyio.move_on_after(_DRAIN_GRACE_SECONDS):
                await eof.wait()
            tg.cancel_scope.cancel()
        return deadline.cancelled_caught

    @staticmethod
    async def _close(process: anyio.abc.Process) -> None:
        """Release the shell's pipe (shielded); never waits on a shell that is still running."""
        with anyio.CancelScope(shield=True):
            if process.returncode is not None:
                await process.aclose()  # closes streams and transports; the shell is reaped
            elif process.stdout is not None:
                await process.stdout.aclose()

    @staticmethod
    def _result(returncode: int | None, timed_out: bool, timeout: float, tail: _Tail) -> ToolResult:
        """Build the result from the exit status, the timeout flag and the output."""
        output = tail.text()
        details: dict[str, Any] = {
            "exit_code": returncode,
            "timed_out": timed_out,
            "output_bytes": tail.total,
            "truncated": tail.total > len(tail.buffer),
        }
        if timed_out:
            note = f"command timed out after {timeout:g} seconds; its process group was killed"
            text = f"{output.rstrip(chr(10))}\n{note}" if output else note
            return ToolResult.text(text, is_error=True, details=details)
        if returncode == 0:
            return ToolResult.text(output or "(no output)", details=details)
        status = f"exit code {returncode}"
        if returncode is not None and returncode < 0:
            try:
                status += f" (killed by {signal.Signals(-returncode).name})"
            except ValueError:
                pass
        text = f"{output.rstrip(chr(10))}\n{status}" if output else status
        return ToolResult.text(text, is_error=True, details=details)


# --------------------------------------------------------------------------------------------


async def _file_op(
    ctx: ToolContext, path: str, verb: str, body: Callable[[Path], ToolResult]
) -> ToolResult:
    """Resolve ``path`` inside ``ctx.cwd`` and run the blocking ``body(target)`` in a worker
    thread; a path escape or an :class:`OSError` becomes an error result naming the path."""
    try:
        target = resolve_path(ctx.cwd, path)
    except PathEscape as exc:
        return _escape_result(exc)
    try:
        return await anyio.to_thread.run_sync(body, target)
    except OSError as exc:
        return _os_error_result(verb, path, exc)


def builtin_tools(*, allow_env: Iterable[str] = ()) -> dict[str, Tool]:
    """Return one fresh instance of each built-in tool, keyed by tool name:
    ``read_file``, ``write_file``, ``edit_file``, ``append_file``, ``bash``.

    ``allow_env``: credential-like environment variables ``bash`` may still pass on
    (:class:`BashTool`)."""
    tools: list[Tool] = [
        ReadFileTool(),
        WriteFileTool(),
        EditFileTool(),
        AppendFileTool(),
        BashTool(allow_env=allow_env),
    ]
    return {tool.name: tool for tool in tools}
