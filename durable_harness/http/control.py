"""A session generation's own control endpoint: the agent routes of that one session on
its own loopback port (``design/http.md``, "Control ports"). It runs uvicorn's protocol on
an asyncio server, without uvicorn's main loop, so it needs the asyncio backend.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import uvicorn
from fastapi import FastAPI

from durable_harness.errors import InvalidRequest
from durable_harness.host.manager import SessionManager
from durable_harness.host.options import ControlFactory
from durable_harness.http import errors
from durable_harness.http.app import agent_routes, body_limit_for, openapi_builder
from durable_harness.http.guard import install_guards
from durable_harness.http.server import bind

log = logging.getLogger("durable_harness.http")

SHUTDOWN_GRACE = 2
"""Seconds a stopping generation gives its control endpoint's open requests to finish."""


def create_control_app(
    manager: SessionManager, session_id: str, *, token: str | None = None
) -> FastAPI:
    """The control endpoint's application: the agent routes of ``session_id`` under
    ``/agent``, with the API's errors and guards (``token`` as on the main server)."""
    app = FastAPI(
        title=f"durable-harness session {session_id} control",
        description="One session generation's control endpoint (design/http.md).",
        docs_url=None,
        redoc_url=None,
    )
    app.state.manager = manager
    errors.install(app)
    agent_routes(app, "/agent", lambda: session_id)
    app.openapi = openapi_builder(app)  # type: ignore[method-assign]
    install_guards(
        app,
        body_limit=body_limit_for(manager.options.max_message_bytes),
        token=token,
        loopback_hosts_only=token is None,  # always on loopback: a DNS-rebinding page's Host
    )
    return app


def control_endpoint(*, token: str | None = None, host: str = "127.0.0.1") -> ControlFactory:
    """A :attr:`~durable_harness.host.options.HostOptions.control` factory: per generation,
    bind ``host`` at port 0, serve :func:`create_control_app` there until the generation
    stops, and yield the port (``None``, with a warning, when binding is refused)."""

    @asynccontextmanager
    async def endpoint(manager: SessionManager, session_id: str) -> AsyncIterator[int | None]:
        try:
            sock = bind(host, 0)
        except InvalidRequest as exc:
            log.warning(
                "session %s: no control port (%s); it runs without one", session_id, exc.message
            )
            yield None
            return
        app = create_control_app(manager, session_id, token=token)
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=SHUTDOWN_GRACE,
        )
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        try:
            await server.startup(sockets=[sock])
        except BaseException:
            sock.close()
            raise
        port: int = sock.getsockname()[1]
        try:
            yield port
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_GRACE + 1):
                await server.shutdown(sockets=[sock])
            sock.close()

    return endpoint
