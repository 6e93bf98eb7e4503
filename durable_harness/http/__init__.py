"""The HTTP front of the host (``design/http.md``): :func:`create_app`, :func:`serve`."""

from durable_harness.http.app import create_app
from durable_harness.http.server import serve

__all__ = ["create_app", "serve"]
