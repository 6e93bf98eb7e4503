"""durable-harness: crash-durable runs for LLM agents.

The stable surface is the names in :data:`__all__` (``design/api.md``)::

    from durable_harness import Harness, Session, open_store, make_provider

Larger areas are documented subpackages (``durable_harness.storage``,
``durable_harness.recovery``, ``durable_harness.testing``); anything else is internal.

The names load on first use (PEP 562), so ``import durable_harness`` stays cheap for the
command line; the record vocabulary's shape check is registered with storage at import
(:mod:`durable_harness.harness.records`), before any store can be opened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import durable_harness.harness.records  # noqa: F401  (registers the record shape check)
from durable_harness.lazy import lazy_names

__version__ = "0.1.0"

if TYPE_CHECKING:
    from durable_harness.errors import DurableHarnessError
    from durable_harness.harness.core import HarnessOptions, RunHandle
    from durable_harness.harness.harness import Harness
    from durable_harness.providers import make_provider
    from durable_harness.recovery.decide import RecoveryPlan
    from durable_harness.recovery.resume import recover, resume
    from durable_harness.session.session import Session
    from durable_harness.storage import open_store
    from durable_harness.tools.base import Tool, ToolContext, ToolResult

#: Where each public name is defined.
_SOURCES = {
    "DurableHarnessError": "durable_harness.errors",
    "Harness": "durable_harness.harness.harness",
    "HarnessOptions": "durable_harness.harness.core",
    "RecoveryPlan": "durable_harness.recovery.decide",
    "RunHandle": "durable_harness.harness.core",
    "Session": "durable_harness.session.session",
    "Tool": "durable_harness.tools.base",
    "ToolContext": "durable_harness.tools.base",
    "ToolResult": "durable_harness.tools.base",
    "make_provider": "durable_harness.providers",
    "open_store": "durable_harness.storage",
    "recover": "durable_harness.recovery.resume",
    "resume": "durable_harness.recovery.resume",
}

__all__ = [
    "DurableHarnessError",
    "Harness",
    "HarnessOptions",
    "RecoveryPlan",
    "RunHandle",
    "Session",
    "Tool",
    "ToolContext",
    "ToolResult",
    "__version__",
    "make_provider",
    "open_store",
    "recover",
    "resume",
]


__getattr__ = lazy_names(__name__, _SOURCES, globals())


def __dir__() -> list[str]:
    """The module's names, the lazy public ones included."""
    return sorted(set(globals()) | set(__all__))
