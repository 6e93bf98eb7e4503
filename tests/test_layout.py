"""Layering and documentation rules of the package, checked on its source.

* The library never imports a front: no module outside the fronts (``cli/``, ``demo.py``,
  ``__main__.py``, ``crashtest/``, the testing kit ``testing/`` (built on the crash matrix, used
  by test suites), and the HTTP/console/ACP fronts if they appear) imports
  ``durable_harness.cli`` (or another front), statically or through ``importlib``.
* Every public module-level function and class has a docstring.
* No module reaches another module's private names; sibling modules import one way; no module
  is over 600 lines (``design/architecture.md``).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "durable_harness"
# Fronts, as paths relative to the package (a folder or one module).
FRONT_PATHS = ("cli", "http", "console", "acp", "crashtest", "testing", "demo.py", "__main__.py")
FRONT_MODULES = tuple(
    "durable_harness." + p.removesuffix(".py").replace("/", ".") for p in FRONT_PATHS
)


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_front(path: Path) -> bool:
    rel = path.relative_to(PACKAGE).as_posix()
    return any(rel == f or rel.startswith(f + "/") for f in FRONT_PATHS)


def _library_files() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if not _is_front(p)]


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports (relative imports resolved), with its line number;
    ``from X import name`` yields both ``X`` and ``X.name`` (``name`` may be a submodule)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (
                    isinstance(node.func, ast.Name)
                    and node.func.id in ("__import__", "import_module")
                )
            )
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def _is_front_module(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FRONT_MODULES)


def test_the_walk_sees_the_library() -> None:
    names = {_module_name(p) for p in _library_files()}
    assert {"durable_harness", "durable_harness.session", "durable_harness.storage"} <= names
    assert not any(_is_front_module(n) for n in names)
    assert (PACKAGE / "cli" / "main.py").is_file()


@pytest.mark.slow
def test_library_never_imports_a_front() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for path in _library_files()
        for line, name in _imported_modules(path)
        if _is_front_module(name)
    ]
    assert not offenders, "the library imports a front:\n" + "\n".join(offenders)


@pytest.mark.slow
def test_importing_the_library_loads_no_front() -> None:
    """The same rule at run time: importing every library module loads no front module."""
    modules = sorted(_module_name(p) for p in _library_files())
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        f"print([m for m in sys.modules if m.startswith({FRONT_MODULES!r})])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"front modules loaded by the library: {proc.stdout}"


def _undocumented(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and not node.name.startswith("_")
        and ast.get_docstring(node) is None
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "area",
    sorted({p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in PACKAGE.rglob("*.py")}),
)
def test_public_names_have_docstrings(area: str) -> None:
    files = [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.relative_to(PACKAGE).parts[0].removesuffix(".py") == area
    ]
    offenders = [o for p in files for o in _undocumented(p)]
    assert not offenders, (
        f"{len(offenders)} public module-level function(s)/class(es) without a docstring:\n"
        + "\n".join(offenders)
    )


# Private reach across modules (design/architecture.md, "One rule, one home"): a module uses
# another module's objects through their public names only. ``x._name`` where ``x`` is not
# ``self``/``cls`` and ``_name`` is not defined in the same module, and ``from m import _name``
# from another module of the package, are offences. The stdlib's documented underscore names
# (``os._exit``, ``sys._getframe``, namedtuple's ``_replace``/``_asdict``/``_fields``/``_make``)
# are public in spite of their spelling.
_PUBLIC_UNDERSCORE = {"_replace", "_asdict", "_fields", "_make", "_exit", "_getframe"}


def _private_names_defined(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return {n for n in names if n.startswith("_")}


def _foreign_private_reach(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    own = _private_names_defined(tree)
    where = path.relative_to(PACKAGE.parent)
    found: list[str] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and node.attr not in _PUBLIC_UNDERSCORE | own
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append(f"{where}:{node.lineno} reaches .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (
            node.level or (node.module or "").startswith("durable_harness")
        ):
            found += [
                f"{where}:{node.lineno} imports private {a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
    return found


@pytest.mark.slow
def test_no_private_reach_across_modules() -> None:
    offenders = [o for p in sorted(PACKAGE.rglob("*.py")) for o in _foreign_private_reach(p)]
    assert not offenders, "private names used across modules:\n" + "\n".join(offenders)


def _sibling_imports() -> dict[str, set[str]]:
    """Each non-package module mapped to the sibling modules (same package) it imports,
    at any depth of the file (a function-level or ``TYPE_CHECKING`` import counts)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        parent = name.rpartition(".")[0]
        graph[name] = {
            target
            for _, imported in _imported_modules(path)
            for target in (imported, imported.rpartition(".")[0])
            if target in modules and target != name and target.rpartition(".")[0] == parent
        }
    return graph


@pytest.mark.slow
def test_a_part_never_imports_the_module_that_composes_it() -> None:
    """Inside a package the imports between sibling modules run one way: when ``a`` imports
    ``b``, ``b`` does not import ``a`` (a part that needs its composer takes a protocol)."""
    graph = _sibling_imports()
    cycles = sorted(
        f"{a} <-> {b}" for a, deps in graph.items() for b in deps if a < b and a in graph[b]
    )
    assert not cycles, "sibling modules importing each other:\n" + "\n".join(cycles)


def test_no_module_is_over_600_lines() -> None:
    long = [
        f"{p.relative_to(PACKAGE.parent)}: {n} lines"
        for p in sorted(PACKAGE.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > 600
    ]
    assert not long, "modules over 600 lines (split them by job):\n" + "\n".join(long)
