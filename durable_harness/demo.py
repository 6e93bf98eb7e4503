"""``durable-harness demo``: the main job, end to end, with no network and no server: a
scripted run SIGKILLed mid-tool (crash point ``after_tool_started:3``), its recovery plan read
by a fresh process, a decision taken from the real side effect and the run resumed; then a pi
v3 session imported."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from durable_harness.terminal import say

SCRIPT = {
    "turns": [
        {
            "text": "I'll write the release notes first.",
            "tool_calls": [
                {
                    "name": "write_file",
                    "arguments": {"path": "NOTES.md", "content": "# Release 1.2\n- fixes\n"},
                }
            ],
            "usage": {"input": 1200, "output": 60, "cost": {"input": 0.0036, "output": 0.0009}},
        },
        {
            "text": "Now I check the notes and deploy.",
            "tool_calls": [
                {"name": "read_file", "arguments": {"path": "NOTES.md"}},
                {
                    "name": "bash",
                    "arguments": {"command": 'echo "deployed release 1.2" >> deploy.log'},
                },
            ],
            "usage": {"input": 1500, "output": 80, "cost": {"input": 0.0045, "output": 0.0012}},
        },
        {
            "text": "Release 1.2 is deployed and the notes are in NOTES.md.",
            "usage": {"input": 1800, "output": 40, "cost": {"input": 0.0054, "output": 0.0006}},
        },
    ]
}


def _say(text: str) -> None:
    print(flush=True)
    say(f"== {text}", "bold")


def _cli(
    args: list[str], env: dict[str, str], cwd: str, *, echo: bool = True
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "durable_harness", *args]
    if echo:
        print("$ durable-harness " + shlex.join(args), flush=True)
    proc = subprocess.run(cmd, env=env, cwd=cwd, text=True, capture_output=True, check=not echo)
    if echo:
        sys.stdout.write(proc.stdout + proc.stderr)
        sys.stdout.flush()
    return proc


def run_demo(folder: str | None = None, store: str | None = None) -> int:
    """Run the demo in ``folder`` (default: a new temporary one); 0 when it all worked."""
    scratch = Path(folder or tempfile.mkdtemp(prefix="durable-harness-demo-")).resolve()
    work = scratch / "project"
    work.mkdir(parents=True, exist_ok=True)
    cwd = str(work)
    log = work / "deploy.log"
    # a reused --dir may hold an earlier demo's deploy line: judge this run by what it adds
    before = log.read_text().count("deployed release 1.2") if log.exists() else 0
    store = store or f"jsonl:{scratch / 'home'}"
    script = scratch / "script.json"
    script.write_text(json.dumps(SCRIPT, indent=1))
    env = {k: v for k, v in os.environ.items() if k != "DURABLE_HARNESS_CRASH_AT"}
    env["DURABLE_HARNESS_STORE"] = store
    print(f"scratch folder {scratch}\nstore {store}")

    _say(
        "1. Run the agent; in turn 2 the process SIGKILLs itself once both tool intents "
        "(read_file, bash) are durable and before bash starts"
    )
    crash_env = {**env, "DURABLE_HARNESS_CRASH_AT": "after_tool_started:3"}
    run = ["run", "Write release notes and deploy", "--provider", f"scripted:{script}"]
    first = _cli([*run, "--cwd", cwd], crash_env, cwd)
    if first.returncode != -9:
        print(f"expected the child to die by SIGKILL (-9), got {first.returncode}")
        return 1
    print("child process killed by SIGKILL (exit -9)")
    sid = json.loads(_cli(["sessions", "--json", "--cwd", cwd], env, cwd).stdout or "[]")[0]["id"]

    _say("2. A fresh process reads the recovery plan (nothing runs yet)")
    plan = json.loads(_cli(["recover", sid, "--json"], env, cwd, echo=False).stdout)
    _cli(["recover", sid], env, cwd)
    calls = plan["lanes"][0]["tool_calls"]
    waiting = [c for c in calls if c["action"] == "await_decision"]
    rerun = [c for c in calls if c["action"] == "re-execute"]
    print(f"re-run because replay is safe: {', '.join(c['tool_name'] for c in rerun) or '-'}")
    print(
        "refused (started, outcome unknown; replay never): "
        f"{', '.join(c['tool_name'] for c in waiting) or '-'}"
    )

    _say("3. The operator checks the real side effect, decides, and resumes")
    deployed = log.exists() and log.read_text().count("deployed release 1.2") > before
    decisions = []
    for c in waiting:
        choice = "result:already deployed (seen in deploy.log)" if deployed else "retry"
        print(
            f"deploy.log {'has' if deployed else 'does not have'} the deploy line, so the "
            f"operator decides {c['tool_call_id']}={choice.split(':')[0]}"
        )
        decisions += ["--decide", f"{c['tool_call_id']}={choice}"]
    resumed = _cli(["resume", sid, *decisions, "--quiet"], env, cwd)
    lines = (log.read_text().count("deployed release 1.2") if log.exists() else 0) - before
    print(f"deploy.log got the deploy line {lines} time(s): the bash tool ran exactly once")

    _say("4. The operation log and the cost per turn")
    _cli(["log", sid], env, cwd)
    _cli(["cost", sid], env, cwd)

    _say("5. A real pi session (format v3) imported, its tree and context")
    # the shared copy of pi's sample if present, else the one shipped in the package
    sample = Path(__file__).resolve().parents[2] / "shared/data/pi-sessions/v3-branched.jsonl"
    if not sample.is_file():
        sample = Path(__file__).parent / "data" / "v3-branched.jsonl"
    imported = _cli(["import", str(sample), "--json"], env, cwd)
    pi_sid = json.loads(imported.stdout)["session_id"] if imported.returncode == 0 else ""
    shown = _cli(["show", pi_sid, "--tree"], env, cwd)
    _cli(["context", pi_sid], env, cwd)
    ok = resumed.returncode == 0 and lines == 1 and shown.returncode == 0
    _say("demo " + ("finished: the run completed after the crash" if ok else "FAILED"))
    print(
        f"The demo's sessions live in its own store; to look further:\n"
        f"  durable-harness sessions --store {store}\n"
        f"  durable-harness log {sid} --store {store}"
    )
    return 0 if ok else 1
