"""Router: untrusted /nodes entries, routable filtering, random choice per shard."""

from __future__ import annotations

import random
from typing import Any

import pytest

from node.client.costs import CostBook
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
        entry(shards=[0, 2]),  # not one contiguous span
        entry(shards=[1, 0]),
        entry(shards=[1, 2]),  # a span past the model's last shard
        entry(shards=[]),
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


def _router(entries: list[dict[str, Any]], shard_layers: list[tuple[int, int]]) -> Router:
    router = Router(
        Source(entries),
        model_hash="sha256:" + "0" * 64,
        shard_layers=shard_layers,
        http=None,  # type: ignore[arg-type]
        refresh_s=0,
        public_only=False,  # loopback test endpoints
    )

    async def verified(node: RoutableNode) -> bool:
        return True

    router._verify = verified  # type: ignore[method-assign]
    return router


def _seen(router: Router, endpoint: str, step_s: float) -> None:
    """The router's cost book saw `endpoint` compute 10 forwards of `step_s` each."""
    load = {"max_batch": 32, "max_sessions": 64, "max_queued": 256}
    empty = {**load, "load": {"decode_s": 0.0, "decode_batches": 0}}
    router.costs.observe_info(endpoint, empty, 0.002)
    info = {**load, "load": {"decode_s": 10 * step_s, "decode_batches": 10}}
    router.costs.observe_info(endpoint, info, 0.002)


async def test_router_load_aware_leaves_out_a_3x_slower_replica_random_among_the_rest() -> None:
    keys = [f"{i:02x}" * 32 for i in range(3)]
    urls = [f"http://127.0.0.1:{9000 + i}" for i in range(3)]
    router = _router([entry(key=k, endpoint=u) for k, u in zip(keys, urls, strict=True)], [(0, 30)])
    for url, step in zip(urls, (0.05, 0.05, 0.15), strict=True):
        _seen(router, url, step)
    chosen = [(await router.circuit()).keys[0] for _ in range(64)]
    assert set(chosen) == set(keys[:2])  # the slow one never; both equal ones are used


async def test_router_replace_cools_the_failed_node_and_keeps_the_healthy_hops() -> None:
    a0, b0, a1 = "a0" * 32, "b0" * 32, "a1" * 32
    router = _router(
        [
            entry(key=a0, endpoint="http://127.0.0.1:9000"),
            entry(key=b0, endpoint="http://127.0.0.1:9001"),
            entry(key=a1, endpoint="http://127.0.0.1:9002", shards=[1]),
        ],
        [(0, 15), (15, 30)],
    )
    first = await router.circuit()
    failed = first.keys[0]
    replaced = await router.replace(first, [0])
    assert replaced.keys[0] != failed and replaced.keys[1] == a1
    assert failed not in [(await router.circuit()).keys[0] for _ in range(16)]  # cooling
    # shard 1 has no other node: the same node is tried again (after the caller's backoff)
    again = await router.replace(replaced, [1])
    assert again.keys == replaced.keys


async def test_router_moves_off_a_slow_node_on_trial_without_cooling_it() -> None:
    """Shard 0: `fast` seen, `slow` not seen lately (so tried: as cheap as the cheapest); once
    the client's passes through `slow` show it 3x slower, the router names its hop outpriced
    and replaces it by `fast` without cooling `slow` down; `fast` picked while seen is never
    outpriced."""
    fast, slow, other = "0f" * 32, "05" * 32, "a1" * 32
    urls = {fast: "http://127.0.0.1:9000", slow: "http://127.0.0.1:9001"}
    router = _router(
        [
            *(entry(key=k, endpoint=u) for k, u in urls.items()),
            entry(key=other, endpoint="http://127.0.0.1:9002", shards=[1]),
        ],
        [(0, 15), (15, 30)],
    )
    for url in urls.values():
        _seen(router, url, 0.05)  # both claim the same step
    router.costs.observe_circuit([urls[fast], "http://127.0.0.1:9002"], 0.13)
    for _ in range(64):  # a tie at the cheapest: sooner or later the slow one is tried
        circuit = await router.circuit()
        if circuit.keys[0] == slow:
            break
        assert router.outpriced(circuit) == set()
    assert circuit.keys[0] == slow
    router.costs.observe_circuit([urls[slow], "http://127.0.0.1:9002"], 0.33)
    assert router.outpriced(circuit) == {0}
    moved = await router.replace(circuit, [0], failed=False)
    assert moved.keys == (fast, other) and not router._cooling(circuit.nodes[0])
    assert router.outpriced(moved) == set()


async def test_router_leaves_out_nodes_charging_what_this_gateway_does_not_pay(
    aiohttp_server: Any,
) -> None:
    """A router with no credit payer (the default `accept_price`): a node asking credits
    (`credit_positions` in its /info) would refuse its every question, so it is not routed to;
    a payer's router (the personal client's, the hosted gateway's) takes free nodes and those no
    dearer than its floor. A free node that starts charging is left out once the router sees
    the new price."""
    import aiohttp
    from aiohttp import web

    from node.gateway.errors import NoCircuit

    prices = {9: 0, 8: 8, 64: 64}
    servers = {}
    for name, price in prices.items():
        app = web.Application()

        async def info(_: web.Request, price: int = price, name: int = name) -> web.Response:
            return web.json_response(
                {
                    "model_hash": "sha256:" + "0" * 64,
                    "shard": 0,
                    "layers": [0, 30],
                    "credit_positions": prices[name],
                }
            )

        app.router.add_get("/info", info)
        servers[name] = await aiohttp_server(app)
    entries = [
        entry(
            key=f"{name:02x}" * 32,
            endpoint=f"http://127.0.0.1:{server.port}",
            prices={"0": prices[name]},  # registered on the chain
        )
        for name, server in servers.items()
    ]
    async with aiohttp.ClientSession() as http:

        def router(accept: Any = None) -> Router:
            return Router(
                Source(entries),
                model_hash="sha256:" + "0" * 64,
                shard_layers=[(0, 30)],
                http=http,
                public_only=False,
                refresh_s=0,
                accept_price=accept,
            )

        hosted = router()
        assert {(await hosted.circuit()).keys[0] for _ in range(24)} == {"09" * 32}
        personal = router(lambda price: price == 0 or price >= 16)
        assert {(await personal.circuit()).keys[0] for _ in range(48)} == {"09" * 32, "40" * 32}
        prices[9] = 4  # the node free on the chain asks credits: seen at the next /info
        node = next(n for n in (await hosted.routable())[0] if n.key == "09" * 32)
        await hosted._observe(node)
        with pytest.raises(NoCircuit):
            await hosted.circuit()


async def test_background_refresh_reads_an_https_node_pinned_to_its_key(
    aiohttp_server: Any,
) -> None:
    """The hosted gateway's background /info refresh of an https node (every real node: TLS
    with a self-signed certificate of its key) is pinned to the registered key, as the
    verification is: a node that starts charging is seen at the next refresh and left out. It
    was read with the default certificate check, which a node certificate always fails, so its
    stats only moved at the 60 s verification."""
    import aiohttp
    from aiohttp import web
    from nacl.signing import SigningKey

    from node.gateway.errors import NoCircuit
    from node.links import server_context

    key = SigningKey.generate()
    price = {"now": 0}

    async def info(_: web.Request) -> web.Response:
        body = {"model_hash": "sha256:" + "0" * 64, "shard": 0, "layers": [0, 30]}
        return web.json_response({**body, "credit_positions": price["now"]})

    app = web.Application()
    app.router.add_get("/info", info)
    server = await aiohttp_server(app, ssl=server_context(key))
    node_key = key.verify_key.encode().hex()
    endpoint = f"https://127.0.0.1:{server.port}"
    async with aiohttp.ClientSession() as http:
        router = Router(
            Source([entry(key=node_key, endpoint=endpoint, prices={"0": 0})]),
            model_hash="sha256:" + "0" * 64,
            shard_layers=[(0, 30)],
            http=http,
            public_only=False,
            refresh_s=0,
        )
        assert (await router.circuit()).keys == (node_key,)  # verified, pinned
        price["now"] = 4  # free on the chain, now asks credits: the refresh must see it
        node = (await router.routable())[0][0]
        await router._observe(node)
        with pytest.raises(NoCircuit):
            await router.circuit()


async def test_hosted_router_takes_charging_nodes_at_or_above_its_floor_and_refuses_dearer(
    aiohttp_server: Any, tmp_path: Any
) -> None:
    """The hosted gateway pays charging nodes with its credits (node/gateway/credit_payer.py):
    its router (`run.committee_router`) puts free nodes and nodes asking a credit per
    `--min-credit-positions` positions or more in circuits, never a dearer one."""
    from types import SimpleNamespace

    import aiohttp
    from aiohttp import web

    from node.gateway.config import GatewayConfig
    from node.gateway.run import committee_router

    prices = {0: 0, 8: 8, 15: 15, 16: 16, 64: 64}  # node name → its credit_positions
    entries = []
    for name, price in prices.items():
        app = web.Application()

        async def info(_: web.Request, price: int = price) -> web.Response:
            return web.json_response(
                {
                    "model_hash": "sha256:" + "0" * 64,
                    "shard": 0,
                    "layers": [0, 30],
                    "credit_positions": price,
                }
            )

        app.router.add_get("/info", info)
        server = await aiohttp_server(app)
        entries.append(
            entry(
                key=f"{name:02x}" * 32,
                endpoint=f"http://127.0.0.1:{server.port}",
                prices={"0": price},
            )
        )

    class Committee:
        async def abci_query(self, path: str) -> Any:
            return {"nodes": entries}

    manifest = SimpleNamespace(
        model_hash="sha256:" + "0" * 64, shards=[SimpleNamespace(layers=[0, 30])]
    )

    def config(floor: int) -> GatewayConfig:
        return GatewayConfig(
            evm_rpc="http://x",
            deployment=tmp_path / "d.json",
            committee_rpc="http://x",
            manifest=tmp_path / "m.json",
            wallet=tmp_path / "wallet.json",
            private_endpoints=True,  # loopback test nodes
            min_credit_positions=floor,
        )

    async with aiohttp.ClientSession() as http:
        for floor, taken in ((16, {0, 16, 64}), (64, {0, 64}), (1, set(prices))):
            router = committee_router(config(floor), manifest, Committee(), http, floor)
            chosen = {(await router.circuit()).keys[0] for _ in range(96)}
            assert chosen == {f"{name:02x}" * 32 for name in taken}, floor
            assert router.prices[entries[1]["endpoint"]] == 8  # what its payer reads


def test_router_lists_graced_entries_as_fallbacks_and_skips_malformed_grace() -> None:
    grouped = routable_by_shard(
        [entry(routable=False, grace=True), entry(key="cd" * 32, routable=False, grace="true")],
        1,
        public_only=False,
    )
    assert [n.grace for n in grouped[0]] == [True] and grouped[0][0].key == KEY


async def test_router_routes_through_a_graced_node_only_when_no_routable_one_answers() -> None:
    """Issue 44: a node the chain marks DOWN for missed heartbeats while it serves (`grace`)
    is a fallback: never chosen over a routable node that answers, chosen (not a 503) when none
    does, and cooled down like any node when it does not answer either."""
    from node.gateway.errors import NoCircuit

    live, graced = "0a" * 32, "0b" * 32
    router = _router(
        [
            entry(key=live, endpoint="http://127.0.0.1:9000"),
            entry(key=graced, endpoint="http://127.0.0.1:9001", routable=False, grace=True),
        ],
        [(0, 30)],
    )
    assert {(await router.circuit()).keys[0] for _ in range(32)} == {live}
    answering = {graced}

    async def verify(node: RoutableNode) -> bool:
        if node.key not in answering:
            router.mark_failed(node)
            return False
        return True

    router._verify = verify  # type: ignore[method-assign]
    assert (await router.circuit()).keys == (graced,)  # the routable node died: the fallback
    assert router.outpriced(await router.circuit()) == set()
    answering.clear()
    router._cooldown.clear()
    with pytest.raises(NoCircuit, match="no routable compute node"):
        await router.circuit()


async def test_router_pays_the_registered_price_and_distrusts_an_info_that_asks_more(
    aiohttp_server: Any,
) -> None:
    """The price a gateway pays is the one the node registered on the committee chain (its
    `/nodes` entry's `prices`), never its /info: a node whose /info asks more credits than it
    registered (a raise charged before the chain counts it), or asks credits where it
    registered none, is not routed to; one that cut its price mid-epoch (a credit buys more
    there from the next epoch) is routed and paid the registered price. A node with no price
    on the chain is never paid (the chain redeems nothing there): routed only while its /info
    asks nothing, and absent from `prices` otherwise, so a payer refuses it by name."""
    import aiohttp
    from aiohttp import web

    from node.client.chain_prices import price_trusted

    # node name → (registered price on the chain, the price its /info advertises)
    nodes = {1: (64, 16), 2: (64, 128), 3: (0, 64), 4: (64, 0), 5: (32, 32), 6: (None, 64)}
    nodes[7] = (None, 0)
    entries = []
    for name, (registered, advertised) in nodes.items():
        app = web.Application()

        async def info(_: web.Request, advertised: int = advertised) -> web.Response:
            return web.json_response(
                {
                    "model_hash": "sha256:" + "0" * 64,
                    "shard": 0,
                    "layers": [0, 30],
                    "credit_positions": advertised,
                }
            )

        app.router.add_get("/info", info)
        server = await aiohttp_server(app)
        entries.append(
            entry(
                key=f"{name:02x}" * 32,
                endpoint=f"http://127.0.0.1:{server.port}",
                prices={} if registered is None else {"0": registered},
            )
        )
    async with aiohttp.ClientSession() as http:
        router = Router(
            Source(entries),
            model_hash="sha256:" + "0" * 64,
            shard_layers=[(0, 30)],
            http=http,
            public_only=False,
            refresh_s=0,
            accept_price=lambda price: price == 0 or price >= 16,
        )
        # a fixed draw: with 4 of the 7 refused and MAX_TRIES_PER_SHARD = 4 probes, an unlucky
        # first draw (~3 %: the 4 refused first) ends that circuit NoCircuit by design
        router.costs = CostBook(rng=random.Random(7))
        chosen = {(await router.circuit()).keys[0] for _ in range(96)}
        assert {"02" * 32, "05" * 32} <= chosen <= {"02" * 32, "05" * 32, "07" * 32}
        assert router.prices[entries[1]["endpoint"]] == 64  # registered, not its /info's 128
        assert router.prices[entries[4]["endpoint"]] == 32
        [unpriced, free] = (await router.routable())[0][5:]
        assert unpriced.price is None and not await router._verify(unpriced)
        assert unpriced.endpoint not in router.prices  # a payer refuses it: price_unregistered
        assert await router._verify(free) and router.prices[free.endpoint] == 0
    assert price_trusted(None, 0) and not price_trusted(None, 8)
    assert price_trusted(0, 0) and price_trusted(8, 8) and price_trusted(8, 9)
    assert not price_trusted(8, 7) and not price_trusted(0, 8) and not price_trusted(8, 0)
    assert not price_trusted(8, "8") and not price_trusted(8, None)


async def test_router_cooldown_is_a_setting_30_s_by_default() -> None:
    """A failed node sits out `cooldown_s` (`--node-cooldown-s`), then is routed again; the
    default stays router.py's COOLDOWN_S, 30 s (issue 41: a devnet with one node per shard sets
    it short)."""
    import asyncio
    import time

    from node.gateway.router import COOLDOWN_S

    key = "ab" * 32

    def router(**cooldown: float) -> Router:
        built = Router(
            Source([entry(key=key, endpoint="http://127.0.0.1:9000")]),
            model_hash="sha256:" + "0" * 64,
            shard_layers=[(0, 30)],
            http=None,  # type: ignore[arg-type]
            public_only=False,  # loopback test endpoints
            refresh_s=0,
            **cooldown,
        )

        async def verified(node: RoutableNode) -> bool:
            return True

        built._verify = verified  # type: ignore[method-assign]
        return built

    node = RoutableNode(key, "http://127.0.0.1:9000", 0)
    default = router()
    default.mark_failed(node)
    assert COOLDOWN_S == 30.0 and default._cooling(node)
    assert default._cooldown[key] - time.monotonic() > 29
    short = router(cooldown_s=0.2)
    short.mark_failed(node)
    assert short._cooling(node)
    await asyncio.sleep(0.3)
    assert not short._cooling(node)
    assert (await short.circuit()).keys == (key,)


def test_gateway_config_refuses_a_negative_or_huge_node_cooldown(tmp_path: Any) -> None:
    from node.gateway.config import GatewayConfig
    from protocol.errors import UsageError

    def config(cooldown_s: float) -> GatewayConfig:
        return GatewayConfig(
            evm_rpc="http://127.0.0.1:8545",
            deployment=tmp_path / "deployment.json",
            committee_rpc="http://127.0.0.1:26657",
            manifest=tmp_path / "missing-manifest.json",
            wallet=tmp_path / "wallet.json",
            node_cooldown_s=cooldown_s,
        )

    for bad in (-1.0, 3_601.0):
        with pytest.raises(UsageError, match="--node-cooldown-s"):
            config(bad).validate()
    with pytest.raises(UsageError, match="no manifest"):  # 0 (never sit out) is allowed
        config(0.0).validate()


async def test_router_tries_a_shards_cooling_nodes_rather_than_leave_it_without_one() -> None:
    """Issue 44: every node of a shard cooling (its only node refused a question once) is no
    reason to answer `no_routable_node`: the router tries them again, the one that failed
    longest ago first, and a shard with a node cooling beside a live one still uses the live
    one."""
    first, second, other = "0a" * 32, "0b" * 32, "0c" * 32
    router = _router(
        [
            entry(key=first, endpoint="http://127.0.0.1:9000"),
            entry(key=second, endpoint="http://127.0.0.1:9001"),
            entry(key=other, endpoint="http://127.0.0.1:9002", shards=[1]),
        ],
        [(0, 15), (15, 30)],
    )
    circuit = await router.circuit()
    by_key = {n.key: n for n in circuit.nodes}
    router.mark_failed(RoutableNode(first, "http://127.0.0.1:9000", 0))
    assert {(await router.circuit()).keys[0] for _ in range(16)} == {second}
    router.mark_failed(RoutableNode(second, "http://127.0.0.1:9001", 0))
    router.mark_failed(by_key[other])  # shard 1's only node
    assert (await router.circuit()).keys == (first, other)
    assert router._cooling(by_key[other])  # tried, still cooling for the other choices


async def test_router_a_node_named_by_its_previous_hop_cools_briefly() -> None:
    """A node only its previous hop named as the fault (`accused`, node/client/circuit.py
    NEXT_HOP_FAULTS) sits out `accused_cooldown_s` (5 s), not the 30 s a failure the gateway
    saw costs: a hostile hop's word cannot keep an honest next hop out for long."""
    import time

    from node.gateway.router import ACCUSED_COOLDOWN_S

    a0, a1, b1 = "a0" * 32, "a1" * 32, "b1" * 32
    router = _router(
        [
            entry(key=a0, endpoint="http://127.0.0.1:9000"),
            entry(key=a1, endpoint="http://127.0.0.1:9001", shards=[1]),
            entry(key=b1, endpoint="http://127.0.0.1:9002", shards=[1]),
        ],
        [(0, 15), (15, 30)],
    )
    first = await router.circuit()
    accused = first.keys[1]
    replaced = await router.replace(first, [1], accused=[1])
    assert replaced.keys[0] == a0 and replaced.keys[1] != accused
    left = router._cooldown[accused] - time.monotonic()
    assert ACCUSED_COOLDOWN_S == 5.0 and 4 < left <= ACCUSED_COOLDOWN_S
    assert a0 not in router._cooldown  # the hop that named it is not cooled
    again = await router.replace(replaced, [1])  # a failure the gateway saw: the full cooldown
    assert router._cooldown[replaced.keys[1]] - time.monotonic() > 29
    assert again.keys[1] == accused  # (cooling too: tried again rather than no node)


async def test_router_tries_a_cooling_node_when_the_shards_other_nodes_do_not_answer() -> None:
    """The shard's one node not cooling does not answer its /info: the cooling one is tried
    (and answers) rather than a 503."""
    cooled, dead = "0a" * 32, "0b" * 32
    router = _router(
        [
            entry(key=cooled, endpoint="http://127.0.0.1:9000"),
            entry(key=dead, endpoint="http://127.0.0.1:9001"),
        ],
        [(0, 30)],
    )
    probed: list[str] = []

    async def verify(node: RoutableNode) -> bool:
        probed.append(node.key)
        if node.key == dead:
            router.mark_failed(node)
            return False
        return True

    router._verify = verify  # type: ignore[method-assign]
    router.mark_failed(RoutableNode(cooled, "http://127.0.0.1:9000", 0))
    assert (await router.circuit()).keys == (cooled,)
    assert probed == [dead, cooled]
