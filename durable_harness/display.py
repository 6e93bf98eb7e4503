"""Text from a session as a person is shown it: invisible and reordering characters escaped
as ``\\u{HEX}`` (the one rule of every door: ``design/cli.md``, "What the operator reads").
Display only: ``--json`` and the APIs carry the exact stored string."""

from __future__ import annotations

import html
import re
import unicodedata

_DEFAULT_IGNORABLE = (
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x061C, 0x061C),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
"""``Default_Ignorable_Code_Point`` ranges (Unicode 15.1 DerivedCoreProperties.txt)."""

_TOKEN = re.compile(r"\\u\{([0-9a-f]{1,6})\}")


def _ignorable(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in _DEFAULT_IGNORABLE)


def needs_escape(ch: str, *, multiline: bool = False) -> bool:
    """Whether the one character ``ch`` is shown as ``\\u{HEX}`` (the classes:
    ``design/cli.md``); ``\\n`` and ``\\t`` are kept when ``multiline``."""
    if ch == " " or ("!" <= ch <= "~"):
        return False
    if multiline and ch in "\n\t":
        return False
    category = unicodedata.category(ch)
    if category[0] == "C" or category in ("Zl", "Zp", "Zs"):
        return True
    return _ignorable(ord(ch))


def _escape(ch: str) -> str:
    return f"\\u{{{ord(ch):x}}}"


def _pieces(text: str, multiline: bool) -> list[tuple[bool, str]]:
    """``text`` as ``(escaped, piece)`` runs: plain text, or one character's token."""
    pieces: list[tuple[bool, str]] = []
    start = 0
    for i, ch in enumerate(text):
        if ch == "\\":
            if not text.startswith("u{", i + 1):
                continue
        elif not needs_escape(ch, multiline=multiline):
            continue
        if start < i:
            pieces.append((False, text[start:i]))
        pieces.append((True, _escape(ch)))
        start = i + 1
    if start < len(text):
        pieces.append((False, text[start:]))
    return pieces


def visible(value: object, *, multiline: bool = False) -> str:
    """``value`` (its ``str``; ``None`` is ``""``) with every invisible, reordering or control
    character as ``\\u{HEX}``, and a backslash that precedes ``u{`` as ``\\u{5c}``;
    ``multiline`` keeps ``\\n`` and ``\\t``. :func:`unescape` inverts it."""
    text = "" if value is None else str(value)
    if text.isascii() and text.isprintable() and "\\u{" not in text:
        return text  # the common case: nothing to escape
    return "".join(piece for _, piece in _pieces(text, multiline))


def visible_html(value: object, *, multiline: bool = True) -> str:
    """:func:`visible` as HTML markup (the caller marks it safe): each token in
    ``<span class="esc" title="U+202E RIGHT-TO-LEFT OVERRIDE">\\u{202e}</span>``."""
    text = "" if value is None else str(value)
    out: list[str] = []
    for escaped, piece in _pieces(text, multiline):
        if not escaped:
            out.append(html.escape(piece, quote=False))
            continue
        cp = int(piece[3:-1], 16)
        name = unicodedata.name(chr(cp), "") if not 0xD800 <= cp <= 0xDFFF else ""
        title = f"U+{cp:04X} {name}".rstrip()
        out.append(f'<span class="esc" title="{html.escape(title)}">{piece}</span>')
    return "".join(out)


def clip(shown: str, limit: int, mark: str = "…") -> str:
    """``shown`` (:func:`visible`'s output) cut to at most ``limit`` characters, ``mark``
    included, never inside a ``\\u{HEX}`` token (a token cut in two would read as text)."""
    if len(shown) <= limit:
        return shown
    end = max(0, limit - len(mark))
    for token in _TOKEN.finditer(shown, max(0, end - 10), end + 10):
        if token.start() < end < token.end():
            end = token.start()
    return shown[:end] + mark


def unescape(shown: str) -> str:
    """The original text of :func:`visible`'s output: every ``\\u{HEX}`` token back to its
    character, everything else as it is (left to right, so ``\\u{5c}u{41}`` is ``\\u{41}``)."""
    return _TOKEN.sub(lambda m: chr(int(m.group(1), 16)), shown)


__all__ = ["clip", "needs_escape", "unescape", "visible", "visible_html"]
