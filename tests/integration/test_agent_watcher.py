"""A real anvil with the contracts, a real 1-validator committee (app + CometBFT + its stake
watcher), a real compute node and its agent: routability follows the EVM stake.

stake → the watcher attests it → the agent registers and heartbeats → routable in /nodes;
the validator's RPC frozen for a while → the agent keeps running and heartbeats again;
unstake → the watcher attests 0 → not routable; SIGTERM to the agent → `leave` → LEFT.

Credits (genesis sells them; the escrow is the deployed QueryEscrow): the watcher publishes the
validator's credit keys by itself, and vouches for a mint only when its read of the payer's
balance at the escrow covers it and the payer's mints in flight — a payer with no balance, or
one whose balance is already spoken for, gets no credits and no charge.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deploy.anvil import ANVIL_DEV_KEY, start_anvil
from deploy.committee.generate import InitOptions, init_network
from deploy.committee.genesis import committee_members, set_genesis_evm
from deploy.committee.processes import read_pid, stop_network
from deploy.committee.start import start_network
from deploy.committee.watchers import start_watchers
from deploy.evm import DeployConfig, deploy_all
from harness.committee_reads import nodes_of
from node.chain.evm.account import PlanetChain
from node.keys import create_dev_wallet, create_node_key
from node.net import port_is_free
from node.procs import run_captured, spawn_piped
from node.server.launcher import start_node, stop_pid, wait_healthy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ETHER = 10**18
PRICE = 10**15  # wei per credit
# anvil's account 2 (public dev key): a payer with ether for its escrow deposit
PAYER_KEY = "0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a"
# anvil's account 1 (public dev key of the default mnemonic): the operator's staking wallet
OPERATOR_KEY = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d"


def _free(start: int, count: int = 1, step: int = 1) -> int:
    for base in range(start, start + 2000, step):
        if all(port_is_free(p) for p in range(base, base + count)):
            return base
    pytest.skip(f"no free ports from {start}")


@dataclass
class World:
    rpc: str
    chain: PlanetChain
    home: Path
    node_key: str
    network: Any
    manifest: Path
    endpoint: str


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[World]:
    from node.model.prepare import prepare

    root = tmp_path_factory.mktemp("agent-watcher")
    anvil = start_anvil(_free(22600), log_path=root / "anvil.log")
    network = None
    try:
        network = init_network(
            InitOptions(directory=root / "committee", validators=1, base_port=_free(23000, 10, 10))
        )
        deployment = deploy_all(
            anvil.rpc_url, ANVIL_DEV_KEY, DeployConfig.devnet(committee_members(network))
        )
        deployment_path = deployment.save(root / "deployment.json")
        set_genesis_evm(
            network,
            committee_address=deployment.address("Committee"),
            fraud_proofs_address=deployment.address("FraudProofs"),
            escrow_address=deployment.address("QueryEscrow"),
            # the first key period's DKG in 3 × 2 blocks: the watcher's part forms the key
            credits={
                "price_wei": str(PRICE),
                "layer_tokens": 4096,
                "key_period_blocks": 100_000,
                "dkg_phase_blocks": 2,
            },
        )
        start_network(network, timeout_s=90)
        start_watchers(network, deployment=deployment_path, evm_rpc=anvil.rpc_url)
        home = root / "operator"
        create_dev_wallet(home / "wallet.json", "pw", OPERATOR_KEY)
        node_key = create_node_key(home / "node_key.json", "pw").verify_key.encode().hex()
        manifest = Path(prepare(parts=3, quant="int8"))
        node = start_node(manifest=manifest, shard=0, port=_free(22650), run_dir=home / "run")
        try:
            wait_healthy([node], timeout_s=180)
            yield World(
                anvil.rpc_url,
                PlanetChain(deployment, OPERATOR_KEY, rpc_url=anvil.rpc_url),
                home,
                node_key,
                network,
                manifest,
                node.url,
            )
        finally:
            stop_pid(node.pid, grace_s=5)
    finally:
        if network is not None:
            stop_network(network)
        anvil.stop()


def _query(world: World, path: str, **params: str) -> Any:
    full = path + ("?" + urllib.parse.urlencode(params) if params else "")
    rpc = world.network.validators[0].rpc_url
    url = f"{rpc}/abci_query?path=" + urllib.parse.quote(json.dumps(full))
    with urllib.request.urlopen(url, timeout=10) as answer:
        response = json.load(answer)["result"]["response"]
    if response.get("code", 0):
        return None
    return json.loads(base64.b64decode(response["value"]))


def _wait(condition: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def test_agent_and_watcher_routability_follows_the_evm_stake(world: World) -> None:
    world.chain.staking.stake(1, 2 * ETHER)
    log_path = world.home / "agent.log"
    with open(log_path, "wb") as log_file:
        agent = spawn_piped(
            [
                sys.executable, "-m", "node.agent", "--home", str(world.home),
                "--manifest", str(world.manifest), "--shard", "0",
                "--endpoint", world.endpoint,
                "--committee-rpc", world.network.validators[0].rpc_url,
                "--heartbeat-every", "3",
            ],
            env={**os.environ, "PLANET_PASSWORD": "pw"},
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        view = _wait(
            lambda: (v := _query(world, "/node", key=world.node_key)) and v["routable"] and v,
            120,
            f"the node to be routable ({log_path})",
        )
        assert view["status"] == "SERVING" and view["stake"] == str(2 * ETHER)
        assert view["evm_address"].lower() == world.chain.address.lower()
        listed = nodes_of(lambda path: _query(world, path), role="compute")
        assert [n["key"] for n in listed if n["routable"]] == [world.node_key]

        # the only validator's RPC and consensus freeze for 4 s: the agent must ride it out
        cometbft = read_pid(world.network, "cometbft", 0)
        assert cometbft is not None
        os.kill(cometbft, signal.SIGSTOP)
        time.sleep(4)
        os.kill(cometbft, signal.SIGCONT)
        before = _query(world, "/node", key=world.node_key)["last_heartbeat"]
        _wait(
            lambda: _query(world, "/node", key=world.node_key)["last_heartbeat"] > before,
            60,
            "a heartbeat after the outage",
        )
        assert agent.poll() is None, log_path.read_text()[-2000:]

        world.chain.staking.request_unstake()
        view = _wait(
            lambda: (v := _query(world, "/node", key=world.node_key))["stake"] == "0" and v,
            60,
            "the watcher to attest 0 after unstake",
        )
        assert view["status"] == "SERVING" and not view["routable"]
    finally:
        agent.send_signal(signal.SIGTERM)
        code = agent.wait(30)
    assert code == 0, log_path.read_text()[-2000:]
    assert _query(world, "/node", key=world.node_key)["status"] == "LEFT"
    assert "left the network" in log_path.read_text()


def _watcher_credit_key(world: World) -> None:
    """The watcher takes part in the key period's DKG on its own (node/watcher/credit_dkg.py):
    the committee key forms, and the validator's share is in its home's share store, which its
    app signs mints with. No per-validator RSA key is published (`/credit_keys` lists none)."""
    from protocol.credit_shares import CREDIT_SHARES_DIR, CreditShareStore

    store = CreditShareStore(Path(world.network.validators[0].home) / CREDIT_SHARES_DIR)

    def formed() -> dict[str, Any] | None:
        """The key formed on the chain and the watcher's share of it stored: the watcher
        writes its share on its pass after the block that formed the key (a moment later)."""
        answer = _query(world, "/credit_period")
        key = ((answer.get("run") or {}).get("result") or {}).get("key")
        return answer if key and store.share(int(answer["period"])) is not None else None

    _wait(formed, 90, "the watcher's DKG forming the key and storing its share")
    assert "keys" not in _query(world, "/credit_keys")


def test_watcher_vouches_only_for_mints_the_payers_escrow_balance_covers(
    world: World, tmp_path: Path
) -> None:
    import asyncio

    from node.client.credit_purchase import MintUnfunded, buy_credits
    from node.client.credit_wallet import CreditWallet

    _watcher_credit_key(world)
    rpcs = [world.network.validators[0].rpc_url]
    payer_chain = PlanetChain(world.chain.deployment, PAYER_KEY, rpc_url=world.rpc)
    escrow = payer_chain.escrow
    escrow.deposit_balance(escrow.address, 3 * PRICE)
    wallet = CreditWallet(tmp_path / "credits.json")

    def buy(key: bytes | str, count: int) -> list[Any]:
        secret = bytes.fromhex(key[2:]) if isinstance(key, str) else key
        expiry = int(time.time()) + 3600
        return asyncio.run(
            buy_credits(rpcs, secret, count, wallet, expiry=expiry, fund_timeout_s=15)
        )

    assert len(buy(PAYER_KEY, 2)) == 2 and wallet.count() == 2  # 3 prices cover 2
    with pytest.raises(MintUnfunded):
        buy(PAYER_KEY, 2)  # 3 − 2 in flight < 2: the same balance never pays twice
    broke = bytes(range(1, 33))  # an EVM key that never deposited
    with pytest.raises(MintUnfunded):
        buy(broke, 1)
    assert wallet.count() == 2
    mints = _query(world, "/mints", payer=payer_chain.address.lower())["mints"]
    assert _query(world, "/mints", payer=payer_chain.address.lower())["next"] is None
    mints.sort(key=lambda m: m["height"])  # a page lists by id
    assert [m["funded_height"] is not None for m in mints] == [True, False]
    assert mints[1]["vouched"] == []  # the watcher never vouched: never charged, never signed


# anvil's account 3 (public dev key of the default mnemonic): a relay operator's staking wallet
RELAY_OPERATOR_KEY = "0x7c852118294e51e653712a81e05800f419141751be58f605c371e15141b007a6"


def test_a_staked_relay_registers_is_listed_and_leaves(world: World) -> None:
    """The relay role across processes: a Relay stake (Staking role 3) on anvil, `planet relay
    serve` registering itself, the validator's watcher attesting the stake for the relay's
    registered role, `/relays` listing it and the personal client reading it from there, and
    `planet relay leave` taking it off the list."""
    import asyncio

    from node.chain.committee_link import CommitteeLink
    from node.client.relay_registry import read_chain_relays

    root = world.home.parent
    home = root / "relay-operator"
    create_dev_wallet(home / "wallet.json", "pw", RELAY_OPERATOR_KEY)
    relay_chain = PlanetChain(world.chain.deployment, RELAY_OPERATOR_KEY, rpc_url=world.rpc)
    relay_chain.staking.stake(3, ETHER // 10)
    rpc = world.network.validators[0].rpc_url
    chains = ["--home", str(home), "--evm-rpc", world.rpc, "--committee-rpc", rpc,
              "--deployment", str(root / "deployment.json")]  # fmt: skip
    env = {**os.environ, "PLANET_PASSWORD": "pw"}
    port = _free(22700)
    log_path = home / "relay.log"
    with open(log_path, "wb") as log_file:
        relay = spawn_piped(
            [sys.executable, "-m", "planet", "relay", "serve", "--port", str(port), *chains],
            env=env, stdout=subprocess.PIPE, stderr=log_file, text=True,
        )  # fmt: skip
    try:
        assert relay.stdout is not None
        listening = relay.stdout.readline()
        assert listening.startswith("relay on"), log_path.read_text()[-2000:]
        key = listening.split(" key ", 1)[1].strip()
        registered = relay.stdout.readline()
        assert registered.startswith("registered relay"), log_path.read_text()[-2000:]
        assert f"http://127.0.0.1:{port}" in registered
        [entry] = _wait(lambda: _query(world, "/relays")["relays"], 60, "the relay listed")
        assert (entry["endpoint"], entry["relay_key"]) == (f"http://127.0.0.1:{port}", key)
        assert entry["evm_address"].lower() == relay_chain.address.lower()
        assert entry["stake"] == str(ETHER // 10)

        async def read() -> Any:
            link = CommitteeLink([rpc])
            try:
                return await read_chain_relays(link.query)
            finally:
                await link.close()

        [hop] = asyncio.run(read())
        assert (hop.url, hop.key.hex()) == (f"http://127.0.0.1:{port}", key)
    finally:
        relay.send_signal(signal.SIGTERM)
        relay.wait(30)
    left = run_captured(
        [sys.executable, "-m", "planet", "relay", "leave", *chains],
        env=env, text=True, timeout=60,
    )  # fmt: skip
    assert left.returncode == 0, left.stderr
    assert _query(world, "/relays")["relays"] == []
    assert _query(world, "/node", key=entry["key"])["status"] == "LEFT"
