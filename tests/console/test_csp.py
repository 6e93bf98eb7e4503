"""Every HTML answer of the host's app carries a Content-Security-Policy (issue 20): the
console's own, or, for any other HTML answer, ``guard.HtmlCsp``'s strict one; and there is no
``/docs`` page loading scripts from a CDN. A real uvicorn server, a real HTTP client."""

from __future__ import annotations

from pathlib import Path

import httpx
from fastapi.responses import HTMLResponse, JSONResponse

from durable_harness.console import console_router, is_console_path
from durable_harness.console.security import CSP
from durable_harness.host import HostOptions
from durable_harness.http import create_app
from durable_harness.http.guard import HTML_CSP

from .conftest import served


def test_every_html_answer_has_a_policy(tmp_path: Path) -> None:
    app = create_app(
        store=f"jsonl:{tmp_path / 'store'}",
        options=HostOptions(),
        own_auth=is_console_path,
        loopback_hosts_only=True,
    )
    app.include_router(console_router(lambda: app.state.manager))

    @app.get("/extra-page", include_in_schema=False)
    async def extra() -> HTMLResponse:  # an HTML answer that sets no policy itself
        return HTMLResponse("<p>hi</p>")

    @app.get("/extra-json", include_in_schema=False)
    async def extra_json() -> JSONResponse:
        return JSONResponse({})

    with served(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        page = c.get("/extra-page")
        assert page.headers["content-security-policy"] == HTML_CSP
        assert page.headers["x-content-type-options"] == "nosniff"
        assert c.get("/").headers["content-security-policy"] == CSP  # the console's own
        assert "content-security-policy" not in c.get("/extra-json").headers
        for path in ("/docs", "/redoc"):
            assert c.get(path).status_code == 404
