"""Provider payloads are valid for the provider they go to (issue 10).

One session holding every content kind the models can hold (built through the context builder,
so synthetic results, summaries and renamed duplicate ids are in it too) is converted for each
provider, and the request is checked against the provider's documented schema: the official
SDK's typed request params (``anthropic.types.MessageCreateParamsStreaming``, ``openai``'s
``CompletionCreateParamsStreaming``), validated with pydantic, with no key dropped by the
validation, plus the documented rules the types cannot say (tool ids, pairing, images).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from typing import Any

import pytest
from anthropic.types.message_create_params import MessageCreateParamsStreaming as AnthropicParams
from openai.types.chat.completion_create_params import (
    CompletionCreateParamsStreaming as OpenAIParams,
)
from pydantic import TypeAdapter

from durable_harness.providers._wire import check_image
from durable_harness.providers.anthropic_provider import (
    ANTHROPIC_IMAGES,
    AnthropicProvider,
    to_anthropic_messages,
)
from durable_harness.providers.base import ProviderRequest, ToolSpec
from durable_harness.providers.openai_compat import MAX_TOOL_ID, OPENAI_IMAGES, OpenAIProvider
from durable_harness.session.context import build_context

from .images import JPEG_B64, PNG_B64

BMP_B64 = base64.b64encode(b"BM" + b"\0" * 30).decode()
LONG_ID = "call_9f8e7d6c5b4a3f2e1d0c|fc_0123456789abcdef0123456789abcdef"  # pi Responses-API id
TOOLS = [ToolSpec("bash", "Run a command", {"type": "object", "properties": {}})]


def every_kind_entries() -> dict[str, dict[str, Any]]:
    """A chain of entries with every content kind; leaf is the last one."""
    items: list[dict[str, Any]] = []

    def msg(role: str, **fields: Any) -> None:
        items.append({"type": "message", "message": {"role": role, **fields}})

    def result(call: str, content: Any, **extra: Any) -> None:
        msg("toolResult", toolCallId=call, toolName="bash", content=content, **extra)

    def call(cid: str) -> dict[str, Any]:
        return {"type": "toolCall", "id": cid, "name": "bash", "arguments": {"command": "ls"}}

    items.append({"type": "branch_summary", "summary": "tried another way"})
    msg("user", content="plain string prompt")
    msg(
        "user",
        content=[
            {"type": "text", "text": "look at these"},
            {"type": "image", "data": PNG_B64, "mimeType": "image/png"},
            {"type": "image", "data": JPEG_B64, "mimeType": "image/jpg"},  # mislabelled
            {"type": "image", "data": BMP_B64, "mimeType": "image/bmp"},  # not accepted
            {"type": "image", "data": "", "mimeType": "image/png"},  # empty
            {"type": "image", "data": "not base64 !!", "mimeType": "image/png"},  # undecodable
        ],
    )
    msg("custom", customType="note", content="an extension's note")
    msg("bashExecution", command="make", output="ok", exitCode=2)
    items.append({"type": "custom_message", "content": [{"type": "text", "text": "injected"}]})
    # A turn by an OpenAI-compatible model: its reasoning carries a foreign "signature".
    msg(
        "assistant",
        provider="openai",
        model="gpt-test",
        content=[
            {"type": "thinking", "thinking": "foreign plan", "thinkingSignature": "rs_foreign"},
            {"type": "thinking", "thinking": "", "thinkingSignature": "enc", "redacted": True},
            {"type": "text", "text": "Looking."},
            call(LONG_ID),
        ],
        stopReason="toolUse",
    )
    result(
        LONG_ID,
        [
            {"type": "text", "text": "a screenshot:"},
            {"type": "image", "data": PNG_B64, "mimeType": "image/png"},
            {"type": "image", "data": BMP_B64, "mimeType": "image/bmp"},
        ],
    )
    # A turn by the Anthropic model itself: signed, unsigned and redacted thinking.
    msg(
        "assistant",
        provider="anthropic",
        model="claude-test",
        content=[
            {"type": "thinking", "thinking": "own plan", "thinkingSignature": "sig-own"},
            {"type": "thinking", "thinking": "cut short"},
            {"type": "thinking", "thinking": "", "thinkingSignature": "red-own", "redacted": True},
            call("call_0"),
            call("call_0"),  # a duplicate provider id
            call("toolu_never_answered"),  # gets the interrupted marker
        ],
        stopReason="toolUse",
    )
    result("call_0", [{"type": "text", "text": "first"}])
    result("call_0", [{"type": "text", "text": "second"}], isError=True)
    msg("assistant", provider="anthropic", model="claude-test", content=[])  # empty: dropped
    msg("assistant", provider="anthropic", model="claude-test", content=[call("call|x y")])
    result("call|x y", "a string result")
    msg("user", content=[{"type": "text", "text": "and now?"}])
    entries: dict[str, dict[str, Any]] = {}
    parent = None
    for i, item in enumerate(items):
        eid = f"e{i:02d}"
        entries[eid] = {**item, "id": eid, "parentId": parent, "timestamp": "t"}
        parent = eid
    return entries


def _messages() -> list[dict[str, Any]]:
    entries = every_kind_entries()
    return build_context(entries.get, max(entries)).messages


def _materialize(value: Any) -> Any:
    """Consume pydantic's lazy iterators (SDK fields typed ``Iterable``), so every element is
    validated, and return plain lists and dicts to compare with the input."""
    if isinstance(value, dict):
        return {k: _materialize(v) for k, v in value.items()}
    if isinstance(value, list | tuple | Iterator):
        return [_materialize(v) for v in value]
    return value


def _validate(adapter: TypeAdapter[Any], params: dict[str, Any]) -> None:
    """Valid for the SDK's request type, with nothing the type does not know (a key pydantic
    drops while validating a TypedDict shows up as a difference)."""
    checked = _materialize(adapter.validate_python(params))
    assert checked == _materialize(params)


def _images(data: Any) -> Iterator[tuple[str, str]]:
    if isinstance(data, dict):
        if data.get("type") == "image" and isinstance(data.get("source"), dict):
            yield data["source"]["media_type"], data["source"]["data"]
        if data.get("type") == "image_url":
            url = data["image_url"]["url"]
            match = re.fullmatch(r"data:([^;]+);base64,(.*)", url, re.S)
            assert match, url
            yield match[1], match[2]
        for v in data.values():
            yield from _images(v)
    elif isinstance(data, list):
        for v in data:
            yield from _images(v)


def _check_images(params: dict[str, Any], accepted: tuple[str, ...]) -> None:
    found = list(_images(params["messages"]))
    assert len(found) == 3  # the PNG and JPEG of the prompt, the PNG of the tool result
    for mime, data in found:
        assert mime in accepted
        raw = base64.b64decode(data, validate=True)
        assert raw
    text = str(params["messages"])
    assert text.count("not sent to") == 4  # bmp (twice), empty, undecodable
    assert "image/jpg" not in [m for m, _ in found]  # sent as what the bytes are


# -- Anthropic -----------------------------------------------------------------------------


def _anthropic_params(reasoning: bool = False, **request: Any) -> dict[str, Any]:
    provider = AnthropicProvider("claude-test", api_key="k", reasoning=reasoning)
    return provider.build_params(
        ProviderRequest(messages=_messages(), tools=TOOLS, system_prompt="be brief", **request)
    )


def test_anthropic_request_with_every_content_kind_matches_the_sdk_schema() -> None:
    params = _anthropic_params()
    _validate(TypeAdapter(AnthropicParams), params)
    messages = params["messages"]
    assert messages[0]["role"] == "user"
    # Tool ids: [A-Za-z0-9_-]{1,64}, unique, and each tool_use answered in the next message.
    seen: list[str] = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        uses = [b["id"] for b in m["content"] if b["type"] == "tool_use"]
        assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", u) for u in uses)
        seen += uses
        if uses:
            nxt = messages[i + 1]
            assert nxt["role"] == "user"
            assert [b["tool_use_id"] for b in nxt["content"]] == uses
    assert len(seen) == len(set(seen)) == 5
    _check_images(params, ANTHROPIC_IMAGES.media_types)


def test_anthropic_sends_only_its_own_signed_thinking() -> None:
    """The OpenAI turn's reasoning goes as text (its signature not at all), its redacted data
    not at all (pi's rule); the Anthropic turn's signed and redacted blocks go out unmodified;
    unsigned own thinking never."""
    params = _anthropic_params()
    thinking = [
        b
        for m in params["messages"]
        if m["role"] == "assistant"
        for b in m["content"]
        if b["type"] in ("thinking", "redacted_thinking")
    ]
    assert thinking == [
        {"type": "thinking", "thinking": "own plan", "signature": "sig-own"},
        {"type": "redacted_thinking", "data": "red-own"},
    ]
    assert "rs_foreign" not in str(params) and "enc" not in str(params)
    texts = [b for m in params["messages"] if m["role"] == "assistant" for b in m["content"]]
    assert {"type": "text", "text": "foreign plan"} in texts
    assert "cut short" not in str(params)


def test_anthropic_same_provider_other_model_thinking_goes_as_text() -> None:
    msgs = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "provider": "anthropic",
            "model": "claude-other",
            "content": [
                {"type": "thinking", "thinking": "p", "thinkingSignature": "sig"},
                {"type": "text", "text": "hello"},
            ],
        },
        {"role": "user", "content": "more"},
    ]
    wire = to_anthropic_messages(msgs, provider="anthropic", model="claude-test")
    assert wire[1]["content"] == [{"type": "text", "text": "p"}, {"type": "text", "text": "hello"}]
    same = to_anthropic_messages(msgs, provider="anthropic", model="claude-other")
    assert same[1]["content"][0] == {"type": "thinking", "thinking": "p", "signature": "sig"}


def test_anthropic_thinking_is_off_when_the_open_tool_turn_has_no_own_thinking() -> None:
    """A session that switched to Anthropic mid tool-use: the open turn's assistant message (by
    another model) cannot start with a thinking block, which the API requires with thinking
    on, so that one request goes without; a fresh turn gets thinking again."""
    foreign_turn = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "provider": "openai",
            "model": "gpt-test",
            "content": [
                {"type": "thinking", "thinking": "x", "thinkingSignature": "rs_1"},
                {"type": "toolCall", "id": "c1", "name": "bash", "arguments": {}},
            ],
        },
        {"role": "toolResult", "toolCallId": "c1", "toolName": "bash", "content": "ok"},
    ]
    provider = AnthropicProvider("claude-test", api_key="k", reasoning=True)
    params = provider.build_params(ProviderRequest(foreign_turn, thinking_level="high"))
    assert "thinking" not in params
    _validate(TypeAdapter(AnthropicParams), params)
    fresh = provider.build_params(
        ProviderRequest([*foreign_turn, {"role": "user", "content": "next"}], thinking_level="high")
    )
    assert fresh["thinking"]["type"] == "enabled"
    _validate(TypeAdapter(AnthropicParams), fresh)
    own_turn = [
        foreign_turn[0],
        {
            **foreign_turn[1],
            "provider": "anthropic",
            "model": "claude-test",
            "content": [
                {"type": "thinking", "thinking": "x", "thinkingSignature": "sig"},
                foreign_turn[1]["content"][1],
            ],
        },
        foreign_turn[2],
    ]
    own = provider.build_params(ProviderRequest(own_turn, thinking_level="high"))
    assert own["thinking"]["type"] == "enabled"
    assert own["messages"][1]["content"][0] == {
        "type": "thinking",
        "thinking": "x",
        "signature": "sig",
    }
    _validate(TypeAdapter(AnthropicParams), own)


# -- OpenAI ----------------------------------------------------------------------------------


def _openai_params() -> dict[str, Any]:
    provider = OpenAIProvider("gpt-test", api_key="k")
    return provider.build_params(
        ProviderRequest(messages=_messages(), tools=TOOLS, system_prompt="be brief")
    )


def test_openai_request_with_every_content_kind_matches_the_sdk_schema() -> None:
    params = _openai_params()
    _validate(TypeAdapter(OpenAIParams), params)
    messages = params["messages"]
    assert messages[0]["role"] == "system"
    # Each assistant tool_calls is answered by one tool message per id, right after it.
    ids: list[str] = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = [c["id"] for c in m["tool_calls"]]
            ids += calls
            answers = [x["tool_call_id"] for x in messages[i + 1 : i + 1 + len(calls)]]
            assert answers == calls
            assert all(len(c) <= MAX_TOOL_ID for c in calls)
            assert all(isinstance(x["content"], str) for x in messages[i + 1 : i + 1 + len(calls)])
    assert len(ids) == len(set(ids)) == 5
    _check_images(params, OPENAI_IMAGES.media_types)


def test_openai_never_sends_reasoning_or_signatures() -> None:
    """No signature or redacted data ever; another model's thinking (the Anthropic turn's, for
    this OpenAI model) goes as the assistant's text, as pi sends it."""
    params = _openai_params()
    text = str(params)
    for leaked in ("rs_foreign", "sig-own", "red-own", "reasoning"):
        assert leaked not in text
    said = [m["content"] for m in params["messages"] if m["role"] == "assistant"]
    assert any("own plan" in (c or "") for c in said)
    own = OpenAIProvider("gpt-test", api_key="k").build_params(
        ProviderRequest(
            [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "provider": "openai",
                    "model": "gpt-test",
                    "content": [
                        {"type": "thinking", "thinking": "mine"},
                        {"type": "text", "text": "ok"},
                    ],
                },
            ]
        )
    )
    assert own["messages"][1]["content"] == "ok"


# -- the image check itself -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("block", "expect"),
    [
        ({"data": PNG_B64, "mimeType": "image/png"}, ("image/png", PNG_B64)),
        ({"data": JPEG_B64, "mimeType": "image/png"}, ("image/jpeg", JPEG_B64)),
        ({"data": PNG_B64[:20] + "\n" + PNG_B64[20:], "mimeType": "image/png"}, "reencoded"),
        ({"data": "", "mimeType": "image/png"}, "empty"),
        ({"mimeType": "image/png"}, "empty"),
        ({"data": "@@@", "mimeType": "image/png"}, "not valid base64"),
        ({"data": BMP_B64, "mimeType": "image/bmp"}, "not one of the formats"),
    ],
)
def test_image_check(block: dict[str, Any], expect: Any) -> None:
    got = check_image(block, ANTHROPIC_IMAGES)
    if expect == "reencoded":
        assert got == ("image/png", PNG_B64)
    elif isinstance(expect, tuple):
        assert got == expect
    else:
        assert isinstance(got, str) and expect in got and "anthropic" in got


def test_image_over_the_limit_becomes_a_note() -> None:
    big = base64.b64encode(base64.b64decode(PNG_B64) + b"\0" * (5 * 1024 * 1024)).decode()
    note = check_image({"data": big, "mimeType": "image/png"}, ANTHROPIC_IMAGES)
    assert isinstance(note, str) and "over its 5 MB limit" in note
    assert check_image({"data": big, "mimeType": "image/png"}, OPENAI_IMAGES)[0] == "image/png"
