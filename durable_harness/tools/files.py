"""The built-in file tools: ``read_file``, ``write_file``, ``edit_file``, ``append_file``.

Every path argument is resolved with :func:`~durable_harness.fs.resolve_path`, so it
must stay inside the session's working directory (``ToolContext.cwd``); a path that escapes,
directly or through a symlink, yields an ``is_error`` result naming the path, never an
exception. Other expected failures (a missing file, a directory, a parent that is a file,
permission denied, a full disk, text not found) are ``is_error`` results too, so the model can
see and correct them.

Durability: ``write_file`` and ``edit_file`` replace the target atomically
(:func:`~durable_harness.fs.atomic_write`), so after a crash the file holds either the
old or the new content, which is what lets their ``reconcile`` decide an in-doubt call from the
file alone. ``append_file`` cannot be told apart from the outside and offers no ``reconcile``.

File I/O runs in worker threads (:func:`anyio.to_thread.run_sync`), so the tools work on both
asyncio and trio.
"""

from __future__ import annotations

import errno
import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.to_thread
from pydantic import BaseModel, Field

from durable_harness.errors import PathEscape
from durable_harness.fs import append_durably, atomic_write, read_bytes_or_none, resolve_path
from durable_harness.tools.base import (
    OUTPUT_CAP_BYTES,
    Replay,
    StrictArgs,
    Tool,
    ToolContext,
    ToolResult,
)


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


def _content_result(text: str, target: Path, data: bytes, reconciled: bool) -> ToolResult:
    """The success result of a write or edit that left ``data`` (bytes) in ``target``:
    ``details`` ``{"path": absolute path, "bytes", "sha256": hex digest}``, plus
    ``"reconciled": True`` when ``reconcile`` established it from the file."""
    details: dict[str, Any] = {
        "path": str(target),
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    if reconciled:
        details["reconciled"] = True
    return ToolResult.text(text, details=details)


async def _current_content(ctx: ToolContext, path: str) -> tuple[Path, bytes] | None:
    """For ``reconcile``: the resolved ``path`` and the file's current bytes, or ``None`` when
    the path now escapes the working directory or the file cannot be read."""
    try:
        target = resolve_path(ctx.cwd, path)
    except PathEscape:
        return None
    current = await anyio.to_thread.run_sync(read_bytes_or_none, target)
    return None if current is None else (target, current)


def _cut_utf8(data: bytes, limit: int) -> bytes:
    """Return the longest prefix of ``data`` of at most ``limit`` bytes not splitting a
    UTF-8 character."""
    if len(data) <= limit:
        return data
    end = limit
    while end > 0 and (data[end] & 0xC0) == 0x80:
        end -= 1
    return data[:end]


class _FileTool(Tool):
    """A file tool: :meth:`execute` resolves ``args.path`` inside ``ctx.cwd`` and runs the
    blocking :meth:`apply` in a worker thread; a path escape or an :class:`OSError` becomes an
    error result naming the path (``"<verb> <path>: ..."``)."""

    verb: ClassVar[str]

    def __init_subclass__(
        cls,
        *,
        name: str | None = None,
        args: type[BaseModel] | None = None,
        verb: str | None = None,
        replay: Replay | None = None,
    ) -> None:
        """Declare a file tool: its ``name``, argument model, ``replay`` and the ``verb`` its
        error results start with; a subclass of a built-in tool that names none of them keeps
        its parent's (or what its own body sets)."""
        super().__init_subclass__()
        given = {"name": name, "Args": args, "verb": verb, "replay": replay}
        for attr, value in given.items():
            if value is not None:
                setattr(cls, attr, value)

    def apply(self, target: Path, args: Any) -> ToolResult:
        """The effect on ``target`` (blocking). Raises :class:`OSError` on I/O failure."""
        raise NotImplementedError

    async def execute(self, args: Any, ctx: ToolContext) -> ToolResult:
        """Resolve the path and apply the tool (see the class docstring)."""
        try:
            target = resolve_path(ctx.cwd, args.path)
        except PathEscape as exc:
            return _escape_result(exc)
        try:
            return await anyio.to_thread.run_sync(self.apply, target, args)
        except OSError as exc:
            return _os_error_result(self.verb, args.path, exc)


# --------------------------------------------------------------------------------------------
# read_file


class ReadFileArgs(StrictArgs):
    """Arguments of ``read_file``."""

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


class ReadFileTool(
    _FileTool, name="read_file", args=ReadFileArgs, verb="cannot read", replay="safe"
):
    """``read_file``: return a file's text, optionally a window of lines.

    Args model: :class:`ReadFileArgs` (``path``, ``offset`` 1-based line, ``limit`` lines).
    The file is decoded as UTF-8 with invalid bytes replaced. The output holds whole lines and
    at most :data:`OUTPUT_CAP_BYTES` bytes; when it is cut, a note at the end gives the
    ``offset`` to continue from. ``details``: ``{"path", "offset", "lines", "total_lines",
    "truncated"}``.
    Also an error result: ``offset`` past the end of a non-empty file.
    """

    description = (
        "Read a text file inside the working directory. Optionally give offset (1-based first "
        "line) and limit (number of lines) to read a window of a large file. Output is capped "
        "at 256 KiB; a note says where to continue."
    )

    def apply(self, target: Path, args: Any) -> ToolResult:
        with open(target, encoding="utf-8", errors="replace", newline="") as handle:
            return read_window(handle, args, target)


def read_window(lines: Iterable[str], args: ReadFileArgs, target: Path) -> ToolResult:
    """``read_file``'s result over a file's lines (line ends kept), wherever they were read
    (here, or through an ACP client): the window ``args`` asks for, whole lines and at most
    :data:`OUTPUT_CAP_BYTES` bytes (a single line over the cap gives its head), with a note
    when cut saying where to continue; an error result for an ``offset`` past the end."""
    first = args.offset or 1
    chunks: list[str] = []
    used = 0
    shown = 0
    total = 0
    truncated = False
    for number, line in enumerate(lines, start=1):
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
            f"cannot read {args.path}: offset {first} is past the end of the file ({total} lines)",
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


class WriteFileArgs(StrictArgs):
    """Arguments of ``write_file``."""

    path: str = Field(
        description="Path of the file to write, relative to the working "
        "directory; missing parent directories are created."
    )
    content: str = Field(
        description="The complete new content of the file (UTF-8 text); "
        "an existing file is replaced."
    )


class WriteFileTool(_FileTool, name="write_file", args=WriteFileArgs, verb="cannot write"):
    """``write_file``: create or replace a file atomically.

    Args model: :class:`WriteFileArgs` (``path``, ``content``). Result text
    ``"wrote N bytes to PATH"`` (N = UTF-8 bytes of ``content``); ``details``:
    ``{"path": absolute path, "bytes": N, "sha256": hex digest}``.
    """

    description = (
        "Create or overwrite a file inside the working directory with the given content. "
        "Parent directories are created. The write is atomic."
    )

    def apply(self, target: Path, args: Any) -> ToolResult:
        data = args.content.encode("utf-8")
        atomic_write(target, data)
        return self._success(args.path, target, data, reconciled=False)

    async def reconcile(self, args: Any, ctx: ToolContext) -> ToolResult | None:
        """Decide an in-doubt ``write_file`` from the file.

        Returns the success result (``details["reconciled"] = True``) when the file exists
        and holds exactly the intended content; ``None`` otherwise (it may never have been
        written, or been overwritten since), including when the path now escapes.
        """
        assert isinstance(args, WriteFileArgs)
        data = args.content.encode("utf-8")
        found = await _current_content(ctx, args.path)
        if found is None or found[1] != data:
            return None
        return self._success(args.path, found[0], data, reconciled=True)

    @staticmethod
    def _success(path: str, target: Path, data: bytes, *, reconciled: bool) -> ToolResult:
        """Build the success result for writing ``data`` to ``target``."""
        return _content_result(f"wrote {len(data)} bytes to {path}", target, data, reconciled)


# --------------------------------------------------------------------------------------------
# edit_file


class EditFileArgs(StrictArgs):
    """Arguments of ``edit_file``."""

    path: str = Field(
        description="Path of an existing text file, relative to the working directory."
    )
    old_text: str = Field(
        min_length=1,
        description="Exact text to replace; it must occur exactly once in "
        "the file (include surrounding lines to make it unique).",
    )
    new_text: str = Field(description="Text that replaces old_text.")


class EditFileTool(_FileTool, name="edit_file", args=EditFileArgs, verb="cannot edit"):
    """``edit_file``: replace the single occurrence of ``old_text`` with ``new_text``.

    Args model: :class:`EditFileArgs` (``path``, ``old_text``, ``new_text``). The file is
    rewritten atomically like ``write_file``. Result text ``"edited PATH: replaced 1
    occurrence (N bytes)"``; ``details``: ``{"path", "bytes", "sha256"}`` of the new content.
    Also error results: a file not UTF-8, ``old_text`` absent or occurring more than once
    (the count is given).
    """

    description = (
        "Edit a text file inside the working directory by replacing old_text, which must "
        "occur exactly once, with new_text. The write is atomic."
    )

    def apply(self, target: Path, args: Any) -> ToolResult:
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
        atomic_write(target, data)
        return self._success(args.path, target, data, reconciled=False)

    async def reconcile(self, args: Any, ctx: ToolContext) -> ToolResult | None:
        """Decide an in-doubt ``edit_file`` from the file.

        Returns the success result (``details["reconciled"] = True``, size and digest of the
        current file) when the file contains ``new_text`` and no longer contains
        ``old_text``; ``None`` otherwise, including when the file is missing, not UTF-8, or
        the path now escapes.
        """
        assert isinstance(args, EditFileArgs)
        found = await _current_content(ctx, args.path)
        if found is None:
            return None
        target, raw = found
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
        text = f"edited {path}: replaced 1 occurrence ({len(data)} bytes)"
        return _content_result(text, target, data, reconciled)


# --------------------------------------------------------------------------------------------
# append_file


class AppendFileArgs(StrictArgs):
    """Arguments of ``append_file``."""

    path: str = Field(
        description="Path of the file to append to, relative to the working "
        "directory; created (with parents) if missing."
    )
    content: str = Field(description="Text (UTF-8) to add at the end of the file.")


class AppendFileTool(_FileTool, name="append_file", args=AppendFileArgs, verb="cannot append to"):
    """``append_file``: add text at the end of a file (``O_APPEND``, then ``fsync``).

    Args model: :class:`AppendFileArgs` (``path``, ``content``). Result text
    ``"appended N bytes to PATH"`` (N = UTF-8 bytes); ``details``: ``{"path", "bytes"}``.
    No ``reconcile``: whether an append happened cannot be told from the file alone.
    """

    description = (
        "Append text to the end of a file inside the working directory, creating the file "
        "(and parent directories) if needed."
    )

    def apply(self, target: Path, args: Any) -> ToolResult:
        data = args.content.encode("utf-8")
        append_durably(target, data)
        return ToolResult.text(
            f"appended {len(data)} bytes to {args.path}",
            details={"path": str(target), "bytes": len(data)},
        )
