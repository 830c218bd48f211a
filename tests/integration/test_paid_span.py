"""A span hop paid per shard, all real processes: one CometBFT validator with the committee app
(credits on), ONE `planet node serve --shards 0-1` process serving both shards of a tiny model as
one hop and charging (`--credit-positions 8 --credits-dir <base>/shard-0`), and its real node
agent (`python -m node.agent --shards 0-1`), which registers the node for both shards, prices
each, locks and redeems what it was paid on each shard.

`planet ask --credits` (its own process, a nodes file listing the span once) answers through the
one hop and pays it ceil(positions / 8) credits for EACH shard, each assigned to that shard; the
agent redeems both spools, and the chain credits the operator on shard 0 and on shard 1."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eth_utils import keccak

from harness.gateway_net import ephemeral_port, start_committee, wait_for
from node.client.credit_wallet import CreditWallet
from node.client.nodesfile import NodeRef, NodesFile
from node.keys import create_dev_wallet, create_node_key
from node.model.head import ClientHead
from node.model.prepare import prepare
from node.procs import Child, run_captured, spawn_logged
from node.server.launcher import NodeProcess, start_node, stop_pid, wait_healthy
from planet.main import main
from protocol.committee.registry import AttestStake
from protocol.eip712 import address_of
from tests.doubles.tiny_model import make_tiny_model
from tests.integration.test_paid_nodes import (
    EVM,
    LAYER_TOKENS,
    MAX_TOKENS,
    PASSWORD,
    PRICE_POSITIONS,
    PROMPT,
    RELAY_BYTES,
    _vouching,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def net(tmp_path_factory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("paid-span")
    make_tiny_model(root / "src", layers=4, hidden=64, tied=False)
    manifest = Path(prepare(root / "src", parts=2, out=root / "p2", progress=lambda _: None))
    model_hash = json.loads(manifest.read_text())["model_hash"]
    node: NodeProcess | None = None
    agent: Child | None = None
    committee = None
    try:
        committee = start_committee(
            root,
            address_of(keccak(text="paid-span operator")),
            epoch_length=100_000,
            evm=EVM,
            app_state={
                "credits": {
                    "price_wei": "1000",
                    "layer_tokens": LAYER_TOKENS,
                    "key_period_blocks": 100_000,
                    "dkg_phase_blocks": 4,
                    "relay_bytes": RELAY_BYTES,
                }
            },
        )
        committee.form_credit_key()
        password = root / "password"
        password.write_text(PASSWORD)
        home = root / "operator"
        home.mkdir()
        account = create_dev_wallet(home / "wallet.json", PASSWORD, keccak(text="paid-span evm"))
        key = create_node_key(home / "node_key.json", PASSWORD).verify_key.encode().hex()
        node = start_node(
            manifest=manifest,
            shard=0,
            last=1,
            port=ephemeral_port(),
            run_dir=root / "run",
            extra_args=[
                *("--threads", "1", "--committee-rpc", committee.rpc, "--next-hops", "none"),
                *("--credit-positions", str(PRICE_POSITIONS)),
                *("--credits-dir", str(home / "credits" / "shard-0")),  # as `planet join` does
                *("--commit-dir", str(home / "served")),
                *("--node-key", str(home / "node_key.json")),
            ],
            extra_env={"PLANET_PASSWORD": PASSWORD},
        )
        wait_healthy([node], timeout_s=120)
        command = [sys.executable, "-m", "node.agent", "--home", str(home)]
        command += ["--manifest", str(manifest), "--shards", "0-1"]
        command += ["--endpoint", node.url, "--committee-rpc", committee.rpc]
        command += ["--credits-dir", str(home / "credits"), "--password-file", str(password)]
        command += ["--commit-dir", str(home / "served")]
        command += ["--credit-positions", str(PRICE_POSITIONS)]
        agent = spawn_logged(command, root / "run" / "agent.log")

        def priced() -> bool:
            entries = committee.nodes(model=model_hash, role="compute")
            return (
                len(entries) == 1
                and entries[0]["shards"] == [0, 1]
                and all(
                    (entries[0].get("prices") or {}).get(str(s)) == PRICE_POSITIONS for s in (0, 1)
                )
            )

        wait_for(priced, 60, "the agent did not register the span and its prices per shard")
        committee.submit(committee.validator_sign(AttestStake(key, 10**18)))
        payer = root / "payer.json"
        create_dev_wallet(payer, PASSWORD, keccak(text="paid-span payer"))
        layers = [s["layers"] for s in json.loads(manifest.read_text())["shards"]]
        nodes_file = root / "nodes.json"
        NodesFile(manifest, (NodeRef(node.url, 0, (layers[0][0], layers[1][1]), last=1),)).save(
            nodes_file
        )
        yield {
            "root": root,
            "manifest": manifest,
            "committee": committee,
            "node": node,
            "home": home,
            "account": account.address.lower(),
            "payer": payer,
            "password": password,
            "nodes_file": nodes_file,
            "key": key,
        }
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait(timeout=30)
        if node is not None:
            stop_pid(node.pid, grace_s=5)
        if committee is not None:
            committee.stop()


def test_ask_pays_the_span_for_each_shard_and_the_agent_redeems_both(net) -> None:
    credits_file = net["root"] / "credits.json"
    argv = ["credits", "buy", "12", "--committee-rpc", net["committee"].rpc]
    argv += ["--wallet", str(net["payer"]), "--password-file", str(net["password"])]
    argv += ["--credits-file", str(credits_file)]
    with _vouching(net["committee"]):
        assert main(argv) == 0
    command = [sys.executable, "-m", "planet", "ask", PROMPT, "--nodes", str(net["nodes_file"])]
    command += ["--max-tokens", str(MAX_TOKENS), "--json", "--credits"]
    command += ["--credits-file", str(credits_file), "--committee-rpc", net["committee"].rpc]
    command += ["--min-credit-positions", str(PRICE_POSITIONS)]
    env = {**os.environ, "PLANET_HOME": str(net["root"] / "client-home")}
    done = run_captured(command, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["circuit"] == [
        {
            "url": net["node"].url,
            "shards": [0, 1],
            "shard": 0,
            "layers": answer["circuit"][0]["layers"],
        }
    ]
    head = ClientHead.load(net["manifest"], device="cpu")
    fed = len(head.chat_ids([{"role": "user", "content": PROMPT}])) + len(answer["tokens"]) - 1
    per_shard = -(-fed // PRICE_POSITIONS)
    assert answer["tokens"] and answer["credits_spent"] == 2 * per_shard  # one hop, two shards
    assert CreditWallet(credits_file).count() == 12 - 2 * per_shard
    info = json.loads(urllib.request.urlopen(f"{net['node'].url}/info", timeout=10).read())
    assert info["shards"] == [0, 1] and info["credits"]["accepted"] == 2 * per_shard
    assert info["shard_prices"] == {"0": PRICE_POSITIONS, "1": PRICE_POSITIONS}
    committee, credits = net["committee"], net["home"] / "credits"

    def redeemed() -> list[tuple[int, int]] | None:
        if any(credits.glob("shard-*/*.json")):
            return None
        rows = committee.query(f"/credits?account={net['account']}")["credits"]
        by_shard: dict[int, int] = {}
        for row in rows:
            by_shard[row["shard"]] = by_shard.get(row["shard"], 0) + row["layer_tokens"]
        return sorted(by_shard.items()) or None

    assert wait_for(redeemed, 90, "the agent did not redeem the span's credits") == [
        (0, per_shard * LAYER_TOKENS),
        (1, per_shard * LAYER_TOKENS),
    ]
