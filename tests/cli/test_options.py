"""One name per concept: ``--durability`` everywhere a durability mode is chosen; ``serve``'s
old ``--mode`` is a deprecated alias (accepted, warned about on stderr, hidden from --help)."""

from __future__ import annotations

import re

import pytest

from durable_harness.cli.main import build_parser, main
from durable_harness.cli.settings import apply_settings


@pytest.mark.parametrize("name", ["run", "resume", "serve", "acp"])
def test_every_command_choosing_a_durability_calls_it_durability(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([name, "--help"])
    page = capsys.readouterr().out
    assert "--durability {sync,batch,none}" in page
    assert not re.search(r"^\s+--mode\b", page, re.M), "--mode is listed as an option"


def test_serve_mode_is_a_deprecated_alias_of_durability(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["serve", "--mode", "batch"])
    assert args.durability == "batch" and not hasattr(args, "mode")
    err = capsys.readouterr().err
    assert err == "durable-harness: --mode is deprecated; use --durability\n"


def test_serve_durability_needs_no_alias_and_warns_of_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser().parse_args(["serve"])
    apply_settings(args)  # what main() does before the handler: no flag, no file: the default
    assert args.durability == "sync"
    assert build_parser().parse_args(["serve", "--durability", "none"]).durability == "none"
    assert capsys.readouterr().err == ""


def test_the_alias_takes_only_durability_modes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["serve", "--mode", "fast"])
    assert exc.value.code == 2
    assert "invalid choice: 'fast'" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["run", "hi"], ["acp", "--provider", "scripted:x.json"]])
def test_only_serve_keeps_the_old_spelling(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([*argv, "--mode", "sync"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --mode sync" in capsys.readouterr().err
