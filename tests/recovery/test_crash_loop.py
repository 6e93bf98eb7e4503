"""A crash loop: the process dies at ``after_provider_request_started`` on the first run and on
every ``resume``. The durable attempt count stops the loop at the cap (default 5): the run is
parked as failed with its reason instead of being re-issued forever. The same holds when the
request that kills the process is an automatic compaction inside the run."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from .helpers import (
    dh,
    main_lane,
    plan_json,
    read_session,
    session_id,
    store_spec,
    write_script,
)

CAP = 5
POINT = "after_provider_request_started"


# a context window just above the default reserve (16,384 tokens): a prompt of a few hundred
# tokens is over the limit, so the run compacts before its first turn
SMALL_WINDOW = 16_500
LONG_PROMPT = "loop " + "lorem ipsum dolor sit amet " * 60


@pytest.mark.crash
@pytest.mark.timeout(120)
# the attempt count is kept by the one lane fold every backend applies (storage/fold.py): both
# purposes on JSONL, and SQLite's own rows once
@pytest.mark.parametrize(
    ("backend", "purpose"), [("jsonl", "turn"), ("jsonl", "compaction"), ("sqlite", "turn")]
)
def test_crash_loop_parks_at_attempt_cap(backend: str, purpose: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    spec = store_spec(backend, tmp_path)
    extra = {"context_window": SMALL_WINDOW} if purpose == "compaction" else {}
    script = write_script(tmp_path / "script.json", [{"text": "never delivered"}], **extra)
    prompt = LONG_PROMPT if purpose == "compaction" else "loop"
    first = dh(
        "run", prompt, "--provider", f"scripted:{script}", "--store", spec, "--cwd", str(work),
        crash_at=POINT,
    )  # fmt: skip
    assert first.returncode == -signal.SIGKILL, first.stderr
    sid = session_id(first)

    crashes = 1
    resumes = 0
    last = None
    while resumes <= CAP:  # the loop must end by itself within cap + 1 resumes
        lane = main_lane(plan_json(sid, spec))
        # every crash left one more durable attempt, each with unknown cost
        assert lane["attempts"] == {f"{purpose} 1": crashes}
        assert lane["cost_unknown_attempts"] == crashes
        assert lane["next_action"] == (
            "park_failed_attempt_cap" if crashes >= CAP else "reissue_provider_request"
        )
        assert lane["purpose"] == purpose
        last = dh("resume", sid, "--store", spec, crash_at=POINT)
        resumes += 1
        if last.returncode != -signal.SIGKILL:
            break
        crashes += 1
    assert last is not None
    assert resumes <= CAP + 1
    assert crashes == CAP, "the capped resume must not issue a sixth attempt"
    assert resumes == CAP
    assert last.returncode == 1, last.stdout + last.stderr  # EXIT["failed"]
    assert "lane main: failed" in last.stdout

    records, _entries, _loc = read_session(spec, sid)
    starts = [r for r in records if r["type"] == "provider_request_started"]
    assert [r["attempt"] for r in starts] == list(range(1, CAP + 1))
    assert {r.get("purpose", "turn") for r in starts} == {purpose}
    (finished,) = [r for r in records if r["type"] == "run_finished"]
    assert finished["outcome"] == "failed"
    assert f"{CAP} of {CAP}" in finished["reason"]
    assert "attempt" in finished["reason"]
    assert not [r for r in records if r["type"] == "provider_request_finished"]

    after = main_lane(plan_json(sid, spec))
    assert (after["state"], after["next_action"], after["run_id"]) == ("idle", "none", None)
    # a further resume has nothing to do and does not start a new attempt
    again = dh("resume", sid, "--store", spec, crash_at=POINT)
    assert again.returncode == 0, again.stderr
    records, _entries, _loc = read_session(spec, sid)
    assert len([r for r in records if r["type"] == "provider_request_started"]) == CAP
