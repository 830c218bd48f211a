"""node/gateway/dapp.py with an in-process fake gateway and committee (unit: no processes).

The page and its files, the config the page pays with, and /v1/network, whose committee
answers are untrusted: malformed entries are dropped, not passed to the browser.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from eth_utils import to_checksum_address

from node.gateway.app import GATEWAY_KEY, error_middleware
from node.gateway.dapp import add_dapp_routes
from node.gateway.models import ModelInfo, ModelRoute, ModelTable
from protocol.errors import PlanetError
from protocol.payment import payment_domain

pytestmark = pytest.mark.unit

ESCROW = "0x" + "ab" * 20
KEY_A = "a" * 64
KEY_B = "b" * 64
PAYER = "0x" + "5e" * 20
HELD = {to_checksum_address(PAYER): 7 * 10**12}


class FakeCommittee:
    def __init__(self, answers: dict[str, Any] | None = None, down: bool = False) -> None:
        self.answers = answers or {}
        self.down = down
        self.paths: list[str] = []

    async def abci_query(self, path: str) -> Any:
        self.paths.append(path)
        if self.down:
            raise PlanetError("connection refused")
        if path in self.answers:  # an answer for this exact query (one model's pool)
            return self.answers[path]
        route, _, query = path.partition("?")
        if "epoch=" in query:
            return self.answers.get(path)
        after = [p for p in query.split("&") if p.startswith("after=")]
        return self.answers.get(route + ("?" + after[0] if after else ""))


FIRST = ModelInfo("smollm2-135m", "sha256:" + "11" * 32, b"\x11" * 32, 2)
SECOND = ModelInfo(
    "smollm2-135m-1p-int8",
    "sha256:" + "22" * 32,
    b"\x22" * 32,
    1,
    aliases=("sha256:" + "22" * 32,),
)


def _gateway(committee: FakeCommittee, models: tuple[ModelInfo, ...] = (FIRST,)) -> Any:
    table = ModelTable([ModelRoute(info, None, None) for info in models])
    return SimpleNamespace(
        chain_id=31337,
        escrow=ESCROW,
        committee=committee,
        config=SimpleNamespace(evm_rpc="http://127.0.0.1:8545", max_body_bytes=1 << 20),
        model=models[0],
        routes=lambda: table.routes,
        route=table.route,
        desk=SimpleNamespace(
            gateway="0x" + "cd" * 20,
            price=10**12,
            domain=payment_domain(31337, ESCROW),
            max_voucher_lifetime_s=86_400,
            outstanding=lambda payer: HELD.get(payer, 0),
        ),
    )


async def _client(
    aiohttp_client, committee: FakeCommittee, dist: Path, models: tuple[ModelInfo, ...] = (FIRST,)
) -> Any:
    app = web.Application(middlewares=[error_middleware])
    app[GATEWAY_KEY] = _gateway(committee, models)
    add_dapp_routes(app, GATEWAY_KEY, dist=dist)
    return await aiohttp_client(app)


async def test_dapp_index_without_build_says_how_to_build(aiohttp_client, tmp_path) -> None:
    client = await _client(aiohttp_client, FakeCommittee(), tmp_path / "missing")
    answer = await client.get("/")
    assert answer.status == 200
    assert "npm run build:dapp" in await answer.text()


async def test_dapp_serves_built_files_only_from_dist(aiohttp_client, tmp_path) -> None:
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "index.html").write_text("<!doctype html><title>page</title>")
    (dist / "app.js").write_text("console.log(1)")
    (tmp_path / "secret.txt").write_text("no")
    client = await _client(aiohttp_client, FakeCommittee(), dist)
    page = await client.get("/")
    assert page.status == 200 and "<title>page</title>" in await page.text()
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    script = await client.get("/dapp/app.js")
    assert script.status == 200 and script.content_type == "text/javascript"
    for bad in ("/dapp/..%2Fsecret.txt", "/dapp/.hidden", "/dapp/nope.js", "/dapp/a%00.js"):
        answer = await client.get(bad)
        assert answer.status == 404, bad
        assert (await answer.json())["error"]["code"] == "not_found"


async def test_dapp_config_has_chain_escrow_abi_model_and_price(aiohttp_client, tmp_path) -> None:
    client = await _client(aiohttp_client, FakeCommittee(), tmp_path)
    config = await (await client.get("/dapp/config.json")).json()
    assert config["chain_id"] == 31337 and config["escrow"] == ESCROW
    assert config["model_id"] == "0x" + "11" * 32 and config["model"] == "smollm2-135m"
    assert config["price_wei_per_token"] == str(10**12)
    domain = config["payment_domain"]
    assert (domain["name"], domain["version"], domain["chainId"]) == (
        "Planet Query Payment",
        "1",
        31337,
    )
    assert domain["verifyingContract"].lower() == ESCROW
    assert any(item.startswith("function deposit(") for item in config["escrow_abi"])
    assert any(item.startswith("function refund(") for item in config["escrow_abi"])
    assert config["evm_rpc"] == "http://127.0.0.1:8545"
    # the prepaid path: balance, withdrawal and the voucher lifetime the gateway accepts
    for name in ("depositBalance", "requestWithdrawal", "cancelWithdrawal", "withdrawBalance"):
        assert any(item.startswith(f"function {name}(") for item in config["escrow_abi"]), name
    # every payment names the gateway: the one this config names
    assert config["gateway"] == "0x" + "cd" * 20
    assert (
        "function deposit(bytes32 queryId, bytes32 modelId, address gateway) payable"
        in (config["escrow_abi"])
    )
    assert any(
        item.startswith("function prepaidOf(address payer, address gateway) view")
        for item in config["escrow_abi"]
    )
    assert (
        "error WithdrawalNotYetAvailable(address payer, address gateway, uint256 withdrawableAt)"
        in (config["escrow_abi"])
    )
    assert config["max_voucher_lifetime_s"] == 86_400


async def test_dapp_prepaid_shows_what_the_gateway_holds_for_a_payer(
    aiohttp_client, tmp_path
) -> None:
    client = await _client(aiohttp_client, FakeCommittee(), tmp_path)
    for spelling in (PAYER, PAYER.upper().replace("0X", "0x"), to_checksum_address(PAYER)):
        answer = await client.get(f"/dapp/prepaid/{spelling}")
        assert answer.status == 200, spelling
        assert await answer.json() == {
            "payer": to_checksum_address(PAYER),
            "held_wei": str(7 * 10**12),
        }
    other = await (await client.get("/dapp/prepaid/0x" + "11" * 20)).json()
    assert other["held_wei"] == "0"
    for bad in ("0x123", "5e" * 20, "0x" + "zz" * 20, "0x" + "5e" * 21):
        answer = await client.get(f"/dapp/prepaid/{bad}")
        assert answer.status == 400, bad
        assert (await answer.json())["error"]["code"] == "bad_address"


async def test_dapp_config_lists_every_served_model_the_first_first(
    aiohttp_client, tmp_path
) -> None:
    client = await _client(aiohttp_client, FakeCommittee(), tmp_path, (FIRST, SECOND))
    config = await (await client.get("/dapp/config.json")).json()
    assert config["model"] == "smollm2-135m" and config["model_id"] == "0x" + "11" * 32
    assert config["models"] == [
        {
            "model": "smollm2-135m",
            "aliases": [],
            "model_hash": "sha256:" + "11" * 32,
            "model_id": "0x" + "11" * 32,
            "shards": 2,
        },
        {
            "model": "smollm2-135m-1p-int8",
            "aliases": ["sha256:" + "22" * 32],
            "model_hash": "sha256:" + "22" * 32,
            "model_id": "0x" + "22" * 32,
            "shards": 1,
        },
    ]


def test_dapp_config_never_shows_a_remote_rpc_url() -> None:
    from node.gateway.dapp import dapp_config

    for url in (
        "https://mainnet.example/v3/SECRETKEY",
        "http://user:pw@127.0.0.1:8545",
        "http://127.0.0.1:8545/?key=1",
        "http://10.0.0.5:8545",
    ):
        gateway = _gateway(FakeCommittee())
        gateway.config.evm_rpc = url
        assert dapp_config(gateway)["evm_rpc"] is None, url


def _answers() -> dict[str, Any]:
    good = {
        "key": KEY_A,
        "role": "compute",
        "shards": [0],
        "status": "SERVING",
        "reputation": 900_000,
        "untrusted": False,
        "stake": str(10**18),
        "routable": True,
        "endpoint": "http://127.0.0.1:1",
        "evm_address": "0x" + "12" * 20,
    }
    odd = {**good, "key": KEY_B, "shards": [1], "stake": "1e18", "reputation": -5, "role": "<b>"}
    odd["uncommitted"] = True  # flagged by the chain: serves without committing
    hostile = [{**good, "key": "../etc"}, {"key": KEY_A * 2}, {**good, "shards": "0"}]
    return {
        "/nodes": {"nodes": [good, odd, *hostile]},
        "/pool_health": {"routable_per_shard": [1, 0], "status": "incomplete"},
        "/params": {"genesis": {"reputation": {"untrusted_below": 400_000}}},
        "/epochs": {
            "current": 3,
            "height": 77,
            "epochs": [{"epoch": 3, "leader": "V", "challenges": [1]}],
        },
        "/epochs?epoch=2": {"epochs": [{"epoch": 2, "challenges": [], "reputation_applied": {}}]},
        "/epochs?epoch=1": {"epochs": [{"epoch": "1"}]},
    }


async def test_network_view_keeps_only_well_formed_committee_fields(aiohttp_client, tmp_path):
    committee = FakeCommittee(_answers())
    client = await _client(aiohttp_client, committee, tmp_path)
    answer = await client.get("/v1/network")
    assert answer.status == 200
    view = await answer.json()
    assert [n["key"] for n in view["nodes"]] == [KEY_A, KEY_B]
    odd = view["nodes"][1]
    assert odd["stake_wei"] is None and odd["reputation"] is None and odd["role"] is None
    assert view["nodes"][0]["stake_wei"] == str(10**18) and view["nodes"][0]["routable"]
    assert [n["uncommitted"] for n in view["nodes"]] == [False, True]
    assert "endpoint" not in view["nodes"][0]
    assert view["nodes_by_shard"] == [[KEY_A], [KEY_B]]
    assert view["pool"] == {"status": "incomplete", "routable_per_shard": [1, 0]}
    assert [e["epoch"] for e in view["epochs"]] == [3, 2]  # epoch "1" is not an integer
    assert view["epochs"][1]["reputation_applied"] is True
    assert view["current_epoch"] == 3 and view["height"] == 77


async def test_network_view_lists_every_model_and_describes_the_one_named(
    aiohttp_client, tmp_path
) -> None:
    """Two served models: `models` lists both (name, hash, shards, price, pool health); the
    nodes and pool are the first's unless `?model=` names another by name or hash."""
    answers = _answers()
    second_pool = f"/pool_health?model={SECOND.model_hash}&shards=1"
    answers[second_pool] = {"routable_per_shard": [1, 9], "status": "complete"}
    seat = {**answers["/nodes"]["nodes"][0], "key": "c" * 64}
    answers[f"/nodes?model={SECOND.model_hash}"] = {"nodes": [seat], "next": None}
    committee = FakeCommittee(answers)
    client = await _client(aiohttp_client, committee, tmp_path, (FIRST, SECOND))
    view = await (await client.get("/v1/network")).json()
    assert [(m["model"], m["model_hash"], m["shards"]) for m in view["models"]] == [
        ("smollm2-135m", FIRST.model_hash, 2),
        ("smollm2-135m-1p-int8", SECOND.model_hash, 1),
    ]
    assert [m["model_id"] for m in view["models"]] == ["0x" + "11" * 32, "0x" + "22" * 32]
    assert {m["price_wei_per_token"] for m in view["models"]} == {str(10**12)}
    assert [m["pool"] for m in view["models"]] == [
        {"status": "incomplete", "routable_per_shard": [1, 0]},
        {"status": "complete", "routable_per_shard": [1]},  # only its one shard
    ]
    assert view["model"] == "smollm2-135m" and view["nodes_by_shard"] == [[KEY_A], [KEY_B]]
    for name in (SECOND.name, SECOND.model_hash):
        answer = await client.get("/v1/network", params={"model": name})
        assert answer.status == 200, name
        other = await answer.json()
        assert other["model"] == SECOND.name and other["shards"] == 1
        assert other["pool"] == {"status": "complete", "routable_per_shard": [1]}
        assert other["nodes_by_shard"] == [["c" * 64]] and other["nodes_total"] == 1
        assert len(other["models"]) == 2
    assert f"/nodes?model={SECOND.model_hash}" in committee.paths
    missing = await client.get("/v1/network", params={"model": "llama-70b"})
    assert missing.status == 404
    error = (await missing.json())["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "'llama-70b' is not served here" in error["message"]
    assert "'smollm2-135m', 'smollm2-135m-1p-int8'" in error["message"]
    for bad in ("", "x" * 201):
        answer = await client.get("/v1/network", params={"model": bad})
        assert answer.status == 400, bad
        assert (await answer.json())["error"]["param"] == "model"


async def test_network_view_survives_answers_of_the_wrong_shape(aiohttp_client, tmp_path):
    answers = {
        "/nodes": {"nodes": [], "next": None},
        "/pool_health": {"routable_per_shard": list(range(10_000)), "status": "x" * 500},
        "/params": ["odd"],
        "/epochs": {"current": "3", "epochs": "none"},
    }
    client = await _client(aiohttp_client, FakeCommittee(answers), tmp_path)
    answer = await client.get("/v1/network")
    assert answer.status == 200
    view = await answer.json()
    assert view["nodes"] == [] and view["nodes_by_shard"] == [[], []]
    assert view["pool"] == {"status": "unknown", "routable_per_shard": [0, 1]}
    assert view["epochs"] == [] and view["current_epoch"] is None


async def test_network_view_lists_nodes_past_the_committee_s_first_page(aiohttp_client, tmp_path):
    """The committee lists its nodes a page at a time: the view follows `next` (a node on the
    second page is shown) and counts every node in `nodes_total`."""
    answers = _answers()
    [good, odd, *_] = answers["/nodes"]["nodes"]
    answers["/nodes"] = {"nodes": [good], "next": KEY_A}
    answers[f"/nodes?after={KEY_A}"] = {"nodes": [odd], "next": None}
    committee = FakeCommittee(answers)
    client = await _client(aiohttp_client, committee, tmp_path)
    answer = await client.get("/v1/network")
    assert answer.status == 200
    view = await answer.json()
    assert [n["key"] for n in view["nodes"]] == [KEY_A, KEY_B] and view["nodes_total"] == 2
    assert f"/nodes?model=sha256:{'11' * 32}&after={KEY_A}" in committee.paths


async def test_network_view_reads_untrusted_below_from_params_not_reputations(
    aiohttp_client, tmp_path
):
    """`/reputations` lists every registration's record (pages, 1 000 a page): the view needs
    only the genesis threshold, so it asks `/params` and never the paged list."""
    answers = {k: v for k, v in _answers().items() if k != "/reputations"}
    answers["/params"] = {"genesis": {"reputation": {"untrusted_below": 300_000}}}
    committee = FakeCommittee(answers)
    client = await _client(aiohttp_client, committee, tmp_path)
    view = await (await client.get("/v1/network")).json()
    assert view["untrusted_below"] == 300_000 and view["reputation_scale"] == 1_000_000
    assert not any(p.startswith("/reputations") for p in committee.paths)
    committee.answers["/params"] = {"genesis": {"reputation": ["odd"]}}
    view = await (await client.get("/v1/network")).json()
    assert view["untrusted_below"] is None


async def test_network_view_refuses_a_malformed_node_page_by_name(aiohttp_client, tmp_path):
    for page in (
        {"nodes": {"not": "a list"}},
        {"nodes": ["text"], "next": None},
        {"nodes": [], "next": 7},
        {"nodes": [], "next": KEY_A},  # stays on one page: `after` KEY_A answers it again
    ):
        answers = {**_answers(), "/nodes": page, f"/nodes?after={KEY_A}": page}
        client = await _client(aiohttp_client, FakeCommittee(answers), tmp_path)
        answer = await client.get("/v1/network")
        assert answer.status == 503, page
        error = (await answer.json())["error"]
        assert error["code"] == "bad_page" and "node list is unreadable" in error["message"]


async def test_network_view_committee_down_is_503_in_plain_words(aiohttp_client, tmp_path):
    client = await _client(aiohttp_client, FakeCommittee(down=True), tmp_path)
    answer = await client.get("/v1/network")
    assert answer.status == 503
    error = (await answer.json())["error"]
    assert error["code"] == "committee_unavailable"
    assert "unreachable" in error["message"]


def _signature(item: str) -> tuple[str, str, str]:
    """("function" | "event" | "error", "name(type,...)", "returns(type,...)") of one
    human-readable ABI entry."""
    import re

    match = re.match(r"(function|event|error) (\w+)\(([^)]*)\)(.*)\Z", item)
    assert match, item
    kind, name, params, rest = match.groups()

    def types(text: str) -> str:
        return ",".join(p.split()[0] for p in text.split(",") if p.strip())

    returns = re.search(r"returns \(([^)]*)\)", rest)
    return kind, f"{name}({types(params)})", types(returns.group(1)) if returns else ""


def test_dapp_escrow_abi_matches_the_compiled_contract() -> None:
    """Every function, event and error the page names exists in QueryEscrow's compiled ABI with
    these exact types (and outputs): the hand-written ABI cannot drift from the contract."""
    from deploy.evm import load_artifact
    from node.gateway.dapp import ESCROW_ABI

    try:
        abi = load_artifact("QueryEscrow")["abi"]
    except PlanetError:
        pytest.skip("contracts not compiled")
    compiled = {}
    for entry in abi:
        if entry["type"] in ("function", "event", "error"):
            inputs = ",".join(i["type"] for i in entry["inputs"])
            outputs = ",".join(o["type"] for o in entry.get("outputs", []))
            compiled[(entry["type"], f"{entry['name']}({inputs})")] = outputs
    for item in ESCROW_ABI:
        kind, signature, returns = _signature(item)
        assert (kind, signature) in compiled, item
        if kind == "function" and " view " in f" {item} ":
            assert compiled[(kind, signature)] == returns, item
