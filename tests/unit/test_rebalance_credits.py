"""A node that moved still redeems what it earned on the shard it left (issue 44): one credit
spool per shard (node/agent/credit_spools.py), each redeemed on its own shard by the agent
against the in-process committee chain, which takes a shard left for the credits' window
(abci_app/left_shards.py); each process a move starts spools to its own shard's directory
(node/agent/node_host.py `shard_args`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from abci_app import schema
from node.agent.credit_spools import ShardSpools, shard_spool, spool_base
from node.agent.launch import _credit_args
from node.agent.node_host import shard_args
from node.server.payments import CreditSpool
from protocol.committee.prices import SetPrice
from protocol.committee.registry import MoveShards
from tests.credit_chain import minted, node_chain, send
from tests.unit.test_abci_state import commit_served
from tests.unit.test_credit_till import ChainLink

pytestmark = pytest.mark.unit


async def test_after_a_move_the_old_shards_spool_is_redeemed_on_the_old_shard(
    tmp_path: Path,
) -> None:
    chain, node = node_chain(tmp_path)  # on shards 0 and 1
    credits, _ = minted(chain, tmp_path, count=3)
    base = tmp_path / "credits"
    old, new = CreditSpool(shard_spool(base, 0)), CreditSpool(shard_spool(base, 2))
    for credit in credits[:2]:  # paid to the old process (one while it drained after the move)
        old.add(credit)
    commit_served(chain, node, 0, blocks=1)
    assert send(chain, MoveShards((2,), "http://new"), node).code == 0
    assert send(chain, SetPrice("m", 2, 1), node).code == 0
    new.add(credits[2])  # paid to the new process
    commit_served(chain, node, 2, blocks=1)
    spools = ShardSpools(ChainLink(chain, node), "m", base, 2)
    assert await spools.step() == 3
    assert list(old.held()) == [] and list(new.held()) == []
    # each credit redeemed (the chain answered 0) on the shard that earned it
    assert {s: r.redeemed for (_, s), r in spools._redeemers.items()} == {0: 2, 2: 1}
    assert len(chain.state.items(schema.CREDIT_SPENT)) == 3
    assert await spools.step() == 0  # the old shard's empty spool is left alone


async def test_credits_spooled_directly_in_the_base_count_as_the_start_shard(
    tmp_path: Path,
) -> None:
    chain, node = node_chain(tmp_path)
    credits, _ = minted(chain, tmp_path, count=1)
    base = tmp_path / "credits"
    CreditSpool(base).add(credits[0])  # a node joined before per-shard spools
    commit_served(chain, node, 1, blocks=1)
    assert await ShardSpools(ChainLink(chain, node), "m", base, 1, legacy_shard=1).step() == 1
    [(_, record)] = chain.state.items(schema.CREDIT)
    assert record["shard"] == 1


def test_each_process_spools_to_its_own_shards_directory(tmp_path: Path) -> None:
    run = tmp_path / "run"
    joined = _credit_args(64, run, 1)
    assert joined == ["--credit-positions", "64", "--credits-dir", str(run / "credits/shard-1")]
    launch = ("--max-sessions", "4", *joined)
    moved = shard_args(launch, 2)
    assert moved[-1] == str(run / "credits/shard-2") and moved[:-1] == list(launch[:-1])
    legacy = ("--credits-dir", str(run / "credits"))  # a launch file written before
    assert shard_args(legacy, 0) == ["--credits-dir", str(run / "credits/shard-0")]
    assert spool_base(run / "credits/shard-12") == spool_base(run / "credits") == run / "credits"
    assert shard_args(("--free",), 3) == ["--free"]
