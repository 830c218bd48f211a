"""One real CometBFT v0.38 validator driving the committee app over the ABCI socket.

Registers a node, runs commit-reveal (one mismatch → evidence) and a verdict vote through
`broadcast_tx_sync`, reads everything back through CometBFT's `abci_query` RPC, checks that
reputation scores travel through vote extensions, then kills the app with SIGKILL, restarts it
and checks that CometBFT's handshake accepts its height and app hash and the chain continues.
Ports: picked free in 26600-26689.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
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
from nacl.signing import SigningKey

from harness.committee_reads import nodes_of
from node.procs import Child, spawn_piped
from protocol.committee.commitments import CommitBatch, CommitmentRecord, RevealBatch, RevealRecord
from protocol.committee.envelope import sign
from protocol.committee.registry import AttestStake, Heartbeat, RegisterNode, sign_registration
from protocol.committee.verification import VerdictVote
from protocol.eip712 import Verdict, address_of, commitment_value, committee_domain
from protocol.reputation import ReputationParams, update
from tests.committee_chain import seeded_evm_key, seeded_key

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
COMETBFT = ROOT / ".tools" / "bin" / "cometbft"
COMMITTEE = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
FRAUD_PROOFS = "0xa16E02E87b7454126E5E10d957A927A7F5B5d2be"
EVM_CHAIN_ID = 31337
SESSION = "0x" + "0a" * 32
OPERATOR_KEY = seeded_evm_key("integration-operator")


def free_ports(count: int) -> list[int]:
    found = []
    for port in range(26600, 26690):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        found.append(port)
        if len(found) == count:
            return found
    pytest.skip("not enough free ports in 26600-26689")


@dataclass
class Net:
    home: Path
    rpc: str
    proxy: str
    validator_address: str
    logs: Path
    app: Child | None = None
    node: subprocess.Popen[bytes] | None = None

    def start_app(self) -> None:
        log = open(self.logs / f"app-{time.monotonic_ns()}.log", "wb")  # noqa: SIM115
        self.app = spawn_piped(
            [sys.executable, "-m", "abci_app", "--home", str(self.home), "--listen", self.proxy],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        host, port = self.proxy[len("tcp://") :].rsplit(":", 1)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.app.poll() is None, f"app exited early: {log.name}"
            with socket.socket() as probe:
                if probe.connect_ex((host, int(port))) == 0:
                    return
            time.sleep(0.05)
        raise TimeoutError("abci app did not listen within 20 s")

    def start_node(self) -> None:
        log = open(self.logs / f"cometbft-{time.monotonic_ns()}.log", "wb")  # noqa: SIM115
        self.node = subprocess.Popen(
            [str(COMETBFT), "start", "--home", str(self.home)], stdout=log, stderr=subprocess.STDOUT
        )

    def stop(self, process: Child | None, sig: int = signal.SIGTERM) -> None:
        if process is not None and process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)

    def call(self, method: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.rpc}/{method}?{query}", timeout=10) as response:
            body = json.load(response)
        assert "error" not in body, body
        return body["result"]

    def height(self) -> int:
        try:
            return int(self.call("status")["sync_info"]["latest_block_height"])
        except OSError:
            return 0

    def wait_height(self, target: int, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            height = self.height()
            if height >= target:
                return height
            time.sleep(0.1)
        raise TimeoutError(f"height {target} not reached (at {self.height()})")

    def submit(self, raw: bytes) -> dict[str, Any]:
        """broadcast_tx_sync, then wait for the tx's FinalizeBlock result."""
        checked = self.call("broadcast_tx_sync", tx="0x" + raw.hex())
        assert checked["code"] == 0, checked
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                return self.call("tx", hash="0x" + checked["hash"])["tx_result"]
            except (AssertionError, OSError):
                time.sleep(0.1)
        raise TimeoutError(f"tx {checked['hash']} not committed")

    def query(self, path: str) -> Any:
        response = self.call("abci_query", path=json.dumps(path))["response"]
        assert response.get("code", 0) == 0, response
        return json.loads(base64.b64decode(response["value"]))


@contextlib.contextmanager
def open_net(tmp_path: Path, app_state: dict[str, Any] | None = None) -> Iterator[Net]:
    """A configured (not yet started) single-validator network under `tmp_path`; stops every
    process it started on exit. Also used by test_abci_fuzz.py."""
    if not COMETBFT.exists():
        pytest.fail(f"{COMETBFT} missing: run bash deploy/setup.sh")
    home = tmp_path / "validator"
    subprocess.run([str(COMETBFT), "init", "--home", str(home)], check=True, capture_output=True)
    p2p, rpc, proxy = free_ports(3)
    genesis_path = home / "config" / "genesis.json"
    genesis = json.loads(genesis_path.read_text())
    address = genesis["validators"][0]["address"]
    genesis["consensus_params"]["abci"] = {"vote_extensions_enable_height": "1"}
    genesis["app_state"] = app_state or {
        "epoch_length": 5,
        "heartbeat_timeout": 1000,
        # nodes registered here are not always staked: at 150 ms blocks the default TTL
        # (100 blocks) can delete one mid-test on a loaded machine
        "registration_ttl": 1000,
        "evm": {
            "chain_id": EVM_CHAIN_ID,
            "committee_address": COMMITTEE,
            "fraud_proofs_address": FRAUD_PROOFS,
        },
        "validators": {address: address_of(OPERATOR_KEY)},
    }
    genesis_path.write_text(json.dumps(genesis, indent=1))
    config_path = home / "config" / "config.toml"
    config = config_path.read_text()
    for old, new in [
        ('proxy_app = "tcp://127.0.0.1:26658"', f'proxy_app = "tcp://127.0.0.1:{proxy}"'),
        ('laddr = "tcp://127.0.0.1:26657"', f'laddr = "tcp://127.0.0.1:{rpc}"'),
        ('laddr = "tcp://0.0.0.0:26656"', f'laddr = "tcp://127.0.0.1:{p2p}"'),
        ('timeout_commit = "1s"', 'timeout_commit = "150ms"'),
    ]:
        assert old in config, old
        config = config.replace(old, new)
    config_path.write_text(config)
    logs = tmp_path / "logs"
    logs.mkdir()
    network = Net(home, f"http://127.0.0.1:{rpc}", f"tcp://127.0.0.1:{proxy}", address, logs)
    try:
        yield network
    finally:
        network.stop(network.node)
        network.stop(network.app)
        if os.environ.get("PLANET_KEEP_LOGS"):
            print(f"logs in {logs}", file=sys.stderr)


@pytest.fixture
def net(tmp_path: Path) -> Iterator[Net]:
    with open_net(tmp_path) as network:
        yield network


def validator_key(home: Path) -> SigningKey:
    doc = json.loads((home / "config" / "priv_validator_key.json").read_text())
    return SigningKey(base64.b64decode(doc["priv_key"]["value"])[:32])


def test_abci_cometbft_register_commit_reveal_query_and_restart(net: Net) -> None:
    node_key = seeded_key("integration-node")
    node = node_key.verify_key.encode().hex()
    evm = seeded_evm_key("integration-node")
    (net.home / "reputation_scores.json").write_text(json.dumps({"scores": {node: 900_000}}))
    net.start_app()
    net.start_node()
    net.wait_height(2)

    body = RegisterNode(
        evm_address=address_of(evm),
        evm_signature=sign_registration(evm, node),
        role="compute",
        model="smollm2-135m",
        shards=(0, 1),
        endpoint="http://127.0.0.1:8100",
        capacity=4,
    )
    assert net.submit(sign(body, node_key, 1).encode()).get("code", 0) == 0
    assert net.submit(sign(Heartbeat(), node_key, 2).encode()).get("code", 0) == 0
    [listed] = nodes_of(net.query, model="smollm2-135m", shard=1)
    assert listed["key"] == node and listed["status"] == "SERVING"
    # /nodes pages over the real RPC: three more registrations, read a key a page
    others = [seeded_key(f"integration-other-{i}") for i in range(3)]
    for i, key in enumerate(others):
        other_evm = seeded_evm_key(f"integration-other-{i}")
        hexed = key.verify_key.encode().hex()
        other = RegisterNode(
            address_of(other_evm), sign_registration(other_evm, hexed), "compute", "other",
            (0,), f"http://127.0.0.1:{8200 + i}", 1,
        )  # fmt: skip
        assert net.submit(sign(other, key, 1).encode()).get("code", 0) == 0
    everyone = sorted([node, *(k.verify_key.encode().hex() for k in others)])
    first = net.query("/nodes?limit=1")
    assert [n["key"] for n in first["nodes"]] == everyone[:1] and first["next"] == everyone[0]
    assert [n["key"] for n in nodes_of(net.query, limit=1)] == everyone  # 4 pages, then null
    assert [n["key"] for n in nodes_of(net.query, model="smollm2-135m", limit=1)] == [node]

    # commit-reveal: two commitments in one tx, one honest reveal, one mismatching reveal
    output, salt = "0x" + "0b" * 32, "0x" + "0c" * 32
    good = "0x" + commitment_value(SESSION, 1, 0, output, salt).hex()
    records = (CommitmentRecord(SESSION, 1, 0, good), CommitmentRecord(SESSION, 2, 0, good))
    unstaked = sign(CommitBatch(records), node_key, 3).encode()
    refused = net.call("broadcast_tx_sync", tx="0x" + unstaked.hex())
    assert refused["code"] == 106, refused  # NOT_STAKED at CheckTx: only staked nodes commit
    # the single validator attests its stake (as its stake watcher would): now it commits
    attest = AttestStake(node, 10**18)
    assert net.submit(sign(attest, validator_key(net.home), 1).encode()).get("code", 0) == 0
    assert net.submit(sign(CommitBatch(records), node_key, 4).encode()).get("code", 0) == 0
    reveals = (RevealRecord(SESSION, 1, 0, output, salt), RevealRecord(SESSION, 2, 0, output, salt))
    assert net.submit(sign(RevealBatch(reveals), node_key, 5).encode()).get("code", 0) == 0
    commitments = net.query(f"/commitments?node={node}")["commitments"]
    assert [c["match"] for c in commitments] == [True, False]
    [evidence] = net.query("/evidence")["evidence"]
    assert evidence["kind"] == "reveal_mismatch" and evidence["step"] == 2

    # a verdict on that evidence, signed by the single validator's operator key (100 % power)
    verdict = Verdict(
        node=address_of(evm),
        offence=1,
        evidence_hash=bytes.fromhex(evidence["id"][2:]),
        challenger=address_of(OPERATOR_KEY),
        nonce=1,
        consumer=FRAUD_PROOFS,
    )
    signature = verdict.sign(OPERATOR_KEY, committee_domain(EVM_CHAIN_ID, COMMITTEE))
    vote = VerdictVote(
        node=verdict.node,
        offence=1,
        evidence_hash=evidence["id"],
        challenger=verdict.challenger,
        verdict_nonce=1,
        signature="0x" + signature.hex(),
    )
    assert net.submit(sign(vote, validator_key(net.home), 2).encode()).get("code", 0) == 0
    [confirmed] = net.query("/verdicts?confirmed=true")["verdicts"]
    assert confirmed["signers"] == [address_of(OPERATOR_KEY)]
    assert confirmed["signatures"] == ["0x" + signature.hex()]

    # reputation scores reach the chain through vote extensions at epoch boundaries
    registered = listed["registered_height"]
    net.wait_height(-(-registered // 5) * 5 + 1)  # the block after the next epoch close
    record = net.query("/reputations")["reputations"][node]
    assert record["epochs"] >= 1
    expected, window = ReputationParams().initial, ()
    for _ in range(record["epochs"]):
        expected, window = update(expected, window, 900_000, ReputationParams())
    assert record["r"] == expected and record["window"] == list(window)

    # kill the app mid-run; CometBFT stops with it; both restart and agree on the app hash
    params_before = net.query("/params")
    net.stop(net.app, signal.SIGKILL)
    net.stop(net.node)
    net.start_app()
    net.start_node()
    restarted_at = net.wait_height(params_before["height"] + 1)
    net.wait_height(restarted_at + 3)
    after = net.query("/params")
    assert after["height"] > params_before["height"]
    header = net.call("block", height=str(params_before["height"] + 1))["block"]["header"]
    assert header["app_hash"].lower() == params_before["app_hash"]
    assert net.query(f"/node?key={node}")["status"] == "SERVING"
    assert net.app is not None and net.app.poll() is None
    assert net.node is not None and net.node.poll() is None
    # clean shutdown: SIGTERM ends the app with status 0
    net.stop(net.node)
    net.app.send_signal(signal.SIGTERM)
    assert net.app.wait(10) == 0
