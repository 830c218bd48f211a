"""A gateway serving two models (issue 44), in process: the question's `model` picks the model's
head, router and nodes; its payment is checked against, and its receipt names, that model; an
unknown model is refused by name; `/v1/models` and `/v1/pools` list both. Then the naming rule
(node/gateway/models.py), a payment key bound to one model, the client's pool choice
(`planet ask/key --model`), the config's manifests and the guards of two models in one file."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from node.gateway.app import create_app
from node.gateway.client import pick_pool
from node.gateway.config import GatewayConfig
from node.gateway.errors import NotFound, PaymentRequired
from node.gateway.escrow_reads import OnChainBalance, OnChainDeposit
from node.gateway.guards import Guards
from node.gateway.models import ModelInfo, ModelRoute, ModelTable, served_names
from node.gateway.router import Router
from node.server.app import create_app as create_node_app
from node.server.config import ServerConfig
from node.server.next_hops import NextHopSpec
from protocol.eip712 import address_of
from protocol.errors import UsageError
from protocol.payment import (
    PaymentKey,
    QueryPayment,
    parse_payment_key,
    sign_payment,
    sign_payment_key,
    verify_receipt_json,
)
from tests.doubles.fake_shard import FakeShard
from tests.unit.gateway_fakes import (
    CHAT,
    DOMAIN,
    ESCROW,
    GATEWAY,
    MODEL_HASH,
    MODEL_ID,
    NODE_KEYS,
    USER,
    FakeEscrow,
    FakeHead,
    FakeSource,
    H,
    build_gateway,
)

pytestmark = pytest.mark.unit

SECOND_HASH = "sha256:" + "5" * 64
SECOND_ID = bytes.fromhex("5" * 64)
SECOND_KEY = "c3" * 32  # the second model's one node


def _entry(server: Any, key: str, shard: int) -> dict[str, Any]:
    url = str(server.make_url("")).rstrip("/")
    return {"key": key, "endpoint": url, "shards": [shard], "routable": True}


@pytest.fixture
async def env(aiohttp_server, aiohttp_client, tmp_path: Path):
    """Model 1: two fake shards (+1, +2 per token); model 2: one shard of 4 layers (+1)."""
    forward = NextHopSpec("any")
    first = []
    for shard in range(2):
        backend = FakeShard(shard_id=shard, hidden_size=H, layers=(shard * 2, shard * 2 + 2))
        config = ServerConfig(manifest_path=Path("x"), shard_id=shard, next_hops=forward)
        first.append(await aiohttp_server(create_node_app(config, backend)))
    backend = FakeShard(shard_id=0, hidden_size=H, layers=(0, 4))
    backend.model_hash = SECOND_HASH
    config = ServerConfig(manifest_path=Path("x"), shard_id=0, next_hops=forward)
    second = await aiohttp_server(create_node_app(config, backend))
    http = aiohttp.ClientSession()
    router = Router(
        FakeSource([_entry(second, SECOND_KEY, 0)]),
        model_hash=SECOND_HASH,
        shard_layers=[(0, 4)],
        http=http,
        refresh_s=0,
        public_only=False,
    )
    info = ModelInfo("fake-model-1p", SECOND_HASH, SECOND_ID, 1, (SECOND_HASH,))
    escrow = FakeEscrow()
    gateway = build_gateway(
        tmp_path,
        http,
        escrow,
        FakeSource([_entry(s, NODE_KEYS[i], i) for i, s in enumerate(first)]),
        more_models=[ModelRoute(info, FakeHead(), router)],
        more_model_ids=[SECOND_ID],
    )
    client = await aiohttp_client(create_app(gateway))
    yield client, escrow
    await http.close()


_queries = iter(range(1, 10**6))


def pay(escrow: FakeEscrow, model_id: bytes, signed_for: bytes | None = None) -> dict[str, str]:
    """A funded deposit for `model_id`; its proof signed for `signed_for` (default the same)."""
    query = next(_queries).to_bytes(32, "big")
    escrow.deposits[query] = OnChainDeposit(address_of(USER), 10**9, 1, model_id)
    payment = QueryPayment(query, signed_for or model_id, GATEWAY, 10**9)
    return {"Authorization": f"Bearer {sign_payment(USER, payment, DOMAIN)}"}


async def test_a_question_naming_the_second_model_is_served_and_paid_on_its_nodes(env) -> None:
    client, escrow = env
    for name in ("fake-model-1p", SECOND_HASH):  # by its name, and by its model hash
        answer = await client.post(
            "/v1/chat/completions",
            json={**CHAT, "model": name, "max_tokens": 3},
            headers=pay(escrow, SECOND_ID),
        )
        assert answer.status == 200, await answer.text()
        body = await answer.json()
        assert body["model"] == "fake-model-1p"
        assert body["choices"][0]["message"]["content"] == "efg"  # 3 → 4, 5, 6: one +1 shard
        receipt, signer = verify_receipt_json(body["planet_receipt"], DOMAIN)
        assert signer == GATEWAY and receipt.model_id == SECOND_ID
        assert body["planet_receipt"]["nodes"] == [SECOND_KEY]
    # the first model still answers on its own two nodes
    answer = await client.post(
        "/v1/chat/completions", json={**CHAT, "max_tokens": 2}, headers=pay(escrow, MODEL_ID)
    )
    body = await answer.json()
    assert body["model"] == "fake-model" and body["choices"][0]["message"]["content"] == "gj"
    assert body["planet_receipt"]["nodes"] == NODE_KEYS
    assert verify_receipt_json(body["planet_receipt"], DOMAIN)[0].model_id == MODEL_ID


async def test_a_payment_for_one_model_pays_for_no_other_and_unknown_models_are_named(env) -> None:
    client, escrow = env
    # a deposit made for model 1, its proof signed for model 2: refused before any node works
    refused = await client.post(
        "/v1/chat/completions",
        json={**CHAT, "model": "fake-model-1p", "max_tokens": 2},
        headers=pay(escrow, MODEL_ID, signed_for=SECOND_ID),
    )
    assert refused.status == 402
    assert (await refused.json())["error"]["code"] == "payment_wrong_model"
    # a proof signed for model 1 asked of model 2: its signature names another depositor
    refused = await client.post(
        "/v1/chat/completions",
        json={**CHAT, "model": "fake-model-1p", "max_tokens": 2},
        headers=pay(escrow, MODEL_ID),
    )
    assert refused.status == 402
    missing = await client.post(
        "/v1/chat/completions",
        json={**CHAT, "model": "nope", "max_tokens": 2},
        headers=pay(escrow, MODEL_ID),
    )
    assert missing.status == 404
    error = (await missing.json())["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "'fake-model', 'fake-model-1p'" in error["message"]


async def test_models_and_pools_list_every_served_model(env) -> None:
    client, _ = env
    listed = (await (await client.get("/v1/models")).json())["data"]
    assert [(m["id"], m["planet_model_hash"], m["planet_shards"]) for m in listed] == [
        ("fake-model", MODEL_HASH, 2),
        ("fake-model-1p", SECOND_HASH, 1),
    ]
    pools = (await (await client.get("/v1/pools")).json())["data"]
    assert [(p["model"], p["model_id"]) for p in pools] == [
        ("fake-model", "0x" + MODEL_ID.hex()),
        ("fake-model-1p", "0x" + SECOND_ID.hex()),
    ]
    health = await (await client.get("/health")).json()
    assert health["models"] == ["fake-model", "fake-model-1p"]


# --- names -------------------------------------------------------------------------------------


def test_two_sets_of_one_base_model_are_told_apart_by_their_folder(tmp_path: Path) -> None:
    three, one = tmp_path / "m-3p-int8" / "manifest.json", tmp_path / "m-1p-int8" / "manifest.json"
    names = served_names([("m", "sha256:" + "a" * 64, three), ("m", "sha256:" + "b" * 64, one)])
    assert [n.name for n in names] == ["m", "m-1p-int8"]  # the first keeps the manifest's name
    assert names[0].aliases == ("sha256:" + "a" * 64, "m-3p-int8")
    assert names[1].aliases == ("sha256:" + "b" * 64,)
    with pytest.raises(UsageError, match="given twice"):
        served_names([("m", "sha256:" + "a" * 64, three), ("m", "sha256:" + "a" * 64, one)])


def test_the_table_finds_a_model_by_any_name_and_refuses_others_by_name() -> None:
    routes = [
        ModelRoute(ModelInfo("m", "sha256:a", b"a", 3, ("m-3p",)), None, None),
        ModelRoute(ModelInfo("m-1p", "sha256:b", b"b", 1, ("sha256:b", "m")), None, None),
    ]
    table = ModelTable(routes)
    assert table.route("m") is routes[0]  # a name is never shadowed by another's alias
    assert table.route("m-3p") is routes[0] and table.route("sha256:b") is routes[1]
    with pytest.raises(NotFound, match="serves 'm', 'm-1p'"):
        table.route("m-2p")


# --- payment keys, the client's choice, the config ------------------------------------------------


async def test_a_payment_key_id_pays_for_one_model_only(tmp_path: Path) -> None:
    escrow = FakeEscrow()
    escrow.balances[address_of(USER)] = OnChainBalance(10**12, 0)
    async with aiohttp.ClientSession() as http:
        desk = build_gateway(tmp_path, http, escrow, more_model_ids=[SECOND_ID]).desk
    key_id, expiry = bytes(range(32)), int(time.time()) + 86_400
    for model, required in ((MODEL_ID, 100), (SECOND_ID, 100)):
        text = sign_payment_key(
            USER, PaymentKey(GATEWAY, key_id, model, 10**6, expiry, ESCROW), DOMAIN
        )
        if model == MODEL_ID:
            reservation = await desk.reserve(parse_payment_key(text), required, model)
            assert desk.settle(reservation, 1, 1, NODE_KEYS)["model_id"] == "0x" + model.hex()
        else:  # the same key id signed for the other model: refused by name
            with pytest.raises(PaymentRequired) as refused:
                await desk.reserve(parse_payment_key(text), required, model)
            assert refused.value.code == "key_id_conflict"
    with pytest.raises(ValueError, match="not one this desk"):
        await desk.reserve(parse_payment_key(text), 1, bytes(32 * [9]))


def test_the_client_picks_the_pool_of_the_model_asked_for() -> None:
    pools = [
        {"model": "m", "model_hash": "sha256:a", "aliases": ["m-3p"]},
        {"model": "m-1p", "model_hash": "sha256:b", "aliases": []},
    ]
    assert pick_pool(pools, "m-1p", "gw")["model_hash"] == "sha256:b"
    assert pick_pool(pools, "m-3p", "gw")["model"] == "m"
    assert pick_pool(pools, "sha256:b", "gw")["model"] == "m-1p"
    with pytest.raises(UsageError, match="serves m, m-1p"):
        pick_pool(pools, "m-2p", "gw")


def test_the_config_takes_each_manifest_once(tmp_path: Path) -> None:
    for name in ("a", "b", "d.json"):
        (tmp_path / name).write_text("{}")
    common: dict[str, Any] = dict(
        evm_rpc="http://x",
        deployment=tmp_path / "d.json",
        committee_rpc="http://x",
        wallet=tmp_path / "w.json",
    )
    config = GatewayConfig(manifest=tmp_path / "a", more_manifests=(tmp_path / "b",), **common)
    assert config.validate().manifests == (tmp_path / "a", tmp_path / "b")
    with pytest.raises(UsageError, match="twice"):
        GatewayConfig(
            manifest=tmp_path / "a", more_manifests=(tmp_path / "a",), **common
        ).validate()
    with pytest.raises(UsageError, match="no manifest"):
        GatewayConfig(
            manifest=tmp_path / "a", more_manifests=(tmp_path / "c",), **common
        ).validate()


def test_two_models_guards_share_one_file_and_neither_drops_the_other(tmp_path: Path) -> None:
    path = tmp_path / "route.json"
    first = Guards(path, "sha256:a")
    second = first.sibling("sha256:b")
    first.keep(0, "1" * 64)
    second.keep(0, "2" * 64)  # saved after the first's keep: must not drop it
    again = Guards(path, "sha256:a")
    assert again.get(0) == "1" * 64 and again.sibling("sha256:b").get(0) == "2" * 64
