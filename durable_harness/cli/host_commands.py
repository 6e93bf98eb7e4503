"""The host's commands: ``serve`` (HTTP API and console), ``acp`` and ``migrate``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durable_harness.cli import observability
from durable_harness.cli.common import (
    builtin,
    command,
    durability_option,
    json_option,
    mcp_config_of,
    mcp_option,
    out,
    parse_duration,
    policy_option,
    price_of,
    price_option,
    run_async,
    store_of,
    store_spec,
)
from durable_harness.errors import InvalidRequest
from durable_harness.providers import make_provider, require_credentials
from durable_harness.storage import open_store

SECRET_ENV = "DURABLE_HARNESS_NOTIFY_SECRET"
"""Where ``serve`` reads the notices' signing secret without ``--notify-secret``."""

if TYPE_CHECKING:
    from durable_harness.host.options import HostOptions, NotifyOptions


def _root_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--root",
        action="append",
        metavar="DIR",
        help="a directory tree new sessions may run in (repeatable; real paths compared, "
        "design/host.md 'Roots'); without it any directory is allowed",
    )


def _window(text: str) -> tuple[int, int]:
    """A pty window size ``ROWSxCOLUMNS`` (argparse type), e.g. ``24x80``."""
    rows, _, columns = text.lower().partition("x")
    if not (rows.isdigit() and columns.isdigit() and 0 < int(rows) < 65536 > int(columns) > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a window size ROWSxCOLUMNS (24x80)")
    return int(rows), int(columns)


def _seconds(text: str) -> float:
    """A non-negative number of seconds (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative number of seconds")
    return value


def _at_least_one(text: str) -> int:
    """A whole number >= 1 (argparse type)."""
    if not (text.isdigit() and int(text) >= 1):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def _host_options(args: argparse.Namespace, front: str, **extra: Any) -> HostOptions:
    """The host options ``serve`` and ``acp`` take from their command line (``--root``: real
    paths, ``None`` without any), once stderr has said where sessions may run.

    Raises:
        InvalidRequest: a ``--root`` that is not an existing directory, naming it.
        FormatError: a malformed ``--price``.
    """
    from durable_harness.host.options import HostOptions

    roots = tuple(Path(os.path.realpath(Path(text).expanduser())) for text in args.root or ())
    for text, real in zip(args.root or (), roots, strict=True):
        if not real.is_dir():
            raise InvalidRequest(f"--root {text!r} is not an existing directory", root=text)
    options = HostOptions(
        provider=args.provider,
        price=price_of(args),
        mode=args.durability,
        policy=args.policy,
        roots=roots or None,
        observers=observability.observers(),  # the traces OTEL_* asks for
        **extra,
    )
    if not roots:
        observability.announce(
            "%s sessions may be created in any directory (confine them with --root DIR)", front
        )
    else:
        shown = ", ".join(str(root) for root in roots)
        observability.announce(
            "%s sessions may run only under %s", front, shown, roots=[str(r) for r in roots]
        )
    return options


def _mcp_tools(args: argparse.Namespace, options: HostOptions) -> None:
    """Give ``options`` the MCP servers of ``--mcp`` (held open by the manager, their tools
    added to every session's): ``design/mcp.md``."""
    config = mcp_config_of(args)
    if config is None:
        return
    from durable_harness.tools.mcp import McpServers

    servers = McpServers(config)
    options.tools, options.mcp = servers.compose(options.tools), servers


def _serve_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback)")
    p.add_argument("--port", type=int, default=8421, help="port (0: a free one; default 8421)")
    p.add_argument("--provider", help="provider of sessions created without one")
    price_option(p)
    durability_option(
        "durability mode of sessions created without one (default sync; --mode is its old, "
        "deprecated name)",
        alias=True,
    )(p)
    policy_option(
        "in-doubt tool calls on resume: ask (wait for a decision through the API), "
        "retry-safe, fail-in-doubt",
    )(p)
    p.add_argument(
        "--auto-resume",
        choices=("no_decision", "never"),
        default="no_decision",
        help="at start-up, resume crashed sessions whose plan needs no decision (default), "
        "or leave all suspended",
    )
    p.add_argument(
        "--resume-concurrency",
        type=_at_least_one,
        metavar="N",
        help="start-up resumes run in the background once serving, N at a time (default: "
        "HostOptions.resume_concurrency, 8; design/host.md)",
    )
    p.add_argument(
        "--claim-interval",
        type=_seconds,
        metavar="SECONDS",
        help="on a PostgreSQL store, seconds between two rounds of claiming the sessions of "
        "crashed workers (also one at start-up; 0: never claim; default: "
        "HostOptions.claim_interval, 5; design/host.md)",
    )
    p.add_argument(
        "--close-grace",
        type=_seconds,
        metavar="SECONDS",
        help="seconds a closing session's running tools get between SIGTERM and SIGKILL; "
        "close returns within about SECONDS + 2 (default: HostOptions.close_grace, 5)",
    )
    p.add_argument(
        "--token",
        help="bearer token every request must carry (default: $DURABLE_HARNESS_TOKEN); "
        "required off loopback",
    )
    p.add_argument(
        "--control-ports",
        action="store_true",
        help="give each live session its own loopback control port (/agent/send, status, "
        "abort, messages; the port is in .../agent/status)",
    )
    p.add_argument(
        "--pty-size",
        type=_window,
        metavar="ROWSxCOLUMNS",
        help="the window size of the pty runtime's terminals (default 24x80)",
    )
    _root_option(p)
    mcp_option(p)
    _notify_options(p)


def _notify_options(p: argparse.ArgumentParser) -> None:
    """``serve``'s notices and decision timeout (design/notify.md)."""
    p.add_argument(
        "--notify",
        action="append",
        metavar="URL",
        help="POST a signed JSON notice to URL when a call waits for a decision, is decided, "
        "a session enters error, a run ends after a crash recovery (repeatable; also "
        "`notify` in durable-harness.toml; slack+https://... for a Slack webhook body)",
    )
    p.add_argument(
        "--notify-secret",
        metavar="SECRET",
        help="HMAC-SHA256 key of the notices' X-Durable-Harness-Signature header "
        f"(default: ${SECRET_ENV}; without one notices are unsigned)",
    )
    p.add_argument(
        "--public-url",
        metavar="URL",
        help="the console's base URL in notices' links (default: the address served on)",
    )
    p.add_argument(
        "--decision-timeout",
        type=parse_duration,
        metavar="DURATION",
        help="how long a call may wait for a decision, from its intent (90s, 15m, 1h...); "
        "what then: --on-timeout",
    )
    p.add_argument(
        "--on-timeout",
        choices=("keep", "fail"),
        default="keep",
        help="past --decision-timeout: keep waiting (default), or decide the call fail "
        "(author policy:timeout)",
    )


def notify_options(args: argparse.Namespace) -> NotifyOptions | None:
    """The :class:`NotifyOptions` of ``serve``'s command line, or ``None`` (nothing asked).

    Raises:
        InvalidRequest: a ``--notify`` URL that is not ``http(s)://`` (or ``slack+`` one).
    """
    from durable_harness.host.options import NotifyOptions

    notify = NotifyOptions(
        urls=tuple(args.notify or ()),
        secret=args.notify_secret or os.environ.get(SECRET_ENV) or None,
        public_url=args.public_url,
        wait_for_url=args.public_url is None,
        decision_timeout=args.decision_timeout,
        on_timeout=args.on_timeout,
    )
    for url in notify.urls:
        bare = url.removeprefix("slack+")
        if not bare.startswith(("http://", "https://")):
            raise InvalidRequest(
                f"--notify {url[:200]!r} is not an http(s) URL (slack+https://... for Slack)",
                url=url[:200],
            )
    if not notify.active():
        return None
    if notify.urls and notify.secret is None:
        observability.announce(
            "notices are sent unsigned (give --notify-secret or $%s)", SECRET_ENV
        )
    return notify


@command("serve", _serve_options)
def serve(args: argparse.Namespace) -> int:
    """Serve the store's sessions over HTTP (see design/http.md).

    example:
      durable-harness serve --port 8421 --provider anthropic:claude-sonnet-4-5
      DURABLE_HARNESS_TOKEN=s3cret durable-harness serve --host 0.0.0.0 --store sqlite:h.db
      durable-harness serve --root ~/projects --root /srv/agents
    """
    from durable_harness.console import console_router, is_console_path
    from durable_harness.http import create_app
    from durable_harness.http import serve as serve_http
    from durable_harness.http.control import control_endpoint
    from durable_harness.http.server import require_token

    token = args.token or os.environ.get("DURABLE_HARNESS_TOKEN") or None
    require_token(args.host, token)  # before the store is opened: a refusal creates nothing
    control = control_endpoint(token=token) if args.control_ports else None
    options = _host_options(args, "API", auto_resume=args.auto_resume, control=control)
    if args.claim_interval is not None:
        options.claim_interval = args.claim_interval or None
    if args.close_grace is not None:
        options.close_grace = args.close_grace
    if args.resume_concurrency is not None:
        options.resume_concurrency = args.resume_concurrency
    if args.pty_size is not None:
        size = args.pty_size
        options.tools = lambda runtime: builtin(runtime=runtime, pty_size=size)
    _mcp_tools(args, options)
    options.notify = notify = notify_options(args)
    app = create_app(
        store=store_of(args, create=True),
        options=options,
        token=token,
        own_auth=is_console_path,
        loopback_hosts_only=token is None,  # a tokenless server is loopback: DNS rebinding
    )
    app.include_router(console_router(lambda: app.state.manager, token=token))

    def announce(url: str) -> None:
        if notify is not None and notify.public_url is None:
            notify.public_url = url  # links name the address served on
        print(f"durable-harness serving on {url}", flush=True)

    serve_http(app, args.host, args.port, token=token, announce=announce)
    return 0


def _acp_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--provider",
        required=True,
        help="scripted:FILE, openai:MODEL or anthropic:MODEL (for new sessions)",
    )
    price_option(p)
    policy_option(
        "in-doubt tool calls after a crash: ask (put them to the client as a permission "
        "request), retry-safe or fail-in-doubt (decide without asking)",
    )(p)
    durability_option("of new sessions")(p)
    _root_option(p)
    mcp_option(p)


@command("acp", _acp_options)
def acp(args: argparse.Namespace) -> int:
    """Serve the Agent Client Protocol on stdin/stdout (for editors and ACP clients).

    example:
      durable-harness acp --provider anthropic:claude-sonnet-4-5
      durable-harness acp --provider scripted:script.json --store sqlite:sessions.db
    """
    from durable_harness.acp import serve as serve_acp

    require_credentials(args.provider)
    make_provider(args.provider)
    # an editor's agent serves its client's sessions; claiming crashed workers' sessions is
    # for `serve` (design/host.md, "Workers")
    options = _host_options(args, "ACP", claim_interval=None)
    _mcp_tools(args, options)
    run_async(serve_acp, store_of(args, create=True), options)
    return 0


@command("migrate", json_option)
def migrate(args: argparse.Namespace) -> int:
    """Apply the store's pending schema migrations (PostgreSQL and SQLite; also applied at
    start).

    Prints the versions applied; a JSONL store has no schema. Opening a store for writing
    applies the same migrations: this is for operators who upgrade before the workers.

    example:
      durable-harness migrate --store postgresql://agent@db.internal/agents
      durable-harness migrate --store sqlite:agent.db --json
    """
    spec = store_spec(args)
    if spec.startswith(("postgresql://", "postgres://")):
        from durable_harness.storage.postgres import migrate_spec

        result = migrate_spec(spec)
    else:  # SqliteStore migrates when it opens; a JSONL store has nothing to apply
        store = open_store(spec or None, create=True)
        applied: list[int] | None = None if spec.startswith("sqlite:") else []
        result = {"store": store.spec, "applied": applied, "version": None}
    if args.json:
        out(result)
    else:
        applied = result["applied"]
        done = "applied migration(s) " + ", ".join(str(v) for v in applied or ())
        if not applied:
            done = "migrated" if applied is None else "up to date"
        version = "" if result["version"] is None else f" (schema version {result['version']})"
        print(f"{result['store']}: {done}{version}")
    return 0
