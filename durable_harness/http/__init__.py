"""The HTTP front of the host (``design/http.md``): :func:`create_app` builds the FastAPI
application over a :class:`~durable_harness.host.manager.SessionManager`; :func:`serve` runs
it with uvicorn on a socket bound in one step (``durable-harness serve``)."""

from durable_harness.http.app import create_app
from durable_harness.http.server import serve

__all__ = ["create_app", "serve"]
