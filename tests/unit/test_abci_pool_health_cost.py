"""What one `/pool_health` query makes a validator read (abci_app/queries.py `_pool_counts`):
registering and heartbeating cost nothing, so the registry is as long as strangers make it.
One pass over it, one record per registration and one more (its stake) per unstaked SERVING
node of the model; without a model, only the genesis models' pools, in the same one pass
(a model named at registration no longer makes the query read the registry once more).
Measured at 10 000 registrations: bench/query_cost.py, docs/committee.md *What a query costs*."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from abci_app import schema
from abci_app.codes import Code
from abci_app.queries import node_view, routable
from abci_app.state import State
from protocol.committee.registry import Heartbeat
from tests.committee_chain import Chain, seeded_key
from tests.unit.test_abci_state import ask, make_routable, register, register_body

pytestmark = pytest.mark.unit


def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A counter of the records `State` reads (lookups and range-scan rows) from now on."""
    reads = [0]
    committed, items = State.committed, State.committed_items

    def counted(state: State, ns: str, key: str) -> Any:
        reads[0] += 1
        return committed(state, ns, key)

    def counted_items(state: State, *args: Any, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        for item in items(state, *args, **kwargs):
            reads[0] += 1
            yield item

    monkeypatch.setattr(State, "committed", counted)
    monkeypatch.setattr(State, "committed_items", counted_items)
    return reads


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


def test_pool_health_reads_one_record_a_registration_two_an_unstaked_serving_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chain = Chain(genesis={"models": {"m": {"shards": 1}}})
    strangers(chain, 20)  # JOIN
    strangers(chain, 10, beat=True)  # SERVING, unstaked
    strangers(chain, 10, model="other", beat=True)
    reads = count_reads(monkeypatch)
    assert ask(chain, "/pool_health?model=m")["routable_per_shard"] == [0]
    assert reads[0] == 40 + 10  # node records, the stake of m's SERVING ones (was 100: node_view)
    reads[0] = 0
    assert [p["model"] for p in ask(chain, "/pool_health")["pools"]] == ["m"]
    assert reads[0] == 40 + 10  # the same one pass without a model (was once per model seen)


def test_pool_health_without_a_model_lists_the_genesis_models_only() -> None:
    chain = Chain(genesis={"models": {"m": {"shards": 2}}})
    strangers(chain, 3, model="junk-a")
    strangers(chain, 3, model="junk-b")
    assert [p["model"] for p in ask(chain, "/pool_health")["pools"]] == ["m"]
    assert ask(chain, "/pool_health?model=junk-a")["shards"] == 1  # still asked by name
    assert ask(Chain(), "/pool_health") == {"pools": []}


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
