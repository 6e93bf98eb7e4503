"""The context of a pi session follows pi's turn rules (``design/context.md``, "pi sessions"):
errored and aborted assistant turns are not replayed; a session of ours keeps an aborted
partial answer (our harness keeps its complete text on purpose)."""

from __future__ import annotations

from pathlib import Path

from durable_harness.session import Session, import_pi_file, open_session
from durable_harness.session.pi import open_pi_file
from durable_harness.storage import open_store

from .test_real_pi import pi_session_file


def _texts(s: Session) -> list[str]:
    return [
        b.get("text", "")
        for m in s.context().messages
        for b in (m["content"] if isinstance(m["content"], list) else [])
        if b.get("type") == "text"
    ]


def test_pi_session_drops_failed_turns(tmp_path: Path) -> None:
    path = pi_session_file(tmp_path / "pi.jsonl")
    store = open_store(f"jsonl:{tmp_path}/st")
    with open_session(str(path), store) as s:
        assert s.written_by_pi
        assert _texts(s) == ["u1", "a1", "r1", "u2", "u3", "final"]
        assert not [c for c in s.context().messages if c.get("toolCallId") == "c2"]
    sid = import_pi_file(str(path), store)
    with store.open_session(sid) as ss:
        assert _texts(Session(ss)) == ["u1", "a1", "r1", "u2", "u3", "final"]
    # the same entries in a session of ours keep the turns (the errored one's text included)
    ours = Session(store.create_session("/w"))
    for e in open_pi_file(str(path)).iter_entries():
        ours.append({k: v for k, v in e.items() if k not in ("seq", "id", "parentId")})
    assert not ours.written_by_pi and "partial" in _texts(ours)
