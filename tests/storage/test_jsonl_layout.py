"""The JSONL backend's parts (``storage/jsonl``): each module uses another's objects through
their public names only, the imports between them run one way, and only the file object
(``file.py``) and the catalogue make system calls: the format and the scanner are pure."""

from __future__ import annotations

import ast
from pathlib import Path

JSONL = Path(__file__).resolve().parents[2] / "durable_harness" / "storage" / "jsonl"
PURE = ("framing.py", "scan.py")


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _own_private_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return {n for n in names if n.startswith("_")}


def test_no_module_reaches_into_another_modules_private_names() -> None:
    offenders = []
    for path in sorted(JSONL.glob("*.py")):
        tree = _tree(path)
        own = _own_private_names(tree)
        offenders += [
            f"{path.name}:{node.lineno} .{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and node.attr not in own
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ]
    assert not offenders, "private names reached across modules:\n" + "\n".join(offenders)


def _siblings(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "durable_harness.storage.jsonl."
        ):
            found.add(node.module.rsplit(".", 1)[1] + ".py")  # type: ignore[union-attr]
    return found


def test_imports_between_the_parts_run_one_way() -> None:
    graph = {p.name: _siblings(p) for p in JSONL.glob("*.py") if p.name != "__init__.py"}
    cycles = sorted(f"{a} <-> {b}" for a, deps in graph.items() for b in deps if a in graph[b])
    assert not cycles, "modules of storage/jsonl importing each other:\n" + "\n".join(cycles)


def test_the_format_and_the_scanner_make_no_system_call() -> None:
    for name in PURE:
        tree = _tree(JSONL / name)
        calls = [
            f"{name}:{node.lineno} os.{node.func.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "os"
        ]
        imports = [
            f"{name}:{node.lineno} imports {alias.name}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
            if alias.name in ("file", "store", "lease", "barrier_trace")
            or (isinstance(node, ast.ImportFrom) and "jsonl.file" in (node.module or ""))
        ]
        assert not calls and not imports, "\n".join(calls + imports)
