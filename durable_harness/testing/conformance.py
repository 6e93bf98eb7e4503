"""The storage conformance suite: :func:`check_session_store` proves a backend keeps the
storage contract of :mod:`durable_harness.storage.base` (``design/storage.md``), one ``check_``
function per part of it, each on a fresh, empty store."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from durable_harness.errors import (
    AmbiguousSessionPrefix,
    DurableHarnessError,
    IdConflict,
    InvalidOp,
    ReadOnlySession,
    SessionExists,
    SessionNotFound,
    UnknownEntry,
)
from durable_harness.storage import (
    DURABILITY_MODES,
    Durability,
    EntryOp,
    LaneOp,
    Op,
    RecordOp,
    SessionStore,
    Store,
)


class ConformanceError(AssertionError):
    """A backend broke the storage contract (an ``AssertionError``: a test failure, not an
    error); the message names the check and what differed."""


StoreFactory = Callable[[], Store]
Reopener = Callable[[Store], Store]


def _need(cond: object, what: str) -> None:
    if not cond:
        raise ConformanceError(what)


def _eq(got: object, want: object, what: str) -> None:
    if got != want:
        raise ConformanceError(f"{what}: got {got!r}, want {want!r}")


@contextmanager
def _raises(exc: type[DurableHarnessError], what: str) -> Iterator[list[BaseException]]:
    caught: list[BaseException] = []
    try:
        yield caught
    except exc as e:
        caught.append(e)
        return
    raise ConformanceError(f"{what}: expected {exc.__name__}, nothing was raised")


def ent(eid: str, parent: str | None = None, **extra: Any) -> dict[str, Any]:
    """A ``custom`` entry with id ``eid`` under ``parent`` and a fixed timestamp (storage does
    not validate entry bodies beyond their shape), plus ``extra`` fields."""
    return {
        "type": "custom",
        "customType": "test",
        "id": eid,
        "parentId": parent,
        "timestamp": "2026-01-01T00:00:00.000Z",
        **extra,
    }


def rec(rid: str, rtype: str = "note", lane: str | None = "main", **extra: Any) -> dict[str, Any]:
    """An operation-log record of type ``rtype`` on ``lane`` (none for ``None``)."""
    out: dict[str, Any] = {"type": rtype, "id": rid, "timestamp": "2026-01-01T00:00:00.000Z"}
    if lane is not None:
        out["lane"] = lane
    out.update(extra)
    return out


def ids(items: list[dict[str, Any]]) -> list[str]:
    """The ``id`` of each dict, in order."""
    return [str(i["id"]) for i in items]


def snapshot(s: SessionStore) -> dict[str, Any]:
    """Everything a session exposes (entries, records, lanes, last seq, entry count), for
    before/after comparisons."""
    return {
        "entries": s.iter_entries(),
        "records": s.records(),
        "lanes": {k: vars(v) for k, v in s.lanes().items()},
        "last_seq": s.last_seq(),
        "count": s.entry_count(),
    }


def _refuses(
    s: SessionStore, batches: list[list[Op]], exc: type[DurableHarnessError], what: str
) -> dict[str, Any]:
    """Each of ``batches`` raises ``exc`` and leaves ``s`` as it was; returns that state."""
    before = snapshot(s)
    for i, batch in enumerate(batches):
        with _raises(exc, f"{what} {i}"):
            s.commit(batch)
        _eq(snapshot(s), before, f"state after {what} {i}")
    return before


class _Ctx:
    """One check's store and how to reopen a session through ``reopen_store``."""

    def __init__(self, store: Store, reopen_store: Reopener) -> None:
        self.store = store
        self._reopen_store = reopen_store

    def reopen(
        self, s: SessionStore, *, write: bool = True, durability: Durability = "sync"
    ) -> SessionStore:
        s.close()
        return self._reopen_store(self.store).open_session(
            s.session_id, write=write, durability=durability
        )


def check_catalogue(c: _Ctx) -> None:
    """Create, open, close (idempotent), list by cwd, open a missing id."""
    store = c.store
    s = store.create_session("/work/proj")
    sid = s.session_id
    _eq(s.header.get("cwd"), "/work/proj", "header cwd")
    _eq(s.header.get("id"), sid, "header id")
    _need(not s.read_only, "a created session is writable")
    _need(s.generation >= 1, "a writer's generation is at least 1")
    _eq((s.last_seq(), s.entry_count(), s.iter_entries(), s.records()), (0, 0, [], []), "empty")
    lanes = s.lanes()
    _eq(set(lanes), {"main"}, "a new session's lanes")
    _eq((lanes["main"].leaf_id, lanes["main"].run_id), (None, None), "main lane state")
    _eq([i.id for i in store.list_sessions("/work/proj")], [sid], "list_sessions(cwd)")
    _eq(store.list_sessions("/elsewhere"), [], "list_sessions(other cwd)")
    _eq([i.id for i in store.list_sessions()], [sid], "list_sessions()")
    s.close()
    s.close()
    with store.open_session(sid) as again:
        _eq(again.session_id, sid, "reopened id")
        _eq(again.header.get("cwd"), "/work/proj", "reopened cwd")
    with _raises(SessionNotFound, "open_session of a missing id"):
        store.open_session("no-such-session")


def check_prefixes(c: _Ctx) -> None:
    """Open by unique prefix; an exact id wins; an ambiguous prefix lists its candidates;
    ``find_exact`` never answers a prefix nor another session."""
    store = c.store
    a, b = "aaaa1111-0000-7000-8000-000000000001", "bbbb2222-0000-7000-8000-000000000002"
    store.create_session("/p", session_id=a).close()
    store.create_session("/p", session_id=b).close()
    with store.open_session("aaaa", write=False) as s:
        _eq(s.session_id, a, "open by prefix")
    _eq(store.resolve("bbbb2").id, b, "resolve by prefix")
    hit = store.find_exact(a)  # a fast path may find nothing, never another session
    _eq(hit.id if hit is not None else a, a, "find_exact of an id")
    _eq(store.find_exact("aaaa"), None, "find_exact of a prefix")
    store.create_session("/p", session_id="cccc").close()
    store.create_session("/p", session_id="cccc-longer").close()
    _eq(store.resolve("cccc").id, "cccc", "an exact id wins over a prefix")
    first, second = "abcd0001-0000-7000-8000-000000000001", "abcd0002-0000-7000-8000-000000000002"
    for sid in (second, first):
        store.create_session("/p", session_id=sid).close()
    with _raises(AmbiguousSessionPrefix, "an ambiguous prefix") as caught:
        store.open_session("abcd000")
    err = caught[0]
    assert isinstance(err, AmbiguousSessionPrefix)
    _eq(err.details.get("candidates"), [first, second], "ambiguous prefix candidates")
    with _raises(SessionNotFound, "a prefix matching nothing"):
        store.open_session("0123")


def check_duplicate_id(c: _Ctx) -> None:
    """Creating a session with a taken id raises SessionExists and leaves it untouched."""
    store = c.store
    sid = "dddd0001-0000-7000-8000-000000000001"
    s = store.create_session("/p", session_id=sid)
    s.commit([EntryOp(ent("e1"), lane="main")])
    s.close()
    for cwd in ("/p", "/other-cwd"):
        with _raises(SessionExists, f"create_session of a taken id (cwd {cwd})"):
            store.create_session(cwd, session_id=sid)
    with store.open_session(sid, write=False) as s:
        _eq(ids(s.iter_entries()), ["e1"], "the existing session's entries")
    _eq(len(store.list_sessions()), 1, "sessions after refused duplicates")


def check_atomic_commit(c: _Ctx) -> None:
    """A commit whose later op is invalid leaves nothing behind, before and after reopen."""
    s = c.store.create_session("/p")
    s.commit([EntryOp(ent("root"), lane="main"), RecordOp(rec("r0"))])
    bad: list[list[Op]] = [
        [
            EntryOp(ent("a", "root"), lane="main"),
            EntryOp(ent("b", "missing")),
            RecordOp(rec("r1")),
        ],
        [EntryOp(ent("a", "root")), RecordOp(rec("r1")), LaneOp("main", leaf_id="missing")],
        [RecordOp(rec("r1")), EntryOp(ent("a", "r1"), lane="main")],
        [RecordOp(rec("r1")), LaneOp("side", leaf_id="r1")],
    ]
    before = _refuses(s, bad, UnknownEntry, "refused batch")
    with c.reopen(s) as s:
        _eq(snapshot(s), before, "state after reopen")
        _need("side" not in s.lanes(), "a refused lane op created no lane")
        _eq(s.commit([EntryOp(ent("a", "root"), lane="main")]), before["last_seq"] + 1, "seq")


def check_seq(c: _Ctx) -> None:
    """Each op takes one seq, strictly increasing across entries, records and lane ops."""
    s = c.store.create_session("/p")
    returned = [
        s.commit([EntryOp(ent("e1"), lane="main")]),
        s.commit([RecordOp(rec("r1"))]),
        s.commit([LaneOp("main", leaf_id=None)]),
        s.commit([LaneOp("side", config={"model": "m"})]),
        s.commit([EntryOp(ent("e2", "e1"), lane="main"), RecordOp(rec("r2")), LaneOp("side")]),
    ]
    _eq(returned, [1, 2, 3, 4, 7], "seqs returned by commit")
    with c.reopen(s) as s:
        _eq(s.last_seq(), 7, "last_seq after reopen")
        by_id = {e["id"]: e["seq"] for e in s.iter_entries()}
        by_id.update({r["id"]: r["seq"] for r in s.records()})
        _eq(by_id, {"e1": 1, "r1": 2, "e2": 5, "r2": 6}, "stored seqs")
        _eq(s.commit([RecordOp(rec("r3"))]), 8, "seq after reopen")


def check_id_conflicts(c: _Ctx) -> None:
    """A taken entry or record id, or one used twice in a commit, raises IdConflict."""
    s = c.store.create_session("/p")
    s.commit([EntryOp(ent("e1"), lane="main"), RecordOp(rec("r1"))])
    conflicting: list[list[Op]] = [
        [EntryOp(ent("e1"))],
        [EntryOp(ent("fresh")), EntryOp(ent("fresh"))],
        [RecordOp(rec("r1"))],
        [EntryOp(ent("fresh2")), RecordOp(rec("r9")), RecordOp(rec("r9"))],
    ]
    before = _refuses(s, conflicting, IdConflict, "conflicting batch")
    with c.reopen(s) as s:
        _eq(snapshot(s), before, "state after reopen")


def check_shapes(c: _Ctx) -> None:
    """An op that would read back as damage is refused with InvalidOp, leaving nothing."""
    bad: list[list[Any]] = [
        [EntryOp(["not", "an", "object"])],  # type: ignore[arg-type]
        [EntryOp({**ent("e2", "e1"), "type": "message", "message": {"role": 3}})],
        [EntryOp(ent("e2", "e1"), lane=7)],  # type: ignore[arg-type]
        [EntryOp(ent("e2", "e1"), lane="main"), RecordOp(rec("r2", "save_point", turn="3"))],
        [RecordOp(rec("r2", "tool_started", arguments=["not", "an", "object"]))],
        [LaneOp("side", config="not an object")],  # type: ignore[arg-type]
    ]
    for i, batch in enumerate(bad):
        s = c.store.create_session("/p")
        s.commit([EntryOp(ent("e1"), lane="main")])
        before = snapshot(s)
        with _raises(InvalidOp, f"malformed batch {i}"):
            s.commit(batch)
        _eq(snapshot(s), before, f"state after malformed batch {i}")
        with c.reopen(s, write=False) as s:
            _eq(s.damage, [], f"damage after malformed batch {i}")


def check_lanes(c: _Ctx) -> None:
    """Leaf moves (also to None) and config merges are durable."""
    s = c.store.create_session("/p")
    s.commit([EntryOp(ent("a"), lane="main")])
    s.commit([EntryOp(ent("b", "a"), lane="main")])
    s.commit([LaneOp("main", leaf_id="a")])
    s = c.reopen(s)
    _eq(s.lanes()["main"].leaf_id, "a", "leaf moved back")
    s.commit([LaneOp("main", leaf_id=None)])
    s = c.reopen(s)
    _eq(s.lanes()["main"].leaf_id, None, "leaf moved to None")
    s.commit([LaneOp("side", leaf_id="b", config={"model": "x", "thinking": "low"})])
    s.commit([LaneOp("side", config={"thinking": "high"})])
    with c.reopen(s) as s:
        side = s.lanes()["side"]
        _eq(side.leaf_id, "b", "a config-only lane op keeps the leaf")
        _eq(side.config, {"model": "x", "thinking": "high"}, "lane config merges")


def check_open_run(c: _Ctx) -> None:
    """A lane's open run follows its own run_started/run_finished, across reopen."""
    s = c.store.create_session("/p")
    seq = s.commit([RecordOp(rec("s1", "run_started", runId="run-1"))])
    _eq((s.lanes()["main"].run_id, s.lanes()["main"].run_seq), ("run-1", seq), "open run")
    s.commit([RecordOp(rec("s2", "run_started", lane="side", runId="run-2"))])
    s.commit([RecordOp(rec("f9", "run_finished", runId="run-other", outcome="completed"))])
    s = c.reopen(s)
    _eq(s.lanes()["main"].run_id, "run-1", "another run's finish leaves the run open")
    _eq(s.lanes()["side"].run_id, "run-2", "the other lane's run")
    s.commit([RecordOp(rec("f1", "run_finished", runId="run-1", outcome="completed"))])
    with c.reopen(s) as s:
        main = s.lanes()["main"]
        _eq((main.run_id, main.run_seq), (None, None), "a finished run closes the lane")
        s.commit(
            [
                RecordOp(rec("s3", "run_started", runId="run-3")),
                RecordOp(rec("f3", "run_finished", runId="run-3", outcome="declined")),
            ]
        )
        _eq(s.lanes()["main"].run_id, None, "a run opened and settled in one commit")


def check_record_filters(c: _Ctx) -> None:
    """``records()`` filters by lane, run, seq and type, in seq order."""
    s = c.store.create_session("/p")
    s.commit([RecordOp(rec("a1", "run_started", runId="A"))])
    s.commit([RecordOp(rec("a2", "tool_started", runId="A"))])
    s.commit([RecordOp(rec("b1", "run_started", lane="side", runId="B"))])
    s.commit([RecordOp(rec("a3", "run_finished", runId="A", outcome="completed"))])
    s.commit([RecordOp(rec("n1", "note", lane=None))])
    with c.reopen(s, write=False) as s:
        _eq(ids(s.records()), ["a1", "a2", "b1", "a3", "n1"], "records()")
        _eq(ids(s.records("main")), ["a1", "a2", "a3"], "records(lane)")
        _eq(ids(s.records(run_id="A")), ["a1", "a2", "a3"], "records(run_id)")
        _eq(ids(s.records("side", run_id="A")), [], "records(lane, other run)")
        _eq(ids(s.records(since_seq=3)), ["a3", "n1"], "records(since_seq)")
        _eq(
            ids(s.records(types=("run_started", "run_finished"))),
            ["a1", "b1", "a3"],
            "records(types)",
        )
        _eq(
            ids(s.records("main", run_id="A", since_seq=1, types=("tool_started",))),
            ["a2"],
            "records(all filters)",
        )
        _eq(s.records("nope"), [], "records(unknown lane)")


def check_read_only(c: _Ctx) -> None:
    """A read-only open beside a live writer reads, and refuses every commit."""
    writer = c.store.create_session("/p")
    writer.commit([EntryOp(ent("e1"), lane="main")])
    with c.store.open_session(writer.session_id, write=False) as ro:
        _need(ro.read_only, "read_only is set")
        _eq(ids(ro.iter_entries()), ["e1"], "a reader sees the writer's commits")
        with _raises(ReadOnlySession, "an entry commit through a reader"):
            ro.commit([EntryOp(ent("e2", "e1"), lane="main")])
        with _raises(ReadOnlySession, "a lane commit through a reader"):
            ro.commit([LaneOp("main", leaf_id=None)])
    _eq(writer.get_entry("e2"), None, "a refused commit left nothing")
    writer.commit([EntryOp(ent("e2", "e1"), lane="main")])
    writer.close()


def check_durability_modes(c: _Ctx) -> None:
    """Every durability mode round-trips the same data."""
    for mode in DURABILITY_MODES:
        s = c.store.create_session("/p", durability=mode)
        _eq(s.durability, mode, "durability")
        parent = None
        for i in range(5):
            s.commit([EntryOp(ent(f"e{i}", parent, n=i), lane="main"), RecordOp(rec(f"r{i}"))])
            parent = f"e{i}"
        before = snapshot(s)
        with c.reopen(s, durability=mode) as s:
            _eq(snapshot(s), before, f"state after reopen in {mode} mode")


def check_concurrent_batch(c: _Ctx) -> None:
    """Concurrent commits in ``batch`` mode get distinct, per-thread ordered seqs, all kept."""
    s = c.store.create_session("/p", durability="batch")
    threads, per_thread = 8, 6
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def worker(t: int) -> None:
        try:
            start.wait()
            got, parent = [], None
            for i in range(per_thread):
                eid = f"t{t}-e{i}"
                got.append(
                    s.commit(
                        [EntryOp(ent(eid, parent), lane=f"lane{t}"), RecordOp(rec(f"t{t}-r{i}"))]
                    )
                )
                parent = eid
            results[t] = got
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    _eq(errors, [], "errors in committing threads")
    _need(all(not w.is_alive() for w in workers), "a committing thread hung")
    returned = [seq for t in results for seq in results[t]]
    _eq(len(set(returned)), threads * per_thread, "distinct seqs")
    for t in results:
        _eq(results[t], sorted(results[t]), f"thread {t}'s seqs in order")
    with c.reopen(s, write=False) as s:
        seqs = [e["seq"] for e in s.iter_entries()] + [r["seq"] for r in s.records()]
        _eq(sorted(seqs), list(range(1, 2 * threads * per_thread + 1)), "stored seqs")
        for t in range(threads):
            _eq(s.lanes()[f"lane{t}"].leaf_id, f"t{t}-e{per_thread - 1}", f"lane{t} leaf")


def check_copies(c: _Ctx) -> None:
    """Returned dicts are copies: mutating them changes nothing stored."""
    s = c.store.create_session("/p")
    s.commit([EntryOp(ent("e1", body={"k": [1]}), lane="main"), RecordOp(rec("r1"))])
    with c.reopen(s) as s:
        got = s.get_entry("e1")
        _need(got is not None, "get_entry of a stored entry")
        assert got is not None
        got["body"]["k"].append(2)
        s.iter_entries()[0]["body"]["k"].append(3)
        s.records()[0]["extra"] = 1
        _eq(s.get_entry("e1"), {**ent("e1", body={"k": [1]}), "seq": 1}, "entry after mutation")
        _need("extra" not in s.records()[0], "a mutated record leaked into the store")


CHECKS: dict[str, Callable[[_Ctx], None]] = {
    name.removeprefix("check_"): check
    for name, check in list(globals().items())
    if name.startswith("check_") and callable(check)
}
"""Every check above by name (``check_seq`` is ``seq``), in the order they run."""


def check_session_store(
    factory: StoreFactory,
    *,
    reopen_store: Reopener | None = None,
    only: list[str] | None = None,
) -> list[str]:
    """Run the storage conformance suite against a backend; return the names of the checks run.

    ``factory()`` returns a fresh, empty store (called once per check). ``reopen_store(store)``
    returns the store to reopen sessions through: for a durable backend a *new* store object
    over the same data (``lambda s: open_store(s.spec)``); the default reuses the same object.
    ``only`` runs the named checks of :data:`CHECKS`.

    Raises:
        ConformanceError: a check failed (an ``AssertionError``; the message starts with the
            check's name and says what differed).
        KeyError: ``only`` names no check.
    """
    names = list(CHECKS) if only is None else only
    for name in names:
        check = CHECKS[name]
        ctx = _Ctx(factory(), reopen_store or (lambda s: s))
        try:
            check(ctx)
        except ConformanceError as exc:
            raise ConformanceError(f"{name}: {exc}") from None
        except Exception as exc:
            raise ConformanceError(f"{name}: raised {type(exc).__name__}: {exc}") from exc
    return names
