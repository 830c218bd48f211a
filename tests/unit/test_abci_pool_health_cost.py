"""What one `/pool_health` query makes a validator read (abci_app/queries.py `_pool_counts`):
registering and heartbeating cost nothing, so the registry is as long as strangers make it.
The query counts a pool from the staked pools alone (`pool/<model>/<key>`, kept by
registry.py `update_pool` at attest_stake, leave and expiry): a free registration, SERVING or
not, costs it no read; without a model it answers only the genesis models' pools. The counts
stay those of the routable `/nodes` entries through every change of stake and lifecycle.
Measured: bench/query_cost.py, docs/committee.md *What a query costs*."""

from __future__ import annotations

import dataclasses

import pytest

from abci_app import schema
from abci_app.codes import Code
from abci_app.queries import node_view, routable
from protocol.committee.registry import AttestStake, Heartbeat, Leave
from tests.committee_chain import Chain, seeded_key
from tests.unit.state_reads import count_reads
from tests.unit.test_abci_state import ask, hexkey, make_routable, register, register_body

pytestmark = pytest.mark.unit


def strangers(chain: Chain, count: int, model: str = "m", beat: bool = False) -> None:
    """`count` free registrations on `model` (heartbeating once with `beat`: SERVING)."""
    labels = [f"x/{model}/{beat}/{i}" for i in range(count)]
    keys = [seeded_key(label) for label in labels]
    txs = [
        chain.tx(dataclasses.replace(register_body(x), model=model), seeded_key(x)) for x in labels
    ]
    assert {r.code for r in chain.block(txs)} == {Code.OK}
    if beat:
        assert {r.code for r in chain.block([chain.tx(Heartbeat(), k) for k in keys])} == {Code.OK}


def test_pool_health_reads_no_record_of_a_free_registration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chain = Chain(genesis={"models": {"m": {"shards": 1}}})
    strangers(chain, 20)  # JOIN
    strangers(chain, 10, beat=True)  # SERVING, unstaked
    strangers(chain, 10, model="other", beat=True)
    strangers(chain, 5, model="m/x", beat=True)  # a model whose name goes on after "m/"
    reads = count_reads(monkeypatch)
    assert ask(chain, "/pool_health?model=m")["routable_per_shard"] == [0]
    assert reads[0] == 0  # was 55: one a registration, one more a SERVING one's stake
    assert [p["model"] for p in ask(chain, "/pool_health")["pools"]] == ["m"]
    assert reads[0] == 0
    staked = register(chain, "staked")
    make_routable(chain, staked)
    reads[0] = 0
    assert ask(chain, "/pool_health?model=m")["routable_per_shard"] == [1]
    assert reads[0] == 4  # its pool row, node, stake, reputation (no coverage record yet)


def test_pool_health_without_a_model_lists_the_genesis_models_only() -> None:
    chain = Chain(genesis={"models": {"m": {"shards": 2}}})
    strangers(chain, 3, model="junk-a")
    strangers(chain, 3, model="junk-b")
    assert [p["model"] for p in ask(chain, "/pool_health")["pools"]] == ["m"]
    # still asked by name; its shard count comes from its staked nodes (none: 0)
    assert ask(chain, "/pool_health?model=junk-a")["shards"] == 0
    assert ask(Chain(), "/pool_health") == {"pools": []}


def pool(chain: Chain) -> set[str]:
    return {key for key, _ in chain.state.committed_items(schema.POOL)}


def routable_counts(chain: Chain, model: str, shards: int) -> list[int]:
    """Per shard, the routable compute nodes of `model` as `/nodes` lists them (every page)."""
    counts = [0] * shards
    after = ""
    while True:
        page = ask(chain, f"/nodes?model={model}&role=compute" + (f"&after={after}" * bool(after)))
        for entry in page["nodes"]:
            for shard in entry["shards"] if entry["routable"] else []:
                counts[shard] += 1
        if page["next"] is None:
            return counts
        after = page["next"]


def test_the_staked_pool_follows_stake_leave_and_expiry() -> None:
    """The pool index holds exactly the staked compute nodes that did not leave, so the
    counts of /pool_health stay those of the routable /nodes entries at every step."""
    genesis = {"models": {"m": {"shards": 2}}, "registration_ttl": 20, "heartbeat_timeout": 1000}
    chain = Chain(genesis=genesis)
    a, b, c = (register(chain, label, shards=(0, 1)) for label in ("a", "b", "c"))
    register(chain, "verifier", role="verifier")  # another role: never in a pool
    strangers(chain, 4, beat=True)
    assert pool(chain) == set()

    def agree() -> None:
        assert ask(chain, "/pool_health?model=m")["routable_per_shard"] == routable_counts(
            chain, "m", 2
        )

    for key in (a, b, c):
        make_routable(chain, key)
    assert pool(chain) == {f"m/{hexkey(k)}" for k in (a, b, c)}
    assert ask(chain, "/pool_health?model=m")["routable_per_shard"] == [3, 3]
    agree()
    # a's stake falls below the minimum: out of the pool, then expired
    chain.block([chain.tx(AttestStake(hexkey(a), 1), v.key) for v in chain.validators[:3]])
    assert f"m/{hexkey(a)}" not in pool(chain)
    agree()
    chain.block([chain.tx(Leave(), b)])  # b leaves: out at once, whatever its stake
    assert pool(chain) == {f"m/{hexkey(c)}"}
    agree()
    for _ in range(21):
        chain.block([])
    assert pool(chain) == {f"m/{hexkey(c)}"}
    assert ask(chain, "/pool_health?model=m")["routable_per_shard"] == [1, 1]
    agree()
    # the strangers expired too, and nothing of theirs was ever in the pool
    assert [n["key"] for n in ask(chain, "/nodes?role=compute")["nodes"]] == sorted(
        hexkey(k) for k in (b, c)
    )


def test_routable_agrees_with_the_node_view() -> None:
    chain = Chain(genesis={"models": {"m": {"shards": 1}}})
    staked, unstaked = register(chain, "staked"), register(chain, "unstaked")
    make_routable(chain, staked)
    chain.block([chain.tx(Heartbeat(), unstaked)])
    register(chain, "joined")
    nodes = list(chain.state.committed_items(schema.NODE))
    views = {key: node_view(chain.state, key, node)["routable"] for key, node in nodes}
    assert {key: routable(chain.state, key, node) for key, node in nodes} == views
    assert sorted(views.values()) == [False, False, True]
