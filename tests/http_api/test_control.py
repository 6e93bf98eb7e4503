"""Each live generation's own loopback control port (``serve --control-ports``;
``design/http.md``): bound at port 0, serving the session's ``/agent/send``, ``status``,
``abort`` and ``messages``; runtime state only, gone when the generation stops; where binding
is refused the session runs without one."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import httpx
import pytest

from durable_harness.host import HostOptions, SessionManager
from durable_harness.http.control import control_endpoint

from .util import run_records, wait_state


@pytest.mark.slow
def test_control_port_serves_the_session_until_its_generation_stops(
    start_server, script, workdir, tmp_path
):
    gate = tmp_path / "gate"
    provider = script([{"text": "held", "wait_for": str(gate)}, {"text": "after steer"}])
    server = start_server(None, "--control-ports", token="tok")
    with server.client() as c:
        sid = c.post("/sessions", json={"cwd": str(workdir), "provider": provider}).json()["id"]
        port = c.get(f"/sessions/{sid}/agent/status").json()["port"]
        assert isinstance(port, int) and port != int(server.url.rsplit(":", 1)[1])
        control = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=control, timeout=30) as anon:
            assert anon.get("/agent/status").json()["code"] == "unauthorized"
        auth = {"Authorization": "Bearer tok"}
        with httpx.Client(base_url=control, timeout=30, headers=auth) as ctl:
            status = ctl.get("/agent/status").json()
            assert (status["id"], status["state"], status["port"]) == (sid, "idle", port)
            sent = ctl.post("/agent/send", json={"message": "via the control port"})
            assert sent.status_code == 202, sent.text
            wait_state(c, sid, "running")
            again = ctl.post("/agent/send", json={"message": "second prompt"})
            assert (again.status_code, again.json()["code"]) == (409, "run_in_progress")
            assert (
                ctl.post("/agent/send", json={"message": "STEER", "mode": "steer"}).status_code
                == 202
            )
            gate.touch()
            wait_state(c, sid, "idle")
            texts = [
                p.get("text")
                for e in ctl.get("/agent/messages", params={"limit": 10}).json()["entries"]
                for p in e["message"]["content"]
            ]
            assert texts[0] == "via the control port" and "STEER" in texts
            refused = ctl.post("/agent/abort", json={})
            assert (refused.status_code, refused.json()["code"]) == (409, "no_open_run")
            assert ctl.get("/sessions").status_code == 404  # only the four agent routes

        assert c.post(f"/sessions/{sid}/close", json={}).json()["state"] == "closed"
        assert c.get(f"/sessions/{sid}/agent/status").json()["port"] is None
        try:
            httpx.get(f"{control}/agent/status", headers=auth, timeout=5)
            raise AssertionError("the control port still answers after close")
        except httpx.ConnectError:
            pass
        resumed = c.post(f"/sessions/{sid}/resume", json={}).json()
        assert resumed["generation"] == 2
        new_port = c.get(f"/sessions/{sid}/agent/status").json()["port"]
        assert isinstance(new_port, int)
        with httpx.Client(base_url=f"http://127.0.0.1:{new_port}", headers=auth) as ctl:
            assert ctl.get("/agent/status").json()["generation"] == 2
        # runtime state only: no record of the store names a port
        assert not any("port" in r for r in run_records(c, sid, "session_lifecycle"))


def test_a_refused_bind_leaves_the_session_running_without_a_port(tmp_path, workdir, caplog):
    script = tmp_path / "script.json"
    script.write_text('{"turns": [{"text": "fine"}]}')
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: bind() fails with EADDRNOTAVAIL
    options = HostOptions(provider=f"scripted:{script}", control=control_endpoint(host="192.0.2.1"))

    async def go() -> tuple[dict, dict]:
        async with SessionManager(f"jsonl:{tmp_path / 'store'}", options) as manager:
            rec = await manager.create(str(workdir))
            await manager.send(rec.id, "hello")
            with anyio.fail_after(30):
                while (await manager.status(rec.id))["state"] != "idle":
                    await anyio.sleep(0.02)
            status = await manager.status(rec.id)
            return rec.to_json(), status

    with caplog.at_level(logging.WARNING, logger="durable_harness.http"):
        rec, status = anyio.run(go)
    assert rec["state"] in ("idle", "running") and status["port"] is None
    assert status["state"] == "idle" and status["last_error"] is None
    warning = [r.getMessage() for r in caplog.records if "no control port" in r.getMessage()]
    assert warning and rec["id"] in warning[0] and "192.0.2.1" in warning[0]
    assert Path(rec["transcript"]).exists()
