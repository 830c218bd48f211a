"""Prices on the committee chain (abci_app/prices.py): a node registers what a credit buys on
its shard, changes count from the next epoch, and a redemption consumes N × price committed
served positions (coverage.py), never fewer."""

from __future__ import annotations

from pathlib import Path

import pytest
from nacl.signing import SigningKey

from abci_app.codes import Code
from protocol.committee.credits import CreditRedeem
from protocol.committee.prices import DEFAULT_PRICE_POSITIONS, SetPrice, going_price
from tests.committee_chain import Chain
from tests.credit_chain import LAYER_TOKENS, minted, node_chain
from tests.unit.test_abci_settlement import ask, evm_of, next_epoch_end, one
from tests.unit.test_abci_state import commit_served, hexkey, register

pytestmark = pytest.mark.unit


def epoch_now(chain: Chain) -> int:
    return chain.state.height // chain.state.genesis.epoch_length + 1  # the next block's


def price_of(chain: Chain, node: SigningKey, shard: int = 0) -> dict:
    rows = ask(chain, f"/prices?model=m&node={hexkey(node)}")["prices"]
    [row] = [r for r in rows if r["shard"] == shard]
    return row


def set_price(chain: Chain, node: SigningKey, positions: int, shard: int = 0) -> None:
    result = one(chain, SetPrice("m", shard, positions), node)
    assert result.code == Code.OK, result.log


def credited(chain: Chain) -> int:
    found = ask(chain, f"/credits?account={evm_of('credit-node')}")["credits"]
    return sum(c["layer_tokens"] for c in found)


def start_of_epoch(chain: Chain) -> None:
    """Room for a few blocks in this epoch (the tests' steps must not straddle a close)."""
    length = chain.state.genesis.epoch_length
    assert length >= 12
    if chain.state.height % length > length - 10:
        next_epoch_end(chain)


def test_prices_first_counts_now_a_change_only_from_the_next_epoch(tmp_path: Path) -> None:
    chain, node = node_chain(tmp_path, price=None, heartbeat_timeout=10_000, epoch_length=20)
    start_of_epoch(chain)
    epoch = epoch_now(chain)
    set_price(chain, node, 64)
    assert price_of(chain, node) == {
        "node": hexkey(node),
        "model": "m",
        "shard": 0,
        "positions": 64,
        "next": None,
    }
    set_price(chain, node, 128)  # a raise mid-epoch: the epoch keeps its price
    set_price(chain, node, 96)  # a second change in the epoch replaces the first
    row = price_of(chain, node)
    assert row["positions"] == 64 and row["next"] == {"epoch": epoch + 1, "positions": 96}
    assert ask(chain, f"/node?key={hexkey(node)}")["prices"] == {"0": 64}
    next_epoch_end(chain)
    assert price_of(chain, node)["positions"] == 96 and price_of(chain, node)["next"] is None
    set_price(chain, node, 32)
    set_price(chain, node, 96)  # back to the epoch's price: the pending change is cancelled
    assert price_of(chain, node)["next"] is None


def test_prices_only_a_compute_node_prices_only_its_own_shards(tmp_path: Path) -> None:
    chain, node = node_chain(tmp_path, price=None, epoch_length=20)
    foreign = one(chain, SetPrice("m", 7, 64), node)
    assert foreign.code == Code.PRICE_SHARD, foreign.log
    other_model = one(chain, SetPrice("other", 0, 64), node)
    assert other_model.code == Code.PRICE_SHARD, other_model.log
    verifier = register(chain, "a-verifier", role="verifier")
    assert one(chain, SetPrice("m", 0, 64), verifier).code == Code.WRONG_ROLE


def test_prices_a_redemption_over_the_registered_price_is_refused_by_name(tmp_path: Path) -> None:
    chain, node = node_chain(tmp_path, price=None, heartbeat_timeout=10_000, epoch_length=20)
    credits, _ = minted(chain, tmp_path, count=3)
    set_price(chain, node, 64)
    # one session of 2 blocks: 64 positions, plus 63 for its last credit paid ahead = 127
    commit_served(chain, node, shard=0, blocks=2)
    over = one(chain, CreditRedeem("m", 0, tuple(credits[:2])), node)
    assert over.code == Code.REDEMPTION_OVER_PRICE, over.log
    assert "64 positions each need 128" in over.log and credited(chain) == 0
    assert one(chain, CreditRedeem("m", 0, (credits[0],)), node).code == Code.OK
    again = one(chain, CreditRedeem("m", 0, (credits[1],)), node)  # 63 left: under one credit's 64
    assert again.code == Code.REDEMPTION_OVER_PRICE, again.log
    assert credited(chain) == LAYER_TOKENS


def test_prices_a_node_with_no_price_above_0_redeems_nothing(tmp_path: Path) -> None:
    """No registered price, or 0 (free): the chain says a credit buys nothing there, so no
    credit is redeemed there, whatever was committed (before: 1 position per credit)."""
    chain, node = node_chain(tmp_path, price=None, heartbeat_timeout=10_000, epoch_length=20)
    credits, _ = minted(chain, tmp_path, count=2)
    commit_served(chain, node, shard=0, blocks=2)
    unpriced = one(chain, CreditRedeem("m", 0, (credits[0],)), node)
    assert unpriced.code == Code.REDEMPTION_UNPRICED, unpriced.log
    assert "set_price first" in unpriced.log
    set_price(chain, node, 0)
    free = one(chain, CreditRedeem("m", 0, (credits[0],)), node)
    assert free.code == Code.REDEMPTION_UNPRICED, free.log
    assert credited(chain) == 0
    next_epoch_end(chain)
    set_price(chain, node, 32)  # from the next epoch: this one is still free
    assert one(chain, CreditRedeem("m", 0, (credits[0],)), node).code == Code.REDEMPTION_UNPRICED
    next_epoch_end(chain)
    commit_served(chain, node, shard=0, blocks=1)
    paid = one(chain, CreditRedeem("m", 0, (credits[0],)), node)
    assert paid.code == Code.OK, paid.log
    assert credited(chain) == LAYER_TOKENS


def test_prices_each_session_s_last_credit_may_be_used_in_part(tmp_path: Path) -> None:
    """A client pays ahead: a session of s positions costs ceil(s / price) credits, so each
    committed session covers price − 1 positions beyond its records, no more."""
    chain, node = node_chain(tmp_path, price=None, heartbeat_timeout=10_000, epoch_length=20)
    credits, _ = minted(chain, tmp_path, count=3)
    set_price(chain, node, 64)
    commit_served(chain, node, shard=0, blocks=1)  # two sessions of one block (≤ 32 positions):
    commit_served(chain, node, shard=0, blocks=1)  # a credit each
    assert one(chain, CreditRedeem("m", 0, tuple(credits[:2])), node).code == Code.OK
    third = one(chain, CreditRedeem("m", 0, (credits[2],)), node)
    assert third.code == Code.REDEMPTION_OVER_PRICE, third.log


def test_prices_a_node_that_raises_its_price_mid_epoch_is_paid_the_registered_one(
    tmp_path: Path,
) -> None:
    """Raising a price asks more credits for the same work: a credit per 16 positions instead
    of 64. Its clients pay what the chain said at the epoch's start, and so is the node."""
    chain, node = node_chain(tmp_path, price=None, heartbeat_timeout=10_000, epoch_length=20)
    credits, _ = minted(chain, tmp_path, count=3)
    start_of_epoch(chain)  # the steps below in one epoch
    set_price(chain, node, 64)
    set_price(chain, node, 16)  # raised mid-epoch: counts from the next epoch
    commit_served(chain, node, shard=0, blocks=2)  # 64 positions + 63: one credit at 64
    over = one(chain, CreditRedeem("m", 0, tuple(credits[:2])), node)  # at 16 each, 32 would do
    assert over.code == Code.REDEMPTION_OVER_PRICE, over.log
    assert "registered price of 64 positions each" in over.log and credited(chain) == 0
    assert one(chain, CreditRedeem("m", 0, (credits[0],)), node).code == Code.OK
    assert credited(chain) == LAYER_TOKENS
    next_epoch_end(chain)  # the raise counts now: a session of 32 positions buys two credits
    assert price_of(chain, node)["positions"] == 16
    commit_served(chain, node, shard=0, blocks=1)
    paid = one(chain, CreditRedeem("m", 0, tuple(credits[1:])), node)
    assert paid.code == Code.OK, paid.log


def test_prices_a_price_cut_mid_epoch_waits_too(tmp_path: Path) -> None:
    """The other way: a credit per 256 positions announced mid-epoch; this epoch still 16."""
    chain, node = node_chain(tmp_path, price=None, heartbeat_timeout=10_000, epoch_length=20)
    credits, _ = minted(chain, tmp_path, count=3)
    start_of_epoch(chain)
    set_price(chain, node, 16)
    set_price(chain, node, 256)
    commit_served(chain, node, shard=0, blocks=1)  # 32 positions + 15: two credits at 16
    paid = one(chain, CreditRedeem("m", 0, tuple(credits[:2])), node)
    assert paid.code == Code.OK, paid.log  # at 256 each, two credits would need 512
    assert credited(chain) == 2 * LAYER_TOKENS
    over = one(chain, CreditRedeem("m", 0, (credits[2],)), node)
    assert over.code == Code.REDEMPTION_OVER_PRICE and "16 positions each" in over.log


def test_prices_the_going_price_is_the_median_or_the_default(tmp_path: Path) -> None:
    assert going_price([]) == going_price([0, 0]) == DEFAULT_PRICE_POSITIONS
    assert going_price([128, 0, 16, 64]) == 64
    assert going_price([32, 16, 64, 128]) == 32
    chain, node = node_chain(tmp_path, price=None, epoch_length=20)

    def going() -> int:  # what `planet join` works out from the pages (one here)
        answer = ask(chain, "/prices?model=m")
        assert answer["next"] is None
        return going_price([r["positions"] for r in answer["prices"] if r["positions"]])

    assert going() == DEFAULT_PRICE_POSITIONS
    set_price(chain, node, 48)
    assert going() == 48
    assert ask(chain, "/prices?model=other")["prices"] == []


def test_prices_go_with_an_expired_registration() -> None:
    from tests.unit.test_abci_settlement import settled_chain

    chain = settled_chain(registration_ttl=10, epoch_length=20)
    node = register(chain, "never-staked", shards=(0,))
    set_price(chain, node, 64)
    assert ask(chain, "/prices?model=m")["prices"] != []
    chain.advance_to(chain.state.height + 12)  # unstaked past its ttl: deleted
    assert ask(chain, "/prices?model=m")["prices"] == []
    assert list(chain.state.committed_items("price")) == []
