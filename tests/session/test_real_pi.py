"""Real pi, installed from npm, opens what ``durable-harness export --format pi`` writes and sees
the same conversation (``design/pi.md``). Needs node and npm: skipped with the reason where they
are absent, and under ``CI=true`` an error instead. pi is installed once per cache
(``~/.cache/durable-harness-tests/pi-VERSION``) and run offline with a throw-away ``HOME``.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_harness.providers import wire_messages
from durable_harness.providers.base import arguments_json
from durable_harness.session import Session, import_pi_file, open_session
from durable_harness.session.pi import open_pi_file
from durable_harness.session.pi_export import pi_entries, pi_text
from durable_harness.storage import open_store

# each test runs real pi (node) processes: out of `make check`'s fast lane, in `make test`
pytestmark = pytest.mark.slow

PI_VERSION = "0.73.1"
"""The pi release the tests install (``@mariozechner/pi-coding-agent``, npm)."""

PACKAGED = Path(__file__).resolve().parents[2] / "durable_harness" / "data" / "v3-branched.jsonl"
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "pi-sessions"

# Opens a session file with pi's own SessionManager and prints what pi builds from it: the leaf,
# the messages of buildSessionContext, and those messages after pi-ai's transformMessages for a
# given model (what pi sends).
HELPER = """
import { pathToFileURL } from "node:url";
const [root, file, provider, api, model] = process.argv.slice(2);
const dist = root + "/node_modules/@mariozechner/pi-coding-agent/dist/index.js";
const tm = root + "/node_modules/@mariozechner/pi-ai/dist/providers/transform-messages.js";
const { SessionManager } = await import(pathToFileURL(dist).href);
const { transformMessages } = await import(pathToFileURL(tm).href);
const sm = SessionManager.open(file);
const ctx = sm.buildSessionContext();
const target = { provider, api, id: model, input: ["text", "image"] };
const sent = transformMessages(ctx.messages.filter((m) =>
  ["user", "assistant", "toolResult"].includes(m.role)), target);
const argsJson = sent.flatMap((m) => m.role === "assistant"
  ? m.content.filter((b) => b.type === "toolCall").map((b) => JSON.stringify(b.arguments)) : []);
process.stdout.write(JSON.stringify({ leafId: sm.getLeafId(), count: sm.getEntries().length,
  messages: ctx.messages, model: ctx.model, thinkingLevel: ctx.thinkingLevel, sent, argsJson }));
"""

# Writes a session with pi's own SessionManager (what current pi writes): "write DIR" creates one
# with every entry kind and prints its path; "append FILE" adds a user message to a file.
WRITER = """
import { pathToFileURL } from "node:url";

const [root, mode, where] = process.argv.slice(2);
const dist = root + "/node_modules/@mariozechner/pi-coding-agent/dist/index.js";
const { SessionManager } = await import(pathToFileURL(dist).href);
const said = (text) => [{ type: "text", text }];
const usage = { input: 120, output: 30, cacheRead: 10, cacheWrite: 0, totalTokens: 160,
  cost: { input: 0.1, output: 0.2, cacheRead: 0.01, cacheWrite: 0, total: 0.31 } };
const reply = (content, stopReason, model = "claude-x") => ({ role: "assistant", content,
  api: "anthropic-messages", provider: "anthropic", model, usage, stopReason, timestamp: 2 });
if (mode === "append") {
  const sm = SessionManager.open(where);
  sm.appendMessage({ role: "user", content: said("from pi"), timestamp: 9 });
  sm.appendMessage(reply(said("pi answers"), "stop"));
  process.stdout.write(sm.getSessionFile());
} else {
  const sm = SessionManager.create("/work/project", where);
  sm.appendModelChange("anthropic", "claude-x");
  sm.appendThinkingLevelChange("high");
  const u1 = sm.appendMessage({ role: "user", content: said("list files"), timestamp: 1 });
  sm.appendMessage(reply([{ type: "thinking", thinking: "plan", thinkingSignature: "sig" },
    ...said("looking"), { type: "toolCall", id: "t1", name: "bash",
    arguments: { command: "ls" } }], "toolUse"));
  sm.appendMessage({ role: "toolResult", toolCallId: "t1", toolName: "bash",
    content: said("a b"), isError: false, timestamp: 3 });
  const a2 = sm.appendMessage(reply(said("two files"), "stop"));
  sm.appendLabelChange(a2, "answer");
  sm.appendSessionInfo("pi wrote this");
  sm.appendCustomEntry("ext/state", { n: 1 });
  sm.appendCustomMessageEntry("ext/note", "a note", true, { k: 1 });
  sm.branchWithSummary(u1, "tried listing", { files: 2 });
  const u2 = sm.appendMessage({ role: "user", content: said("count them"), timestamp: 4 });
  sm.appendMessage(reply(said("2"), "stop"));
  sm.appendCompaction("summary so far", u2, 5000, { read: [] });
  sm.appendModelChange("openai", "gpt-5");
  sm.appendMessage({ role: "user", content: said("and now?"), timestamp: 5 });
  sm.appendMessage(reply(said("done"), "stop", "gpt-5"));
  process.stdout.write(sm.getSessionFile());
}
"""


@pytest.fixture(scope="module")
def pi_root() -> Iterator[Path]:
    """A folder with pi installed from npm (installed on first use, then reused)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        reason = "node and npm are needed to run real pi (CI installs them from Debian)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"under CI=true real pi must run: {reason}")
        pytest.skip(reason)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = cache / "durable-harness-tests" / f"pi-{PI_VERSION}"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:  # one install even with xdist workers
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "node_modules" / ".bin" / "pi").exists():
            subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--prefix", str(root),
                 f"@mariozechner/pi-coding-agent@{PI_VERSION}"],
                check=True, capture_output=True, timeout=900,
            )  # fmt: skip
    (root / "helper.mjs").write_text(HELPER)
    (root / "writer.mjs").write_text(WRITER)
    yield root


def _env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "pi-home"
    home.mkdir(exist_ok=True)
    return {**os.environ, "HOME": str(home), "PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1"}


def pi_reads(
    root: Path, path: Path, tmp_path: Path, model: tuple[str, str, str] = ("x", "x", "x")
) -> dict[str, Any]:
    """What pi's SessionManager builds from ``path`` (a copy: pi rewrites files it migrates)."""
    copy = tmp_path / f"pi-copy-{path.name}"
    shutil.copyfile(path, copy)
    proc = subprocess.run(
        ["node", str(root / "helper.mjs"), str(root), str(copy), *model],
        capture_output=True, text=True, timeout=120, env=_env(tmp_path), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def pi_export_html(root: Path, path: Path, tmp_path: Path) -> dict[str, Any]:
    """Run the ``pi`` command itself on ``path`` (``pi --export FILE OUT.html``, offline) and
    return the session data its page embeds (header, entries, leafId)."""
    out = tmp_path / "pi.html"
    proc = subprocess.run(
        [str(root / "node_modules" / ".bin" / "pi"), "--export", str(path), str(out)],
        capture_output=True, text=True, timeout=120, env=_env(tmp_path), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = re.search(
        r'<script id="session-data" type="application/json">([^<]*)<', out.read_text()
    )
    assert found, "pi's page embeds no session data"
    return dict(json.loads(base64.b64decode(found.group(1))))


def _export(s: Session, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_bytes(pi_text(pi_entries(s)))
    return path


def _ours(s: Session) -> list[Any]:
    """Our conversation from the lane's leaf, as pi's buildSessionContext spells it: stored
    messages as they are, summaries as pi's summary messages (``summary`` field)."""
    out: list[Any] = []
    for eid in s.context().entry_ids:
        if eid is None:
            continue
        e = s.entry(eid)
        out.append(e["message"] if e["type"] == "message" else ("summary", e.get("summary")))
    return out


def _theirs(messages: list[dict[str, Any]]) -> list[Any]:
    return [
        ("summary", m["summary"]) if m["role"] in ("compactionSummary", "branchSummary") else m
        for m in messages
    ]


def test_real_pi_opens_an_export_as_the_same_conversation(pi_root: Path, tmp_path: Path) -> None:
    """The packaged v3 file (tree, compaction, branch summary, labels, model and thinking
    changes, usage), imported then exported: pi sees the same messages, model, thinking level
    and leaf as from the original file, and as our own context."""
    store = open_store(f"jsonl:{tmp_path}/st")
    sid = import_pi_file(str(PACKAGED), store)
    with store.open_session(sid) as ss:
        s = Session(ss)
        path = _export(s, tmp_path, "export.jsonl")
        seen, original = pi_reads(pi_root, path, tmp_path), pi_reads(pi_root, PACKAGED, tmp_path)
        assert seen["leafId"] == s.leaf() == original["leafId"]
        assert seen["messages"] == original["messages"]
        assert (seen["model"], seen["thinkingLevel"]) == (original["model"], "medium")
        assert s.context().thinking_level == "medium"
        assert _theirs(seen["messages"]) == _ours(s)
        page = pi_export_html(pi_root, path, tmp_path)
        assert page["leafId"] == s.leaf() and len(page["entries"]) == len(ss.iter_entries())
        labels = [e for e in page["entries"] if e["type"] == "label"]
        assert labels and labels[0]["label"] == "first-pass"


def test_real_pi_follows_a_marked_leaf(pi_root: Path, tmp_path: Path) -> None:
    """A lane whose leaf has children on another branch: pi's leaf is our marker entry under
    it, and pi's conversation is that leaf's."""
    store = open_store(f"jsonl:{tmp_path}/st")
    s = Session(store.create_session("/work"))
    s.set_thinking_level("low")
    u1 = s.append_message({"role": "user", "content": [{"type": "text", "text": "one"}]})
    s.append_message({"role": "user", "content": [{"type": "text", "text": "two"}]})
    s.navigate(u1["id"])
    s.append_message({"role": "user", "content": [{"type": "text", "text": "three"}]})
    s.navigate(u1["id"])
    path = _export(s, tmp_path, "marked.jsonl")
    seen = pi_reads(pi_root, path, tmp_path)
    assert [m["content"][0]["text"] for m in seen["messages"]] == ["one"]
    assert seen["thinkingLevel"] == "low" and _theirs(seen["messages"]) == _ours(s)
    assert pi_export_html(pi_root, path, tmp_path)["leafId"] == seen["leafId"] != u1["id"]


@pytest.mark.parametrize("name", ["before-compaction.jsonl", "large-session.jsonl"])
def test_real_pi_files_round_trip(pi_root: Path, tmp_path: Path, name: str) -> None:
    """Real pi files (format version 1) imported and exported as version 3: pi builds the same
    messages from our export as from its own file."""
    source = SHARED / name
    if not source.is_file():
        pytest.skip(f"shared pi session file not found at {source}: the tests read it in place")
    store = open_store(f"jsonl:{tmp_path}/st")
    sid = import_pi_file(str(source), store)
    with store.open_session(sid) as ss:
        path = _export(Session(ss), tmp_path, "export.jsonl")
    seen, original = pi_reads(pi_root, path, tmp_path), pi_reads(pi_root, source, tmp_path)
    assert seen["messages"] == original["messages"]
    assert (seen["model"], seen["thinkingLevel"]) == (original["model"], original["thinkingLevel"])


def pi_session_file(path: Path) -> Path:
    """A pi v3 file as pi writes one, with what pi does not replay: a turn by another model
    (thinking, non-ASCII arguments), an errored turn, an aborted turn with a call."""

    def msg(eid: str, parent: str | None, **m: Any) -> dict[str, Any]:
        ts = "2026-03-02T10:00:00.000Z"
        return {"type": "message", "id": eid, "parentId": parent, "timestamp": ts, "message": m}

    def said(text: str) -> list[dict[str, Any]]:
        return [{"type": "text", "text": text}]

    claude = {"provider": "anthropic", "api": "anthropic-messages", "model": "claude-x"}
    lines = [
        {"type": "session", "version": 3, "id": "s1", "timestamp": "2026-03-02T10:00:00.000Z",
         "cwd": "/w"},
        {"type": "model_change", "id": "e1", "parentId": None,
         "timestamp": "2026-03-02T10:00:00.000Z", "provider": "anthropic", "modelId": "claude-x"},
        msg("e2", "e1", role="user", content=said("u1"), timestamp=1),
        msg("e3", "e2", role="assistant", provider="openai", api="openai-completions",
            model="gpt-5", stopReason="toolUse", timestamp=2, content=[
                {"type": "thinking", "thinking": "foreign idea"}, *said("a1"),
                {"type": "toolCall", "id": "c1", "name": "read",
                 "arguments": {"path": "ü.txt", "n": [1, 2]}}]),
        msg("e4", "e3", role="toolResult", toolCallId="c1", toolName="read", content=said("r1"),
            isError=False, timestamp=3),
        msg("e5", "e4", role="assistant", **claude, stopReason="error", errorMessage="boom",
            content=said("partial"), timestamp=4),
        msg("e6", "e5", role="user", content=said("u2"), timestamp=5),
        msg("e7", "e6", role="assistant", **claude, stopReason="aborted", timestamp=6,
            content=[{"type": "toolCall", "id": "c2", "name": "read", "arguments": {}}]),
        msg("e8", "e7", role="user", content=said("u3"), timestamp=7),
        msg("e9", "e8", role="assistant", **claude, stopReason="stop", content=said("final"),
            timestamp=8),
    ]  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _pi_sent(sent: list[dict[str, Any]]) -> list[Any]:
    out: list[Any] = []
    for m in sent:
        blocks = m["content"] if isinstance(m["content"], list) else [m["content"]]
        texts = [b["text"] for b in blocks if b.get("type") == "text"]
        if m["role"] == "assistant":
            calls = [b["id"] for b in blocks if b["type"] == "toolCall"]
            out.append(("assistant", texts, calls))
        elif m["role"] == "toolResult":
            out.append(("toolResult", m["toolCallId"], texts))
        else:
            out.append(("user", texts))
    return out


def _our_wire(wire: list[dict[str, Any]]) -> list[Any]:
    out: list[Any] = []
    for m in wire:
        blocks = m["content"] if isinstance(m["content"], list) else [m["content"]]
        if m["role"] == "assistant":
            texts = [b["text"] for b in blocks if b["type"] == "text"]
            out.append(("assistant", texts, [b["id"] for b in blocks if b["type"] == "tool_use"]))
        elif blocks and blocks[0].get("type") == "tool_result":
            for b in blocks:
                texts = (
                    [c["text"] for c in b["content"]]
                    if isinstance(b["content"], list)
                    else [b["content"]]
                )
                out.append(("toolResult", b["tool_use_id"], texts))
        else:
            out.append(("user", [b["text"] for b in blocks if b["type"] == "text"]))
    return out


def test_context_of_a_pi_session_is_what_pi_sends(pi_root: Path, tmp_path: Path) -> None:
    """pi's own transform (errored and aborted turns dropped, another model's thinking as
    text) and ours give the same request for an Anthropic model; the arguments are spelt as
    pi's JSON.stringify spells them."""
    path = pi_session_file(tmp_path / "pi.jsonl")
    theirs = pi_reads(pi_root, path, tmp_path, ("anthropic", "anthropic-messages", "claude-x"))
    with open_session(str(path), open_store(f"jsonl:{tmp_path}/st")) as s:
        ctx = s.context()
    ours = wire_messages("anthropic", ctx.messages, model="claude-x")
    assert _our_wire(ours) == _pi_sent(theirs["sent"])
    assert _pi_sent(theirs["sent"])[1][1] == ["foreign idea", "a1"]
    calls = [b for m in ctx.messages for b in m["content"] if b.get("type") == "toolCall"]
    assert [arguments_json(c["arguments"]) for c in calls] == theirs["argsJson"]


def pi_writes(root: Path, mode: str, where: Path, tmp_path: Path) -> Path:
    """Run :data:`WRITER` (pi's SessionManager writing a file); return the file's path."""
    proc = subprocess.run(
        ["node", str(root / "writer.mjs"), str(root), mode, str(where)],
        capture_output=True, text=True, timeout=120, env=_env(tmp_path), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout)


def _file(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_bytes().splitlines() if x.strip()]


def test_what_pi_writes_imports_and_exports_without_loss(pi_root: Path, tmp_path: Path) -> None:
    """A session written by pi's SessionManager (every entry kind: model and thinking changes,
    usage, thinking with signature, label, session name, custom entry and message, branch
    summary, compaction) imports with every entry as pi wrote it and pi's context, exports
    back to pi's lines, and pi can append to our export: fsck finds no damage."""
    written = pi_writes(pi_root, "write", tmp_path / "pi-sessions", tmp_path)
    header, *entries = _file(written)
    assert header["version"] == 3 and len(entries) == 17
    store = open_store(f"jsonl:{tmp_path}/st")
    sid = import_pi_file(str(written), store)
    with store.open_session(sid) as ss:
        s = Session(ss)
        assert [{k: v for k, v in e.items() if k != "seq"} for e in ss.iter_entries()] == entries
        assert s.leaf() == entries[-1]["id"] and s.name == "pi wrote this"
        assert s.labels()[entries[5]["id"]] == "answer"
        theirs = pi_reads(pi_root, written, tmp_path)
        assert _theirs(theirs["messages"]) == _ours(s)
        assert s.context().model == theirs["model"]
        assert s.context().thinking_level == theirs["thinkingLevel"] == "high"
        out = _export(s, tmp_path, "export.jsonl")
    assert _file(out)[1:] == entries
    pi_writes(pi_root, "append", out, tmp_path)
    from durable_harness.recovery.fsck import fsck_path

    assert fsck_path(str(out))["ok"]
    again = Session(open_pi_file(str(out)))
    assert [m["content"][0]["text"] for m in again.context().messages[-2:]] == [
        "from pi",
        "pi answers",
    ]
