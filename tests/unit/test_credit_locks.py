"""Credit locks on the committee state machine (abci_app/credit_locks.py; issue 42, attack 4):
the first lock of a credit wins, deterministically in block order; a second node's lock and
redemption are refused CREDIT_LOCKED by name (in CheckTx already, from the committed state); a
lock sent again is a no-op; a lock lasts as long as its credit's window, then goes."""

from __future__ import annotations

from pathlib import Path

import pytest

from abci_app.codes import Code
from protocol.blind_bls import ThresholdCredit
from protocol.committee.credit_locks import MAX_LOCKS, CreditLock
from protocol.committee.envelope import decode
from protocol.committee.grammar import TxDecodeError
from protocol.paid_credits import spent_id
from tests.credit_chain import epoch_now, minted, node_chain, redeem
from tests.unit.test_abci_settlement import ask, next_epoch_end
from tests.unit.test_abci_state import make_routable, register

pytestmark = pytest.mark.unit


def lock(credits: list[ThresholdCredit], shard: int = 0, epoch: int = 1) -> CreditLock:
    """A lock of `credits` under `epoch` (a credit names its key period only: a node locks it
    under the chain's epoch, node/agent/credit_locker.py; epoch 1 is in every window here but
    the lifetime test's)."""
    return CreditLock("m", shard, tuple(sorted((spent_id(c), epoch) for c in credits)))


def test_the_first_lock_wins_the_second_node_is_refused_by_name_and_cannot_redeem(
    tmp_path: Path,
) -> None:
    chain, a = node_chain(tmp_path)
    b = register(chain, "other-node", shards=(0,))
    make_routable(chain, b)
    credits, _ = minted(chain, tmp_path, count=3)
    # one block, two nodes locking the same credit: the earlier tx wins, the later is refused
    every = lock(credits)
    [first, second] = chain.block([chain.tx(lock(credits[:1]), a), chain.tx(every, b)])
    assert first.code == Code.OK, first.log
    index = [identifier for identifier, _ in every.locks].index(spent_id(credits[0]))
    assert second.code == Code.CREDIT_LOCKED and f"credit {index}:" in second.log
    answer = ask(chain, f"/credit_lock?id={spent_id(credits[0])}")
    assert answer["node"] == a.verify_key.encode().hex() and answer["spent"] is None
    # the refused tx wrote nothing: the other two credits are free for b
    rest = lock(credits[1:])
    assert chain.block([chain.tx(rest, b)])[0].code == Code.OK
    # CheckTx names the contested credit from the committed state, before any block
    refused = chain.machine.check_tx(chain.tx(lock(credits[:1]), b))
    assert refused.code == Code.CREDIT_LOCKED and "locked by node" in refused.log
    # b holds the credit too (the client showed it to both): its redemption is refused by name
    stolen = redeem(chain, b, credits[:1])
    assert stolen.code == Code.CREDIT_LOCKED, stolen.log
    assert redeem(chain, a, credits[:1]).code == Code.OK
    assert redeem(chain, b, credits[1:]).code == Code.OK
    # a redeemed credit cannot be locked again (CheckTx and FinalizeBlock)
    assert chain.machine.check_tx(chain.tx(lock(credits[:1]), b)).code == Code.CREDIT_SPENT
    [late] = chain.block([chain.tx(lock(credits[:1]), a)])
    assert late.code == Code.CREDIT_SPENT, late.log


def test_a_lock_sent_again_is_a_no_op_and_an_unlocked_credit_is_redeemed_as_before(
    tmp_path: Path,
) -> None:
    chain, a = node_chain(tmp_path)
    credits, _ = minted(chain, tmp_path, count=2)
    body = lock(credits[:1])
    assert chain.block([chain.tx(body, a)])[0].code == Code.OK
    height = ask(chain, f"/credit_lock?id={spent_id(credits[0])}")["height"]
    # the same lock again (an answer lost on the way back): accepted, the first height kept
    assert chain.machine.check_tx(chain.tx(body, a)).code == Code.OK
    assert chain.block([chain.tx(body, a)])[0].code == Code.OK
    assert ask(chain, f"/credit_lock?id={spent_id(credits[0])}")["height"] == height
    # the same signed tx replayed: its nonce is used
    raw = chain.tx(body, a)
    assert chain.block([raw])[0].code == Code.OK
    assert chain.block([raw])[0].code == Code.BAD_NONCE
    assert redeem(chain, a, credits).code == Code.OK  # one locked, one never locked


def test_a_lock_lasts_as_long_as_its_credit_can_be_redeemed(tmp_path: Path) -> None:
    chain, a = node_chain(tmp_path, lifetime_epochs=2, retention_epochs=1)
    credits, _ = minted(chain, tmp_path, count=1)
    e = epoch_now(chain)  # locked under the chain's epoch, as the node's agent does
    assert chain.block([chain.tx(lock(credits, epoch=e), a)])[0].code == Code.OK
    identifier = spent_id(credits[0])
    for _ in range(2):  # to epoch e + 2, the last that redeems it: still locked
        next_epoch_end(chain)
    assert epoch_now(chain) == e + 2
    assert ask(chain, f"/credit_lock?id={identifier}")["node"] is not None
    next_epoch_end(chain)  # past the window: a lock of it is refused, and the entry goes
    [late] = chain.block([chain.tx(lock(credits, epoch=e), a)])
    assert late.code == Code.CREDIT_EPOCH, late.log
    for _ in range(3):
        next_epoch_end(chain)
    assert ask(chain, f"/credit_lock?id={identifier}")["node"] is None


def test_who_may_lock_and_the_tx_is_parsed_at_the_boundary(tmp_path: Path) -> None:
    chain, a = node_chain(tmp_path)
    stranger = register(chain, "stranger-node", shards=(0,))  # registered, not on shard 1
    credits, _ = minted(chain, tmp_path, count=1)
    [wrong_shard] = chain.block([chain.tx(lock(credits, shard=1), stranger)])
    assert wrong_shard.code == Code.REDEEM_SHARD, wrong_shard.log
    ids = [["0" * 63 + str(i), 1] for i in range(2)]
    with pytest.raises(TxDecodeError, match="strictly ascending"):
        CreditLock.from_json({"locks": ids[::-1], "model": "m", "shard": 0})
    with pytest.raises(TxDecodeError, match="strictly ascending"):
        CreditLock.from_json({"locks": [ids[0], ids[0]], "model": "m", "shard": 0})
    with pytest.raises(TxDecodeError, match="locks"):
        CreditLock.from_json({"locks": [], "model": "m", "shard": 0})
    with pytest.raises(TxDecodeError, match="id"):
        CreditLock.from_json({"locks": [["AB" * 32, 1]], "model": "m", "shard": 0})
    with pytest.raises(TxDecodeError, match="at most"):
        many = [[f"{i:064x}", 1] for i in range(MAX_LOCKS + 1)]
        CreditLock.from_json({"locks": many, "model": "m", "shard": 0})
    body = lock(credits)
    assert decode(chain.tx(body, a)).body == body
