"""What the operator reads is what will run, in the console's HTML (issue 20,
``design/console.md``): every text node and tooltip of a page shows invisible and reordering
characters as marked ``\\u{HEX}`` tokens; attributes that are posted back keep the exact
string. httpx over ASGI against a SessionManager on a real JSONL store; the in-doubt session
comes from a real SIGKILL."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from durable_harness.console import console_router
from durable_harness.host import HostOptions, SessionManager

from .conftest import crashed_cli_run, script

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

RAW = ("\u202e", "\u200b", "\u2066")


class Text(HTMLParser):
    """A page's text nodes (SVG ``<title>`` and ``<text>`` included) and its attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.attributes: dict[str, list[str]] = {}

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            self.attributes.setdefault(name, []).append(value or "")


def parse(html: str) -> Text:
    page = Text()
    page.feed(html)
    return page


@pytest.mark.crash
async def test_pages_show_session_text_escaped_and_post_it_exact(tmp_path: Path) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    call_id = "call\u202e_1"
    provider = script(
        tmp_path,
        [
            {
                "text": "on it\u200b",
                "tool_calls": [
                    {"id": call_id, "name": "bash", "arguments": {"command": "echo \u202eok"}}
                ],
            },
            {"text": "done"},
        ],
    )
    sid = crashed_cli_run(tmp_path, spec, provider, "after_tool_started")
    odd = tmp_path / "dir\u2066name"
    odd.mkdir()
    async with SessionManager(spec, HostOptions(provider=provider)) as manager:
        made = await manager.create(str(odd))
        app = FastAPI()
        app.include_router(console_router(lambda: manager, token=None))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            listing = (await c.get("/")).text
            page = (await c.get(f"/console/sessions/{sid}")).text
        await manager.close(made.id)

    shown = parse(listing)
    text = "".join(shown.text)
    assert not [ch for ch in RAW if ch in text]
    assert "dir\\u{2066}name" in text
    assert '<span class="esc" title="U+2066 LEFT-TO-RIGHT ISOLATE">\\u{2066}</span>' in listing

    shown = parse(page)
    text = "".join(shown.text)
    assert not [ch for ch in RAW if ch in text]
    assert "echo \\u{202e}ok" in text  # the decision panel and the transcript
    assert "on it\\u{200b}" in text
    assert "bash call\\u{202e}_1 attempt 1" in text  # the timeline's tooltip (SVG <title>)
    assert "<title>bash call\\u{202e}_1" in page  # plain there: no markup inside SVG text
    # what the decision form posts back is the exact id
    assert call_id in shown.attributes["value"]
    assert call_id in shown.attributes["data-call"]
