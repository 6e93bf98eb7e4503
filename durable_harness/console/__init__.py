"""The operator console: server-rendered pages over the host's sessions (``design/console.md``)."""

from durable_harness.console.routes import console_router, is_console_path

__all__ = ["console_router", "is_console_path"]
