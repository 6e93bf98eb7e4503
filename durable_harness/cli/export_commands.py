"""The ``export`` command: a session written out as a pi session file, a self-contained HTML
page, or our own JSONL (``design/pi.md``, ``design/cli.md``)."""

from __future__ import annotations

import argparse
import sys

from durable_harness.cli.common import (
    command,
    json_option,
    line,
    open_named,
    out,
    require_lane,
    session_argument,
)
from durable_harness.session.html_export import session_html
from durable_harness.session.pi_export import pi_entries, pi_text

FORMATS = ("pi", "html")
"""The formats ``export`` writes."""


def _export_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="pi",
        help="pi: a pi session file (format version 3) that pi opens as the same conversation; "
        "html: one self-contained page (tree, transcript, run timeline). Default: pi",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    p.add_argument("--lane", default="main", help="the lane whose leaf is the conversation's")
    p.add_argument(
        "--with-log",
        action="store_true",
        help="pi: keep the operation log as one pi `custom` entry pi ignores (default: left out)",
    )


@command("export", session_argument, _export_options, json_option)
def export(args: argparse.Namespace) -> int:
    """Write a session out as a pi session file or one HTML page (the session is not changed).

    The pi file's last line is the lane's leaf, as pi reads it; the mapping and what is left
    out: ``design/pi.md``. With ``-o`` the file is written atomically.

    example:
      durable-harness export 01a2f --format pi -o ~/.pi/agent/sessions/--home-me-project--/x.jsonl
      durable-harness export 01a2f --format html -o session.html
    """
    from pathlib import Path

    from durable_harness.fs import atomic_write

    with open_named(args) as s:
        require_lane(s, args.lane)
        if args.format == "pi":
            lines = pi_entries(s, args.lane, with_log=args.with_log)
            data, count = pi_text(lines), len(lines)
        else:
            data = session_html(s, args.lane).encode()
            count = 1
        sid, leaf = s.id, s.leaf(args.lane)
    if args.output is None:
        sys.stdout.buffer.write(data)
        return 0
    atomic_write(Path(args.output), data)
    if args.json:
        out(
            {
                "session_id": sid,
                "format": args.format,
                "path": args.output,
                "bytes": len(data),
                "lines": count,
                "leaf": leaf,
            }
        )
    else:
        line(f"exported session {sid} ({args.format}, {len(data)} bytes) to {args.output}")
    return 0
