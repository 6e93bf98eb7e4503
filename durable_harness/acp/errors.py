"""Library errors as JSON-RPC errors: the library's message and ``data`` its JSON
(``design/acp.md``, "Errors")."""

from __future__ import annotations

from acp import RequestError

from durable_harness.errors import DurableHarnessError

INVALID_PARAMS = -32602
NOT_FOUND = -32002
CONFLICT = -32010
INTERNAL = -32603

_BY_CODE: dict[str, int] = {
    "invalid_request": INVALID_PARAMS,
    "cwd_not_allowed": INVALID_PARAMS,
    "message_too_large": INVALID_PARAMS,
    "format_error": INVALID_PARAMS,
    "missing_credential": INVALID_PARAMS,
    "idempotency_key_reused": INVALID_PARAMS,
    "mcp_config_error": INVALID_PARAMS,  # a bad mcpServers entry in session/new or load
    "session_not_found": NOT_FOUND,
    "ambiguous_session_prefix": NOT_FOUND,
    "run_in_progress": CONFLICT,
    "no_open_run": CONFLICT,
    "lane_suspended": CONFLICT,
    "session_live": CONFLICT,
    "session_not_live": CONFLICT,
    "illegal_transition": CONFLICT,
    "lease_held": CONFLICT,
    "recovery_error": CONFLICT,
    "decision_required": CONFLICT,
    "already_decided": CONFLICT,
}
"""JSON-RPC error code per library error code; any other ``-32603`` (``design/acp.md``)."""


def rpc_error(exc: DurableHarnessError) -> RequestError:
    """The JSON-RPC error for a library error: its message, ``data`` its ``to_remote_json()``."""
    shown = exc.to_remote_json()
    return RequestError(_BY_CODE.get(exc.code, INTERNAL), str(shown["message"]), shown)
