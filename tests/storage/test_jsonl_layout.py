"""The JSONL backend's parts (``storage/jsonl``): only the file object (``file.py``) and the
catalogue make system calls; the format and the scanner are pure. (No private reach and
one-way imports between its modules are checked package-wide by ``tests/test_layout.py``.)"""

from __future__ import annotations

import ast
from pathlib import Path

JSONL = Path(__file__).resolve().parents[2] / "durable_harness" / "storage" / "jsonl"
PURE = ("framing.py", "scan.py")


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


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
