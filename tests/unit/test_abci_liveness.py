"""Liveness on the committee chain (abci_app/liveness.py): evidence of service — the node's own
txs, never a gateway's word — keeps a node SERVING without heartbeats, and a DOWN node that is
otherwise routable is a client fallback (`grace`) for ten heartbeat timeouts."""

from __future__ import annotations

import pytest

from abci_app.codes import Code
from protocol.committee.credit_locks import CreditLock
from protocol.committee.registry import Heartbeat, Leave
from tests.committee_chain import Chain
from tests.unit.test_abci_settlement import GATEWAY, one, report, settled_chain
from tests.unit.test_abci_state import (
    commit_served,
    make_routable,
    node,
    register,
)

pytestmark = pytest.mark.unit

TIMEOUT = 4  # tests/committee_chain.py's heartbeat_timeout


def test_liveness_a_node_committing_served_work_stays_serving_without_heartbeats() -> None:
    chain = Chain()
    key = register(chain, "busy")
    make_routable(chain, key)  # height 2: its last heartbeat
    for _ in range(3 * TIMEOUT):  # its agent commits what it served; no heartbeat at all
        commit_served(chain, key)
    info = node(chain, key)
    assert info["status"] == "SERVING" and info["routable"] is True
    assert info["last_heartbeat"] == 2 and info["last_served"] == chain.state.height
    chain.advance_to(chain.state.height + TIMEOUT)
    assert node(chain, key)["status"] == "SERVING"  # within the timeout of its last commit
    chain.advance_to(chain.state.height + 1)
    assert node(chain, key)["status"] == "DOWN"  # nothing at all for longer: DOWN as before


def test_liveness_a_gateway_report_neither_revives_a_dead_node_nor_keeps_one_alive() -> None:
    """Attack (issue 45): any key can bind itself as a gateway, so its reports are no evidence
    of anyone's service (they name no node at all now): a stream of them revives no DOWN node
    and keeps no silent node SERVING past its timeout."""
    chain = settled_chain()
    dead = register(chain, "dead")
    make_routable(chain, dead)
    chain.advance_to(chain.state.height + TIMEOUT + 1)
    assert node(chain, dead)["status"] == "DOWN"
    quiet = register(chain, "quiet")
    make_routable(chain, quiet)
    alive_since = chain.state.height
    for index in range(TIMEOUT + 1):  # the bound gateway reports, block after block
        work = report(queries=(("0x" + f"{index + 1:064x}", 5),))
        assert one(chain, work, GATEWAY).code == Code.OK
    assert node(chain, dead)["status"] == "DOWN"
    info = node(chain, quiet)
    assert info["status"] == "DOWN" and "last_served" not in info
    assert info["status_height"] == alive_since + TIMEOUT + 1


def test_liveness_a_nodes_own_credit_lock_revives_it() -> None:
    """A `credit_lock` is the node's own tx taking its clients' credits: evidence of service."""
    chain = settled_chain()
    key = register(chain, "locking")
    make_routable(chain, key)
    chain.advance_to(chain.state.height + TIMEOUT + 1)
    assert node(chain, key)["status"] == "DOWN"
    epoch = chain.state.height // chain.state.genesis.epoch_length + 1
    assert one(chain, CreditLock("m", 0, (("ab" * 32, epoch),)), key).code == Code.OK
    info = node(chain, key)
    assert info["status"] == "SERVING" and info["routable"] is True
    assert info["last_served"] == info["status_height"] == chain.state.height


def test_liveness_a_stranger_report_or_a_joining_node_changes_nothing() -> None:
    chain = settled_chain()
    key = register(chain, "joining")  # JOIN: no heartbeat yet
    body = report(queries=(("0x" + "42" * 32, 5),))
    assert one(chain, body, key).code == Code.UNKNOWN_GATEWAY  # a node cannot vouch for itself
    assert "last_served" not in node(chain, key)
    assert one(chain, body, GATEWAY).code == Code.OK
    assert node(chain, key)["status"] == "JOIN" and "last_served" not in node(chain, key)


def test_liveness_grace_lists_a_lately_down_routable_node_for_ten_timeouts() -> None:
    chain = Chain()
    key = register(chain, "quiet")
    make_routable(chain, key)  # height 2
    assert node(chain, key)["grace"] is False  # SERVING: routable, no fallback needed
    chain.advance_to(2 + TIMEOUT + 1)
    info = node(chain, key)
    assert (info["status"], info["routable"], info["grace"]) == ("DOWN", False, True)
    down_at = info["status_height"]
    chain.advance_to(down_at + 10 * TIMEOUT)
    assert node(chain, key)["grace"] is True
    chain.advance_to(down_at + 10 * TIMEOUT + 1)
    assert node(chain, key)["grace"] is False  # DOWN for too long: not even a fallback
    chain.block([chain.tx(Heartbeat(), key)])
    assert node(chain, key)["routable"] is True


def test_liveness_grace_never_lists_an_unstaked_or_left_node() -> None:
    chain = Chain()
    unstaked = register(chain, "unstaked")
    chain.block([chain.tx(Heartbeat(), unstaked)])
    left = register(chain, "left")
    make_routable(chain, left)
    chain.block([chain.tx(Leave(), left)])
    chain.advance_to(chain.state.height + TIMEOUT + 1)
    assert node(chain, unstaked)["status"] == "DOWN"
    assert node(chain, unstaked)["grace"] is False
    assert node(chain, left)["grace"] is False


def test_pool_health_names_the_shards_below_the_replica_floor() -> None:
    from tests.unit.test_abci_state import ask

    chain = Chain(genesis={"replica_floor": 2, "models": {"m": {"shards": 2}}})
    for label, shard in (("a", 0), ("b", 0), ("c", 1)):
        make_routable(chain, register(chain, label, shards=(shard,)))
    health = ask(chain, "/pool_health?model=m")
    assert health["routable_per_shard"] == [2, 1]
    assert (health["replica_floor"], health["below_floor"]) == (2, [1])
    assert ask(chain, "/params")["genesis"].get("replica_floor") is None  # the default: unstored
    lone = Chain(genesis={"replica_floor": 1})
    assert ask(lone, "/params")["genesis"]["replica_floor"] == 1
