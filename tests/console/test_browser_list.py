"""The session list in a real browser (issue 24, "The console"): each session by its first
prompt, the one waiting for a decision first although another changed later, and the list
refreshing itself through server-sent events when a state changes (no reload: a marker set
on ``window`` survives). The decision that changes it is posted by a real HTTP client, as
another operator's browser would (``design/console.md``, "Live updates")."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from durable_harness.host import HostOptions

from .conftest import cli_run, console_app, crashed_cli_run, script, served, workdir
from .test_browser import browser, shot, wait_for  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.browser, pytest.mark.crash, pytest.mark.timeout(180)]


def test_the_list_shows_titles_waiting_first_and_refreshes_itself(
    browser: Any,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    from selenium.webdriver.common.by import By

    spec = f"jsonl:{tmp_path / 'store'}"
    out = Path(workdir(tmp_path)) / "effects.txt"
    doubtful = script(
        tmp_path,
        [
            {
                "text": "appending",
                "tool_calls": [{"name": "bash", "arguments": {"command": f"echo x >> {out}"}}],
            },
            {"text": "all done"},
        ],
    )
    waiting = crashed_cli_run(
        tmp_path, spec, doubtful, "after_tool_effect", prompt="Append a line to effects.txt"
    )
    plain = script(tmp_path, [{"text": "hello"}], name="plain.json")
    later = cli_run(tmp_path, spec, plain, "Say hello\nsecond line is not the title")
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with served(console_app(spec, HostOptions(provider=doubtful))) as base:
        browser.get(base + "/")
        rows = wait_for(
            lambda: (
                browser.find_elements(By.CSS_SELECTOR, "tr.session-row")[1:]
                and browser.find_elements(By.CSS_SELECTOR, "tr.session-row")
            ),
            "two rows",
        )
        # waiting first, although the other session changed later
        assert [r.get_attribute("data-session") for r in rows] == [waiting, later]
        first, second = rows
        assert first.find_element(By.CSS_SELECTOR, "a.session-link").text == (
            "Append a line to effects.txt"
        )
        assert second.find_element(By.CSS_SELECTOR, "a.session-link").text == "Say hello"
        assert "1 waiting" in first.text and "waiting" in first.get_attribute("class")
        assert "1 session waiting for a decision" in browser.find_element(By.ID, "live").text
        shot(browser, shots / "list.png")
        first.find_element(By.CSS_SELECTOR, "a.session-link").click()  # its page, by its title
        heading = wait_for(lambda: browser.find_element(By.CSS_SELECTOR, "h1.session-title"), "h1")
        assert heading.text == "Append a line to effects.txt"
        assert browser.title == "Append a line to effects.txt · durable-harness"
        assert browser.find_element(By.CSS_SELECTOR, "p.session-id").text == waiting
        browser.back()
        wait_for(lambda: browser.find_element(By.CSS_SELECTOR, "tr.session-row"), "the list")
        browser.execute_script("window.consoleTestMarker = 'same page';")

        # another operator decides, through a real HTTP client
        with httpx.Client(base_url=base, timeout=30) as other:
            page = other.get(f"/console/sessions/{waiting}").text
            token = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', page)
            key = re.search(r'name="call_key" value="([^"]+)"', page)
            assert token and key
            done = other.post(
                f"/console/sessions/{waiting}/decide",
                data={
                    "csrf_token": token.group(1),
                    "call_key": key.group(1),
                    "decision": "fail",
                    "confirmed": "yes",
                },
            )
            assert done.status_code == 303, done.text

        def refreshed() -> bool:
            row = browser.find_element(By.CSS_SELECTOR, f'tr[data-session="{waiting}"]')
            return row.get_attribute("data-state") != "suspended" and "waiting" not in row.text

        wait_for(refreshed, "the list to refresh itself")
        assert browser.execute_script("return window.consoleTestMarker;") == "same page"
        assert browser.find_element(By.ID, "live").get_attribute("data-refreshed")
        assert "waiting for a decision" not in browser.find_element(By.ID, "live").text
        logs = browser.get_log("browser")
        assert not [e for e in logs if "Content Security Policy" in str(e.get("message"))]
        browser.get("about:blank")  # closes the page's event stream before the server stops
    if os.environ.get("CONSOLE_SCREENSHOTS"):
        shutil.copy(
            shots / "list.png", Path(os.environ["CONSOLE_SCREENSHOTS"]) / "console-list.png"
        )
