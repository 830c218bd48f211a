"""One credit shown to two nodes at once (issue 42, attack 4), through each node's own parts:
its compute process's `Payments` (node/server/payments.py, node/server/credit_locks.py) and its
agent's `SpoolLocker` and `SpoolRedeemer` (node/agent/credit_locker.py, credit_till.py), both
nodes against the in-process committee chain.

The bound (docs/credits.md "One credit pays one node"): a node serves a session at most
`unlocked` credits' positions beyond the credits whose lock it won, so the node that loses a
credit's lock served at most `unlocked · positions` on it, then stops the session by name
(`credit_double_spent`); the credit pays the winner only, once. With `unlocked` 0 the loser
serves nothing; a lock that never comes stops the session (`credit_lock_timeout`) after the
same bound; and once a lock is committed, every other node refuses the credit when shown it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from node.agent.credit_locker import SpoolLocker
from node.agent.credit_till import CreditTill, SpoolRedeemer
from node.server.credit_locks import (
    CreditDoubleSpentError,
    CreditLockTimeoutError,
    LockMarks,
)
from node.server.payments import (
    Account,
    CreditCheck,
    CreditRefusedError,
    CreditSpool,
    Payments,
)
from protocol.errors import UnavailableError
from protocol.paid_credits import spent_id
from protocol.stream import PaymentRequiredError
from tests.credit_chain import minted, node_chain
from tests.unit.test_abci_state import commit_served, make_routable, price_txs, register
from tests.unit.test_credit_till import ChainLink

pytestmark = pytest.mark.unit

PRICE = 8  # positions per credit


class Node:
    """One node: its compute process's payments and its agent's locker and redeemer."""

    def __init__(
        self,
        chain,
        key,
        spool_dir: Path,
        unlocked: int,
        lock_wait_blocks: int = 60,
        lock_stall_s: float = 5.0,
    ) -> None:
        link = ChainLink(chain, key)
        spool = CreditSpool(spool_dir)
        self.payments = Payments(
            PRICE,
            CreditCheck(link, margin_blocks=1),
            spool,
            wait_s=0.1,
            locks=LockMarks(spool_dir),
            unlocked=unlocked,
            lock_wait_blocks=lock_wait_blocks,
            lock_stall_s=lock_stall_s,
            height_poll_s=0.01,
        )
        self.locker = SpoolLocker(link, "m", 0, spool)
        self.redeemer = SpoolRedeemer(CreditTill(link, "m", 0), spool, locker=self.locker)
        self.account = Account()
        self.served = 0

    async def serve(self, limit: int = 64) -> PaymentRequiredError | None:
        """Frames of one position, as the client sends them, until the node stops the session
        (its error) or `limit` positions were served."""
        while self.served < limit:
            try:
                await self.payments.cover(self.account, 1)
            except PaymentRequiredError as error:
                return error
            self.served += 1
        return None


def _two_nodes(tmp: Path, unlocked: int = 1, lock_wait_blocks: int = 60, lock_stall_s: float = 5.0):
    chain, a = node_chain(tmp)
    b = register(chain, "other-node", shards=(0,))
    make_routable(chain, b)
    chain.block(price_txs(chain, b))
    credits, _ = minted(chain, tmp, count=3)
    nodes = [
        Node(chain, key, tmp / f"spool-{name}", unlocked, lock_wait_blocks, lock_stall_s)
        for name, key in (("a", a), ("b", b))
    ]
    return chain, (a, b), credits, nodes


async def test_one_credit_shown_to_two_nodes_pays_the_first_lock_and_the_other_serves_one_credit(
    tmp_path: Path,
) -> None:
    chain, keys, credits, (a, b) = _two_nodes(tmp_path)
    shared, own_a, own_b = credits
    # the client pays each node two credits at once: one of its own, and the same shared one
    for node, own in ((a, own_a), (b, own_b)):
        await node.payments.accept(node.account, shared)
        await node.payments.accept(node.account, own)
    # both sessions run at once while both nodes' locks are in flight
    sessions = [asyncio.create_task(node.serve()) for node in (a, b)]
    while a.served < PRICE or b.served < PRICE:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # each served one credit's positions and waits for its locks
    assert a.served == PRICE and b.served == PRICE
    assert await a.locker.step() == 2  # a's agent is first: both its locks win
    assert await b.locker.step() == 1  # b's lock of the shared credit is refused by name
    assert b.locker.lost == 1
    assert LockMarks(b.payments.spool.dir).status(spent_id(shared)) == "lost"
    # once a's lock is committed, no other node takes the credit at all (not redeemed yet)
    late = Node(chain, keys[1], tmp_path / "spool-late", 1)
    with pytest.raises(CreditRefusedError, match="locked on the committee chain by node"):
        await late.payments.accept(late.account, own_a)
    # a serves on everything it was paid; b stops the session by name at its next frame
    done_a, stopped = await asyncio.gather(*sessions)
    assert type(done_a) is PaymentRequiredError and a.served == 2 * PRICE
    assert isinstance(stopped, CreditDoubleSpentError) and stopped.code == "credit_double_spent"
    assert b.served == PRICE  # the bound: one credit's positions on the credit it lost
    # the credit pays a once; b's agent drops it and redeems only its own
    commit_served(chain, keys[0], 0, blocks=1)
    commit_served(chain, keys[1], 0, blocks=1)
    assert await a.redeemer.step() == 2
    assert await b.redeemer.step() == 1
    assert list(b.payments.spool.held()) == []
    answer = await a.redeemer.till.link.query("/credit_lock", id=spent_id(shared))
    assert answer["node"] == keys[0].verify_key.encode().hex() and answer["spent"] is not None


async def test_with_no_unlocked_credit_the_node_that_loses_the_lock_serves_nothing(
    tmp_path: Path,
) -> None:
    _, _, credits, (a, b) = _two_nodes(tmp_path, unlocked=0, lock_stall_s=0.3)
    shared = credits[0]
    for node in (a, b):
        await node.payments.accept(node.account, shared)
    await b.locker.step()  # b's agent is first this time
    await a.locker.step()
    assert await b.serve(PRICE) is None and b.served == PRICE
    stopped = await a.serve()
    assert isinstance(stopped, CreditDoubleSpentError) and a.served == 0


async def test_a_lock_that_never_comes_stops_the_session_after_the_same_bound(
    tmp_path: Path,
) -> None:
    """The bound counts committee blocks: a lock not committed within `lock_wait_blocks` blocks
    of the height the credit was taken at stops the session by name, after the same R · N
    positions; one block fewer and the session still waits."""
    chain, _, credits, (a, _) = _two_nodes(tmp_path, unlocked=1, lock_wait_blocks=3)
    for credit in credits[:2]:
        await a.payments.accept(a.account, credit)
    taken = chain.state.height
    session = asyncio.create_task(a.serve())  # no agent pass: neither lock is decided
    for _ in range(3):
        chain.advance_to(chain.state.height + 1)
        await asyncio.sleep(0.05)
        assert not session.done() and a.served == PRICE
    chain.advance_to(taken + 4)
    stopped = await asyncio.wait_for(session, 5)
    assert isinstance(stopped, CreditLockTimeoutError) and stopped.code == "credit_lock_timeout"
    assert f"within 3 committee blocks (taken at height {taken}" in stopped.message
    assert a.served == PRICE


async def test_a_slow_chain_stops_no_session_that_its_locks_reach(tmp_path: Path) -> None:
    """Time does not stop a session while the chain makes blocks: 12 blocks a tenth of a
    second apart against a backstop of 0.5 s (the session waits 1.2 s in all, over twice
    that), and the lock, committed then, lets the session go on. Before, the bound was
    seconds (LOCK_WAIT_S = 20), and a chain of blocks over 20 s stopped every session
    `credit_lock_timeout`."""
    chain, _, credits, (a, _) = _two_nodes(
        tmp_path, unlocked=1, lock_wait_blocks=15, lock_stall_s=0.5
    )
    for credit in credits[:2]:
        await a.payments.accept(a.account, credit)
    session = asyncio.create_task(a.serve(2 * PRICE))
    for _ in range(12):
        await asyncio.sleep(0.1)
        chain.advance_to(chain.state.height + 1)
        assert not session.done() and a.served == PRICE
    assert await a.locker.step() == 2
    assert await asyncio.wait_for(session, 5) is None and a.served == 2 * PRICE


async def test_a_chain_that_makes_no_block_stops_the_session_by_its_backstop(
    tmp_path: Path,
) -> None:
    _, _, credits, (a, _) = _two_nodes(tmp_path, unlocked=1, lock_stall_s=0.3)
    for credit in credits[:2]:
        await a.payments.accept(a.account, credit)
    stopped = await asyncio.wait_for(a.serve(), 5)  # no block, no agent pass
    assert isinstance(stopped, CreditLockTimeoutError) and stopped.code == "credit_lock_timeout"
    assert "made no block" in stopped.message and a.served == PRICE


async def test_a_till_without_a_lock_drops_a_credit_another_node_locked(tmp_path: Path) -> None:
    """A till that redeems without locking first (an agent from before the locks) loses a credit
    another node locked: refused CREDIT_LOCKED by name, dropped, the rest of its batch redeemed."""
    chain, (a, _), credits, (_, node_b) = _two_nodes(tmp_path)
    assert await node_b.locker.step() == 0  # b's spool is empty: nothing to lock yet
    node_b.payments.spool.add(credits[0])
    assert await node_b.locker.step() == 1
    till = CreditTill(ChainLink(chain, a), "m", 0)
    for credit in credits[:2]:
        await till.accept(credit)
    commit_served(chain, a, 0, blocks=1)
    assert await till.redeem() == 1 and till.held == []


class _DroppedLink(ChainLink):
    """A link whose lock txs CometBFT's recheck drops from the mempool: never in a block."""

    def __init__(self, chain, key) -> None:
        super().__init__(chain, key)
        self.signer = key.verify_key.encode().hex()
        self.looks = 0

    async def submit(self, body: Any) -> Any:
        return SimpleNamespace(hash="dropped")

    async def committed_code(self, tx_hash: str, *, timeout_s: float = 15.0) -> tuple[int, str]:
        self.looks += 1
        raise UnavailableError(f"tx {tx_hash} not committed within {timeout_s:g} s")


async def test_a_lock_tx_dropped_because_another_node_locked_first_is_lost_not_waited_on(
    tmp_path: Path,
) -> None:
    """The loser's lock tx never lands (recheck drops it once the winner's block is in): its
    agent reads the lock itself after one look and marks the credit lost, so the compute process
    stops the session as the double spend it is, well before its lock-timeout bound."""
    chain, keys, credits, (a, b) = _two_nodes(tmp_path)
    shared = credits[0]
    for node in (a, b):
        await node.payments.accept(node.account, shared)
    assert await a.locker.step() == 1  # a's lock lands first
    dropped = _DroppedLink(chain, keys[1])
    b.locker.link = dropped
    assert await b.locker.step() == 0
    assert dropped.looks == 1 and b.locker.lost == 1
    assert LockMarks(b.payments.spool.dir).status(spent_id(shared)) == "lost"


async def test_a_lock_tx_not_in_a_block_with_no_other_holder_is_waited_on_then_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nobody holds the credit: nothing is marked, and after LOCK_WAIT_S the pass fails as
    before (the agent tries again)."""
    from node.agent import credit_locker

    monkeypatch.setattr(credit_locker, "LOCK_WAIT_S", 6.0)
    chain, keys, credits, (_, b) = _two_nodes(tmp_path)
    await b.payments.accept(b.account, credits[0])
    dropped = _DroppedLink(chain, keys[1])
    b.locker.link = dropped
    with pytest.raises(UnavailableError):
        await b.locker.step()
    assert dropped.looks == 3  # every LOCK_LOOK_S (2 s) up to 6 s
    assert LockMarks(b.payments.spool.dir).status(spent_id(credits[0])) is None
