"""A page from another origin cannot change a session (issue 20, "CSRF"): a real headless
Chromium loads a page from a second local server (another port: another origin, the same
site) that fires every request a browser sends without a CORS preflight at a real tokenless
API server: ``fetch`` with ``mode: "no-cors"``, ``navigator.sendBeacon`` and a
``text/plain`` form POST, plus a CORS ``fetch`` with a JSON body (which needs a preflight).
The API server sees the requests arrive and the session is neither closed nor aborted: its
files are unchanged (``design/http.md``, "Cross-site requests")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from durable_harness.console import console_router, is_console_path
from durable_harness.host import HostOptions
from durable_harness.http import create_app

from .conftest import script, served, snapshot_store, workdir
from .test_browser import browser, wait_for  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

PAGE = """<!doctype html><title>evil</title>
<iframe name="sink"></iframe>
<form id="f" method="POST" enctype="text/plain" target="sink" action="{api}/sessions/{sid}/close">
<input name='{{"x": "' value='"}}'></form>
<script>
const api = "{api}", sid = "{sid}", out = [];
async function go() {{
  out.push("beacon:" + navigator.sendBeacon(api + "/sessions/" + sid + "/agent/abort", "{{}}"));
  out.push("beacon:" + navigator.sendBeacon(api + "/sessions/" + sid + "/close",
    new Blob(["{{}}"], {{type: "text/plain"}})));
  for (const path of ["/close", "/agent/abort"]) {{
    try {{
      const r = await fetch(api + "/sessions/" + sid + path, {{method: "POST", mode: "no-cors",
        body: "{{}}", headers: {{"Content-Type": "application/json"}}}});
      out.push("no-cors:" + r.type);
    }} catch (e) {{ out.push("no-cors-error:" + e.name); }}
  }}
  try {{
    await fetch(api + "/sessions/" + sid + "/close", {{method: "POST", body: "{{}}",
      headers: {{"Content-Type": "application/json"}}}});
    out.push("cors:answered");
  }} catch (e) {{ out.push("cors-error:" + e.name); }}
  const frame = document.querySelector("iframe");
  frame.addEventListener("load", () => {{ out.push("form:loaded"); document.title = "done"; }});
  document.getElementById("f").submit();
}}
go();
window.results = out;
</script>"""


def test_a_page_from_another_origin_cannot_close_or_abort_a_session(
    browser: Any,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    options = HostOptions(provider=script(tmp_path, [{"text": "hi"}]))
    api = create_app(
        store=spec, options=options, own_auth=is_console_path, loopback_hosts_only=True
    )
    api.include_router(console_router(lambda: api.state.manager))
    arrived: list[tuple[str, str, str]] = []

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            origin = headers.get(b"origin", b"").decode()
            arrived.append((scope["method"], scope["path"], origin))
        await api(scope, receive, send)

    evil = FastAPI()
    with (
        served(recording) as api_url,  # type: ignore[arg-type]
        httpx.Client(base_url=api_url, timeout=30) as c,
    ):
        sid = c.post("/sessions", json={"cwd": workdir(tmp_path)}).json()["id"]
        wait_for(lambda: c.get(f"/sessions/{sid}").json()["state"] == "idle", "an idle session")

        @evil.get("/")
        async def page() -> HTMLResponse:
            return HTMLResponse(PAGE.format(api=api_url, sid=sid))

        before = snapshot_store(tmp_path / "store")
        with served(evil) as evil_url:
            assert evil_url != api_url
            browser.get(evil_url + "/")
            wait_for(lambda: browser.title == "done", "the page's requests", 60)
            results = browser.execute_script("return window.results")
            browser.get("about:blank")
        assert "no-cors:opaque" in results, results  # answered (opaquely): it arrived
        assert "cors-error:TypeError" in results, results  # the preflight got no CORS
        assert "form:loaded" in results, results
        foreign = [(m, p) for m, p, o in arrived if o == evil_url]
        for path in (f"/sessions/{sid}/close", f"/sessions/{sid}/agent/abort"):
            assert ("POST", path) in foreign, arrived
        assert snapshot_store(tmp_path / "store") == before
        assert c.get(f"/sessions/{sid}").json()["state"] == "idle"
        log = c.get(f"/sessions/{sid}/agent/log").json()["records"]
        assert not [r for r in log if r["type"] == "abort_requested"], log
        # the same request from the server's own origin does what it says
        own = c.post(f"/sessions/{sid}/close", json={}, headers={"Origin": api_url})
        assert own.status_code == 200 and own.json()["state"] == "closed"
