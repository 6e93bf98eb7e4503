"""The host: many durable sessions in one process (``design/host.md``).

Its names load on first use (:mod:`durable_harness.lazy`): a command that reaches one module of
the host (``durable-harness forget`` imports ``host.forget``) does not import the manager, the
HTTP notifier and their dependencies."""

from typing import TYPE_CHECKING

from durable_harness.lazy import lazy_names

if TYPE_CHECKING:
    from durable_harness.host.lifecycle import State
    from durable_harness.host.manager import SessionManager
    from durable_harness.host.options import HostOptions
    from durable_harness.host.record import SessionRecord

__all__ = ["HostOptions", "SessionManager", "SessionRecord", "State"]

__getattr__ = lazy_names(
    __name__,
    {
        "State": "durable_harness.host.lifecycle",
        "SessionManager": "durable_harness.host.manager",
        "HostOptions": "durable_harness.host.options",
        "SessionRecord": "durable_harness.host.record",
    },
    globals(),
)
