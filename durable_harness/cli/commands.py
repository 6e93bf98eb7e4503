"""The subcommands of ``durable-harness`` (each registered with :func:`main.command`)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from durable_harness import crash
from durable_harness.cli.main import command, out, run_async, store_of
from durable_harness.errors import FormatError, SessionNotFound
from durable_harness.harness.harness import POLICIES, Harness, HarnessOptions
from durable_harness.harness.report import cost_report, timeline
from durable_harness.providers import make_provider, provider_spec
from durable_harness.recovery.plan import RecoveryPlan
from durable_harness.recovery.resume import parse_decision, recover, resume_session
from durable_harness.session import Session, import_pi_file, open_session
from durable_harness.session.context import context_text
from durable_harness.session.fsck import damage_location, fsck_path, fsck_session
from durable_harness.storage import DURABILITY_MODES
from durable_harness.tools.builtin import builtin_tools

EXIT = {"completed": 0, "failed": 1, "aborted": 3, "declined": 4, "suspended": 5, "idle": 0}


def configure(name: str, p: argparse.ArgumentParser) -> None:
    """Add the options of command ``name``."""
    if name in ("show", "context", "log", "cost", "recover", "resume"):
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
    ):
        p.add_argument("--json", action="store_true", help="print JSON")
    if name == "sessions":
        p.add_argument("--cwd", help="only sessions of this working directory")
    if name == "show":
        p.add_argument("--tree", action="store_true", help="print the whole tree")
    if name == "context":
        p.add_argument("--leaf", help="entry id to build from (default: the lane's leaf)")
        p.add_argument("--lane", default="main", help="lane whose leaf to use (default main)")
    if name == "fsck":
        p.add_argument(
            "path",
            help="a session id or unique id prefix (looked up in --store), a session file "
            "(ours or pi's), a JSONL store folder, or a SQLite store (PATH or sqlite:PATH)",
        )
    if name == "import":
        p.add_argument("file", help="a pi session file (format version 1, 2 or 3)")
    if name == "log":
        p.add_argument("--lane", help="only this lane")
    if name in ("run", "resume"):
        p.add_argument("--provider", help="scripted:FILE, openai:MODEL or anthropic:MODEL")
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
    if name == "run":
        p.add_argument("prompt", help="the prompt text")
        p.add_argument("--session", help="continue this session (default: a new one)")
        p.add_argument(
            "--continue",
            dest="continue_recent",
            action="store_true",
            help="continue the most recent session of the working directory",
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


def _open(args: argparse.Namespace, *, write: bool = False, durability: str = "sync") -> Session:
    return open_session(args.session, store_of(args), write=write, durability=durability)  # type: ignore[arg-type]


@command("sessions", "List sessions, most recent first.")
def cmd_sessions(args: argparse.Namespace) -> int:
    """List the sessions of the store (``--cwd`` narrows to one directory)."""
    infos = store_of(args).list_sessions(args.cwd)
    if args.json:
        out([vars(i) for i in infos])
        return 0
    for i in infos:
        print(f"{i.id}  {i.created}  {i.cwd}")
    if not infos:
        print("no sessions", file=sys.stderr)
    return 0


def _tree_lines(nodes: list[Any], depth: int, lines: list[str], leaves: dict[str, str]) -> None:
    for n in nodes:
        e = n.entry
        kind = e.get("type")
        if kind == "message":
            msg = e.get("message") or {}
            from durable_harness.models.messages import text_of

            calls = [
                b.get("name")
                for b in msg.get("content") or []
                if isinstance(b, dict) and b.get("type") == "toolCall"
            ]
            desc = f"{msg.get('role')}: {text_of(msg.get('content'))[:60]!r}"
            if calls:
                desc += f" -> {', '.join(str(c) for c in calls)}"
        else:
            desc = str(kind)
        marks = "".join(f" <{lane}>" for lane, leaf in leaves.items() if leaf == e["id"])
        label = f" [{n.label}]" if n.label else ""
        lines.append(f"{'  ' * depth}{e['id']} {desc}{label}{marks}")
        _tree_lines(n.children, depth + 1, lines, leaves)


@command("show", "Show a session: header, lanes, facts, damage (and the tree with --tree).")
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
        print(f"session {s.id}  ({s.store.location})")
        print(f"cwd {s.cwd}  name {s.name or '-'}  entries {info['entries']}")
        for lane, st in lanes.items():
            run = f" run {st['run_id']} open" if st["run_id"] else ""
            print(f"lane {lane}: leaf {st['leaf_id']}{run}")
        for d in s.damage:
            print(f"damage: {d['kind']} at {damage_location(d)}: {d['detail']}")
        if args.tree:
            lines: list[str] = []
            leaves = {k: v["leaf_id"] for k, v in lanes.items()}
            _tree_lines(s.tree(), 0, lines, leaves)
            print("\n".join(lines))
    return 0


@command(
    "context",
    "Print the provider context built from a leaf: exactly what the next request would carry.",
)
def cmd_context(args: argparse.Namespace) -> int:
    """Print the provider context built from a leaf (the lane's by default)."""
    with _open(args) as s:
        ctx = s.context(args.leaf, lane=args.lane)
        if args.json:
            out(ctx.messages)
        else:
            model = ctx.model or {}
            print(
                f"# model {model.get('provider')}/{model.get('modelId')} thinking "
                f"{ctx.thinking_level}"
            )
            print(context_text(ctx.messages))
    return 0


@command("fsck", "Check a session file or store; report damage with byte offsets.")
def cmd_fsck(args: argparse.Namespace) -> int:
    """Check a session (by id, or its file), a file or a store read-only; exit 1 when damage
    is found. A path that exists (or a ``jsonl:``/``sqlite:`` spec) is checked as given;
    anything else is a session id looked up in the store, as the other commands do."""
    target = str(args.path)
    spec = target.startswith(("jsonl:", "sqlite:"))
    if spec or os.path.exists(target):
        result = fsck_path(target)
    else:
        result = fsck_session(target, store_of(args))
    if args.json:
        out(result)
    else:
        print(
            f"{args.path}: {'ok' if result['ok'] else 'DAMAGED'} ({result['format']}, "
            f"{result['entries']} entries, {result['records']} records)"
        )
        for d in result["damage"]:
            print(f"  {d['kind']} at {damage_location(d)}: {d['detail']}")
        for f in result.get("files", []):
            print(f"  {f['path']}: {'ok' if f['ok'] else 'DAMAGED'}")
    return 0 if result["ok"] else 1


@command("import", "Import a pi session file as a new session (the file is not modified).")
def cmd_import(args: argparse.Namespace) -> int:
    """Import a pi session file as a new session of the store."""
    if not os.path.isfile(args.file):
        raise SessionNotFound(f"no file at {args.file}", path=args.file)
    store = store_of(args)
    sid = import_pi_file(args.file, store)
    if args.json:
        out({"session_id": sid, "store": store.spec})
    else:
        print(f"imported {args.file} as session {sid}")
    return 0


def _printer(quiet: bool) -> Any:
    def on_event(e: dict[str, Any]) -> None:
        if quiet:
            return
        t = e["type"]
        if t == "turn_start":
            print(f"\n--- turn {e['turn']} ---", flush=True)
        elif t == "message_update" and "delta" in e:
            print(e["delta"], end="", flush=True)
        elif t == "message_end":
            print(flush=True)
        elif t == "tool_execution_start":
            print(f"  [tool] {e['toolName']} {e['arguments']}", flush=True)
        elif t == "tool_execution_end":
            print(f"  [tool] {e['toolName']} -> {e['outcome']}", flush=True)
        elif t == "suspended":
            print(f"  [suspended] awaiting a decision on {', '.join(e['awaiting'])}", flush=True)

    return on_event


@command("run", "Run a prompt to its end, streaming to the terminal.")
def cmd_run(args: argparse.Namespace) -> int:
    """Run one prompt to its end, streaming events; the exit status reflects the outcome."""
    if not args.provider:
        raise FormatError("run needs --provider (scripted:FILE, openai:MODEL or anthropic:MODEL)")
    provider = make_provider(args.provider)
    store = store_of(args)
    cwd = os.path.abspath(args.cwd or os.getcwd())
    if args.continue_recent and not args.session:
        recent = store.most_recent(cwd)
        if recent is None:
            raise SessionNotFound(f"no session to continue for {cwd} in {store.spec}", cwd=cwd)
        args.session = recent.id
    if args.session:
        session = _open(args, write=True, durability=args.durability)
    else:
        session = Session(store.create_session(cwd, durability=args.durability))
    opts = HarnessOptions(provider_spec=provider_spec(args.provider))

    async def go() -> str:
        async with Harness(
            session, provider, builtin_tools(), cwd=session.cwd or cwd, options=opts
        ) as h:
            h.subscribe(_printer(args.quiet))
            handle = await h.prompt(args.prompt, lane=args.lane)
            for text in args.steer:
                await h.steer(text, lane=args.lane)
            for text in args.follow_up:
                await h.follow_up(text, lane=args.lane)
            return await handle.wait()

    with session:
        print(f"session {session.id}", file=sys.stderr)
        outcome: str = run_async(go)
        if outcome == "failed":
            done = session.store.records(args.lane, types=("run_finished",))
            reason = done[-1].get("reason") if done else None
            print(f"run failed: {reason or 'see durable-harness log'}", file=sys.stderr)
    print(f"run {outcome}", file=sys.stderr)
    return EXIT.get(outcome, 1)


@command("log", "Print the lane operation log as a timeline.")
def cmd_log(args: argparse.Namespace) -> int:
    """Print a session's operation log as a timeline."""
    with _open(args) as s:
        rows = timeline(s.store, args.lane)
    if args.json:
        out(rows)
        return 0
    for r in rows:
        run = (r["runId"] or "")[-8:]
        print(
            f"{r['seq']:>5}  {r['timestamp']}  {r['lane']:<6} {run:<8}  {r['type']:<26} "
            f"{r['summary']}"
        )
    return 0


@command("cost", "Print cost per turn, per run and for the session (USD).")
def cmd_cost(args: argparse.Namespace) -> int:
    """Print cost per turn, per run and for the session (USD, tokens)."""
    with _open(args) as s:
        report = cost_report(s.store)
    if args.json:
        out(report)
        return 0
    print(f"{'run':<10} {'turn':>4}  {'purpose':<14} {'tokens':>8}  cost (USD)")
    for t in report["turns"]:
        print(
            f"{str(t['run_id'])[-8:]:<10} {t['turn']!s:>4}  {t['purpose']:<14} "
            f"{t['tokens']:>8}  ${t['cost']:.6f}"
        )
    for r in report["runs"]:
        print(f"run {r['run_id']}: {r['turns']} turn(s), {r['tokens']} tokens, ${r['cost']:.6f}")
    print(f"session total: {report['total']['tokens']} tokens, ${report['total']['cost']:.6f}")
    if report["unknown_cost_attempts"]:
        print(f"plus {report['unknown_cost_attempts']} attempt(s) lost in a crash: cost unknown")
    return 0


def print_plan(plan: RecoveryPlan) -> None:
    """Print a recovery plan as a readable table."""
    print(f"session {plan.session_id}")
    if plan.lease:
        print(f"  lease held by live process {plan.lease.get('pid')}: nothing will be recovered")
    for lp in plan.lanes:
        reason = f" ({lp.reason})" if lp.reason else ""
        print(
            f"  lane {lp.lane}: {lp.state}{reason}  run {lp.run_id or '-'}  next: {lp.next_action}"
        )
        if lp.abort_requested:
            print("    abort requested: the run settles as aborted, it is not resumed")
        if lp.last_run and lp.state == "idle":
            last = lp.last_run
            reason = f" ({last['reason']})" if last.get("reason") else ""
            print(
                f"    last run {last['run_id']}: {last['outcome']}{reason}; provider attempts "
                f"per turn {last['attempts']}"
            )
        if lp.attempts:
            print(
                f"    provider attempts per turn {lp.attempts} (cap {lp.attempt_cap}); "
                f"{lp.cost_unknown_attempts} with unknown cost"
            )
        if lp.last_safe_boundary:
            print(
                f"    last safe boundary: seq {lp.last_safe_boundary['seq']} "
                f"({lp.last_safe_boundary['type']})"
            )
        if lp.tool_calls:
            print(f"    {'tool call':<16} {'tool':<12} {'status':<12} {'replay':<7} action")
            for c in lp.tool_calls:
                print(
                    f"    {c.tool_call_id:<16} {c.tool_name:<12} {c.status:<12} "
                    f"{c.replay or '-':<7} {c.action}"
                )
            waiting = [c for c in lp.tool_calls if c.action == "await_decision"]
            for c in lp.tool_calls:
                if c.process and c.process.get("alive"):
                    print(
                        f"    {c.tool_call_id}: its process group {c.process['pgid']} is still "
                        "running (left by the crashed process); resume kills it first"
                    )
            for c in waiting:
                print(f"    {c.tool_call_id} ran with {c.arguments}: check its effect, then")
                print(
                    f"      durable-harness resume {plan.session_id} --decide "
                    f"{c.tool_call_id}=retry|fail|result:TEXT"
                )
        for q in lp.queued:
            print(f"    queued {q['queue']} {q['itemId']} (delivered exactly once on resume)")
    for d in plan.damage:
        print(f"  damage: {d['kind']} at {damage_location(d)}: {d['detail']}")


@command("recover", "Print the recovery plan of a session (runs nothing).")
def cmd_recover(args: argparse.Namespace) -> int:
    """Print the recovery plan; nothing runs."""
    with _open(args) as s:
        plan = recover(s.store, builtin_tools(), policy=args.policy)
    if args.json:
        out(plan.to_json())
    else:
        print_plan(plan)
    return 0


@command("resume", "Apply the recovery plan and continue interrupted runs to their end.")
def cmd_resume(args: argparse.Namespace) -> int:
    """Apply decisions, resume interrupted runs, and print each lane's outcome."""
    decisions = dict(parse_decision(d) for d in args.decide)
    provider = make_provider(args.provider) if args.provider else None
    session = _open(args, write=True, durability=args.durability)
    with session:
        tools = builtin_tools()
        plan = recover(session.store, tools, policy=args.policy, decisions=decisions)
        if not args.quiet and not args.json:
            print_plan(plan)

        async def go() -> dict[str, str]:
            return await resume_session(
                session,
                tools,
                provider=provider,
                decisions=decisions,
                policy=args.policy,
                lanes=[args.lane] if args.lane else None,
            )

        results: dict[str, str] = run_async(go)
        after = recover(session.store, tools, policy=args.policy)
    if args.json:
        out({"results": results, "plan": after.to_json()})
    else:
        for lane, outcome in results.items():
            print(f"lane {lane}: {outcome}")
    worst = max((EXIT.get(o, 1) for o in results.values()), default=0)
    return worst


@command("crash-points", "List the named crash points (DURABLE_HARNESS_CRASH_AT=POINT[:N]).")
def cmd_crash_points(args: argparse.Namespace) -> int:
    """List the named crash points with one line each."""
    if args.json:
        out(crash.CRASH_POINTS)
        return 0
    for name, desc in crash.CRASH_POINTS.items():
        print(f"{name:<32} {desc}")
    return 0


@command("demo", "The main job: a run killed mid-tool, recovered, resumed; then a pi import.")
def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo (see :mod:`durable_harness.demo`)."""
    from durable_harness.demo import run_demo

    return run_demo(args.dir, getattr(args, "store", None))


@command("crash-test", "Run the crash matrix: every scenario at every crash point it reaches.")
def cmd_crash_test(args: argparse.Namespace) -> int:
    """Run the crash matrix (see :mod:`durable_harness.crashtest`)."""
    from durable_harness.crashtest import run_cli

    return run_cli(args)
