"""The host: many durable sessions in one process (``design/host.md``)."""

from durable_harness.host.lifecycle import State
from durable_harness.host.manager import SessionManager
from durable_harness.host.options import HostOptions
from durable_harness.host.record import SessionRecord

__all__ = ["HostOptions", "SessionManager", "SessionRecord", "State"]
