"""ASGI middleware in front of every route: the bearer token and the body limit
(``design/http.md``).

Both answer before the application reads anything: a request without the right token, or
with a body over the limit, is refused with the API's JSON error body and never reaches a
route, so nothing is parsed and nothing changes on disk.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from durable_harness.errors import MessageTooLarge


async def _reply(send: Send, status: int, code: str, message: str, **details: Any) -> None:
    body = orjson.dumps({"code": code, "message": message, **details})
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
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = value
                break
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
