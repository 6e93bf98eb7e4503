"""The SQLite writer's cache against a fresh reader, as a hypothesis state machine: random good
and refused commits (``UnknownEntry``, ``IdConflict``, ``InvalidOp``), in their own transaction,
unwaited, grouped from tasks (``commit_async``) and from threads, with calls failing inside a
group, and close/reopen. After every step every read the writer's cache answers (``lanes``,
``lane``, ``last_seq``, ``get_entry`` of every entry) must equal what a fresh read-only session
of a fresh store object reads (``design/storage.md``, "The writer's cache")."""

from __future__ import annotations

import shutil
import tempfile
import threading
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from durable_harness.errors import StorageError
from durable_harness.storage import EntryOp, LaneOp, Op, RecordOp, SessionStore, open_store

from .util import ent, outcomes, rec

LANES = (None, "main", "side")
CONFIGS = st.one_of(
    st.none(),
    st.fixed_dictionaries({"k": st.integers(0, 3)}),
    st.fixed_dictionaries({"m": st.fixed_dictionaries({"x": st.integers(0, 3)})}),
)
# An op as drawn: turned into a real op against the entries committed so far (see _op).
OP = st.one_of(
    st.tuples(st.just("entry"), st.integers(-3, 20), st.sampled_from(LANES)),
    st.tuples(
        st.just("record"),
        st.sampled_from(["note", "run_started", "run_finished"]),
        st.sampled_from(LANES),
        st.sampled_from([None, "r0", "r1"]),
    ),
    st.tuples(st.just("lane"), st.sampled_from(["main", "side"]), st.integers(-4, 20), CONFIGS),
    st.tuples(st.just("dup"), st.integers(0, 20)),
    st.tuples(st.just("invalid")),
)
CALL = st.lists(OP, min_size=1, max_size=4)


def view(s: SessionStore, entry_ids: list[str]) -> dict[str, Any]:
    """Every read the writer's cache answers."""
    return {
        "lanes": {k: vars(v) for k, v in s.lanes().items()},
        "lane": {n: vars(s.lane(n)) for n in ("main", "side", "none")},
        "last_seq": s.last_seq(),
        "entries": {e: s.get_entry(e) for e in [*entry_ids, "nope"]},
    }


class WriterCacheMachine(RuleBasedStateMachine):
    @initialize(durability=st.sampled_from(["sync", "batch", "none"]))
    def setup(self, durability: str) -> None:
        self.dir = tempfile.mkdtemp()
        self.spec = f"sqlite:{self.dir}/s.db"
        self.store = open_store(self.spec)
        self.durabilities = [durability, "batch"]
        self.sessions = [
            self.store.create_session("/p", durability=d)  # type: ignore[arg-type]
            for d in self.durabilities
        ]
        self.ids: list[list[str]] = [[], []]  # committed entry ids, as the fresh reader has them
        self.n = 0

    def teardown(self) -> None:
        for s in getattr(self, "sessions", []):
            s.close()
        if hasattr(self, "dir"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def _new(self) -> str:
        self.n += 1
        return f"e{self.n}"

    def _op(self, which: int, spec: tuple[Any, ...], made: list[str]) -> Op:
        known = self.ids[which] + made

        def pick(i: int) -> str | None:
            if i == -1 or not known:
                return None
            if i == -2:
                return "nope"
            if i == -3:
                return known[-1]
            return known[i % len(known)]

        kind = spec[0]
        if kind == "entry":
            eid = self._new()
            made.append(eid)
            return EntryOp(ent(eid, pick(spec[1])), lane=spec[2])
        if kind == "record":
            _, rtype, lane, run = spec
            extra = {} if run is None else {"runId": run}
            return RecordOp(rec(f"r{self._new()}", rtype, lane=lane, **extra))
        if kind == "lane":
            _, lane, leaf, config = spec
            if leaf == -4:
                return LaneOp(lane, config=config)
            return LaneOp(lane, leaf_id=pick(leaf), config=config)
        if kind == "dup":
            eid = known[spec[1] % len(known)] if known else "dup-none"
            return EntryOp(ent(eid), lane="main")
        return EntryOp("not an entry")  # type: ignore[arg-type]

    def _ops(self, which: int, call: list[tuple[Any, ...]]) -> list[Op]:
        made: list[str] = []
        return [self._op(which, spec, made) for spec in call]

    @rule(which=st.integers(0, 1), call=CALL, wait=st.booleans())
    def commit(self, which: int, call: list[tuple[Any, ...]], wait: bool) -> None:
        try:
            self.sessions[which].commit(self._ops(which, call), wait=wait)
        except StorageError:
            pass

    @rule(calls=st.lists(st.tuples(st.integers(0, 1), CALL), min_size=1, max_size=5))
    def group_of_tasks(self, calls: list[tuple[int, list[tuple[Any, ...]]]]) -> None:
        named = {
            f"c{i}": (self.sessions[w], self._ops(w, call)) for i, (w, call) in enumerate(calls)
        }
        anyio.run(outcomes, named)

    @rule(calls=st.lists(st.tuples(st.integers(0, 1), CALL), min_size=2, max_size=5))
    def threads(self, calls: list[tuple[int, list[tuple[Any, ...]]]]) -> None:
        work = [(self.sessions[w], self._ops(w, call)) for w, call in calls]
        start = threading.Barrier(len(work))

        def one(s: SessionStore, ops: list[Op]) -> None:
            start.wait()
            try:
                s.commit(ops)
            except StorageError:
                pass

        threads = [threading.Thread(target=one, args=item) for item in work]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    @rule(which=st.integers(0, 1), fresh_store=st.booleans())
    def reopen(self, which: int, fresh_store: bool) -> None:
        s = self.sessions[which]
        s.close()
        store = open_store(self.spec) if fresh_store else self.store
        self.sessions[which] = store.open_session(
            s.session_id,
            durability=self.durabilities[which],  # type: ignore[arg-type]
        )

    @invariant()
    def the_writer_reads_what_the_database_holds(self) -> None:
        if not hasattr(self, "sessions"):
            return
        for which, s in enumerate(self.sessions):
            with open_store(self.spec).open_session(s.session_id, write=False) as ro:
                self.ids[which] = [str(e["id"]) for e in ro.iter_entries()]
                truth = view(ro, self.ids[which])
            assert view(s, self.ids[which]) == truth


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_the_writer_s_cache_reads_as_a_fresh_reader() -> None:
    run_state_machine_as_test(
        WriterCacheMachine,
        settings=settings(
            max_examples=40,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
