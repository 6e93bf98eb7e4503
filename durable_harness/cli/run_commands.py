"""The commands that run, plan or break runs: ``run``, ``recover``, ``resume``,
``crash-points``, ``demo`` and ``crash-test`` (``design/cli.md``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from durable_harness import crash
from durable_harness import terminal as ui
from durable_harness.cli import common, observability
from durable_harness.cli.common import (
    command,
    json_option,
    json_text,
    line,
    or_dash,
    out,
    price_of,
    run_async,
)
from durable_harness.errors import FormatError, SessionNotFound
from durable_harness.models.content import text_of
from durable_harness.providers import make_provider, provider_spec, require_credentials
from durable_harness.recovery.decide import RecoveryPlan
from durable_harness.recovery.fsck import damage_location
from durable_harness.recovery.resume import (
    parse_decision,
    plan_recovery,
    resume_session,
    resumed_provider,
)
from durable_harness.recovery.resume import (
    recover as plan_of,
)
from durable_harness.session import Session

EXIT = {"completed": 0, "failed": 1, "aborted": 3, "declined": 4, "suspended": 5, "idle": 0}
"""The exit status of a run's outcome (``main.EXIT_STATUS_HELP``)."""

TOOL_STATUS_TEXT = {
    "not_started": "not started",
    "in_doubt": "started, outcome unknown",
    "completed": "completed",
}
"""How a tool call's recovery status reads for a person (never "ran")."""


def _running_options(lane_default: str | None, lane_help: str) -> Callable[..., None]:
    """The options ``run`` and ``resume`` share (``--lane`` differs)."""

    def add(p: argparse.ArgumentParser) -> None:
        p.add_argument("--provider", help="scripted:FILE, openai:MODEL or anthropic:MODEL")
        common.price_option(p)
        common.durability_option("sync: fsync each commit; batch: share fsyncs; none: never fsync")(
            p
        )
        p.add_argument("--lane", default=lane_default, help=lane_help)
        p.add_argument("--quiet", action="store_true", help="print only the outcome")
        common.mcp_option(p)
        p.add_argument(
            "--allow-env",
            action="append",
            default=[],
            metavar="NAME",
            help="let bash inherit this credential-like variable (*_KEY, *_TOKEN, *_SECRET, "
            "*PASSWORD*; removed by default); a name or shell pattern, repeatable",
        )

    return add


_policy_option = common.policy_option(
    "in-doubt tool calls: ask (wait for a decision), retry-safe (never wait; fail what cannot "
    "be re-run or reconciled), fail-in-doubt (fail every in-doubt call, re-running nothing)"
)


def _printer(quiet: bool) -> Callable[[dict[str, Any]], None]:
    """The harness listener that streams a run to the terminal (nothing when ``quiet``)."""

    def on_event(e: dict[str, Any]) -> None:
        if quiet:
            return
        t = e["type"]
        if t == "turn_start":
            line(flush=True)
            ui.say(f"--- turn {e['turn']} ---", "bold")
        elif t == "message_update" and "delta" in e:
            line(e["delta"], multiline=True, end="", flush=True)
        elif t == "message_end":
            line(flush=True)
        elif t == "provider_request_end" and e.get("outcome") == "error":
            # the text printed so far was no answer: say so, so a retry's is not read as its end
            line(flush=True)
            again = "; retrying" if e.get("retryable") else ""
            ui.say(f"  [attempt {e.get('attempt')} failed: {e.get('error')}{again}]", "yellow")
        elif t == "tool_execution_start":
            ui.say_parts(("  [tool] ", "cyan"), f"{e['toolName']} {json_text(e['arguments'])}")
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


def _fan_out(*callbacks: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """One event callback calling each of ``callbacks`` in turn."""
    if len(callbacks) == 1:
        return callbacks[0]

    def each(event: dict[str, Any]) -> None:
        for callback in callbacks:
            callback(event)

    return each


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--session", help="continue this session (default: a new one)")
    p.add_argument(
        "--continue",
        dest="continue_recent",
        action="store_true",
        help="continue the most recent session of the working directory (a new one if it has none)",
    )
    p.add_argument("--cwd", default=None, help="working directory (default: current)")
    p.add_argument("--steer", action="append", default=[], help="queue a steering message")
    p.add_argument("--follow-up", action="append", default=[], help="queue a follow-up message")


@command(
    "run",
    _running_options("main", "lane to run on"),
    _run_options,
    json_option,
    exits=common.RUN_EXITS,
)
def run(args: argparse.Namespace) -> int:
    """Run a prompt to its end, streaming to the terminal.

    The exit status reflects the outcome; the provider and its key are checked first. With
    ``--json`` nothing streams: one object at the end (``design/cli.md``, "Output").

    example:
      durable-harness run 'fix the failing test' --provider anthropic:claude-sonnet-4-5
      OPENAI_BASE_URL=http://localhost:11434/v1 durable-harness run 'hi' --provider openai:qwen3
      durable-harness run 'and now the docs' --session 01a2f --provider scripted:script.json
    """
    # the harness is imported by the commands that run one: recover, crash-points and the
    # rest start without it (design/cli.md, "Start-up")
    from durable_harness.harness.harness import Harness, HarnessOptions

    if not args.provider:
        raise FormatError("run needs --provider (scripted:FILE, openai:MODEL or anthropic:MODEL)")
    require_credentials(args.provider)
    provider = make_provider(args.provider, price_of(args))
    mcp = common.mcp_config_of(args)  # a bad config is refused before anything is created
    store = common.store_of(args, create=True)
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
            line(f"no session of {cwd} to continue: starting a new one", file=sys.stderr)
    if args.session:
        session = common.open_named(args, write=True, durability=args.durability)
    else:
        session = Session(store.create_session(cwd, durability=args.durability))
    opts = HarnessOptions(provider_spec=provider_spec(args.provider))
    tool_cwd = tool_cwd or session.cwd or cwd

    ran: dict[str, Any] = {}

    async def go() -> str:
        builtin = common.builtin(allow_env=args.allow_env)
        async with (
            common.with_mcp(mcp, builtin, tool_cwd) as tools,
            Harness(session, provider, tools, cwd=tool_cwd, options=opts) as h,
        ):
            h.subscribe(_printer(args.quiet or args.json))
            for listener in observability.listeners(session.id):
                h.subscribe(listener)
            handle = await h.prompt(args.prompt, lane=args.lane)
            ran["run_id"] = handle.run_id
            for text in args.steer:
                await h.steer(text, lane=args.lane)
            for text in args.follow_up:
                await h.follow_up(text, lane=args.lane)
            outcome = await handle.wait()
            ran["awaiting"] = handle.awaiting
            return outcome

    with session:
        if not args.json and not observability.as_record(
            "session", f"session {session.id}", session_id=session.id
        ):
            line(f"session {session.id}", file=sys.stderr)
        outcome: str = run_async(go)
        done = session.store.records(args.lane, types=("run_finished",))
        reason = done[-1].get("reason") if done and outcome != "suspended" else None
        if args.json:
            out(
                {
                    "session_id": session.id,
                    "lane": args.lane,
                    "run_id": ran.get("run_id"),
                    "outcome": outcome,
                    "reason": reason,
                    "awaiting": ran.get("awaiting", []),
                    "text": last_answer(session, args.lane),
                }
            )
            return EXIT.get(outcome, 1)
        ids = {"session_id": session.id, "lane": args.lane, "run_id": ran.get("run_id")}
        if observability.as_record(
            "run_outcome", f"run {outcome}", outcome=outcome, reason=reason, **ids
        ):
            return EXIT.get(outcome, 1)
        if outcome == "failed":
            ui.say(f"run failed: {reason or 'see durable-harness log'}", "red", stderr=True)
    ui.say(f"run {outcome}", "green" if outcome == "completed" else "yellow", stderr=True)
    return EXIT.get(outcome, 1)


def last_answer(session: Session, lane: str) -> str | None:
    """The text of the last assistant message on ``lane``'s path (``None``: there is none)."""
    for message in reversed(session.context(lane=lane).messages):
        if message.get("role") == "assistant":
            return text_of(message.get("content"))
    return None


def _attempts_text(attempts: Any) -> str:
    """Provider attempts per counter (``{"turn 1": 2}``) as ``turn 1: 2``."""
    if not isinstance(attempts, dict) or not attempts:
        return "none"
    return ", ".join(f"{key}: {n}" for key, n in attempts.items())


def print_plan(plan: RecoveryPlan) -> None:
    """Print a recovery plan as a readable table."""
    line(f"session {plan.session_id}")
    if plan.lease:
        line(
            f"  lease held by live process {or_dash(plan.lease.get('pid'))}: "
            "nothing will be recovered"
        )
    for lp in plan.lanes:
        reason = f" ({lp.reason})" if lp.reason else ""
        line(
            f"  lane {lp.lane}: {lp.state}{reason}  run {lp.run_id or '-'}  next: {lp.next_action}"
        )
        if lp.abort_requested:
            line("    abort requested: the run settles as aborted, it is not resumed")
        if lp.last_run and lp.state == "idle":
            last = lp.last_run
            reason = f" ({last['reason']})" if last.get("reason") else ""
            line(
                f"    last run {last['run_id']}: {last['outcome']}{reason}; provider attempts "
                f"{_attempts_text(last.get('attempts'))}"
            )
        if lp.attempts:
            line(
                f"    provider attempts {_attempts_text(lp.attempts)} (cap {lp.attempt_cap} "
                f"per turn); {lp.cost_unknown_attempts} with unknown cost"
            )
        if boundary := lp.last_safe_boundary:
            line(f"    last safe boundary: seq {boundary['seq']} ({boundary['type']})")
        if lp.tool_calls:
            line(f"    {'tool call':<16} {'tool':<12} {'status':<12} {'replay':<7} action")
            for c in lp.tool_calls:
                line(
                    f"    {c.tool_call_id:<16} {c.tool_name:<12} {c.status:<12} "
                    f"{c.replay or '-':<7} {c.action}"
                )
            for c in lp.tool_calls:
                if c.process and c.kills_group:
                    line(
                        f"    {c.tool_call_id}: its process group {c.process['pgid']} is still "
                        "running (left by the crashed process); resume kills it first"
                    )
                elif c.process and c.process.get("host") and c.process.get("alive") is None:
                    print(
                        f"    {c.tool_call_id}: its process group {c.process['pgid']} was "
                        f"started on host {c.process['host']} and may still run there; retry "
                        f"is refused until it is killed there (or decide {c.tool_call_id}=retry!)"
                    )
            for c in lp.tool_calls:
                if c.action != "await_decision":
                    continue
                line(
                    f"    {c.tool_call_id} {c.tool_name} "
                    f"{TOOL_STATUS_TEXT.get(c.status, c.status)}, with arguments "
                    f"{json_text(c.arguments or {})}: check its effect, then"
                )
                line(
                    f"      durable-harness resume {plan.session_id} --decide "
                    f"{c.tool_call_id}=retry|fail|result:TEXT"
                )
        for q in lp.queued:
            line(
                f"    queued {q.get('queue')} {or_dash(q.get('itemId'))} "
                "(delivered exactly once on resume)"
            )
    for d in plan.damage:
        line(f"  damage: {d['kind']} at {damage_location(d)}: {d['detail']}")


@command("recover", common.session_argument, json_option, _policy_option, common.mcp_option)
def recover(args: argparse.Namespace) -> int:
    """Print the recovery plan of a session (runs nothing).

    example:
      durable-harness recover SESSION
      durable-harness recover SESSION --policy retry-safe --json
    """
    mcp = common.mcp_config_of(args)
    with common.open_named(args) as s:

        async def declared() -> dict[str, Any]:  # today's declarations, then disconnected
            recorded = s.store.records(types=("tool_started",)) if mcp else ()
            async with common.with_mcp(mcp, common.builtin(), s.cwd, recorded) as tools:
                return tools

        plan = plan_of(s.store, run_async(declared), policy=args.policy)
    if args.json:
        out(plan.to_json())
    else:
        print_plan(plan)
    return 0


def _decide_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--decide",
        action="append",
        default=[],
        metavar="ID=DECISION",
        help="TOOL_CALL_ID=retry|retry!|fail|result:TEXT (repeatable): retry runs the call "
        "again, retry! even when its process group was recorded on another machine and may "
        "still run there, fail settles it as failed, result:TEXT settles it with TEXT",
    )


def _resume_target(p: argparse.ArgumentParser) -> None:
    p.add_argument("session", nargs="?", help="session id, unique id prefix, or session file path")
    p.add_argument(
        "--latest",
        action="store_true",
        help="the most recently modified session of the working directory (instead of SESSION)",
    )
    p.add_argument(
        "-r",
        "--pick",
        action="store_true",
        help="on a terminal, pick one of the working directory's sessions from a list (state, "
        "calls waiting, name or first prompt, age; waiting ones first)",
    )


def chosen_session(args: argparse.Namespace) -> None:
    """Set ``args.session`` from ``--latest`` (the working directory's most recent session, by
    :meth:`~durable_harness.storage.base.Store.most_recent`, the rule ``run --continue`` uses)
    or ``-r`` (:func:`~durable_harness.cli.picker.pick_session`).

    Raises:
        FormatError: not exactly one of SESSION, ``--latest``, ``-r``; ``-r`` off a terminal.
        SessionNotFound: the directory has no session.
    """
    if [bool(args.session), args.latest, args.pick].count(True) != 1:
        raise FormatError("resume needs one of SESSION, --latest or -r")
    if args.pick:
        from durable_harness.cli.picker import pick_session

        args.session = pick_session(common.store_of(args), os.path.abspath(os.getcwd()))
    elif args.latest:
        cwd = os.path.abspath(os.getcwd())
        recent = common.store_of(args).most_recent(cwd)
        if recent is None:
            raise SessionNotFound(
                f"no session of {cwd} in {common.store_spec(args) or 'the default store'}",
                cwd=cwd,
            )
        args.session = recent.id


@command(
    "resume",
    _resume_target,
    _running_options(None, "only this lane"),
    _policy_option,
    _decide_option,
    json_option,
    exits=(
        (0, "every lane's run completed, or had nothing to resume"),
        *[
            (code, f"{meaning} (the worst lane's outcome)")
            for code, meaning in common.RUN_EXITS[1:]
        ],
    ),
)
def resume(args: argparse.Namespace) -> int:
    """Apply the recovery plan and continue interrupted runs to their end.

    Prints each lane's outcome; a run resumes with ``--provider``, else its recorded one.

    example:
      durable-harness resume SESSION
      durable-harness resume --latest      # this directory's most recent session
      durable-harness resume -r            # pick one of this directory's sessions
      durable-harness resume SESSION --decide call_ab12_2_1=fail
      durable-harness resume SESSION --decide call_ab12_2_1='result:deployed (checked by hand)'
    """
    chosen_session(args)
    # who decided, on the record (design/notify.md): the notices and the log name the door
    decisions = {key: {**d, "author": "cli"} for key, d in map(parse_decision, args.decide)}
    if args.provider:
        require_credentials(args.provider)
    provider = make_provider(args.provider, price_of(args)) if args.provider else None
    with common.open_named(args, write=True, durability=args.durability) as session:
        if args.lane is not None:
            common.require_lane(session, args.lane)
        if not args.provider:  # the runs resume with their recorded provider: its key is needed
            for lane in [args.lane] if args.lane else sorted(session.store.lanes()):
                choice = resumed_provider(session, lane)
                if session.lane(lane).run_id is not None and choice is not None:
                    require_credentials(choice.spec)
        builtin = common.builtin(allow_env=args.allow_env)
        mcp = common.mcp_config_of(args)
        recorded = session.store.records(types=("tool_started",)) if mcp else ()
        tools: dict[str, Any] = dict(builtin)

        async def go() -> dict[str, str]:
            async with common.with_mcp(mcp, builtin, session.cwd, recorded) as live:
                tools.update(live)  # the plan after the resume reads today's declarations
                return await resumed(live)

        async def resumed(tools: dict[str, Any]) -> dict[str, str]:
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
                on_event=_fan_out(
                    _printer(args.quiet or args.json), *observability.listeners(session.id)
                ),
            )

        results: dict[str, str] = run_async(go)
        after = plan_of(session.store, tools, policy=args.policy)
        for lane, outcome in results.items():  # JSON log format only: stdout says it too
            observability.as_record(
                "resume",
                f"session {session.id}: lane {lane}: {outcome}",
                session_id=session.id,
                lane=lane,
                outcome=outcome,
            )
    if args.json:
        out({"results": results, "plan": after.to_json()})
    else:
        for lane, outcome in results.items():
            line(f"lane {lane}: {outcome}")
    return max((EXIT.get(o, 1) for o in results.values()), default=0)


EXAMPLE_CRASH_POINTS = (
    "  durable-harness crash-points\n  DURABLE_HARNESS_CRASH_AT=after_tool_started "
    "durable-harness run 'deploy' --provider scripted:script.json"
)


@command("crash-points", json_option, example=EXAMPLE_CRASH_POINTS)
def crash_points(args: argparse.Namespace) -> int:
    """List the named crash points (DURABLE_HARNESS_CRASH_AT=POINT[:N])."""
    if args.json:
        out(crash.CRASH_POINTS)
        return 0
    for name, desc in crash.CRASH_POINTS.items():
        line(f"{name:<32} {desc}")
    return 0


@command(
    "demo",
    lambda p: p.add_argument("--dir", help="scratch folder (default: a new temporary one)"),
    exits=((0, "the demo ran as described"), (1, "a step did not go as the demo expects")),
)
def demo(args: argparse.Namespace) -> int:
    """The main job: a run killed mid-tool, recovered, resumed; then a pi import.

    example:
      durable-harness demo
      durable-harness demo --dir /tmp/dh-demo --store sqlite:demo.db
    """
    from durable_harness.demo import run_demo

    return run_demo(args.dir, getattr(args, "store", None))


def _crash_test_options(p: argparse.ArgumentParser) -> None:
    from durable_harness.crashtest import configure_parser

    configure_parser(p)


@command(
    "crash-test",
    _crash_test_options,
    exits=((0, "every cell passed"), (1, "a cell failed (the report names it)")),
)
def crash_test(args: argparse.Namespace) -> int:
    """Run the crash matrix: every scenario at every crash point it reaches.

    example:
      durable-harness crash-test
      durable-harness crash-test --backend sqlite --scenario single_tool --report matrix.md
    """
    from durable_harness.crashtest import run_cli

    return run_cli(args)
