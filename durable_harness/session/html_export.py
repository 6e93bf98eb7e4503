"""Export a session as one self-contained HTML page: the tree, the transcript of a lane's
context, and the run timeline (``design/pi.md``, "HTML"), as pi's ``export_html`` gives a page
for a pi session. No script, no external resource: every value is HTML-escaped text, images are
``data:`` URIs, so the page is safe to open from anywhere and to mail.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from durable_harness.fs import atomic_write
from durable_harness.harness.report import timeline
from durable_harness.session.session import Session, TreeNode

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;display:flex;color:#1d1f23;background:#fafafa}
nav{width:30%;max-width:420px;height:100vh;overflow:auto;position:sticky;top:0;
background:#f0f1f4;padding:12px;box-sizing:border-box;border-right:1px solid #ddd}
main{flex:1;padding:16px 24px;max-width:900px}
nav ul{list-style:none;padding-left:10px;margin:2px 0;border-left:1px dotted #bbb}
nav li{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
nav a{color:inherit;text-decoration:none}.path>a{font-weight:600}.leaf>a{color:#b3261e}
.label{background:#ffe08a;border-radius:3px;padding:0 3px;font-size:12px}
.msg{border-radius:6px;padding:8px 12px;margin:10px 0;background:#fff;border:1px solid #e3e3e3}
.user{border-left:4px solid #3a6ee8}.assistant{border-left:4px solid #2e9d57}
.toolResult{border-left:4px solid #8a8f98;background:#f6f7f9}.error{border-left-color:#b3261e}
.summary{border-left:4px solid #c58b00}.role{font-size:12px;color:#666;margin-bottom:4px}
pre{white-space:pre-wrap;word-break:break-word;margin:4px 0;font:13px/1.4 ui-monospace,monospace}
.thinking{color:#666;font-style:italic}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
img{max-width:100%}
"""


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _describe(entry: dict[str, Any]) -> str:
    """A short line for the tree: the entry type, or role and start of the text."""
    kind = str(entry.get("type"))
    if kind != "message":
        extra = entry.get("label") or entry.get("modelId") or entry.get("thinkingLevel") or ""
        return f"{kind} {extra}".strip()
    msg = entry.get("message") or {}
    text = " ".join(
        str(b.get("text") or b.get("name") or "")
        for b in msg.get("content") or []
        if isinstance(b, dict)
    )
    if isinstance(msg.get("content"), str):
        text = msg["content"]
    return f"{msg.get('role')}: {' '.join(text.split())[:60]}"


def _tree(nodes: list[TreeNode], on_path: set[str], leaf: str | None) -> str:
    """The tree as nested lists: a chain of single children stays at one level (as pi's tree
    view draws it); a branch point opens one nested list per child. An explicit stack, so a
    deep session does not recurse."""
    parts: list[str] = []
    # stack items: a node to draw, or the closing markup left for after its subtree
    stack: list[TreeNode | str] = ["</ul>", *reversed(nodes)]
    parts.append("<ul>")
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            parts.append(item)
            continue
        eid = str(item.entry.get("id"))
        cls = "leaf" if eid == leaf else "path" if eid in on_path else ""
        label = f'<span class="label">{_esc(item.label)}</span> ' if item.label else ""
        parts.append(
            f'<li class="{cls}">{label}<a href="#e-{_esc(eid)}" title="{_esc(eid)}">'
            f"{_esc(_describe(item.entry))}</a>"
        )
        if len(item.children) == 1:
            parts.append("</li>")
            stack.append(item.children[0])
        elif item.children:
            later: list[TreeNode | str] = ["</li>"]
            for child in reversed(item.children):
                later += ["</ul>", child, "<ul>"]
            stack += later
        else:
            parts.append("</li>")
    return "".join(parts)


def _blocks(content: Any) -> str:
    if isinstance(content, str):
        return f"<pre>{_esc(content)}</pre>"
    out = []
    for b in content or []:
        if not isinstance(b, dict):
            continue
        kind = b.get("type")
        if kind == "text":
            out.append(f"<pre>{_esc(b.get('text', ''))}</pre>")
        elif kind == "thinking":
            out.append(f'<pre class="thinking">{_esc(b.get("thinking", ""))}</pre>')
        elif kind == "toolCall":
            args = json.dumps(b.get("arguments"), ensure_ascii=False, indent=1)
            out.append(
                f"<div>&rarr; <b>{_esc(b.get('name'))}</b> <code>{_esc(b.get('id'))}</code>"
                f"<pre>{_esc(args)}</pre></div>"
            )
        elif kind == "image":
            src = f"data:{_esc(b.get('mimeType'))};base64,{_esc(b.get('data'))}"
            out.append(f'<img alt="image" src="{src}">')
    return "".join(out)


def _message(entry: dict[str, Any]) -> str:
    """One path entry in the transcript ('' for entries that carry no conversation)."""
    eid = _esc(entry.get("id"))
    kind = entry.get("type")
    if kind in ("compaction", "branch_summary"):
        return (
            f'<div class="msg summary" id="e-{eid}"><div class="role">{_esc(kind)}</div>'
            f"<pre>{_esc(entry.get('summary', ''))}</pre></div>"
        )
    if kind == "custom_message":
        return (
            f'<div class="msg user" id="e-{eid}"><div class="role">custom '
            f"{_esc(entry.get('customType'))}</div>{_blocks(entry.get('content'))}</div>"
        )
    if kind in ("model_change", "thinking_level_change"):
        what = entry.get("modelId") or entry.get("thinkingLevel")
        return f'<div class="role" id="e-{eid}">{_esc(kind)}: {_esc(what)}</div>'
    if kind != "message":
        return ""
    msg = entry.get("message") or {}
    role = str(msg.get("role"))
    err = " error" if msg.get("isError") or msg.get("stopReason") in ("error", "aborted") else ""
    meta = [role]
    if role == "assistant":
        meta += [str(msg.get("model") or ""), str(msg.get("stopReason") or "")]
        usage = msg.get("usage") or {}
        if usage:
            meta.append(f"{usage.get('input', 0)} in / {usage.get('output', 0)} out")
    if role == "toolResult":
        meta.append(f"{msg.get('toolName')} {msg.get('toolCallId')}")
    body = _blocks(msg.get("content"))
    if msg.get("errorMessage"):
        body += f"<pre>{_esc(msg['errorMessage'])}</pre>"
    return (
        f'<div class="msg {_esc(role)}{err}" id="e-{eid}"><div class="role">'
        f"{_esc(' · '.join(m for m in meta if m))}</div>{body}</div>"
    )


def _timeline(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p>No runs recorded (the operation log is empty).</p>"
    head = (
        "<tr><th>seq</th><th>time</th><th>lane</th><th>run</th><th>type</th><th>summary</th></tr>"
    )
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{_esc(r.get(k) if r.get(k) is not None else '-')}</td>"
            for k in ("seq", "timestamp", "lane", "runId", "type", "summary")
        )
        + "</tr>"
        for r in rows
    )
    return f"<table>{head}{body}</table>"


def session_html(session: Session, lane: str = "main") -> str:
    """The page for ``session`` seen from ``lane``: the whole tree (the lane's path in bold,
    its leaf in red, labels shown), the transcript of the path from the root to the leaf, and
    the operation log's timeline."""
    leaf = session.leaf(lane)
    path = session.path(leaf)
    on_path = {str(e.get("id")) for e in path}
    title = session.title or session.id
    return (
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
        f"<title>{_esc(title)}</title><style>{STYLE}</style></head><body>"
        f"<nav><h3>Tree</h3>{_tree(session.tree(), on_path, leaf)}</nav>"
        f"<main><h1>{_esc(title)}</h1><p>session <code>{_esc(session.id)}</code> · cwd "
        f"<code>{_esc(session.cwd)}</code> · lane <code>{_esc(lane)}</code> · leaf "
        f"<code>{_esc(leaf)}</code></p><h2>Transcript</h2>"
        + "".join(_message(e) for e in path)
        + f"<h2>Run timeline</h2>{_timeline(timeline(session.store))}</main></body></html>\n"
    )


def export_html(session: Session, path: str, lane: str = "main") -> int:
    """Write :func:`session_html` to ``path`` atomically; return its size in bytes.

    Raises:
        OSError: the file cannot be written.
    """
    data = session_html(session, lane).encode()
    atomic_write(Path(path), data)
    return len(data)
