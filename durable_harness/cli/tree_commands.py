"""The commands that edit a session's tree or remove sessions: ``label``, ``name``,
``navigate``, ``branch-summary``, ``forget`` and ``prune`` (``design/cli.md``, "Tree verbs and
removal"). Each is a thin call of a :class:`~durable_harness.session.Session` verb, the
harness's navigation, or the host's forget rule (``durable_harness.host.forget``)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from durable_harness.cli import common
from durable_harness.cli.common import (
    catalogue_time,
    command,
    json_option,
    line,
    open_named,
    out,
    parse_duration,
    require_lane,
    resolve_entry,
    run_async,
    session_argument,
    store_of,
)
from durable_harness.errors import DurableHarnessError, FormatError
from durable_harness.host.forget import forget_stored, stored_refusal


def _lane_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lane", default="main", help="the lane whose leaf moves (default: main)")


def _entry_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "entry",
        help="entry id (from `show --tree`; a unique prefix is enough: its first 8 characters)",
    )


def _label_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", nargs="?", default=None, help="the label (omit it to clear)")


@command("label", session_argument, _entry_argument, _label_options, json_option)
def label(args: argparse.Namespace) -> int:
    """Label an entry of the session's tree, as pi's /tree does (no TEXT: clear its label).

    example:
      durable-harness label SESSION 9f2c1a0b 'before the refactor'
      durable-harness label SESSION 9f2c1a0b        # clear it
    """
    with open_named(args, write=True) as s:
        args.entry = resolve_entry(s, args.entry)
        entry = s.set_label(args.entry, args.text or None)
    return _report(args, entry, f"labelled {args.entry}: {args.text or '(cleared)'}")


def _name_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", help="the session's display name")


@command("name", session_argument, _name_options, json_option)
def name(args: argparse.Namespace) -> int:
    """Name the session (`sessions` and `show` list it by this name).

    example:
      durable-harness name SESSION 'nightly dependency bumps'
    """
    with open_named(args, write=True) as s:
        entry = s.set_name(args.text)
    return _report(args, entry, f"named session {s.id}: {args.text}")


@command("navigate", session_argument, _entry_argument, _lane_option, json_option)
def navigate(args: argparse.Namespace) -> int:
    """Move a lane's leaf to an entry, durably: the next prompt continues from there.

    A lane with an interrupted run is refused (recover and resume it first).

    example:
      durable-harness navigate SESSION 9f2c1a0b
    """
    with open_named(args, write=True) as s:
        require_lane(s, args.lane)
        s.check_no_open_run(args.lane)
        args.entry = resolve_entry(s, args.entry)
        left = s.leaf(args.lane)
        s.navigate(args.entry, lane=args.lane)
    info = {"session_id": s.id, "lane": args.lane, "from": left, "leaf": args.entry}
    if args.json:
        out(info)
    else:
        line(f"lane {args.lane} of session {s.id}: leaf {left or '-'} -> {args.entry}")
    return 0


def _summary_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--provider", help="the model that writes the summary (default: the lane's recorded one)"
    )
    common.price_option(p)


@command(
    "branch-summary",
    session_argument,
    _entry_argument,
    _lane_option,
    _summary_options,
    json_option,
)
def branch_summary(args: argparse.Namespace) -> int:
    """Leave the current branch for an entry, summarising the branch being left (pi's
    branchWithSummary): the summary is a provider request under the intent rules.

    example:
      durable-harness branch-summary SESSION 9f2c1a0b --provider anthropic:claude-sonnet-4-5
    """
    from durable_harness.harness.harness import Harness
    from durable_harness.providers import make_provider, require_credentials
    from durable_harness.recovery.resume import resumed_provider

    with open_named(args, write=True) as s:
        require_lane(s, args.lane)
        s.check_no_open_run(args.lane)
        args.entry = resolve_entry(s, args.entry)
        choice = resumed_provider(s, args.lane, args.provider)
        if choice is None:
            raise FormatError(
                f"lane {args.lane} of session {s.id} records no provider: give --provider"
            )
        require_credentials(choice.spec)
        provider = make_provider(choice.spec, common.price_of(args))

        async def go() -> dict[str, Any] | None:
            async with Harness(s, provider) as h:
                return await h.navigate(args.entry, lane=args.lane, summarize=True)

        entry = run_async(go)
    assert entry is not None
    return _report(args, entry, f"left the branch for {args.entry}: summary {entry['id']}")


def _report(args: argparse.Namespace, entry: dict[str, Any], text: str) -> int:
    """Print the entry a verb appended (``--json``) or ``text``; exit 0."""
    if args.json:
        out(entry)
    else:
        line(text)
    return 0


@command("forget", session_argument, json_option)
def forget(args: argparse.Namespace) -> int:
    """Delete a closed session for good (never a live, waiting or failed one: close it first).

    The host's rule (``design/host.md``, "Forget and prune"), the same as ``DELETE
    /sessions/{id}``.

    example:
      durable-harness forget 01a2f
    """
    store = store_of(args)
    session_id = store.resolve(args.session).id
    refusal = stored_refusal(store, session_id)
    if refusal is not None:
        raise refusal
    forget_stored(store, session_id)
    if args.json:
        out({"forgotten": [session_id]})
    else:
        line(f"forgot session {session_id}")
    return 0


def _prune_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--closed",
        action="store_true",
        required=True,
        help="forget closed sessions (the only kind prune removes; required, so that what is "
        "removed is spelt out)",
    )
    p.add_argument(
        "--older-than",
        required=True,
        metavar="DURATION",
        type=parse_duration,
        help="only sessions last modified longer ago than this (90s, 15m, 12h, 30d, 2w)",
    )
    p.add_argument("--cwd", help="only sessions of this working directory")
    p.add_argument("--dry-run", action="store_true", help="list what would go; delete nothing")


@command(
    "prune",
    _prune_options,
    json_option,
    exits=((0, "pruned (or, with --dry-run, listed)"), (1, "a session file cannot be read")),
)
def prune(args: argparse.Namespace) -> int:
    """Forget every closed session not modified for a while (never a live or waiting one).

    Each candidate is checked by the same rule as ``forget``; a session that is not closed, or
    that a live process holds, is kept and listed with the reason. Exit 1 when a session cannot
    be read.

    example:
      durable-harness prune --closed --older-than 30d --dry-run
      durable-harness prune --closed --older-than 2w --store sqlite:agent.db
    """
    store = store_of(args)
    cutoff = time.time() - args.older_than
    gone: list[str] = []
    kept: list[dict[str, Any]] = []
    unreadable = recent = not_closed = 0
    for info in store.list_sessions(args.cwd):
        if info.error is not None:
            unreadable += 1
            continue
        if catalogue_time(str(info.modified)).timestamp() > cutoff:
            recent += 1
            continue
        try:
            refusal = stored_refusal(store, info.id)
            if refusal is None and not args.dry_run:
                forget_stored(store, info.id)
        except DurableHarnessError as exc:
            refusal = exc
        if refusal is None:
            gone.append(info.id)
        elif refusal.code == "illegal_transition":  # not closed: not a candidate at all
            not_closed += 1
        else:
            kept.append({"session_id": info.id, "error": refusal.to_json()})
    skipped = {"newer": recent, "not_closed": not_closed, "unreadable": unreadable}
    if args.json:
        out({"forgotten": gone, "kept": kept, "skipped": skipped, "dry_run": args.dry_run})
    else:
        verb = "would forget" if args.dry_run else "forgot"
        for sid in gone:
            line(f"{verb} session {sid}")
        for k in kept:
            line(f"kept session {k['session_id']}: {k['error']['message']}")
        line(
            f"{verb} {len(gone)} session(s); kept {len(kept)} held by a process; skipped "
            f"{recent} newer than --older-than, {not_closed} not closed, {unreadable} unreadable"
        )
    return 1 if unreadable else 0


__all__ = ["branch_summary", "forget", "label", "name", "navigate", "prune"]
