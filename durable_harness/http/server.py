"""Run the HTTP API with uvicorn (``durable-harness serve``, ``design/http.md``) on a socket
bound in one step (no check-then-bind race); the ready line is printed once it answers.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI

from durable_harness.errors import InvalidRequest

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` is ``127.0.0.0/8``, ``::1`` or ``localhost`` (any other name counts as
    non-loopback)."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def require_token(host: str, token: str | None) -> None:
    """Refuse to serve a non-loopback ``host`` without a ``token`` (:class:`InvalidRequest`)."""
    if not is_loopback(host) and not token:
        raise InvalidRequest(
            f"serving on {host} (not loopback) needs a bearer token: pass --token or set "
            "DURABLE_HARNESS_TOKEN",
            host=host,
        )


def bind(host: str, port: int) -> socket.socket:
    """Bind and listen on ``host:port`` in one step (port 0: a free port).

    Raises:
        InvalidRequest: the address cannot be resolved or bound (in use, not ours...),
            naming it and the system's reason.
    """
    try:
        family, kind, proto, _name, addr = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise InvalidRequest(f"cannot resolve {host}:{port}: {exc}", host=host) from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        raise InvalidRequest(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}", host=host, port=port
        ) from exc
    return sock


def url_of(sock: socket.socket) -> str:
    """``http://HOST:PORT`` of a bound socket (IPv6 hosts in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Server(uvicorn.Server):
    """A uvicorn server that calls ``ready()`` once it serves (after the app's lifespan)."""

    def __init__(self, config: uvicorn.Config, ready: Callable[[], None]) -> None:
        super().__init__(config)
        self._ready = ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and not self.should_exit:
            self._ready()


def serve(
    app: FastAPI,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    token: str | None = None,
    log_level: str = "warning",
    announce: Callable[[str], None] | None = None,
) -> None:
    """Serve ``app`` on ``host:port`` until SIGINT or SIGTERM; ``announce(url)`` is called
    once it answers (default: print ``durable-harness serving on URL``).

    Raises:
        InvalidRequest: a non-loopback ``host`` without ``token``, or the socket cannot be
            bound. An error of the app's start-up is raised as itself.
    """
    require_token(host, token)
    sock = bind(host, port)
    url = url_of(sock)

    def ready() -> None:
        if announce is not None:
            announce(url)
        else:
            print(f"durable-harness serving on {url}", flush=True)

    config = uvicorn.Config(
        app, log_level=log_level, lifespan="on", access_log=False, timeout_graceful_shutdown=5
    )
    server = _Server(config, ready)
    try:
        server.run(sockets=[sock])
    except SystemExit:
        failure: Any = getattr(app.state, "startup_error", None)
        if isinstance(failure, BaseException):
            raise failure from None
        raise
    finally:
        sock.close()
    if getattr(app.state, "startup_error", None) is not None:
        raise app.state.startup_error
    sys.stdout.flush()
