"""The subcommands of ``durable-harness`` (each registered with :func:`main.command`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from durable_harness import crash
from durable_harness import terminal as ui
from durable_harness.cli.main import (
    add_price_argument,
    command,
    out,
    price_of,
    run_async,
    store_of,
)
from durable_harness.display import visible
from durable_harness.errors import FormatError, SessionNotFound, UnknownEntry, UnknownLane
from durable_harness.harness.harness import Harness, HarnessOptions
from durable_harness.harness.report import cost_report, format_cost, timeline
from durable_harness.providers import (
    WIRE_FORMATS,
    make_provider,
    provider_spec,
    require_credentials,
    wire_messages,
)
from durable_harness.recovery.decide import POLICIES, RecoveryPlan
from durable_harness.recovery.fsck import damage_location, fsck_path, fsck_session
from durable_harness.recovery.resume import (
    parse_decision,
    plan_recovery,
    recover,
    resume_session,
    resumed_provider,
)
from durable_harness.session import Session, import_pi_file, open_session
from durable_harness.session.context import context_text
from durable_harness.storage import DURABILITY_MODES, open_store
from durable_harness.tools.builtin import builtin_tools

EXIT = {"completed": 0, "failed": 1, "aborted": 3, "declined": 4, "suspended": 5, "idle": 0}


def configure(name: str, p: argparse.ArgumentParser) -> None:
    """Add the options of command ``name``."""
    if name in ("show", "context", "log", "cost", "recover", "resume", "fork"):
        p.add_argument("session", help="session id, unique id prefix, or session file path")
    if name in (
        "sessions",
        "show",
        "context",
        "fsck",
        "log",
        "cost",
        "recover",
        "import",
        "crash-points",
        "fork",
        "migrate",
    ):
        p.add_argument("--json", action="store_true", help="print JSON")
    if name == "sessions":
        p.add_argument("--cwd", help="only sessions of this working directory")
        p.add_argument(
            "--state",
            action="append",
            metavar="STATE",
            help="only sessions in this state (repeatable): creating, idle, running, closing, "
            "closed, suspended (crashed or waiting for a decision), error",
        )
    if name == "show":
        p.add_argument("--tree", action="store_true", help="print the whole tree")
    if name == "context":
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
    if name == "fsck":
        p.add_argument(
            "path",
            help="a session id or unique id prefix (looked up in --store), a session file "
            "(ours or pi's), a JSONL store folder, or a SQLite store (PATH or sqlite:PATH)",
        )
    if name == "import":
        p.add_argument("file", help="a pi session file (format version 1, 2 or 3)")
    if name == "log":
        p.add_argument("--lane", help="only this lane (must exist)")
    if name == "fork":
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
    if name in ("run", "resume"):
        p.add_argument("--provider", help="scripted:FILE, openai:MODEL or anthropic:MODEL")
        add_price_argument(p)
        p.add_argument(
            "--durability",
            choices=DURABILITY_MODES,
            default="sync",
            help="sync: fsync each commit; batch: share fsyncs; none: never fsync",
        )
        p.add_argument(
            "--lane",
            default=None if name == "resume" else "main",
            help="lane to run on" if name == "run" else "only this lane",
        )
        p.add_argument("--quiet", action="store_true", help="print only the outcome")
        p.add_argument(
            "--allow-env",
            action="append",
            default=[],
            metavar="NAME",
            help="let bash inherit this credential-like variable (*_KEY, *_TOKEN, *_SECRET, "
            "*PASSWORD*; removed by default); a name or shell pattern, repeatable",
        )
    if name == "run":
        p.add_argument("prompt", help="the prompt text")
        p.add_argument("--session", help="continue this session (default: a new one)")
        p.add_argument(
            "--continue",
            dest="continue_recent",
            action="store_true",
            help="continue the most recent session of the working directory (a new one if it "
            "has none)",
        )
        p.add_argument("--cwd", default=None, help="working directory (default: current)")
        p.add_argument("--steer", action="append", default=[], help="queue a steering message")
        p.add_argument("--follow-up", action="append", default=[], help="queue a follow-up message")
    if name in ("recover", "resume"):
        p.add_argument(
            "--policy",
            choices=POLICIES,
            default="ask",
            help="in-doubt tool calls: ask (wait for a decision), retry-safe "
            "(never wait; fail what cannot be re-run or reconciled), fail-in-doubt (fail every "
            "in-doubt call, re-running nothing)",
        )
    if name == "resume":
        p.add_argument(
            "--decide",
            action="append",
            default=[],
            metavar="ID=DECISION",
            help="TOOL_CALL_ID=retry|fail|result:TEXT (repeatable)",
        )
        p.add_argument("--json", action="store_true", help="print JSON")
    if name == "crash-test":
        from durable_harness.crashtest import configure_parser

        configure_parser(p)
    if name == "demo":
        p.add_argument("--dir", help="scratch folder (default: a new temporary one)")
    if name in ("serve", "acp"):
        from durable_harness.cli.host_commands import configure_host

        configure_host(name, p)


def _open(args: argparse.Namespace, *, write: bool = False, durability: str = "sync") -> Session:
    """Open the session named on the command line; a session file path needs no store (the
    default one stands in, and nothing is created)."""
    ref = args.session
    store = open_store(None, create=False) if os.path.isfile(ref) else store_of(args)
    return open_session(ref, store, write=write, durability=durability)  # type: ignore[arg-type]


def _require_lane(session: Session, lane: str) -> None:
    """Refuse a lane the session does not have, naming the lanes it has.

    Raises:
        UnknownLane: ``lane`` is not among ``session``'s lanes.
    """
    lanes = sorted(session.store.lanes())
    if lane not in lanes:
        raise UnknownLane(
            f"session {session.id} has no lane {lane!r}; its lanes: {', '.join(lanes)}",
            lane=lane,
            lanes=lanes,
        )


def _line(
    text: str = "",
    *,
    multiline: bool = False,
    file: Any = None,
    end: str = "\n",
    flush: bool = False,
) -> None:
    """Print ``text`` for a person: every invisible or reordering character shown as
    ``\\u{HEX}`` (:func:`durable_harness.display.visible`; ``multiline`` keeps newlines and
    tabs). Every human-form line of these commands goes through here; ``--json`` does not."""
    print(visible(text, multiline=multiline), file=file, end=end, flush=flush)


def _json_text(value: Any) -> str:
    """A value as compact JSON for human output (never a Python repr)."""
    return json.dumps(value, ensure_ascii=False, default=str)


def _or_dash(value: Any) -> str:
    """``-`` for a missing value, else its text."""
    return "-" if value is None or value == "" else str(value)


TOOL_STATUS_TEXT = {
    "not_started": "not started",
    "in_doubt": "started, outcome unknown",
    "completed": "completed",
}
"""How a tool call's recovery status reads for a person: an intent that is durable with no
settlement is *started, outcome unknown*, never "ran"."""


@command(
    "sessions",
    "List sessions, most recently modified first, with their state and the calls they wait on.",
    "  durable-harness sessions\n"
    "  durable-harness sessions --state suspended --json --store sqlite:agent.db\n"
    "  durable-harness sessions --cwd ~/project",
)
def cmd_sessions(args: argparse.Namespace) -> int:
    """List the sessions of the store: a header, then per session its id, last modification,
    state, number of in-doubt calls waiting for a decision and cwd (``--cwd`` narrows to one
    directory, compared as real paths; ``--state`` to some states). A session file that cannot
    be read is listed with its error, and the exit status is then 1
    (:func:`durable_harness.cli.listing.list_sessions`)."""
    from durable_harness.cli.listing import list_sessions

    return list_sessions(args)


def _describe(e: dict[str, Any]) -> str:
    """One entry as a short human line: role, start of its text, tools it calls."""
    from durable_harness.models.messages import text_of

    kind = e.get("type")
    if kind != "message":
        return str(kind)
    msg = e.get("message") or {}
    calls = [
        b.get("name")
        for b in msg.get("content") or []
        if isinstance(b, dict) and b.get("type") == "toolCall"
    ]
    desc = f"{msg.get('role')}: {_json_text(text_of(msg.get('content'))[:60])}"
    if calls:
        desc += f" -> {', '.join(str(c) for c in calls)}"
    return desc


MAX_INDENT = 32
"""Branch levels drawn in ``show --tree``; deeper ones print their level as a number instead
(``[40] ├─ id ...``), so that no line grows with the depth of the tree."""


def _tree_lines(roots: list[Any], leaves: dict[str, str]) -> list[str]:
    """The tree as lines, depth first, children in ``seq`` order.

    An only child stays at its parent's indentation (a conversation is a chain: indenting every
    entry would make line length grow with its length); each child of a branch point starts
    with ``├─`` (``└─`` for the last), and the lines of its branch keep a ``│`` under it.
    Iterative, with an explicit stack: a 100,000-entry chain is as deep as it is long, and
    Python's recursion limit is about 1,000.
    """
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
    "Show a session: header, lanes, facts, damage (and the tree with --tree).",
    "  durable-harness show 01a2f   # a unique prefix of the session id is enough\n"
    "  durable-harness show SESSION --tree\n"
    "  durable-harness show ~/.pi/agent/sessions/x.jsonl --json",
)
def cmd_show(args: argparse.Namespace) -> int:
    """Print a session's header, lanes, facts and damage, and with ``--tree`` its tree."""
    with _open(args) as s:
        lanes = {k: vars(v) for k, v in s.store.lanes().items()}
        info = {
            "session_id": s.id,
            "cwd": s.cwd,
            "location": s.store.location,
            "name": s.name,
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
        _line(f"session {s.id}  ({s.store.location})")
        _line(f"cwd {s.cwd}  name {s.name or '-'}  entries {info['entries']}")
        for lane, st in lanes.items():
            run = f" run {st['run_id']} open" if st["run_id"] else ""
            _line(f"lane {lane}: leaf {_or_dash(st['leaf_id'])}{run}")
        for d in s.damage:
            ui.say_parts(
                (f"damage: {d['kind']}", "bold red"), f" at {damage_location(d)}: {d['detail']}"
            )
        if args.tree:
            leaves = {k: v["leaf_id"] for k, v in lanes.items()}
            lines = _tree_lines(s.tree(), leaves)
            if lines:
                for line in lines:
                    _line(line)
    return 0


@command(
    "context",
    "Print the provider context built from a leaf: exactly what the next request would carry.",
    "  durable-harness context SESSION\n"
    "  durable-harness context SESSION --json --lane side\n"
    "  durable-harness context SESSION --leaf ENTRY_ID   # as it was at an earlier entry",
)
def cmd_context(args: argparse.Namespace) -> int:
    """Print the provider context built from a leaf (the lane's by default)."""
    with _open(args) as s:
        if args.leaf is None:
            _require_lane(s, args.lane)
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
            _line(f"# model {name} thinking {ctx.thinking_level}")
            _line(context_text(ctx.messages), multiline=True)
    return 0


@command(
    "fsck",
    "Check a session file or store; report damage with byte offsets.",
    "  durable-harness fsck ~/.durable-harness/sessions/--home-me-project--/x.jsonl\n"
    "  durable-harness fsck sqlite:agent.db --json",
)
def cmd_fsck(args: argparse.Namespace) -> int:
    """Check a session (by id, or its file), a file or a store read-only; exit 1 when damage
    is found. A path that exists (or a ``jsonl:``/``sqlite:`` spec) is checked as given;
    anything else is a session id looked up in the store, as the other commands do."""
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
            _line(f"  {d['kind']} at {damage_location(d)}: {d['detail']}")
        for f in result.get("files", []):
            ui.say_parts(
                f"  {f['path']}: ", ("ok", "green") if f["ok"] else ("DAMAGED", "bold red")
            )
    return 0 if result["ok"] else 1


@command(
    "import",
    "Import a pi session file as a new session (the file is not modified).",
    "  durable-harness import ~/.pi/agent/sessions/--home-me-project--/x.jsonl\n"
    "  durable-harness import x.jsonl --store sqlite:agent.db --json",
)
def cmd_import(args: argparse.Namespace) -> int:
    """Import a pi session file as a new session of the store."""
    if not os.path.isfile(args.file):
        raise SessionNotFound(f"no file at {args.file}", path=args.file)
    store = store_of(args, create=True)
    sid = import_pi_file(args.file, store)
    if args.json:
        out({"session_id": sid, "store": store.spec})
    else:
        _line(f"imported {args.file} as session {sid}")
    return 0


def _printer(quiet: bool) -> Any:
    def on_event(e: dict[str, Any]) -> None:
        if quiet:
            return
        t = e["type"]
        if t == "turn_start":
            _line(flush=True)
            ui.say(f"--- turn {e['turn']} ---", "bold")
        elif t == "message_update" and "delta" in e:
            _line(e["delta"], multiline=True, end="", flush=True)
        elif t == "message_end":
            _line(flush=True)
        elif t == "provider_request_end" and e.get("outcome") == "error":
            # the text printed so far was no answer: say so, so a retry's is not read as its end
            _line(flush=True)
            again = "; retrying" if e.get("retryable") else ""
            ui.say(f"  [attempt {e.get('attempt')} failed: {e.get('error')}{again}]", "yellow")
        elif t == "tool_execution_start":
            ui.say_parts(("  [tool] ", "cyan"), f"{e['toolName']} {_json_text(e['arguments'])}")
        elif t == "tool_execution_end":
            outcome = str(e["outcome"])
            ui.say_parts(
                ("  [tool] ", "cyan"),
                f"{e['toolName']} -> ",
                (outcome, "green" if outcome == "completed" else "yellow"),
            )
        elif t == "suspended":
            ui.say_parts(
                ("  [suspended]", "bold yellow"),
                f" awaiting a decision on {', '.join(e['awaiting'])}",
            )

    return on_event


@command(
    "run",
    "Run a prompt to its end, streaming to the terminal.",
    "  durable-harness run 'fix the failing test' --provider anthropic:claude-sonnet-4-5\n"
    "  OPENAI_BASE_URL=http://localhost:11434/v1 durable-harness run 'hi' --provider openai:qwen3\n"
    "  durable-harness run 'and now the docs' --session 01a2f --provider scripted:script.json",
)
def cmd_run(args: argparse.Namespace) -> int:
    """Run one prompt to its end, streaming events; the exit status reflects the outcome.

    Everything that can be refused before a session exists (the provider spec, its API key)
    is checked before one is created."""
    if not args.provider:
        raise FormatError("run needs --provider (scripted:FILE, openai:MODEL or anthropic:MODEL)")
    require_credentials(args.provider)
    provider = make_provider(args.provider, price_of(args))
    store = store_of(args, create=True)
    cwd = os.path.abspath(args.cwd or os.getcwd())
    tool_cwd: str | None = None
    if args.continue_recent and not args.session:
        # the directory's own latest session (by its recorded cwd as a real path); none: a
        # new session here, as pi does, never another directory's
        recent = store.most_recent(cwd)
        if recent is not None:
            args.session = recent.id
            tool_cwd = cwd  # the same directory as the recorded one, as the user spells it
        elif not args.quiet:
            _line(f"no session of {cwd} to continue: starting a new one", file=sys.stderr)
    if args.session:
        session = _open(args, write=True, durability=args.durability)
    else:
        session = Session(store.create_session(cwd, durability=args.durability))
    opts = HarnessOptions(provider_spec=provider_spec(args.provider))
    tool_cwd = tool_cwd or session.cwd or cwd

    async def go() -> str:
        async with Harness(
            session,
            provider,
            builtin_tools(allow_env=args.allow_env),
            cwd=tool_cwd,
            options=opts,
        ) as h:
            h.subscribe(_printer(args.quiet))
            handle = await h.prompt(args.prompt, lane=args.lane)
            for text in args.steer:
                await h.steer(text, lane=args.lane)
            for text in args.follow_up:
                await h.follow_up(text, lane=args.lane)
            return await handle.wait()

    with session:
        _line(f"session {session.id}", file=sys.stderr)
        outcome: str = run_async(go)
        if outcome == "failed":
            done = session.store.records(args.lane, types=("run_finished",))
            reason = done[-1].get("reason") if done else None
            ui.say(f"run failed: {reason or 'see durable-harness log'}", "red", stderr=True)
    ui.say(f"run {outcome}", "green" if outcome == "completed" else "yellow", stderr=True)
    return EXIT.get(outcome, 1)


@command(
    "log",
    "Print the lane operation log as a timeline.",
    "  durable-harness log SESSION\n  durable-harness log SESSION --lane main --json",
)
def cmd_log(args: argparse.Namespace) -> int:
    """Print a session's operation log as a timeline."""
    with _open(args) as s:
        if args.lane is not None:
            _require_lane(s, args.lane)
        rows = timeline(s.store, args.lane)
    if args.json:
        out(rows)
        return 0
    for r in rows:
        run = (r["runId"] or "-")[-8:]
        _line(
            f"{r['seq']:>5}  {_or_dash(r['timestamp'])}  {_or_dash(r['lane']):<6} {run:<8}  "
            f"{r['type']:<26} {r['summary']}".rstrip()
        )
    return 0


@command(
    "cost",
    "Print cost per turn, per run and for the session (USD).",
    "  durable-harness cost SESSION\n  durable-harness cost SESSION --json",
)
def cmd_cost(args: argparse.Namespace) -> int:
    """Print cost per turn, per run and for the session (USD, tokens)."""
    with _open(args) as s:
        report = cost_report(s.store)
    if args.json:
        out(report)
        return 0
    _line(f"{'run':<10} {'turn':>4}  {'purpose':<14} {'tokens':>8}  cost (USD)")
    for t in report["turns"]:
        _line(
            f"{_or_dash(t['run_id'])[-8:]:<10} {_or_dash(t['turn']):>4}  {t['purpose']:<14} "
            f"{t['tokens']:>8}  {format_cost(t['cost'])}"
        )
    for r in report["runs"]:
        _line(f"run {r['run_id']}: {r['turns']} turn(s), {r['tokens']} tokens, {format_cost(r)}")
    total = report["total"]
    _line(f"session total: {total['tokens']} tokens, {format_cost(total)}")
    if report["unknown_cost_attempts"]:
        _line(f"plus {report['unknown_cost_attempts']} attempt(s) lost in a crash: cost unknown")
    return 0


def _attempts_text(attempts: Any) -> str:
    """Provider attempts per counter (``{"turn 1": 2, "compaction 2": 1}``) as
    ``turn 1: 2, compaction 2: 1``."""
    if not isinstance(attempts, dict) or not attempts:
        return "none"
    return ", ".join(f"{key}: {n}" for key, n in attempts.items())


def print_plan(plan: RecoveryPlan) -> None:
    """Print a recovery plan as a readable table."""
    _line(f"session {plan.session_id}")
    if plan.lease:
        _line(
            f"  lease held by live process {_or_dash(plan.lease.get('pid'))}: "
            "nothing will be recovered"
        )
    for lp in plan.lanes:
        reason = f" ({lp.reason})" if lp.reason else ""
        _line(
            f"  lane {lp.lane}: {lp.state}{reason}  run {lp.run_id or '-'}  next: {lp.next_action}"
        )
        if lp.abort_requested:
            _line("    abort requested: the run settles as aborted, it is not resumed")
        if lp.last_run and lp.state == "idle":
            last = lp.last_run
            reason = f" ({last['reason']})" if last.get("reason") else ""
            _line(
                f"    last run {last['run_id']}: {last['outcome']}{reason}; provider attempts "
                f"{_attempts_text(last.get('attempts'))}"
            )
        if lp.attempts:
            _line(
                f"    provider attempts {_attempts_text(lp.attempts)} (cap {lp.attempt_cap} "
                f"per turn); {lp.cost_unknown_attempts} with unknown cost"
            )
        if lp.last_safe_boundary:
            _line(
                f"    last safe boundary: seq {lp.last_safe_boundary['seq']} "
                f"({lp.last_safe_boundary['type']})"
            )
        if lp.tool_calls:
            _line(f"    {'tool call':<16} {'tool':<12} {'status':<12} {'replay':<7} action")
            for c in lp.tool_calls:
                _line(
                    f"    {c.tool_call_id:<16} {c.tool_name:<12} {c.status:<12} "
                    f"{c.replay or '-':<7} {c.action}"
                )
            waiting = [c for c in lp.tool_calls if c.action == "await_decision"]
            for c in lp.tool_calls:
                if c.process and c.process.get("alive"):
                    _line(
                        f"    {c.tool_call_id}: its process group {c.process['pgid']} is still "
                        "running (left by the crashed process); resume kills it first"
                    )
                elif c.process and c.process.get("host") and c.process.get("alive") is None:
                    print(
                        f"    {c.tool_call_id}: its process group {c.process['pgid']} was "
                        f"started on host {c.process['host']} and may still run there; retry "
                        f"is refused until it is killed there (or decide {c.tool_call_id}=retry!)"
                    )
            for c in waiting:
                _line(
                    f"    {c.tool_call_id} {c.tool_name} "
                    f"{TOOL_STATUS_TEXT.get(c.status, c.status)}, with arguments "
                    f"{_json_text(c.arguments or {})}: check its effect, then"
                )
                _line(
                    f"      durable-harness resume {plan.session_id} --decide "
                    f"{c.tool_call_id}=retry|fail|result:TEXT"
                )
        for q in lp.queued:
            _line(
                f"    queued {q.get('queue')} {_or_dash(q.get('itemId'))} "
                "(delivered exactly once on resume)"
            )
    for d in plan.damage:
        _line(f"  damage: {d['kind']} at {damage_location(d)}: {d['detail']}")


@command(
    "recover",
    "Print the recovery plan of a session (runs nothing).",
    "  durable-harness recover SESSION\n"
    "  durable-harness recover SESSION --policy retry-safe --json",
)
def cmd_recover(args: argparse.Namespace) -> int:
    """Print the recovery plan; nothing runs."""
    with _open(args) as s:
        plan = recover(s.store, builtin_tools(), policy=args.policy)
    if args.json:
        out(plan.to_json())
    else:
        print_plan(plan)
    return 0


@command(
    "resume",
    "Apply the recovery plan and continue interrupted runs to their end.",
    "  durable-harness resume SESSION\n"
    "  durable-harness resume SESSION --decide call_ab12_2_1=fail\n"
    "  durable-harness resume SESSION --decide call_ab12_2_1='result:deployed (checked by hand)'",
)
def cmd_resume(args: argparse.Namespace) -> int:
    """Apply decisions, resume interrupted runs, and print each lane's outcome."""
    decisions = dict(parse_decision(d) for d in args.decide)
    if args.provider:
        require_credentials(args.provider)
    provider = make_provider(args.provider, price_of(args)) if args.provider else None
    session = _open(args, write=True, durability=args.durability)
    with session:
        if args.lane is not None:
            _require_lane(session, args.lane)
        if not args.provider:  # the runs resume with their recorded provider: its key is needed
            for lane in [args.lane] if args.lane else sorted(session.store.lanes()):
                choice = resumed_provider(session, lane)
                if session.lane(lane).run_id is not None and choice is not None:
                    require_credentials(choice.spec)
        tools = builtin_tools(allow_env=args.allow_env)

        async def go() -> dict[str, str]:
            rec = await plan_recovery(session.store, tools, args.policy, decisions, session.cwd)
            if not args.quiet and not args.json:
                print_plan(rec.plan)
            return await resume_session(
                session,
                tools,
                provider=provider,
                decisions=decisions,
                policy=args.policy,
                lanes=[args.lane] if args.lane else None,
                recovery=rec,
                price=price_of(args),
            )

        results: dict[str, str] = run_async(go)
        after = recover(session.store, tools, policy=args.policy)
    if args.json:
        out({"results": results, "plan": after.to_json()})
    else:
        for lane, outcome in results.items():
            _line(f"lane {lane}: {outcome}")
    worst = max((EXIT.get(o, 1) for o in results.values()), default=0)
    return worst


@command(
    "crash-points",
    "List the named crash points (DURABLE_HARNESS_CRASH_AT=POINT[:N]).",
    "  durable-harness crash-points\n"
    "  DURABLE_HARNESS_CRASH_AT=after_tool_started durable-harness run 'deploy' "
    "--provider scripted:script.json",
)
def cmd_crash_points(args: argparse.Namespace) -> int:
    """List the named crash points with one line each."""
    if args.json:
        out(crash.CRASH_POINTS)
        return 0
    for name, desc in crash.CRASH_POINTS.items():
        _line(f"{name:<32} {desc}")
    return 0


@command(
    "demo",
    "The main job: a run killed mid-tool, recovered, resumed; then a pi import.",
    "  durable-harness demo\n  durable-harness demo --dir /tmp/dh-demo --store sqlite:demo.db",
)
def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo (see :mod:`durable_harness.demo`)."""
    from durable_harness.demo import run_demo

    return run_demo(args.dir, getattr(args, "store", None))


@command(
    "crash-test",
    "Run the crash matrix: every scenario at every crash point it reaches.",
    "  durable-harness crash-test --jobs 2\n"
    "  durable-harness crash-test --backend sqlite --scenario single_tool --report matrix.md",
)
def cmd_crash_test(args: argparse.Namespace) -> int:
    """Run the crash matrix (see :mod:`durable_harness.crashtest`)."""
    from durable_harness.crashtest import run_cli

    return run_cli(args)


@command(
    "fork",
    "Fork a new session holding the path up to an entry (ids kept; the original is untouched).",
    "  durable-harness fork SESSION                        # the whole current branch of main\n"
    "  durable-harness fork SESSION --entry 9f2c1a0b --before   # try that turn again\n"
    "  durable-harness fork ~/.pi/agent/sessions/x.jsonl --cwd ~/other-project",
)
def cmd_fork(args: argparse.Namespace) -> int:
    """Fork a session at an entry (default: the lane's leaf) into a new session of the store;
    print the new session's id."""
    with _open(args) as s:
        entry = args.entry
        if entry is None:
            _require_lane(s, args.lane)
            entry = s.leaf(args.lane)
            if entry is None:
                raise UnknownEntry(
                    f"lane {args.lane} of session {s.id} has no entries: nothing to fork",
                    lane=args.lane,
                )
        target = store_of(args, create=True)
        new = s.fork(
            target,
            entry,
            position="before" if args.before else "at",
            cwd=os.path.abspath(args.cwd) if args.cwd else None,
        )
        with new:
            info = {
                "session_id": new.id,
                "parent_session": s.id,
                "entry": entry,
                "position": "before" if args.before else "at",
                "entries": new.store.entry_count(),
                "location": new.store.location,
            }
    if args.json:
        out(info)
    else:
        at = f"{'before' if args.before else 'at'} entry {_or_dash(entry)}"
        _line(f"forked session {s.id} {at} as session {new.id} ({info['entries']} entries)")
    return 0


from durable_harness.cli import host_commands  # noqa: E402,F401  (registers serve, acp, migrate)
