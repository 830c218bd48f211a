"""Only the staked pools commit, and an epoch close reads only theirs (issue 42; abci_app/
commitments.py, abci_app/coverage.py `judged_nodes`): a stranger's free registrations add no
record to `cover/` through `commit` (NOT_STAKED) and no read to any close, while a node whose
stake ends mid-epoch has what it committed settled and paid."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from abci_app import coverage, schema
from abci_app.codes import Code
from abci_app.state import State
from protocol.committee.credits import CreditRedeem
from protocol.committee.registry import AttestStake, Heartbeat, Leave
from tests.committee_chain import Chain, seeded_key
from tests.unit.state_reads import count_reads
from tests.unit.test_abci_coverage import close_epochs, cover, credits_of, lock_tx, sold
from tests.unit.test_abci_settlement import one, settled_chain
from tests.unit.test_abci_state import (
    commit_served,
    hexkey,
    make_routable,
    price_txs,
    register,
    register_body,
    served_commit_tx,
)

pytestmark = pytest.mark.unit


def attest(chain: Chain, key: SigningKey, amount: int) -> None:
    txs = [chain.tx(AttestStake(hexkey(key), amount), v.key) for v in chain.validators[:3]]
    assert [r.code for r in chain.block(txs)] == [Code.OK] * 3


def cover_keys(chain: Chain) -> list[str]:
    return [key for key, _ in chain.state.committed_items(schema.COVERAGE)]


def test_commit_by_an_unstaked_node_is_refused_not_staked() -> None:
    chain = Chain()
    key = register(chain, "free")
    assert chain.block([chain.tx(Heartbeat(), key)])[0].code == Code.OK  # SERVING, unstaked
    raw = served_commit_tx(chain, key)
    admitted = chain.machine.check_tx(raw)  # kept out of the mempool, so out of blocks
    assert admitted.code == Code.NOT_STAKED and "not staked" in admitted.log, admitted
    [result] = chain.block([raw])  # a proposer that includes it anyway: refused in its block
    assert result.code == Code.NOT_STAKED, result.log
    assert "not staked" in result.log
    assert list(chain.state.committed_items(schema.COMMITMENT)) == []
    assert cover_keys(chain) == []
    attest(chain, key, 10**18)  # staked: the same node commits
    assert chain.machine.check_tx(served_commit_tx(chain, key)).code == Code.OK
    commit_served(chain, key)
    assert cover_keys(chain) == [f"{hexkey(key)}/00000"]
    attest(chain, key, 10**17)  # below min_stake.compute: refused again
    assert chain.block([served_commit_tx(chain, key)])[0].code == Code.NOT_STAKED
    # a left node is still told it left (INVALID_LIFECYCLE), not that it is unstaked
    attest(chain, key, 10**18)
    assert chain.block([chain.tx(Leave(), key)])[0].code == Code.OK
    assert chain.block([served_commit_tx(chain, key)])[0].code == Code.INVALID_LIFECYCLE


def count_close_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Per epoch close from now on, the records `coverage.close` read from the committed state
    (lookups and range-scan rows; what it reads from the block's own writes costs no I/O)."""
    per_close: list[int] = []
    close = coverage.close

    def counted_close(state: State, epoch: int) -> None:
        with monkeypatch.context() as patch:
            reads = count_reads(patch)
            close(state, epoch)
        per_close.append(reads[0])

    monkeypatch.setattr(coverage, "close", counted_close)
    return per_close


def flood(chain: Chain, count: int) -> None:
    """`count` free registrations, each SERVING, committing (refused) and locking one made-up
    credit id (taken on a chain without `credits.holder_bound`: a `cover/` entry each)."""
    labels = [f"stranger-{i}" for i in range(count)]
    keys = [seeded_key(label) for label in labels]
    registrations = chain.block(
        [chain.tx(register_body(label), key) for label, key in zip(labels, keys, strict=True)]
    )
    assert {r.code for r in registrations} == {Code.OK}
    assert {r.code for r in chain.block([chain.tx(Heartbeat(), k) for k in keys])} == {Code.OK}
    commits = chain.block([served_commit_tx(chain, k) for k in keys])
    assert {r.code for r in commits} == {Code.NOT_STAKED}
    locks = chain.block([lock_tx(chain, k, 0, 1, tag="flood") for k in keys])
    assert {r.code for r in locks} == {Code.OK}


def honest_chain() -> tuple[Chain, list[SigningKey]]:
    chain = settled_chain(heartbeat_timeout=10_000)  # sells credits: locks are taken
    keys = [register(chain, f"honest-{i}") for i in range(2)]
    for key in keys:
        make_routable(chain, key)
        commit_served(chain, key, blocks=3)
    return chain, keys


def test_close_reads_nothing_of_unstaked_registrations_that_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    quiet, _ = honest_chain()
    flooded, _ = honest_chain()
    flood(flooded, 30)
    assert len(cover_keys(flooded)) == len(cover_keys(quiet)) + 30  # the locks' entries
    assert quiet.state.height < flooded.state.height
    reads = count_close_reads(monkeypatch)
    length = quiet.state.genesis.epoch_length
    boundary = (flooded.state.height // length + 2) * length  # two closes on both chains
    quiet.advance_to(boundary)
    quiet_reads = list(reads)
    reads.clear()
    flooded.advance_to(boundary)
    # the same two closes: old code read 30 more rows each (the strangers' entries)
    assert reads[-2:] == quiet_reads[-2:]
    # per close: the 2 pool rows, then per node its record and its one cover row
    assert reads[-2:] == [6, 6]


def test_close_judges_a_node_whose_stake_ended_in_the_epoch_once() -> None:
    """A node staked at an epoch's start, unstaked in it after committing: that close settles its
    records (charged: its price was above 0), the next closes leave it alone."""
    chain = settled_chain(commit_grace_epochs=1, heartbeat_timeout=10_000)
    key = register(chain, "quitter")
    make_routable(chain, key)
    sold(chain, key, 0, 2, 64)  # a price above 0 from this block, 128 positions bought
    commit_served(chain, key, blocks=3)  # 96 positions
    attest(chain, key, 0)
    assert [k for k, _ in chain.state.committed_items(schema.COVERAGE_DUE)] == [hexkey(key)]
    close_epochs(chain, 1)
    view = cover(chain, key, 0)
    assert view["charged_positions"] == 96  # settled at the close (not: 0)
    assert list(chain.state.committed_items(schema.COVERAGE_DUE)) == []
    entry = chain.state.committed(schema.COVERAGE, schema.coverage_key(hexkey(key), 0))
    close_epochs(chain, 2)
    assert chain.state.committed(schema.COVERAGE, schema.coverage_key(hexkey(key), 0)) == entry


def test_node_unstaked_mid_epoch_is_paid_for_the_work_it_committed(tmp_path: Path) -> None:
    from tests.credit_chain import ensure_key, minted

    chain = settled_chain(commit_grace_epochs=1, heartbeat_timeout=10_000)
    ensure_key(chain, tmp_path)
    key = register(chain, "quitter")
    make_routable(chain, key)
    chain.block(price_txs(chain, key))  # 1 position a credit
    credits, _ = minted(chain, tmp_path, count=2)
    length = chain.state.genesis.epoch_length
    if chain.state.height % length >= length - 3:
        close_epochs(chain, 1)  # room for commit and unstake inside one epoch
    commit_served(chain, key, blocks=1)  # 32 positions: pays both credits
    committed_in = (chain.state.height - 1) // length + 1
    attest(chain, key, 0)  # its stake ends in the same epoch
    assert chain.block([served_commit_tx(chain, key)])[0].code == Code.NOT_STAKED
    close_epochs(chain, 1)  # the close of that epoch
    assert chain.state.height // length + 1 == committed_in + 1  # the next block: its grace
    redeemed = one(chain, CreditRedeem("m", 0, tuple(credits)), key)
    assert redeemed.code == Code.OK, redeemed.log
    assert credits_of(chain, "quitter") == 2 * chain.state.genesis.credit_layer_tokens
    again = one(chain, CreditRedeem("m", 0, tuple(credits[:1])), key)
    assert again.code == Code.CREDIT_SPENT  # charged once


def test_a_node_staking_mid_epoch_commits_from_its_staking_block_and_is_judged() -> None:
    chain = Chain(genesis={"heartbeat_timeout": 10_000})
    key = register(chain, "late")
    assert chain.block([served_commit_tx(chain, key)])[0].code == Code.NOT_STAKED
    attest(chain, key, 10**18)
    commit_served(chain, key, blocks=2)
    close_epochs(chain, 1)
    assert cover(chain, key, 0)["free_positions"] == 64  # settled (no price: free) at the close


def staked_closes(mutate: Callable[[Chain], None]) -> bytes:
    chain = Chain(genesis={"heartbeat_timeout": 10_000})
    keys = [register(chain, f"n{i}") for i in range(3)]
    for key in keys:
        make_routable(chain, key)
        commit_served(chain, key)
    mutate(chain)
    close_epochs(chain, 2)
    return chain.state.app_hash


def test_close_same_txs_same_app_hash_with_pool_exits() -> None:
    def exits(chain: Chain) -> None:
        attest(chain, seeded_key("n1"), 0)
        assert chain.block([chain.tx(Leave(), seeded_key("n2"))])[0].code == Code.OK

    assert staked_closes(exits) == staked_closes(exits)
    assert staked_closes(exits) != staked_closes(lambda chain: None)


def test_a_node_staked_again_after_a_long_gap_is_judged_on_the_window_not_its_history() -> None:
    """Unstaked for longer than the window, a node misses every close meanwhile: staked again,
    its window starts from the counts of its last judged close, so a burst of sales judged and
    cleared long ago does not flag it again (it would from 0: its whole history)."""
    chain = settled_chain(commit_grace_epochs=1, heartbeat_timeout=10**6, registration_ttl=10**6)
    key = register(chain, "returning")
    make_routable(chain, key)
    sold(chain, key, 0, 4, 64)  # 256 positions bought, none committed
    window = coverage.window_epochs(chain.state)
    close_epochs(chain, 2)
    assert cover(chain, key, 0)["uncommitted_since"] is not None  # flagged
    close_epochs(chain, window + 2)
    assert cover(chain, key, 0)["uncommitted_since"] is None  # the burst left the window
    attest(chain, key, 0)
    close_epochs(chain, window + 4)  # unstaked: judged at the first close only
    attest(chain, key, 10**18)
    for _ in range(3):  # the closes that read the gap (old: flagged from the second on)
        close_epochs(chain, 1)
        assert cover(chain, key, 0)["uncommitted_since"] is None
