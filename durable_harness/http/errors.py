"""Errors as HTTP responses: the one table from error code to status (``design/http.md``).

Every error leaves the API as ``{"code", "message", ...details}`` with the library's stable
code (:mod:`durable_harness.errors`). A code in :data:`STATUS_BY_CODE` takes its status from
there; any other library error takes the status of its nearest listed ancestor class in
:data:`STATUS_BY_CLASS`; an exception that is no library error is a bug: 500 ``internal``,
its text kept out of the body (it is logged).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from durable_harness.errors import (
    DurableHarnessError,
    HostError,
    ProviderError,
    RecoveryError,
    RunError,
    StorageError,
    encodable,
    root_cause,
)
from durable_harness.http.methods import allowed_methods

log = logging.getLogger("durable_harness.http")

STATUS_BY_CODE: dict[str, int] = {
    # the request names nothing that exists
    "session_not_found": 404,
    "not_found": 404,
    # the request is malformed (bad JSON, a missing or mistyped field, a bad id, a bad spec)
    "invalid_request": 400,
    "format_error": 400,
    "import_spec": 400,
    "ambiguous_session_prefix": 400,
    "missing_credential": 400,
    "unknown_lane": 400,
    "tool_error": 400,
    "path_escape": 400,
    "host_not_allowed": 400,
    # no bearer token, or the wrong one
    "unauthorized": 401,
    # a state-changing request from another origin (http/guard.py SameOrigin)
    "cross_origin": 403,
    # a session's working directory outside the server's --root trees
    "cwd_not_allowed": 403,
    "method_not_allowed": 405,
    # the session's state does not allow it now
    "session_live": 409,
    "session_not_live": 409,
    "lease_held": 409,
    "run_in_progress": 409,
    "no_open_run": 409,
    "lane_suspended": 409,
    "illegal_transition": 409,
    "already_decided": 409,
    "recovery_error": 409,
    "tool_process_running": 409,
    "tool_process_elsewhere": 409,
    "attempt_cap_reached": 409,
    "session_exists": 409,
    # an Idempotency-Key reused for a different request
    "idempotency_key_reused": 422,
    # too big to take
    "message_too_large": 413,
    # a state-changing request whose body is not JSON (http/guard.py SameOrigin)
    "unsupported_media_type": 415,
    # the store is busy: try again
    "database_locked": 503,
}
"""``{error code: HTTP status}``: the statuses of the API, written once."""

STATUS_BY_CLASS: tuple[tuple[type[DurableHarnessError], int], ...] = (
    (HostError, 400),
    (RunError, 409),
    (RecoveryError, 409),
    (ProviderError, 502),
    (StorageError, 500),
    (DurableHarnessError, 500),
)
"""For a library error whose code is not in :data:`STATUS_BY_CODE`: the status of its
nearest ancestor here (first match wins, so subclasses come first)."""


def status_of(error: DurableHarnessError) -> int:
    """The HTTP status of a library error (:data:`STATUS_BY_CODE`, then
    :data:`STATUS_BY_CLASS`)."""
    status = STATUS_BY_CODE.get(error.code)
    if status is not None:
        return status
    for cls, fallback in STATUS_BY_CLASS:
        if isinstance(error, cls):
            return fallback
    return 500


def error_response(
    status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> Response:
    """A JSON error response: ``body`` is ``{"code", "message", **details}`` (details may
    hold any key, ``status`` included), with ``headers`` and the ones the status needs
    (``WWW-Authenticate`` on 401, ``Accept`` on 415, ``Retry-After`` on 503). Total: a string
    that UTF-8 cannot encode (a lone surrogate quoted from the request) is escaped
    (:func:`~durable_harness.errors.encodable`)."""
    headers = dict(headers or {})
    if status == 401:
        headers.setdefault("WWW-Authenticate", "Bearer")
    if status == 415:
        headers.setdefault("Accept", "application/json")
    if status == 503:
        headers.setdefault("Retry-After", "1")
    try:
        content = orjson.dumps(body, default=str)
    except TypeError:
        content = orjson.dumps(encodable(body), default=lambda v: encodable(str(v)))
    return Response(
        content,
        status_code=status,
        headers=headers,
        media_type="application/json",
    )


def library_error_response(error: DurableHarnessError) -> Response:
    """The response of a library error: its ``to_remote_json()`` (what a caller who is not
    the store's owner may see) with :func:`status_of`."""
    return error_response(status_of(error), error.to_remote_json())


def _validation_problems(exc: RequestValidationError) -> list[dict[str, Any]]:
    problems = []
    for err in exc.errors()[:20]:
        where = ".".join(str(part) for part in err.get("loc", ()))
        problems.append({"field": where, "problem": str(err.get("msg", ""))})
    return problems


def install(app: FastAPI) -> None:
    """Install the handlers that render every error through this module."""

    async def on_library_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, DurableHarnessError)
        return library_error_response(exc)

    async def on_validation(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        problems = _validation_problems(exc)
        first = problems[0] if problems else {"field": "request", "problem": "invalid"}
        message = f"{first['field']}: {first['problem']}"
        return error_response(
            400, {"code": "invalid_request", "message": message, "problems": problems}
        )

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized"}.get(
            exc.status_code, "invalid_request" if exc.status_code < 500 else "internal"
        )
        message = str(exc.detail)
        headers = dict(exc.headers or {})
        if exc.status_code in (404, 405):
            message = f"{message}: no route {request.method} {request.url.path[:200]}"
        if exc.status_code == 405:  # every method of the path, not only the first route's
            allowed = allowed_methods(request.app.router, request.scope)
            headers["Allow"] = ", ".join(sorted(allowed or {"GET"}))
        return error_response(exc.status_code, {"code": code, "message": message}, headers)

    async def on_other(request: Request, exc: Exception) -> Response:
        cause = root_cause(exc)
        if isinstance(cause, DurableHarnessError):
            return library_error_response(cause)
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        message = f"internal error ({type(cause).__name__}); see the server log"
        return error_response(500, {"code": "internal", "message": message})

    app.add_exception_handler(DurableHarnessError, on_library_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_other)
