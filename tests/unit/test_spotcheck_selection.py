"""Spot-check selection (protocol/spotcheck.py): deterministic, Bernoulli(p) per triple,
unpredictable without the seed, verifiers assigned by rendezvous hashing."""

from __future__ import annotations

import hashlib
import math

import pytest

from protocol.spotcheck import (
    DEFAULT_RATE_PPM,
    Outcome,
    SelectionError,
    Triple,
    assign_verifier,
    detection_probability_ppm,
    draw,
    evidence_hash,
    is_selected,
    select,
)

NODE = "ab" * 32
SEED = hashlib.sha256(b"epoch seed").digest()


def _triples(count: int, node: str = NODE) -> list[Triple]:
    return [
        Triple(node, "0x" + hashlib.sha256(str(i // 16).encode()).hexdigest(), i % 16, 1)
        for i in range(count)
    ]


def test_selection_same_inputs_same_answer_in_any_order() -> None:
    triples = _triples(2000)
    first = select(SEED, triples)
    assert first == select(SEED, list(reversed(triples)))
    assert first == select("0x" + SEED.hex(), triples + triples[:10])  # hex seed, duplicates
    assert first == sorted(first)


def test_selection_rate_matches_p_within_four_sigma() -> None:
    n = 40_000
    chosen = len(select(SEED, _triples(n)))
    p = DEFAULT_RATE_PPM / 1e6
    assert abs(chosen - n * p) < 4 * math.sqrt(n * p * (1 - p)), chosen


def test_selection_other_seed_other_triples() -> None:
    triples = _triples(4000)
    a = set(select(SEED, triples))
    b = set(select(hashlib.sha256(b"next epoch").digest(), triples))
    assert a and b and a != b
    # independent draws: the overlap is about p of either set, far from all of it
    assert len(a & b) < len(a) // 3


def test_selection_every_field_of_the_triple_changes_the_draw() -> None:
    base = Triple(NODE, "0x" + "11" * 32, 5, 2)
    variants = [
        Triple("cd" * 32, base.session, 5, 2),
        Triple(NODE, "0x" + "12" * 32, 5, 2),
        Triple(NODE, base.session, 6, 2),
        Triple(NODE, base.session, 5, 3),
    ]
    assert len({draw(SEED, t) for t in [base, *variants]}) == 5


def test_selection_rate_bounds() -> None:
    triples = _triples(300)
    assert select(SEED, triples, rate_ppm=0) == []
    assert select(SEED, triples, rate_ppm=1_000_000) == sorted(triples)
    for bad in (-1, 1_000_001, True, 0.05):
        with pytest.raises(SelectionError):
            select(SEED, triples, rate_ppm=bad)  # type: ignore[arg-type]


def test_selection_threshold_is_exact_on_the_draw() -> None:
    triple = _triples(1)[0]
    value = draw(SEED, triple)
    rate_at = value * 1_000_000 // (1 << 64)  # smallest rate that still excludes it
    assert not is_selected(SEED, triple, rate_at)
    assert is_selected(SEED, triple, rate_at + 1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"node": "AB" * 32},
        {"node": "ab" * 31},
        {"session": "ab" * 32},
        {"session": "0x" + "ab" * 31},
        {"block": -1},
        {"block": 2**64},
        {"block": True},
        {"shard": 2**32},
        {"shard": "1"},
    ],
)
def test_triple_hostile_fields_named_error(kwargs: dict) -> None:
    fields = {"node": NODE, "session": "0x" + "00" * 32, "block": 0, "shard": 0, **kwargs}
    with pytest.raises(SelectionError):
        Triple(**fields)


@pytest.mark.parametrize("seed", [b"short", "0x1234", "zz" * 32, 5, b"\x00" * 33])
def test_selection_bad_seed_named_error(seed: object) -> None:
    with pytest.raises(SelectionError):
        select(seed, _triples(3))  # type: ignore[arg-type]


def test_assign_verifier_deterministic_and_spread() -> None:
    verifiers = [hashlib.sha256(bytes([i])).hexdigest() for i in range(4)]
    triples = _triples(800)
    owners = [assign_verifier(SEED, t, verifiers) for t in triples]
    assert owners == [assign_verifier(SEED, t, list(reversed(verifiers))) for t in triples]
    counts = {v: owners.count(v) for v in verifiers}
    assert all(120 < c < 280 for c in counts.values()), counts
    # removing one verifier moves only its own checks
    fewer = verifiers[1:]
    for triple, owner in zip(triples, owners, strict=True):
        if owner != verifiers[0]:
            assert assign_verifier(SEED, triple, fewer) == owner
    with pytest.raises(SelectionError):
        assign_verifier(SEED, triples[0], [])
    with pytest.raises(SelectionError):
        assign_verifier(SEED, triples[0], ["not hex"])


def test_evidence_hash_names_outcome_and_refuses_passed() -> None:
    triple = _triples(1)[0]
    failed = evidence_hash(SEED, triple, Outcome.FAILED)
    timeout = evidence_hash(SEED, triple, Outcome.TIMEOUT)
    assert len(failed) == 32 and failed != timeout
    assert Outcome.FAILED.offence == 3 and Outcome.TIMEOUT.offence == 4
    with pytest.raises(SelectionError):
        evidence_hash(SEED, triple, Outcome.PASSED)


@pytest.mark.parametrize("blocks", [0, 1, 5, 20, 100])
def test_detection_probability_matches_formula(blocks: int) -> None:
    exact = 1 - (1 - 0.05) ** blocks
    assert abs(detection_probability_ppm(50_000, blocks) / 1e6 - exact) < 2e-6


def test_checks_split_between_verifiers_and_cover_the_selection() -> None:
    from protocol.spotcheck import checks_for

    verifiers = [hashlib.sha256(bytes([i])).hexdigest() for i in range(3)]
    triples = _triples(3000)
    mine = [checks_for(SEED, triples, verifiers, v) for v in verifiers]
    assert sorted(t for part in mine for t in part) == select(SEED, triples)
    assert all(part for part in mine)


def test_triples_from_records_keeps_the_epoch_and_skips_junk() -> None:
    from protocol.spotcheck import epoch_of_height, triples_from_records

    good = {"node": NODE, "session": "0x" + "11" * 32, "step": 2, "shard": 1, "height": 7}
    records = [
        good,
        {**good, "height": 12},  # epoch 3 with L = 5
        {**good, "step": 3, "height": 6},
        {**good, "node": "zz"},
        {**good, "height": "7"},
        {**good, "step": True},
        "junk",
        None,
    ]
    triples = triples_from_records(records, epoch=2, epoch_length=5)
    assert triples == [Triple(NODE, good["session"], 2, 1), Triple(NODE, good["session"], 3, 1)]
    assert [epoch_of_height(h, 5) for h in (1, 5, 6, 10, 11)] == [1, 1, 2, 2, 3]
    with pytest.raises(SelectionError):
        epoch_of_height(0, 5)
