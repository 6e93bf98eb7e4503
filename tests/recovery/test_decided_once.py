"""A decision on record for a call attempt is never replaced (issue 20), through the library
(``recover``/``resume(decisions=...)``) and the CLI (``resume --decide``); a retried call that is
in doubt again after a new crash is a new attempt and takes a new decision.

Each test starts from a real SIGKILL: ``durable-harness run`` with two replay-never bash calls
that run at once, killed after both effects, neither settled (each command appends its tag,
then waits for the other's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from durable_harness.errors import AlreadyDecided
from durable_harness.recovery.resume import recover, resume
from durable_harness.session.session import Session
from durable_harness.storage import open_store
from durable_harness.tools.builtin import builtin_tools

from .helpers import BACKENDS, dh, effects, read_session, session_id, store_spec, write_script

pytestmark = [pytest.mark.crash, pytest.mark.timeout(180)]


def _command(log: Path, mine: str, other: str) -> str:
    return f"echo {mine} >> {log}; until grep -q {other} {log}; do sleep 0.01; done"


def crashed_with_two_in_doubt(tmp_path: Path, backend: str) -> tuple[str, str, Path]:
    """``(store spec, session id, working directory)`` of a run SIGKILLed with both calls in
    doubt and both effects done."""
    work = tmp_path / "work"
    work.mkdir()
    log = work / "effects.log"
    calls = [
        {"id": f"call_{n}", "name": "bash", "arguments": {"command": _command(log, n, o)}}
        for n, o in (("a", "b"), ("b", "a"))
    ]
    script = write_script(tmp_path / "s.json", [{"text": "", "tool_calls": calls}, {"text": "ok"}])
    spec = store_spec(backend, tmp_path)
    proc = dh(
        "run", "go", "--store", spec, "--provider", f"scripted:{script}", "--cwd", str(work),
        "--quiet", crash_at="after_tool_effect",
    )  # fmt: skip
    assert proc.returncode == -9, proc.stderr
    assert effects(work) == {"a": 1, "b": 1}
    return spec, session_id(proc), work


def decisions_of(spec: str, sid: str) -> list[tuple[Any, ...]]:
    records, _entries, _where = read_session(spec, sid)
    return [
        (r["toolCallId"], r["decision"], r.get("attempt"))
        for r in records
        if r["type"] == "decision"
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_library_resume_refuses_a_second_decision_and_writes_nothing(
    tmp_path: Path, backend: str
) -> None:
    spec, sid, work = crashed_with_two_in_doubt(tmp_path, backend)
    store = open_store(spec)
    tools = builtin_tools()

    async def resume_with(decisions: dict[str, dict[str, Any]]) -> dict[str, str]:
        with Session(store.open_session(sid)) as s:
            return await resume(s, tools, decisions=decisions)

    got = anyio.run(resume_with, {"call_a": {"decision": "result", "result": "a done"}})
    assert got == {"main": "suspended"}  # call_b still waits
    before = read_session(spec, sid)[0]
    key_a = next(r["callKey"] for r in before if r["type"] == "decision")
    for name, decision in (("call_a", "retry"), (key_a, "fail")):
        with pytest.raises(AlreadyDecided) as caught:
            anyio.run(resume_with, {name: {"decision": decision}})
        err = caught.value
        assert err.code == "already_decided"
        assert (err.details["tool_call_id"], err.details["call_key"]) == ("call_a", key_a)
        assert err.details["on_record"]["decision"] == "result"
        assert err.details["on_record"]["result"] == "a done"
        assert "call_a" in err.message and "already decided" in err.message
    # the planner refuses the same way (recover is read-only)
    with Session(store.open_session(sid, write=False)) as s, pytest.raises(AlreadyDecided):
        recover(s.store, tools, decisions={"call_a": {"decision": "retry"}})
    assert read_session(spec, sid)[0] == before  # nothing written
    assert effects(work) == {"a": 1, "b": 1}  # nothing re-ran

    got = anyio.run(resume_with, {"call_b": {"decision": "result", "result": "b done"}})
    assert got == {"main": "completed"}
    assert decisions_of(spec, sid) == [("call_a", "result", 1), ("call_b", "result", 1)]
    assert effects(work) == {"a": 1, "b": 1}


def test_cli_resume_decide_twice_is_refused_and_a_new_attempt_is_decided_anew(
    tmp_path: Path,
) -> None:
    spec, sid, work = crashed_with_two_in_doubt(tmp_path, "sqlite")

    listed = dh("sessions", "--store", spec, "--state", "suspended", "--json")
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert row["id"] == sid and row["state"] == "suspended"
    assert sorted(w["tool_call_id"] for w in row["waiting"]) == ["call_a", "call_b"]
    text = dh("sessions", "--store", spec).stdout.splitlines()
    assert text[0].split() == ["ID", "MODIFIED", "STATE", "WAITING", "CWD", "TITLE"]
    assert text[1].split()[:1] + text[1].split()[2:4] == [sid, "suspended", "2"]
    assert json.loads(dh("sessions", "--store", spec, "--state", "idle", "--json").stdout) == []

    first = dh("resume", sid, "--store", spec, "--decide", "call_a=result:a done", "--quiet")
    assert first.returncode == 5, first.stderr  # suspended: call_b still waits
    before = read_session(spec, sid)[0]
    again = dh("resume", sid, "--store", spec, "--decide", "call_a=retry", "--quiet")
    assert again.returncode == 2, again.stderr  # README "Exit status": a refused decision
    assert "error[already_decided]" in again.stderr and "call_a" in again.stderr
    assert read_session(spec, sid)[0] == before
    assert effects(work) == {"a": 1, "b": 1}
    (row,) = json.loads(dh("sessions", "--store", spec, "--json").stdout)
    assert [w["tool_call_id"] for w in row["waiting"]] == ["call_b"]

    # a retry that crashes in doubt again: a new attempt, which takes a new decision
    retried = dh(
        "resume", sid, "--store", spec, "--decide", "call_b=retry", "--quiet",
        crash_at="after_tool_effect",
    )  # fmt: skip
    assert retried.returncode == -9, retried.stderr
    assert effects(work) == {"a": 1, "b": 2}  # the retry the operator asked for
    (row,) = json.loads(dh("sessions", "--store", spec, "--json").stdout)
    assert [(w["tool_call_id"], w["attempt"]) for w in row["waiting"]] == [("call_b", 2)]
    done = dh("resume", sid, "--store", spec, "--decide", "call_b=result:b done", "--quiet")
    assert done.returncode == 0, done.stderr
    assert decisions_of(spec, sid) == [
        ("call_a", "result", 1),
        ("call_b", "retry", 1),
        ("call_b", "result", 2),
    ]
    assert effects(work) == {"a": 1, "b": 2}


def test_decision_records_have_one_writer() -> None:
    """Every ``decision`` record is built by ``recovery/decisions.py`` (the harness and the
    host both call it): no other module of the package builds one."""
    import ast

    import durable_harness

    root = Path(durable_harness.__file__).parent
    writers = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == "decision"
                and getattr(node.func, "id", getattr(node.func, "attr", None)) == "record"
            ):
                writers.add(str(path.relative_to(root)))
    assert writers == {"recovery/decisions.py"}
