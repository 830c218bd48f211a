"""Commitment coverage on the committee chain (abci_app/coverage.py): no commitment, no pay, no
routing, and a spot-check floor that serving little cannot dodge."""

from __future__ import annotations

from pathlib import Path

import pytest

from abci_app import settlement
from abci_app.codes import Code
from protocol.committee.commitments import CommitBatch, CommitmentRecord
from protocol.committee.credits import CreditRedeem
from protocol.committee.settlement import NodeWork
from protocol.committee.verification import SpotCheckReport
from protocol.spotcheck import Triple, checks_for, epoch_verifiers, node_rate_ppm, select
from tests.committee_chain import Chain, seeded_key
from tests.unit.test_abci_seeds_accusations import _signer, commit
from tests.unit.test_abci_settlement import (
    GATEWAY,
    ask,
    evm_of,
    one,
    report,
    settled_chain,
)
from tests.unit.test_abci_state import commit_served, hexkey, make_routable, price_txs, register

pytestmark = pytest.mark.unit


def routable_node(chain: Chain, label: str, shard: int = 0) -> str:
    register(chain, label, shards=(shard,))
    make_routable(chain, seeded_key(label))
    return hexkey(seeded_key(label))


def credits_of(chain: Chain, label: str) -> int:
    found = ask(chain, f"/credits?account={evm_of(label)}")["credits"]
    return sum(c["layer_tokens"] for c in found)


def close_epochs(chain: Chain, count: int) -> None:
    length = chain.state.genesis.epoch_length
    chain.advance_to((chain.state.height // length + count) * length)


def test_coverage_commitments_older_than_the_grace_window_do_not_cover_a_redemption(
    tmp_path: Path,
) -> None:
    from tests.credit_chain import ensure_key, minted

    chain = settled_chain(commit_grace_epochs=1)
    ensure_key(chain, tmp_path)  # the credit key first
    routable_node(chain, "node")
    key = seeded_key("node")
    commit_served(chain, key, shard=0, blocks=1)
    close_epochs(chain, 2)  # the commitment's epoch is now two epochs old
    credits, _ = minted(chain, tmp_path, count=2)
    chain.block(price_txs(chain, key))
    stale = one(chain, CreditRedeem("m", 0, (credits[0],)), key)
    assert stale.code == Code.UNCOMMITTED_REDEMPTION, stale.log
    assert credits_of(chain, "node") == 0
    if (chain.state.height + 2) % chain.state.genesis.epoch_length == 0:
        chain.block()  # the redemption not in the epoch's last block: its close moves the record
    commit_served(chain, key, shard=0, blocks=1)
    assert one(chain, CreditRedeem("m", 0, (credits[0],)), key).code == Code.OK
    assert credits_of(chain, "node") == chain.state.genesis.credit_layer_tokens


def test_coverage_silent_node_is_flagged_and_unroutable_after_the_grace_window() -> None:
    chain = settled_chain(commit_grace_epochs=2, heartbeat_timeout=10_000)
    silent = routable_node(chain, "silent", shard=0)
    honest = routable_node(chain, "honest", shard=1)
    work = report(NodeWork(silent, "m", 0, 2, 200), NodeWork(honest, "m", 1, 2, 200))
    assert one(chain, work, GATEWAY).code == Code.OK
    reported_in = (chain.state.height - 1) // chain.state.genesis.epoch_length + 1
    commit_served(chain, seeded_key("honest"), shard=1, blocks=7)  # 224 positions ≥ 200
    length = chain.state.genesis.epoch_length
    chain.advance_to((reported_in + 1) * length)  # the grace window is still open
    for key in (silent, honest):
        view = ask(chain, f"/node?key={key}")
        assert view["routable"] is True and view["uncommitted"] is False
    chain.advance_to((reported_in + 2) * length)  # closes epoch reported_in + grace
    view = ask(chain, f"/node?key={silent}")
    assert view["uncommitted"] is True and view["routable"] is False
    assert ask(chain, f"/node?key={honest}")["routable"] is True
    assert ask(chain, "/coverage")["uncommitted"] == [silent]
    [shard] = ask(chain, f"/coverage?node={silent}")["shards"]
    assert shard["uncommitted_since"] == reported_in + 2
    assert [n["key"] for n in ask(chain, "/nodes?routable=true")["nodes"] if n["routable"]] == [
        honest
    ]
    # committing what it served clears the flag at the next close
    commit_served(chain, seeded_key("silent"), shard=0, blocks=4)  # 128 ≥ half of 200
    close_epochs(chain, 1)
    assert ask(chain, f"/node?key={silent}")["routable"] is True


def test_settlement_pool_health_leaves_out_a_flagged_node_as_pool_health_does() -> None:
    """The scarcity bonus's count of routable nodes (settlement, at each epoch close) is the
    one `/pool_health` answers: a node flagged uncommitted does not make its shard look well
    served (before: it still counted, so the honest nodes' shard lost scarcity bonus)."""
    chain = settled_chain(commit_grace_epochs=1, heartbeat_timeout=10_000)
    silent = routable_node(chain, "silent", shard=0)
    honest = routable_node(chain, "honest", shard=0)
    work = report(NodeWork(silent, "m", 0, 2, 200), NodeWork(honest, "m", 0, 2, 200))
    assert one(chain, work, GATEWAY).code == Code.OK
    commit_served(chain, seeded_key("honest"), shard=0, blocks=7)
    assert settlement._routable_counts(chain.state)[("m", 0)] == 2
    close_epochs(chain, 2)
    assert ask(chain, f"/node?key={silent}")["uncommitted"] is True
    assert ask(chain, "/pool_health?model=m")["routable_per_shard"][0] == 1
    assert settlement._routable_counts(chain.state)[("m", 0)] == 1


def test_coverage_node_committing_less_than_half_is_flagged() -> None:
    chain = settled_chain(commit_grace_epochs=1, heartbeat_timeout=10_000)
    node = routable_node(chain, "partial")
    assert one(chain, report(NodeWork(node, "m", 0, 2, 320)), GATEWAY).code == Code.OK
    commit_served(chain, seeded_key("partial"), shard=0, blocks=4)  # 128 of 320 positions
    close_epochs(chain, 2)
    assert ask(chain, f"/node?key={node}")["uncommitted"] is True


def test_coverage_same_txs_give_the_same_app_hash() -> None:
    hashes = []
    for _ in range(2):
        chain = settled_chain(commit_grace_epochs=1)
        node = routable_node(chain, "silent")
        assert one(chain, report(NodeWork(node, "m", 0, 2, 64)), GATEWAY).code == Code.OK
        commit_served(chain, seeded_key("silent"), shard=0, blocks=1)
        close_epochs(chain, 3)
        hashes.append(chain.state.app_hash)
    assert hashes[0] == hashes[1]


# --- the spot-check floor -----------------------------------------------------------------------


def test_floor_rate_checks_every_block_of_a_node_that_serves_little() -> None:
    assert node_rate_ppm(50_000, 1, 1) == 1_000_000
    assert node_rate_ppm(50_000, 1, 4) == 250_000
    assert node_rate_ppm(50_000, 1, 1_000) == 50_000  # serving a lot: the base rate
    assert node_rate_ppm(50_000, 0, 1) == 50_000  # floor off
    assert node_rate_ppm(50_000, 3, 2) == 1_000_000
    seed = "0x" + "5a" * 32
    little = [Triple("aa" * 32, "0x" + "01" * 32, 0, 0)]
    lots = [Triple("bb" * 32, "0x" + f"{i:064x}", 0, 0) for i in range(400)]
    chosen = select(seed, little + lots, 1, floor=1)
    assert little[0] in chosen  # one block: always drawn
    assert 0 < len([t for t in chosen if t.node == "bb" * 32]) < 20  # ≈ 1 of 400
    # the chain's count decides, not the triples a verifier happens to see
    assert little[0] not in select(seed, little, 1, floor=1, blocks={"aa" * 32: 10**6})


def test_floor_report_of_a_small_node_is_credited_at_its_raised_rate() -> None:
    chain = settled_chain(spot_check_ppm=1, epoch_length=10, spot_check_floor=1)
    chain.block([commit(chain, 0, 2, b"\x00" * 32)])
    node = routable_node(chain, "small")
    record = CommitmentRecord("0x" + "42" * 32, 0, 0, "0x" + "aa" * 32)
    assert one(chain, CommitBatch((record,)), seeded_key("small")).code == Code.OK
    assert chain.state.height <= 10
    chain.advance_to(10)
    seed, verifiers = epoch_verifiers(ask(chain, "/epochs?epoch=2")["epochs"][0])
    triple = Triple(node, record.session, 0, 0)
    owed = checks_for(seed, [triple], verifiers, _signer(chain, 0), 1, floor=1, blocks={node: 1})
    assert owed == [triple]
    [shard] = ask(chain, f"/coverage?node={node}")["shards"]
    assert shard["blocks"]["1"] == 1
    body = SpotCheckReport(1, ((node, record.session, 0, 0),))
    assert one(chain, body, chain.validators[0].key).code == Code.OK
