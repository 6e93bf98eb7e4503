"""Names a package loads on first use (PEP 562), so that importing it stays cheap."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_names(
    package: str, sources: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: a name of ``sources`` is imported from the
    module ``sources[name]`` on first use and kept in ``namespace`` (the package's globals).
    The function raises ``AttributeError`` for any other name."""

    def __getattr__(name: str) -> Any:
        source = sources.get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = namespace[name] = getattr(import_module(source), name)
        return value

    return __getattr__
