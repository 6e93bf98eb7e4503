"""ASGI middleware in front of every route: the Host check of a tokenless loopback server,
the bearer token and the body limit (``design/http.md``).

Each answers before the application reads anything: a request without the right token, or
with a body over the limit, is refused with the API's JSON error body and never reaches a
route, so nothing is parsed and nothing changes on disk.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from durable_harness.errors import MessageTooLarge, encodable


async def _reply(send: Send, status: int, code: str, message: str, **details: Any) -> None:
    body = orjson.dumps(encodable({"code": code, "message": message, **details}))
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if status == 413:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


LOOPBACK_HOST_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
"""The ``Host`` header values (any port) a tokenless loopback server answers."""


def host_name(header: bytes) -> str:
    """The host of a ``Host`` header value without its port, lower-cased: ``[::1]:8080`` ->
    ``[::1]``, ``LocalHost:80`` -> ``localhost``; ``""`` for an empty or undecodable one."""
    try:
        text = header.decode("ascii").strip().lower()
    except UnicodeDecodeError:
        return ""
    if text.startswith("["):
        end = text.find("]")
        return text[: end + 1] if end > 0 else ""
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


def _header(scope: Scope, name: bytes) -> bytes:
    """The first value of header ``name`` (lower case) in an ASGI ``scope``, or ``b""``."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return b""


class LoopbackHosts:
    """Refuse every request whose ``Host`` is not one of :data:`LOOPBACK_HOST_NAMES` (any
    port) with 400 ``host_not_allowed``, a missing ``Host`` included.

    For a server without a token on a loopback address: there, any local program may call
    it, but a web page must not. A DNS-rebinding page (``evil.example`` re-pointed at
    127.0.0.1) sends its own name as ``Host``, so checking it keeps the page from reading
    the API or the console's CSRF token (``design/http.md``, "Security")."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        given = _header(scope, b"host")
        if host_name(given) in LOOPBACK_HOST_NAMES:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        shown = given[:200].decode("ascii", "backslashreplace")
        await _reply(
            send,
            400,
            "host_not_allowed",
            f"Host {shown!r} is not allowed: this server has no token and answers only "
            "localhost, 127.0.0.1 and [::1]",
            host=shown,
        )


class BearerAuth:
    """Refuse every HTTP request whose ``Authorization`` is not ``Bearer <token>``
    (401 ``unauthorized``); the comparison is :func:`hmac.compare_digest` (constant time).
    With ``token=None`` every request passes (a loopback server started without one)."""

    def __init__(
        self, app: ASGIApp, token: str | None, own_auth: Callable[[str], bool] | None = None
    ) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode() if token else None
        self.own_auth = own_auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.expected is None
            or scope["type"] != "http"
            or (self.own_auth is not None and self.own_auth(scope.get("path", "")))
        ):
            await self.app(scope, receive, send)
            return
        given = _header(scope, b"authorization")
        if not hmac.compare_digest(given, self.expected):
            why = "a wrong bearer token" if given else "no bearer token"
            await _reply(
                send,
                401,
                "unauthorized",
                f"this server needs a bearer token; the request had {why}",
            )
            return
        await self.app(scope, receive, send)


class BodyLimit:
    """Refuse a request body over ``limit`` bytes with 413 ``message_too_large``: at once
    when ``Content-Length`` says so, else as soon as the streamed body passes the limit
    (reading it raises :class:`~durable_harness.errors.MessageTooLarge` inside the route,
    before anything parses it, and whatever the app answers then is replaced by the 413)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.limit:
                    await self._refuse(send, declared)
                    return
        seen = 0
        exceeded = refused = False

        async def limited() -> Message:
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    exceeded = True
                    raise MessageTooLarge(
                        f"the request body is over the limit of {self.limit} bytes",
                        limit=self.limit,
                        size=seen,
                    )
            return message

        async def guarded(message: Message) -> None:
            # the framework may report a failed body read its own way (FastAPI: 400 "error
            # parsing the body"): once the limit is passed, the answer is ours
            nonlocal refused
            if not exceeded:
                await send(message)
            elif message["type"] == "http.response.start" and not refused:
                refused = True
                await self._refuse(send, seen)

        try:
            await self.app(scope, limited, guarded)
        except MessageTooLarge:
            if refused:
                return
            refused = True
            await self._refuse(send, seen)

    async def _refuse(self, send: Send, size: int) -> None:
        await _reply(
            send,
            413,
            "message_too_large",
            f"the request body is over the limit of {self.limit} bytes",
            limit=self.limit,
            size=size,
        )
