"""The one table from error code to HTTP status (``durable_harness/http/errors.py``)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from durable_harness import errors as errmod
from durable_harness.http.errors import STATUS_BY_CODE, status_of

ERROR_CLASSES = sorted(
    (
        cls
        for _name, cls in inspect.getmembers(errmod, inspect.isclass)
        if issubclass(cls, errmod.DurableHarnessError)
    ),
    key=lambda cls: cls.__name__,
)


def _instance(cls: type[errmod.DurableHarnessError]) -> errmod.DurableHarnessError:
    if issubclass(cls, errmod.MissingCredential):
        return cls("no key", env="X_API_KEY")
    return cls("a message")


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_every_library_error_has_a_status(cls: type[errmod.DurableHarnessError]) -> None:
    status = status_of(_instance(cls))
    server_side = issubclass(cls, (errmod.StorageError, errmod.ProviderError)) or cls in (
        errmod.DurableHarnessError,
    )
    if issubclass(cls, (errmod.HostError, errmod.RunError, errmod.RecoveryError)):
        assert 400 <= status < 500, (cls, status)
    elif not server_side:
        assert status < 500, (cls, status)
    assert status in (400, 401, 403, 404, 405, 409, 413, 415, 422, 500, 502, 503)


def test_the_issue_statuses() -> None:
    expected = {
        "session_not_found": 404,
        "session_live": 409,
        "session_not_live": 409,
        "run_in_progress": 409,
        "no_open_run": 409,
        "lane_suspended": 409,
        "illegal_transition": 409,
        "message_too_large": 413,
        "invalid_request": 400,
        "unauthorized": 401,
        "cross_origin": 403,
        "cwd_not_allowed": 403,
        "unsupported_media_type": 415,
    }
    assert {code: STATUS_BY_CODE[code] for code in expected} == expected
    codes = {cls.code for cls in ERROR_CLASSES}
    own = {  # the front's own
        "not_found",
        "method_not_allowed",
        "host_not_allowed",
        "unauthorized",
        "cross_origin",
        "unsupported_media_type",
    }
    assert set(STATUS_BY_CODE) - own <= codes, "the table names a code no error has"


def test_the_codes_are_the_design_table() -> None:
    """``design/api.md`` "Errors" lists every error class with its code; they agree."""
    design = Path(__file__).resolve().parents[2] / "design" / "api.md"
    text = design.read_text(encoding="utf-8")
    table = text.split("<!-- error tree -->")[1].split("<!-- end of error tree -->")[0]
    rows = re.findall(r"(\w+)\s+(\w+)\n", table)
    assert {name: code for name, code in rows} == {c.__name__: c.code for c in ERROR_CLASSES}
