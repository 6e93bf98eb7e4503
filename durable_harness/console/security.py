"""The console's request safety: signed double-submit CSRF tokens, the bearer-token login
cookie (a MAC of the token, never the token), response headers (``design/console.md``,
"Safety").
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from starlette.requests import Request
from starlette.responses import Response

from durable_harness.http.guard import token_matches

CSRF_COOKIE = "dh_console_csrf"
"""The cookie holding the browser's random CSRF id."""
AUTH_COOKIE = "dh_console_auth"
"""The cookie the login form sets (a MAC of the bearer token)."""
CSRF_FIELD = "csrf_token"
"""The hidden form field every console form carries."""

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
"""The Content-Security-Policy of every console response: no inline script or style."""

SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
"""Headers set on every console response."""


class Guard:
    """CSRF tokens and the bearer-token check of one console.

    Args:
        token: the bearer token the server requires, or ``None`` (a loopback bind: no login).
        secret: the CSRF MAC key; random per process when ``None`` (share it between workers).
    """

    def __init__(self, token: str | None, secret: bytes | None = None) -> None:
        self.token = token
        self.secret = secret if secret is not None else secrets.token_bytes(32)
        self._login_mac = (
            hmac.new(token.encode(), b"durable-harness console login", hashlib.sha256).hexdigest()
            if token is not None
            else None
        )

    # -- CSRF ---------------------------------------------------------------------------------

    def csrf_id(self, request: Request) -> tuple[str, bool]:
        """The browser's CSRF id and whether it is new (to be set as a cookie)."""
        value = request.cookies.get(CSRF_COOKIE, "")
        if 16 <= len(value) <= 128 and value.isalnum():
            return value, False
        return secrets.token_hex(24), True

    def csrf_token(self, csrf_id: str) -> str:
        """The form token for ``csrf_id``: hex HMAC-SHA256 under the secret."""
        return hmac.new(self.secret, csrf_id.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, request: Request, submitted: str | None) -> bool:
        """Whether a POST's ``csrf_token`` matches its CSRF cookie (constant time)."""
        value = request.cookies.get(CSRF_COOKIE, "")
        if not value or not submitted:
            return False
        return hmac.compare_digest(self.csrf_token(value).encode(), submitted.encode())

    def set_csrf_cookie(self, request: Request, response: Response, csrf_id: str) -> None:
        """Set the CSRF cookie (``HttpOnly``, ``SameSite=Strict``, ``Secure`` over https)."""
        _set_cookie(request, response, CSRF_COOKIE, csrf_id)

    # -- the bearer token ---------------------------------------------------------------------

    def authorized(self, request: Request) -> bool:
        """Whether the request may use the console: no token required, or a valid bearer
        header, or a valid login cookie."""
        if self.token is None:
            return True
        if token_matches(request.headers.get("authorization", ""), self.token):
            return True
        cookie = request.cookies.get(AUTH_COOKIE, "")
        assert self._login_mac is not None
        return bool(cookie) and hmac.compare_digest(cookie.encode(), self._login_mac.encode())

    def login(self, request: Request, response: Response, given: str) -> bool:
        """Check a token typed into the login form; when right, set the login cookie."""
        if self.token is None:
            return True
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return False
        assert self._login_mac is not None
        _set_cookie(request, response, AUTH_COOKIE, self._login_mac)
        return True


def _set_cookie(request: Request, response: Response, name: str, value: str) -> None:
    response.set_cookie(
        name,
        value,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
