"""The CLI door of the provider rule (``durable_harness.providers.choice``): a session run with
OpenAI ``gpt-5.1`` and continued, or resumed after a SIGKILL, with ``--provider anthropic:...``
sends Anthropic's model to Anthropic, never ``gpt-5.1`` (issue 20)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from providers.servers import FakeLLMServer, Turn

from durable_harness.cli.main import main
from durable_harness.crashtest import forkserver

_SCRIPT = Path(sys.executable).with_name("durable-harness")
DH = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "durable_harness"]


@pytest.fixture
def llm_server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as srv:
        yield srv


def _dh(
    srv: FakeLLMServer, *args: str, crash_at: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_HARNESS_CRASH")}
    env.update(
        OPENAI_BASE_URL=srv.openai_base_url,
        ANTHROPIC_BASE_URL=srv.anthropic_base_url,
        OPENAI_API_KEY="k",
        ANTHROPIC_API_KEY="k",
    )
    if crash_at:
        env["DURABLE_HARNESS_CRASH_AT"] = crash_at
    # a child forked with the CLI warm: no interpreter start (issue 22)
    return forkserver.run_cli(list(args), env=env, cwd=os.getcwd(), timeout=60)


def _read(*args: str) -> subprocess.CompletedProcess[str]:
    """A command that only reads the store (``cost``, ``sessions``), run in this process
    through the CLI's ``main(argv)``: it reaches no provider and crashes nowhere, so a fresh
    interpreter would only cost its start-up (design/architecture.md, "Suite time")."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_run_and_resume_with_another_provider_send_its_own_model(
    llm_server: FakeLLMServer, tmp_path: Path
) -> None:
    store = f"jsonl:{tmp_path / 'home'}"
    llm_server.queue(Turn(text="one"), Turn(text="two"), Turn(text="three"))
    first = _dh(llm_server, "run", "hi", "--provider", "openai:gpt-5.1", "--store", store)
    assert first.returncode == 0, first.stderr
    match = re.search(r"session (\S+)", first.stderr)
    assert match, first.stderr
    sid = match.group(1)

    again = _dh(
        llm_server, "run", "again", "--session", sid, "--provider", "anthropic:claude-x",
        "--store", store,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr

    # a run on OpenAI killed after its intent; resumed with Anthropic given
    killed = _dh(
        llm_server, "run", "third", "--session", sid, "--provider", "openai:gpt-5.1",
        "--store", store, crash_at="after_provider_request_started",
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = _dh(llm_server, "resume", sid, "--provider", "anthropic:claude-x", "--store", store)
    assert resumed.returncode == 0, resumed.stderr + resumed.stdout
    sent = [(r.path, r.body["model"]) for r in llm_server.requests]
    assert sent == [
        ("/v1/chat/completions", "gpt-5.1"),
        ("/v1/messages", "claude-x"),
        ("/v1/messages", "claude-x"),
    ]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_network_model_without_a_price_costs_unknown_and_price_supplies_it(
    llm_server: FakeLLMServer, tmp_path: Path
) -> None:
    """Issue 20: no price known for the model -> ``cost`` null in the record and
    ``unknown`` in ``durable-harness cost``; ``--price`` on ``run`` and on ``resume`` prices
    the tokens; a bad ``--price`` is a ``format_error`` that creates nothing."""
    import json

    store = f"jsonl:{tmp_path / 'home'}"
    usage = {"input": 1000, "output": 100}
    llm_server.queue(Turn(text="one", usage=usage), Turn(text="two", usage=usage))
    llm_server.queue(Turn(text="three", usage=usage))
    first = _dh(llm_server, "run", "hi", "--provider", "openai:gpt-5.1", "--store", store)
    assert first.returncode == 0, first.stderr
    sid = re.search(r"session (\S+)", first.stderr).group(1)  # type: ignore[union-attr]
    unknown = _read("cost", sid, "--store", store)
    assert "session total: 1100 tokens, unknown" in unknown.stdout, unknown.stdout

    priced = _dh(
        llm_server, "run", "again", "--session", sid, "--provider", "openai:gpt-5.1",
        "--price", "2,10", "--store", store,
    )  # fmt: skip
    assert priced.returncode == 0, priced.stderr
    report = json.loads(_read("cost", sid, "--json", "--store", store).stdout)
    costs = [t["cost"] for t in report["turns"]]
    assert costs == [None, pytest.approx((1000 * 2 + 100 * 10) / 1e6)]
    assert report["total"]["cost"] is None
    assert report["total"]["known_cost"] == pytest.approx(0.003)
    shown = _read("cost", sid, "--store", store).stdout
    assert "session total: 2200 tokens, ≥ $0.003000 (1 unknown)" in shown, shown

    killed = _dh(
        llm_server, "run", "third", "--session", sid, "--provider", "openai:gpt-5.1",
        "--store", store, crash_at="after_provider_request_started",
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = _dh(llm_server, "resume", sid, "--price", "2,10", "--store", store)
    assert resumed.returncode == 0, resumed.stderr + resumed.stdout
    report = json.loads(_read("cost", sid, "--json", "--store", store).stdout)
    assert report["turns"][-1]["cost"] == pytest.approx(0.003)

    bad = _dh(
        llm_server, "run", "x", "--provider", "openai:m", "--price", "cheap", "--store", store
    )
    assert bad.returncode == 2 and "error[format_error]" in bad.stderr, bad.stderr
    sessions = json.loads(_read("sessions", "--json", "--store", store).stdout)
    assert [s["id"] for s in sessions] == [sid]
