"""The formats declared once (issue 21): the session-id pattern (``ids.py``), the session
header and the command runtime type (``models/``). Every id the library can make is reachable
through the host and the HTTP API; a hostile id is refused by each of them and by the JSONL
store; the other modules import the one definition instead of writing their own."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest

from durable_harness import ids
from durable_harness.errors import FormatError, InvalidRequest
from durable_harness.host import HostOptions, SessionManager
from durable_harness.models import header, records
from durable_harness.storage import open_store

# every character an id the library makes can hold: uuid7's hex and '-', new_id's hex, and
# the '.' and '_' the JSONL store accepts from a caller (the longest: 128 characters)
LIBRARY_IDS = [ids.uuid7(), ids.new_id(), "a.b_c-D9", "0.1", "Z" + "a._-" * 31 + "xyz"]
HOSTILE_IDS = ["", ".", "..", "../x", "a/b", "a\\b", ".hidden", "-rf", "_x", "a b", "a\x00b"]
HOSTILE_IDS += ["é", "a\n", "a" * 129, "%2e%2e"]


def _http_pattern() -> str:
    from durable_harness.http.app import SessionId

    pattern = get_args(SessionId)[1].json_schema_extra["pattern"]
    assert isinstance(pattern, str)
    return pattern


def test_the_definitions_are_imported_not_repeated() -> None:
    from durable_harness.host import inputs
    from durable_harness.host.record import CommandRuntime
    from durable_harness.http import models as http_models
    from durable_harness.storage import base
    from durable_harness.storage.jsonl import FORMAT, is_own_format
    from durable_harness.tools import bash

    assert inputs.SESSION_ID is ids.SESSION_ID
    assert inputs.SESSION_ID_PATTERN is ids.SESSION_ID_PATTERN
    assert _http_pattern() == f"^{ids.SESSION_ID_PATTERN}$"
    assert base.new_header is header.new_header
    assert (FORMAT, is_own_format) == (header.FORMAT, header.is_own_format)
    runtime = records.CommandRuntime
    assert bash.Runtime is runtime and CommandRuntime is runtime
    assert http_models.CommandRuntime is runtime
    assert bash.RUNTIMES == records.COMMAND_RUNTIMES == ("pipe", "pty")


@pytest.mark.parametrize("backend", ["memory", "jsonl", "sqlite"])
def test_every_backend_writes_the_one_header(tmp_path: Path, backend: str) -> None:
    spec = {"memory": "memory:", "jsonl": f"jsonl:{tmp_path}", "sqlite": f"sqlite:{tmp_path}/s.db"}
    with open_store(spec[backend]).create_session("/p", parent_session="p1") as s:
        made = s.header
    want = header.new_header(s.session_id, made["timestamp"], "/p", "p1")
    assert {k: made[k] for k in want} == want
    assert header.is_own_format(made)


def test_library_ids_match_and_hostile_ids_do_not() -> None:
    http = _http_pattern()
    for sid in LIBRARY_IDS:
        assert ids.SESSION_ID.fullmatch(sid) and re.fullmatch(http, sid), sid
    for sid in HOSTILE_IDS:
        assert not ids.SESSION_ID.fullmatch(sid) and not re.fullmatch(http, sid), repr(sid)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_library_made_id_is_reachable_through_the_host(tmp_path: Path) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    store = open_store(spec)
    for sid in LIBRARY_IDS:
        store.create_session(str(tmp_path), session_id=sid).close()
    for sid in HOSTILE_IDS[1:]:  # an empty id asks the store for a new one
        with pytest.raises(FormatError):
            store.create_session(str(tmp_path), session_id=sid)
        assert store.find_exact(sid) is None
    async with SessionManager(spec, HostOptions(auto_resume="never")) as m:
        for sid in LIBRARY_IDS:
            assert (await m.get(sid)).id == sid
        for sid in HOSTILE_IDS:
            with pytest.raises(InvalidRequest, match="is not a session id"):
                await m.get(sid)
