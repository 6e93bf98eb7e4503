"""No recursion over the session tree (issue 10): ``show --tree`` on a real 1,002-entry pi session
failed with RecursionError. Every walk is iterative; checked on a chain 20 times deeper than the
recursion limit (20,000 entries) built with the library, through the CLI (``show --tree``,
``fsck``) and the library's walks (tree, path, context), and by a scan of the code for
self-recursive functions."""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from durable_harness.cli.session_commands import _tree_lines
from durable_harness.session import Session
from durable_harness.storage import EntryOp, MemorySessionStore, open_store

from .conftest import REPO, Result

Cli = Callable[..., Result]
CHAIN = 20 * sys.getrecursionlimit()  # deep enough that any recursive walk overflows


def _message(i: int) -> dict[str, Any]:
    if i % 2 == 0:
        return {"role": "user", "content": [{"type": "text", "text": f"q{i}"}], "timestamp": 0}
    return {
        "role": "assistant",
        "content": [{"type": "text", "text": f"a{i}"}],
        "api": "scripted",
        "provider": "scripted",
        "model": "scripted-1",
        "usage": {
            "input": 0,
            "output": 0,
            "cacheRead": 0,
            "cacheWrite": 0,
            "totalTokens": 0,
            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0},
        },
        "stopReason": "stop",
        "timestamp": 0,
    }


def _chain_ops() -> list[EntryOp]:
    """:data:`CHAIN` message entries, each the child of the one before, on lane ``main``."""
    ops: list[EntryOp] = []
    parent: str | None = None
    for i in range(CHAIN):
        eid = f"e{i:06d}"
        entry = {"type": "message", "id": eid, "parentId": parent, "message": _message(i)}
        ops.append(EntryOp({**entry, "timestamp": "2026-01-01T00:00:00.000Z"}, lane="main"))
        parent = eid
    return ops


@pytest.mark.slow
def test_show_tree_and_fsck_on_a_chain_deeper_than_the_recursion_limit(
    cli: Cli, tmp_path: Path
) -> None:
    """Through the CLI, on a real JSONL session file built with the library."""
    store = open_store(f"jsonl:{tmp_path / 'store'}").create_session("/deep", durability="none")
    ops = _chain_ops()
    for start in range(0, CHAIN, 5000):
        store.commit(ops[start : start + 5000])
    path = store.location
    store.close()
    res = cli("show", path, "--tree")
    assert res.code == 0, res.err
    tree = [line for line in res.out.splitlines() if line.startswith("e")]
    assert len(tree) == CHAIN
    assert tree[0].startswith("e000000 user") and tree[-1].endswith("<main>")
    assert max(len(line) for line in tree) < 100  # a chain is not indented
    checked = cli("fsck", path, "--json")
    assert checked.code == 0 and checked.json()["entries"] == CHAIN


@pytest.mark.slow
def test_library_walks_on_a_chain_deeper_than_the_recursion_limit() -> None:
    """The library's walks (tree, path, context, fork) on the same chain, in memory."""
    assert sys.getrecursionlimit() < CHAIN  # the walks below would overflow if recursive
    s = Session(MemorySessionStore({"id": "deep", "cwd": "/deep"}))
    s.store.commit(_chain_ops())
    roots = s.tree()
    assert len(roots) == 1
    depth, node = 1, roots[0]
    while node.children:
        (node,) = node.children
        depth += 1
    assert depth == CHAIN
    assert len(s.path(s.leaf())) == CHAIN
    ctx = s.context()
    assert len(ctx.messages) == CHAIN and ctx.entry_ids[-1] == f"e{CHAIN - 1:06d}"
    assert len(_tree_lines(roots, {"main": str(s.leaf())})) == CHAIN


def test_show_tree_on_the_real_1002_entry_pi_session(cli: Cli, pi_sessions: Path) -> None:
    for name in ("before-compaction.jsonl", "large-session.jsonl"):
        path = pi_sessions / name
        if not path.is_file():
            pytest.skip(f"{path} not found: the test reads the shared pi files in place")
        res = cli("show", str(path), "--tree")
        assert res.code == 0, (name, res.err)
        entries = cli("show", str(path), "--json").json()["entries"]
        assert entries > 1000
        head = 4 if res.out.splitlines()[2].startswith("first prompt") else 3
        tree = [line for line in res.out.splitlines()[head:] if not line.startswith("damage")]
        assert len(tree) == entries, name


def _self_recursive(path: Path) -> list[str]:
    found = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for call in ast.walk(fn):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Name)
                and call.func.id == fn.name
            ):
                found.append(f"{path.relative_to(REPO)}:{fn.lineno} {fn.name}")
    return found


def test_no_recursive_function_walks_the_tree() -> None:
    """Scan the packages that walk the session tree for functions that call themselves."""
    found = [
        hit
        for package in ("session", "cli", "recovery", "harness")
        for path in sorted((REPO / "durable_harness" / package).rglob("*.py"))
        for hit in _self_recursive(path)
    ]
    assert found == [], f"recursive functions (use an explicit stack): {found}"


def test_show_tree_draws_branch_points(cli: Cli, pi_sessions: Path) -> None:
    res = cli("show", str(pi_sessions / "v3-branched.jsonl"), "--tree")
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    assert any(line.startswith("├─ a0000006 ") for line in lines), res.out
    assert "│  a0000007 " in res.out and any(line.startswith("└─ a000000a ") for line in lines)
    assert "   a0000011 session_info <main>" in res.out
