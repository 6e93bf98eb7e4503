"""Session verbs on both backends: append, navigate, branch, labels, name, lanes, fork, tree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from durable_harness.errors import SessionNotFound, UnknownEntry
from durable_harness.session import Session, TreeNode, open_session
from durable_harness.session.context import Context
from durable_harness.storage import RecordOp, Store, open_store


def _texts(ctx: Context) -> list[str]:
    out = []
    for m in ctx.messages:
        c = m["content"]
        out.append(c if isinstance(c, str) else "".join(b.get("text", "") for b in c))
    return out


def user(s: Session, text: str, lane: str = "main") -> str:
    return str(s.append_message({"role": "user", "content": text}, lane=lane)["id"])


def assistant(s: Session, text: str, lane: str = "main") -> str:
    msg = {"role": "assistant", "content": [{"type": "text", "text": text}]}
    return str(s.append_message(msg, lane=lane)["id"])


def reopened(store: Store, s: Session) -> Session:
    s.close()
    return open_session(s.id, open_store(store.spec), write=True)


@pytest.fixture
def sess(store: Store) -> Any:
    s = Session(store.create_session("/proj"))
    yield s
    s.close()


def test_append_links_entries_and_moves_the_leaf(store: Store, sess: Session) -> None:
    assert sess.leaf() is None
    u1 = user(sess, "hello")
    a1 = assistant(sess, "hi")
    entry = sess.entry(a1)
    assert entry["parentId"] == u1
    assert entry["type"] == "message"
    assert entry["timestamp"].endswith("Z")
    assert isinstance(entry["seq"], int)
    assert sess.leaf() == a1
    assert [e["id"] for e in sess.path(a1)] == [u1, a1]
    assert _texts(sess.context()) == ["hello", "hi"]
    s = reopened(store, sess)
    try:
        assert s.leaf() == a1
        assert _texts(s.context()) == ["hello", "hi"]
        with pytest.raises(UnknownEntry):
            s.entry("nope")
    finally:
        s.close()


def test_navigate_is_durable_and_branches(store: Store, sess: Session) -> None:
    u1 = user(sess, "one")
    a1 = assistant(sess, "two")
    sess.navigate(u1)
    assert sess.leaf() == u1
    s = reopened(store, sess)  # no append after the move
    try:
        assert s.leaf() == u1
        b = assistant(s, "other answer")
        assert s.entry(b)["parentId"] == u1
        assert _texts(s.context()) == ["one", "other answer"]
        assert _texts(s.context(a1)) == ["one", "two"]  # the old branch is still there
        with pytest.raises(UnknownEntry):
            s.navigate("missing")
        assert s.leaf() == b
        s.navigate(None)
        assert s.leaf() is None
        root2 = user(s, "new root")
        assert s.entry(root2)["parentId"] is None
        with pytest.raises(UnknownEntry):
            s.context("missing")
    finally:
        s.close()


def test_branch_with_summary(store: Store, sess: Session) -> None:
    u1 = user(sess, "start")
    assistant(sess, "went left")
    left = user(sess, "more left")
    summary = sess.branch_with_summary(u1, "left was a dead end")
    assert summary["type"] == "branch_summary"
    assert summary["parentId"] == u1
    assert summary["fromId"] == left
    assert sess.leaf() == summary["id"]
    s = reopened(store, sess)
    try:
        assert s.leaf() == summary["id"]
        ctx = s.context()
        assert [m["role"] for m in ctx.messages] == ["user", "user"]
        assert "left was a dead end" in _texts(ctx)[1]
        with pytest.raises(UnknownEntry):
            s.branch_with_summary("missing", "x")
    finally:
        s.close()


def test_labels_latest_wins_and_none_clears(store: Store, sess: Session) -> None:
    a = user(sess, "a")
    b = assistant(sess, "b")
    sess.set_label(a, "first")
    sess.set_label(a, "second")
    sess.set_label(b, "bee")
    assert sess.labels() == {a: "second", b: "bee"}
    sess.set_label(a, None)
    assert sess.labels() == {b: "bee"}
    with pytest.raises(UnknownEntry):
        sess.set_label("missing", "x")
    s = reopened(store, sess)
    try:
        assert s.labels() == {b: "bee"}
        s.set_label(a, "again")
        assert s.labels() == {a: "again", b: "bee"}
        # Label entries never reach the model.
        assert _texts(s.context()) == ["a", "b"]
    finally:
        s.close()


def test_name_latest_wins(store: Store, sess: Session) -> None:
    assert sess.name is None
    sess.set_name("first name")
    sess.set_name("second name")
    assert sess.name == "second name"
    s = reopened(store, sess)
    try:
        assert s.name == "second name"
    finally:
        s.close()


def test_create_lane(store: Store, sess: Session) -> None:
    u1 = user(sess, "shared start")
    a1 = assistant(sess, "main answer")
    lane = sess.create_lane("side", from_entry=u1, config={"model": "m1"})
    assert (lane.name, lane.leaf_id, lane.config) == ("side", u1, {"model": "m1"})
    side = assistant(sess, "side answer", lane="side")
    assert sess.entry(side)["parentId"] == u1
    assert sess.leaf("side") == side
    assert sess.leaf() == a1  # main did not move
    with pytest.raises(UnknownEntry):
        sess.create_lane("bad", from_entry="missing")
    s = reopened(store, sess)
    try:
        assert s.leaf("side") == side
        assert s.lane("side").config == {"model": "m1"}
        assert s.leaf("main") == a1
        assert "bad" not in s.store.lanes()
        assert _texts(s.context(lane="side")) == ["shared start", "side answer"]
        assert s.lane("unknown").leaf_id is None
    finally:
        s.close()


def test_fork_at_and_before(store: Store, sess: Session, tmp_path: Path) -> None:
    u1 = user(sess, "one")
    a1 = assistant(sess, "two")
    u2 = user(sess, "three")
    sess.store.commit([RecordOp({"type": "note", "id": "op-log-record", "lane": "main"})])
    original = {e["id"]: e for e in sess.store.iter_entries()}

    at = sess.fork(store, a1, position="at")
    before = sess.fork(store, a1, position="before")
    at_leaf = sess.fork(store, None)
    try:
        for forked, want in ((at, [u1, a1]), (before, [u1]), (at_leaf, [u1, a1, u2])):
            assert forked.id != sess.id
            assert forked.store.header["parentSession"] == sess.id
            assert forked.cwd == "/proj"
            entries = forked.store.iter_entries()
            assert [e["id"] for e in entries] == want  # ids kept
            for e in entries:
                assert {k: v for k, v in e.items() if k != "seq"} == {
                    k: v for k, v in original[e["id"]].items() if k != "seq"
                }
            assert forked.leaf() == want[-1]
            assert forked.store.records() == []  # the op log is not copied
        assert _texts(at.context()) == ["one", "two"]
        infos = {i.id: i for i in store.list_sessions("/proj")}
        assert infos[at.id].parent_session == sess.id
    finally:
        for forked in (at, before, at_leaf):
            forked.close()
    # The source session is unchanged.
    assert [e["id"] for e in sess.store.iter_entries()] == [u1, a1, u2]
    assert len(sess.store.records()) == 1
    with pytest.raises(UnknownEntry):
        sess.fork(store, "missing")


def test_fork_into_another_cwd_and_backend(store: Store, sess: Session, tmp_path: Path) -> None:
    u1 = user(sess, "one")
    a1 = assistant(sess, "two")
    elsewhere = sess.fork(store, a1, cwd="/elsewhere")
    try:
        assert elsewhere.cwd == "/elsewhere"
        assert [i.id for i in store.list_sessions("/elsewhere")] == [elsewhere.id]
        assert elsewhere.id not in [i.id for i in store.list_sessions("/proj")]
    finally:
        elsewhere.close()
    other_kind = "sqlite" if store.spec.startswith("jsonl:") else "jsonl"
    target = open_store(
        f"sqlite:{tmp_path}/other.db" if other_kind == "sqlite" else f"jsonl:{tmp_path}/other"
    )
    copy = sess.fork(target, a1)
    try:
        assert [e["id"] for e in copy.store.iter_entries()] == [u1, a1]
        assert copy.store.header["parentSession"] == sess.id
    finally:
        copy.close()
    reread = open_session(copy.id, target)
    try:
        assert _texts(reread.context()) == ["one", "two"]
    finally:
        reread.close()


def _shape(nodes: list[TreeNode]) -> list[Any]:
    return [(n.entry["id"], n.label, _shape(n.children)) for n in nodes]


def test_tree_listing(store: Store, sess: Session) -> None:
    u1 = user(sess, "root")
    a1 = assistant(sess, "a")
    u2 = user(sess, "deep")
    sess.navigate(u1)
    a2 = assistant(sess, "b")  # second child of u1
    sess.navigate(None)
    r2 = user(sess, "second root")
    lbl = sess.set_label(a1, "mark")["id"]  # a label is itself an entry, under the leaf
    s = reopened(store, sess)
    try:
        assert _shape(s.tree()) == [
            (u1, None, [(a1, "mark", [(u2, None, [])]), (a2, None, [])]),
            (r2, None, [(lbl, None, [])]),
        ]
    finally:
        s.close()


def test_open_session_by_path_prefix_and_missing(store: Store, sess: Session) -> None:
    user(sess, "x")
    sid = sess.id
    sess.close()
    by_prefix = open_session(sid[:13], store)
    try:
        assert by_prefix.id == sid
        assert by_prefix.store.read_only  # read-only unless write=True
    finally:
        by_prefix.close()
    if store.spec.startswith("jsonl:"):
        path = store.list_sessions()[0].path
        by_path = open_session(path, store, write=True)
        try:
            assert by_path.id == sid and not by_path.store.read_only
        finally:
            by_path.close()
    with pytest.raises(SessionNotFound):
        open_session("/no/such/file.jsonl", store)
    with pytest.raises(SessionNotFound):
        open_session("zzzz", store)


def _ids(s: Session) -> set[str]:
    return {str(e["id"]) for e in s.store.iter_entries()}


def test_a_fork_keeps_the_labels_of_the_entries_it_copies(store: Store, sess: Session) -> None:
    """As pi's ``createBranchedSession``: the path without its label entries, then each
    path entry's current label re-made under the path's end; labels of entries left out, and
    cleared ones, are not carried (issue 20: the fork dropped them)."""
    u1 = user(sess, "one")
    a1 = assistant(sess, "two")
    u2 = user(sess, "three")
    sess.set_label(u1, "start")
    sess.set_label(a1, "old")
    sess.set_label(a1, "answer")  # the latest label wins
    sess.set_label(u2, "later")  # u2 is not copied by a fork at a1
    sess.navigate(u1)
    side = assistant(sess, "side")  # a branch off u1, labelled there
    sess.set_label(u1, "start again")
    sess.set_label(side, "")  # cleared: not carried
    forks = [sess.fork(store, a1), reopened(store, sess).fork(store, side)]
    try:
        at_a1, at_side = forks
        # a label is the session's (the latest per entry wins, on any branch), as in pi
        assert at_a1.labels() == {u1: "start again", a1: "answer"}
        assert at_side.labels() == {u1: "start again"}
        assert _texts(at_a1.context()) == ["one", "two"]  # labels never reach the context
        label_entries = at_a1.store.iter_entries(("label",))
        assert [e["parentId"] for e in label_entries] == [a1, label_entries[0]["id"]]
        assert at_a1.leaf() == label_entries[-1]["id"]
    finally:
        for f in forks:
            f.close()


def test_a_cross_cwd_fork_and_a_clone_copy_the_whole_tree(
    store: Store, sess: Session, tmp_path: Path
) -> None:
    """As pi's ``SessionManager.forkFrom``: every entry of the tree (other branches and the
    label entries too), ids kept, the same leaf; the other cwd is the new session's."""
    u1 = user(sess, "one")
    assistant(sess, "two")
    sess.set_label(u1, "start")
    sess.navigate(u1)
    leaf = assistant(sess, "other branch")
    elsewhere = sess.fork(store, None, cwd="/elsewhere")
    target = open_store(f"sqlite:{tmp_path}/clone.db")
    cloned = sess.clone(target)
    try:
        for copy in (elsewhere, cloned):
            assert _ids(copy) == _ids(sess)
            assert copy.leaf() == leaf == sess.leaf()
            assert copy.labels() == {u1: "start"}
            assert _texts(copy.context()) == ["one", "other branch"]
            assert copy.store.header["parentSession"] == sess.id
            assert copy.store.records() == []
        assert elsewhere.cwd == "/elsewhere" and cloned.cwd == "/proj"
        at = sess.fork(store, u1, cwd="/elsewhere")  # the whole tree, the leaf where asked
        assert _ids(at) == _ids(sess) and at.leaf() == u1
        at.close()
    finally:
        elsewhere.close()
        cloned.close()
