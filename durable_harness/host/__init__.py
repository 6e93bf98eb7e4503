"""The host: many durable sessions in one process (``design/host.md``).

- :class:`SessionManager` (with :class:`HostOptions`): ``create``, ``resume``, ``decide``,
  ``close``, ``forget``, ``list``, ``shutdown`` and the agent verbs;
- :class:`SessionRecord`: a session's durable facts; :data:`State`: its lifecycle state,
  moved only through :func:`durable_harness.host.lifecycle.check`.
"""

from durable_harness.host.lifecycle import State
from durable_harness.host.manager import SessionManager
from durable_harness.host.options import HostOptions
from durable_harness.host.record import SessionRecord

__all__ = ["HostOptions", "SessionManager", "SessionRecord", "State"]
