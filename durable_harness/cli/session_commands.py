"""The commands that read a session or a store, or copy one in: ``sessions``, ``show``,
``context``, ``fsck``, ``import``, ``log``, ``cost`` and ``fork`` (``design/cli.md``)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Literal

from durable_harness import terminal as ui
from durable_harness.cli.common import (
    builtin,
    catalogue_time,
    command,
    json_option,
    json_text,
    line,
    open_named,
    or_dash,
    out,
    require_lane,
    resolve_entry,
    run_async,
    session_argument,
    store_of,
)
from durable_harness.display import visible
from durable_harness.errors import DurableHarnessError, SessionNotFound, UnknownEntry
from durable_harness.harness.report import cost_report, format_cost, timeline
from durable_harness.providers import WIRE_FORMATS, wire_messages
from durable_harness.recovery.fsck import damage_location, fsck_path, fsck_session
from durable_harness.session import Session, import_pi_file
from durable_harness.session.context import context_text
from durable_harness.storage.base import SessionInfo, Store

HEADER = ("ID", "MODIFIED", "STATE", "WAITING", "CWD", "TITLE")
"""The columns of the ``sessions`` listing (``design/cli.md``, "Output")."""

MAX_INDENT = 32
"""Branch levels drawn in ``show --tree``; deeper ones print their level as ``[40] ``."""


async def listed_rows(store: Store, infos: list[SessionInfo]) -> list[dict[str, Any]]:
    """Each catalogue row with ``state`` and ``waiting`` by the host's rule (``host.listing``)."""
    from durable_harness.host.listing import read_listed, waiting_calls

    rows: list[dict[str, Any]] = []
    for info in infos:
        row: dict[str, Any] = vars(info) | {"state": None, "waiting": [], "title": None}
        if info.error is None:
            try:
                with store.open_session(info.id, write=False) as ss:
                    rec, plan = await read_listed(ss, store.spec, lambda _rt: builtin())
                    row["title"] = Session(ss).title
                row["state"], row["waiting"] = rec.state, waiting_calls(plan)
            except DurableHarnessError as exc:
                row["error"] = exc.to_json()
        rows.append(row)
    rows.sort(key=lambda r: catalogue_time(str(r.get("modified") or "")), reverse=True)
    return rows


def _sessions_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cwd", help="only sessions of this working directory")
    p.add_argument(
        "--state",
        action="append",
        metavar="STATE",
        help="only sessions in this state (repeatable): creating, idle, running, closing, "
        "closed, suspended (crashed or waiting for a decision), error",
    )


@command(
    "sessions",
    json_option,
    _sessions_options,
    exits=((0, "listed"), (1, "a session file cannot be read (listed with its error)")),
)
def sessions(args: argparse.Namespace) -> int:
    """List sessions, most recently modified first, with their state and the calls they wait on.

    The columns and filters: ``design/cli.md``, "Output". Exit 1 when a session cannot be read.

    Raises:
        InvalidRequest: a ``--state`` value is no lifecycle state.

    example:
      durable-harness sessions
      durable-harness sessions --state suspended --json --store sqlite:agent.db
      durable-harness sessions --cwd ~/project
    """
    from durable_harness.host.listing import check_states

    chosen = check_states(args.state)
    store = store_of(args)
    rows = run_async(listed_rows, store, store.list_sessions(args.cwd))
    broken = [r for r in rows if r.get("error") is not None]
    if chosen is not None:
        rows = [r for r in rows if r["state"] in chosen]
    if args.json:
        out(rows)
        return 1 if broken else 0
    if rows:
        table = [HEADER] + [
            tuple(
                visible(cell)  # the operator reads what is stored (design/cli.md)
                for cell in (
                    str(r["id"] or "-"),
                    str(r.get("modified") or "-"),
                    str(r["state"] or "UNREADABLE"),
                    "-" if r["state"] is None else str(len(r["waiting"])),
                    str(r["cwd"] or "-"),
                    str(r["error"]["message"] if r.get("error") else or_dash(r["title"])),
                )
            )
            for r in rows
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(HEADER) - 1)]
        for row in table:
            print("  ".join([c.ljust(w) for c, w in zip(row, widths, strict=False)] + [row[-1]]))
    else:
        print("no sessions", file=sys.stderr)
    if broken:
        print(f"{len(broken)} session file(s) cannot be read", file=sys.stderr)
    return 1 if broken else 0


def _describe(e: dict[str, Any]) -> str:
    """One entry as a short human line: role, start of its text, tools it calls."""
    from durable_harness.models.content import text_of

    kind = e.get("type")
    if kind != "message":
        return str(kind)
    msg = e.get("message") or {}
    calls = [
        b.get("name")
        for b in msg.get("content") or []
        if isinstance(b, dict) and b.get("type") == "toolCall"
    ]
    desc = f"{msg.get('role')}: {json_text(text_of(msg.get('content'))[:60])}"
    if calls:
        desc += f" -> {', '.join(str(c) for c in calls)}"
    return desc


def _tree_lines(roots: list[Any], leaves: dict[str, str]) -> list[str]:
    """The tree as lines, depth first, children in ``seq`` order; only branch points indent
    (``design/cli.md``, "Output"). Iterative: a 100,000-entry chain is as deep as it is long."""
    lines: list[str] = []
    # (node, prefix of its own line, prefix of the lines below it, branch level)
    stack: list[tuple[Any, str, str, int]] = []

    def push_children(children: list[Any], rest: str, level: int) -> None:
        if len(children) == 1:
            stack.append((children[0], rest, rest, level))
            return
        if level >= MAX_INDENT:  # too deep to draw: number the level instead
            marker = f"[{level + 1}] "
            stack.extend((c, marker, marker, level + 1) for c in reversed(children))
            return
        for i in reversed(range(len(children))):
            last = i == len(children) - 1
            first = rest + ("└─ " if last else "├─ ")
            stack.append((children[i], first, rest + ("   " if last else "│  "), level + 1))

    push_children(roots, "", -1 if len(roots) > 1 else 0)
    while stack:
        n, first, rest, level = stack.pop()
        e = n.entry
        marks = "".join(f" <{lane}>" for lane, leaf in leaves.items() if leaf == e["id"])
        label = f" [{n.label}]" if n.label else ""
        lines.append(f"{first}{e['id']} {_describe(e)}{label}{marks}")
        push_children(n.children, rest, level)
    return lines


@command(
    "show",
    session_argument,
    json_option,
    lambda p: p.add_argument("--tree", action="store_true", help="print the whole tree"),
)
def show(args: argparse.Namespace) -> int:
    """Show a session: header, lanes, facts, damage (and the tree with --tree).

    example:
      durable-harness show 01a2f   # a unique prefix of the session id is enough
      durable-harness show SESSION --tree
      durable-harness show ~/.pi/agent/sessions/x.jsonl --json
    """
    with open_named(args) as s:
        lanes = {k: vars(v) for k, v in s.store.lanes().items()}
        info = {
            "session_id": s.id,
            "cwd": s.cwd,
            "location": s.store.location,
            "name": s.name,
            "title": s.title,
            "entries": s.store.entry_count(),
            "lanes": lanes,
            "labels": s.labels(),
            "damage": s.damage,
            "header": s.store.header,
        }
        if args.json:
            if args.tree:
                info["tree"] = [e for e in s.store.iter_entries()]
            out(info)
            return 0
        line(f"session {s.id}  ({s.store.location})")
        line(f"cwd {s.cwd}  name {s.name or '-'}  entries {info['entries']}")
        if not s.name and s.title:
            line(f"first prompt {s.title}")
        for lane, st in lanes.items():
            run = f" run {st['run_id']} open" if st["run_id"] else ""
            line(f"lane {lane}: leaf {or_dash(st['leaf_id'])}{run}")
        for d in s.damage:
            ui.say_parts(
                (f"damage: {d['kind']}", "bold red"), f" at {damage_location(d)}: {d['detail']}"
            )
        if args.tree:
            leaves = {k: v["leaf_id"] for k, v in lanes.items()}
            for tree_line in _tree_lines(s.tree(), leaves):
                line(tree_line)
    return 0


def _context_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--leaf", help="entry id to build from (default: the lane's leaf)")
    p.add_argument(
        "--lane", default="main", help="lane whose leaf to use (default main; must exist)"
    )
    p.add_argument(
        "--format",
        choices=WIRE_FORMATS,
        default=None,
        help="print the messages as that provider's request carries them (JSON; default: "
        "the stored form)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="with --format anthropic: the model the request is for, which decides whose "
        "thinking signatures are sent (default: the session's current model)",
    )


@command("context", session_argument, json_option, _context_options)
def context(args: argparse.Namespace) -> int:
    """Print the provider context built from a leaf: exactly what the next request would carry.

    example:
      durable-harness context SESSION
      durable-harness context SESSION --json --lane side
      durable-harness context SESSION --leaf ENTRY_ID   # as it was at an earlier entry
    """
    with open_named(args) as s:
        if args.leaf is None:
            require_lane(s, args.lane)
        ctx = s.context(args.leaf, lane=args.lane)
        if args.format:
            current = ctx.model or {}
            model = args.model or (
                current.get("modelId") if current.get("provider") == args.format else None
            )
            out(wire_messages(args.format, ctx.messages, model=model))
        elif args.json:
            out(ctx.messages)
        else:
            model = ctx.model or {}
            name = f"{model.get('provider')}/{model.get('modelId')}" if model else "(none recorded)"
            line(f"# model {name} thinking {ctx.thinking_level}")
            line(context_text(ctx.messages), multiline=True)
    return 0


@command(
    "fsck",
    json_option,
    lambda p: p.add_argument(
        "path",
        help="a session id or unique id prefix (looked up in --store), a session file "
        "(ours or pi's), a JSONL store folder, or a SQLite store (PATH or sqlite:PATH)",
    ),
    exits=((0, "no damage found"), (1, "damage found (each kind and where)")),
)
def fsck(args: argparse.Namespace) -> int:
    """Check a session file or store; report damage with byte offsets.

    Read-only; exit 1 when damage is found.

    example:
      durable-harness fsck ~/.durable-harness/sessions/--home-me-project--/x.jsonl
      durable-harness fsck sqlite:agent.db --json
    """
    target = str(args.path)
    spec = target.startswith(("jsonl:", "sqlite:", "postgresql://", "postgres://"))
    if spec or os.path.exists(target):
        result = fsck_path(target)
    else:
        result = fsck_session(target, store_of(args))
    if args.json:
        out(result)
    else:
        ui.say_parts(
            f"{args.path}: ",
            ("ok", "green") if result["ok"] else ("DAMAGED", "bold red"),
            f" ({result['format']}, {result['entries']} entries, {result['records']} records)",
        )
        for d in result["damage"]:
            line(f"  {d['kind']} at {damage_location(d)}: {d['detail']}")
        for f in result.get("files", []):
            ui.say_parts(
                f"  {f['path']}: ", ("ok", "green") if f["ok"] else ("DAMAGED", "bold red")
            )
    return 0 if result["ok"] else 1


@command(
    "import",
    json_option,
    lambda p: p.add_argument("file", help="a pi session file (format version 1, 2 or 3)"),
)
def import_(args: argparse.Namespace) -> int:
    """Import a pi session file as a new session (the file is not modified).

    example:
      durable-harness import ~/.pi/agent/sessions/--home-me-project--/x.jsonl
      durable-harness import x.jsonl --store sqlite:agent.db --json
    """
    if not os.path.isfile(args.file):
        raise SessionNotFound(f"no file at {args.file}", path=args.file)
    store = store_of(args, create=True)
    sid = import_pi_file(args.file, store)
    if args.json:
        out({"session_id": sid, "store": store.spec})
    else:
        line(f"imported {args.file} as session {sid}")
    return 0


@command(
    "log",
    session_argument,
    json_option,
    lambda p: p.add_argument("--lane", help="only this lane (must exist)"),
)
def log(args: argparse.Namespace) -> int:
    """Print the lane operation log as a timeline.

    example:
      durable-harness log SESSION
      durable-harness log SESSION --lane main --json
    """
    with open_named(args) as s:
        if args.lane is not None:
            require_lane(s, args.lane)
        rows = timeline(s.store, args.lane)
    if args.json:
        out(rows)
        return 0
    for r in rows:
        run = (r["runId"] or "-")[-8:]
        line(
            f"{r['seq']:>5}  {or_dash(r['timestamp'])}  {or_dash(r['lane']):<6} {run:<8}  "
            f"{r['type']:<26} {r['summary']}".rstrip()
        )
    return 0


@command("cost", session_argument, json_option)
def cost(args: argparse.Namespace) -> int:
    """Print cost per turn, per run and for the session (USD).

    example:
      durable-harness cost SESSION
      durable-harness cost SESSION --json
    """
    with open_named(args) as s:
        report = cost_report(s.store)
    if args.json:
        out(report)
        return 0
    line(f"{'run':<10} {'turn':>4}  {'purpose':<14} {'tokens':>8}  cost (USD)")
    for t in report["turns"]:
        line(
            f"{or_dash(t['run_id'])[-8:]:<10} {or_dash(t['turn']):>4}  {t['purpose']:<14} "
            f"{t['tokens']:>8}  {format_cost(t['cost'])}"
        )
    for r in report["runs"]:
        line(f"run {r['run_id']}: {r['turns']} turn(s), {r['tokens']} tokens, {format_cost(r)}")
    total = report["total"]
    line(f"session total: {total['tokens']} tokens, {format_cost(total)}")
    if report["unknown_cost_attempts"]:
        line(f"plus {report['unknown_cost_attempts']} attempt(s) lost in a crash: cost unknown")
    return 0


def _fork_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--entry",
        help="the entry to fork at (default: the leaf of --lane); its id from `show --tree`",
    )
    p.add_argument("--lane", default="main", help="lane whose leaf is the default entry")
    p.add_argument(
        "--before",
        action="store_true",
        help="fork just before the entry (keep its parent, not the entry itself)",
    )
    p.add_argument("--cwd", help="working directory of the new session (default: the same)")


@command("fork", session_argument, json_option, _fork_options)
def fork(args: argparse.Namespace) -> int:
    """Fork a new session holding the path up to an entry (ids kept; the original is untouched).

    example:
      durable-harness fork SESSION                        # the whole current branch of main
      durable-harness fork SESSION --entry 9f2c1a0b --before   # try that turn again
      durable-harness fork ~/.pi/agent/sessions/x.jsonl --cwd ~/other-project
    """
    position: Literal["at", "before"] = "before" if args.before else "at"
    with open_named(args) as s:
        entry = None if args.entry is None else resolve_entry(s, args.entry)
        if entry is None:
            require_lane(s, args.lane)
            entry = s.leaf(args.lane)
            if entry is None:
                raise UnknownEntry(
                    f"lane {args.lane} of session {s.id} has no entries: nothing to fork",
                    lane=args.lane,
                )
        cwd = os.path.abspath(args.cwd) if args.cwd else None
        with s.fork(store_of(args, create=True), entry, position=position, cwd=cwd) as new:
            info = {
                "session_id": new.id,
                "parent_session": s.id,
                "entry": entry,
                "position": position,
                "entries": new.store.entry_count(),
                "location": new.store.location,
            }
    if args.json:
        out(info)
    else:
        line(
            f"forked session {s.id} {position} entry {or_dash(entry)} as session {new.id} "
            f"({info['entries']} entries)"
        )
    return 0
