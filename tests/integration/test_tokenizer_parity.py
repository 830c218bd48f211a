"""The client's own tokenizer (node/model/tokenizer.py) gives what transformers' AutoTokenizer
gives on the same prepared directory: chat ids, plain ids, decoded text with and without the
special tokens, single tokens' text, the end-of-sequence id. On the devnet's SmolLM2 tokenizer
(a byte-level BPE with its own chat template) and on the tests' tiny word-level one.

Real files, real libraries: the prepared model's tokenizer/ from the shared cache (the lanes
prepare it before they start), transformers as the reference.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.model.head import ClientHead
from node.model.manifest import TOKENIZER_DIR
from node.model.tokenizer import ChatTokenizer
from tests.doubles.tiny_model import make_tiny_model, tiny_words

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Name a planet."},
        {"role": "assistant", "content": "Mars"},
        {"role": "user", "content": "Another one, über-quick: 🪐 ✓"},
    ],
    [{"role": "user", "content": "  spaces\tand\nnew lines  \n"}],
    [{"role": "user", "content": "<|im_start|>user\nnot a real turn<|im_end|>"}],
    [{"role": "user", "content": ""}],
]
TEXTS = [
    "Hello, world!",
    "  leading and trailing  ",
    "naïve café — 東京 🚀",
    "<|im_end|> inside text",
    "line one\nline two\r\n\ttab",
    "",
]


def _smollm2() -> Path:
    from node.model.source import models_dir

    cached = models_dir() / "smollm2-135m-3p-int8" / TOKENIZER_DIR
    if not (cached / "tokenizer.json").is_file():
        from node.model.prepare import prepare

        prepare(parts=3, quant="int8", progress=lambda _msg: None)
    return cached


@pytest.fixture(scope="module", params=["smollm2", "tiny"])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoTokenizer

    if request.param == "smollm2":
        directory = _smollm2()
        texts = TEXTS
    else:
        directory = tmp_path_factory.mktemp("tiny-tokenizer")
        make_tiny_model(directory)
        words = tiny_words()
        texts = [" ".join(words[:7]), f"{words[3]}  {words[90]}\n{words[5]}", "<s> w1 </s> w2", ""]
    ours = ChatTokenizer.load(directory)
    assert ours is not None, f"{directory}: the fast path did not take this tokenizer"
    return ours, AutoTokenizer.from_pretrained(str(directory)), texts


def test_chat_ids_are_transformers(pair) -> None:
    ours, theirs, _ = pair
    for chat in CHATS:
        expected = theirs.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert ours.apply_chat_template(chat, add_generation_prompt=True) == list(expected)
        without = theirs.apply_chat_template(chat, add_generation_prompt=False, tokenize=False)
        assert (
            ours.apply_chat_template(chat, add_generation_prompt=False, tokenize=False) == without
        )


def test_plain_ids_and_text_are_transformers(pair) -> None:
    ours, theirs, texts = pair
    for text in texts:
        ids = ours.encode(text)
        assert ids == list(theirs.encode(text, add_special_tokens=False)), text
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
                ids, skip_special_tokens=skip
            ), (text, skip)
    assert ours.eos_token_id == theirs.eos_token_id is not None


def test_every_token_text_is_transformers(pair) -> None:
    ours, theirs, _ = pair
    vocabulary = len(theirs)
    step = max(1, vocabulary // 3000)  # SmolLM2's 49,152: every 16th, the specials first
    for token in [*range(0, 32), *range(0, vocabulary, step)]:
        assert ours.decode([token]) == theirs.decode([token]), token


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.text(max_size=120))
def test_any_text_round_trips_like_transformers(text: str) -> None:
    ours, theirs = _smollm2_pair()
    ids = ours.encode(text)
    assert ids == list(theirs.encode(text, add_special_tokens=False))
    assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(
        ids, skip_special_tokens=True
    )
    chat = [{"role": "user", "content": text}]
    assert ours.apply_chat_template(chat) == list(
        theirs.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )


@functools.cache
def _smollm2_pair() -> tuple[ChatTokenizer, Any]:
    from transformers import AutoTokenizer

    directory = _smollm2()
    ours = ChatTokenizer.load(directory)
    assert ours is not None
    return ours, AutoTokenizer.from_pretrained(str(directory))


def test_a_prepared_head_uses_the_fast_tokenizer_and_a_template_it_cannot_read_falls_back(
    tmp_path: Path,
) -> None:
    """The devnet's head takes the fast path; a directory whose template marks generation
    spans (transformers' own extension) or that has no tokenizer.json is left to transformers."""
    from node.model.source import models_dir

    head = ClientHead.load(models_dir() / "smollm2-135m-3p-int8" / "manifest.json", "cpu")
    assert isinstance(head.tokenizer, ChatTokenizer)
    assert head.chat_ids(CHATS[0])[-3:] == head.encode("<|im_start|>assistant\n")[-3:]
    marked = tmp_path / "marked"
    marked.mkdir()
    source = _smollm2()
    (marked / "tokenizer.json").write_bytes((source / "tokenizer.json").read_bytes())
    (marked / "chat_template.jinja").write_text("{% generation %}x{% endgeneration %}")
    assert ChatTokenizer.load(marked) is None
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "chat_template.jinja").write_text("{{ messages }}")
    assert ChatTokenizer.load(bare) is None
