"""Targets the fork-server tests ask the server to run in its children (by ``module:function``,
the module named from ``__name__``, so the child imports it as the test did)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from durable_harness import crash


def report(argv: list[str]) -> int:
    """Write what the child sees (env, cwd, stdin, argv) as JSON to ``argv[0]``; exit 3."""
    Path(argv[0]).write_text(
        json.dumps(
            {
                "env": dict(os.environ),
                "cwd": os.getcwd(),
                "stdin": sys.stdin.read(),
                "argv": argv,
                "ppid": os.getppid(),
            }
        )
    )
    print("to stdout")
    print("to stderr", file=sys.stderr)
    return 3


def hit(argv: list[str]) -> int:
    """Hit the crash point ``argv[0]`` ``argv[1]`` times (SIGKILLed at the configured hit)."""
    for _ in range(int(argv[1])):
        crash.crash_point(argv[0])
    return 0


def rendezvous(argv: list[str]) -> int:
    """Create ``argv[0]``, then wait for ``argv[1]`` (the other child's): both must run at once."""
    Path(argv[0]).write_text(str(os.getpid()))
    while not Path(argv[1]).exists():
        time.sleep(0.01)
    return 0


def hang(argv: list[str]) -> int:
    """Write this pid to ``argv[0]``, then never end."""
    tmp = argv[0] + ".tmp"
    Path(tmp).write_text(str(os.getpid()))
    os.replace(tmp, argv[0])
    while True:
        time.sleep(60)


def boom(argv: list[str]) -> int:
    """Raise, for the traceback-and-exit-1 path."""
    raise ValueError("boom from the forked child")


def echo(argv: list[str]) -> int:
    """Copy stdin to stdout line by line, upper-cased and flushed, until end of input; then
    write the descriptors this process has open to stderr and exit 4."""
    for line in sys.stdin:
        sys.stdout.write(line.upper())
        sys.stdout.flush()
    print(sorted(int(fd) for fd in os.listdir("/proc/self/fd")), file=sys.stderr)
    return 4


def frozen(argv: list[str]) -> int:
    """Write how many objects the collector holds frozen (``gc.get_freeze_count``) and how many
    it tracks, as JSON to ``argv[0]``."""
    import gc

    Path(argv[0]).write_text(
        json.dumps({"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects())})
    )
    return 0
