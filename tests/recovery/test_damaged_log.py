"""Recovery over a damaged log: when the line holding a tool's intent is lost or left out,
"no intent found" no longer proves "never started", so a replay-never tool waits for a decision
instead of running (it may already have run). Decisions are only taken for calls in doubt."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import dh, effects, main_lane, plan_json, session_id, write_script

pytestmark = [pytest.mark.crash, pytest.mark.timeout(120)]

TURNS = [
    {
        "text": "Deploying.",
        "tool_calls": [{"name": "bash", "arguments": {"command": "echo d1 >> effects.log"}}],
    },
    {"text": "done"},
]


def _crashed(tmp_path: Path, point: str) -> tuple[str, str, Path, Path]:
    work = tmp_path / "work"
    work.mkdir()
    script = write_script(tmp_path / "s.json", TURNS)
    spec = f"jsonl:{tmp_path / 'home'}"
    proc = dh(
        "run",
        "deploy",
        "--provider",
        f"scripted:{script}",
        "--store",
        spec,
        "--cwd",
        str(work),
        crash_at=point,
    )
    assert proc.returncode == -9, proc.stderr
    sid = session_id(proc)
    (path,) = (tmp_path / "home").rglob("*.jsonl")
    return sid, spec, work, path


def _damage_intent_line(path: Path) -> None:
    """Put a NUL byte into the line holding the tool_started intent."""
    lines = path.read_bytes().split(b"\n")
    (i,) = [n for n, line in enumerate(lines) if b'"tool_started"' in line]
    lines[i] = lines[i][:40] + b"\0" + lines[i][41:]
    path.write_bytes(b"\n".join(lines))


def test_a_lost_intent_does_not_make_a_never_tool_run_again(tmp_path: Path) -> None:
    sid, spec, work, path = _crashed(tmp_path, "after_tool_effect")
    assert effects(work) == {"d1": 1}
    _damage_intent_line(path)
    lane = main_lane(plan_json(sid, spec))
    (call,) = lane["tool_calls"]
    assert (call["status"], call["doubt"]) == ("in_doubt", "damaged_log")  # intent may be lost
    assert call["action"] == "await_decision" and lane["reason"] == "awaiting_decision"
    resumed = dh("resume", sid, "--store", spec, "--quiet")
    assert resumed.returncode == 5, resumed.stdout + resumed.stderr  # suspended
    assert effects(work) == {"d1": 1}  # not run a second time
    decided = dh(
        "resume",
        sid,
        "--store",
        spec,
        "--quiet",
        "--decide",
        f"{call['tool_call_id']}=result:already deployed",
    )
    assert decided.returncode == 0, decided.stdout + decided.stderr
    assert effects(work) == {"d1": 1}


def test_a_decision_about_a_call_that_has_not_started_is_refused(tmp_path: Path) -> None:
    sid, spec, work, _path = _crashed(tmp_path, "after_assistant_entry")
    (call,) = main_lane(plan_json(sid, spec))["tool_calls"]
    assert call["status"] == "not_started" and call["action"] == "execute"
    refused = dh("resume", sid, "--store", spec, "--decide", f"{call['tool_call_id']}=fail")
    assert refused.returncode == 2
    assert "recovery_error" in refused.stderr
    assert effects(work) == {}  # nothing ran
    ok = dh("resume", sid, "--store", spec, "--quiet")
    assert ok.returncode == 0 and effects(work) == {"d1": 1}
