"""The pieces of the notices (``design/notify.md``) without a server: stable event ids from
durable facts, the signature a receiver verifies, the Slack body, the receipts file, and the
config file's ``notify`` reaching ``serve``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import orjson
import pytest

from durable_harness.cli.host_commands import notify_options
from durable_harness.cli.settings import apply_settings
from durable_harness.errors import InvalidRequest
from durable_harness.host.notices import derive_notices, event_id
from durable_harness.host.notify import (
    EVENT_ID_HEADER,
    SIGNATURE_HEADER,
    Receipts,
    receipts_path,
    request_of,
    sign,
    verify,
)

RECORDS = [
    {"type": "session_lifecycle", "id": "a" * 16, "seq": 1, "state": "idle", "generation": 1},
    {"type": "run_started", "id": "b" * 16, "seq": 2, "runId": "r1", "lane": "main"},
    {
        "type": "tool_started",
        "id": "c" * 16,
        "seq": 3,
        "runId": "r1",
        "lane": "main",
        "callKey": "e/0",
        "toolCallId": "t1",
        "toolName": "bash",
        "arguments": {"command": "ls"},
        "timestamp": "2026-01-31T12:00:00.000Z",
    },
    {"type": "session_lifecycle", "id": "d" * 16, "seq": 4, "state": "idle", "generation": 2},
    {
        "type": "decision",
        "id": "e" * 16,
        "seq": 5,
        "runId": "r1",
        "lane": "main",
        "callKey": "e/0",
        "toolCallId": "t1",
        "decision": "fail",
        "author": "console",
    },
    {"type": "run_finished", "id": "f" * 16, "seq": 6, "runId": "r1", "outcome": "completed"},
    {"type": "session_lifecycle", "id": "0" * 16, "seq": 7, "state": "error", "error": "boom"},
]
WAITING = [
    {
        "lane": "main",
        "run_id": "r2",
        "tool_name": "bash",
        "tool_call_id": "t9",
        "call_key": "x/0",
        "attempt": 1,
        "doubt": "intent_unsettled",
        "arguments": {"command": "rm -rf build"},
    }
]


def test_notices_are_derived_from_facts_with_stable_ids() -> None:
    notices = derive_notices("s1", RECORDS, WAITING, "http://h:1/")
    kinds = [n["kind"] for n in notices]
    assert kinds == ["decided", "run_recovered", "session_error", "decision_due"]
    again = derive_notices("s1", RECORDS, WAITING, None)
    assert [n["event_id"] for n in again] == [n["event_id"] for n in notices]
    decided, recovered, error, due = notices
    assert decided["decision"] == {"decision": "fail", "result": None, "author": "console"}
    assert decided["tool"] == "bash" and decided["arguments_digest"].startswith("sha256:")
    assert recovered["outcome"] == "completed" and error["error"] == "boom"
    assert due["link"] == "http://h:1/console/sessions/s1"
    assert due["doubt"]["code"] == "intent_unsettled"
    assert due["event_id"] == event_id("decision_due", "s1", "x/0#1")
    # a later attempt of the same call is a new event; another session too
    later = derive_notices("s1", [], [{**WAITING[0], "attempt": 2}])[0]
    assert later["event_id"] != due["event_id"]
    assert derive_notices("s2", [], WAITING)[0]["event_id"] != due["event_id"]


def test_a_run_without_a_new_generation_inside_is_not_a_recovery() -> None:
    plain = [r for r in RECORDS if r["id"] not in ("d" * 16, "e" * 16)]
    assert "run_recovered" not in [n["kind"] for n in derive_notices("s", plain)]
    # a decision inside the run (a CLI resume writes no lifecycle record) is a recovery too
    decided = [r for r in RECORDS if r["id"] != "d" * 16]
    assert "run_recovered" in [n["kind"] for n in derive_notices("s", decided)]


def test_the_signature_verifies_and_a_tampered_body_or_old_stamp_does_not() -> None:
    (due,) = derive_notices("s1", [], WAITING)
    url, body, headers = request_of(due, "http://r/hook", "k")
    assert url == "http://r/hook" and headers[EVENT_ID_HEADER] == due["event_id"]
    assert verify("k", headers[SIGNATURE_HEADER], body)
    assert not verify("k", headers[SIGNATURE_HEADER], body + b" ")
    assert not verify("other", headers[SIGNATURE_HEADER], body)
    old = sign("k", int(time.time()) - 3600, body)
    assert not verify("k", old, body) and verify("k", old, body, tolerance=None)
    slack_url, slack_body, _ = request_of(due, "slack+https://hooks.example/x", None)
    assert slack_url == "https://hooks.example/x"
    assert list(orjson.loads(slack_body)) == ["text"]
    assert "decision is needed" in orjson.loads(slack_body)["text"]


def test_receipts_survive_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    Receipts(path).add("e1", "t1")
    with path.open("ab") as f:
        f.write(b'{"event_id": "e2", "tar')  # a crash mid-append
    again = Receipts(path)
    assert again.sent == {("e1", "t1")}
    again.add("e3", "t1")
    assert Receipts(path).sent >= {("e1", "t1"), ("e3", "t1")}


def test_receipts_live_beside_the_store_and_never_name_a_password(tmp_path: Path) -> None:
    assert receipts_path(f"jsonl:{tmp_path}") == tmp_path / "notices-sent.jsonl"
    assert receipts_path(f"sqlite:{tmp_path}/h.db") == tmp_path / "h.db.notices-sent.jsonl"
    pg = receipts_path("postgresql://u:pw@h/db", str(tmp_path))
    assert pg.parent == tmp_path and "pw" not in pg.name


def test_the_config_file_s_notify_reaches_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DURABLE_HARNESS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DURABLE_HARNESS_NOTIFY_SECRET", "from-env")
    (tmp_path / "durable-harness.toml").write_text('notify = ["https://hooks.example/dh"]\n')
    args = argparse.Namespace(
        command="serve",
        store=None,
        provider=None,
        durability=None,
        mcp=[],
        notify=None,
        notify_secret=None,
        public_url=None,
        decision_timeout=None,
        on_timeout="keep",
    )
    settings = apply_settings(args)
    assert settings.sources["notify"] == str(tmp_path / "durable-harness.toml")
    notify = notify_options(args)
    assert notify is not None
    assert notify.urls == ("https://hooks.example/dh",) and notify.secret == "from-env"


def test_a_notify_url_must_be_http() -> None:
    args = argparse.Namespace(
        notify=["ftp://x/y"],
        notify_secret=None,
        public_url=None,
        decision_timeout=None,
        on_timeout="keep",
    )
    with pytest.raises(InvalidRequest, match="not an http"):
        notify_options(args)
    args.notify = ["slack+https://hooks.example/x"]
    assert notify_options(args) is not None
