"""Errors as HTTP responses: the one table from error code to status, every error body
``{"code", "message", ...details}`` (``design/http.md``, "Errors"); an exception that is no
library error is 500 ``internal``, its text logged, not sent.
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

_BY_STATUS = (
    (404, "session_not_found not_found"),  # the request names nothing that exists
    # the request is malformed (bad JSON, a missing or mistyped field, a bad id, a bad spec)
    (400, "invalid_request format_error import_spec ambiguous_session_prefix missing_credential"),
    (400, "unknown_lane tool_error path_escape host_not_allowed mcp_config_error"),
    (401, "unauthorized"),  # no bearer token, or the wrong one
    (403, "cross_origin"),  # a state-changing request from another origin (guard.SameOrigin)
    (403, "cwd_not_allowed"),  # a session's working directory outside the --root trees
    (405, "method_not_allowed"),
    # the session's state does not allow it now
    (409, "session_live session_not_live lease_held run_in_progress no_open_run lane_suspended"),
    (409, "illegal_transition already_decided recovery_error"),
    (409, "tool_process_running tool_process_elsewhere attempt_cap_reached session_exists"),
    (409, "mcp_server_unavailable"),  # a session's MCP server is down (its calls: error results)
    (422, "idempotency_key_reused"),  # an Idempotency-Key reused for a different request
    (413, "message_too_large"),  # too big to take
    (415, "unsupported_media_type"),  # a state-changing request whose body is not JSON
    (503, "database_locked"),  # the store is busy: try again
)

STATUS_BY_CODE: dict[str, int] = {
    code: status for status, codes in _BY_STATUS for code in codes.split()
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
    """A JSON error response of ``body`` (``{"code", "message", **details}``) with ``headers``
    and the ones the status needs (401, 415, 503); a string UTF-8 cannot encode is escaped
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
    return Response(content, status_code=status, headers=headers, media_type="application/json")


def library_error_response(error: DurableHarnessError) -> Response:
    """The response of a library error: its ``to_remote_json()`` with :func:`status_of`."""
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
