"""node/gateway/requests.py: the one parser of request bodies, against hostile input."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from node.gateway.errors import InvalidRequest
from node.gateway.requests import (
    ChatRequest,
    CompletionRequest,
    Limits,
    parse_body,
    parse_chat,
    parse_completion,
)

pytestmark = pytest.mark.unit

CODES = {
    "invalid_json",
    "invalid_body",
    "missing_field",
    "invalid_type",
    "invalid_value",
    "out_of_range",
    "too_many_messages",
    "prompt_too_long",
    "unsupported_parameter",
    "unknown_parameter",
}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def chat(**changes: Any) -> dict[str, Any]:
    return {**CHAT, **changes}


def refused(doc: dict[str, Any], parse: Any = parse_chat) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        parse(doc, Limits())
    assert caught.value.http_status == 400 and caught.value.code in CODES
    return caught.value


def test_parse_chat_defaults_follow_openai() -> None:
    req = parse_chat(CHAT)
    assert isinstance(req, ChatRequest)
    assert req.messages == (("user", "hi"),)
    s = req.sampling
    assert (s.temperature, s.top_p, s.max_tokens, s.stream, s.stop) == (1.0, 1.0, 256, False, ())


def test_parse_chat_all_fields() -> None:
    req = parse_chat(
        chat(
            messages=[
                {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
                {"role": "user", "content": "hi", "name": "u"},
            ],
            max_completion_tokens=9,
            temperature=0,
            top_p=0.5,
            seed=-1,
            stop="\n",
            stream=True,
            stream_options={"include_usage": True},
            logprobs=True,
            top_logprobs=20,
            n=1,
            presence_penalty=0,
            user="someone",
        )
    )
    assert req.messages == (("system", "be brief"), ("user", "hi"))
    s = req.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.seed) == (9, 0.0, 0.5, 2**64 - 1)
    assert (s.stop, s.stream, s.include_usage) == (("\n",), True, True)
    assert (req.logprobs, req.top_logprobs) == (True, 20)


@pytest.mark.parametrize(
    ("doc", "code", "param"),
    [
        ({"messages": CHAT["messages"]}, "missing_field", "model"),
        (chat(model=7), "invalid_type", "model"),
        (chat(messages="hi"), "invalid_type", "messages"),
        (chat(messages=[]), "out_of_range", "messages"),
        (chat(messages=[{"role": "user", "content": "x"}] * 257), "too_many_messages", "messages"),
        (chat(messages=[{"role": "tool", "content": "x"}]), "invalid_value", "messages[0]"),
        (chat(messages=[{"role": "user", "content": 5}]), "invalid_type", "messages[0].content"),
        (chat(messages=[{"role": "user", "content": "x" * 200_001}]), "prompt_too_long", None),
        (chat(messages=["hi"]), "invalid_type", "messages[0]"),
        (chat(max_tokens=0), "out_of_range", "max_tokens"),
        (chat(max_tokens=-5), "out_of_range", "max_tokens"),
        (chat(max_tokens=10**30), "out_of_range", "max_tokens"),
        (chat(max_tokens=1.5), "invalid_type", "max_tokens"),
        (chat(max_tokens=16.0), "invalid_type", "max_tokens"),
        (chat(max_tokens="16"), "invalid_type", "max_tokens"),
        (chat(max_tokens=True), "invalid_type", "max_tokens"),
        (chat(max_tokens=5, max_completion_tokens=6), "invalid_value", "max_completion_tokens"),
        (chat(temperature=2.5), "out_of_range", "temperature"),
        (chat(temperature=-0.1), "out_of_range", "temperature"),
        (chat(temperature=1e308 * 10), "out_of_range", "temperature"),
        (chat(temperature=10**400), "out_of_range", "temperature"),
        (chat(temperature="hot"), "invalid_type", "temperature"),
        (chat(top_p=1.01), "out_of_range", "top_p"),
        (chat(seed=2**63), "out_of_range", "seed"),
        (chat(seed=3.0), "invalid_type", "seed"),
        (chat(stop=["a", "b", "c", "d", "e"]), "out_of_range", "stop"),
        (chat(stop=[""]), "out_of_range", "stop"),
        (chat(stop=[1]), "invalid_type", "stop"),
        (chat(stop={"a": 1}), "invalid_type", "stop"),
        (chat(stream="yes"), "invalid_type", "stream"),
        (chat(stream_options={"include_usage": True}), "invalid_value", "stream_options"),
        (chat(stream=True, stream_options=[]), "invalid_type", "stream_options"),
        (chat(stream=True, stream_options={"x": 1}), "unknown_parameter", "stream_options"),
        (chat(top_logprobs=3), "invalid_value", "top_logprobs"),
        (chat(logprobs=True, top_logprobs=21), "out_of_range", "top_logprobs"),
        (chat(logprobs=1), "invalid_type", "logprobs"),
        (chat(n=2), "unsupported_parameter", "n"),
        (chat(presence_penalty=1.0), "unsupported_parameter", "presence_penalty"),
        (chat(logit_bias={"5": 10}), "unsupported_parameter", "logit_bias"),
        (chat(tools=[]), "unknown_parameter", "tools"),
        (chat(response_format={"type": "json_object"}), "unsupported_parameter", None),
    ],
)
def test_parse_chat_refuses_with_named_code(doc: dict, code: str, param: str | None) -> None:
    error = refused(doc)
    assert error.code == code
    if param is not None:
        assert error.param == param


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"{", "invalid_json"),
        (b"\xff\xfe", "invalid_json"),
        (b"[1, 2]", "invalid_body"),
        (b'"text"', "invalid_body"),
        (b'{"temperature": NaN}', "invalid_json"),
        (b'{"temperature": Infinity}', "invalid_json"),
        (b'{"max_tokens": ' + b"9" * 5000 + b"}", "invalid_json"),
        (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "invalid_body"),
        (b'{"a": ' + b"[" * 40 + b"]" * 40 + b"}", "invalid_body"),
    ],
)
def test_parse_body_refuses_hostile_bytes(raw: bytes, code: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_body(raw)
    assert caught.value.code == code


def test_parse_completion_prompt_forms() -> None:
    assert parse_completion({"model": "m", "prompt": "hi"}).prompt == "hi"
    assert parse_completion({"model": "m", "prompt": ["hi"]}).prompt == "hi"
    assert parse_completion({"model": "m", "prompt": [1, 2, 3]}).prompt == (1, 2, 3)
    req = parse_completion({"model": "m", "prompt": "x", "logprobs": 5})
    assert isinstance(req, CompletionRequest)
    assert (req.logprobs, req.sampling.max_tokens) == (5, 16)


@pytest.mark.parametrize(
    "doc",
    [
        {"model": "m"},
        {"model": "m", "prompt": ""},
        {"model": "m", "prompt": ["a", "b"]},
        {"model": "m", "prompt": [1, -2]},
        {"model": "m", "prompt": [1, True]},
        {"model": "m", "prompt": [1.5]},
        {"model": "m", "prompt": {}},
        {"model": "m", "prompt": "x", "logprobs": 6},
        {"model": "m", "prompt": "x", "echo": 1},
        {"model": "m", "prompt": "x", "echo": True, "stream": True},
        {"model": "m", "prompt": "x", "best_of": 3},
        {"model": "m", "prompt": "x", "suffix": "y"},
        {"model": "m", "prompt": "x", "messages": []},
    ],
)
def test_parse_completion_refuses(doc: dict) -> None:
    refused(doc, parse_completion)


def test_parse_completion_echo_with_logprobs_is_accepted() -> None:
    req = parse_completion({"model": "m", "prompt": [1, 2], "echo": True, "logprobs": 5})
    assert req.echo and req.logprobs == 5
    assert not parse_completion({"model": "m", "prompt": "x"}).echo


HOSTILE: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**64,
    -(2**70),
    10**100,
    0.5,
    -0.0,
    1e308,
    "",
    "x",
    "9",
    "\u0000",
    [],
    [1],
    ["a"] * 10,
    {},
    {"type": "text"},
    [{"role": "user", "content": "x"}],
]
FIELDS = [
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "n",
    "presence_penalty",
    "logit_bias",
    "echo",
]


@pytest.mark.parametrize("parse", [parse_chat, parse_completion])
def test_parse_fuzz_hostile_values_give_a_request_or_a_named_400(parse: Any) -> None:
    rng = random.Random(2026)
    base = {"model": "m", "messages": CHAT["messages"], "prompt": "hello"}
    accepted = 0
    for _ in range(400):
        doc = dict(base)
        for field in rng.sample(FIELDS, rng.randrange(1, 4)):
            doc[field] = rng.choice(HOSTILE)
        if parse is parse_chat:
            doc.pop("prompt", None)
        else:
            doc.pop("messages", None)
        # the same document through the byte boundary first
        doc = parse_body(json.dumps(doc).encode())
        try:
            req = parse(doc, Limits())
        except InvalidRequest as error:
            assert error.code in CODES and error.http_status == 400
            continue
        accepted += 1
        s = req.sampling
        assert 1 <= s.max_tokens <= Limits().max_tokens
        assert 0.0 <= s.temperature <= 2.0 and 0.0 < s.top_p <= 1.0
        assert s.seed is None or 0 <= s.seed < 2**64
        assert len(s.stop) <= 4 and all(isinstance(x, str) and x for x in s.stop)
    assert accepted > 0  # the fuzzer also reaches the accepting paths
