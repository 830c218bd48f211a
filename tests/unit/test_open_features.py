"""A node's /info `open_features` (protocol/open_features.py): read at the client's boundary into
`OpenFeatures`; absent is a node of before, unknown names of a newer node are ignored, anything
out of grammar is refused by name (and the cost book then counts the node as one of before);
this code's nodes advertise `next_alternates`."""

from __future__ import annotations

import logging

import pytest

from node.client.costs import CostBook
from protocol.open_features import (
    ADVERTISED,
    MAX_FEATURES,
    NEXT_ALTERNATES,
    OLD_NODE,
    BadOpenFeaturesError,
    OpenFeatures,
    open_features_of,
    parse_open_features,
)

pytestmark = pytest.mark.unit


def test_absent_or_empty_is_a_node_of_before() -> None:
    assert parse_open_features(None) == OLD_NODE == OpenFeatures()
    assert not OLD_NODE.next_alternates
    assert parse_open_features([]) == OLD_NODE
    for info in ({}, {"open_features": None}, None, "not an object", [NEXT_ALTERNATES]):
        assert open_features_of(info) == OLD_NODE


def test_next_alternates_is_read_and_unknown_names_are_ignored() -> None:
    assert parse_open_features([NEXT_ALTERNATES]) == OpenFeatures(next_alternates=True)
    newer = ["route_hints", NEXT_ALTERNATES, "x9_y"]  # a newer node's other features
    assert parse_open_features(newer) == OpenFeatures(next_alternates=True)
    assert parse_open_features(["route_hints"]) == OLD_NODE
    assert open_features_of({"open_features": list(ADVERTISED)}).next_alternates


@pytest.mark.parametrize(
    "value",
    [
        "next_alternates",  # not a list
        {"next_alternates": True},
        True,
        7,
        [NEXT_ALTERNATES, NEXT_ALTERNATES],  # repeated
        ["Next_Alternates"],  # out of grammar
        ["next-alternates"],
        [""],
        ["a" * 33],
        ["ｎext_alternates"],  # full-width letter
        [1],
        [None],
        [[NEXT_ALTERNATES]],
        [f"f{i}" for i in range(MAX_FEATURES + 1)],  # too many
    ],
)
def test_out_of_grammar_is_refused_by_name(value: object) -> None:
    with pytest.raises(BadOpenFeaturesError) as refused:
        parse_open_features(value)
    assert refused.value.code == "bad_open_features"


def test_the_cost_book_reads_them_and_counts_a_bad_advertisement_as_a_node_of_before(
    caplog: pytest.LogCaptureFixture,
) -> None:
    book = CostBook()
    assert book.get("https://1.1.1.1:1").open_features == OLD_NODE  # not read yet
    book.observe_info("https://1.1.1.1:1", {"open_features": [NEXT_ALTERNATES]}, 0.01)
    assert book.get("https://1.1.1.1:1").open_features.next_alternates
    with caplog.at_level(logging.WARNING):
        book.observe_info("https://1.1.1.1:1", {"open_features": "next_alternates"}, 0.01)
    assert book.get("https://1.1.1.1:1").open_features == OLD_NODE
    assert "bad_open_features" in caplog.text
    book.observe_info("https://1.1.1.1:1", {}, 0.01)  # the field gone: a node of before
    assert book.get("https://1.1.1.1:1").open_features == OLD_NODE
