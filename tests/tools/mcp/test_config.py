"""The MCP config: the ``mcpServers`` shape editors use, checked, with typed errors naming the
file and the server; the replay rule from annotations and overrides."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from durable_harness.errors import McpConfigError
from durable_harness.tools.mcp import load_mcp_config, parse_mcp_config, replay_of, tool_name
from durable_harness.tools.mcp.config import HttpServer, StdioServer


def test_both_kinds_of_server_parse(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}},
                    "remote": {
                        "type": "http",
                        "url": "https://example.test/mcp",
                        "headers": {"Authorization": "Bearer x"},
                        "tools": {"deploy": {"replay": "never"}},
                    },
                }
            }
        )
    )
    config = load_mcp_config(path)
    time, remote = config.mcpServers["time"], config.mcpServers["remote"]
    assert isinstance(time, StdioServer) and time.args == ["mcp-server-time"]
    assert time.env == {"TZ": "UTC"}
    assert isinstance(remote, HttpServer) and remote.headers["Authorization"] == "Bearer x"
    assert remote.tools["deploy"].replay == "never"
    assert config.source == str(path)


@pytest.mark.parametrize(
    ("servers", "server", "says"),
    [
        ({"a": {"command": "x", "url": "http://h/mcp"}}, "a", "either 'command'"),
        ({"a": {"args": ["x"]}}, "a", "either 'command'"),
        ({"a": {"command": "x", "args": "not a list"}}, "a", "args"),
        ({"a": {"command": "x", "bogus": 1}}, "a", "bogus"),
        ({"a": {"url": "ftp://h/mcp"}}, "a", "url"),
        ({"a": {"command": "x", "tools": {"t": {"replay": "maybe"}}}}, "a", "tools.t.replay"),
        ({"a b": {"command": "x"}}, "a b", "letters, digits"),
        ({"a": ["command"]}, "a", "must be an object"),
    ],
)
def test_a_bad_server_is_a_typed_error_naming_file_and_server(
    tmp_path: Path, servers: dict[str, Any], server: str, says: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    with pytest.raises(McpConfigError) as err:
        load_mcp_config(path)
    assert err.value.code == "mcp_config_error"
    assert str(path) in err.value.message and repr(server) in err.value.message
    assert says in err.value.message
    assert err.value.details == {"path": str(path), "server": server}


@pytest.mark.parametrize("text", ["{not json", "[]", '{"mcpServers": []}'])
def test_a_bad_file_is_a_typed_error_naming_it(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(McpConfigError, match=r"bad\.json"):
        load_mcp_config(path)


def test_a_missing_file_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(McpConfigError, match="cannot read") as err:
        load_mcp_config(tmp_path / "absent.json")
    assert err.value.details["path"].endswith("absent.json")


@pytest.mark.parametrize(
    ("annotations", "override", "expected"),
    [
        ({"readOnlyHint": True}, None, ("safe", "annotation")),
        ({"readOnlyHint": False, "idempotentHint": True}, None, ("safe", "annotation")),
        ({"destructiveHint": True}, None, ("never", "annotation")),
        ({"readOnlyHint": False}, None, ("never", "annotation")),
        ({}, None, ("never", "annotation")),
        (None, None, ("never", "annotation")),
        ({"readOnlyHint": True}, "never", ("never", "override")),
        ({"destructiveHint": True}, "safe", ("safe", "override")),
    ],
)
def test_the_replay_class_comes_from_the_annotations_unless_overridden(
    annotations: dict[str, Any] | None, override: Any, expected: tuple[str, str]
) -> None:
    assert replay_of(annotations, override) == expected


def test_tool_names_are_namespaced_and_provider_safe() -> None:
    assert tool_name("time", "get_current_time") == "mcp__time__get_current_time"
    assert tool_name("fs", "read.file/v2") == "mcp__fs__read_file_v2"
    assert len(tool_name("s", "x" * 300)) == 128


def test_parse_names_its_source() -> None:
    with pytest.raises(McpConfigError, match="ACP session/new"):
        parse_mcp_config({"mcpServers": {"a": {}}}, "ACP session/new")
