"""``durable-harness completion bash|zsh``: the script completes every command and an option of
one, checked in a real bash (issue 24, "Shell completion")."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from durable_harness.cli.main import COMMANDS
from durable_harness.crashtest import forkserver

BASH_COMPLETE = """
source {script}
func=$(complete -p durable-harness | sed -E 's/.*-F ([^ ]+).*/\\1/')
COMP_WORDS=({words}); COMP_CWORD={cword}; COMP_LINE="{line}"; COMP_POINT=${{#COMP_LINE}}
"$func" durable-harness "${{COMP_WORDS[$COMP_CWORD]}}" "${{COMP_WORDS[$((COMP_CWORD-1))]}}"
printf '%s\\n' "${{COMPREPLY[@]}}"
"""


def _script(tmp_path: Path, shell: str) -> Path:
    done = forkserver.run_cli(
        ["completion", shell], env=dict(os.environ), cwd=os.getcwd(), timeout=60
    )
    done.check_returncode()
    path = tmp_path / f"completion.{shell}"
    path.write_text(done.stdout)
    return path


def _complete(script: Path, *words: str) -> list[str]:
    bash = shutil.which("bash")
    assert bash is not None, "bash is part of the base system the suite runs on"
    quoted = " ".join(f"'{w}'" for w in ("durable-harness", *words))
    text = BASH_COMPLETE.format(
        script=script, words=quoted, cword=len(words), line=" ".join(("durable-harness", *words))
    )
    done = subprocess.run([bash, "-c", text], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.slow
def test_bash_completes_commands_and_their_options(tmp_path: Path) -> None:
    script = _script(tmp_path, "bash")
    assert set(_complete(script, "")) >= set(COMMANDS)
    assert "resume" in _complete(script, "res") and "sessions" not in _complete(script, "res")
    options = _complete(script, "resume", "--")
    assert {"--latest", "--decide", "--policy", "--store"} <= set(options)
    assert set(_complete(script, "prune", "--")) >= {"--closed", "--older-than", "--dry-run"}


def test_zsh_script_names_every_command(tmp_path: Path) -> None:
    text = _script(tmp_path, "zsh").read_text()
    assert text.startswith("#compdef durable-harness")
    for name in COMMANDS:
        assert f"{name}:" in text or f'"{name}"' in text, name
