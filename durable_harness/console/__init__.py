"""The operator console: server-rendered pages over the host's sessions (``design/console.md``).

:func:`console_router` builds a FastAPI router to include in the host's HTTP app; nothing else
is needed (templates and static files ship as package data).
"""

from durable_harness.console.routes import console_router

__all__ = ["console_router"]
