"""Scenario code by import path (``"tools"``/``"provider": "module:function"``), resolved from
the current folder, with typed errors naming the spec; and the kit's default decision."""

from __future__ import annotations

import json
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_harness.crashtest.runner import default_decision
from durable_harness.crashtest.scenario import (
    load,
    scenario_provider,
    scenario_tools,
    tool_effects,
)
from durable_harness.errors import FormatError, ImportSpecError
from durable_harness.providers.scripted import ScriptedProvider
from durable_harness.recovery.decide import ToolCallPlan
from durable_harness.testing import ToolContext, run_crash, scenario

MODULE = """
from collections import Counter
from pydantic import BaseModel
from durable_harness.testing import Tool, ToolResult
from durable_harness.providers.scripted import ScriptedProvider


class A(BaseModel):
    n: int


class Count(Tool):
    name = "count"
    description = "count"
    Args = A

    async def execute(self, args, ctx):
        return ToolResult.text("ok")

    def count_effects(self, cwd):
        return {"k1": 1, "k2": 2}


class Other(Count):
    name = "other"

    def count_effects(self, cwd):
        return Counter({"k1": 3})


def tools():
    return [Count(), Other()]

def twice():
    return [Count(), Count()]

def not_a_list():
    return Count()

def provider():
    return ScriptedProvider([{"text": "mine"}])

def bad_provider():
    return "no"

value = 3
"""


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder holding ``shopmod.py``, made the current folder (as a user's project is)."""
    name = f"shopmod_{abs(hash(str(tmp_path)))}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    sys.modules.pop(name, None)


def _scenario(folder: Path, **keys: str) -> Path:
    mod = next(folder.glob("shopmod_*.py")).stem
    path = folder / "s.json"
    path.write_text(
        json.dumps({"name": "s", "steps": [], **{k: f"{mod}:{v}" for k, v in keys.items()}})
    )
    return path


def test_custom_tools_replace_the_builtins(here: Path) -> None:
    sc = load(_scenario(here, tools="tools", provider="provider"))
    tools = scenario_tools(sc)
    assert sorted(tools) == ["count", "other"]  # no built-in unless the function returns it
    provider = scenario_provider(sc)
    assert isinstance(provider, ScriptedProvider)
    assert tool_effects(tools, here) == {"count:k1": 1, "count:k2": 2, "other:k1": 3}
    assert str(here) in sys.path


def test_default_is_builtins_and_the_script(here: Path) -> None:
    sc = load(_scenario(here))
    assert "bash" in scenario_tools(sc)
    assert isinstance(scenario_provider(sc), ScriptedProvider)


@pytest.mark.parametrize(
    ("keys", "needle"),
    [
        ({"tools": "twice"}, "two tools named 'count'"),
        ({"tools": "not_a_list"}, "must return a list of Tool"),
        ({"tools": "missing"}, "has no function 'missing'"),
        ({"tools": "value"}, "has no function 'value'"),
        ({"provider": "bad_provider"}, "must return a Provider"),
    ],
)
def test_bad_tools_or_provider_is_a_typed_error(
    here: Path, keys: dict[str, str], needle: str
) -> None:
    sc = load(_scenario(here, **keys))
    with pytest.raises(ImportSpecError) as info:
        scenario_tools(sc) if "tools" in keys else scenario_provider(sc)
    assert needle in str(info.value)
    assert info.value.code == "import_spec"
    assert info.value.details["spec"].endswith(next(iter(keys.values())))


def test_unimportable_module_names_the_folder(here: Path) -> None:
    path = here / "s.json"
    path.write_text(json.dumps({"name": "s", "steps": [], "tools": "nowhere_mod:tools"}))
    with pytest.raises(ImportSpecError, match=r"cannot import 'nowhere_mod'.*from " + str(here)):
        scenario_tools(load(path))


@pytest.mark.parametrize("value", ["no colon", "a:b:c", 7, "mod:"])
def test_malformed_import_path_is_refused_at_load(tmp_path: Path, value: object) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"name": "s", "steps": [], "provider": value}))
    with pytest.raises(FormatError, match="'provider' must be an import path 'module:function'"):
        load(path)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ([], "must be a JSON object, got list"),
        ({"steps": "prompt"}, "'steps' must be a JSON array, got str"),
        ({"steps": ["prompt"]}, "step 0 must be a JSON object"),
        ({"turns": {"text": "hi"}}, "'turns' must be a JSON array, got dict"),
        ({"by_prompt": ["a"]}, "'by_prompt' must be a JSON object, got list"),
        ({"files": "a.txt"}, "'files' must be a JSON object, got str"),
    ],
)
def test_a_scenario_of_the_wrong_shape_is_a_format_error(
    tmp_path: Path, content: object, needle: str
) -> None:
    """Each names the file and the key (it was an AttributeError or TypeError)."""
    path = tmp_path / "s.json"
    path.write_text(json.dumps(content))
    with pytest.raises(FormatError, match=needle) as info:
        load(path)
    assert str(path) in str(info.value)


def _call(name: str, arguments: dict[str, object]) -> ToolCallPlan:
    return ToolCallPlan("c1", name, "in_doubt", "never", "await_decision", arguments=arguments)


def test_default_decision(tmp_path: Path) -> None:
    ctx = ToolContext(cwd=tmp_path, run_id="r", tool_call_id="c1", idempotency_key="r:k")
    bash = _call("bash", {"command": "echo t1 >> effects.log"})
    assert default_decision(bash, ctx) == {"decision": "retry"}
    (tmp_path / "effects.log").write_text("t1\n")
    assert default_decision(bash, ctx)["decision"] == "result"
    # a custom tool's effect cannot be seen: never turned into a second effect by default
    assert default_decision(_call("charge", {"cents": 5}), ctx)["decision"] == "fail"


def test_a_scenario_that_cannot_load_leaves_no_temporary_folder(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_crash``, the crash-free run under it and ``scenario(dict)`` create their folders
    only once the scenario's code loads, and a dict that fails removes the folder made for it
    (every failed ``crash-test`` left an empty ``dh-base-*`` folder in /tmp)."""
    temp = here / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    bad = {"name": "bad", "steps": [], "tools": "nowhere_mod:tools"}
    with pytest.raises(ImportSpecError):
        run_crash(scenario(bad, here / "scen"), "after_tool_started")
    with pytest.raises(FormatError):
        scenario({"name": "bad", "steps": "not a list"})
    assert sorted(p.name for p in temp.iterdir()) == []
