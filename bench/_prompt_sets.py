"""The two prompt sets speculative decoding is measured and tested on (bench/wan.py,
tests/integration/test_speculation_nodes.py), as chat messages.

HELDOUT: questions and a story opening as the other tests ask them (test_codec_http.py's
question, the compute docs' rainbow question, the first sentences of node/model/data/heldout.txt):
ordinary answers, where prompt lookup rarely guesses right.
REPETITIVE: answers that copy or rework text of the prompt (copy a paragraph, number a list, correct
spelling, edit code), where it often does.
"""

from __future__ import annotations

from node.model.evaluate import heldout_text

Messages = list[dict[str, str]]


def _user(text: str) -> Messages:
    return [{"role": "user", "content": text}]


def heldout_prompts() -> dict[str, Messages]:
    opening = heldout_text().split("\n\n")[0].split(". ")
    return {
        "capital": _user("What is the capital of France?"),
        "rainbow": _user("Explain how a rainbow forms."),
        "story": _user("Continue this story: " + ". ".join(opening[:2]) + "."),
    }


def repetitive_prompts() -> dict[str, Messages]:
    paragraph = heldout_text().split("\n\n")[1]
    items = "apples, pears, plums, cherries, grapes, lemons, oranges, peaches, melons, figs"
    code = (
        "def total(prices):\n"
        "    result = 0\n"
        "    for price in prices:\n"
        "        result = result + price\n"
        "    return result\n\n"
        "def average(prices):\n"
        "    return total(prices) / len(prices)\n"
    )
    return {
        "copy": _user("Repeat the following text exactly, word for word:\n\n" + paragraph),
        "list": _user(f"Write each of these fruits on its own numbered line: {items}."),
        "spelling": _user(
            "Correct the spelling mistakes in this text and change nothing else:\n\n"
            "The lamp room suprised her. She had expected rust and broken glas, but the great "
            "lens was intact, wraped in canvas that someone had tied with care. When she puled "
            "the cloth away, the morning sun struck the prisms."
        ),
        "code": _user(
            "Rewrite this Python code, renaming `prices` to `values` everywhere and "
            "changing nothing else:\n\n" + code
        ),
    }
