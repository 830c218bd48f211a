"""Hostile credit txs: every malformed body is a named decode error, and every decodable but
wrong value (signatures of the wrong length, foreign messages, oversized blinded messages) is a
named result code, never an exception in FinalizeBlock (which would halt the validator)."""

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
from protocol.committee.credits import CreditKey, FundMint, Mint, Redeem
from protocol.committee.envelope import decode, sign
from protocol.committee.grammar import TxDecodeError
from protocol.credits import PREPARED_BYTES, Credit
from tests.committee_chain import seeded_key
from tests.unit.test_abci_credits import (
    keys_of,
    mint,
    minted,
    node_chain,
    publish_keys,
    redeem,
    send,
)

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


CREDIT = Credit(1, b"\x00" * PREPARED_BYTES, (("A" * 40, b"\x01" * 256), ("B" * 40, b"\x02" * 256)))
REDEEM = Redeem("m", 0, (CREDIT,)).to_json()
KEY = CreditKey(1, b"\x30" * 300).to_json()
FUND = FundMint("0x" + "ab" * 32).to_json()


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_mutations(REDEEM), _mutations(KEY), _mutations(FUND)))
def test_credits_hostile_mutated_bodies_decode_or_raise_the_named_error(body: Any) -> None:
    for cls in (Redeem, CreditKey, FundMint):
        with contextlib.suppress(TxDecodeError):
            cls.from_json(body)


def test_credits_hostile_mutated_mint_bodies(tmp_path: Path) -> None:
    chain, _ = node_chain()
    publish_keys(chain, 1, tmp_path)
    doc = mint(chain, keys_of(chain, 1), 2).body.to_json()

    @settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
    @given(_mutations(doc))
    def check(body: Any) -> None:
        with contextlib.suppress(TxDecodeError):
            Mint.from_json(body)

    check()


def test_credits_hostile_decodable_but_wrong_values_are_named_codes(tmp_path: Path) -> None:
    chain, node = node_chain(epoch_length=50)
    credits, keys, _ = minted(chain, tmp_path, count=1)
    credit = credits[0]
    address = credit.signatures[0][0]
    cases = [
        Credit(credit.epoch, credit.prepared, ((address, b"\x01" * 10),)),  # short signature
        Credit(credit.epoch, credit.prepared, ((address, b"\xff" * 256),)),  # ≥ n
        Credit(credit.epoch, b"\x00" * PREPARED_BYTES, credit.signatures),  # not a credit
        Credit(credit.epoch, credit.prepared, (("F" * 40, credit.signatures[0][1]),)),
        Credit(credit.epoch, credit.prepared, tuple(reversed(credit.signatures))),
        Credit(credit.epoch, credit.prepared, (credit.signatures[0], credit.signatures[0])),
    ]
    for case in cases:
        result = redeem(chain, node, [case])
        assert result.code == Code.CREDIT_INVALID, (case, result.log)
    body = mint(chain, keys_of(chain, keys.epoch), 1).body
    first = sorted(body.blinded)[0]
    oversized = {**body.blinded, first: (b"\xff" * len(body.blinded[first][0]),)}
    result = send(chain, replace(body, blinded=oversized), seeded_key("mint-sender"))
    assert result.code == Code.MINT_INVALID, result.log
    raw = sign(Redeem("m", 0, (credit,)), seeded_key("x"), 1).encode()
    assert decode(raw).body.credits == (credit,)
