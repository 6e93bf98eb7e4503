"""The run timeline: a session's operation log laid out on a time axis, drawn on the server
as an inline SVG by ``timeline.html`` (``design/console.md``, "The run timeline": the rows, the
crash as a gap, the piecewise axis).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from durable_harness.harness.report import summarize_record
from durable_harness.host.read_model import parse_ts
from durable_harness.recovery.explain import clock

WIDTH = 960
"""Width of the drawing, in pixels."""
GUTTER = 110
"""Width of the row labels on the left, in pixels."""
ROW_H = 18
"""Height of one row, in pixels."""
AXIS_H = 34
"""Height of the time axis under the rows, in pixels."""
GAP_W = 56
"""Width a crash or a quiet stretch is drawn with, whatever its length, in pixels."""
MIN_SEGMENT_W = 24
"""Narrowest width of an active stretch of time, in pixels."""
QUIET_S = 2.0
"""A stretch without records longer than this (seconds) is drawn compressed."""
ROWS = ("run", "provider", "tools", "marks")
"""The rows of one lane, top to bottom."""
CHAR_W = 6.2
"""Width of one character of a bar label or tick (10 px monospace, ``console.css``), pixels:
a label is cut to what fits its bar, so no label overflows or overlaps another."""
ROW_CHAR_W = 6.8
"""Width of one character of a row label (11 px monospace), pixels."""

_MARKS = {
    "queue_enqueued": "queue",
    "queue_consumed": "queue-consumed",
    "queue_cancelled": "queue-cancelled",
    "save_point": "save-point",
    "abort_requested": "abort",
    "decision": "decision",
    "tool_process": "process",
    "tool_process_killed": "process",
    "session_lifecycle": "lifecycle",
    "write_deferred": "deferred",
}


def fmt_duration(seconds: float) -> str:
    """A short human duration: ``812 ms``, ``3.4 s``, ``5 min 12 s``, ``2 h 03 min``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


@dataclass
class Shape:
    """One drawn thing: a bar (``w`` > 0) or a mark (``w`` == 0) at pixel ``x``, ``y``, of
    ``kind`` ``run``, ``provider``, ``tool``, ``gap`` or a mark kind, with CSS classes ``cls``."""

    kind: str
    cls: str
    x: float
    y: float
    w: float
    h: float
    title: str
    label: str = ""


@dataclass
class Tick:
    """A label on the time axis centred at pixel ``x``; ``line`` 0 (the gaps' lengths) or 1
    (times since the first record); ``title``: the full text when ``text`` was cut."""

    x: float
    text: str
    line: int = 1
    title: str = ""


def fit(text: str, width: float, char_w: float = CHAR_W) -> str:
    """``text`` cut (with ``…``) to fit ``width`` pixels of ``char_w``-wide characters; ``""``
    when not even one character and the ellipsis fit."""
    room = int(width // char_w)
    if len(text) <= room:
        return text
    return text[: room - 1] + "…" if room >= 2 else ""


def _place(ticks: list[Tick], tick: Tick, right: float) -> bool:
    """Add ``tick`` to ``ticks`` unless its text would overlap one on its line or leave the
    drawing (``right``: the last usable pixel)."""
    half = len(tick.text) * CHAR_W / 2
    tick.x = min(max(tick.x, GUTTER + half), right - half)
    for other in ticks:
        if (
            other.line == tick.line
            and abs(other.x - tick.x) < half + len(other.text) * CHAR_W / 2 + 4
        ):
            return False
    ticks.append(tick)
    return True


@dataclass
class Timeline:
    """What ``timeline.html`` draws: the size, row labels ``(y, text)``, shapes, axis ticks;
    ``empty`` when no record has a timestamp."""

    width: int
    height: int
    rows: list[tuple[float, str]] = field(default_factory=list)
    shapes: list[Shape] = field(default_factory=list)
    ticks: list[Tick] = field(default_factory=list)
    empty: bool = False
    notes: list[str] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[Shape]:
        """The shapes of one kind, in drawing order."""
        return [s for s in self.shapes if s.kind == kind]


@dataclass
class _Span:
    kind: str
    lane: str
    start: float
    end: float | None
    cls: str
    title: str
    label: str = ""
    key: Any = None
    doubt: bool = False


class _Axis:
    """A piecewise-linear map from time (seconds) to x (pixels), with gaps of fixed width."""

    def __init__(self, times: list[float], crashes: list[tuple[float, float]], left: float):
        times = sorted(set(times))
        breaks: list[tuple[float, float, str]] = [(a, b, "crash") for a, b in crashes if b > a]
        for a, b in itertools.pairwise(times):
            if b - a > QUIET_S and not any(ca <= a and b <= cb for ca, cb, _ in breaks):
                breaks.append((a, b, "quiet"))
        breaks.sort()
        self.t0, self.t1 = times[0], times[-1]
        # the active stretches between the breaks
        segments: list[tuple[float, float]] = []
        cursor = self.t0
        for a, b, _ in breaks:
            segments.append((cursor, max(cursor, a)))
            cursor = max(cursor, b)
        segments.append((cursor, max(cursor, self.t1)))
        total = sum(b - a for a, b in segments) or 1.0
        avail = WIDTH - left - 10 - GAP_W * len(breaks)
        widths = [max(MIN_SEGMENT_W, avail * (b - a) / total) for a, b in segments]
        scale = min(1.0, avail / sum(widths)) if widths else 1.0
        widths = [w * scale for w in widths]
        # pieces: (t_start, t_end, x_start, x_end)
        self.pieces: list[tuple[float, float, float, float]] = []
        x = left
        for i, (a, b) in enumerate(segments):
            self.pieces.append((a, b, x, x + widths[i]))
            x += widths[i]
            if i < len(breaks):
                ba, bb, _kind = breaks[i]
                self.pieces.append((ba, bb, x, x + GAP_W))
                x += GAP_W
        self.breaks = breaks
        self.segments = segments

    def x(self, t: float) -> float:
        for a, b, xa, xb in self.pieces:
            if t <= b:
                if t <= a or b == a:
                    return xa if t <= a else xb
                return xa + (xb - xa) * (t - a) / (b - a)
        return self.pieces[-1][3]


def build_timeline(
    records: Iterable[Mapping[str, Any]], *, live: bool, now: float | None = None
) -> Timeline:
    """Lay out ``records`` (the operation log of one session, every lane, ``seq`` order).

    Args:
        records: records as :meth:`SessionStore.records` returns them.
        live: whether a generation runs now; when not, anything still open at the end ends in
            a crash gap up to ``now`` (seconds since the epoch).

    Returns: a :class:`Timeline`; records without a parseable ``timestamp`` are skipped.
    """
    spans: list[_Span] = []
    marks: list[tuple[str, float, str, str]] = []  # (lane, t, kind, title)
    crashes: list[tuple[float, float]] = []
    open_runs: dict[str, _Span] = {}
    open_req: dict[tuple[Any, ...], _Span] = {}
    open_tools: dict[tuple[Any, ...], _Span] = {}
    lanes: list[str] = []
    times: list[float] = []
    last_t: float | None = None
    decided: dict[Any, str] = {}  # run id -> timestamp of its latest decision record
    notes: list[str] = []

    def settle(
        opened: dict[Any, _Span], key: Any, kind: str, lane: str, t: float, title: str = ""
    ) -> _Span:
        """End at ``t`` the span open under ``key`` (one with no start seen begins there)."""
        span = opened.pop(key, None)
        if span is None:
            span = _Span(kind, lane, t, None, kind, title)
            spans.append(span)
        span.end = t
        return span

    def crash(at: float) -> None:
        """The generation died at ``at``: its tool intents are in doubt, its requests end."""
        for span in open_tools.values():
            span.doubt = True
        for span in open_req.values():
            span.end = at
            span.cls += " interrupted"
            span.title += ", interrupted by the crash"
        open_req.clear()

    def lane_of(rec: Mapping[str, Any]) -> str:
        lane = str(rec.get("lane") or "main")
        if lane not in lanes:
            lanes.append(lane)
        return lane

    for rec in records:
        t = parse_ts(rec.get("timestamp"))
        if t is None:
            continue
        rtype = str(rec.get("type"))
        lane = lane_of(rec)
        run = rec.get("runId")
        if rtype == "session_lifecycle" and rec.get("state") == "idle" and last_t is not None:
            still_open = [*open_runs.values(), *open_req.values(), *open_tools.values()]
            if still_open:
                crashes.append((last_t, t))
                crash(last_t)
        times.append(t)
        if rtype == "run_started":
            span = _Span(
                "run", lane, t, None, "run", f"run {run} on lane {lane}", label=_short(run)
            )
            open_runs[lane] = span
            spans.append(span)
        elif rtype == "run_finished":
            outcome = str(rec.get("outcome") or "?")
            span = settle(open_runs, lane, "run", lane, t, f"run {run}")
            span.cls = f"run outcome-{outcome}"
            reason = f" ({rec.get('reason')})" if rec.get("reason") else ""
            span.title += f": {outcome}{reason}"
            if run in decided:  # finished after an operator's decision: the page says so
                at = clock(str(rec.get("timestamp")))
                span.label = f"run {outcome} {at}"
                notes.append(
                    f"run {_short(run)} on lane {lane}: {outcome} {at}, after the decision "
                    f"at {clock(decided[run])}"
                )
        elif rtype == "provider_request_started":
            purpose = rec.get("purpose") or "turn"
            key: tuple[Any, ...] = (run, purpose, rec.get("turn"), rec.get("attempt"))
            span = _Span(
                "provider",
                lane,
                t,
                None,
                "provider",
                f"{purpose} {rec.get('turn')} attempt {rec.get('attempt')} "
                f"({rec.get('provider')}/{rec.get('model')})",
                label=f"a{rec.get('attempt')}" if (rec.get("attempt") or 1) > 1 else "",
            )
            open_req[key] = span
            spans.append(span)
        elif rtype in ("provider_request_finished", "provider_request_failed"):
            key = (run, rec.get("purpose") or "turn", rec.get("turn"), rec.get("attempt"))
            span = settle(open_req, key, "provider", lane, t)
            if rtype == "provider_request_failed":
                span.cls = "provider failed"
                retry = "retryable" if rec.get("retryable") else "not retryable"
                span.title += f": failed ({rec.get('status')}, {retry}): {rec.get('error')}"
        elif rtype == "tool_started":
            key = (run, rec.get("callKey"))
            prior = open_tools.pop(key, None)
            if prior is not None:  # a new attempt of an unsettled call: the old one ends here
                prior.end = t
            span = _Span(
                "tool",
                lane,
                t,
                None,
                "tool",
                f"{rec.get('toolName')} {rec.get('toolCallId')} attempt {rec.get('attempt')} "
                f"(replay {rec.get('replay')}, key {rec.get('idempotencyKey')})",
                label=str(rec.get("toolName") or ""),
                key=rec.get("toolCallId"),
            )
            open_tools[key] = span
            spans.append(span)
        elif rtype == "tool_finished":
            key = (run, rec.get("callKey"))
            span = settle(open_tools, key, "tool", lane, t)
            span.cls = f"tool outcome-{rec.get('outcome') or 'ok'}"
            span.title += f": {rec.get('outcome')}"
        if rtype == "decision":
            decided[run] = str(rec.get("timestamp"))
        if rtype in _MARKS:
            marks.append((lane, t, _MARKS[rtype], _mark_title(rtype, rec)))
        last_t = t

    if not times:
        return Timeline(WIDTH, ROW_H * len(ROWS) + AXIS_H, empty=True)
    end = times[-1]
    anything_open = bool(open_runs or open_req or open_tools)
    if not live and anything_open and now is not None and now > end:
        crashes.append((end, now))
        crash(end)
        times.append(now)
        end = now
    axis = _Axis(times, crashes, GUTTER)
    tl = Timeline(WIDTH, ROW_H * len(ROWS) * len(lanes) + AXIS_H, notes=notes)
    top = {lane: i * ROW_H * len(ROWS) for i, lane in enumerate(lanes)}
    for lane in lanes:
        for r, name in enumerate(ROWS):
            room = GUTTER - 8 - len(f" · {name}") * ROW_CHAR_W
            label = f"{fit(lane, room, ROW_CHAR_W) or '…'} · {name}"
            tl.rows.append((top[lane] + r * ROW_H + ROW_H * 0.7, label))
    axis_y = ROW_H * len(ROWS) * len(lanes)
    for a, b, kind in axis.breaks:
        xa, xb = axis.x(a), axis.x(b)
        what = "crash: no live writer" if kind == "crash" else "quiet"
        tl.shapes.append(
            Shape("gap", f"gap {kind}", xa, 0, xb - xa, axis_y, f"{what} for {fmt_duration(b - a)}")
        )
        full = f"⟂ {fmt_duration(b - a)}"
        for text in (full, f"⟂ {_compact(b - a)}", "⟂"):
            if _place(tl.ticks, Tick((xa + xb) / 2, text, 0, full), WIDTH - 10):
                break
    for span in spans:
        row = {"run": 0, "provider": 1, "tool": 2}[span.kind]
        stop = span.end if span.end is not None else end
        xa, xb = axis.x(span.start), axis.x(stop)
        cls = span.cls
        title = f"{span.title} · {fmt_duration(max(0.0, stop - span.start))}"
        if span.end is None:
            cls += " open"
            title += " (still open)"
        if span.doubt:
            cls = "tool in-doubt" if span.end is None else f"{cls} in-doubt"
            title += " · in doubt: the generation that ran it ended before it was settled"
        tl.shapes.append(
            Shape(
                span.kind,
                cls,
                xa,
                top[span.lane] + row * ROW_H + 3,
                max(2.0, xb - xa),
                ROW_H - 6,
                title,
                fit(span.label, max(2.0, xb - xa) - 6),
            )
        )
    for lane, t, kind, title in marks:
        tl.shapes.append(
            Shape(kind, f"mark {kind}", axis.x(t), top[lane] + 3 * ROW_H + 3, 0, ROW_H - 6, title)
        )
    t0 = axis.t0
    for t in [a for a, _b in axis.segments] + [end]:
        _place(tl.ticks, Tick(axis.x(t), f"+{fmt_duration(t - t0)}"), WIDTH - 10)
    return tl


def _compact(seconds: float) -> str:
    """A duration in at most five characters: ``812ms``, ``3s``, ``5m``, ``2h``, ``3d``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size:.0f}{unit}"
    return f"{seconds:.0f}s" if seconds >= 1 else f"{seconds * 1000:.0f}ms"


def _short(value: Any) -> str:
    text = str(value or "")
    return text[-8:]


def _mark_title(rtype: str, rec: Mapping[str, Any]) -> str:
    """A mark's tooltip: the record's one-line summary (as ``durable-harness log``) and time."""
    if rtype == "session_lifecycle":
        detail = f"{rec.get('state')} (generation {rec.get('generation')})"
    else:
        detail = summarize_record(dict(rec))
    return (
        f"{rtype} {detail} at {rec.get('timestamp')}"
        if detail
        else f"{rtype} at {rec.get('timestamp')}"
    )
