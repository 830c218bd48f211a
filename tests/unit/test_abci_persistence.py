"""SQLite persistence: a restarted app reports the same height and app hash and continues
identically; a crash before Commit replays to the same hash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from abci_app.queries import query
from protocol.committee.registry import Heartbeat, RegisterNode, sign_registration
from protocol.eip712 import address_of
from tests.committee_chain import Chain, seeded_evm_key, seeded_key

pytestmark = pytest.mark.unit


def workload(chain: Chain) -> list[list[bytes]]:
    key = seeded_key("n1")
    evm = seeded_evm_key("n1")
    node = key.verify_key.encode().hex()
    body = RegisterNode(address_of(evm), sign_registration(evm, node), "compute", "m", (0,), "e", 1)
    return [
        [chain.tx(body, key, nonce=1)],
        [chain.tx(Heartbeat(), key, nonce=2)],
        [],
        [chain.tx(Heartbeat(), key, nonce=3)],
    ]


def test_abci_restart_recovers_height_app_hash_and_state(tmp_path: Path) -> None:
    db = tmp_path / "app.sqlite"
    chain = Chain(db=db)
    for txs in workload(chain):
        chain.block(txs)
    chain.advance_to(12)  # crosses two epoch boundaries with vote extensions
    height, app_hash = chain.state.height, chain.state.app_hash
    nodes = query(chain.state, "/nodes", b"")[1]
    restarted = chain.reopen()
    assert (restarted.state.height, restarted.state.app_hash) == (height, app_hash)
    assert query(restarted.state, "/nodes", b"")[1] == nodes
    # both continue identically: same next app hashes as a never-restarted chain
    reference = Chain()
    for txs in workload(reference):
        reference.block(txs)
    reference.advance_to(12)
    assert reference.state.app_hash == app_hash
    restarted.advance_to(16)
    reference.advance_to(16)
    assert restarted.state.app_hash == reference.state.app_hash


def test_abci_crash_before_commit_replays_to_same_hash(tmp_path: Path) -> None:
    db = tmp_path / "app.sqlite"
    chain = Chain(db=db)
    blocks = workload(chain)
    chain.block(blocks[0])
    chain.block(blocks[1])
    committed = chain.state.app_hash
    # finalize block 3 but die before Commit
    machine = chain.machine
    machine.begin_block(3, b"\x09" * 32)
    for i, raw in enumerate(blocks[3]):
        machine.deliver_tx(raw, i)
    finalized = machine.end_block()
    restarted = chain.reopen()
    assert restarted.state.height == 2 and restarted.state.app_hash == committed
    # CometBFT replays block 3: same bytes, same hash
    machine = restarted.machine
    machine.begin_block(3, b"\x09" * 32)
    for i, raw in enumerate(blocks[3]):
        machine.deliver_tx(raw, i)
    assert machine.end_block() == finalized
    machine.commit()
    assert restarted.reopen().state.app_hash == finalized


def test_abci_crash_after_init_chain_starts_over(tmp_path: Path) -> None:
    db = tmp_path / "app.sqlite"
    chain = Chain(db=db)  # InitChain ran; nothing committed yet
    genesis_hash = chain.state.app_hash
    chain.state.store.close()
    again = Chain(db=db)  # height 0 → InitChain again, same genesis hash
    assert again.state.height == 0 and again.state.app_hash == genesis_hash
    again.block()
    restarted = again.reopen()
    assert restarted.state.height == 1
    params = json.loads(query(restarted.state, "/params", b"")[1])
    assert params["chain_id"] == "planet-test" and len(params["validators"]) == 4


def test_store_ranges_read_both_ways_across_its_internal_pages() -> None:
    """`Store.items` (and `State.committed_items`) over a range larger than the store's own
    read page, ascending and `descending`: the same keys, exact reverse order, bounds kept."""
    from abci_app.store import _PAGE, Store

    store = Store(":memory:")
    keys = [f"{n:06d}" for n in range(2 * _PAGE + 7)]
    store.commit(1, b"\0" * 32, [("ns", key, json.dumps(int(key))) for key in keys])
    store.commit(2, b"\0" * 32, [("other", "000001", "1")])
    assert [k for k, _ in store.items("ns")] == keys
    assert [k for k, _ in store.items("ns", descending=True)] == keys[::-1]
    lower, upper = keys[3], keys[_PAGE + 40]
    inside = [(k, int(k)) for k in keys if lower <= k < upper]
    assert list(store.items("ns", lower, upper, descending=True)) == inside[::-1]
    assert list(store.items("ns", lower, upper)) == inside
