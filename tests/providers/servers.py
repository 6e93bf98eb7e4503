"""A scripted, real local HTTP server speaking the OpenAI and Anthropic streaming wire formats.

The server binds ``127.0.0.1`` on a free port and runs ``http.server.ThreadingHTTPServer`` in a
daemon thread. Tests queue responses and point an SDK client at it::

    with FakeLLMServer() as srv:
        srv.queue(Turn(text="hi", usage={"input": 10, "output": 2}))
        srv.queue(StatusError(429, "slow down"))
        client = AsyncOpenAI(base_url=srv.openai_base_url, api_key="k", max_retries=0)
        ...
        assert srv.requests[0].body["model"] == "gpt-test"

Routes:

* ``POST /v1/chat/completions``: OpenAI chat completions. A :class:`Turn` is sent as SSE
  ``data: {chunk}`` lines ending with ``data: [DONE]``; the usage chunk (empty ``choices``) is
  sent only when the request asked for ``stream_options.include_usage``. Non-streaming requests
  get one ``chat.completion`` JSON object.
* ``POST /v1/messages``: Anthropic messages. A :class:`Turn` is sent as SSE events
  ``message_start``, ``content_block_start`` / ``content_block_delta`` (``thinking_delta``,
  ``signature_delta``, ``text_delta``, ``input_json_delta``) / ``content_block_stop``,
  ``message_delta`` (``stop_reason`` and output usage) and ``message_stop``, with a ``ping``.

Responses are consumed first-in first-out, whichever route asks. An empty queue answers HTTP 500
with ``"no scripted response"``. Every request is recorded in :attr:`FakeLLMServer.requests`
(method, path, lower-cased headers, parsed JSON body), including the ones answered with errors.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FakeLLMServer", "RecordedRequest", "StatusError", "ToolCallSpec", "Turn"]


@dataclass(frozen=True)
class ToolCallSpec:
    """A tool call the scripted model makes: ``id``, ``name`` and ``arguments`` (a JSON object).

    ``arguments`` may also be a raw string, sent as-is (to script invalid JSON).
    """

    id: str
    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)


@dataclass(frozen=True)
class Turn:
    """One successful streamed answer.

    Attributes:
        text: answer text; streamed in pieces of ``chunk_size`` characters (no text block when
            empty).
        tool_calls: tool calls made after the text; arguments are streamed in two pieces.
        usage: token counts ``{"input", "output", "cacheRead", "cacheWrite"}`` (missing = 0),
            mapped to each wire format (OpenAI ``prompt_tokens`` includes cached tokens).
        thinking: reasoning text (Anthropic ``thinking`` block with ``signature``; OpenAI-style
            ``reasoning_content`` deltas).
        signature: the Anthropic thinking block's signature.
        stop_reason: override of the wire stop/finish reason (default: derived from tool calls).
        chunk_size: characters per text delta.
        drop_after: close the connection abruptly after this many SSE events (mid-stream failure:
            the chunked body never ends).
        end_after: end the stream cleanly (a well-formed end of the body, no ``[DONE]``) after
            this many SSE events; negative counts from the end (``-1``: all but the last).
        reset_after: reset the connection (TCP RST: ``SO_LINGER`` 0, then close) after this
            many SSE events.
        error_after: send a mid-stream error event after this many SSE events and stop.
        error: the mid-stream error object (``{"type", "message"}``) sent with ``error_after``.
        delay: seconds to stall before answering (or after ``delay_after`` SSE events), to
            script timeouts.
        delay_after: when set, stall after this many SSE events instead of before the headers.
    """

    text: str = ""
    tool_calls: list[ToolCallSpec] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)
    thinking: str = ""
    signature: str = "sig-1"
    stop_reason: str | None = None
    chunk_size: int = 4
    drop_after: int | None = None
    end_after: int | None = None
    reset_after: int | None = None
    error_after: int | None = None
    error: dict[str, Any] = field(
        default_factory=lambda: {"type": "overloaded_error", "message": "Overloaded"}
    )
    delay: float = 0.0
    delay_after: int | None = None


@dataclass(frozen=True)
class StatusError:
    """An HTTP error answer.

    Attributes:
        status: HTTP status code (e.g. 429, 400, 500, 529).
        message: error message placed in the wire-format error body.
        error_type: the error ``type`` field (default derived from ``status``).
        headers: extra response headers (e.g. ``{"retry-after": "2"}``).
        body: a raw JSON body to send instead of the wire-format one.
    """

    status: int
    message: str = "error"
    error_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None


@dataclass(frozen=True)
class RecordedRequest:
    """A request the server received: ``method``, ``path``, lower-cased ``headers``, JSON ``body``.

    ``body`` is ``None`` when the request had no body or it was not JSON.
    """

    method: str
    path: str
    headers: dict[str, str]
    body: Any


Response = Turn | StatusError

_OPENAI_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_exceeded",
}
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


class _Drop(Exception):
    """Raised inside the handler to abort the connection without a proper ending."""


class _Reset(Exception):
    """Raised inside the handler once the connection was reset (nothing more to do with it)."""


def _cut(turn: Turn, n: int, total: int) -> bool:
    """True when ``turn`` ends its stream cleanly before SSE event ``n`` of ``total``."""
    if turn.end_after is None:
        return False
    return n >= (turn.end_after if turn.end_after >= 0 else total + turn.end_after)


class FakeLLMServer:
    """The scripted server (see the module docstring).

    Use as a context manager, or call :meth:`start` and :meth:`stop`. Thread-safe: the queue and
    the request log are guarded by a lock.

    Attributes:
        requests: every request received, in arrival order.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._responses: deque[Response] = deque()
        self.requests: list[RecordedRequest] = []
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> FakeLLMServer:
        """Bind ``127.0.0.1:0`` and serve in a daemon thread; return ``self``."""
        server = self

        class Handler(_Handler):
            owner = server

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        httpd.daemon_threads = True
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket (idempotent)."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses ---------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound TCP port."""
        if self._httpd is None:
            raise RuntimeError("server not started")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` (the Anthropic SDK's ``base_url``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1`` (the OpenAI SDK's ``base_url``)."""
        return f"{self.base_url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """Same as :attr:`base_url`; the Anthropic SDK appends ``/v1/messages`` itself."""
        return self.base_url

    # -- scripting -----------------------------------------------------------------------------

    def queue(self, *responses: Response) -> None:
        """Append responses to the script, answered in order."""
        with self._lock:
            self._responses.extend(responses)

    @property
    def pending(self) -> int:
        """How many queued responses have not been served yet."""
        with self._lock:
            return len(self._responses)

    @property
    def last_request(self) -> RecordedRequest:
        """The most recent request (``IndexError`` when none arrived)."""
        with self._lock:
            return self.requests[-1]

    def _next(self, request: RecordedRequest) -> Response:
        with self._lock:
            self.requests.append(request)
            if self._responses:
                return self._responses.popleft()
        return StatusError(500, "no scripted response", error_type="api_error")


class _Handler(BaseHTTPRequestHandler):
    owner: FakeLLMServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output quiet."""

    def handle(self) -> None:
        """Serve keep-alive requests; a client resetting the connection is not an error, nor
        is a flush after the server has closed the socket under a handler (``ValueError``:
        I/O on a closed file, at the server's shutdown)."""
        try:
            super().handle()
        except (ConnectionResetError, BrokenPipeError, TimeoutError):
            self.close_connection = True
        except ValueError:
            if not self.wfile.closed:
                raise  # a fault of the handler's own, not the closed socket
            self.close_connection = True

    # -- plumbing ------------------------------------------------------------------------------

    def _read_body(self) -> Any:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return None

    def _send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _start_sse(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_sse(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _stall(self, turn: Turn, n: int | None) -> None:
        if turn.delay and turn.delay_after == n:
            time.sleep(turn.delay)

    def _drop(self) -> None:
        self.close_connection = True
        self.wfile.flush()
        raise _Drop

    def _faults(self, turn: Turn, n: int, total: int) -> bool:
        """Apply ``turn``'s scripted fault before SSE event ``n``: stall, drop or reset the
        connection (raising :class:`_Drop`), or end the body cleanly (returning ``True``)."""
        self._stall(turn, n)
        if turn.drop_after is not None and n >= turn.drop_after:
            self._drop()
        if turn.reset_after is not None and n >= turn.reset_after:
            self.close_connection = True
            self.wfile.flush()
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            # the socket closes for real once its file objects are closed too: with a zero
            # linger, that sends an RST, not a FIN
            self.rfile.close()
            self.wfile.close()
            self.connection.close()
            raise _Reset
        if _cut(turn, n, total):
            self._end_sse()
            return True
        return False

    # -- dispatch ------------------------------------------------------------------------------

    def do_POST(self) -> None:
        """Record the request and answer from the script."""
        body = self._read_body()
        path = self.path.split("?", 1)[0]
        headers = {k.lower(): v for k, v in self.headers.items()}
        response = self.owner._next(RecordedRequest("POST", self.path, headers, body))
        body = body if isinstance(body, dict) else {}
        try:
            if path.endswith("/chat/completions"):
                self._openai(response, body)
            elif path.endswith("/messages"):
                self._anthropic(response, body)
            else:
                self._send_json(404, {"error": {"message": f"no route {path}"}})
        except _Reset:
            self.close_connection = True
        except _Drop:
            self.close_connection = True
            try:
                self.connection.shutdown(2)
            except OSError:
                pass
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -- OpenAI --------------------------------------------------------------------------------

    def _openai(self, response: Response, req: dict[str, Any]) -> None:
        if isinstance(response, StatusError):
            body = response.body
            if body is None:
                etype = response.error_type or _OPENAI_ERROR_TYPES.get(
                    response.status, "server_error"
                )
                body = {
                    "error": {
                        "message": response.message,
                        "type": etype,
                        "code": None,
                        "param": None,
                    }
                }
            self._send_json(response.status, body, response.headers)
            return
        model = str(req.get("model", "gpt-test"))
        turn = response
        usage = _openai_usage(turn.usage)
        finish = turn.stop_reason or ("tool_calls" if turn.tool_calls else "stop")
        base = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }
        if not req.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": turn.text or None}
            if turn.tool_calls:
                message["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": _args_json(c)},
                    }
                    for c in turn.tool_calls
                ]
            self._send_json(
                200,
                {
                    **base,
                    "object": "chat.completion",
                    "usage": usage,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                },
            )
            return

        def choice(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {
                **base,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }

        chunks: list[dict[str, Any]] = [choice({"role": "assistant", "content": ""})]
        for piece in _pieces(turn.thinking, turn.chunk_size):
            chunks.append(choice({"reasoning_content": piece}))
        for piece in _pieces(turn.text, turn.chunk_size):
            chunks.append(choice({"content": piece}))
        for i, call in enumerate(turn.tool_calls):
            args = _args_json(call)
            half = len(args) // 2
            chunks.append(
                choice(
                    {
                        "tool_calls": [
                            {
                                "index": i,
                                "id": call.id,
                                "type": "function",
                                "function": {"name": call.name, "arguments": ""},
                            }
                        ]
                    }
                )
            )
            for part in (args[:half], args[half:]):
                if part:
                    chunks.append(
                        choice({"tool_calls": [{"index": i, "function": {"arguments": part}}]})
                    )
        chunks.append(choice({}, finish))
        options = req.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            chunks.append({**base, "choices": [], "usage": usage})

        self._stall(turn, None)
        self._start_sse()
        for n, chunk in enumerate(chunks):
            if self._faults(turn, n, len(chunks)):
                return
            if turn.error_after is not None and n >= turn.error_after:
                self._chunk(f"data: {json.dumps({'error': turn.error})}\n\n".encode())
                self._end_sse()
                return
            self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())
        self._chunk(b"data: [DONE]\n\n")
        self._end_sse()

    # -- Anthropic -----------------------------------------------------------------------------

    def _anthropic(self, response: Response, req: dict[str, Any]) -> None:
        if isinstance(response, StatusError):
            body = response.body
            if body is None:
                etype = response.error_type or _ANTHROPIC_ERROR_TYPES.get(
                    response.status, "api_error"
                )
                body = {"type": "error", "error": {"type": etype, "message": response.message}}
            self._send_json(response.status, body, response.headers)
            return
        model = str(req.get("model", "claude-test"))
        turn = response
        u = turn.usage
        stop = turn.stop_reason or ("tool_use" if turn.tool_calls else "end_turn")
        start_usage = {
            "input_tokens": u.get("input", 0),
            "output_tokens": 1,
            "cache_read_input_tokens": u.get("cacheRead", 0),
            "cache_creation_input_tokens": u.get("cacheWrite", 0),
        }
        events: list[tuple[str, dict[str, Any]]] = [
            (
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_1",
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": start_usage,
                    },
                },
            ),
            ("ping", {"type": "ping"}),
        ]
        index = 0

        def block(start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
            nonlocal index
            events.append(
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": start},
                )
            )
            for delta in deltas:
                events.append(
                    (
                        "content_block_delta",
                        {"type": "content_block_delta", "index": index, "delta": delta},
                    )
                )
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
            index += 1

        if turn.thinking:
            block(
                {"type": "thinking", "thinking": "", "signature": ""},
                [
                    {"type": "thinking_delta", "thinking": p}
                    for p in _pieces(turn.thinking, turn.chunk_size)
                ]
                + [{"type": "signature_delta", "signature": turn.signature}],
            )
        if turn.text:
            block(
                {"type": "text", "text": ""},
                [{"type": "text_delta", "text": p} for p in _pieces(turn.text, turn.chunk_size)],
            )
        for call in turn.tool_calls:
            args = _args_json(call)
            half = len(args) // 2
            block(
                {"type": "tool_use", "id": call.id, "name": call.name, "input": {}},
                [
                    {"type": "input_json_delta", "partial_json": part}
                    for part in (args[:half], args[half:])
                ],
            )
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": u.get("output", 0)},
                },
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))

        if not req.get("stream"):
            self._send_json(200, _anthropic_message(model, turn, stop))
            return
        self._stall(turn, None)
        self._start_sse()
        for n, (name, data) in enumerate(events):
            if self._faults(turn, n, len(events)):
                return
            if turn.error_after is not None and n >= turn.error_after:
                err = {"type": "error", "error": turn.error}
                self._chunk(f"event: error\ndata: {json.dumps(err)}\n\n".encode())
                self._end_sse()
                return
            self._chunk(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        self._end_sse()


def _pieces(text: str, size: int) -> list[str]:
    size = max(size, 1)
    return [text[i : i + size] for i in range(0, len(text), size)]


def _args_json(call: ToolCallSpec) -> str:
    return call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)


def _openai_usage(u: dict[str, int]) -> dict[str, Any]:
    cached = u.get("cacheRead", 0)
    written = u.get("cacheWrite", 0)
    prompt = u.get("input", 0) + cached + written
    out = u.get("output", 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": out,
        "total_tokens": prompt + out,
        "prompt_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
    }


def _anthropic_message(model: str, turn: Turn, stop: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if turn.thinking:
        content.append({"type": "thinking", "thinking": turn.thinking, "signature": turn.signature})
    if turn.text:
        content.append({"type": "text", "text": turn.text})
    for call in turn.tool_calls:
        content.append(
            {
                "type": "tool_use",
                "id": call.id,
                "name": call.name,
                "input": json.loads(_args_json(call)),
            }
        )
    u = turn.usage
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": u.get("input", 0),
            "output_tokens": u.get("output", 0),
            "cache_read_input_tokens": u.get("cacheRead", 0),
            "cache_creation_input_tokens": u.get("cacheWrite", 0),
        },
    }
