"""Issue 23, "OpenTelemetry and logs from every front": a real ``durable-harness serve`` child
configured by the standard ``OTEL_*`` variables alone exports its spans over OTLP/HTTP to a
receiver in the test (the protobuf decoded with ``opentelemetry-proto``), in the GenAI
conventions, recovery steps included; ``--log-format json`` makes stderr one JSON object per
line; ``/metrics`` answers OpenMetrics to a scraper that asks for it
(``design/observability.md``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.proto", reason="the otel extra is not installed")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="no OTLP exporter")

from otlp_receiver import Receiver, otel_env
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from durable_harness.storage import open_store

from .util import Server, make_sessions, poll, wait_state

pytestmark = [pytest.mark.slow]

PLAN = "durable_harness.recovery.plan"  # the span of a session's recovery plan


def crashed_in_doubt(tmp_path: Path) -> tuple[str, str]:
    """A ``durable-harness run`` child SIGKILLed right after its ``bash`` call's intent is
    durable: the call is in doubt. Returns ``(store spec, session id)``."""
    work = tmp_path / "work"
    work.mkdir(parents=True)
    script = tmp_path / "script.json"
    bash = {"name": "bash", "arguments": {"command": "echo ran >> effects.log"}}
    turns = [{"text": "Running it.", "tool_calls": [bash]}, {"text": "Finished."}]
    script.write_text(json.dumps({"turns": turns}))
    spec = f"jsonl:{tmp_path / 'store'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_HARNESS")}
    env["DURABLE_HARNESS_HOME"] = str(tmp_path / "home")
    env["DURABLE_HARNESS_CRASH_AT"] = "after_tool_started"
    argv = [sys.executable, "-m", "durable_harness", "run", "do it", "--store", spec]
    argv += ["--provider", f"scripted:{script}", "--cwd", str(work)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode < 0, f"the child did not crash: {proc.returncode} {proc.stderr}"
    sid = next(line.split()[1] for line in proc.stderr.splitlines() if line.startswith("session "))
    return spec, sid


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every non-empty line of ``text`` as JSON (fails on a line that is not)."""
    out = []
    for line in text.splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError:
                raise AssertionError(f"not a JSON line on stderr: {line!r}\n{text}") from None
    return out


@pytest.mark.timeout(180)
def test_serve_exports_genai_spans_from_otel_env_logs_json_and_serves_openmetrics(
    receiver: Receiver,
    start_server: Callable[..., Server],
    script: Callable[..., str],
    workdir: Path,
    tmp_path: Path,
) -> None:
    # a session crashed with its bash call in doubt: serving it, the decision resumes it
    spec, crashed = crashed_in_doubt(tmp_path / "crash")
    with open_store(spec).open_session(crashed, write=False) as store:
        (started,) = store.records(types=("tool_started",))
    call_id = started["toolCallId"]
    provider = script(
        [
            {
                "text": "listing",
                "tool_calls": [{"name": "bash", "arguments": {"command": "echo hi"}}],
                "usage": {"input": 100, "output": 10, "cacheRead": 40, "cacheWrite": 5},
            },
            {"text": "done", "usage": {"input": 20, "output": 2}},
        ]
    )
    server = start_server(spec, "--log-format", "json", env=otel_env(receiver))
    with server.client() as c:
        sid = c.post("/sessions", json={"cwd": str(workdir), "provider": provider}).json()["id"]
        assert c.post(f"/sessions/{sid}/agent/send", json={"message": "go"}).status_code == 202
        wait_state(c, sid, "idle")
        decided = c.post(
            f"/sessions/{crashed}/agent/decide",
            json={"tool_call_id": call_id, "decision": "result:it ran"},
        )
        assert decided.status_code == 200, decided.text
        wait_state(c, crashed, "idle")

        # OpenMetrics when asked, the text format otherwise
        om = c.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        assert om.headers["content-type"].startswith("application/openmetrics-text")
        assert om.text.endswith("# EOF\n")
        families = {f.name: f for f in text_string_to_metric_families(om.text)}
        runs = families["durable_harness_runs"]
        assert runs.type == "counter"
        completed = [s for s in runs.samples if s.labels.get("outcome") == "completed"]
        assert completed and completed[0].value >= 2
        plain = c.get("/metrics")
        assert plain.headers["content-type"].startswith("text/plain")
        assert "# EOF" not in plain.text

    # -- the spans, from the environment variables alone
    def chats() -> list[dict[str, Any]] | None:
        found = [s for s in receiver.named("chat ") if s["attrs"]["gen_ai.conversation.id"] == sid]
        # the batch exporter sends on its own schedule, in batches of its own: wait for every
        # span read below (a run's tool span, the recovery's plan and decision, and the span of
        # the call the decision settled, which a later batch may carry)
        tool_sessions = {
            s["attrs"]["gen_ai.conversation.id"] for s in receiver.named("execute_tool")
        }
        plans = {s["attrs"]["durable_harness.session.id"] for s in receiver.named(PLAN)}
        ready = (
            receiver.named("durable_harness.recovery.decision")
            and {sid, crashed} <= tool_sessions
            and crashed in plans
        )
        return found if len(found) == 2 and ready else None

    found = poll(chats, "the spans of the new session's run and of the recovery")
    by_reason = {s["attrs"]["gen_ai.response.finish_reasons"]: s for s in found}
    assert set(by_reason) == {("tool_call",), ("stop",)}
    tool_turn = by_reason[("tool_call",)]["attrs"]
    assert tool_turn["gen_ai.operation.name"] == "chat"
    assert tool_turn["gen_ai.provider.name"] == "scripted"
    assert tool_turn["gen_ai.usage.input_tokens"] == 145  # 100 + 40 cached + 5 written
    assert tool_turn["gen_ai.usage.cache_read.input_tokens"] == 40
    assert tool_turn["gen_ai.usage.cache_creation.input_tokens"] == 5
    assert tool_turn["gen_ai.usage.output_tokens"] == 10
    assert by_reason[("stop",)]["attrs"]["gen_ai.usage.input_tokens"] == 20
    assert by_reason[("stop",)]["resource"]["service.name"] == "dh-under-test"
    tools = [
        s
        for s in receiver.named("execute_tool bash")
        if s["attrs"]["gen_ai.conversation.id"] == sid
    ]
    assert len(tools) == 1
    assert tools[0]["attrs"]["gen_ai.tool.name"] == "bash"
    assert tools[0]["attrs"]["gen_ai.tool.call.id"].startswith("call_")

    # the recovery of the crashed session: a plan span, its decision a child of it
    plans = [
        s
        for s in receiver.named("durable_harness.recovery.plan")
        if s["attrs"]["durable_harness.session.id"] == crashed
    ]
    assert plans, receiver.spans
    decisions = receiver.named("durable_harness.recovery.decision")
    assert [d["attrs"]["gen_ai.tool.call.id"] for d in decisions] == [call_id]
    assert decisions[0]["attrs"]["durable_harness.decision"] == "result"
    assert decisions[0]["parent"] == plans[-1]["id"]
    assert decisions[0]["scope"] == "durable_harness.recovery"
    settled = [
        s
        for s in receiver.named("execute_tool bash")
        if s["attrs"]["gen_ai.conversation.id"] == crashed
    ]
    assert [s["attrs"]["gen_ai.tool.call.id"] for s in settled] == [call_id]

    # -- the logs: stderr is JSON lines, with the ids a reader filters on
    server.stop()
    records = json_lines(server.stderr())
    events = [(r["event"], r.get("session_id")) for r in records]
    assert ("notice", None) in events  # "sessions may be created in any directory"
    assert ("decision", crashed) in events
    (resumed,) = [r for r in records if r["event"] == "resume"]
    assert resumed["session_id"] == crashed and resumed["generation"] == 2
    lifecycle = [r for r in records if r["event"] == "lifecycle" and r["session_id"] == sid]
    assert [r["state"] for r in lifecycle][:3] == ["idle", "running", "idle"]
    assert {r["generation"] for r in lifecycle} == {1}
    run_end = [r for r in records if r["event"] == "run_end" and r["session_id"] == sid]
    assert run_end[0]["outcome"] == "completed" and run_end[0]["lane"] == "main"
    assert run_end[0]["run_id"] and run_end[0]["generation"] == 1
    for r in records:
        assert {"time", "level", "logger", "event", "message"} <= set(r)


@pytest.mark.postgres
@pytest.mark.crash
@pytest.mark.timeout(180)
@pytest.mark.parametrize("log_format", ["json", "text"])
def test_a_worker_logs_the_sessions_it_claims_and_resumes(
    log_format: str,
    start_server: Callable[..., Server],
    script: Callable[..., str],
    pg_spec: str,
    tmp_path: Path,
) -> None:
    """Issue 23: "a worker that took over three sessions printed nothing"; now each claim and
    resume is a record, in the text format too (``DURABLE_HARNESS_LOG_FORMAT`` here)."""
    gate = tmp_path / "gate"
    provider = script(
        [
            {"text": "waiting", "wait_for": str(gate)},
            {"text": "done"},
        ]
    )
    fast = {"DURABLE_HARNESS_PG_LEASE_S": "3"}
    worker = start_server(
        pg_spec, "--claim-interval", "0.3", env={**fast, "DURABLE_HARNESS_LOG_FORMAT": log_format}
    )
    crashing = start_server(pg_spec, "--claim-interval", "0", env=fast)
    sids = list(make_sessions(crashing, 3, tmp_path, provider))
    with crashing.client() as c:
        for sid in sids:
            wait_state(c, sid, "running")
    crashing.proc.send_signal(signal.SIGKILL)
    crashing.proc.wait(timeout=10)

    def claimed() -> list[str] | None:
        text = worker.stderr()
        found = [sid for sid in sids if f"session {sid}: resumed" in text]
        return found if len(found) == len(sids) else None

    poll(claimed, "the worker to claim and resume the three sessions", timeout=90)
    gate.touch()
    text = worker.stderr()
    if log_format == "text":
        for sid in sids:
            assert f"durable-harness: session {sid}: claimed from a crashed worker" in text, text
            assert f"durable-harness: session {sid}: resumed as generation 2" in text, text
        return
    records = json_lines(text)
    for sid in sids:
        (claim,) = [r for r in records if r["event"] == "claim" and r["session_id"] == sid]
        assert claim["generation"] == 2 and claim["logger"] == "durable_harness.host.worker"
        (resume,) = [r for r in records if r["event"] == "resume" and r["session_id"] == sid]
        assert resume["generation"] == 2 and resume["lanes"] == {
            "main": "reissue_provider_request"
        }, resume
        assert resume["lane"] == "main" and resume["run_id"], resume


@pytest.mark.timeout(120)
def test_resume_and_run_export_spans_and_log_json_from_the_environment(
    receiver: Receiver, tmp_path: Path
) -> None:
    """The CLI's ``run`` (crashed by SIGKILL) and ``resume`` with a decision, each configured
    by ``OTEL_*`` and ``DURABLE_HARNESS_LOG_FORMAT=json`` alone."""
    spec, sid = crashed_in_doubt(tmp_path)
    with open_store(spec).open_session(sid, write=False) as store:
        (started,) = store.records(types=("tool_started",))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_HARNESS")}
    env.update(otel_env(receiver), DURABLE_HARNESS_LOG_FORMAT="json")
    env["DURABLE_HARNESS_HOME"] = str(tmp_path / "home")
    argv = [sys.executable, "-m", "durable_harness", "resume", sid, "--store", spec]
    argv += [
        "--decide",
        f"{started['toolCallId']}=fail",
        "--provider",
        "scripted:" + str(tmp_path / "script.json"),
    ]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    records = json_lines(proc.stderr)
    (resumed,) = [r for r in records if r["event"] == "resume"]
    assert (resumed["session_id"], resumed["lane"], resumed["outcome"]) == (
        sid,
        "main",
        "completed",
    )
    (end,) = [r for r in records if r["event"] == "run_end"]
    assert end["session_id"] == sid and end["run_id"] and end["outcome"] == "completed"
    # the spans were flushed before the command exited: no polling needed
    plans = receiver.named("durable_harness.recovery.plan")  # the printed plan, maybe more
    assert plans and {p["attrs"]["durable_harness.session.id"] for p in plans} == {sid}
    assert plans[0]["resource"]["service.name"] == "dh-under-test"
    decisions = receiver.named("durable_harness.recovery.decision")
    assert decisions and {d["attrs"]["durable_harness.decision"] for d in decisions} == {"fail"}
    assert {d["parent"] for d in decisions} <= {p["id"] for p in plans}
    runs = receiver.named("durable_harness.run")
    assert [r["attrs"]["gen_ai.conversation.id"] for r in runs] == [sid]
    assert runs[0]["attrs"]["durable_harness.outcome"] == "completed"

    # a plain run: its records say which session and run, its spans arrive before it exits
    script = tmp_path / "hello.json"
    script.write_text(
        json.dumps({"turns": [{"text": "hello", "usage": {"input": 7, "output": 1}}]})
    )
    argv = [sys.executable, "-m", "durable_harness", "run", "hi", "--store", spec]
    argv += ["--provider", f"scripted:{script}", "--cwd", str(tmp_path)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    records = json_lines(proc.stderr)
    (session,) = [r for r in records if r["event"] == "session"]
    (outcome,) = [r for r in records if r["event"] == "run_outcome"]
    assert outcome["session_id"] == session["session_id"] != sid
    assert outcome["outcome"] == "completed" and outcome["run_id"]
    (chat,) = [
        c
        for c in receiver.named("chat ")
        if c["attrs"]["gen_ai.conversation.id"] == session["session_id"]
    ]
    assert chat["attrs"]["gen_ai.response.finish_reasons"] == ("stop",)
    assert chat["attrs"]["durable_harness.run.id"] == outcome["run_id"]
