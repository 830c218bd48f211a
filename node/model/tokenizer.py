"""The client's tokenizer without transformers: the model's `tokenizer.json` run by Hugging Face
`tokenizers` (the Rust library transformers' fast tokenizers call), and its chat template
rendered by jinja2 in a sandbox.

Why: every process that holds a client head — the gateway, `planet ask`, the personal client,
each verifier — paid ~1.1 s of CPU to import transformers for its tokenizer alone (torch is
needed anyway for the head's tensors). `tokenizers` imports in 0.05 s.

    ChatTokenizer.load(directory) -> ChatTokenizer | None
        None when the prepared tokenizer is not one this reads exactly (no `tokenizer.json`, no
        single chat template, a template that marks generation spans): the head then takes
        transformers' AutoTokenizer, as before.
    .apply_chat_template(messages, add_generation_prompt=True) -> list[int]
    .encode(text, add_special_tokens=False) -> list[int]
    .decode(ids, skip_special_tokens=False) -> str
    .eos_token_id -> int | None

What it reproduces of transformers' `apply_chat_template` (tests/unit/test_tokenizer_parity.py
holds the two equal on the prepared models): the template sees `messages`,
`add_generation_prompt`, `tools` and `documents` (None) and the special tokens by name
(`bos_token`, `eos_token`, …); blocks are trimmed (`trim_blocks`, `lstrip_blocks`), loop
controls are on, `raise_exception(message)` fails the render, `strftime_now(format)` is the
local time and `tojson` does not escape HTML; the rendered text is encoded without adding
special tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from protocol.errors import ConfigError

SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
GENERATION_TAG = "{% generation"  # assistant-span tracking: transformers' own extension


class ChatTokenizer:
    """A tokenizer.json and its chat template (module docstring)."""

    def __init__(self, tokenizer: Any, template: Any, special: Mapping[str, str]) -> None:
        self._tokenizer = tokenizer
        self._template = template
        self.special_tokens_map: dict[str, str] = dict(special)
        eos = special.get("eos_token")
        self.eos_token_id: int | None = None if eos is None else tokenizer.token_to_id(eos)

    @classmethod
    def load(cls, directory: Path) -> ChatTokenizer | None:
        source = _template_source(directory)
        if not (directory / "tokenizer.json").is_file() or source is None:
            return None
        if GENERATION_TAG in source:
            return None
        import tokenizers

        try:
            tokenizer = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as error:  # the Rust library raises its own Exception type
            raise ConfigError(f"{directory / 'tokenizer.json'}: {error}") from None
        return cls(tokenizer, _compile(source), _special_tokens(directory))

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tokenize: bool = True,
        return_dict: bool = False,
    ) -> list[int] | str:
        if return_dict:
            raise ValueError("ChatTokenizer.apply_chat_template: return_dict is not supported")
        text = self._template.render(
            messages=[dict(m) for m in messages],
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **self.special_tokens_map,
        )
        return self.encode(text) if tokenize else text

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))


def _template_source(directory: Path) -> str | None:
    """The one chat template of a tokenizer directory, where transformers looks for it."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    for name in ("chat_template.json", "tokenizer_config.json"):
        path = directory / name
        if not path.is_file():
            continue
        try:
            template = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
        except (ValueError, AttributeError):
            return None  # transformers' loader decides what such a file means
        if template is not None:
            return template if isinstance(template, str) else None  # named templates: theirs
    return None


def _special_tokens(directory: Path) -> dict[str, str]:
    """The special tokens by name: tokenizer_config.json's, then special_tokens_map.json's for
    those it does not name (a token may be a string or {"content": ...})."""
    found: dict[str, str] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = directory / name
        if not path.is_file():
            continue
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            continue
        if not isinstance(config, dict):
            continue
        for key in SPECIAL_TOKENS:
            value = config.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str) and key not in found:
                found[key] = value
    return found


def _compile(source: str) -> Any:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        value: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
            sort_keys=sort_keys,
        )  # fmt: skip

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )

    def strftime_now(format: str) -> str:  # a template's "today" (Llama 3's): the user's clock
        return datetime.now().strftime(format)

    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    try:
        return environment.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as error:
        raise ConfigError(f"the model's chat template does not parse: {error}") from None
