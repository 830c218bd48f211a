"""Credits a node earned on a shard it moved away from (`move_shards`, rebalancing) stay
lockable and redeemable there for their window (abci_app/left_shards.py): held to the price and
the committed positions it had there; a shard it never served, or left too long ago, is
REDEEM_SHARD."""

from __future__ import annotations

from pathlib import Path

import pytest

from abci_app import schema
from abci_app.codes import Code
from protocol.committee.credit_locks import CreditLock
from protocol.committee.credits import CreditRedeem
from protocol.committee.registry import MoveShards
from protocol.paid_credits import spent_id
from tests.credit_chain import epoch_now, minted, node_chain, send
from tests.unit.test_abci_settlement import next_epoch_end
from tests.unit.test_abci_state import commit_served, hexkey

pytestmark = pytest.mark.unit


def test_credits_earned_on_a_shard_left_are_locked_and_redeemed_there(tmp_path: Path) -> None:
    chain, node = node_chain(tmp_path)  # serves shards 0 and 1, priced 1 on both
    credits, _ = minted(chain, tmp_path, count=3)
    commit_served(chain, node, 0, blocks=1)  # what it served on shard 0, committed
    assert send(chain, MoveShards((2,), "http://new"), node).code == Code.OK
    assert chain.state.get(schema.PRICE, schema.price_key(hexkey(node), 0)) is None
    # the old process drained a session after the move and was paid: locked on shard 0
    lock = CreditLock("m", 0, ((spent_id(credits[2]), epoch_now(chain)),))
    locked = send(chain, lock, node)
    assert locked.code == Code.OK, locked.log
    redeemed = send(chain, CreditRedeem("m", 0, tuple(credits)), node)
    assert redeemed.code == Code.OK, redeemed.log
    [(key, record)] = chain.state.items(schema.CREDIT)
    assert record["shard"] == 0 and key.split("/")[2] == "00000"
    # still held to what it committed there: nothing left on shard 0 for more
    more, _ = minted(chain, tmp_path, count=1)
    assert send(chain, CreditRedeem("m", 7, tuple(more)), node).code == Code.REDEEM_SHARD
    assert send(chain, CreditRedeem("m", 2, tuple(more)), node).code != Code.REDEEM_SHARD


def test_a_shard_left_is_redeemable_for_the_credit_lifetime_and_one_epoch_only(
    tmp_path: Path,
) -> None:
    chain, node = node_chain(tmp_path, lifetime_epochs=2)
    commit_served(chain, node, 0, blocks=4)
    assert send(chain, MoveShards((2,), "http://new"), node).code == Code.OK
    price = chain.state.get(schema.PRICE, schema.price_key(hexkey(node), 2))  # none: 2 shards
    entries = dict(chain.state.items(schema.LEFT_SHARD))
    assert price is None and sorted(k.split("/")[1] for k in entries) == ["00000", "00001"]
    left = {int(k.split("/")[2]) for k in entries}.pop()  # the epoch of the move
    assert all(e["price"]["schedule"] for e in entries.values())  # its prices there, kept
    while epoch_now(chain) < left + 2 + 1:
        next_epoch_end(chain)
    assert epoch_now(chain) == left + 3  # the last epoch of the window
    credits, _ = minted(chain, tmp_path, count=2)
    last = send(chain, CreditRedeem("m", 0, tuple(credits[:1])), node)
    assert last.code != Code.REDEEM_SHARD, last.log
    next_epoch_end(chain)
    late = send(chain, CreditRedeem("m", 0, tuple(credits[1:])), node)
    assert late.code == Code.REDEEM_SHARD, late.log


def test_a_credit_redeemed_on_a_shard_left_cannot_be_redeemed_again_on_the_new_one(
    tmp_path: Path,
) -> None:
    """The window on a shard left is a second place to redeem, never a second payment: the
    credits' spent ids are the chain's, whatever the shard."""
    chain, node = node_chain(tmp_path)
    credits, _ = minted(chain, tmp_path, count=2)
    commit_served(chain, node, 0, blocks=1)
    commit_served(chain, node, 1, blocks=1)
    assert send(chain, MoveShards((1,), "http://new"), node).code == Code.OK
    first = send(chain, CreditRedeem("m", 0, tuple(credits)), node)
    assert first.code == Code.OK, first.log
    again = send(chain, CreditRedeem("m", 1, tuple(credits)), node)
    assert again.code == Code.CREDIT_SPENT, again.log
    replayed = send(chain, CreditRedeem("m", 0, tuple(credits)), node)
    assert replayed.code == Code.CREDIT_SPENT, replayed.log
