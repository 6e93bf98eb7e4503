"""``durable-harness.toml`` and ``--verbose`` (issue 24): the flag, then the environment, then
the working directory's file, then the home's, then the default; each command says where its
settings came from."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from durable_harness.cli.settings import apply_settings
from durable_harness.storage import open_store

from .conftest import Result

Cli = Callable[..., Result]


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    monkeypatch.chdir(path)
    (path / "s.json").write_text(json.dumps({"turns": [{"text": "ok"}]}))
    return path


def _sources(res: Result) -> dict[str, str]:
    out = {}
    for ln in res.err.splitlines():
        if " = " in ln and "(from " in ln:
            name = ln.split("durable-harness: ", 1)[1].split(" = ", 1)[0]
            out[name] = ln.rsplit("(from ", 1)[1].rstrip(")")
    return out


def test_the_working_directory_s_file_names_the_store_provider_and_durability(
    cli: Cli, work: Path
) -> None:
    db = work / "agent.db"
    (work / "durable-harness.toml").write_text(
        f'store = "sqlite:{db}"\nprovider = "scripted:s.json"\ndurability = "batch"\n'
    )
    res = cli("run", "hi", "--verbose")
    assert res.code == 0, res.err
    config = str(work / "durable-harness.toml")
    assert _sources(res) == {
        "store": config,
        "provider": config,
        "durability": config,
        "mcp": "default",
    }
    [info] = open_store(f"sqlite:{db}").list_sessions()
    assert open_store().list_sessions() == []  # not the default JSONL store
    # what the handler is given (durability is a runtime setting: no record carries it)
    args = argparse.Namespace(command="run", store=None, provider=None, durability=None)
    apply_settings(args)
    assert (args.store, args.provider, args.durability) == (
        f"sqlite:{db}",
        "scripted:s.json",
        "batch",
    )
    listed = cli("sessions", "--json")
    assert [r["id"] for r in listed.json()] == [info.id]


def test_flag_beats_environment_beats_file_beats_home(
    cli: Cli, work: Path, home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "durable-harness.toml").write_text(f'store = "jsonl:{tmp_path / "from-home"}"\n')
    res = cli("sessions", "--verbose")
    assert _sources(res)["store"] == str(home / "durable-harness.toml")
    (work / "durable-harness.toml").write_text(f'store = "jsonl:{tmp_path / "from-cwd"}"\n')
    assert _sources(cli("sessions", "--verbose"))["store"] == str(work / "durable-harness.toml")
    monkeypatch.setenv("DURABLE_HARNESS_STORE", f"jsonl:{tmp_path / 'from-env'}")
    assert _sources(cli("sessions", "--verbose"))["store"] == "$DURABLE_HARNESS_STORE"
    flagged = cli("sessions", "--verbose", "--store", f"jsonl:{tmp_path / 'from-flag'}")
    assert _sources(flagged)["store"] == "--store"
    # and the store really used is the one named: a run lands in the environment's store
    assert cli("run", "hi", "--provider", "scripted:s.json").code == 0
    assert len(open_store(f"jsonl:{tmp_path / 'from-env'}").list_sessions()) == 1
    assert open_store(f"jsonl:{tmp_path / 'from-cwd'}", create=True).list_sessions() == []


def test_a_resumed_run_keeps_its_recorded_provider_over_the_file_s(cli: Cli, work: Path) -> None:
    assert cli("run", "hi", "--provider", "scripted:s.json").code == 0
    (work / "durable-harness.toml").write_text('provider = "openai:gpt-nothing"\n')
    res = cli("resume", "--latest", "--verbose")
    assert res.code == 0, res.err  # no OPENAI_API_KEY needed: the file's provider is not used
    assert "provider" not in _sources(res)


def test_crash_test_s_durability_is_its_own_option_not_the_file_s(work: Path) -> None:
    # crash-test --durability picks power-cut modes; a file's store durability must not fill it
    (work / "durable-harness.toml").write_text('durability = "batch"\n')
    args = argparse.Namespace(command="crash-test", durability=None, power_cut=False)
    settings = apply_settings(args)
    assert args.durability is None and "durability" not in settings.sources
    run = argparse.Namespace(command="run", durability=None, provider=None, store=None, mcp=[])
    assert apply_settings(run).sources["durability"] == str(work / "durable-harness.toml")
    assert run.durability == "batch"


def test_a_malformed_file_is_a_typed_error_naming_the_file_and_the_key(
    cli: Cli, work: Path
) -> None:
    path = work / "durable-harness.toml"
    path.write_text('stor = "sqlite:x.db"\n')
    res = cli("sessions")
    assert res.code == 2 and "error[format_error]" in res.err
    assert str(path) in res.err and "stor" in res.err
    path.write_text('durability = "sometimes"\n')
    res = cli("sessions")
    assert res.code == 2 and "durability" in res.err
    path.write_text("store = [\n")
    res = cli("sessions")
    assert res.code == 2 and "not a readable TOML file" in res.err
