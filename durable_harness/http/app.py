"""The HTTP API over :class:`~durable_harness.host.manager.SessionManager`
(``design/http.md``): each route parses its input (:mod:`durable_harness.http.models`), makes
one manager call and renders the result; :func:`create_app`'s lifespan enters the manager.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.openapi.utils import get_openapi
from sse_starlette import EventSourceResponse

from durable_harness import __version__
from durable_harness.errors import root_cause
from durable_harness.host.inputs import LANE_PATTERN, SESSION_ID_PATTERN
from durable_harness.host.manager import SessionManager
from durable_harness.host.metrics import HostMetrics
from durable_harness.host.options import HostOptions
from durable_harness.http import errors, models
from durable_harness.http.guard import install_guards
from durable_harness.http.methods import SAFE_METHODS
from durable_harness.http.streams import SLOTS, sse_batches
from durable_harness.storage.base import Store

ManagerFactory = Callable[[], SessionManager]
"""Builds the (not yet entered) manager the app serves."""

SSE_PING_SECONDS = 15
"""Seconds between keep-alive comments on an idle event stream."""


def body_limit_for(max_message_bytes: int) -> int:
    """The largest request body accepted: the largest message JSON-escaped (6 bytes per
    byte at worst) plus 64 KiB for the other fields."""
    return 6 * max_message_bytes + 65536


_ERROR = {"model": models.Error}
_SESSION_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {**_ERROR, "description": "invalid_request (a malformed id or body)"},
    404: {**_ERROR, "description": "session_not_found"},
}
_STATE_ERRORS: dict[int | str, dict[str, Any]] = {
    **_SESSION_ERRORS,
    409: {**_ERROR, "description": "the session's state does not allow it (see the code)"},
}

SessionId = Annotated[
    str,
    Path(
        alias="id",
        description="a session id (letters, digits, '.', '_' and '-'); the manager checks it",
        json_schema_extra={"pattern": f"^{SESSION_ID_PATTERN}$"},
    ),
]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=256,
        description="a client key: a repeated request with the same key is not applied twice",
    ),
]

LastEventId = Annotated[
    str | None,
    Header(
        alias="Last-Event-ID",
        pattern=r"^[0-9]{1,18}-[0-9]{1,18}$",
        description="the `id` of the last event a reader saw (`GENERATION-EVENTID`): the "
        "stream resumes after it",
    ),
]


def _manager(request: Request) -> SessionManager:
    manager: SessionManager = request.app.state.manager
    return manager


Manager = Annotated[SessionManager, Depends(_manager)]


def create_app(
    manager_factory: ManagerFactory | None = None,
    *,
    store: Store | str | None = None,
    options: HostOptions | None = None,
    token: str | None = None,
    metrics: HostMetrics | None = None,
    own_auth: Callable[[str], bool] | None = None,
    loopback_hosts_only: bool = False,
) -> FastAPI:
    """Build the API.

    Args:
        manager_factory: builds the manager to serve (entered by the app's lifespan); by
            default ``SessionManager(store, options)``.
        store, options: for the default factory (a store spec or
            :class:`~durable_harness.storage.base.Store`; :class:`HostOptions`).
        token: when given, every request needs ``Authorization: Bearer <token>``.
        metrics: the ``/metrics`` sink (default: a new :class:`HostMetrics`).
        own_auth: ``path -> bool``: paths of a front beside the API that checks the token
            itself (the console); the bearer check lets them through.
        loopback_hosts_only: answer only loopback ``Host`` values
            (:class:`~durable_harness.http.guard.LoopbackHosts`).

    Returns:
        The FastAPI application (OpenAPI at ``/openapi.json``).
    """
    factory = manager_factory or (lambda: SessionManager(store, options))
    sink = metrics or HostMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.startup_error = None
        try:
            manager = factory()
            manager.observe(sink.observe)  # before entering: resumed at start-up too
            sink.start()  # commit and fsync latency from storage.timing
            entered = await manager.__aenter__()
        except BaseException as exc:
            app.state.startup_error = root_cause(exc)  # serve() raises it as itself
            raise
        app.state.manager = entered
        try:
            yield
        finally:
            try:
                await manager.__aexit__(None, None, None)
            finally:
                sink.close()

    app = FastAPI(
        title="durable-harness host",
        version=__version__,
        description="Crash-durable agent sessions over HTTP (design/http.md).",
        lifespan=lifespan,
        docs_url=None,  # no CDN script on the API's origin (design/http.md, "Documents")
        redoc_url=None,
    )
    errors.install(app)
    _routes(app, sink)
    app.openapi = openapi_builder(app)  # type: ignore[method-assign]
    max_message = (options or HostOptions()).max_message_bytes
    install_guards(
        app,
        body_limit=body_limit_for(max_message),
        token=token,
        own_auth=own_auth,
        loopback_hosts_only=loopback_hosts_only,
    )
    return app


_ANY_ROUTE: dict[str, str] = {
    "400": "invalid_request (a malformed id, query, header or body); host_not_allowed (a "
    "tokenless server answers only loopback Host values)",
    "401": "unauthorized: the server has a bearer token and the request lacks it",
    "503": "database_locked (with Retry-After), too_many_streams",
}
"""The statuses every route can answer, whatever it does (the guards, the store)."""

_UNSAFE_ROUTE: dict[str, str] = {
    "403": "cross_origin: an Origin other than the server's own, or Sec-Fetch-Site "
    "cross-site/same-site",
    "413": "message_too_large: the body is over the limit",
    "415": "unsupported_media_type: the Content-Type is not application/json",
}
"""The statuses every POST/DELETE route can answer besides (``http/guard.py``)."""

_KEYED_ROUTE: dict[str, str] = {
    "422": "idempotency_key_reused: the Idempotency-Key came with another request before",
}
"""The status a route taking an ``Idempotency-Key`` can answer besides."""

_ERROR_BODY = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}


def _document_statuses(method: str, operation: dict[str, Any]) -> None:
    """Add to one operation of the document the statuses its route can answer beyond its
    own, each with the error body; and, to a POST/DELETE without a body, the ``{}`` it takes."""
    responses = operation.setdefault("responses", {})
    if responses.pop("422", None) is not None:
        responses.setdefault("400", {"description": "invalid_request", "content": _ERROR_BODY})
    extra = dict(_ANY_ROUTE)
    if method.upper() not in SAFE_METHODS:
        extra.update(_UNSAFE_ROUTE)
        operation.setdefault(
            "requestBody",
            {
                "required": True,
                "description": "no input: send {} (Content-Type: application/json)",
                "content": {"application/json": {"schema": {"type": "object"}}},
            },
        )
    if any(p.get("name") == "Idempotency-Key" for p in operation.get("parameters", ())):
        extra.update(_KEYED_ROUTE)
    for status, description in extra.items():
        answer = responses.setdefault(status, {"description": description, "content": _ERROR_BODY})
        if answer.get("description") != description and description not in str(
            answer.get("description")
        ):
            answer["description"] = f"{answer.get('description', '')}; {description}"


def openapi_builder(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """The app's OpenAPI document with FastAPI's default 422 replaced by this API's 400
    ``invalid_request`` and every status a route can answer listed."""

    def build() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        for item in doc.get("paths", {}).values():
            for method, operation in item.items():
                _document_statuses(method, operation)
        schemas = doc.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        app.openapi_schema = doc
        return doc

    return build


def _route(
    app: FastAPI, method: str, path: str, model: Any, responses: Any, tag: str, **more: Any
) -> Callable[[Any], Any]:
    """The decorator registering one route of the API (``app.get``, ``app.post``...)."""
    return app.api_route(
        path,
        methods=[method.upper()],
        response_model=model,
        responses=responses,
        tags=[tag],
        **more,
    )


def _routes(app: FastAPI, sink: HostMetrics) -> None:
    """Register every route of the API on ``app``."""

    cwd_refused = {400: _ERROR, 403: {**_ERROR, "description": "cwd_not_allowed (--root)"}}

    @_route(app, "post", "/sessions", models.Session, cwd_refused, "sessions", status_code=201)
    async def create_session(
        body: models.CreateSession, manager: Manager, key: IdempotencyKey = None
    ) -> dict[str, Any]:
        """Create a session in ``cwd`` and start its generation 1. With an
        ``Idempotency-Key`` seen before, the session created then is returned."""
        rec = await manager.create(
            body.cwd,
            mode=body.mode,
            command_runtime=body.command_runtime,
            provider=body.provider,
            client_key=key,
        )
        return rec.to_json()

    @_route(app, "get", "/sessions", models.SessionList, {400: _ERROR}, "sessions")
    async def list_sessions(
        manager: Manager,
        state: Annotated[list[str] | None, Query()] = None,
    ) -> dict[str, Any]:
        """Every readable session of the store (most recently modified first), only those in
        one of the ``state`` values when given (repeatable: ``?state=suspended&state=error``),
        each with the in-doubt calls it waits on (``waiting``); and the unreadable ones with
        why. An unknown state is 400 ``invalid_request``."""
        return await manager.listing(state)

    @_route(app, "get", "/sessions/{id}", models.Session, _SESSION_ERRORS, "sessions")
    async def get_session(session_id: SessionId, manager: Manager) -> dict[str, Any]:
        """The session's record (``state``, ``generation``...)."""
        return (await manager.get(session_id)).to_json()

    @_route(app, "post", "/sessions/{id}/resume", models.Session, _STATE_ERRORS, "sessions")
    async def resume_session(session_id: SessionId, manager: Manager) -> dict[str, Any]:
        """Start the next generation (recovery first). A session whose plan needs a decision
        stays ``suspended``: decide through ``.../agent/decide``."""
        return (await manager.resume(session_id)).to_json()

    @_route(app, "post", "/sessions/{id}/close", models.Session, _STATE_ERRORS, "sessions")
    async def close_session(session_id: SessionId, manager: Manager) -> dict[str, Any]:
        """Close the session (abort, grace period, kill, release); record and transcript are
        kept. Idempotent."""
        return (await manager.close(session_id)).to_json()

    @app.delete("/sessions/{id}", status_code=204, responses=_STATE_ERRORS, tags=["sessions"])
    async def forget_session(session_id: SessionId, manager: Manager) -> Response:
        """Delete a closed session for good (refused while it is live or not closed)."""
        await manager.forget(session_id)
        return Response(status_code=204)

    agent_routes(app, "/sessions/{id}/agent", _session_from_path)

    @_route(app, "get", "/sessions/{id}/agent/log", models.Log, _SESSION_ERRORS, "agent")
    async def oplog(
        session_id: SessionId,
        manager: Manager,
        since_seq: Annotated[int, Query(ge=0, le=1 << 62)] = 0,
        limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
        lane: Annotated[str | None, Query(pattern=f"^{LANE_PATTERN}$")] = None,
    ) -> dict[str, Any]:
        """A page of the operation log (records with ``seq`` above ``since_seq``)."""
        return manager.log(session_id, lane=lane, since_seq=since_seq, limit=limit)

    @_route(app, "post", "/sessions/{id}/agent/decide", models.Session, _STATE_ERRORS, "agent")
    async def decide(
        session_id: SessionId, body: models.Decide, manager: Manager
    ) -> dict[str, Any]:
        """Decide one in-doubt call of a suspended session; it resumes once no call still
        waits (the returned record says which)."""
        return (
            await manager.decide(session_id, body.tool_call_id, body.decision, author="api")
        ).to_json()

    @app.get(
        "/sessions/{id}/agent/events",
        response_class=EventSourceResponse,
        responses={
            200: {"content": {"text/event-stream": {}}, "description": "the event stream"},
            **_STATE_ERRORS,
        },
        tags=["agent"],
    )
    async def events(
        session_id: SessionId, manager: Manager, last_event_id: LastEventId = None
    ) -> EventSourceResponse:
        """The live generation's events, one SSE event each (``id`` = ``GENERATION-EVENTID``,
        ``event`` = its type, ``data`` = the event as JSON), in order, from now on; with
        ``Last-Event-ID``, from the event after that one (a ``gap`` event, without an id,
        first when they cannot all be replayed). The stream ends when the generation stops."""
        refused = SLOTS.refusal()
        if refused is not None:
            return refused  # type: ignore[return-value]
        after = None
        if last_event_id is not None:
            generation, _, seen = last_event_id.partition("-")
            after = (int(generation), int(seen))
        stream = manager.listen(session_id, after)
        return SLOTS.response(sse_batches(stream, session_id), ping=SSE_PING_SECONDS)

    @app.get(
        "/metrics",
        response_class=Response,
        responses={
            200: {
                "content": {"text/plain": {}, "application/openmetrics-text": {}},
                "description": "Prometheus text, or OpenMetrics when Accept asks for it",
            }
        },
        tags=["host"],
    )
    async def metrics(manager: Manager, request: Request) -> Response:
        """Exposition of the host's metrics: OpenMetrics 1.0 when the scraper's ``Accept``
        asks for ``application/openmetrics-text``, else the Prometheus text format 0.0.4
        (``design/observability.md``, "Metrics")."""
        # the scrape-time gauges first: awaiting decisions, sessions by state, start-up resumes
        # queued, a worker's counts
        sink.set_awaiting_counts(manager.awaiting_decisions())
        sink.resumes_pending.set(len(manager.pending))
        sink.set_state_counts(await manager.state_counts())
        if (counts := manager.worker_counts()) is not None:
            sink.set_worker_counts(*counts)
        body, content_type = sink.render(request.headers.get("accept"))
        return Response(body, media_type=content_type)


def _session_from_path(session_id: SessionId) -> str:
    """The session id of a ``/sessions/{id}/...`` route."""
    return session_id


def agent_routes(app: FastAPI, prefix: str, session: Callable[..., str]) -> None:
    """Register the agent routes a session's control endpoint also serves (``send``,
    ``status``, ``abort``, ``messages``) under ``prefix``; ``session`` is the dependency that
    names the session (the path's ``{id}``, or the endpoint's own session)."""

    too_large = {**_STATE_ERRORS, 413: {**_ERROR, "description": "message_too_large"}}

    @_route(app, "post", f"{prefix}/send", models.Accepted, too_large, "agent", status_code=202)
    async def send(
        body: models.SendMessage,
        manager: Manager,
        key: IdempotencyKey = None,
        session_id: str = Depends(session),
    ) -> dict[str, Any]:
        """Send a message; returns once it is durable. A ``prompt`` while a run is open on
        the lane is 409 ``run_in_progress``."""
        return await manager.send(
            session_id, body.message, mode=body.mode, lane=body.lane, client_key=key
        )

    @_route(app, "get", f"{prefix}/status", models.Status, _SESSION_ERRORS, "agent")
    async def status(manager: Manager, session_id: str = Depends(session)) -> dict[str, Any]:
        """State, generation, lanes, and the recovery plan when suspended."""
        return await manager.status(session_id)

    @_route(app, "post", f"{prefix}/abort", models.Aborted, _STATE_ERRORS, "agent")
    async def abort(
        manager: Manager,
        body: Annotated[models.AbortRun | None, Body()] = None,
        session_id: str = Depends(session),
    ) -> dict[str, Any]:
        """Abort the lane's running run (``abort_requested`` is durable first)."""
        return await manager.abort(session_id, lane=(body or models.AbortRun()).lane)

    @_route(app, "post", f"{prefix}/kill", models.Killed, _STATE_ERRORS, "agent")
    async def kill(
        manager: Manager, body: models.KillTool, session_id: str = Depends(session)
    ) -> dict[str, Any]:
        """SIGKILL the live process group of one unsettled tool call (on this machine),
        recorded as ``tool_process_killed``; the call stays in doubt, nothing is decided."""
        return await manager.kill_tool(session_id, body.tool_call_id)

    @_route(app, "get", f"{prefix}/messages", models.Messages, _SESSION_ERRORS, "agent")
    async def messages(
        manager: Manager,
        session_id: str = Depends(session),
        offset: Annotated[int, Query(ge=0, le=1 << 40)] = 0,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        lane: Annotated[str, Query(pattern=f"^{LANE_PATTERN}$")] = "main",
    ) -> dict[str, Any]:
        """A page of the lane's transcript, root to leaf."""
        return manager.messages(session_id, lane=lane, offset=offset, limit=limit)
