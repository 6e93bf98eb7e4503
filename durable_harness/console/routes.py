"""The console's routes: server-rendered pages over a :class:`SessionManager`
(``design/console.md``, "Mounting"). Every POST needs a valid ``csrf_token`` (403 before
anything is read or written); every route needs the bearer token when one is configured.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import anyio
import jinja2
import orjson
from fastapi import APIRouter
from fastapi.routing import APIRoute
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from durable_harness.console.security import CSRF_FIELD, SECURITY_HEADERS, Guard
from durable_harness.console.timeline import build_timeline, fmt_duration
from durable_harness.console.view import ago, transcript
from durable_harness.display import visible, visible_html
from durable_harness.errors import DurableHarnessError, SessionLive, SessionNotLive, encodable
from durable_harness.harness.report import format_cost
from durable_harness.host.lifecycle import LIVE, STATES
from durable_harness.http.errors import status_of
from durable_harness.http.streams import SLOTS, paced
from durable_harness.recovery import explain

if TYPE_CHECKING:
    from durable_harness.host.manager import SessionManager


HOOKS = {
    "missing": "the tool is not installed in this host",
    "unsure": "the reconcile hook could not tell whether the call took effect",
    "none": "the tool has no reconcile hook: nothing can check what happened",
}
"""Why a waiting call could not be settled, by :data:`~durable_harness.host.read_model.Hook`."""

NOTICES = {
    "sent": "Message accepted.",
    "aborted": "Abort requested.",
    "closed": "Session closed.",
    "resumed": "Session resumed.",
    "decided": "Decision recorded.",
    "killed": "Process group killed; the call stays without a result until decided.",
    "gone": "The process group had already ended.",
    "waiting": "Decision recorded; other calls still wait for a decision.",
}
"""The fixed notices a redirect may name (``?notice=``); anything else shows nothing."""

CLOSE_SUMMARY = (
    "Close this session: running turns are aborted, tool processes still running after the "
    "grace period are killed; the transcript is kept."
)
"""What the close confirmation says."""

DECIDE_SUMMARY = {
    "retry": "Run the call again (it may have taken effect already).",
    "retry!": "Run the call again although its process group may still run on another machine "
    "(it may run twice at once).",
    "fail": "Settle the call as failed: the model is told it did not complete.",
    "result": "Settle the call with the result text below, as if the tool had returned it.",
}
"""What each decision's confirmation says."""

STATIC = {"console.css": "text/css; charset=utf-8", "console.js": "text/javascript; charset=utf-8"}
"""The static files served under ``/console/static/``, with their media types."""

TIMELINE_RECORDS = 3000
"""The timeline draws at most this many of a session's latest records (the page stays small)."""

PAGE_SIZE = 100
"""Sessions per page of the list (each row reads its session's files for cost and activity)."""

LIST_PACE_S = 0.2
"""The least time between two ``update`` events of the list's stream (bursts coalesce)."""

LISTEN_POLL_S = 1.0
"""How often the event route checks whether a session without a live generation got one."""


class _SecureRoute(APIRoute):
    """A route whose every response carries :data:`SECURITY_HEADERS`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def secured(request: Request) -> Response:
            response = await handler(request)
            for name, value in SECURITY_HEADERS.items():
                response.headers.setdefault(name, value)
            return response

        return secured


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("durable_harness.console", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["ago"] = ago
    env.filters["money"] = lambda v: format_cost(v, 4)
    env.filters["duration"] = fmt_duration
    env.filters["q"] = lambda v: quote(str(v), safe="")
    # what the operator reads is what will run (design/console.md): session text in a page
    # goes through one of these; form values and URLs carry the exact string
    env.filters["visible"] = lambda v: Markup(visible_html(v, multiline=False))
    env.filters["visible_block"] = lambda v: Markup(visible_html(v, multiline=True))
    env.filters["visible_text"] = visible
    return env


def console_router(
    get_manager: Callable[[], SessionManager],
    *,
    token: str | None = None,
    csrf_secret: bytes | None = None,
) -> APIRouter:
    """Build the console's router.

    Args:
        get_manager: returns the running :class:`SessionManager` (called per request, so the
            router can be built before the app's lifespan enters the manager).
        token: the bearer token the server requires (``None``: none, a loopback bind).
        csrf_secret: the CSRF MAC key; random per process when ``None``
            (:class:`~durable_harness.console.security.Guard`).

    Returns: an :class:`APIRouter` (no middleware: it can be included in any FastAPI app).
    """
    router = APIRouter(route_class=_SecureRoute, include_in_schema=False)
    guard = Guard(token, csrf_secret)
    env = _environment()

    def render(request: Request, name: str, http_status: int = 200, **context: Any) -> HTMLResponse:
        csrf_id, new = guard.csrf_id(request)
        html = env.get_template(name).render(
            csrf_field=CSRF_FIELD, csrf=guard.csrf_token(csrf_id), **context
        )
        response = HTMLResponse(html, status_code=http_status)
        if new:
            guard.set_csrf_cookie(request, response, csrf_id)
        return response

    def unauthorized(request: Request, page: bool) -> Response:
        if page:
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse("/console/login?" + urlencode({"next": target}), 303)
        return Response("a bearer token is required", 401, {"WWW-Authenticate": "Bearer"})

    async def form_of(request: Request) -> dict[str, str] | Response:
        """The POST's form fields, or its refusal (401: no token; 403: no valid CSRF token)."""
        if not guard.authorized(request):
            return unauthorized(request, page=False)
        form = await request.form()
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        if not guard.csrf_ok(request, fields.get(CSRF_FIELD)):
            return render(
                request,
                "error.html",
                403,
                title="Refused",
                message="This form has no valid CSRF token (reload the page and try again).",
            )
        return fields

    def error_page(request: Request, exc: DurableHarnessError) -> HTMLResponse:
        # the API's one table of statuses, and what a remote caller may see of the error
        return render(
            request,
            "error.html",
            status_of(exc),
            title=exc.code,
            message=encodable(str(exc.to_remote_json()["message"])),
        )

    def back(session_id: str, notice: str) -> RedirectResponse:
        return RedirectResponse(
            f"/console/sessions/{quote(session_id, safe='')}?notice={notice}", 303
        )

    # -- pages --------------------------------------------------------------------------------

    async def list_context(state: str | None, cwd: str | None, page: int) -> dict[str, Any]:
        manager = get_manager()
        waiting = manager.awaiting_decisions()
        chosen = [
            rec
            for rec in await manager.list()  # most recently modified first
            if (not state or rec.state == state)
            and (not cwd or rec.cwd == cwd or rec.cwd.startswith(cwd.rstrip("/") + "/"))
        ]
        # sessions waiting for a decision first (stable: each group keeps its order)
        chosen.sort(key=lambda rec: 0 if waiting.get(rec.id) else 1)
        pages = max(1, -(-len(chosen) // PAGE_SIZE))
        page = min(max(1, page), pages)
        rows = []
        for rec in chosen[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]:
            try:
                view = manager.view(rec.id)
            except DurableHarnessError:
                continue
            rows.append(
                {
                    "rec": rec,
                    "title": view.title,
                    "cost": view.cost,
                    "last": view.last_activity,
                    "waiting": waiting.get(rec.id, 0),
                }
            )
        query = {k: v for k, v in (("state", state), ("cwd", cwd)) if v}
        return {
            "rows": rows,
            "states": STATES,
            "state": state or "",
            "cwd": cwd or "",
            "total": len(chosen),
            "page": page,
            "pages": pages,
            "prev_url": "/?" + urlencode({**query, "page": page - 1}) if page > 1 else "",
            "next_url": "/?" + urlencode({**query, "page": page + 1}) if page < pages else "",
            "fragment_url": "/console/list?" + urlencode({**query, "page": page}),
            "waiting_total": sum(1 for n in waiting.values() if n),
            "unreadable": manager.unreadable,
        }

    @router.get("/")
    async def sessions_list(
        request: Request, state: str | None = None, cwd: str | None = None, page: int = 1
    ) -> Response:
        if not guard.authorized(request):
            return unauthorized(request, page=True)
        return render(request, "list.html", **await list_context(state, cwd, page))

    @router.get("/console/list")
    async def sessions_fragment(
        request: Request, state: str | None = None, cwd: str | None = None, page: int = 1
    ) -> Response:
        if not guard.authorized(request):
            return unauthorized(request, page=False)
        return render(request, "rows.html", **await list_context(state, cwd, page))

    @router.get("/console/events")
    async def list_events(request: Request) -> Response:
        """Server-sent events for the list: one ``update`` per batch of state changes this
        host saw (:class:`~durable_harness.host.changes.Changes`; a reader holds one number,
        however slow it is)."""
        if not guard.authorized(request):
            return unauthorized(request, page=False)
        changes = get_manager().changes
        refused = SLOTS.refusal()
        if refused is not None:
            return refused

        async def stream() -> AsyncIterator[dict[str, Any]]:
            seen = changes.version
            yield {"event": "hello", "data": orjson.dumps({"version": seen}).decode()}
            while True:
                version = await changes.wait(seen)
                data = {"version": version, "sessions": changes.since(seen)[-50:]}
                seen = version
                yield {"event": "update", "data": orjson.dumps(data).decode()}
                await anyio.sleep(LIST_PACE_S)  # a burst of changes is one refresh

        return SLOTS.response(stream(), ping=15)

    async def session_context(
        request: Request, session_id: str, lane: str | None
    ) -> dict[str, Any]:
        detail = await get_manager().detail(session_id)
        view, rec, notice = detail.view, detail.record, request.query_params.get("notice", "")
        lane = lane if lane in view.lanes else "main"
        decisions = [
            {
                "lane": w.lane,
                "run_id": w.run_id,
                "call": w.call,
                "arguments": orjson.dumps(w.call.arguments, option=orjson.OPT_INDENT_2).decode(),
                "idempotency_key": w.idempotency_key,
                "reconcile": HOOKS[w.hook],
                "why": w.why,
                "started_at": w.started_at,
                "choices": w.choices,
            }
            for w in detail.waiting
        ]
        live = rec.state in LIVE
        return {
            "rec": rec,
            "title": view.title,
            "status": detail.status,
            "plan": detail.plan,
            "needs_decision": detail.needs_decision,
            "decisions": decisions,
            "lane": lane,
            "lanes": detail.status["lanes"],
            "items": transcript(view.paths.get(lane, []), view.entries),
            "running": detail.running,
            "cost": view.cost,
            "last": view.last_activity,
            "timeline": build_timeline(
                view.records[-TIMELINE_RECORDS:], live=live, now=time.time()
            ),
            "timeline_cut": max(0, len(view.records) - TIMELINE_RECORDS),
            "live": live,
            "resumable": detail.resumable,
            "notice": NOTICES.get(notice, ""),
            "notice_key": notice if notice in NOTICES else "",
        }

    async def session_view(
        request: Request, session_id: str, lane: str | None, template: str
    ) -> Response:
        if not guard.authorized(request):
            return unauthorized(request, page=template == "session.html")
        try:
            context = await session_context(request, session_id, lane)
        except DurableHarnessError as exc:
            return error_page(request, exc)
        return render(request, template, **context)

    @router.get("/console/sessions/{session_id}")
    async def session_page(request: Request, session_id: str, lane: str | None = None) -> Response:
        return await session_view(request, session_id, lane, "session.html")

    @router.get("/console/sessions/{session_id}/live")
    async def session_fragment(
        request: Request, session_id: str, lane: str | None = None
    ) -> Response:
        return await session_view(request, session_id, lane, "live.html")

    @router.get("/console/sessions/{session_id}/events")
    async def session_events(request: Request, session_id: str) -> Response:
        if not guard.authorized(request):
            return unauthorized(request, page=False)
        manager = get_manager()
        try:
            await manager.get(session_id)
        except DurableHarnessError as exc:
            return Response(encodable(str(exc.to_remote_json()["message"])), status_of(exc))
        refused = SLOTS.refusal()
        if refused is not None:
            return refused

        async def stream() -> AsyncIterator[dict[str, Any]]:
            yield {"event": "hello", "data": "{}", "retry": 2000}
            while True:
                try:
                    events = manager.listen(session_id)
                except (SessionNotLive, SessionLive):  # not live here (yet)
                    await anyio.sleep(LISTEN_POLL_S)
                    continue
                # subscribed: anything that happened before is fetched by this refresh
                yield {"event": "state", "data": '{"live": true}'}
                with events:  # one update per batch of events, paced (design/http.md, Events)
                    async for batch in paced(events):
                        event = batch[-1]
                        data = {
                            "type": event.get("type"),
                            "eventId": event.get("eventId"),
                            "generation": event.get("generation"),
                        }
                        yield {"event": "update", "data": orjson.dumps(data).decode()}
                yield {"event": "state", "data": '{"live": false}'}

        return SLOTS.response(stream(), ping=15)

    @router.get("/console/static/{name}")
    async def static(name: str) -> Response:
        media = STATIC.get(name)
        if media is None:
            return Response("not found", 404)
        body = resources.files("durable_harness.console").joinpath("static", name).read_bytes()
        return Response(body, media_type=media)

    # -- login and filters --------------------------------------------------------------------

    @router.get("/console/login")
    async def login_page(request: Request, next: str = "/") -> Response:
        return render(request, "login.html", next=_local(next), failed=False)

    @router.post("/console/login")
    async def login(request: Request) -> Response:
        form = await request.form()
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        if not guard.csrf_ok(request, fields.get(CSRF_FIELD)):
            return render(
                request, "error.html", 403, title="Refused", message="No valid CSRF token."
            )
        target = _local(fields.get("next", "/"))
        response: Response = RedirectResponse(target, 303)
        if not guard.login(request, response, fields.get("token", "")):
            return render(request, "login.html", 401, next=target, failed=True)
        return response

    @router.post("/console/filter")
    async def filter_list(request: Request) -> Response:
        fields = await form_of(request)
        if isinstance(fields, Response):
            return fields
        query = {k: fields[k] for k in ("state", "cwd") if fields.get(k)}
        return RedirectResponse("/" + (f"?{urlencode(query)}" if query else ""), 303)

    # -- actions ------------------------------------------------------------------------------

    Action = Callable[[Request, str, dict[str, str]], Awaitable[str | Response]]

    def action(verb: str) -> Callable[[Action], Action]:
        """Register a form action at ``/console/sessions/{id}/VERB``: the form checked, one
        verb of the manager, then back to the session page with the notice it returns (or
        the page it returns: a confirmation), or the error page."""

        def register(do: Action) -> Action:
            async def route(request: Request, session_id: str) -> Response:
                fields = await form_of(request)
                if isinstance(fields, Response):
                    return fields
                try:
                    notice = await do(request, session_id, fields)
                except DurableHarnessError as exc:
                    return error_page(request, exc)
                return notice if isinstance(notice, Response) else back(session_id, notice)

            router.add_api_route(
                f"/console/sessions/{{session_id}}/{verb}", route, methods=["POST"]
            )
            return do

        return register

    def confirm(
        request: Request, session_id: str, action: str, summary: str, **fields: str
    ) -> Response:
        return render(
            request,
            "confirm.html",
            session_id=session_id,
            action=action,
            summary=summary,
            fields=fields,
            button=f"Confirm {action}",
            call=None,
        )

    @action("send")
    async def send(request: Request, session_id: str, fields: dict[str, str]) -> str:
        await get_manager().send(
            session_id,
            fields.get("message", ""),
            mode=fields.get("mode", "prompt"),  # type: ignore[arg-type]  # refused there
            lane=fields.get("lane") or "main",
        )
        return "sent"

    @action("abort")
    async def abort(request: Request, session_id: str, fields: dict[str, str]) -> str:
        await get_manager().abort(session_id, fields.get("lane") or "main")
        return "aborted"

    @action("close")
    async def close(request: Request, session_id: str, fields: dict[str, str]) -> str | Response:
        if fields.get("confirmed") != "yes":
            return confirm(request, session_id, "close", CLOSE_SUMMARY)
        await get_manager().close(session_id)
        return "closed"

    @action("kill")
    async def kill(request: Request, session_id: str, fields: dict[str, str]) -> str:
        out = await get_manager().kill_tool(session_id, fields.get("tool_call_id", ""))
        return "killed" if out["killed"] else "gone"

    @action("resume")
    async def resume(request: Request, session_id: str, fields: dict[str, str]) -> str:
        await get_manager().resume(session_id)
        return "resumed"

    @action("decide")
    async def decide(request: Request, session_id: str, fields: dict[str, str]) -> str | Response:
        call, choice, call_id = (
            fields.get(k, "") for k in ("call_key", "decision", "tool_call_id")
        )
        if choice in DECIDE_SUMMARY and fields.get("confirmed") != "yes":
            kept = {"call_key": call, "tool_call_id": call_id, "decision": choice}
            kept["result"] = fields.get("result", "")
            detail = await get_manager().detail(session_id)
            waiting = next((w for w in detail.waiting if w.call.call_key == call), None)
            picked = explain.choice(waiting.call, choice) if waiting is not None else None
            if waiting is None or picked is None:  # decided meanwhile: the decide refuses
                what = f"{DECIDE_SUMMARY[choice]} Tool call {call_id} ({call})."
                return confirm(request, session_id, "decide", what, **kept)
            args = waiting.call.arguments or {}
            command = args.get("command") if isinstance(args.get("command"), str) else None
            return render(
                request,
                "confirm.html",
                session_id=session_id,
                action="decide",
                summary=f"{picked.summary} Tool call {call_id} ({call}).",
                fields=kept,
                button=picked.label,
                call={
                    "tool": waiting.call.tool_name,
                    "command": command,
                    # as recorded: the stored order of the keys, never sorted
                    "arguments": orjson.dumps(args, option=orjson.OPT_INDENT_2).decode(),
                    "cwd": detail.record.cwd,
                    "session": session_id,
                    "title": detail.view.title,
                    "lane": waiting.lane,
                    "why": waiting.why,
                },
            )
        # anything but a known choice is refused by the manager as malformed
        decision = "result:" + fields.get("result", "") if choice == "result" else choice
        rec = await get_manager().decide(session_id, call, decision or "(none)", author="console")
        return "waiting" if rec.state == "suspended" else "decided"

    return router


def is_console_path(path: str) -> bool:
    """Whether a request path is the console's (``/`` and ``/console/...``), which checks the
    bearer token itself (``design/console.md``, "Safety")."""
    return path == "/" or path == "/console" or path.startswith("/console/")


def _local(target: str) -> str:
    """``target`` if it is a root-relative path of this site, else ``/`` (no open redirect)."""
    if target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/"
