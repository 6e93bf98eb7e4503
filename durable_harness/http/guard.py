"""ASGI middleware in front of every route, each answering with the API's JSON error body
before the application reads anything: the Host check, the same-origin rule, the bearer
token, the body limit, the HTML CSP (``design/http.md``, "Auth", "Cross-site requests").
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.routing import Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from durable_harness.errors import MessageTooLarge, encodable
from durable_harness.http.errors import STATUS_BY_CODE
from durable_harness.http.methods import SAFE_METHODS, allowed_methods

HTML_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
"""The Content-Security-Policy of an HTML answer that sets none itself (the console's does)."""


async def _reply(send: Send, code: str, message: str, **details: Any) -> None:
    """Answer with the API's JSON error body and ``code``'s status (:data:`STATUS_BY_CODE`)."""
    status = STATUS_BY_CODE[code]
    body = orjson.dumps(encodable({"code": code, "message": message, **details}))
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if status == 413:
        headers.append((b"connection", b"close"))
    if status == 415:
        headers.append((b"accept", b"application/json"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


LOOPBACK_HOST_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
"""The ``Host`` header values (any port) a tokenless loopback server answers."""


def host_name(header: bytes) -> str:
    """The host of a ``Host`` header value without its port, lower-cased (``""`` for an empty
    or undecodable one)."""
    try:
        text = header.decode("ascii").strip().lower()
    except UnicodeDecodeError:
        return ""
    if text.startswith("["):
        end = text.find("]")
        return text[: end + 1] if end > 0 else ""
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


def _headers(scope: Scope, name: bytes) -> list[bytes]:
    """Every value of header ``name`` (lower case) in an ASGI ``scope``, in order."""
    return [bytes(v) for k, v in scope.get("headers", ()) if k == name]


def _header(scope: Scope, name: bytes) -> bytes:
    """The first value of header ``name`` (lower case) in an ASGI ``scope``, or ``b""``."""
    return next(iter(_headers(scope, name)), b"")


class LoopbackHosts:
    """Refuse every request whose ``Host`` is not one of :data:`LOOPBACK_HOST_NAMES` (any
    port) with 400 ``host_not_allowed``, a missing ``Host`` included: DNS rebinding, for a
    tokenless loopback server (``design/http.md``, "Auth")."""

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
            "host_not_allowed",
            f"Host {shown!r} is not allowed: this server has no token and answers only "
            "localhost, 127.0.0.1 and [::1]",
            host=shown,
        )


def bearer_token(header: str | bytes) -> str | None:
    """The credentials of an ``Authorization: Bearer <token>`` header value, or ``None`` when
    it is not one (scheme case-insensitive, RFC 9110 11.1; RFC 6750 2.1)."""
    if isinstance(header, bytes):
        header = header.decode("latin-1")
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = rest.strip(" ")
    return token or None


def token_matches(header: str | bytes, token: str) -> bool:
    """Whether an ``Authorization`` header value carries bearer ``token`` (constant time)."""
    given = bearer_token(header)
    return given is not None and hmac.compare_digest(
        given.encode("latin-1", "replace"), token.encode("utf-8")
    )


class BearerAuth:
    """Refuse every HTTP request whose ``Authorization`` is not ``Bearer <token>`` (401
    ``unauthorized``), but paths ``own_auth`` names; with ``token=None`` every one passes."""

    def __init__(
        self, app: ASGIApp, token: str | None, own_auth: Callable[[str], bool] | None = None
    ) -> None:
        self.app = app
        self.token = token or None
        self.own_auth = own_auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.token is None
            or scope["type"] != "http"
            or (self.own_auth is not None and self.own_auth(scope.get("path", "")))
        ):
            await self.app(scope, receive, send)
            return
        given = _header(scope, b"authorization")
        if not token_matches(given, self.token):
            why = "a wrong bearer token" if given else "no bearer token"
            await _reply(
                send,
                "unauthorized",
                f"this server needs a bearer token; the request had {why}",
            )
            return
        await self.app(scope, receive, send)


class BodyLimit:
    """Refuse a request body over ``limit`` bytes with 413 ``message_too_large``: at once
    when ``Content-Length`` says so, else as soon as the streamed body passes the limit
    (whatever the app answers then is replaced by the 413)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for value in _headers(scope, b"content-length"):
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
            "message_too_large",
            f"the request body is over the limit of {self.limit} bytes",
            limit=self.limit,
            size=size,
        )


def _origin(scheme: str, host: str) -> str:
    """``scheme://host[:port]`` lower-cased, the scheme's default port dropped (RFC 6454 4)."""
    scheme, host = scheme.lower(), host.strip().lower()
    default = {"http": ":80", "https": ":443", "ws": ":80", "wss": ":443"}.get(scheme)
    if default and host.endswith(default) and not host.endswith("]"):
        host = host[: -len(default)]
    return f"{scheme}://{host}"


def own_origin(scope: Scope) -> str:
    """The origin a request was addressed to: its scheme and its ``Host`` header."""
    host = _header(scope, b"host").decode("latin-1")
    scheme = str(scope.get("scheme", "http"))
    return _origin({"ws": "http", "wss": "https"}.get(scheme, scheme), host)


def request_origin(header: str) -> str | None:
    """An ``Origin`` header value normalised as :func:`own_origin` (``None``: not a
    ``scheme://host`` origin, e.g. ``null`` from a sandboxed frame or a ``file:`` page)."""
    scheme, sep, rest = header.strip().partition("://")
    if not sep or not scheme or not rest or "/" in rest:
        return None
    return _origin(scheme, rest)


class SameOrigin:
    """The CSRF rule of the API (``design/http.md``, "Cross-site requests"): a state-changing
    request a route would take is refused (403 ``cross_origin``, 415
    ``unsupported_media_type``: :meth:`refusal`) before the route runs; one no route takes
    passes to the router. ``exempt``: ``path -> bool`` for a front with its own CSRF rule.
    """

    def __init__(
        self, app: ASGIApp, router: Router, exempt: Callable[[str], bool] | None = None
    ) -> None:
        self.app = app
        self.router = router
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope.get("method", "GET") in SAFE_METHODS
            or (self.exempt is not None and self.exempt(scope.get("path", "")))
            or scope.get("method") not in allowed_methods(self.router, scope)
        ):
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        await _reply(send, *refusal)

    @staticmethod
    def refusal(scope: Scope) -> tuple[str, str] | None:
        """``(code, message)`` refusing a state-changing request, or ``None``: a foreign or
        ``null`` ``Origin``, a ``cross-site``/``same-site`` ``Sec-Fetch-Site``, a repeated
        ``Origin``/``Sec-Fetch-Site``/``Host``/``Content-Type`` (RFC 9110 5.3), or a
        ``Content-Type`` other than ``application/json``."""
        own = own_origin(scope)
        for name in (b"origin", b"sec-fetch-site", b"host", b"content-type"):
            if len(_headers(scope, name)) > 1:  # which copy counts would be a guess
                code = "unsupported_media_type" if name == b"content-type" else "cross_origin"
                return (code, f"a state-changing request may carry one {name.decode()} header")
        origins = _headers(scope, b"origin")
        given = origins[0].decode("latin-1") if origins else ""
        if origins and request_origin(given) != own:  # an empty Origin is no origin of ours
            return (
                "cross_origin",
                f"a request from origin {given[:200]!r} may not change anything on {own}: "
                "state-changing requests must come from the server's own origin",
            )
        site = _header(scope, b"sec-fetch-site").decode("latin-1").strip().lower()
        if site in ("cross-site", "same-site"):
            return (
                "cross_origin",
                f"a {site} request (Sec-Fetch-Site) may not change anything on {own}",
            )
        media = _header(scope, b"content-type").decode("latin-1").split(";", 1)[0]
        if media.strip().lower() != "application/json":
            shown = media.strip()[:100] or "none"
            return (
                "unsupported_media_type",
                f"this request needs Content-Type: application/json (it had {shown}); a "
                "route without input takes {}",
            )
        return None


class HtmlCsp:
    """Give every ``text/html`` answer that sets no ``Content-Security-Policy`` the strict
    :data:`HTML_CSP` (and ``X-Content-Type-Options: nosniff``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_csp(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                names = {bytes(k).lower(): bytes(v) for k, v in headers}
                if names.get(b"content-type", b"").lower().startswith(b"text/html"):
                    if b"content-security-policy" not in names:
                        headers.append((b"content-security-policy", HTML_CSP.encode()))
                    if b"x-content-type-options" not in names:
                        headers.append((b"x-content-type-options", b"nosniff"))
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_csp)


def install_guards(
    app: Starlette,
    *,
    body_limit: int,
    token: str | None,
    own_auth: Callable[[str], bool] | None = None,
    loopback_hosts_only: bool = False,
) -> None:
    """Put the guards in front of ``app`` (the API and each control endpoint). A request
    meets them in this order: :class:`LoopbackHosts` (when ``loopback_hosts_only``),
    :class:`HtmlCsp`, :class:`SameOrigin` (``own_auth`` paths exempt), :class:`BearerAuth`,
    :class:`BodyLimit` (``body_limit`` bytes), then the route."""
    app.add_middleware(BodyLimit, limit=body_limit)
    app.add_middleware(BearerAuth, token=token, own_auth=own_auth)
    app.add_middleware(SameOrigin, router=app.router, exempt=own_auth)
    app.add_middleware(HtmlCsp)
    if loopback_hosts_only:
        app.add_middleware(LoopbackHosts)  # added last: runs first
