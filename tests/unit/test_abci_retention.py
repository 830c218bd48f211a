"""State costs its writer: unstaked registrations expire, settled records are pruned (bounded
per block), and the bytes a tx can add to the state are bounded (docs/committee.md, "What state
costs")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from abci_app.codes import Code
from abci_app.queries import query
from protocol.committee.commitments import CommitBatch, CommitmentRecord, RevealBatch, RevealRecord
from protocol.committee.registry import AttestStake, Heartbeat, RegisterNode, sign_registration
from protocol.eip712 import address_of
from tests.committee_chain import Chain, seeded_evm_key, seeded_key

pytestmark = pytest.mark.unit

TTL = 10
EPOCH = 5  # tests.committee_chain.Chain's epoch length
RETENTION = 1
SESSION = "0x" + "01" * 32


def chain(**genesis: object) -> Chain:
    return Chain(genesis={"registration_ttl": TTL, "retention_epochs": RETENTION, **genesis})


def register(c: Chain, label: str, role: str = "compute") -> SigningKey:
    key = seeded_key(label)
    evm = seeded_evm_key(label)
    body = RegisterNode(
        evm_address=address_of(evm),
        evm_signature=sign_registration(evm, key.verify_key.encode().hex()),
        role=role,
        model="m",
        shards=(0,),
        endpoint=f"http://{label}",
        capacity=1,
    )
    [result] = c.block([c.tx(body, key)])
    assert result.code == Code.OK, result.log
    return key


def hexkey(key: SigningKey) -> str:
    return key.verify_key.encode().hex()


def attest(c: Chain, key: SigningKey, amount: int) -> None:
    results = c.block([c.tx(AttestStake(hexkey(key), amount), v.key) for v in c.validators[:3]])
    assert [r.code for r in results] == [Code.OK] * 3


def status(c: Chain, path: str) -> int:
    return query(c.state, path, b"")[0]


def answer(c: Chain, path: str) -> dict:
    code, value, log = query(c.state, path, b"")
    assert code == Code.OK, log
    return json.loads(value)


def test_abci_retention_unstaked_registration_expires_after_ttl() -> None:
    c = chain()
    key = register(c, "lazy")
    registered = c.state.height
    c.block([c.tx(Heartbeat(), key)])
    c.advance_to(registered + TTL - 1)
    assert status(c, f"/node?key={hexkey(key)}") == Code.OK
    c.advance_to(registered + TTL)
    assert status(c, f"/node?key={hexkey(key)}") == Code.NOT_FOUND
    for ns in ("node", "rep", "acct", "stake"):
        assert c.state.committed(ns, hexkey(key)) is None
    # the key is fresh again: it can register anew (same EVM address, now unbound)
    c.nonces.clear()
    assert register(c, "lazy")


def test_abci_retention_staked_registration_stays_and_stake_drop_expires_it() -> None:
    c = chain()
    key = register(c, "staked")
    attest(c, key, 10**18)
    c.advance_to(c.state.height + 3 * TTL)
    assert answer(c, f"/node?key={hexkey(key)}")["stake"] == str(10**18)
    attest(c, key, 0)  # the node withdrew: validators attest 0
    dropped = c.state.height
    c.advance_to(dropped + TTL - 1)
    assert status(c, f"/node?key={hexkey(key)}") == Code.OK
    c.advance_to(dropped + TTL)
    assert status(c, f"/node?key={hexkey(key)}") == Code.NOT_FOUND


def commit_records(first_step: int, count: int) -> tuple[CommitmentRecord, ...]:
    return tuple(
        CommitmentRecord(SESSION, step, 0, "0x" + f"{step:064x}")
        for step in range(first_step, first_step + count)
    )


def test_abci_retention_settled_commitments_and_evidence_pruned() -> None:
    c = chain()
    key = register(c, "worker")
    attest(c, key, 10**18)  # staked: the node itself stays, only its records are pruned
    c.block([c.tx(CommitBatch(commit_records(1, 4)), key)])
    written = c.state.height
    bad = RevealRecord(SESSION, 1, 0, "0x" + "00" * 32, "0x" + "00" * 32)
    results = c.block([c.tx(RevealBatch((bad,)), key)])
    assert [r.code for r in results] == [Code.OK]
    assert len(answer(c, "/evidence")["evidence"]) == 1
    epoch = (written - 1) // EPOCH + 1
    # kept through the end of epoch + RETENTION, pruned in the first block after it
    last_kept = (epoch + RETENTION) * EPOCH
    c.advance_to(last_kept)
    assert len(answer(c, f"/commitments?node={hexkey(key)}")["commitments"]) == 4
    c.advance_to(last_kept + 1)
    assert answer(c, f"/commitments?node={hexkey(key)}")["commitments"] == []
    assert answer(c, "/evidence")["evidence"] == []
    assert list(c.state.committed_items("gc")) == []
    # lasting: the node itself
    assert answer(c, f"/node?key={hexkey(key)}")["key"] == hexkey(key)


def test_abci_retention_pruning_is_bounded_per_block() -> None:
    c = chain(prune_per_block=3)
    key = register(c, "busy")
    attest(c, key, 10**18)  # only staked nodes commit
    c.block([c.tx(CommitBatch(commit_records(1, 10)), key)])
    epoch = (c.state.height - 1) // EPOCH + 1
    first_prune = (epoch + RETENTION) * EPOCH + 1
    counts = []
    for height in range(first_prune, first_prune + 4):
        c.advance_to(height)
        counts.append(len(list(c.state.committed_items("commit"))))
    assert counts == [7, 4, 1, 0]


def test_abci_retention_old_epoch_records_pruned() -> None:
    c = chain()
    c.advance_to(6 * EPOCH)
    assert status(c, "/epochs?epoch=7") == Code.OK
    assert answer(c, "/epochs?epoch=5")["epochs"] != []
    assert answer(c, "/epochs?epoch=4")["epochs"] == []
    assert answer(c, "/epochs")["epochs"][0]["epoch"] == 7


# --- the byte bounds written down in docs/committee.md --------------------------------------------

TX_FACTOR = 4  # state bytes a successful tx may add: ≤ TX_FACTOR · len(tx) + TX_OVERHEAD
TX_OVERHEAD = 1024
LASTING_PER_STAKED_NODE = 2048  # plus STAKE_PER_VALIDATOR per attesting validator
STAKE_PER_VALIDATOR = 64


def test_abci_retention_bytes_per_tx_within_documented_bound() -> None:
    c = chain()
    store = c.state.store
    key = seeded_key("measured")
    evm = seeded_evm_key("measured")
    body = RegisterNode(
        evm_address=address_of(evm),
        evm_signature=sign_registration(evm, hexkey(key)),
        role="compute",
        model="m" * 128,
        shards=tuple(range(256)),
        endpoint="e" * 256,
        capacity=1,
    )
    batch_full = commit_records(1, 340)
    txs = [
        c.tx(body, key),
        c.tx(Heartbeat(), key),
        c.tx(CommitBatch(batch_full), key),
        c.tx(
            RevealBatch(
                tuple(RevealRecord(SESSION, r.step, 0, SESSION, SESSION) for r in batch_full[:230])
            ),
            key,
        ),
        # equivocation: the same (session, step, shard) with another value → evidence each
        c.tx(CommitBatch(commit_records(10**6, 340)), key),
        c.tx(
            CommitBatch(
                tuple(CommitmentRecord(SESSION, s, 0, SESSION) for s in range(10**6, 10**6 + 340))
            ),
            key,
        ),
    ]
    for index, raw in enumerate(txs):
        assert len(raw) <= 64 * 1024
        if index == 2:
            attest(c, key, 10**18)  # only staked nodes commit
        before = store.size_bytes()
        [result] = c.block([raw])
        assert result.code == Code.OK, result.log
        added = store.size_bytes() - before
        assert added <= TX_FACTOR * len(raw) + TX_OVERHEAD, (len(raw), added)
        print(f"tx {len(raw)} bytes -> state +{added} bytes ({added / len(raw):.2f}x)")


def test_abci_retention_unstaked_attacker_leaves_nothing_lasting() -> None:
    """An attacker with free keys registers nodes and fills blocks with commitments and
    reveals: every commit is refused by name (NOT_STAKED: only staked nodes commit), every
    reveal finds no commitment; after the TTL the state is byte for byte the size of a chain
    that never saw him."""
    attacked, reference = chain(), chain()
    keys = [register(attacked, f"attacker-{i}") for i in range(3)]
    for index, key in enumerate(keys):
        records = commit_records(1000 * index, 200)
        reveals = tuple(
            RevealRecord(SESSION, r.step, 0, "0x" + "00" * 32, "0x" + "00" * 32)
            for r in records[:50]
        )
        results = attacked.block(
            [attacked.tx(CommitBatch(records), key), attacked.tx(Heartbeat(), key)]
        )
        results += attacked.block([attacked.tx(RevealBatch(reveals), key)])
        assert [r.code for r in results] == [Code.NOT_STAKED, Code.OK, Code.UNKNOWN_COMMITMENT]
    assert list(attacked.state.committed_items("commit")) == []
    assert list(attacked.state.committed_items("cover")) == []
    end = TTL + (RETENTION + 3) * EPOCH + attacked.state.height
    attacked.advance_to(end)
    reference.advance_to(end)
    assert attacked.state.store.size_bytes() == reference.state.store.size_bytes()


def test_abci_retention_node_unstaked_after_committing_leaves_no_cover_entry() -> None:
    """A node commits while staked, its stake drops to 0 and its registration expires: its
    cover entries go with it (coverage.py `forget`), though no close reads them any more."""
    c = chain()
    key = register(c, "quitter")
    attest(c, key, 10**18)
    assert c.block([c.tx(CommitBatch(commit_records(1, 4)), key)])[0].code == Code.OK
    assert [k for k, _ in c.state.committed_items("cover")] == [f"{hexkey(key)}/00000"]
    attest(c, key, 0)
    c.advance_to(c.state.height + TTL)
    assert status(c, f"/node?key={hexkey(key)}") == Code.NOT_FOUND
    assert list(c.state.committed_items("cover")) == []
    assert list(c.state.committed_items("covdue")) == []


def test_abci_retention_lasting_bytes_per_staked_node_within_bound() -> None:
    staked, reference = chain(), chain()
    key = register(staked, "honest")
    staked.block([staked.tx(Heartbeat(), key)])
    attest(staked, key, 10**18)
    end = TTL + (RETENTION + 3) * EPOCH + staked.state.height
    staked.advance_to(end)
    reference.advance_to(end)
    lasting = staked.state.store.size_bytes() - reference.state.store.size_bytes()
    assert 0 < lasting <= LASTING_PER_STAKED_NODE + STAKE_PER_VALIDATOR * len(staked.validators)


def test_abci_retention_state_is_read_through_sqlite_not_loaded_whole(tmp_path: Path) -> None:
    c = Chain(db=tmp_path / "app.sqlite")
    keys = [register(c, f"n{i}") for i in range(5)]
    attest(c, keys[0], 10**18)  # only staked nodes commit
    c.block([c.tx(CommitBatch(commit_records(1, 300)), keys[0])])
    assert c.state.store.size_bytes() > 60_000
    reopened = c.reopen()
    store = reopened.state.store
    assert store.load() == (reopened.state.height, reopened.state.app_hash)
    assert store.cache_bytes < 4096  # only the meta entries read at start
    assert (
        len(answer(reopened, f"/commitments?node={hexkey(keys[0])}&limit=10")["commitments"]) == 10
    )
    assert len(answer(reopened, "/nodes")["nodes"]) == 5
