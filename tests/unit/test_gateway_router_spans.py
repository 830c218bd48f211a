"""Router with span hops: a registry entry `shards: [a, …, b]` (contiguous) is one hop covering
shards a … b; circuits cover the shards in order, preferring spans, and a failed span is
replaced by another span or by single-shard nodes of the same shards."""

from __future__ import annotations

from typing import Any

import pytest

from node.gateway.errors import NoCircuit
from node.gateway.router import RoutableNode, Router, routable_by_shard

pytestmark = pytest.mark.unit

LAYERS = [(0, 2), (2, 4), (4, 6)]


def entry(key: str, port: int, shards: list[int], **changes: Any) -> dict[str, Any]:
    return {
        "key": key * 32,
        "endpoint": f"http://127.0.0.1:{port}",
        "shards": shards,
        "routable": True,
        **changes,
    }


class Source:
    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.entries = entries

    async def compute_nodes(self) -> list[dict[str, Any]]:
        return self.entries


def _router(entries: list[dict[str, Any]]) -> Router:
    router = Router(
        Source(entries),
        model_hash="sha256:" + "0" * 64,
        shard_layers=LAYERS,
        http=None,  # type: ignore[arg-type]
        refresh_s=0,
        public_only=False,  # loopback test endpoints
    )

    async def verified(node: RoutableNode) -> bool:
        return True

    router._verify = verified  # type: ignore[method-assign]
    return router


def test_routable_by_shard_takes_a_contiguous_span_under_its_first_shard() -> None:
    grouped = routable_by_shard([entry("aa", 1, [1, 2])], 3, public_only=False)
    (node,) = grouped[1]
    assert (node.shard, node.last, node.span.shards) == (1, 2, (1, 2))
    assert grouped[0] == [] and grouped[2] == []


@pytest.mark.parametrize("shards", [[0, 2], [2, 1], [1, 1], [1, 2, 3], [0, True], ["1", "2"]])
def test_routable_by_shard_skips_a_span_that_is_not_contiguous_or_past_the_model(
    shards: list[Any],
) -> None:
    assert routable_by_shard([entry("aa", 1, shards)], 3, public_only=False) == {
        0: [],
        1: [],
        2: [],
    }


def test_routable_by_shard_prices_a_span_per_shard() -> None:
    paid = entry("bb", 2, [1, 2], prices={"1": 0, "2": 64})
    (node,) = routable_by_shard([paid], 3, public_only=False)[1]
    assert node.shard_prices == (0, 64)
    assert node.payees() == [
        (1, "http://127.0.0.1:2#shard-1", 0),
        (2, "http://127.0.0.1:2#shard-2", 64),
    ]


async def test_router_pays_a_span_per_shard_checked_against_its_info() -> None:
    from node.client.paying import accepts_price

    router = _router(
        [entry("00", 1, [0], prices={"0": 0}), entry("12", 4, [1, 2], prices={"1": 8, "2": 16})]
    )
    router.accept_price = accepts_price(8)
    info = {
        "model_hash": router.model_hash,
        "shard": 1,
        "shards": [1, 2],
        "layers": [2, 6],
        "credit_positions": 8,
        "shard_prices": {"1": 8, "2": 16},
    }
    (span,) = (await router.routable())[1]
    assert router._note_price(span, info)
    assert router.prices == {"http://127.0.0.1:4#shard-1": 8, "http://127.0.0.1:4#shard-2": 16}
    assert set(router.parties) == set(router.prices)
    # /info asking more than the chain's price on one shard: not paid, not routed
    lying = {**info, "shard_prices": {"1": 8, "2": 4}}
    assert not router._note_price(span, lying) and router.prices == {}


async def test_router_prefers_the_span_and_covers_every_shard_once() -> None:
    router = _router(
        [entry("00", 1, [0]), entry("11", 2, [1]), entry("22", 3, [2]), entry("12", 4, [1, 2])]
    )
    for _ in range(8):
        circuit = await router.circuit()
        assert [(n.shard, n.span.last) for n in circuit.nodes] == [(0, 0), (1, 2)]


async def test_router_leaves_an_overloaded_span_for_single_shards() -> None:
    router = _router(
        [entry("00", 1, [0]), entry("11", 2, [1]), entry("22", 3, [2]), entry("12", 4, [1, 2])]
    )
    full = {"max_batch": 32, "max_sessions": 4, "max_queued": 256, "sessions": 4, "load": {}}
    router.costs.observe_info("http://127.0.0.1:4", full, 0.002)
    circuit = await router.circuit()
    assert [n.key[:2] for n in circuit.nodes] == ["00", "11", "22"]


async def test_router_replaces_a_failed_span_by_single_shard_nodes() -> None:
    router = _router(
        [entry("00", 1, [0]), entry("11", 2, [1]), entry("22", 3, [2]), entry("12", 4, [1, 2])]
    )
    circuit = await router.circuit()
    assert [n.key[:2] for n in circuit.nodes] == ["00", "12"]
    replaced = await router.replace(circuit, [1])
    assert [n.key[:2] for n in replaced.nodes] == ["00", "11", "22"]
    # and a failed single-shard hop by a single-shard node of its shard, never a span
    router2 = _router([entry("00", 1, [0]), entry("0a", 5, [0]), entry("12", 4, [1, 2])])
    circuit = await router2.circuit()
    first = circuit.nodes[0].key[:2]
    replaced = await router2.replace(circuit, [0])
    assert [n.key[:2] for n in replaced.nodes] == [{"00": "0a", "0a": "00"}[first], "12"]


async def test_router_uses_a_span_where_no_single_node_serves_its_shards() -> None:
    router = _router([entry("00", 1, [0]), entry("12", 4, [1, 2])])
    circuit = await router.circuit()
    assert [n.key[:2] for n in circuit.nodes] == ["00", "12"]
    router = _router([entry("00", 1, [0]), entry("01", 4, [0, 1])])  # nothing serves shard 2
    with pytest.raises(NoCircuit, match="shard"):
        await router.circuit()
