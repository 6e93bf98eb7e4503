"""Newline-delimited JSON-RPC over stdio that answers malformed input (``design/acp.md``,
"Errors", "Bounds" and "Lifetime"): the SDK's transport drops a line it cannot parse without a
word, and one that parses to no message object stops its receive loop."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
from typing import Any

from acp._transport import NdjsonTransport
from acp.task import MessageSender, TaskSupervisor

log = logging.getLogger(__name__)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600

MAX_LINE_BYTES = 16 << 20
"""The longest line (one JSON-RPC message) taken, in bytes (16 MiB)."""
READ_CHUNK_BYTES = 1 << 20
"""The reader's buffer limit: an over-long line is consumed (and dropped) in such pieces."""
MAX_ECHO_CHARS, MAX_ECHO_ITEMS, MAX_ECHO_DEPTH = 200, 20, 6
"""The longest string, most items, deepest nesting an error's ``data`` carries."""
MAX_ERROR_MESSAGE_CHARS = 2000
"""The longest ``message`` an error carries (a library message quotes the input it refuses)."""


def clip_error_data(value: Any, depth: int = 0) -> Any:
    """``value`` (an error's ``data``) cut to the ``MAX_ECHO_*`` bounds, each cut said in the
    text; anything that is not JSON becomes its (cut) ``str``."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        if len(value) <= MAX_ECHO_CHARS:
            return value
        return f"{value[:MAX_ECHO_CHARS]}... ({len(value)} characters in all)"
    if isinstance(value, (list, tuple, dict)) and depth >= MAX_ECHO_DEPTH:
        return f"(a {type(value).__name__} nested too deeply to show)"
    if isinstance(value, (list, tuple)):
        items = [clip_error_data(v, depth + 1) for v in value[:MAX_ECHO_ITEMS]]
        if len(value) > MAX_ECHO_ITEMS:
            items.append(f"... ({len(value)} items in all)")
        return items
    if isinstance(value, dict):
        out = {
            str(k)[:MAX_ECHO_CHARS]: clip_error_data(v, depth + 1)
            for k, v in list(value.items())[:MAX_ECHO_ITEMS]
        }
        if len(value) > MAX_ECHO_ITEMS:
            out["..."] = f"{len(value)} keys in all"
        return out
    return clip_error_data(str(value), depth)


def check_message(message: Any) -> tuple[str, Any] | None:
    """Why ``message`` (parsed JSON) is not a JSON-RPC message, as ``(reason, id to answer
    with)``; ``None`` when it is one."""
    if not isinstance(message, dict):
        if isinstance(message, list):
            return "the message is an array (batches are not supported)", None
        return "the message is not a JSON object", None
    mid = message.get("id")
    usable_id = mid if isinstance(mid, (str, int)) and not isinstance(mid, bool) else None
    if "id" in message and mid is not None and usable_id is None:
        return "the message id must be a string, a number or null", None
    if "method" in message:
        if not isinstance(message["method"], str):
            return "the method must be a string", usable_id
        params = message.get("params")
        if params is not None and not isinstance(params, (dict, list)):
            return "params must be an object or an array", usable_id
        return None
    if "id" in message and ("result" in message or "error" in message):
        return None
    return "the message has no method and is not a response", usable_id


class _Output(asyncio.Protocol):
    """The write side's protocol: flow control for ``StreamWriter.drain``, and ``on_lost``."""

    def __init__(self, on_lost: Any) -> None:
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._on_lost = on_lost

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.resume_writing()
        self._on_lost(exc)

    async def _drain_helper(self) -> None:  # what asyncio.StreamWriter.drain awaits
        if self._paused:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter


class _FileOutput(asyncio.WriteTransport):
    """Writes to a regular file (``acp > file``) at once: asyncio's pipe transport refuses one."""

    def __init__(self, fd: int, protocol: _Output) -> None:
        super().__init__()
        self._fd = fd
        self._protocol = protocol
        self._closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            self._closing = True
            self._protocol.connection_lost(exc)

    def can_write_eof(self) -> bool:
        return False

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            os.close(self._fd)
            self._protocol.connection_lost(None)

    def abort(self) -> None:
        self.close()


class StdioTransport(NdjsonTransport):
    """The SDK's NDJSON transport over stdin and stdout that answers malformed lines, knows when
    the client stopped reading (:attr:`output_lost`) and which requests are unanswered."""

    def __init__(self, reader: asyncio.StreamReader, sender: MessageSender) -> None:
        super().__init__(reader, sender)
        self.output_lost = False  # stdout broken (EPIPE, or the client closed its end)
        self.input_transport: asyncio.ReadTransport | None = None
        self._closing = False
        self._dropped = 0
        self._unanswered: set[str | int] = set()
        self._all_answered = asyncio.Event()
        self._all_answered.set()

    def lose_output(self, exc: Exception | None) -> None:
        """Stdout is gone: stop reading stdin too, so that the agent sees the end of input."""
        if self.output_lost:
            return
        self.output_lost = True
        self._all_answered.set()  # nothing more can be answered
        if exc is not None or not self._closing:  # an EPIPE is said, even while closing
            log.warning("the client closed stdout (%s)", exc or "its end closed")
        if self.input_transport is not None and not self.input_transport.is_closing():
            self.input_transport.close()

    async def receive(self) -> dict[str, Any] | None:
        """The next well-formed message (a request kept until answered); ``None`` at the end."""
        while True:
            line, size = await self._read_bounded()
            if size > MAX_LINE_BYTES:
                details = f"the line is {size} bytes, over the limit of {MAX_LINE_BYTES}; discarded"
                await self._refuse(INVALID_REQUEST, "Invalid request", details, None)
                continue
            if not line:
                return None
            line = line.strip()
            if not line:
                continue
            try:
                message = json.loads(line)
            except ValueError as exc:
                await self._refuse(PARSE_ERROR, "Parse error", f"not JSON: {exc}", None)
                continue
            except RecursionError:
                details = "the JSON is nested too deeply to parse"
                await self._refuse(PARSE_ERROR, "Parse error", details, None)
                continue
            problem = check_message(message)
            if problem is None:
                assert isinstance(message, dict)
                mid = message.get("id")
                if "method" in message and isinstance(mid, (str, int)):
                    self._unanswered.add(mid)
                    self._all_answered.clear()
                return message
            await self._refuse(INVALID_REQUEST, "Invalid request", *problem)

    async def _read_bounded(self) -> tuple[bytes, int]:
        """The next line and its size in bytes (``b""``: end of input, or a line too long)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            done = True
            try:
                piece = await self._wait_for_reader(self._reader.readuntil(b"\n"))
            except asyncio.LimitOverrunError as exc:
                piece = await self._wait_for_reader(self._reader.readexactly(exc.consumed))
                done = False
            except asyncio.IncompleteReadError as exc:
                piece = exc.partial
            size += len(piece)
            if size <= MAX_LINE_BYTES:
                chunks.append(piece)
            else:
                chunks.clear()
            if done:
                return b"".join(chunks), size

    async def _refuse(self, code: int, message: str, details: str, mid: Any) -> None:
        log.warning("refused a malformed JSON-RPC message: %s", details)
        error = {"code": code, "message": f"{message}: {details}", "data": {"details": details}}
        await self.send({"jsonrpc": "2.0", "id": mid, "error": error})

    async def send(self, message: dict[str, Any]) -> None:
        """Send ``message`` (an error's ``data`` cut first: :func:`clip_error_data`), or drop it
        once stdout is broken (logged: each answer, and the first other message)."""
        answers = "method" not in message and message.get("id") in self._unanswered
        if self.output_lost:
            self._dropped += 1
            if answers:
                log.warning(
                    "stdout is closed: the answer to request %s cannot be sent", message["id"]
                )
            elif self._dropped == 1:
                log.warning("stdout is closed: messages to the client are dropped")
        else:
            error = message.get("error")
            if isinstance(error, dict) and "data" in error:
                error = {**error, "data": clip_error_data(error["data"])}
                text = error.get("message")
                if isinstance(text, str) and len(text) > MAX_ERROR_MESSAGE_CHARS:
                    error["message"] = text[:MAX_ERROR_MESSAGE_CHARS] + "..."
                message = {**message, "error": error}
            await super().send(message)
        if answers:
            self._unanswered.discard(message["id"])
            if not self._unanswered:
                self._all_answered.set()

    async def answered(self, limit: float) -> bool:
        """Whether every request got its answer (or stdout was lost) within ``limit`` seconds."""
        try:
            await asyncio.wait_for(self._all_answered.wait(), limit)
        except TimeoutError:
            pass
        return not self._unanswered

    async def close(self) -> None:
        """Close stdout (after what is queued) and stop reading stdin."""
        await asyncio.sleep(0)  # a write that just failed reports it first (call_soon)
        self._closing = True
        if self.input_transport is not None and not self.input_transport.is_closing():
            self.input_transport.close()
        await super().close()


async def stdio_transport() -> tuple[StdioTransport, TaskSupervisor]:
    """The checked transport over stdin and stdout (a pipe, socket, terminal or regular file)
    and the supervisor of its writer task (shut it down when done)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=READ_CHUNK_BYTES)
    supervisor = TaskSupervisor(source="durable_harness.acp.transport")
    box: list[StdioTransport] = []
    protocol = _Output(lambda exc: box[0].lose_output(exc) if box else None)
    out_fd = os.dup(1)
    write_transport: asyncio.WriteTransport
    if stat.S_ISREG(os.fstat(out_fd).st_mode):
        write_transport = _FileOutput(out_fd, protocol)
    else:
        out = os.fdopen(out_fd, "wb", buffering=0)
        write_transport, _ = await loop.connect_write_pipe(lambda: protocol, out)
    writer = asyncio.StreamWriter(write_transport, protocol, None, loop)
    transport = StdioTransport(reader, MessageSender(writer, supervisor))
    box.append(transport)
    stdin = os.fdopen(os.dup(0), "rb", buffering=0)
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), stdin
    )
    transport.input_transport = read_transport
    return transport, supervisor


__all__ = [
    "MAX_LINE_BYTES",
    "StdioTransport",
    "check_message",
    "clip_error_data",
    "stdio_transport",
]
