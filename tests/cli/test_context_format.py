"""``durable-harness context SESSION --json --format anthropic|openai`` prints the messages exactly
as that provider's request would carry them; without ``--format`` the stored form (issue 10)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from providers.test_payloads import every_kind_entries

from durable_harness.providers.anthropic_provider import AnthropicProvider
from durable_harness.providers.base import ProviderRequest
from durable_harness.providers.openai_compat import OpenAIProvider
from durable_harness.session import Session
from durable_harness.session.pi import open_pi_file

from .conftest import Result

Cli = Callable[..., Result]


@pytest.fixture
def pi_file(tmp_path: Path) -> Path:
    """A pi v3 file holding every content kind (tests/providers/test_payloads.py)."""
    header = {"type": "session", "version": 3, "id": "pi-wire", "timestamp": "t", "cwd": "/p"}
    path = tmp_path / "wire.jsonl"
    path.write_bytes(
        b"".join(orjson.dumps(x) + b"\n" for x in [header, *every_kind_entries().values()])
    )
    return path


def _stored(pi_file: Path) -> list[dict[str, object]]:
    return Session(open_pi_file(str(pi_file))).context().messages


def test_context_format_anthropic_prints_the_request_messages(cli: Cli, pi_file: Path) -> None:
    res = cli("context", str(pi_file), "--json", "--format", "anthropic")
    assert res.code == 0, res.err
    request = AnthropicProvider("claude-test", api_key="k").build_params(
        ProviderRequest(messages=_stored(pi_file))
    )
    assert json.loads(res.out) == request["messages"]
    assert "sig-own" in res.out and "rs_foreign" not in res.out  # the session's model's own


def test_context_format_anthropic_for_another_model_keeps_no_thinking(
    cli: Cli, pi_file: Path
) -> None:
    res = cli("context", str(pi_file), "--json", "--format", "anthropic", "--model", "claude-2")
    assert res.code == 0, res.err
    assert '"thinking"' not in res.out and "sig-own" not in res.out


def test_context_format_openai_prints_the_request_messages(cli: Cli, pi_file: Path) -> None:
    res = cli("context", str(pi_file), "--json", "--format", "openai")
    assert res.code == 0, res.err
    request = OpenAIProvider("gpt-test", api_key="k").build_params(
        ProviderRequest(messages=_stored(pi_file))
    )
    assert json.loads(res.out) == request["messages"]


def test_context_without_format_prints_the_stored_form(cli: Cli, pi_file: Path) -> None:
    res = cli("context", str(pi_file), "--json")
    assert res.code == 0, res.err
    assert json.loads(res.out) == json.loads(json.dumps(_stored(pi_file)))
    assert "thinkingSignature" in res.out and "toolCallId" in res.out


def test_context_unknown_format_is_refused(cli: Cli, pi_file: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        cli("context", str(pi_file), "--json", "--format", "gemini")
    assert exc.value.code == 2
