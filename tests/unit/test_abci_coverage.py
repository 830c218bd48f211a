"""Commitment coverage on the committee chain (abci_app/coverage.py): no commitment, no pay, no
routing (commitments against what credits bought, from the node's own locks: no gateway's word
decides), and a spot-check floor that serving little cannot dodge."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from abci_app import coverage, rules
from abci_app.codes import Code
from protocol.committee.commitments import CommitBatch, CommitmentRecord
from protocol.committee.credit_locks import CreditLock
from protocol.committee.credits import CreditRedeem
from protocol.committee.prices import SetPrice
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


def lock_tx(chain: Chain, key: SigningKey, shard: int, count: int, tag: str = "") -> bytes:
    """A `credit_lock` of `count` credits of this epoch by `key` on `shard` (spent ids made
    from `tag`: the same tag, the same credits)."""
    epoch = rules.epoch_of(chain.state, chain.state.height + 1)
    ids = sorted(
        hashlib.sha256(f"{hexkey(key)}/{tag}/{i}".encode()).hexdigest() for i in range(count)
    )
    locks = tuple((identifier, epoch) for identifier in ids)
    return chain.tx(CreditLock("m", shard, locks), key)


def sold(chain: Chain, key: SigningKey, shard: int, count: int, price: int, tag: str = "") -> None:
    """`key` registers `price` positions per credit on `shard` (a first price counts from its
    own block), then locks `count` credits its clients paid with: count × price positions."""
    assert one(chain, SetPrice("m", shard, price), key).code == Code.OK
    [result] = chain.block([lock_tx(chain, key, shard, count, tag)])
    assert result.code == Code.OK, result.log


def cover(chain: Chain, key: SigningKey, shard: int) -> dict:
    shards = ask(chain, f"/coverage?node={hexkey(key)}")["shards"]
    [view] = [s for s in shards if s["shard"] == shard]
    return view


def test_coverage_silent_node_is_flagged_and_unroutable_after_the_grace_window() -> None:
    chain = settled_chain(commit_grace_epochs=2, heartbeat_timeout=10_000)
    silent = routable_node(chain, "silent", shard=0)
    honest = routable_node(chain, "honest", shard=1)
    sold(chain, seeded_key("silent"), 0, 4, 64)  # 256 positions bought, none committed
    sold(chain, seeded_key("honest"), 1, 4, 64)
    sold_in = (chain.state.height - 1) // chain.state.genesis.epoch_length + 1
    commit_served(chain, seeded_key("honest"), shard=1, blocks=7)  # 224 + slack 63 ≥ 256
    assert cover(chain, seeded_key("silent"), 0)["bought_positions"] == 256
    length = chain.state.genesis.epoch_length
    chain.advance_to((sold_in + 1) * length)  # the grace window is still open
    for key in (silent, honest):
        view = ask(chain, f"/node?key={key}")
        assert view["routable"] is True and view["uncommitted"] is False
    chain.advance_to((sold_in + 2) * length)  # closes epoch sold_in + grace
    view = ask(chain, f"/node?key={silent}")
    assert view["uncommitted"] is True and view["routable"] is False
    assert ask(chain, f"/node?key={honest}")["routable"] is True
    assert ask(chain, "/coverage")["uncommitted"] == [silent]
    assert cover(chain, seeded_key("silent"), 0)["uncommitted_since"] == sold_in + 2
    assert [n["key"] for n in ask(chain, "/nodes?routable=true")["nodes"] if n["routable"]] == [
        honest
    ]
    # committing what it served clears the flag at the next close
    commit_served(chain, seeded_key("silent"), shard=0, blocks=3)  # 96 + 63 ≥ half of 256
    close_epochs(chain, 1)
    assert ask(chain, f"/node?key={silent}")["routable"] is True


def test_pool_health_leaves_out_a_flagged_node() -> None:
    """`/pool_health` (placement reads it) leaves out a node flagged uncommitted: it does not
    make its shard look well served. (The close's own count of it, for the scarcity bonus,
    went with the bonus in issue 42.)"""
    chain = settled_chain(commit_grace_epochs=1, heartbeat_timeout=10_000)
    silent = routable_node(chain, "silent", shard=0)
    routable_node(chain, "honest", shard=0)
    sold(chain, seeded_key("silent"), 0, 2, 100)
    sold(chain, seeded_key("honest"), 0, 2, 100)
    commit_served(chain, seeded_key("honest"), shard=0, blocks=7)
    assert ask(chain, "/pool_health?model=m")["routable_per_shard"][0] == 2
    close_epochs(chain, 2)
    assert ask(chain, f"/node?key={silent}")["uncommitted"] is True
    assert ask(chain, "/pool_health?model=m")["routable_per_shard"][0] == 1


def test_coverage_node_committing_less_than_half_of_what_credits_bought_is_flagged() -> None:
    chain = settled_chain(commit_grace_epochs=1, heartbeat_timeout=10_000)
    node = routable_node(chain, "partial")
    sold(chain, seeded_key("partial"), 0, 10, 32)  # 320 positions bought
    commit_served(chain, seeded_key("partial"), shard=0, blocks=4)  # 128 + slack 31 < 160
    close_epochs(chain, 2)
    assert ask(chain, f"/node?key={node}")["uncommitted"] is True
    view = cover(chain, seeded_key("partial"), 0)
    assert (view["bought_positions"], view["committed_positions"]) == (320, 128)
    assert view["slack_positions"] == 31


def test_coverage_short_sessions_at_a_high_price_leave_an_honest_node_covered() -> None:
    """Each session's last credit is paid ahead and may be used in part: three one-block
    sessions at 1000 positions per credit sold 3000 positions and committed 96. The slack of
    p − 1 per session begun covers them (without it the node would be flagged)."""
    chain = settled_chain(commit_grace_epochs=1, heartbeat_timeout=10_000)
    node = routable_node(chain, "pricey")
    key = seeded_key("pricey")
    sold(chain, key, 0, 1, 1000, tag="s1")
    for tag in ("s2", "s3"):
        [result] = chain.block([lock_tx(chain, key, 0, 1, tag)])
        assert result.code == Code.OK, result.log
    for _ in range(3):
        commit_served(chain, key, shard=0, blocks=1)
    close_epochs(chain, 3)
    view = cover(chain, key, 0)
    assert (view["bought_positions"], view["committed_positions"]) == (3000, 96)
    assert view["slack_positions"] == 3 * 999
    assert ask(chain, f"/node?key={node}")["uncommitted"] is False


def test_coverage_a_flag_from_one_burst_of_sales_clears_once_the_window_has_passed() -> None:
    """The flag judges the last W epochs of sales, not the node's whole history: a node flagged
    for one burst of credits it never served (failed sessions, or a client paying for sessions
    it then breaks, at its own cost) is routable again W + grace epochs later with no traffic at
    all, while a flagged node is routed nothing and could commit nothing."""
    chain = settled_chain(commit_grace_epochs=1, heartbeat_timeout=10_000)
    node = routable_node(chain, "burst")
    key = seeded_key("burst")
    sold(chain, key, 0, 4, 64)  # 256 positions bought, nothing served
    length = chain.state.genesis.epoch_length
    sold_in = (chain.state.height - 1) // length + 1
    window = coverage.window_epochs(chain.state)
    assert window == coverage.WINDOW_FACTOR * 2
    flagged = []
    for close in range(sold_in, sold_in + window + 3):
        chain.advance_to(close * length)
        flagged.append(ask(chain, f"/node?key={node}")["uncommitted"])
    # judged from the close of sold_in + grace until the sale leaves the window (W closes)
    assert flagged == [False] + [True] * window + [False, False]
    assert ask(chain, f"/node?key={node}")["routable"] is True


def test_coverage_a_lock_sent_again_buys_nothing_more() -> None:
    chain = settled_chain(commit_grace_epochs=1, heartbeat_timeout=10_000)
    routable_node(chain, "resender")
    key = seeded_key("resender")
    sold(chain, key, 0, 3, 10, tag="a")
    [again] = chain.block([lock_tx(chain, key, 0, 3, tag="a")])  # an answer lost: sent again
    assert again.code == Code.OK, again.log
    assert cover(chain, key, 0)["bought_positions"] == 30


def test_coverage_a_gateways_reports_flag_nobody_and_keep_nobody_routable() -> None:
    """Attack (issue 45): anyone can bind a key as a gateway. Its reports name no node (served
    counts left the wire), so reporting again and again neither flags an honest node that sold
    nothing nor clears the flag of a node that sold positions it did not commit; an unbound key
    is refused whole."""
    chain = settled_chain(commit_grace_epochs=1, heartbeat_timeout=10_000)
    honest = routable_node(chain, "honest", shard=0)
    cheat = routable_node(chain, "cheat", shard=1)
    sold(chain, seeded_key("cheat"), 1, 8, 64)
    stranger = seeded_key("stranger")
    fees = report(queries=(("0x" + "77" * 32, 5),))
    assert one(chain, fees, stranger).code == Code.UNKNOWN_GATEWAY
    for _ in range(3):  # the bound gateway, again and again, over the grace window
        assert one(chain, fees, GATEWAY).code == Code.OK
        close_epochs(chain, 1)
    assert ask(chain, f"/node?key={honest}")["uncommitted"] is False
    assert ask(chain, f"/node?key={honest}")["routable"] is True
    assert "reported_tokens" not in cover(chain, seeded_key("cheat"), 1)
    assert ask(chain, f"/node?key={cheat}")["uncommitted"] is True
    assert ask(chain, "/coverage")["uncommitted"] == [cheat]


def test_coverage_same_txs_give_the_same_app_hash() -> None:
    hashes = []
    for _ in range(2):
        chain = settled_chain(commit_grace_epochs=1)
        routable_node(chain, "silent")
        sold(chain, seeded_key("silent"), 0, 2, 64)
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


# --- rule 5: what a charging node commits, credits bought; rule 4: free positions ---------------


def next_epoch(chain: Chain) -> int:
    """Advance to the end of the next block's epoch; returns the epoch the next block opens."""
    length = chain.state.genesis.epoch_length
    chain.advance_to((chain.state.height // length + 1) * length)
    return chain.state.height // length + 1


def priced(chain: Chain, key: SigningKey, shard: int, positions: int) -> None:
    assert one(chain, SetPrice("m", shard, positions), key).code == Code.OK


def test_coverage_charging_node_committing_what_no_credit_bought_is_flagged() -> None:
    """Rule 5 (issue 45): a charging node that commits served positions while no credit of its
    was locked or redeemed around them served sessions the chain never saw sold (its clients'
    credits unlocked, or junk committed to cover later sales): flagged like an uncovered one.
    A lock landing an epoch after the commitments it paid for (within the grace) is fine.
    Before: bought 0 was never below half of anything, so it stayed routable."""
    chain = settled_chain(commit_grace_epochs=1, heartbeat_timeout=10_000)
    unsold = routable_node(chain, "unsold", shard=0)
    late = routable_node(chain, "late", shard=1)
    key, late_key = seeded_key("unsold"), seeded_key("late")
    committed_in = next_epoch(chain)
    priced(chain, key, 0, 64)
    priced(chain, late_key, 1, 64)
    commit_served(chain, key, shard=0, blocks=5)
    commit_served(chain, late_key, shard=1, blocks=2)
    length = chain.state.genesis.epoch_length
    chain.advance_to(committed_in * length)
    [lock] = chain.block([lock_tx(chain, late_key, 1, 1)])  # the next epoch: within the grace
    assert lock.code == Code.OK, lock.log
    chain.advance_to((committed_in + 1) * length)  # closes committed_in + grace
    assert ask(chain, f"/node?key={unsold}")["uncommitted"] is True
    assert ask(chain, f"/node?key={unsold}")["routable"] is False
    assert ask(chain, f"/node?key={late}")["uncommitted"] is False
    view = cover(chain, key, 0)
    assert (view["bought_positions"], view["charged_positions"]) == (0, 160)
    assert view["uncommitted_since"] == committed_in + 1
    assert ask(chain, "/coverage")["uncommitted"] == [unsold]


def test_coverage_a_credit_redeemed_without_a_lock_counts_as_sold(tmp_path: Path) -> None:
    """A redemption of a credit nobody locked is its lock and its spend at once: it adds the
    node's price to `bought` (before: nothing), so a node that redeems without locking is seen
    selling, and rule 5 does not flag it."""
    from tests.credit_chain import ensure_key, minted

    chain = settled_chain(commit_grace_epochs=1, heartbeat_timeout=10_000)
    ensure_key(chain, tmp_path)
    node = routable_node(chain, "direct")
    key = seeded_key("direct")
    credits, _ = minted(chain, tmp_path, count=2)
    chain.block(price_txs(chain, key, positions=16))
    commit_served(chain, key, shard=0, blocks=1)  # 32 positions + 15 slack
    redeemed = one(chain, CreditRedeem("m", 0, tuple(credits)), key)
    assert redeemed.code == Code.OK, redeemed.log
    assert cover(chain, key, 0)["bought_positions"] == 32
    close_epochs(chain, 3)
    assert ask(chain, f"/node?key={node}")["uncommitted"] is False


def test_coverage_positions_committed_while_free_pay_no_redemption(tmp_path: Path) -> None:
    """Rule 4: positions a node committed in an epoch it was free (price 0) were paid by
    nobody, so no credit is cashed against them once it charges: before, a node could serve
    free traffic, switch to a price and redeem its new clients' credits against the free
    commitments, leaving the paid work uncommitted (out of spot checks)."""
    from tests.credit_chain import ensure_key, minted

    chain = settled_chain(commit_grace_epochs=2, heartbeat_timeout=10_000)
    ensure_key(chain, tmp_path)
    routable_node(chain, "switcher")
    key = seeded_key("switcher")
    credits, _ = minted(chain, tmp_path, count=1)
    next_epoch(chain)
    priced(chain, key, 0, 0)  # free from this epoch
    commit_served(chain, key, shard=0, blocks=10)  # 320 positions nobody paid for
    priced(chain, key, 0, 64)  # charging from the next epoch
    next_epoch(chain)
    refused = one(chain, CreditRedeem("m", 0, (credits[0],)), key)
    assert refused.code == Code.UNCOMMITTED_REDEMPTION, refused.log
    commit_served(chain, key, shard=0, blocks=2)  # 64 positions at the price
    assert one(chain, CreditRedeem("m", 0, (credits[0],)), key).code == Code.OK


def test_coverage_positions_committed_while_free_cover_no_sale() -> None:
    """Rule 4: free positions do not cover what credits bought later (before: 960 free
    positions hid 256 sold and never committed for the whole window)."""
    chain = settled_chain(commit_grace_epochs=1, heartbeat_timeout=10_000)
    node = routable_node(chain, "banker")
    key = seeded_key("banker")
    next_epoch(chain)
    priced(chain, key, 0, 0)
    commit_served(chain, key, shard=0, blocks=30)
    priced(chain, key, 0, 64)
    sold_in = next_epoch(chain)
    [lock] = chain.block([lock_tx(chain, key, 0, 4)])  # 256 positions, never committed
    assert lock.code == Code.OK, lock.log
    chain.advance_to((sold_in + 1) * chain.state.genesis.epoch_length)
    assert ask(chain, f"/node?key={node}")["uncommitted"] is True
    view = cover(chain, key, 0)
    assert (view["free_positions"], view["charged_positions"]) == (960, 0)
    assert (view["committed_positions"], view["bought_positions"]) == (960, 256)


def test_coverage_a_free_node_committing_what_nobody_bought_is_not_flagged() -> None:
    """Rule 4: a free node's commitments are judged by spot checks alone (they are selectable
    like any), not against sales: nobody buys from it, so rule 5 does not flag it; an unpriced
    node likewise."""
    chain = settled_chain(commit_grace_epochs=1, heartbeat_timeout=10_000)
    free = routable_node(chain, "free", shard=0)
    unpriced = routable_node(chain, "unpriced", shard=1)
    next_epoch(chain)
    priced(chain, seeded_key("free"), 0, 0)
    commit_served(chain, seeded_key("free"), shard=0, blocks=4)
    commit_served(chain, seeded_key("unpriced"), shard=1, blocks=4)
    close_epochs(chain, 3)
    for node in (free, unpriced):
        assert ask(chain, f"/node?key={node}")["routable"] is True
    assert cover(chain, seeded_key("free"), 0)["free_positions"] == 128
    [shard] = ask(chain, f"/coverage?node={free}")["shards"]
    assert shard["blocks"] != {}  # still counted for the spot-check floor
