"""The one boundary where request bodies become typed requests (or a named 400).

    parse_body(raw)                  bytes → a JSON object (no NaN/Infinity, bounded depth)
    parse_chat(doc, limits)          /v1/chat/completions → ChatRequest
    parse_completion(doc, limits)    /v1/completions → CompletionRequest

Every rule failure is `InvalidRequest(code, message, param=<field>)`; codes:
`invalid_json`, `invalid_body`, `missing_field`, `invalid_type`, `out_of_range`,
`too_many_messages`, `prompt_too_long`, `unsupported_parameter`, `unknown_parameter`.
Numbers are strict: a bool is not a number, an integer field refuses 1.5 and 1e3, values have
bounded ranges (OpenAI's: temperature [0, 2], top_p [0, 1], top_logprobs [0, 20], stop ≤ 4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from node.gateway.errors import InvalidRequest
from protocol.canonical import JsonTooDeepError, loads_bounded

ROLES = frozenset({"system", "developer", "user", "assistant"})
MAX_STOP = 4
MAX_STOP_CHARS = 256
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
MAX_NAME_CHARS = 256
MAX_DEPTH = 32
SEED_RANGE = (-(1 << 63), (1 << 63) - 1)
# Accepted and ignored: they change nothing about the answer.
IGNORED = frozenset({"user", "metadata", "store", "service_tier", "parallel_tool_calls"})


@dataclass(frozen=True, slots=True)
class Limits:
    max_messages: int = 256  # messages in one chat
    max_prompt_chars: int = 200_000  # characters of prompt text in all
    max_tokens: int = 4096  # largest max_tokens accepted
    default_chat_max_tokens: int = 256  # when the request names none
    default_completion_max_tokens: int = 16  # OpenAI's default for /v1/completions


@dataclass(frozen=True, slots=True)
class Sampling:
    max_tokens: int
    temperature: float  # 0 = greedy
    top_p: float  # (0, 1]
    seed: int | None  # non-negative (numpy's rule): negative seeds are taken mod 2**64
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool


@dataclass(frozen=True, slots=True)
class ChatRequest:
    model: str
    messages: tuple[tuple[str, str], ...]  # (role, text)
    sampling: Sampling
    logprobs: bool
    top_logprobs: int

    kind = "chat"


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    model: str
    prompt: str | tuple[int, ...]  # text, or token ids
    sampling: Sampling
    logprobs: int | None  # None: no logprobs; else how many top alternatives (0..5)
    echo: bool = False  # the answer starts with the prompt (and its logprobs, with logprobs)

    kind = "completion"


def _bad(code: str, message: str, param: str | None = None) -> InvalidRequest:
    return InvalidRequest(code, message, param=param)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _depth(value: Any, level: int = 0) -> None:
    if level > MAX_DEPTH:
        raise _bad("invalid_body", f"the body nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        for item in value.values():
            _depth(item, level + 1)
    elif isinstance(value, list):
        for item in value:
            _depth(item, level + 1)


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object."""
    try:
        doc = loads_bounded(
            raw.decode("utf-8"), max_depth=MAX_DEPTH, parse_constant=_reject_constant
        )
    except UnicodeDecodeError:
        raise _bad("invalid_json", "the body is not UTF-8") from None
    except (JsonTooDeepError, RecursionError):
        raise _bad("invalid_body", f"the body nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as error:  # JSONDecodeError, NaN, integers longer than 4300 digits
        raise _bad("invalid_json", f"the body is not valid JSON: {error}"[:300]) from None
    if not isinstance(doc, dict):
        raise _bad("invalid_body", "the body must be a JSON object")
    _depth(doc)
    return doc


# --- field readers ------------------------------------------------------------------------------


def _type_name(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array"}.get(
        type(value), "object" if isinstance(value, dict) else type(value).__name__
    )


def _string(doc: dict[str, Any], key: str, *, max_chars: int = MAX_NAME_CHARS) -> str:
    if key not in doc or doc[key] is None:
        raise _bad("missing_field", f"'{key}' is required", key)
    value = doc[key]
    if not isinstance(value, str):
        raise _bad("invalid_type", f"'{key}' must be a string, got {_type_name(value)}", key)
    if not 0 < len(value) <= max_chars:
        raise _bad("out_of_range", f"'{key}' must be 1 to {max_chars} characters", key)
    return value


def _integer(doc: dict[str, Any], key: str, default: int | None, lo: int, hi: int) -> int | None:
    value = doc.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad("invalid_type", f"'{key}' must be an integer, got {_type_name(value)}", key)
    if not lo <= value <= hi:
        raise _bad("out_of_range", f"'{key}' must be between {lo} and {hi}, got {value}", key)
    return value


def _number(doc: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    value = doc.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad("invalid_type", f"'{key}' must be a number, got {_type_name(value)}", key)
    try:
        number = float(value)
    except OverflowError:
        raise _bad("out_of_range", f"'{key}' must be between {lo:g} and {hi:g}", key) from None
    if not math.isfinite(number) or not lo <= number <= hi:
        raise _bad("out_of_range", f"'{key}' must be between {lo:g} and {hi:g}", key)
    return number


def _boolean(doc: dict[str, Any], key: str, default: bool = False) -> bool:
    value = doc.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad("invalid_type", f"'{key}' must be a boolean, got {_type_name(value)}", key)
    return value


def _stop(doc: dict[str, Any]) -> tuple[str, ...]:
    value = doc.get("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise _bad("invalid_type", "'stop' must be a string or an array of strings", "stop")
    if len(items) > MAX_STOP:
        raise _bad("out_of_range", f"'stop' takes at most {MAX_STOP} sequences", "stop")
    for item in items:
        if not isinstance(item, str):
            raise _bad("invalid_type", "'stop' must be a string or an array of strings", "stop")
        if not 0 < len(item) <= MAX_STOP_CHARS:
            raise _bad("out_of_range", f"each stop sequence is 1 to {MAX_STOP_CHARS} chars", "stop")
    return tuple(items)


def _check_keys(doc: dict[str, Any], known: frozenset[str]) -> None:
    for key in doc:
        if key not in known and key not in IGNORED:
            shown = key if len(key) <= 64 else key[:64] + "…"
            raise _bad("unknown_parameter", f"unrecognized request argument: {shown!r}", shown)


def _unsupported(doc: dict[str, Any], key: str, allowed: Any, why: str) -> None:
    value = doc.get(key)
    if value is not None and value != allowed:
        raise _bad("unsupported_parameter", f"'{key}' is not supported: {why}", key)


def _sampling(doc: dict[str, Any], limits: Limits, default_max_tokens: int) -> Sampling:
    _unsupported(doc, "n", 1, "one choice per request")
    for penalty in ("presence_penalty", "frequency_penalty"):
        _number(doc, penalty, 0.0, -2.0, 2.0)
        _unsupported(doc, penalty, 0, "penalties are not implemented (0 only)")
    bias = doc.get("logit_bias")
    if bias is not None and bias != {}:
        raise _bad("unsupported_parameter", "'logit_bias' is not supported", "logit_bias")
    max_tokens = _integer(doc, "max_tokens", None, 1, limits.max_tokens)
    alt = _integer(doc, "max_completion_tokens", None, 1, limits.max_tokens)
    if max_tokens is not None and alt is not None and max_tokens != alt:
        raise _bad(
            "invalid_value",
            "'max_tokens' and 'max_completion_tokens' disagree",
            "max_completion_tokens",
        )
    temperature = _number(doc, "temperature", 1.0, 0.0, 2.0)  # OpenAI's default: 1
    top_p = _number(doc, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0.0:  # the nucleus keeps only the top token
        temperature, top_p = 0.0, 1.0
    seed = _integer(doc, "seed", None, *SEED_RANGE)
    stream = _boolean(doc, "stream")
    options = doc.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise _bad("invalid_type", "'stream_options' must be an object", "stream_options")
        if not stream:
            raise _bad(
                "invalid_value",
                "'stream_options' is only allowed when 'stream' is true",
                "stream_options",
            )
        unknown = set(options) - {"include_usage"}
        if unknown:
            raise _bad(
                "unknown_parameter", "stream_options takes include_usage only", "stream_options"
            )
        include_usage = _boolean(options, "include_usage")
    return Sampling(
        max_tokens=max_tokens or alt or default_max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=None if seed is None else seed % (1 << 64),
        stop=_stop(doc),
        stream=stream,
        include_usage=include_usage,
    )


# --- chat ---------------------------------------------------------------------------------------

CHAT_KEYS = frozenset(
    {
        "model",
        "messages",
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
        "frequency_penalty",
        "logit_bias",
        "response_format",
    }
)


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise _bad(
                    "unsupported_parameter", f"{where}: only text parts are supported", where
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise _bad("invalid_type", f"{where}: a text part needs a string 'text'", where)
            parts.append(text)
        return "".join(parts)
    raise _bad("invalid_type", f"{where} must be a string or an array of text parts", where)


def parse_chat(doc: dict[str, Any], limits: Limits = Limits()) -> ChatRequest:
    _check_keys(doc, CHAT_KEYS)
    model = _string(doc, "model")
    fmt = doc.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise _bad("unsupported_parameter", "only response_format text", "response_format")
    raw = doc.get("messages")
    if raw is None:
        raise _bad("missing_field", "'messages' is required", "messages")
    if not isinstance(raw, list):
        raise _bad("invalid_type", "'messages' must be an array", "messages")
    if not raw:
        raise _bad("out_of_range", "'messages' must not be empty", "messages")
    if len(raw) > limits.max_messages:
        raise _bad(
            "too_many_messages",
            f"at most {limits.max_messages} messages, got {len(raw)}",
            "messages",
        )
    messages: list[tuple[str, str]] = []
    total = 0
    for index, message in enumerate(raw):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise _bad("invalid_type", f"{where} must be an object", where)
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise _bad("invalid_value", f"{where}.role must be one of {sorted(ROLES)}", where)
        extra = set(message) - {"role", "content", "name"}
        if extra:
            raise _bad("unsupported_parameter", f"{where}: unsupported keys {sorted(extra)}", where)
        text = _content(message.get("content"), f"{where}.content")
        total += len(text)
        if total > limits.max_prompt_chars:
            raise _bad(
                "prompt_too_long",
                f"the messages hold more than {limits.max_prompt_chars} characters",
                "messages",
            )
        messages.append(("system" if role == "developer" else role, text))
    logprobs = _boolean(doc, "logprobs")
    top = _integer(doc, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS) or 0
    if top and not logprobs:
        raise _bad("invalid_value", "'top_logprobs' needs 'logprobs': true", "top_logprobs")
    sampling = _sampling(doc, limits, limits.default_chat_max_tokens)
    return ChatRequest(model, tuple(messages), sampling, logprobs, top)


# --- completions --------------------------------------------------------------------------------

COMPLETION_KEYS = frozenset(
    {
        "model",
        "prompt",
        "max_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "logprobs",
        "n",
        "best_of",
        "echo",
        "suffix",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
    }
)


def _prompt(doc: dict[str, Any], limits: Limits) -> str | tuple[int, ...]:
    value = doc.get("prompt")
    if value is None:
        raise _bad("missing_field", "'prompt' is required", "prompt")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]  # a batch of one
    if isinstance(value, str):
        if not value:
            raise _bad("out_of_range", "'prompt' must not be empty", "prompt")
        if len(value) > limits.max_prompt_chars:
            raise _bad("prompt_too_long", f"over {limits.max_prompt_chars} characters", "prompt")
        return value
    if isinstance(value, list):
        if not value or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < (1 << 31) for t in value
        ):
            raise _bad(
                "invalid_type",
                "'prompt' must be a string, or one array of non-negative token ids",
                "prompt",
            )
        if len(value) > limits.max_prompt_chars:
            raise _bad("prompt_too_long", "too many prompt tokens", "prompt")
        return tuple(value)
    raise _bad("invalid_type", f"'prompt' must be a string, got {_type_name(value)}", "prompt")


def parse_completion(doc: dict[str, Any], limits: Limits = Limits()) -> CompletionRequest:
    _check_keys(doc, COMPLETION_KEYS)
    model = _string(doc, "model")
    prompt = _prompt(doc, limits)
    _unsupported(doc, "best_of", 1, "one candidate per request")
    suffix = doc.get("suffix")
    if suffix is not None and suffix != "":
        raise _bad("unsupported_parameter", "'suffix' is not supported", "suffix")
    logprobs = _integer(doc, "logprobs", None, 0, MAX_COMPLETION_LOGPROBS)
    echo = _boolean(doc, "echo")
    sampling = _sampling(doc, limits, limits.default_completion_max_tokens)
    if echo and sampling.stream:
        raise _bad("unsupported_parameter", "'echo' is not supported with 'stream'", "echo")
    return CompletionRequest(model, prompt, sampling, logprobs, echo)
