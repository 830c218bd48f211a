"""A paid mint gives exactly its credits or its price back (abci_app/mint_partials.py): each
validator posts its partial signatures on the chain (`mint_partials`, batch-verified under its
public share), and a funded mint with fewer than t posted sets at its signing deadline
(`credits.sign_blocks` blocks after its funding) is refunded to its payer, once, as a direct row
of the credit pool's page (settlement.py `close`). Before this, nothing on chain showed whether
partials were delivered: a mint that >1/3 of the validators vouched for and never signed was
lost money for its payer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from abci_app import mint_partials, schema
from abci_app.codes import Code
from abci_app.query_params import QueryError
from abci_app.threshold_queries import partials
from node.watcher.mint_signer import sign_set
from protocol import bls
from protocol.committee.credits import MintPartials
from protocol.committee.envelope import BODY_TYPES
from protocol.committee.grammar import TxDecodeError
from protocol.eip712 import address_of
from tests.committee_chain import Chain, seeded_key
from tests.credit_chain import (
    PAYER,
    PRICE,
    credit_chain,
    fund,
    period_key,
    post_partials,
    request,
    send,
    shares,
)
from tests.unit.test_abci_settlement import ask, rows

pytestmark = pytest.mark.unit

SIGN_BLOCKS = 6
PAYER_ADDRESS = address_of(PAYER).lower()


def _chain(tmp_path: Path, sign_blocks: int = SIGN_BLOCKS) -> Chain:
    return credit_chain(tmp_path, credits_extra={"sign_blocks": sign_blocks})


def _funded(chain: Chain, count: int = 3) -> tuple[str, dict[str, Any]]:
    req = request(chain, count)
    assert send(chain, req.body).code == Code.OK
    fund(chain, req.mint_id)
    return req.mint_id, chain.state.committed(schema.MINT, req.mint_id)


def _set(chain: Chain, tmp_path: Path, validator: int, record: dict[str, Any]) -> tuple[bytes, ...]:
    """Validator `validator`'s honest partials for the mint (its share, the mint's points)."""
    _, share = shares(tmp_path, chain)[validator].share(int(record["period"]))
    return sign_set(share, tuple(bytes.fromhex(p) for p in record["points"]))


def _post(chain: Chain, validator: int, mint: str, partials_: tuple[bytes, ...]) -> Any:
    return send(chain, MintPartials(mint, partials_), chain.validators[validator].key)


def _closes_until(chain: Chain, height: int, since: int | None = None) -> list[int]:
    """Advance through `height` and to the end of its epoch; the epochs closed on the way (or
    since the one of height `since`, which may have closed already)."""
    length = chain.state.genesis.epoch_length
    first = chain.state.height // length + 1 if since is None else (since - 1) // length + 1
    last = -(-height // length)
    chain.advance_to(last * length)
    return list(range(first, last + 1))


def _refund_rows(chain: Chain, epochs: list[int]) -> list[int]:
    return [rows(chain, e).get(PAYER_ADDRESS) for e in epochs if _has_statement(chain, e)]


def _has_statement(chain: Chain, epoch: int) -> bool:
    return chain.state.committed(schema.PAYOUT, schema.epoch_key(epoch)) is not None


# --- posting and verification ------------------------------------------------------------------


def test_mint_partials_valid_sets_are_kept_and_the_t_th_closes_the_refund(tmp_path: Path) -> None:
    chain = _chain(tmp_path)
    mint, record = _funded(chain)
    assert record["deadline"] == record["funded_height"] + SIGN_BLOCKS
    assert record["signers"] == [] and record["refunded_height"] is None
    for v in range(3):
        assert _post(chain, v, mint, _set(chain, tmp_path, v, record)).code == Code.OK
    after = chain.state.committed(schema.MINT, mint)
    assert len(after["signers"]) == 3 == period_key(chain).threshold
    assert list(chain.state.committed_items(schema.MINT_SIGNING)) == []
    # the fourth may still post before the deadline (a client may take any t)
    assert _post(chain, 3, mint, _set(chain, tmp_path, 3, record)).code == Code.OK
    answer = ask(chain, f"/mint_partials?mint={mint}")
    assert [s["index"] for s in answer["sets"]] == [1, 2, 3, 4]
    assert answer["threshold"] == 3 and answer["refunded_height"] is None


def test_mint_partials_a_wrong_partial_is_refused_by_name_and_nothing_kept(
    tmp_path: Path,
) -> None:
    chain = _chain(tmp_path)
    mint, record = _funded(chain)
    honest = _set(chain, tmp_path, 0, record)
    other_point = bls.g1_bytes(bls.g1_mul(bls.g1_generator(), 7))
    wrong = (*honest[:2], other_point)
    result = _post(chain, 0, mint, wrong)
    assert result.code == Code.PARTIALS_INVALID, result.log
    assert chain.state.committed(schema.MINT, mint)["signers"] == []
    assert list(chain.state.committed_items(schema.MINT_PARTIALS)) == []
    # too few partials: refused by name too
    assert _post(chain, 0, mint, honest[:2]).code == Code.PARTIALS_INVALID
    # the validator's honest set still lands afterwards
    assert _post(chain, 0, mint, honest).code == Code.OK


def test_mint_partials_signed_with_another_validators_share_are_refused(tmp_path: Path) -> None:
    chain = _chain(tmp_path)
    mint, record = _funded(chain)
    stolen = _set(chain, tmp_path, 1, record)  # validator 1's valid set, posted by validator 0
    assert _post(chain, 0, mint, stolen).code == Code.PARTIALS_INVALID
    assert _post(chain, 1, mint, stolen).code == Code.OK


def test_mint_partials_replay_is_refused(tmp_path: Path) -> None:
    chain = _chain(tmp_path)
    mint, record = _funded(chain)
    honest = _set(chain, tmp_path, 2, record)
    assert _post(chain, 2, mint, honest).code == Code.OK
    again = _post(chain, 2, mint, honest)
    assert again.code == Code.PARTIALS_REPLAYED, again.log
    assert chain.state.committed(schema.MINT, mint)["signers"] == [chain.validators[2].address]


def test_mint_partials_for_an_unfunded_unknown_mint_or_by_a_stranger_are_refused(
    tmp_path: Path,
) -> None:
    chain = _chain(tmp_path)
    req = request(chain, 2)
    assert send(chain, req.body).code == Code.OK
    record = chain.state.committed(schema.MINT, req.mint_id)
    honest = _set(chain, tmp_path, 0, record)
    assert _post(chain, 0, req.mint_id, honest).code == Code.MINT_UNFUNDED
    assert _post(chain, 0, "0x" + "11" * 32, honest).code == Code.MINT_UNKNOWN
    stranger = send(chain, MintPartials(req.mint_id, honest), seeded_key("not-a-validator"))
    assert stranger.code == Code.NOT_VALIDATOR


def test_mint_partials_after_the_deadline_are_refused(tmp_path: Path) -> None:
    chain = _chain(tmp_path)
    mint, record = _funded(chain)
    chain.advance_to(record["deadline"])
    late = _post(chain, 0, mint, _set(chain, tmp_path, 0, record))
    assert late.code == Code.MINT_SIGNING_CLOSED, late.log


def test_mint_partials_tx_round_trips_and_refuses_malformed_bodies() -> None:
    body = MintPartials("0x" + "ab" * 32, (bls.g1_bytes(bls.g1_generator()),))
    assert MintPartials.from_json(body.to_json()) == body
    for bad in (
        {"mint": body.mint, "partials": []},
        {"mint": body.mint, "partials": ["zz"]},
        {"mint": "0x12", "partials": body.to_json()["partials"]},
        {"mint": body.mint, "partials": body.to_json()["partials"], "extra": 1},
    ):
        with pytest.raises(TxDecodeError):
            MintPartials.from_json(bad)
    assert BODY_TYPES["mint_partials"] is MintPartials  # the envelope knows the type


# --- the deadline and the refund ---------------------------------------------------------------


def test_a_mint_short_of_t_at_its_deadline_is_refunded_once_its_price_exactly(
    tmp_path: Path,
) -> None:
    chain = _chain(tmp_path)
    mint, record = _funded(chain, count=3)
    for v in (0, 1):  # 2 of 4 post: validators 2 and 3 (> 1/3 of the power) withhold
        assert _post(chain, v, mint, _set(chain, tmp_path, v, record)).code == Code.OK
    closed = _closes_until(chain, record["deadline"])
    after = chain.state.committed(schema.MINT, mint)
    assert after["refunded_height"] == record["deadline"]
    assert _refund_rows(chain, closed)[-1] == 3 * PRICE == int(record["amount"])
    # never signed afterwards: the chain refuses late sets, the query answers nothing
    late = _post(chain, 2, mint, _set(chain, tmp_path, 2, record))
    assert late.code == Code.MINT_SIGNING_CLOSED
    with pytest.raises(QueryError) as refused:
        partials(chain.state, shares(tmp_path, chain)[0], {"mint": mint})
    assert refused.value.code == Code.MINT_SIGNING_CLOSED
    # at most once: the following closes pay the payer nothing more
    more = _closes_until(chain, chain.state.height + 3 * chain.state.genesis.epoch_length)
    assert all(r is None for r in _refund_rows(chain, more))
    assert list(chain.state.committed_items(schema.MINT_REFUND)) == []


def test_a_mint_that_reached_t_is_never_refunded(tmp_path: Path) -> None:
    chain = _chain(tmp_path)
    mint, record = _funded(chain)
    bad = tuple(bls.g1_bytes(bls.g1_mul(bls.g1_generator(), 5 + i)) for i in range(3))
    assert _post(chain, 0, mint, bad).code == Code.PARTIALS_INVALID  # one bad validator …
    post_partials(chain, tmp_path, mint, signers=(1, 2, 3))  # … never voids the others
    closed = _closes_until(chain, record["deadline"] + 1)
    assert chain.state.committed(schema.MINT, mint)["refunded_height"] is None
    assert all(r is None for r in _refund_rows(chain, closed))
    req_key = period_key(chain, int(record["period"]))
    assert len(ask(chain, f"/mint_partials?mint={mint}")["sets"]) == 3 >= req_key.threshold


def test_a_refund_the_pool_cannot_pay_yet_waits_whole_and_is_paid_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chain = _chain(tmp_path)
    mint, record = _funded(chain, count=2)
    real = mint_partials.payable
    calls: list[int] = []

    def short_once(refunds: list[tuple[str, str, int]], available: int) -> int:
        if refunds:
            calls.append(len(refunds))
        return 0 if calls == [1] else real(refunds, available)

    monkeypatch.setattr(mint_partials, "payable", short_once)
    first = _closes_until(chain, record["deadline"])
    assert _refund_rows(chain, first[-1:]) in ([], [None])  # not paid in part
    [(key, value)] = chain.state.committed_items(schema.MINT_REFUND)
    assert key == schema.in_epoch(first[-1] + 1, mint)
    assert value == {"payer": PAYER_ADDRESS, "amount": str(2 * PRICE)}
    second = _closes_until(chain, chain.state.height + 1)
    assert _refund_rows(chain, second) == [2 * PRICE]
    assert list(chain.state.committed_items(schema.MINT_REFUND)) == []


def test_payable_pays_whole_refunds_in_order_never_a_part() -> None:
    refunds = [("0xa", "p", 5), ("0xb", "q", 7), ("0xc", "r", 1)]
    assert mint_partials.payable(refunds, 0) == 0
    assert mint_partials.payable(refunds, 11) == 1  # 5, then 7 does not fit: stops (in order)
    assert mint_partials.payable(refunds, 13) == 3


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    signers=st.sets(st.integers(0, 3)),
    count=st.integers(1, 4),
    sign_blocks=st.integers(1, 12),
)
def test_property_a_paid_mint_gives_credits_or_exactly_its_price_never_both(
    tmp_path_factory: pytest.TempPathFactory, signers: set[int], count: int, sign_blocks: int
) -> None:
    """Whichever validators post, the mint ends either signable (≥ t sets: never refunded) or
    refunded exactly its amount, once; the credit pool keeps what it was paid less what it paid
    out (purchases − rows drawn), so a refund comes out of that mint's own purchase."""
    tmp_path = tmp_path_factory.mktemp("prop")
    chain = _chain(tmp_path, sign_blocks)
    mint, record = _funded(chain, count)
    post_partials(chain, tmp_path, mint, signers=sorted(signers))
    after = chain.state.committed(schema.MINT, mint)
    posted = len(after["signers"])
    length = chain.state.genesis.epoch_length
    closed = _closes_until(chain, record["deadline"] + 2 * length, since=record["funded_height"])
    final = chain.state.committed(schema.MINT, mint)
    paid = [r for r in _refund_rows(chain, closed) if r is not None]
    threshold = period_key(chain, int(record["period"])).threshold
    # the sets land in the block after the funding one: ≤ the deadline (sign_blocks ≥ 1)
    if posted >= threshold:
        assert final["refunded_height"] is None and paid == []
    else:
        assert final["refunded_height"] == record["deadline"] and paid == [count * PRICE]
    pool = int(chain.state.committed(schema.CREDIT_POOL, schema.POOL_BALANCE) or 0)
    assert pool == count * PRICE - sum(paid)  # nothing redeemed: the pool keeps the rest
