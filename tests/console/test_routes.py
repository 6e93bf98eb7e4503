"""The console's routes through a real HTTP client (httpx over ASGI) against a SessionManager
on a real JSONL store; in-doubt sessions come from a real SIGKILL (``design/console.md``)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI

from durable_harness.console import console_router, is_console_path
from durable_harness.crashtest import forkserver
from durable_harness.host import HostOptions, SessionManager
from durable_harness.host.read_model import parse_ts
from durable_harness.storage import open_store
from durable_harness.tools.processes import group_alive

from .conftest import crashed_cli_run, script, workdir

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


@asynccontextmanager
async def console(
    spec: str, options: HostOptions, token: str | None = None
) -> AsyncIterator[tuple[SessionManager, httpx.AsyncClient]]:
    async with SessionManager(spec, options) as manager:
        app = FastAPI()
        app.include_router(console_router(lambda: manager, token=token))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            yield manager, c


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', html)
    assert match, "the page has no CSRF field"
    return match.group(1)


async def idle(manager: SessionManager, sid: str, limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while (await manager.get(sid)).state != "idle":
        assert time.monotonic() < deadline, f"session {sid} did not become idle"
        await anyio.sleep(0.02)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def records(spec: str, sid: str, *types: str) -> list[dict[str, Any]]:
    with open_store(spec).open_session(sid, write=False) as s:
        return s.records(None, types=types or None)


class Forms(HTMLParser):
    """Every <form> of a page: its attributes and the names of its inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[dict[str, Any]] = []
        self.scripts: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "form":
            self.forms.append({**dict(attrs), "inputs": []})
        elif tag in ("input", "textarea", "button") and self.forms:
            self.forms[-1]["inputs"].append(dict(attrs).get("name"))
        elif tag == "script":
            self.scripts.append(dict(attrs))


def check_page(html: str) -> Forms:
    """Every form posts to a root-relative action with a CSRF field; no inline script."""
    parser = Forms()
    parser.feed(html)
    for form in parser.forms:
        assert form.get("method") == "post", form
        action = str(form.get("action"))
        assert action.startswith("/") and not action.startswith("//"), form
        assert "csrf_token" in form["inputs"], form
    for tag in parser.scripts:
        assert tag.get("src", "").startswith("/console/static/"), tag  # type: ignore[union-attr]
    assert " style=" not in html and "onclick" not in html.lower()
    return parser


def in_doubt_script(tmp_path: Path, out: Path, **last: Any) -> str:
    return script(
        tmp_path,
        [
            {
                "text": "running it",
                "tool_calls": [{"name": "bash", "arguments": {"command": f"echo x >> {out}"}}],
                "usage": {"cost": {"total": 0.125}},
            },
            {"text": "done", **last},
        ],
    )


@pytest.mark.crash
async def test_the_list_shows_state_cost_waiting_decisions_and_filters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    out = Path(workdir(tmp_path)) / "effects.txt"
    provider = in_doubt_script(tmp_path, out)
    crashed = crashed_cli_run(tmp_path, spec, provider, "after_tool_effect")
    other = tmp_path / "other"
    other.mkdir()
    priced = script(tmp_path, [{"text": "hi", "usage": {"cost": {"total": 0.75}}}], "p.json")
    async with console(spec, HostOptions(provider=priced, auto_resume="never")) as (m, c):
        live = await m.create(str(other))
        await m.send(live.id, "hello")
        await idle(m, live.id)
        page = await c.get("/")
        assert page.status_code == 200
        check_page(page.text)
        rows = dict(re.findall(r'data-session="([^"]+)" data-state="([^"]+)"', page.text))
        assert rows == {crashed: "suspended", live.id: "idle"}
        assert "1 waiting" in page.text and "$0.7500" in page.text and "$0.1250" in page.text
        assert page.headers["content-security-policy"].startswith("default-src 'none'")

        only = await c.get("/", params={"state": "suspended"})
        assert re.findall(r'data-session="([^"]+)"', only.text) == [crashed]
        by_dir = await c.get("/", params={"cwd": str(other)})
        assert re.findall(r'data-session="([^"]+)"', by_dir.text) == [live.id]
        none = await c.get("/", params={"cwd": str(other) + "-not"})
        assert "No sessions match the filter" in none.text

        monkeypatch.setattr("durable_harness.console.routes.PAGE_SIZE", 1)
        first = await c.get("/")
        second = await c.get("/", params={"page": 2})
        assert "page 1 of 2 (2 sessions)" in first.text and 'href="/?page=2"' in first.text
        seen = [re.findall(r'data-session="([^"]+)"', p.text) for p in (first, second)]
        assert sorted(seen[0] + seen[1]) == sorted([crashed, live.id])
        clamped = await c.get("/", params={"page": 99, "state": "idle"})
        assert re.findall(r'data-session="([^"]+)"', clamped.text) == [live.id]
        monkeypatch.undo()

        token = csrf_of(page.text)
        moved = await c.post(
            "/console/filter", data={"csrf_token": token, "state": "idle", "cwd": ""}
        )
        assert (moved.status_code, moved.headers["location"]) == (303, "/?state=idle")
        await m.close(live.id)


@pytest.mark.crash
async def test_an_in_doubt_call_is_shown_confirmed_and_decided(tmp_path: Path) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    out = Path(workdir(tmp_path)) / "effects.txt"
    provider = in_doubt_script(tmp_path, out)
    sid = crashed_cli_run(tmp_path, spec, provider, "after_tool_effect")
    async with console(spec, HostOptions(provider=provider)) as (m, c):
        page = await c.get(f"/console/sessions/{sid}")
        assert page.status_code == 200
        check_page(page.text)
        html = page.text
        assert '<svg class="timeline"' in html
        assert 'class="gap crash"' in html and 'class="tool in-doubt"' in html
        (call,) = m.plan(sid).open_calls()  # type: ignore[union-attr]
        panel = html.split('<section class="decisions">')[1].split("</section>")[0]
        assert call.tool_call_id in panel and ">bash<" in panel
        assert f"echo x &gt;&gt; {out}" in panel  # the arguments, escaped
        (started,) = records(spec, sid, "tool_started")
        assert started["idempotencyKey"] in panel
        assert "no reconcile hook" in panel and "process group" in panel
        # plain words, each button saying what it does (design/console.md)
        hhmm = time.strftime("%H:%M", time.localtime(parse_ts(started["timestamp"])))
        assert (
            f"started before the crash at {hhmm}; no result was recorded; "
            "this tool is not safe to run twice"
        ) in panel
        assert ">Run bash again<" in panel and ">Mark bash failed<" in panel
        assert ">Give bash a result<" in panel
        token = csrf_of(html)

        form = {"csrf_token": token, "call_key": call.call_key, "tool_call_id": call.tool_call_id}
        ask = await c.post(
            f"/console/sessions/{sid}/decide", data={**form, "decision": "result", "result": "ok"}
        )
        assert ask.status_code == 200
        check_page(ask.text)
        confirm_page = ask.text.split('<section class="confirm">')[1]
        assert (
            '<button type="submit" class="confirm-button danger">Give bash a result</button>'
            in (confirm_page)
        )
        assert '<dd class="confirm-tool">bash</dd>' in confirm_page
        assert f'<pre class="confirm-command">echo x &gt;&gt; {out}</pre>' in confirm_page
        assert f'<dd class="confirm-cwd">{workdir(tmp_path)}</dd>' in confirm_page
        assert sid in confirm_page.split('class="confirm-session"')[1]
        assert records(spec, sid, "decision") == []  # the confirmation page changed nothing
        assert (await m.get(sid)).state == "suspended"

        done = await c.post(
            f"/console/sessions/{sid}/decide",
            data={**form, "decision": "result", "result": "it ran once", "confirmed": "yes"},
        )
        assert done.status_code == 303
        assert done.headers["location"] == f"/console/sessions/{sid}?notice=decided"
        await idle(m, sid)
        after = await c.get(done.headers["location"])
        assert "Decision recorded." in after.text and 'class="decisions"' not in after.text
        assert "it ran once" in after.text and ">done<" in after.text.replace("\n", "")
        await m.close(sid)
    assert out.read_text() == "x\n"  # the replay-never call did not run again
    (finished,) = records(spec, sid, "run_finished")
    assert finished["outcome"] == "completed"


@pytest.mark.slow
async def test_an_empty_result_decision_and_a_bad_lane_are_refused(tmp_path: Path) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    out = Path(workdir(tmp_path)) / "effects.txt"
    provider = in_doubt_script(tmp_path, out)
    sid = crashed_cli_run(tmp_path, spec, provider, "after_tool_effect")
    async with console(spec, HostOptions(provider=provider)) as (m, c):
        token = csrf_of((await c.get(f"/console/sessions/{sid}")).text)
        (call,) = m.plan(sid).open_calls()  # type: ignore[union-attr]
        form = {"csrf_token": token, "call_key": call.call_key, "tool_call_id": call.tool_call_id}
        for text in ("", "   "):
            r = await c.post(
                f"/console/sessions/{sid}/decide",
                data={**form, "decision": "result", "result": text, "confirmed": "yes"},
            )
            assert r.status_code == 400 and "invalid_request" in r.text, r.text[:500]
            assert "non-empty" in r.text
        assert records(spec, sid, "decision") == []
        assert (await m.get(sid)).state == "suspended"
        for lane in ("../x", "<img>"):
            r = await c.post(
                f"/console/sessions/{sid}/send",
                data={"csrf_token": token, "message": "hi", "lane": lane},
            )
            assert r.status_code == 400 and "not a lane name" in r.text, lane


async def test_html_in_a_prompt_is_escaped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    provider = script(tmp_path, [{"text": "<b>bold</b> & <i>more</i>"}])
    evil = '<script>alert(1)</script><img src=x onerror="alert(2)">'
    async with console(spec, HostOptions(provider=provider)) as (m, c):
        rec = await m.create(workdir(tmp_path))
        page = await c.get(f"/console/sessions/{rec.id}")
        sent = await c.post(
            f"/console/sessions/{rec.id}/send",
            data={"csrf_token": csrf_of(page.text), "message": evil, "mode": "prompt"},
        )
        assert sent.status_code == 303
        await idle(m, rec.id)
        html = (await c.get(f"/console/sessions/{rec.id}")).text
        check_page(html)
        assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=" in html
        assert "<script>alert" not in html and "<img" not in html
        assert "&lt;b&gt;bold&lt;/b&gt; &amp; &lt;i&gt;" in html and "<b>" not in html
        (started,) = records(spec, rec.id, "run_started")
        assert started["prompt"]["content"][0]["text"] == evil  # stored as typed
        total = len(records(spec, rec.id))
        monkeypatch.setattr("durable_harness.console.routes.TIMELINE_RECORDS", 2)
        cut = (await c.get(f"/console/sessions/{rec.id}")).text
        assert f"The {total - 2} oldest records of this session are not drawn" in cut
        assert '<svg class="timeline"' in cut
        await m.close(rec.id)


@pytest.mark.crash
async def test_a_forged_form_is_refused_and_nothing_changes_on_disk(tmp_path: Path) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    out = Path(workdir(tmp_path)) / "effects.txt"
    provider = in_doubt_script(tmp_path, out)
    suspended = crashed_cli_run(tmp_path, spec, provider, "after_tool_effect")
    async with console(spec, HostOptions(provider=provider)) as (m, c):
        live = await m.create(workdir(tmp_path))
        page = await c.get(f"/console/sessions/{suspended}")
        good = csrf_of(page.text)
        (call,) = m.plan(suspended).open_calls()  # type: ignore[union-attr]
        before = snapshot(tmp_path / "store")
        actions: list[tuple[str, dict[str, str]]] = [
            (f"{live.id}/send", {"message": "hi", "mode": "prompt"}),
            (f"{live.id}/abort", {"lane": "main"}),
            (f"{live.id}/close", {"confirmed": "yes"}),
            (f"{suspended}/resume", {}),
            (f"{suspended}/close", {"confirmed": "yes"}),
            (
                f"{suspended}/decide",
                {"call_key": call.call_key, "decision": "retry", "confirmed": "yes"},
            ),
        ]
        forged_tokens: list[dict[str, str]] = [{}, {"csrf_token": ""}, {"csrf_token": "0" * 64}]
        for path, fields in actions:
            for forged in forged_tokens:
                r = await c.post(f"/console/sessions/{path}", data={**fields, **forged})
                assert r.status_code == 403, (path, forged)
                assert "CSRF" in r.text
            # a valid token without its cookie (another browser's page) is refused too
            async with httpx.AsyncClient(
                transport=c._transport,
                base_url="http://testserver",
                cookies={"dh_console_csrf": "f" * 48},
            ) as other:
                r = await other.post(
                    f"/console/sessions/{path}", data={**fields, "csrf_token": good}
                )
            assert r.status_code == 403, path
        assert snapshot(tmp_path / "store") == before
        assert (await m.get(live.id)).state == "idle"
        assert (await m.get(suspended)).state == "suspended"
        assert out.read_text() == "x\n"
        await m.close(live.id)


async def test_the_bearer_token_guards_every_route(tmp_path: Path) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    provider = script(tmp_path, [{"text": "hello"}])
    async with console(spec, HostOptions(provider=provider), token="s3cret-token") as (m, c):
        rec = await m.create(workdir(tmp_path))
        page = await c.get("/")
        assert page.status_code == 303
        assert page.headers["location"] == "/console/login?next=%2F"
        assert (await c.get(f"/console/sessions/{rec.id}/live")).status_code == 401
        assert (await c.get(f"/console/sessions/{rec.id}/events")).status_code == 401
        login = await c.get("/console/login", params={"next": f"/console/sessions/{rec.id}"})
        token = csrf_of(login.text)
        refused = await c.post(
            f"/console/sessions/{rec.id}/send",
            data={"csrf_token": token, "message": "hi", "mode": "prompt"},
        )
        assert refused.status_code == 401
        wrong = await c.post(
            "/console/login", data={"csrf_token": token, "token": "guess", "next": "/"}
        )
        assert wrong.status_code == 401 and "not right" in wrong.text
        assert "dh_console_auth" not in c.cookies
        outside = await c.post(
            "/console/login",
            data={"csrf_token": token, "token": "s3cret-token", "next": "https://evil.example/"},
        )
        assert (outside.status_code, outside.headers["location"]) == (303, "/")
        assert "s3cret-token" not in str(c.cookies.get("dh_console_auth"))
        assert (await c.get("/")).status_code == 200
        c.cookies.delete("dh_console_auth")
        header = {"Authorization": "Bearer s3cret-token"}
        assert (await c.get("/", headers=header)).status_code == 200
        bad = {"Authorization": "Bearer s3cret-tokeN"}
        assert (await c.get("/", headers=bad)).status_code == 303
        sent = await c.post(
            f"/console/sessions/{rec.id}/send",
            data={"csrf_token": token, "message": "hi", "mode": "prompt"},
            headers=header,
        )
        assert sent.status_code == 303
        await idle(m, rec.id)
        await m.close(rec.id)
    assert len(records(spec, rec.id, "run_started")) == 1


async def test_refusals_are_pages_with_the_right_status(tmp_path: Path) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    gate = tmp_path / "gate"
    provider = script(tmp_path, [{"text": "held", "wait_for": str(gate)}])
    async with console(spec, HostOptions(provider=provider, max_message_bytes=64)) as (m, c):
        rec = await m.create(workdir(tmp_path))
        assert (await c.get("/console/sessions/" + "0" * 36)).status_code == 404
        assert (await c.get("/console/sessions/bad%20id")).status_code == 400
        assert (await c.get("/console/static/../routes.py")).status_code == 404
        assert (await c.get("/console/sessions/" + "0" * 36 + "/events")).status_code == 404
        assert (await c.get("/console/sessions/" + "0" * 36 + "/live")).status_code == 404
        token = csrf_of((await c.get("/")).text)
        url = f"/console/sessions/{rec.id}"
        for message, mode, status in (
            ("", "prompt", 400),
            ("x" * 65, "prompt", 413),
            ("hi", "shout", 400),
        ):
            r = await c.post(
                url + "/send", data={"csrf_token": token, "message": message, "mode": mode}
            )
            assert r.status_code == status, (message, mode)
        first = await c.post(
            url + "/send", data={"csrf_token": token, "message": "go", "mode": "prompt"}
        )
        assert first.status_code == 303
        again = await c.post(
            url + "/send", data={"csrf_token": token, "message": "again", "mode": "prompt"}
        )
        assert again.status_code == 409 and "run_in_progress" in again.text
        steer = await c.post(
            url + "/send", data={"csrf_token": token, "message": "also this", "mode": "steer"}
        )
        assert steer.status_code == 303
        assert [r["queue"] for r in records(spec, rec.id, "queue_enqueued")] == ["steer"]
        aborted = await c.post(url + "/abort", data={"csrf_token": token, "lane": "main"})
        assert aborted.status_code == 303
        gate.touch()
        await idle(m, rec.id)
        closing = await c.post(url + "/close", data={"csrf_token": token})
        assert closing.status_code == 200 and "Confirm close" in closing.text
        closed = await c.post(url + "/close", data={"csrf_token": token, "confirmed": "yes"})
        assert closed.status_code == 303 and (await m.get(rec.id)).state == "closed"
        r = await c.post(url + "/send", data={"csrf_token": token, "message": "hi"})
        assert r.status_code == 409 and "session_not_live" in r.text
        resumed = await c.post(url + "/resume", data={"csrf_token": token})
        assert resumed.status_code == 303 and (await m.get(rec.id)).generation == 2
        await m.close(rec.id)
    (finished,) = records(spec, rec.id, "run_finished")
    assert finished["outcome"] == "aborted"


@pytest.mark.crash
async def test_a_call_whose_process_group_still_runs_says_so(tmp_path: Path) -> None:
    """The CLI is SIGKILLed from outside while its bash call runs: the call's process group
    outlives it; the host kills it before it shows the plan (issue 20), so the panel shows the
    call in doubt with no group left running, and the log has the kill."""
    spec = f"jsonl:{tmp_path / 'store'}"
    command = "sleep 60 && echo slept"
    provider = script(
        tmp_path,
        [{"text": "", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]}],
    )
    argv = ["run", "go", "--store", spec, "--provider", provider, "--cwd", workdir(tmp_path)]
    argv += ["--quiet"]
    child: subprocess.Popen[bytes] | forkserver.Spawned
    if forkserver.available():  # a process of its own, forked from the warm fork server
        child = forkserver.shared().spawn(
            argv,
            env=dict(os.environ),
            cwd=os.getcwd(),
            stdout=os.devnull,
            stderr=os.devnull,
            timeout=120,
        )
    else:
        child = subprocess.Popen(
            [sys.executable, "-m", "durable_harness", *argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    pgid: int | None = None
    try:
        deadline = time.monotonic() + 30
        while pgid is None:
            assert time.monotonic() < deadline and child.poll() is None, "no tool process"
            sessions = open_store(spec).list_sessions() if (tmp_path / "store").exists() else []
            if sessions:
                found = records(spec, sessions[0].id, "tool_process")
                pgid = found[0]["pgid"] if found else None
            time.sleep(0.02)
        child.kill()
        assert child.wait(30) == -signal.SIGKILL
        (info,) = open_store(spec).list_sessions()
        async with console(spec, HostOptions(provider=provider)) as (_m, c):
            html = (await c.get(f"/console/sessions/{info.id}")).text
            panel = html.split('<section class="decisions">')[1].split("</section>")[0]
            assert "still running" not in panel
            assert "sleep 60 &amp;&amp; echo slept" in panel
            assert not group_alive(pgid)
            (killed,) = records(spec, info.id, "tool_process_killed")
            assert (killed["pgid"], killed["by"]) == (pgid, "reconcile")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


def test_the_console_paths_are_known_to_the_host() -> None:
    for path in ("/", "/console/login", "/console/sessions/x/events", "/console/static/a"):
        assert is_console_path(path)
    for path in ("/sessions", "/metrics", "/openapi.json", "/consoles", "//console/x"):
        assert not is_console_path(path)


async def test_the_console_shows_the_cost_the_cli_computes_unknown_never_zero(
    tmp_path: Path,
) -> None:
    """Issue 20: the console's cost is ``cost_summary``'s (the CLI's): a model without a
    price shows ``unknown``, not $0; the host's ``price`` supplies it."""
    from durable_harness.harness.report import cost_report, format_cost

    spec = f"jsonl:{tmp_path / 'store'}"
    turn = {"text": "hi", "usage": {"input": 1000, "output": 100}}  # no cost in the script
    provider = script(tmp_path, [turn, turn], "unpriced.json")
    sids = {}
    for name, price in (("unknown", None), ("priced", {"input": 2.0, "output": 10.0})):
        where = tmp_path / name
        where.mkdir()
        async with console(spec, HostOptions(provider=provider, price=price)) as (m, c):
            rec = await m.create(str(where))
            await m.send(rec.id, "hello")
            await idle(m, rec.id)
            page = await c.get(f"/console/sessions/{rec.id}")
            with open_store(spec).open_session(rec.id, write=False) as s:
                expected = format_cost(cost_report(s)["total"], 4)
            assert f'class="cost">{expected}<' in page.text, page.text
            sids[name] = (rec.id, expected)
            await m.close(rec.id)
    assert sids["unknown"][1] == "unknown"
    assert sids["priced"][1] == "$0.0030"
    async with console(spec, HostOptions(provider=provider)) as (m, c):
        listing = (await c.get("/")).text
    assert '<td class="cost">unknown</td>' in listing and '<td class="cost">$0.0030</td>' in listing


@pytest.mark.crash
async def test_a_group_on_another_machine_is_shown_and_retried_only_when_forced(
    tmp_path: Path,
) -> None:
    """A host whose bash group is recorded as another machine's is SIGKILLed: the panel names
    that host, a plain retry is refused (``tool_process_elsewhere``) and "Retry anyway"
    (``retry!``) re-runs the call."""
    child_py = Path(__file__).parents[1] / "host" / "group_child.py"
    work = tmp_path / "work"
    work.mkdir()
    spec = f"sqlite:{tmp_path}/host.db"
    command = "echo x >> effect; while [ ! -e gate ]; do sleep 0.02; done; echo y >> effect"
    turns = [
        {"text": "Long job.", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
        {"text": "Done."},
    ]
    (tmp_path / "script.json").write_text(json.dumps({"turns": turns}))
    argv = [sys.executable, str(child_py), "hold-elsewhere", spec, str(work)]
    child = subprocess.Popen([*argv, str(tmp_path / "script.json")], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not ((work / "effect").exists() and (work / "effect").read_text()):
            assert time.monotonic() < deadline and child.poll() is None, "no effect"
            time.sleep(0.02)
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(30)
        sid = (work / "id").read_text()
        options = HostOptions(provider=f"scripted:{tmp_path / 'script.json'}")
        async with console(spec, options) as (m, c):
            html = (await c.get(f"/console/sessions/{sid}")).text
            panel = html.split('<section class="decisions">')[1].split("</section>")[0]
            assert "other-machine" in panel and "Run bash again anyway" in panel
            (call,) = m.plan(sid).open_calls()  # type: ignore[union-attr]
            form = {
                "csrf_token": csrf_of(html),
                "call_key": call.call_key,
                "tool_call_id": call.tool_call_id,
                "confirmed": "yes",
            }
            refused = await c.post(
                f"/console/sessions/{sid}/decide", data={**form, "decision": "retry"}
            )
            assert "tool_process_elsewhere" in refused.text
            assert records(spec, sid, "decision") == []
            (work / "gate").touch()
            done = await c.post(
                f"/console/sessions/{sid}/decide", data={**form, "decision": "retry!"}
            )
            assert done.status_code == 303, done.text
            await idle(m, sid)
            (decision,) = records(spec, sid, "decision")
            assert decision["force"] is True
    finally:
        (work / "gate").touch()
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(30)


async def test_the_operator_stops_a_running_tool_from_the_console_without_deciding(
    tmp_path: Path,
) -> None:
    """Issue 20: a pending call whose process group runs is shown with "Stop it"; the kill
    (through the host's verb, as ``POST /sessions/{id}/agent/kill``) is a
    ``tool_process_killed`` record by the operator, decides nothing, and the effect never
    lands."""
    spec = f"jsonl:{tmp_path / 'store'}"
    where = Path(workdir(tmp_path))
    command = "echo started > started; sleep 60; echo landed > landed"
    turns = [
        {"text": "Long job.", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
        {"text": "Stopped."},
    ]
    provider = script(tmp_path, turns, "long.json")
    async with console(spec, HostOptions(provider=provider)) as (m, c):
        rec = await m.create(str(where))
        await m.send(rec.id, "go")
        deadline = time.monotonic() + 30
        while not records(spec, rec.id, "tool_process"):
            assert time.monotonic() < deadline, "no tool_process record"
            await anyio.sleep(0.02)
        (proc,) = records(spec, rec.id, "tool_process")
        html = (await c.get(f"/console/sessions/{rec.id}")).text
        check_page(html)
        assert 'class="kill-button"' in html and "its process is still running" in html
        form = {"csrf_token": csrf_of(html), "tool_call_id": proc["toolCallId"]}
        forged = await c.post(f"/console/sessions/{rec.id}/kill", data={**form, "csrf_token": "0"})
        assert forged.status_code == 403 and group_alive(proc["pgid"], proc["startTime"])
        done = await c.post(f"/console/sessions/{rec.id}/kill", data=form)
        assert done.status_code == 303, done.text
        assert done.headers["location"].endswith("?notice=killed")
        assert not group_alive(proc["pgid"], proc["startTime"])
        (killed,) = records(spec, rec.id, "tool_process_killed")
        assert (killed["by"], killed["pgid"]) == ("operator", proc["pgid"])
        assert records(spec, rec.id, "decision") == []
        await idle(m, rec.id)
        after = (await c.get(f"/console/sessions/{rec.id}")).text
        assert 'class="kill-button"' not in after
        await m.close(rec.id)
    assert not (where / "landed").exists()
