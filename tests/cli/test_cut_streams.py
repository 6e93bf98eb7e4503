"""Issue 20 through ``durable-harness run`` (a child process) against the local OpenAI/Anthropic
server: a cut first stream is a failed, retried attempt (exit 0, the retry's answer alone, the
log naming the reason); every attempt cut fails the run at the attempt cap (exit 1). The idle
timeout comes from ``DURABLE_HARNESS_STREAM_IDLE_TIMEOUT``."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from providers.servers import FakeLLMServer, Turn

from durable_harness.providers.failures import IDLE_TIMEOUT_ENV
from durable_harness.storage import open_store

from .conftest import Result

pytestmark = pytest.mark.timeout(120)

Cli = Callable[..., Result]
PARTIAL = "PARTIAL-first-attempt"  # streamed in pieces of 4 characters


@pytest.fixture
def llm_server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as srv:
        yield srv


def session_of(res: Result) -> str:
    found = re.search(r"session ([0-9a-f-]+)", res.err)
    assert found, res.err
    return found.group(1)


def stored(sid: str) -> str:
    with open_store().open_session(sid, write=False) as s:
        return json.dumps([s.iter_entries(), s.records(None)], default=str)


def failures(cli: Cli, sid: str) -> list[dict[str, Any]]:
    """The session's ``provider_request_failed`` records, each checked against the line
    ``durable-harness log --json`` shows for it."""
    with open_store().open_session(sid, write=False) as s:
        recs = s.records(None, types=("provider_request_failed",))
    rows = [r for r in cli("log", sid, "--json").json() if r["type"] == "provider_request_failed"]
    assert [r["seq"] for r in rows] == [r["seq"] for r in recs]
    for row, rec in zip(rows, recs, strict=True):
        assert f"[{rec['reason']}]" in row["summary"], row
    return recs


@pytest.mark.slow
def test_run_retries_a_stream_cut_before_its_finish_reason(
    cli: Cli,
    sh: Cli,
    project: Path,
    llm_server: FakeLLMServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-cut-cli")
    monkeypatch.setenv("OPENAI_BASE_URL", llm_server.openai_base_url)
    # role chunk and 5 of the 6 text chunks: no finish_reason, no [DONE], a clean end
    llm_server.queue(Turn(text=PARTIAL, end_after=6), Turn(text="The whole answer."))
    res = sh("run", "hi", "--provider", "openai:gpt-test", "--cwd", str(project))
    assert res.code == 0, res.err
    assert "run completed" in res.err
    assert "[attempt 1 failed: openai: the stream ended" in res.out
    sid = session_of(res)

    failed = failures(cli, sid)
    assert [(r["attempt"], r["reason"], r["retryable"]) for r in failed] == [
        (1, "stream_truncated", True)
    ]
    assert "[stream_truncated]" in cli("log", sid).out
    ctx = cli("context", sid, "--json").json()
    assert [m["role"] for m in ctx] == ["user", "assistant"]
    assert ctx[1]["content"] == [{"type": "text", "text": "The whole answer."}]
    assert "PARTIAL" not in stored(sid)


@pytest.mark.slow
def test_run_fails_at_the_attempt_cap_when_every_stream_is_cut(
    cli: Cli,
    sh: Cli,
    project: Path,
    llm_server: FakeLLMServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-cut-cli")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", llm_server.anthropic_base_url)
    monkeypatch.setenv(IDLE_TIMEOUT_ENV, "0.5")
    # the default cap is 5 attempts: streams without message_stop, resets, and silent ones
    cuts = [
        Turn(text=PARTIAL, end_after=-1),
        Turn(text=PARTIAL, reset_after=5),
        Turn(text=PARTIAL, delay=10.0, delay_after=5),
        Turn(text=PARTIAL, end_after=-1),
        Turn(text=PARTIAL, delay=10.0, delay_after=5),
    ]
    llm_server.queue(*cuts, Turn(text="never requested"))
    res = sh("run", "hi", "--provider", "anthropic:claude-test", "--cwd", str(project))
    assert res.code == 1, res.err
    assert "attempt cap reached" in res.err and "run failed" in res.err
    assert llm_server.pending == 1
    sid = session_of(res)
    failed = failures(cli, sid)
    assert [r["reason"] for r in failed] == [
        "stream_truncated",
        "stream_truncated",
        "stream_idle_timeout",
        "stream_truncated",
        "stream_idle_timeout",
    ]
    rows = cli("log", sid, "--json").json()
    assert not [r for r in rows if r["type"] == "provider_request_finished"]
    assert [r["type"] for r in rows].count("run_finished") == 1
    assert [m["role"] for m in cli("context", sid, "--json").json()] == ["user"]
    assert "PARTIAL" not in stored(sid)


def test_run_refuses_a_bad_idle_timeout_before_creating_anything(
    cli: Cli, project: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-cut-cli")
    monkeypatch.setenv(IDLE_TIMEOUT_ENV, "five minutes")
    res = cli("run", "hi", "--provider", "openai:gpt-test", "--cwd", str(project))
    assert res.code != 0
    assert IDLE_TIMEOUT_ENV in res.err and "format_error" in res.err
    assert not home.exists()
