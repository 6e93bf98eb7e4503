"""``durable-harness export``: a session as a pi session file (format version 3) that reads back
as the same session, and as one self-contained HTML page (``design/pi.md``)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durable_harness.session import Session, import_pi_file, open_session
from durable_harness.session.pi import LEAF_TYPE, LOG_TYPE, open_pi_file
from durable_harness.session.pi_export import pi_entries
from durable_harness.storage import Store, open_store

from .conftest import Result

Cli = Callable[..., Result]
PACKAGED = Path(__file__).resolve().parents[2] / "durable_harness" / "data" / "v3-branched.jsonl"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_bytes().splitlines() if x.strip()]


def _tree(s: Session) -> dict[str, dict[str, Any]]:
    return {e["id"]: {k: v for k, v in e.items() if k != "seq"} for e in s.store.iter_entries()}


def _run(cli: Cli, script: Path, project: Path) -> str:
    res = cli("run", "Read the notes", "--provider", f"scripted:{script}", "--cwd", str(project))
    assert res.code == 0, res.err
    listed = cli("sessions", "--json").json()
    return str(listed[0]["id"])


def test_pi_file_round_trips_through_export(cli: Cli, tmp_path: Path) -> None:
    """import -> export gives pi's lines back (header aside); import of the export equals."""
    store = open_store(f"jsonl:{tmp_path}/st")
    sid = import_pi_file(str(PACKAGED), store)
    out = tmp_path / "out.jsonl"
    res = cli("export", sid, "--store", f"jsonl:{tmp_path}/st", "-o", str(out), "--json")
    assert res.code == 0, res.err
    assert res.json()["lines"] == len(_lines(PACKAGED))
    header, *entries = _lines(out)
    assert header == {
        "type": "session",
        "version": 3,
        "id": sid,
        "timestamp": header["timestamp"],
        "cwd": "/home/user/project",
    }
    assert entries == _lines(PACKAGED)[1:]  # every entry as pi wrote it, in pi's order
    again = import_pi_file(str(out), store)
    with store.open_session(sid) as a, store.open_session(again) as b:
        assert _tree(Session(a)) == _tree(Session(b))
        assert Session(a).leaf() == Session(b).leaf()
        assert Session(a).context().messages == Session(b).context().messages


def _branched(store: Store) -> Session:
    """root -> u1 -> a1 -> u2 -> a2, and a second branch u3 under a1 (written last)."""
    s = Session(store.create_session("/work"))
    s.set_model("anthropic", "claude-sonnet-4-5")
    u1 = s.append_message({"role": "user", "content": [{"type": "text", "text": "one"}]})
    a1 = s.append_message(
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "first answer"}],
            "provider": "anthropic",
            "model": "claude-sonnet-4-5",
            "usage": {"input": 10, "output": 2, "totalTokens": 12, "cost": None},
            "stopReason": "stop",
        }
    )
    s.append_message({"role": "user", "content": [{"type": "text", "text": "two"}]})
    s.set_label(u1["id"], "start")
    s.navigate(a1["id"])
    s.append_message({"role": "user", "content": [{"type": "text", "text": "three"}]})
    return s


def _round_trip(s: Session, tmp_path: Path, lane: str = "main") -> Session:
    path = tmp_path / f"{s.leaf(lane)}.jsonl"
    path.write_bytes(b"".join(json.dumps(x).encode() + b"\n" for x in pi_entries(s, lane)))
    return Session(open_pi_file(str(path)))


def test_leaf_not_last_moves_or_is_marked(tmp_path: Path) -> None:
    """The lane's leaf ends the file (moved there, or marked by a custom entry pi ignores), and
    reads back as the leaf; an unknown cost (None) is zeros for pi and None again here."""
    store = open_store(f"jsonl:{tmp_path}/st")
    s = _branched(store)
    leaf = s.leaf()
    back = _round_trip(s, tmp_path)
    assert back.leaf() == leaf and _tree(back) == _tree(s)
    assert back.context().messages == s.context().messages
    # a leaf with children elsewhere: a marker entry under it, dropped on the way back
    a1 = next(e for e in s.store.iter_entries() if e.get("message", {}).get("role") == "assistant")
    s.navigate(a1["id"])
    lines = pi_entries(s)
    assert lines[-1]["type"] == "custom" and lines[-1]["customType"] == LEAF_TYPE
    assert lines[-1]["parentId"] == a1["id"]
    cost = next(x for x in lines if x.get("id") == a1["id"])["message"]["usage"]
    assert cost["cost"]["total"] == 0 and cost["costUnknown"] is True
    back = _round_trip(s, tmp_path)
    assert back.leaf() == a1["id"] and _tree(back) == _tree(s)
    assert back.entry(a1["id"])["message"]["usage"]["cost"] is None
    # before the first entry: a root marker, an empty conversation
    s.navigate(None)
    back = _round_trip(s, tmp_path)
    assert back.leaf() is None and back.context().messages == []
    assert _tree(back) == _tree(s)


def test_export_with_log_and_html(cli: Cli, script: Path, project: Path, tmp_path: Path) -> None:
    """A run's session exports with its log as one custom entry, and as one HTML page holding
    the tree, the transcript and the run timeline, with no script and nothing fetched."""
    sid = _run(cli, script, project)
    out = tmp_path / "log.jsonl"
    assert cli("export", sid, "--with-log", "-o", str(out)).code == 0
    last = _lines(out)[-1]
    assert last["customType"] == LOG_TYPE and last["data"]["records"]
    types = {r["type"] for r in last["data"]["records"]}
    assert "run_started" in types or any("run" in t for t in types)
    store = open_store(None)
    with open_session(sid, store) as s:
        back = Session(open_pi_file(str(out)))
        assert back.leaf() == s.leaf() and back.context().messages == s.context().messages
    page = tmp_path / "s.html"
    res = cli("export", sid, "--format", "html", "-o", str(page))
    assert res.code == 0, res.err
    text = page.read_text()
    assert "<script" not in text and not re.search(r"(src|href)=\"https?:", text)
    for needle in ("Tree", "Transcript", "Run timeline", "Read the notes", "summary.md"):
        assert needle in text
    res = cli("export", sid, "--format", "html")  # stdout
    assert res.code == 0 and res.out.startswith("<!DOCTYPE html>")
