"""The operator console: server-rendered pages over the host's sessions (``design/console.md``).

:func:`console_router` builds a FastAPI router to include in the host's HTTP app (templates and
static files ship as package data); :func:`is_console_path` names the paths a bearer-token
middleware must let through to the console's own check.
"""

from durable_harness.console.routes import console_router, is_console_path

__all__ = ["console_router", "is_console_path"]
