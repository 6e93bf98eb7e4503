"""Which methods a path takes: the ``Allow`` header of a 405 and the same-origin guard's
test of whether a route would take a request, written once."""

from __future__ import annotations

from starlette.routing import Match, Router
from starlette.types import Scope

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""The methods that never change state (RFC 9110 9.2.1); others meet the same-origin rule."""


def allowed_methods(router: Router, scope: Scope) -> set[str]:
    """The methods the routes of ``router`` take at the request's path (empty: no route has
    it); ``HEAD`` only where a route declares it (a ``GET`` route answers ``HEAD`` with 405)."""
    methods: set[str] = set()
    probe = {**scope, "type": "http"}
    for route in router.routes:
        match, _ = route.matches(probe)
        if match is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return methods
