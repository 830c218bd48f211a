"""Router: untrusted /nodes entries, routable filtering, random choice per shard."""

from __future__ import annotations

from typing import Any

import pytest

from node.gateway.router import RoutableNode, Router, clean_endpoint, routable_by_shard

pytestmark = pytest.mark.unit

KEY = "ab" * 32


def entry(**changes: Any) -> dict[str, Any]:
    return {
        "key": KEY,
        "endpoint": "http://127.0.0.1:9000",
        "shards": [0],
        "routable": True,
        **changes,
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("http://127.0.0.1:9000", "http://127.0.0.1:9000"),
        ("https://node.example:443/", "https://node.example:443"),
        ("http://127.0.0.1", None),  # no port
        ("http://127.0.0.1:9000/v1", None),  # a path
        ("http://127.0.0.1:9000?x=1", None),
        ("http://user:pw@127.0.0.1:9000", None),
        ("ftp://127.0.0.1:21", None),
        ("http://127.0.0.1:99999", None),
        ("http://[::1:9000", None),
        ("x" * 300, None),
        (None, None),
        (9000, None),
    ],
)
def test_router_clean_endpoint(value: Any, expected: str | None) -> None:
    assert clean_endpoint(value) == expected


@pytest.mark.parametrize(
    "bad",
    [
        entry(routable=False),
        entry(routable="true"),
        entry(key="AB" * 32),
        entry(key="ab" * 31),
        entry(key=None),
        entry(endpoint="http://127.0.0.1:9000/evil"),
        entry(shards=[0, 1]),
        entry(shards=[2]),
        entry(shards=[-1]),
        entry(shards=[True]),
        entry(shards="0"),
        "not an object",
        None,
    ],
)
def test_router_skips_unroutable_and_malformed_entries(bad: Any) -> None:
    assert routable_by_shard([bad], 2, public_only=False) == {0: [], 1: []}


def test_router_groups_routable_by_shard() -> None:
    grouped = routable_by_shard([entry(), entry(key="cd" * 32, shards=[1])], 2, public_only=False)
    assert grouped == {
        0: [RoutableNode(KEY, "http://127.0.0.1:9000", 0)],
        1: [RoutableNode("cd" * 32, "http://127.0.0.1:9000", 1)],
    }


class Source:
    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.entries = entries

    async def compute_nodes(self) -> list[dict[str, Any]]:
        return self.entries


async def test_router_picks_at_random_among_eligible_nodes() -> None:
    keys = [f"{i:02x}" * 32 for i in range(4)]
    router = Router(
        Source([entry(key=k, endpoint=f"http://127.0.0.1:{9000 + i}") for i, k in enumerate(keys)]),
        model_hash="sha256:" + "0" * 64,
        shard_layers=[(0, 30)],
        http=None,  # type: ignore[arg-type]
        public_only=False,  # loopback test endpoints
        refresh_s=0,
    )

    async def verified(node: RoutableNode) -> bool:
        return True

    router._verify = verified  # type: ignore[method-assign]
    chosen = {(await router.circuit()).keys[0] for _ in range(64)}
    assert chosen == set(keys)  # 4 nodes, 64 draws: every one is used
    router.mark_failed(RoutableNode(keys[0], "http://127.0.0.1:9000", 0))
    assert keys[0] not in {(await router.circuit()).keys[0] for _ in range(32)}


async def test_router_probes_few_dead_registrations_then_gives_up_with_503() -> None:
    from node.gateway.errors import NoCircuit
    from node.gateway.router import MAX_TRIES_PER_SHARD

    keys = [f"{i:02x}" * 32 for i in range(10)]
    router = Router(
        Source([entry(key=k) for k in keys]),
        model_hash="sha256:" + "0" * 64,
        shard_layers=[(0, 30)],
        http=None,  # type: ignore[arg-type]
        public_only=False,  # loopback test endpoints
        refresh_s=0,
    )
    probed: list[str] = []

    async def dead(node: RoutableNode) -> bool:
        probed.append(node.key)
        return False

    router._verify = dead  # type: ignore[method-assign]
    with pytest.raises(NoCircuit):
        await router.circuit()
    assert len(probed) == MAX_TRIES_PER_SHARD


async def test_router_hold_queues_questions_beyond_the_per_node_limit() -> None:
    import asyncio

    from node.gateway.errors import NoCircuit
    from node.gateway.router import Circuit

    router = Router(
        Source([]),
        model_hash="sha256:" + "0" * 64,
        shard_layers=[(0, 15), (15, 30)],
        http=None,  # type: ignore[arg-type]
        public_only=False,  # loopback test endpoints
        max_sessions_per_node=2,
        slot_wait_s=0.2,
    )
    a = RoutableNode("aa" * 32, "http://127.0.0.1:1", 0)
    b = RoutableNode("bb" * 32, "http://127.0.0.1:2", 1, capacity=1)  # registered capacity 1
    circuit = Circuit((a, b))
    inside = 0
    most = 0

    async def question() -> None:
        nonlocal inside, most
        async with router.hold(circuit):
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.01)
            inside -= 1

    await asyncio.gather(*(question() for _ in range(5)))
    assert most == 1  # min(per-node limit 2, b's capacity 1)
    async with router.hold(circuit):
        with pytest.raises(NoCircuit) as caught:
            async with router.hold(circuit):
                pass
    assert caught.value.code == "nodes_busy"
    async with router.hold(circuit):  # every slot came back
        pass
