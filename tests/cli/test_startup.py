"""A command imports what it runs (``design/cli.md``, "Start-up"): read-only commands, in a
fresh interpreter as a user starts them, load neither the harness, the providers' SDKs, the
host's server nor the entry models; and what they print is what they printed before."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from durable_harness.cli.main import COMMAND_SOURCES, COMMANDS
from durable_harness.session import Session
from durable_harness.storage import JsonlStore

NOT_FOR_READING = (
    "durable_harness.harness.harness",  # the run loop (anyio task groups, tenacity)
    "durable_harness.harness.turns",
    "tenacity",
    "durable_harness.models.entries",  # pydantic schemas of every entry and message
    "durable_harness.models.messages",
    "durable_harness.providers.scripted",
    "durable_harness.providers.anthropic",
    "durable_harness.providers.openai",
    "anthropic",
    "openai",
    "durable_harness.host.manager",
    "fastapi",
    "uvicorn",
    "durable_harness.cli.host_commands",
    "durable_harness.cli.config_file",
    "rich",  # what prints for a person: every command here prints JSON or plain lines
)

CHILD = """
import contextlib, io, json, sys
from durable_harness.cli.main import main
store, sid = sys.argv[1], sys.argv[2]
outputs = []
for argv in (
    ["sessions", "--store", store, "--json"],
    ["log", sid, "--store", store, "--json"],
    ["cost", sid, "--store", store, "--json"],
    ["recover", sid, "--store", store, "--json"],
    ["crash-points", "--json"],
):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = main(argv)
    outputs.append([argv[0], status, buf.getvalue()])
print(json.dumps({"outputs": outputs, "modules": sorted(sys.modules)}))
"""


@pytest.mark.slow
def test_read_only_commands_import_no_run_loop_provider_or_server(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path / "home")
    with Session(store.create_session(str(tmp_path))) as session:
        session.append({"type": "message", "message": {"role": "user", "content": "hello"}})
        sid = session.id
    spec = f"jsonl:{tmp_path / 'home'}"
    child = subprocess.run(
        [sys.executable, "-c", CHILD, spec, sid],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout)
    modules = set(result["modules"])
    assert not modules & set(NOT_FOR_READING), sorted(modules & set(NOT_FOR_READING))
    statuses = {name: status for name, status, _ in result["outputs"]}
    assert statuses == dict.fromkeys(statuses, 0), result["outputs"]
    printed = {name: text for name, _, text in result["outputs"]}
    assert [row["id"] for row in json.loads(printed["sessions"])] == [sid]
    assert json.loads(printed["recover"])["session_id"] == sid
    assert "after_tool_started" in json.loads(printed["crash-points"])


def test_every_command_is_listed_once_and_loads_as_named() -> None:
    """The lazy table names each command's module and handler: each loads, under its name."""
    assert list(COMMANDS) == [*COMMAND_SOURCES, "completion"]
    for name in COMMANDS:
        assert COMMANDS[name].name == name
    with pytest.raises(KeyError):
        COMMANDS["no-such-command"]
