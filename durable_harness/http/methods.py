"""Which methods a path takes (``design/http.md``): the ``Allow`` header of a 405 and the
same-origin guard's test of whether a route would take a request, written once."""

from __future__ import annotations

from starlette.routing import Match, Router
from starlette.types import Scope

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""The methods that never change state (RFC 9110 9.2.1): no route of the API or the console
changes anything on them. Every other method is checked by
:class:`~durable_harness.http.guard.SameOrigin`."""


def allowed_methods(router: Router, scope: Scope) -> set[str]:
    """The methods the routes of ``router`` take at the request's path: empty when no route
    has that path. ``HEAD`` only where a route declares it (the API's ``GET`` routes answer a
    ``HEAD`` with 405, so an ``Allow`` naming it would promise what is refused). The
    ``Allow`` header of a 405 (RFC 9110 15.5.6), and the same-origin guard's test of whether
    a route would take the request
    (:class:`~durable_harness.http.guard.SameOrigin`)."""
    methods: set[str] = set()
    probe = {**scope, "type": "http"}
    for route in router.routes:
        match, _ = route.matches(probe)
        if match is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return methods
