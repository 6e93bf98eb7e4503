"""The one display rule (``durable_harness.display``): what is escaped, that nothing is lost."""

from __future__ import annotations

import re
import unicodedata

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from durable_harness.display import needs_escape, unescape, visible, visible_html

TOKEN = re.compile(r"\\u\{[0-9a-f]{1,6}\}")

# text rich in what matters: bidi controls, zero-width, controls, separators, backslashes and
# things that look like tokens, plus any code point at all (surrogates included)
TRICKY = st.sampled_from(
    [
        "\u202e",
        "\u202a",
        "\u2066",
        "\u2069",
        "\u200e",
        "\u200f",
        "\u061c",
        "\u200b",
        "\u200d",
        "\ufeff",
        "\u00ad",
        "\u2028",
        "\u2029",
        "\u00a0",
        "\u3164",
        "\ufe0f",
        "\U000e0041",
        "\x00",
        "\x1b",
        "\r",
        "\n",
        "\t",
        "\x7f",
        "\x85",
        "\x9b",
        "\ud800",
        "\\",
        "u{",
        "}",
        "\\u{41}",
        "\\u{5c}",
        "a",
        " ",
        "é",
        "ש",
    ]
)
TEXT = st.lists(st.one_of(TRICKY, st.characters()), max_size=40).map("".join)


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(TEXT, st.booleans())
@example("\\u\x1d{41}", False)  # a token removed would join "\\u" and "{41}"
def test_nothing_escaped_remains_and_the_original_comes_back(text: str, multiline: bool) -> None:
    shown = visible(text, multiline=multiline)
    assert not [c for c in shown if needs_escape(c, multiline=multiline)]
    # every "\u{" a reader sees starts a token: a real backslash cannot pass for one
    # (read left to right: every "\\u{" in the shown text is the start of a whole token)
    starts = [i for i in range(len(shown)) if shown.startswith("\\u{", i)]
    assert all(TOKEN.match(shown, i) for i in starts)
    assert unescape(shown) == text


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(TEXT)
def test_the_html_form_shows_the_same_text(text: str) -> None:
    import html

    markup = visible_html(text)
    plain = html.unescape(re.sub(r"<[^>]*>", "", markup))
    assert plain == visible(text, multiline=True)
    assert "<" not in re.sub(r'<span class="esc" title="[^"<>]*">|</span>', "", markup)


def test_the_classes_named_in_the_rule() -> None:
    for ch in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c":
        assert needs_escape(ch), unicodedata.name(ch)
    for ch in "\u200b\u200c\u200d\u2060\ufeff\u2028\u2029\x00\x1b\r\x7f\x85\u3164\u115f":
        assert needs_escape(ch)
    assert needs_escape("\n") and not needs_escape("\n", multiline=True)
    assert needs_escape("\t") and not needs_escape("\t", multiline=True)
    for ch in "aZ ~é中ש→├😀":
        assert not needs_escape(ch)


def test_the_notation() -> None:
    assert visible("rm -rf \u202e/ \u200b") == "rm -rf \\u{202e}/ \\u{200b}"
    assert visible("printf 'a\\nb'") == "printf 'a\\nb'"  # a real backslash stays
    assert visible("literal \\u{202e}") == "literal \\u{5c}u{202e}"
    assert visible("two\nlines") == "two\\u{a}lines"
    assert visible("two\nlines", multiline=True) == "two\nlines"
    assert visible(None) == "" and visible(12) == "12"
    assert visible_html("<b>\u202e") == (
        '&lt;b&gt;<span class="esc" title="U+202E RIGHT-TO-LEFT OVERRIDE">\\u{202e}</span>'
    )


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(TEXT, st.integers(min_value=1, max_value=60))
def test_a_clipped_text_never_cuts_a_token(text: str, limit: int) -> None:
    from durable_harness.display import clip

    shown = visible(text)
    cut = clip(shown, limit)
    assert len(cut) <= max(limit, 1)
    if cut != shown:
        body = cut[:-1]
        assert shown.startswith(body)
        # the kept part is whole tokens and text: it unescapes to a prefix of the original
        assert text.startswith(unescape(body))
