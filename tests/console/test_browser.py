"""The console in a real browser: headless Chromium from the distribution's packages, driven
by Selenium through the distribution's chromedriver, against a real uvicorn server; the
session was left in doubt by a real SIGKILL (``design/console.md``).

Without Chromium the test skips with the reason; with ``CI=true`` a missing browser is an
error (``.ci/run`` installs ``chromium`` and ``chromium-driver``)."""

from __future__ import annotations

import io
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_harness.host import HostOptions
from durable_harness.storage import open_store

from .conftest import console_app, crashed_cli_run, script, served, workdir

pytestmark = [pytest.mark.browser, pytest.mark.crash, pytest.mark.timeout(180)]

# CONSOLE_CHROMIUM / CONSOLE_CHROMEDRIVER name other binaries (tests/console/test_browser_gate.py
# points them at nothing to check the skip and the CI error).
CHROMIUM = os.environ.get("CONSOLE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = (
    os.environ.get("CONSOLE_CHROMEDRIVER")
    or shutil.which("chromedriver")
    or "/usr/bin/chromedriver"
)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1400",
)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        reason = f"headless Chromium is not installed ({', '.join(missing)} missing)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason + "; CI must run the browser test (.ci/run installs it)")
        pytest.skip(reason + ": apt-get install chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(check: Callable[[], Any], what: str, limit: float = 30.0) -> Any:
    """Poll ``check`` until it returns something true; fail after ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while True:
        try:
            value = check()
        except Exception:  # the DOM is being swapped under us: look again
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def shot(driver: Any, path: Path) -> Path:
    """Save a screenshot and check it is not blank (more than one distinct colour)."""
    from PIL import Image

    assert driver.save_screenshot(str(path)), path
    with Image.open(io.BytesIO(path.read_bytes())) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is None or len(colours) > 1, f"{path} is blank"
    return path


def test_an_operator_decides_an_in_doubt_call_and_watches_the_run_finish(
    browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    spec = f"jsonl:{tmp_path / 'store'}"
    out = Path(workdir(tmp_path)) / "effects.txt"
    gate = tmp_path / "gate"
    provider = script(
        tmp_path,
        [
            {
                "text": "appending a line",
                "tool_calls": [{"name": "bash", "arguments": {"command": f"echo x >> {out}"}}],
            },
            {"text": "all done", "wait_for": str(gate)},
        ],
    )
    sid = crashed_cli_run(tmp_path, spec, provider, "after_tool_effect")
    assert out.read_text() == "x\n"
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with served(console_app(spec, HostOptions(provider=provider))) as base:
        # the list
        browser.get(base + "/")
        row = wait_for(
            lambda: browser.find_element(By.CSS_SELECTOR, f'tr[data-session="{sid}"]'), "the row"
        )
        assert row.get_attribute("data-state") == "suspended"
        assert "1 waiting" in row.text
        shot(browser, shots / "1-list.png")

        # the session, in doubt
        row.find_element(By.CSS_SELECTOR, "a.session-link").click()
        panel = wait_for(
            lambda: browser.find_element(By.CSS_SELECTOR, "article.decision"), "the panel"
        )
        assert panel.find_element(By.CSS_SELECTOR, ".tool-name").text == "bash"
        assert f"echo x >> {out}" in panel.find_element(By.CSS_SELECTOR, ".arguments").text
        # plain words, and buttons that say what they will do
        why = panel.find_element(By.CSS_SELECTOR, ".why").text
        assert re.fullmatch(
            r"started before the crash at \d\d:\d\d; no result was recorded; "
            r"this tool is not safe to run twice\.",
            why,
        ), why
        buttons = [b.text for b in panel.find_elements(By.CSS_SELECTOR, ".decide button")]
        assert buttons == ["Run bash again", "Mark bash failed", "Give bash a result"]
        assert "intent_unsettled" not in panel.text  # the code only under "details"
        assert browser.find_element(By.CSS_SELECTOR, "svg.timeline rect.gap.crash")
        assert browser.find_element(By.CSS_SELECTOR, "svg.timeline rect.tool.in-doubt")
        shot(browser, shots / "2-session-in-doubt.png")
        # a live update may swap the timeline between finding and shooting it: find it again
        wait_for(
            lambda: browser.find_element(By.CSS_SELECTOR, "svg.timeline").screenshot(
                str(shots / "timeline.png")
            ),
            "a screenshot of the timeline",
        )
        panel.screenshot(str(shots / "decision-panel.png"))

        # retry, confirmed
        panel.find_element(By.CSS_SELECTOR, "button.decide-retry").click()
        confirm = wait_for(
            lambda: browser.find_element(By.CSS_SELECTOR, "button.confirm-button"), "confirm"
        )
        summary = browser.find_element(By.CSS_SELECTOR, ".summary").text
        assert summary.startswith("Run bash again with the same arguments"), summary
        assert confirm.text == "Run bash again"
        # the confirmation repeats tool, exact command, working directory and session
        assert browser.find_element(By.CSS_SELECTOR, ".confirm-tool").text == "bash"
        assert browser.find_element(By.CSS_SELECTOR, ".confirm-command").text == (
            f"echo x >> {out}"
        )
        assert browser.find_element(By.CSS_SELECTOR, ".confirm-cwd").text == workdir(tmp_path)
        assert sid in browser.find_element(By.CSS_SELECTOR, ".confirm-session").text
        assert browser.find_element(By.CSS_SELECTOR, ".confirm-session").text.startswith("go")
        shot(browser, shots / "3-confirm.png")
        confirm.click()

        # back on the session page: the run is going again, held at its last turn
        wait_for(
            lambda: (
                browser.find_element(By.CSS_SELECTOR, ".session-state").get_attribute("data-state")
                in ("running", "idle")
            ),
            "the resumed session",
        )
        assert browser.current_url.endswith(f"/console/sessions/{sid}?notice=decided")
        assert "Decision recorded." in browser.find_element(By.ID, "live").text
        browser.execute_script("window.consoleTestMarker = 'same page';")
        gate.touch()

        def finished() -> bool:
            state = browser.find_element(By.CSS_SELECTOR, ".session-state")
            text = browser.find_element(By.CSS_SELECTOR, "section.transcript").text
            return state.get_attribute("data-state") == "idle" and "all done" in text

        wait_for(finished, "the run to finish on the page")
        # seen through live updates: the page was not reloaded, its live region was swapped
        assert browser.execute_script("return window.consoleTestMarker;") == "same page"
        assert browser.find_element(By.ID, "live").get_attribute("data-refreshed")
        assert not browser.find_elements(By.CSS_SELECTOR, "article.decision")
        # the run finished after the decision: the timeline says so, with the time
        note = wait_for(
            lambda: browser.find_element(By.CSS_SELECTOR, ".timeline-note").text, "the note"
        )
        assert re.search(r"completed \d\d:\d\d, after the decision at \d\d:\d\d", note), note
        assert "run completed" in browser.find_element(By.CSS_SELECTOR, "svg.timeline").text
        shot(browser, shots / "4-session-finished.png")
        # a live update may swap the timeline between finding and shooting it: find it again
        wait_for(
            lambda: browser.find_element(By.CSS_SELECTOR, "svg.timeline").screenshot(
                str(shots / "timeline-finished.png")
            ),
            "a screenshot of the timeline",
        )
        logs = browser.get_log("browser")
        assert not [e for e in logs if "Content Security Policy" in str(e.get("message"))]
        browser.get("about:blank")  # closes the page's event stream before the server stops

    assert out.read_text() == "x\nx\n"  # retried, as decided
    with open_store(spec).open_session(sid, write=False) as s:
        (finished_rec,) = s.records(None, types=("run_finished",))
    assert finished_rec["outcome"] == "completed"
    if os.environ.get("CONSOLE_SCREENSHOTS"):
        dest = Path(os.environ["CONSOLE_SCREENSHOTS"])
        for name in (
            "timeline.png",
            "timeline-finished.png",
            "decision-panel.png",
            "2-session-in-doubt.png",
            "3-confirm.png",
        ):
            shutil.copy(shots / name, dest / f"console-{name[2:] if name[1] == '-' else name}")


def test_the_panel_and_the_confirmation_show_invisible_characters_escaped(
    browser: Any, tmp_path: Path
) -> None:
    """What the operator reads is what will run (issue 20): a bash command holding U+202E
    and a zero-width space, left in doubt by a real SIGKILL, reads escaped on the decision
    panel, in the transcript and on the confirmation page; the form carries the exact text,
    so the decision stored is the one typed."""
    from selenium.webdriver.common.by import By

    spec = f"jsonl:{tmp_path / 'store'}"
    command = "echo \u202e#txt.exe >/dev/null\u200b"
    call_id = "call\u202e_1"
    result = "checked: nothing \u202eran"
    provider = script(
        tmp_path,
        [
            {
                "text": "cleaning",
                "tool_calls": [{"id": call_id, "name": "bash", "arguments": {"command": command}}],
            },
            {"text": "all done"},
        ],
    )
    sid = crashed_cli_run(tmp_path, spec, provider, "after_tool_started")
    with served(console_app(spec, HostOptions(provider=provider))) as base:
        browser.get(f"{base}/console/sessions/{sid}")
        panel = wait_for(
            lambda: browser.find_element(By.CSS_SELECTOR, "article.decision"), "the panel"
        )
        assert panel.get_attribute("data-call") == call_id  # attributes keep the exact id
        arguments = panel.find_element(By.CSS_SELECTOR, ".arguments")
        assert "echo \\u{202e}#txt.exe >/dev/null\\u{200b}" in arguments.text
        assert "\u202e" not in panel.text and "\u200b" not in panel.text
        assert panel.find_element(By.CSS_SELECTOR, ".call-id").text == "call\\u{202e}_1"
        marks = arguments.find_elements(By.CSS_SELECTOR, "span.esc")
        assert [m.get_attribute("title") for m in marks] == [
            "U+202E RIGHT-TO-LEFT OVERRIDE",
            "U+200B ZERO WIDTH SPACE",
        ]
        transcript = browser.find_element(By.CSS_SELECTOR, "section.transcript")
        assert "\\u{202e}" in transcript.text and "\u202e" not in transcript.text

        # give a result holding a U+202E: the confirmation shows it escaped
        browser.execute_script(
            "arguments[0].value = arguments[1];",
            panel.find_element(By.CSS_SELECTOR, "textarea[name=result]"),
            result,
        )
        panel.find_element(By.CSS_SELECTOR, "button.decide-result").click()
        confirm = wait_for(
            lambda: browser.find_element(By.CSS_SELECTOR, "button.confirm-button"), "confirm"
        )
        summary = browser.find_element(By.CSS_SELECTOR, ".summary").text
        assert "Tool call call\\u{202e}_1" in summary and "\u202e" not in summary
        shown = browser.find_element(By.CSS_SELECTOR, ".result-text").text
        assert shown == "checked: nothing \\u{202e}ran"
        hidden = browser.find_element(By.CSS_SELECTOR, "section.confirm input[name=result]")
        assert hidden.get_attribute("value") == result
        confirm.click()
        wait_for(lambda: "notice=decided" in browser.current_url, "the decision")
        browser.get("about:blank")  # closes the page's event stream before the server stops

    with open_store(spec).open_session(sid, write=False) as s:
        (decision,) = s.records(None, types=("decision",))
        (started,) = s.records(None, types=("tool_started",))
    assert decision["toolCallId"] == call_id
    assert decision["result"] == result
    assert started["arguments"]["command"] == command
