"""The verifier's scores file is exactly what the validator's ExtendVote accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from abci_app import extensions
from node.verifier.report import SCORES_FILE, scores_report, write_scores
from protocol.canonical import canonical_json
from protocol.errors import UsageError

pytestmark = pytest.mark.unit

A, B, C = "a" * 64, "b" * 64, "0123456789abcdef" * 4


def test_write_scores_is_canonical_and_parsed_by_the_abci_app(tmp_path: Path) -> None:
    path = write_scores(tmp_path / SCORES_FILE, 3, {B: 812_345, A: 1_000_000}, invalid=[C])
    raw = path.read_bytes()
    doc = json.loads(raw)
    assert raw == canonical_json(doc)
    assert list(doc["scores"]) == [A, B]
    report = extensions.parse_report(doc["scores"], doc["invalid"])
    assert report.scores == {A: 1_000_000, B: 812_345}
    assert raw == extensions.encode_extension(3, {A: 1_000_000, B: 812_345}, (C,))
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize(
    ("scores", "invalid"),
    [
        ({A: 1_000_001}, []),
        ({A: -1}, []),
        ({A: True}, []),
        ({A: 0.5}, []),
        ({"A" * 64: 1}, []),
        ({A[:63]: 1}, []),
        ({A: 1}, [A]),
        ({}, ["zz"]),
    ],
)
def test_scores_report_refuses_what_the_chain_would_refuse(scores: dict, invalid: list) -> None:
    with pytest.raises(UsageError):
        scores_report(1, scores, invalid)


def test_scores_report_refuses_negative_epoch() -> None:
    with pytest.raises(UsageError):
        scores_report(-1, {}, [])
