"""The storage contract as a hypothesis state machine over the memory, JSONL, SQLite and
PostgreSQL backends.

Each durable backend's session is held open for writing by a forked child process (a real
writer with its own lease, file descriptors and database connection). Every commit goes to the
children and to the in-memory backend, and must get the same answer from all of them and from
the plain model (``model.py``): a seq when the commit is valid, ``UnknownEntry`` when it is not.
Rules crash the writers with SIGKILL between commits, tear the tail of the log the way a write
cut short by a crash would (a partial line over the JSONL file's padding, a partial frame at the
end of the SQLite write-ahead log), close cleanly, and reopen.

After every step, fresh read-only opens of every durable session must show exactly the model:
every acknowledged commit reads back (entries with their content, records, lanes with their
leaves and open runs), seqs are contiguous (the last seq counts every acknowledged op, so no
commit is missing), every leaf is an entry that exists, and the only damage is a torn tail that
was never acknowledged; a writable reopen quarantines it byte for byte. (PostgreSQL's
server outlives the killed writers: a SIGKILL leaves it nothing torn to find.)
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
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
from durable_harness.storage import (
    DURABILITY_MODES,
    EntryOp,
    LaneOp,
    MemorySessionStore,
    Op,
    RecordOp,
    SessionStore,
    open_store,
)
from durable_harness.storage.barrier_trace import wal_commit_end

from .model import Model, commits, view

BACKENDS = ("jsonl", "sqlite", "postgres")


def encode_ops(ops: list[Op]) -> list[dict[str, Any]]:
    """Ops as JSON for the pipe to a writer (``LaneOp`` keeps "leaf not set" apart from None)."""
    out: list[dict[str, Any]] = []
    for op in ops:
        if isinstance(op, EntryOp):
            out.append({"k": "entry", "entry": op.entry, "lane": op.lane})
        elif isinstance(op, RecordOp):
            out.append({"k": "record", "record": op.record})
        else:
            item: dict[str, Any] = {"k": "lane", "lane": op.lane, "config": op.config}
            if op.sets_leaf():
                item["leaf"] = op.leaf_id
            out.append(item)
    return out


def decode_ops(items: list[dict[str, Any]]) -> list[Op]:
    """The inverse of :func:`encode_ops`."""
    ops: list[Op] = []
    for item in items:
        if item["k"] == "entry":
            ops.append(EntryOp(item["entry"], lane=item["lane"]))
        elif item["k"] == "record":
            ops.append(RecordOp(item["record"]))
        elif "leaf" in item:
            ops.append(LaneOp(item["lane"], leaf_id=item["leaf"], config=item["config"]))
        else:
            ops.append(LaneOp(item["lane"], config=item["config"]))
    return ops


def _serve(spec: str, sid: str, durability: Any, rfd: int, wfd: int) -> None:
    """The writer child: open the session for writing, report its damage, then commit each
    request line and answer with the seq or the error's class name, until killed."""
    inp = os.fdopen(rfd, "rb")
    out = os.fdopen(wfd, "wb", buffering=0)
    session = open_store(spec).open_session(sid, write=True, durability=durability)
    out.write(orjson.dumps({"damage": session.damage}) + b"\n")
    for line in inp:
        request = orjson.loads(line)
        if request.get("close"):
            session.close()
            out.write(b'{"closed":true}\n')
            continue
        try:
            answer: Any = session.commit(decode_ops(request["ops"]))
        except StorageError as exc:
            answer = type(exc).__name__
        out.write(orjson.dumps({"result": answer}) + b"\n")


class Writer:
    """A forked child holding one session open for writing (see :func:`_serve`)."""

    def __init__(self, spec: str, sid: str, durability: str) -> None:
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child never returns into pytest
            code = 0
            try:
                os.close(from_parent)
                os.close(to_parent)
                _serve(spec, sid, durability, to_child, from_child)
            except BaseException as exc:
                os.write(from_child, orjson.dumps({"fatal": repr(exc)}) + b"\n")
                code = 1
            finally:
                os._exit(code)
        os.close(to_child)
        os.close(from_child)
        self.pid = pid
        self._out = os.fdopen(from_parent, "wb", buffering=0)
        self._in = os.fdopen(to_parent, "rb")
        self.damage: list[dict[str, Any]] = self._answer()["damage"]

    def _answer(self) -> dict[str, Any]:
        line = self._in.readline()
        assert line, f"writer {self.pid} died"
        answer: dict[str, Any] = orjson.loads(line)
        assert "fatal" not in answer, answer["fatal"]
        return answer

    def commit(self, ops: list[Op]) -> int | str:
        """Send one commit; return what the writer's ``commit`` returned (or raised)."""
        self._out.write(orjson.dumps({"ops": encode_ops(ops)}) + b"\n")
        result: int | str = self._answer()["result"]
        return result

    def close(self) -> None:
        """Close the session cleanly, then end the child."""
        self._out.write(b'{"close":true}\n')
        assert self._answer() == {"closed": True}
        self.kill()

    def kill(self) -> None:
        """SIGKILL the child (its lease, descriptors and connection die with it) and reap it."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)
        self._out.close()
        self._in.close()


def _memory_commit(s: SessionStore, ops: list[Op]) -> int | str:
    try:
        return s.commit(ops)
    except StorageError as exc:
        return type(exc).__name__


class StorageMachine(RuleBasedStateMachine):
    """Commits, crashes, torn tails and reopens; the invariants hold after every step."""

    pg_spec: Callable[[], str] = staticmethod(lambda: "")  # set by the test (a fresh schema)

    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="dh-stateful-"))
        self.specs = {
            "jsonl": f"jsonl:{self.folder / 'home'}",
            "sqlite": f"sqlite:{self.folder / 'store.db'}",
            "postgres": self.pg_spec(),
        }
        self.model = Model()
        self.writers: dict[str, Writer] = {}
        self.sids: dict[str, str] = {}
        self.memory: MemorySessionStore | None = None
        self.durability = "sync"
        # a torn tail written and not yet quarantined: (offset, bytes) for JSONL
        self.torn: tuple[int, bytes] | None = None
        self.jsonl_path = ""

    @initialize(durability=st.sampled_from(DURABILITY_MODES))
    def create(self, durability: str) -> None:
        self.durability = durability
        for backend in BACKENDS:
            s = open_store(self.specs[backend]).create_session("/p")
            self.sids[backend] = s.session_id
            if backend == "jsonl":
                self.jsonl_path = s.location
            s.close()
        self.memory = MemorySessionStore({"id": self.sids["jsonl"], "cwd": "/p"})
        self.start_writers()

    def start_writers(self) -> None:
        for backend in BACKENDS:
            w = Writer(self.specs[backend], self.sids[backend], self.durability)
            self.writers[backend] = w
            if backend != "jsonl" or self.torn is None:
                assert w.damage == [], (backend, w.damage)
        if self.torn is not None:
            offset, tail = self.torn
            (item,) = self.writers["jsonl"].damage
            assert (item["kind"], item["offset"]) == ("torn_tail", offset), item
            side = Path(item["quarantined_to"])
            assert side.read_bytes() == tail
            assert Path(self.jsonl_path).stat().st_size == offset
            side.unlink()
            self.torn = None

    # -- rules -----------------------------------------------------------------------------

    @rule(descs=commits)
    def commit(self, descs: list[Any]) -> None:
        assert self.memory is not None
        ops, valid = self.model.build(descs)
        got = {b: w.commit(ops) for b, w in self.writers.items()}
        got["memory"] = _memory_commit(self.memory, ops)
        if valid:
            self.model.apply(ops)
            assert set(got.values()) == {self.model.seq}, got
        else:
            assert set(got.values()) == {"UnknownEntry"}, got

    @rule(tear=st.booleans(), data=st.data())
    def crash_and_reopen(self, tear: bool, data: st.DataObject) -> None:
        """SIGKILL both writers between commits; maybe tear the tail as a commit cut short by
        the crash would have; check what a reader sees; start new writers."""
        for w in self.writers.values():
            w.kill()
        self.writers = {}
        if tear:
            self.tear_tail(data)
        self.every_acknowledged_commit_reads_back()
        self.start_writers()

    @rule()
    def close_and_reopen(self) -> None:
        for w in self.writers.values():
            w.close()
        self.writers = {}
        self.every_acknowledged_commit_reads_back()
        self.start_writers()

    def tear_tail(self, data: st.DataObject) -> None:
        """A commit cut short: a prefix of its line where the JSONL data ends (over the
        padding the killed writer left, if any); for SQLite, part of a frame at the end of the
        write-ahead log, which recovery must ignore."""
        raw = Path(self.jsonl_path).read_bytes()
        end = len(raw.rstrip(b" \t\r\n"))
        end += raw[end : end + 1] == b"\n"
        line = orjson.dumps(
            {"gen": 99, "ops": [{"op": "entry", "lane": "main", "entry": {"id": "never"}}]}
        )
        tail = line[: data.draw(st.integers(1, len(line) - 1), label="cut")]
        fd = os.open(self.jsonl_path, os.O_WRONLY)
        try:
            os.pwrite(fd, tail, end)
        finally:
            os.close(fd)
        self.torn = (end, tail)
        wal = self.folder / "store.db-wal"
        end, _ = wal_commit_end(str(wal))  # where the next frame goes (zeros may follow)
        assert end > 0, "the killed SQLite writer left no write-ahead log"
        frame = data.draw(st.binary(min_size=1, max_size=600), label="wal frame")
        with wal.open("r+b") as f:
            f.seek(end)
            f.write(frame)

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def memory_is_the_model(self) -> None:
        if self.memory is not None:
            assert view(self.memory) == self.model.view()

    @invariant()
    def every_acknowledged_commit_reads_back(self) -> None:
        if not self.sids:
            return
        want = self.model.view()
        for backend in BACKENDS:
            s = open_store(self.specs[backend]).open_session(self.sids[backend], write=False)
            try:
                got = view(s)
                assert got == want, backend
                # seq is contiguous: the last seq counts every acknowledged op, no more
                seqs = [x["seq"] for x in [*got["entries"], *got["records"]]]
                assert len(set(seqs)) == len(seqs)
                assert s.last_seq() == self.model.seq
                # leaves are entries that exist; entries read back whole
                for lane in s.lanes().values():
                    assert lane.leaf_id is None or s.get_entry(lane.leaf_id) is not None
                for e in self.model.entries:
                    assert s.get_entry(e["id"]) == e
                assert s.entry_count() == len(self.model.entries)
                # the only damage: the torn tail no one was told about, not yet quarantined
                if backend == "jsonl" and self.torn is not None:
                    assert [(d["kind"], d["offset"]) for d in s.damage] == [
                        ("torn_tail", self.torn[0])
                    ]
                else:
                    assert s.damage == [], (backend, s.damage)
            finally:
                s.close()

    def teardown(self) -> None:
        for w in self.writers.values():
            w.kill()
        if self.memory is not None:
            self.memory.close()
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_storage_machine(pg_spec_factory: Callable[[], str]) -> None:
    """The machine on every backend, PostgreSQL in a fresh schema per example."""
    StorageMachine.pg_spec = staticmethod(pg_spec_factory)
    run_state_machine_as_test(
        StorageMachine,
        settings=settings(
            # each example forks writers and fsyncs: 20 under ci (about 5-10 s), 5 under dev
            max_examples=max(5, settings.default.max_examples // 3),
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
