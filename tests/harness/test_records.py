"""The record vocabulary is declared once (``durable_harness/models/records.py``): the
constructors, the shape check storage runs and the fold are derived from or checked against
the declarations, and storage knows only the envelope (``design/api.md``)."""

from __future__ import annotations

import ast
import inspect
import itertools
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from durable_harness.errors import FormatError, InvalidOp, ProviderError, ToolError
from durable_harness.harness import records as harness_records
from durable_harness.harness.harness import Harness
from durable_harness.models.records import (
    DECLARATIONS,
    ENVELOPE_FIELDS,
    RECORD_TYPES,
    RecordEnvelope,
    record_fields_error,
)
from durable_harness.providers.base import Done, ProviderEvent, ProviderRequest
from durable_harness.providers.scripted import ScriptedProvider
from durable_harness.session.session import Session
from durable_harness.storage import Store, open_store, shapes
from durable_harness.storage.base import RecordOp
from durable_harness.storage.shapes import record_shape_error
from durable_harness.tools.base import ToolContext, ToolResult

from .util import EchoTool

PACKAGE = Path(__file__).resolve().parents[2] / "durable_harness"


def fields_of(rtype: str) -> frozenset[str]:
    """The field names a record of type ``rtype`` may carry, envelope included.

    Raises:
        KeyError: ``rtype`` is not declared.
    """
    return ENVELOPE_FIELDS | frozenset(get_type_hints(DECLARATIONS[rtype]))


def _lineage(td: type) -> list[type]:
    """``td`` after its TypedDict bases, the envelope first."""
    bases = getattr(td, "__orig_bases__", ())
    return [*(b for base in bases if isinstance(base, type) for b in _lineage(base)), td]


def field_docs(td: type) -> dict[str, str]:
    """``{field: docstring}`` of a declaration, read from the string literal under each field
    in its source and its bases', the envelope's first (``type`` included)."""
    docs: dict[str, str] = {}
    for cls in dict.fromkeys([RecordEnvelope, *_lineage(td)]):
        tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(cls)))
        node = tree.body[0]
        body = node.body if isinstance(node, ast.ClassDef) else []
        for field, nxt in itertools.pairwise(body):
            if (
                isinstance(field, ast.AnnAssign)
                and isinstance(field.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[field.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def vocabulary_table() -> str:
    """The record vocabulary as a Markdown table (type, what it records, its own fields), the
    table ``design/api.md`` carries (the test below keeps them equal)."""
    rows = ["| type | records | fields (besides the envelope) |", "|---|---|---|"]
    for rtype, td in DECLARATIONS.items():
        summary = inspect.cleandoc(td.__doc__ or "").split("\n\n")[0].replace("\n", " ")
        own = [f"`{f}`" for f in field_docs(td) if f not in ENVELOPE_FIELDS]
        rows.append(f"| `{rtype}` | {summary} | {', '.join(own) or '-'} |")
    return "\n".join(rows) + "\n"


ALL_FIELDS = frozenset().union(*(fields_of(t) for t in RECORD_TYPES))


def _calls(path: Path) -> list[ast.Call]:
    tree = ast.parse(path.read_text())
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


def test_the_constructors_use_the_declared_types() -> None:
    assert harness_records.RECORD_TYPES == RECORD_TYPES == tuple(DECLARATIONS)
    with pytest.raises(ValueError, match="undeclared record type 'nope'"):
        harness_records.record("nope", "main", None)


def test_every_field_is_documented() -> None:
    for rtype, td in DECLARATIONS.items():
        assert (td.__doc__ or "").strip(), f"{rtype} has no docstring"
        docs = field_docs(td)
        undocumented = sorted(fields_of(rtype) - set(docs))
        assert not undocumented, f"{rtype}: fields without a docstring: {undocumented}"


@pytest.mark.slow
def test_every_record_built_in_the_package_uses_declared_fields() -> None:
    """Each ``record("<type>", lane, run, field=...)`` call names only fields its type
    declares (``**extra`` spreads are checked at commit by the registered check)."""
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for call in _calls(path):
            if not (isinstance(call.func, ast.Name) and call.func.id == "record" and call.args):
                continue
            first = call.args[0]
            if not isinstance(first, ast.Constant):
                continue
            declared = fields_of(first.value)
            for kw in call.keywords:
                if kw.arg is not None and kw.arg not in declared:
                    problems.append(f"{path.name}:{call.lineno}: {first.value}.{kw.arg}")
    assert not problems, problems


def test_the_fold_reads_only_declared_fields() -> None:
    """``rec.get("x")`` and ``rec["x"]`` in the fold, the rest of the harness and recovery
    name declared record fields."""
    read: set[str] = set()
    for path in [*(PACKAGE / "harness").glob("*.py"), *(PACKAGE / "recovery").glob("*.py")]:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "rec"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                read.add(node.args[0].value)
            if (
                isinstance(node, ast.Subscript)
                and isinstance(node.value, ast.Name)
                and node.value.id == "rec"
                and isinstance(node.slice, ast.Constant)
            ):
                read.add(node.slice.value)
    assert read, "the fold reads no record field: the scan is broken"
    assert read <= ALL_FIELDS, sorted(read - ALL_FIELDS)


def test_storage_names_no_harness_field() -> None:
    """Storage's code holds no record field name beyond the envelope; the few names that
    entries and catalogue rows share with records (a message's ``usage``, a toolResult's
    ``toolCallId``, a model change's ``provider``, a listing row's ``error``, the lease file's
    ``generation``, which a ``session_lifecycle`` record repeats, and its ``host``, the same
    machine name a ``tool_process`` record carries) are theirs there."""
    shared = {"message", "usage", "provider", "model", "arguments", "type", "toolCallId", "error"}
    shared |= {"generation", "host"}
    harness_only = ALL_FIELDS - ENVELOPE_FIELDS - shared
    found = []
    for path in sorted((PACKAGE / "storage").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in harness_only:
                found.append(f"{path.name}:{node.lineno}: {node.value}")
    assert not found, found


def test_design_api_carries_the_generated_table() -> None:
    text = (PACKAGE.parent / "design" / "api.md").read_text()
    assert vocabulary_table() in text, "regenerate the table: vocabulary_table() of this file"
    for rtype in RECORD_TYPES:
        assert f"| `{rtype}` |" in text


@pytest.mark.parametrize(
    ("rec", "problem"),
    [
        ({"type": "tool_started", "id": "r", "attempt": "1"}, "attempt"),
        ({"type": "tool_started", "id": "r", "attempt": True}, "attempt"),
        ({"type": "tool_started", "id": "r", "replay": "sometimes"}, "replay"),
        ({"type": "save_point", "id": "r", "appliedWrites": ["a", 1]}, "appliedWrites.1"),
        ({"type": "run_finished", "id": "r", "outcome": "maybe"}, "outcome"),
        ({"type": "queue_enqueued", "id": "r", "queue": "later"}, "queue"),
        ({"type": "decision", "id": "r", "decision": "retry", "result": 3}, "result"),
    ],
)
def test_the_check_is_strict(rec: dict[str, object], problem: str) -> None:
    err = record_fields_error(rec)
    assert err is not None and f": {problem}:" in err
    assert record_shape_error(rec) == err  # what storage runs is the registered check


def test_what_the_check_lets_pass() -> None:
    assert record_fields_error({"type": "abort_requested", "id": "r"}) is None
    assert record_fields_error({"type": "tool_started", "id": "r", "newField": 1}) is None
    # an undeclared type passes on its envelope alone
    assert record_shape_error({"type": "later_kind", "id": "r", "attempt": "x"}) is None
    assert record_shape_error({"type": 3, "id": "r"}) == "type and id must be strings"


@pytest.mark.parametrize("spec", ["memory:", "jsonl", "sqlite"])
def test_a_malformed_harness_record_is_refused_at_commit(tmp_path: Path, spec: str) -> None:
    """Refused because the suite checks built records too (tests/conftest.py); production
    trusts them (see the tests below)."""
    target = {"jsonl": f"jsonl:{tmp_path}", "sqlite": f"sqlite:{tmp_path / 's.db'}"}
    store = open_store(target.get(spec, spec))
    s = store.create_session("/p")
    try:
        bad = harness_records.record("tool_started", "main", "run-1", attempt="2")
        with pytest.raises(InvalidOp, match="tool_started record: attempt"):
            s.commit([RecordOp(bad)])
        assert s.records() == []
        good = harness_records.record("tool_started", "main", "run-1", attempt=2)
        s.commit([RecordOp(good)])
        assert [r["id"] for r in s.records()] == [good["id"]]
        assert s.damage == []
    finally:
        s.close()


def test_a_stored_record_of_the_wrong_shape_reads_as_damage(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    s = open_store(f"sqlite:{db}").create_session("/p")
    good = harness_records.record("tool_started", "main", "run-1", toolCallId="c1", attempt=1)
    s.commit([RecordOp(good)])
    sid = s.session_id
    s.close()
    conn = sqlite3.connect(db)
    (body,) = conn.execute("SELECT body FROM records WHERE id=?", (good["id"],)).fetchone()
    altered = {**json.loads(body), "attempt": "one"}
    conn.execute("UPDATE records SET body=? WHERE id=?", (json.dumps(altered), good["id"]))
    conn.commit()
    conn.close()
    with open_store(f"sqlite:{db}").open_session(sid, write=False) as s2:
        assert s2.records() == []
        assert [d["kind"] for d in s2.damage] == ["bad_row"]
        assert "attempt" in json.dumps(s2.damage)


def test_a_stored_jsonl_record_of_the_wrong_shape_reads_as_damage(tmp_path: Path) -> None:
    """The same guarantee on JSONL: a commit line holding a declared record with a field of the
    wrong type is reported (``bad_line``) and left out, never handed to the fold."""
    store = open_store(f"jsonl:{tmp_path}")
    s = store.create_session("/p")
    good = harness_records.record("tool_started", "main", "run-1", toolCallId="c1", attempt=1)
    s.commit([RecordOp(good)])
    sid = s.session_id
    s.close()
    (path,) = list(tmp_path.rglob(f"*{sid}*.jsonl"))
    bad = {"type": "tool_started", "id": "z", "lane": "main", "attempt": "one", "seq": 50}
    line = json.dumps({"gen": 1, "ops": [{"op": "record", "record": bad}]}).encode()
    with open(path, "ab") as fh:
        fh.write(line + b"\n")
    with store.open_session(sid, write=False) as s2:
        assert [r["id"] for r in s2.records()] == [good["id"]]
        assert "bad_line" in [d["kind"] for d in s2.damage]


# -- harness-built records are trusted; records from elsewhere are checked --------------------


@pytest.fixture
def trusting(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """Production behaviour (the suite checks built records too, tests/conftest.py): returns
    the list of records the field check was run on."""
    monkeypatch.setattr(shapes, "CHECK_TRUSTED", False)
    checked: list[dict[str, object]] = []

    def counting(rec: dict[str, object]) -> str | None:
        checked.append(rec)
        return record_fields_error(rec)  # type: ignore[arg-type]

    monkeypatch.setattr(shapes, "_record_checks", [counting])
    return checked


@pytest.mark.parametrize("spec", ["memory:", "jsonl", "sqlite"])
def test_a_hand_built_malformed_record_is_refused(
    tmp_path: Path, spec: str, trusting: list[dict[str, object]]
) -> None:
    """A record committed directly as a plain dict (user or library code) is checked in full,
    even while the harness's own records are trusted."""
    target = {"jsonl": f"jsonl:{tmp_path}", "sqlite": f"sqlite:{tmp_path / 's.db'}"}
    s = open_store(target.get(spec, spec)).create_session("/p")
    try:
        bad = {"type": "tool_started", "id": "r1", "lane": "main", "attempt": "2"}
        with pytest.raises(InvalidOp, match="tool_started record: attempt"):
            s.commit([RecordOp(bad)])
        copied = dict(harness_records.record("run_finished", "main", "run-1", outcome="maybe"))
        with pytest.raises(InvalidOp, match="run_finished record: outcome"):
            s.commit([RecordOp(copied)])  # a plain copy of a built record is not trusted
        assert s.records() == []
        assert [r["id"] for r in trusting] == ["r1", copied["id"]]
    finally:
        s.close()


def test_a_harness_built_record_is_not_rechecked(trusting: list[dict[str, object]]) -> None:
    s = open_store("memory:").create_session("/p")
    built = harness_records.record("tool_started", "main", "run-1", toolCallId="c1", attempt=1)
    assert type(built) is harness_records.BuiltRecord and built == dict(built)
    s.commit([RecordOp(built)])
    assert trusting == []
    stored = s.records()
    assert stored == [{**built, "seq": 1}] and type(stored[0]) is dict
    shapes.CHECK_TRUSTED = True  # the suite's mode (monkeypatch restores it)
    s.commit([RecordOp(harness_records.record("abort_requested", "main", "run-1"))])
    assert [r["type"] for r in trusting] == ["abort_requested"]


def test_a_built_record_whose_envelope_is_not_vouched_for_is_checked(
    trusting: list[dict[str, object]],
) -> None:
    """``record`` vouches for the envelope it makes (storage then checks nothing): a lane that
    is no string, or a field naming an envelope key, makes an unsure record, checked in full
    at commit with the error it always got."""
    s = open_store("memory:").create_session("/p")
    try:
        odd_lane = harness_records.record("save_point", 3, "run-1")  # type: ignore[arg-type]
        with pytest.raises(InvalidOp, match="lane and runId must be strings or null"):
            s.commit([RecordOp(odd_lane)])
        odd_run = harness_records.record("save_point", "main", 7)  # type: ignore[arg-type]
        with pytest.raises(InvalidOp, match="lane and runId must be strings or null"):
            s.commit([RecordOp(odd_run)])
        odd_id = harness_records.record("save_point", "main", "run-1", id=5)
        with pytest.raises(InvalidOp, match="type and id must be strings"):
            s.commit([RecordOp(odd_id)])
        assert isinstance(odd_id, harness_records.BuiltRecord) and odd_id["id"] == 5
        assert s.records() == []
        assert [r["type"] for r in trusting] == []  # refused by the envelope, before fields
        fine = harness_records.record("save_point", "main", None, id="given")
        s.commit([RecordOp(fine)])  # an unsure record that is well formed is written
        assert [r["id"] for r in trusting] == ["given"]
        assert [r["id"] for r in s.records()] == ["given"]
    finally:
        s.close()


# -- what comes from outside the harness is checked where it enters ---------------------------


class _OddTool(EchoTool):
    """``echo`` that returns what ``returns`` says instead of a result, or registers a process
    group id that is not one."""

    def __init__(self, returns: object = None, pgid: object = None) -> None:
        super().__init__()
        self.returns, self.pgid = returns, pgid

    async def execute(self, args: Any, ctx: ToolContext) -> ToolResult:
        if self.pgid is not None:
            assert ctx.on_process is not None
            ctx.on_process(self.pgid)  # type: ignore[arg-type]
        return self.returns  # type: ignore[return-value]


class _StopReasonProvider(ScriptedProvider):
    """Answers with a message whose ``stopReason`` is an integer."""

    async def stream(self, request: ProviderRequest) -> AsyncIterator[ProviderEvent]:
        yield Done(
            {"role": "assistant", "content": [{"type": "text", "text": "hi"}], "stopReason": 7}
        )


def _reopened_records(store: Store, sid: str) -> list[dict[str, Any]]:
    with open_store(store.spec).open_session(sid, write=False) as s:
        assert s.damage == []
        return s.records()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_outside_values_are_checked_where_they_enter(
    tmp_path: Path, trusting: list[dict[str, object]], anyio_backend: str
) -> None:
    """With built records trusted, a caller's client key, a provider's and a tool's values of
    the wrong type are refused at the boundary, never written as a malformed record."""
    store = open_store(f"jsonl:{tmp_path}/j")
    session = Session(store.create_session(str(tmp_path)))
    async with Harness(session, ScriptedProvider([]), [], cwd=tmp_path) as h:
        with pytest.raises(FormatError, match="client_key must be a string, not int"):
            await h.prompt("hi", client_key=3)  # type: ignore[arg-type]
        with pytest.raises(FormatError, match="client_key must be a string"):
            await h.next_run("hi", client_key=b"k")  # type: ignore[arg-type]
    assert session.store.records() == []

    bad_tool = EchoTool()
    bad_tool.replay = "sometimes"  # type: ignore[misc]
    with pytest.raises(ToolError, match="tool echo: replay must be 'safe' or 'never'"):
        Harness(session, ScriptedProvider([]), [bad_tool], cwd=tmp_path)
    odd_provider = ScriptedProvider([])
    odd_provider.model = None  # type: ignore[assignment]
    with pytest.raises(ProviderError, match="model must be a string, not NoneType"):
        Harness(session, odd_provider, [], cwd=tmp_path)

    async with Harness(session, _StopReasonProvider([]), [], cwd=tmp_path) as h:
        assert await (await h.prompt("hi")).wait() == "failed"
    turns = [{"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]}, {"text": "ok"}]
    for tool, text in [
        (_OddTool(returns=None), "returned NoneType, not a ToolResult"),
        (_OddTool(returns=ToolResult([], is_error=1)), "returned is_error of type int"),  # type: ignore[arg-type]
        (_OddTool(pgid="12"), "on_process needs a positive process group id"),
    ]:
        async with Harness(session, ScriptedProvider(list(turns)), [tool], cwd=tmp_path) as h:
            assert await (await h.prompt("go")).wait() == "completed"
        result = [e for e in session.path(session.leaf("main")) if e["type"] == "message"][-2]
        assert result["message"]["isError"] is True and text in str(result["message"]["content"])
    recs = _reopened_records(store, session.id)
    assert [r["outcome"] for r in recs if r["type"] == "run_finished"] == ["failed"] + [
        "completed"
    ] * 3
    assert not any(r["type"] == "tool_process" for r in recs)
    assert all(record_fields_error(r) is None for r in recs)
