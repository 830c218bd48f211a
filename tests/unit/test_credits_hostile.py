"""Hostile credit txs: every malformed body is a named decode error, and every decodable but
wrong value (a σ that is not the credit's, a nonce altered, a period without a key, blinded
points off the curve or the identity) is a named result code, never an exception in
FinalizeBlock (which would halt the validator)."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from abci_app.codes import Code
from protocol import blind_bls, bls
from protocol.blind_bls import ThresholdCredit
from protocol.committee.credits import CreditMint, CreditRedeem, FundMint
from protocol.committee.envelope import decode, sign
from protocol.committee.grammar import TxDecodeError
from tests.committee_chain import seeded_key
from tests.credit_chain import minted, node_chain, redeem, request, send

pytestmark = pytest.mark.unit

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


def _mutations(doc: Any) -> st.SearchStrategy[Any]:
    """`doc` with one value anywhere replaced by arbitrary JSON."""
    paths: list[tuple[Any, ...]] = []

    def walk(value: Any, path: tuple[Any, ...]) -> None:
        paths.append(path)
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, (*path, key))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, (*path, index))

    walk(doc, ())

    def replace_at(path: tuple[Any, ...], new: Any) -> Any:
        if not path:
            return new
        copy = json.loads(json.dumps(doc))
        target = copy
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = new
        return copy

    return st.builds(replace_at, st.sampled_from(paths), JSON)


CREDIT = ThresholdCredit(1, b"\x00" * 32, bls.g1_bytes(bls.g1_generator()))
REDEEM = CreditRedeem("m", 0, (CREDIT,)).to_json()
FUND = FundMint("0x" + "ab" * 32).to_json()


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_mutations(REDEEM), _mutations(FUND)))
def test_credits_hostile_mutated_bodies_decode_or_raise_the_named_error(body: Any) -> None:
    for cls in (CreditRedeem, FundMint):
        with contextlib.suppress(TxDecodeError):
            cls.from_json(body)


def test_credits_hostile_mutated_mint_bodies(tmp_path: Path) -> None:
    chain, _ = node_chain(tmp_path)
    doc = request(chain, 2).body.to_json()

    @settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
    @given(_mutations(doc))
    def check(body: Any) -> None:
        with contextlib.suppress(TxDecodeError):
            CreditMint.from_json(body)

    check()


def test_credits_hostile_decodable_but_wrong_values_are_named_codes(tmp_path: Path) -> None:
    chain, node = node_chain(tmp_path, epoch_length=50)
    credits, _ = minted(chain, tmp_path, count=2)
    credit = credits[0]
    other_point = bls.g1_bytes(bls.g1_mul(bls.g1_generator(), 5))
    cases = [
        replace(credit, signature=credits[1].signature),  # another credit's σ
        replace(credit, signature=other_point),  # a point, no signature
        replace(credit, nonce=b"\x00" * 32),  # not the nonce σ signs
        replace(credit, period=credit.period + 1000),  # a period without a key
    ]
    for case in cases:
        result = redeem(chain, node, [case])
        assert result.code in (Code.CREDIT_INVALID, Code.CREDIT_EPOCH), (case, result.log)
    body = request(chain, 2).body
    identity = bls.g1_bytes(bls.g1_identity())
    off_curve = bytes([0x80 | 0x1F]) + b"\xff" * 47  # compressed flag, x ≥ p
    for bad in (identity, off_curve):
        result = send(chain, replace(body, blinded=(bad, body.blinded[1])), seeded_key("s"))
        assert result.code in (Code.MINT_INVALID, Code.MALFORMED_TX), result.log
    unblinded = blind_bls.blind(0, b"\x05" * 32)
    assert unblinded.blinded not in body.blinded
    raw = sign(CreditRedeem("m", 0, (credit,)), seeded_key("x"), 1).encode()
    [decoded] = decode(raw).body.credits  # the credit's bytes (the wallet's seed stays home)
    assert decoded.to_bytes() == credit.to_bytes()
    assert redeem(chain, node, credits).code == Code.OK  # the good ones, untouched
