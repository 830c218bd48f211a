"""A validator set change on real CometBFT v0.38: four genesis validators add a fifth.

The network is `planet committee init`'s (`deploy.committee.init_network`, 5 nodes) with the
fifth node left out of genesis `validators`: it starts as a full node. Each validator does
what its watcher would (a thread of its own, as each validator runs its own watcher; no EVM:
every mint counts as covered): its key period DKG messages (`plan`), its partials (`MintSigner`)
and `fund_mint`. In the first blocks, while period 0's DKG among the four runs, the validators
propose and approve (3 of 4, 30 of 40 power) adding the fifth; at the epoch boundary CometBFT
takes the update and the fifth validator signs blocks (its address in the blocks' commits). A
payer buys a credit of key period 0 (the four's key; the fifth holds no share of it). The first
key period whose DKG is configured after the change (period 1 unless the change came late on a
loaded machine) deals the five of them, and a mint of that period or later is signed with their
shares. Then a staked compute node redeems the period-0 credit. The change goes first,
overlapping period 0's DKG (blocks 2-31): the fifth joins by block ~21, period 1's receivers are
recorded at block 40 and it starts at block 71 (made after the period-0 purchase, the change took
effect at block ~51 and the test waited for block 101).
Ports: 28100-28149; run under the devnet lock (`flock /tmp/planet-devnet.lock`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from deploy.committee.generate import InitOptions, init_network
from deploy.committee.network import Network
from deploy.committee.processes import stop_network
from deploy.committee.start import start_network
from node.client.credit_purchase import buy_credits
from node.client.credit_wallet import CreditWallet
from node.watcher.credit_dkg import plan
from node.watcher.mint_signer import MintSigner
from protocol.committee.commitments import CommitBatch, CommitmentRecord
from protocol.committee.credits import CreditRedeem, FundMint
from protocol.committee.envelope import sign
from protocol.committee.prices import SetPrice
from protocol.committee.registry import AttestStake, RegisterNode, sign_registration
from protocol.committee.validator_set import ValidatorApprove, ValidatorChange
from protocol.credit_periods import KeySchedule
from protocol.credit_shares import CREDIT_SHARES_DIR, CreditShareStore
from protocol.eip712 import address_of
from tests.committee_chain import seeded_evm_key, seeded_key
from tests.integration.test_abci_cometbft import Net
from tests.integration.test_credits_cometbft import NetCommittee

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)

BASE_PORT = 28100
ESCROW = "0x" + "ee" * 20
PERIOD_BLOCKS = 70  # period 1 starts at block 71; its DKG from block 41 (3 phases of 10)
DKG_PHASE_BLOCKS = 10  # room for a loaded machine's watcher pass
SCHEDULE = KeySchedule(PERIOD_BLOCKS, DKG_PHASE_BLOCKS)
EPOCH = 10


def _key(home: str) -> SigningKey:
    doc = json.loads((Path(home) / "config" / "priv_validator_key.json").read_text())
    return SigningKey(base64.b64decode(doc["priv_key"]["value"])[:32])


class Member:
    """One node of the network: its RPC (a `Net`), its consensus key, its share store, and
    its txs sent one at a time with its own nonce count."""

    def __init__(self, network: Network, index: int) -> None:
        spec = network.validators[index]
        self.spec = spec
        self.net = Net(Path(spec.home), spec.rpc_url, spec.abci_url, "", network.path / "logs")
        self.key = _key(spec.home)
        self.pub_key = self.key.verify_key.encode().hex()
        self.store = CreditShareStore(Path(spec.home) / CREDIT_SHARES_DIR)
        self.lock = threading.Lock()

    def send(self, body: Any) -> dict[str, Any]:
        with self.lock:
            nonce = self.net.query(f"/nonce?account={self.pub_key}")["nonce"] + 1
            return self.net.submit(sign(body, self.key, nonce).encode())


def _genesis(network: Network, outsider: int) -> None:
    """Every node's genesis: without the outsider in `validators`, with credits on."""
    for spec in network.validators:
        path = Path(spec.home) / "config" / "genesis.json"
        genesis = json.loads(path.read_text())
        genesis["validators"] = [
            v
            for v in genesis["validators"]
            if v["address"] != network.validators[outsider].validator_address
        ]
        state = genesis["app_state"]
        state["evm"]["escrow_address"] = ESCROW
        state["evm"]["fraud_proofs_address"] = state["evm"]["committee_address"]
        state.update(heartbeat_timeout=100_000, registration_ttl=100_000)
        state["credits"] = {
            "price_wei": str(10**12),
            "layer_tokens": 4096,
            "key_period_blocks": PERIOD_BLOCKS,
            "dkg_phase_blocks": DKG_PHASE_BLOCKS,
        }
        path.write_text(json.dumps(genesis, indent=1))


@contextlib.contextmanager
def _watching(members: list[Member]) -> Iterator[None]:
    """Each member's watcher, a thread of its own (each validator runs its own watcher), a pass
    every 0.3 s: its DKG messages, its partials for every funded mint (the real `MintSigner`)
    and `fund_mint` for every mint waiting (members of the set only). Side by side, as real
    watchers are, every validator of a mint's period sees it short of t and posts its set (one
    thread signing for all of them in turn left the last one nothing to sign, and the buyer
    then waited out `buy_credits`' 20 s for that validator's partials). A refused DKG message
    (landed late on a loaded machine: the chain runs the DKG again) is logged; any other
    failure is raised at exit."""
    stop = threading.Event()
    crashed: list[BaseException] = []
    first = members[0].net

    def run(member: Member) -> None:
        signer = MintSigner(NetCommittee(member.net, member.send), member.store)
        funded: set[str] = set()
        try:
            while not stop.wait(0.3):
                validators = {v["pub_key"] for v in first.query("/params")["validators"]}
                current = first.query("/credit_period")
                following = first.query(f"/credit_period?period={current['period'] + 1}")
                for answer in (current, following):  # the watcher's two runs
                    for body in plan(answer, member.key, member.store):
                        refused = member.send(body)
                        if refused.get("code", 0) != 0:
                            log.warning("%s refused: %s", body.TYPE, refused)
                if member.pub_key not in validators:
                    continue
                asyncio.run(signer.step())  # its partials, on chain
                for mint in first.query("/mints?pending=true")["mints"]:
                    if mint["id"] not in funded:
                        answer = member.send(FundMint(mint["id"]))
                        assert answer.get("code", 0) == 0, answer
                        funded.add(mint["id"])
        except BaseException as error:  # surfaced to the test below, logged at once
            log.exception("the watcher of %s stopped", member.pub_key[:12])
            crashed.append(error)

    threads = [threading.Thread(target=run, args=(m,), daemon=True) for m in members]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        if crashed:
            raise crashed[0]


def _signers(net: Net, height: int) -> set[str]:
    commit = net.call("commit", height=str(height))["signed_header"]["commit"]
    return {s["validator_address"] for s in commit["signatures"] if s["block_id_flag"] == 2}


def test_four_validators_add_a_fifth_that_signs_and_an_old_credit_redeems(tmp_path: Path) -> None:
    network = init_network(
        InitOptions(
            directory=tmp_path / "net", validators=5, base_port=BASE_PORT, epoch_length=EPOCH
        )
    )
    _genesis(network, outsider=4)
    members = [Member(network, i) for i in range(5)]
    newcomer = members[4]
    try:
        start_network(network, timeout_s=120)
        first = members[0].net
        assert len(first.call("validators")["validators"]) == 4
        # a staked compute node (its stake attested by the four), before the change
        node_key = seeded_key("validator-set-node")
        node = node_key.verify_key.encode().hex()
        evm = seeded_evm_key("validator-set-node")
        body = RegisterNode(
            address_of(evm), sign_registration(evm, node), "compute", "m", (0,), "http://n", 1
        )
        assert first.submit(sign(body, node_key, 1).encode()).get("code", 0) == 0
        for member in members[:4]:
            assert member.send(AttestStake(node, 10**18)).get("code", 0) == 0
        payer = seeded_evm_key("validator-set-payer")
        wallet = CreditWallet(tmp_path / "wallet.json")
        rpcs = [m.spec.rpc_url for m in members]
        with _watching(members):
            # the four add the fifth: proposed by one, approved by two more (30 of 40), in the
            # first blocks, while period 0's DKG (among the four) runs
            add = ValidatorChange(
                "add", newcomer.pub_key, 10, newcomer.spec.operator_address.lower()
            )
            proposed = members[0].send(add)
            assert proposed.get("code", 0) == 0, proposed
            events = [e for e in proposed["events"] if e["type"] == "planet.validator_change"]
            identifier = next(a["value"] for a in events[0]["attributes"] if a["key"] == "id")
            for member in members[1:3]:
                assert member.send(ValidatorApprove(identifier)).get("code", 0) == 0
            deadline = time.monotonic() + 120
            while len(first.call("validators")["validators"]) < 5:
                assert time.monotonic() < deadline, "the fifth validator never joined"
                time.sleep(0.3)
            joined = first.height()
            first.wait_height(joined + 3, timeout=60)
            address = newcomer.spec.validator_address.upper()
            assert any(address in _signers(first, h) for h in range(joined, joined + 3))
            params = first.query("/params")["validators"]
            assert newcomer.pub_key in {v["pub_key"] for v in params}
            # a credit of period 0: its key dealt among the four (receivers recorded at block 1,
            # before the change; the fifth holds no share of it)
            bought = asyncio.run(
                buy_credits(rpcs[:4], payer, 1, wallet, expiry=int(time.time()) + 3600)
            )
            assert [c.period for c in bought] == [0]
            log.info("the period-0 credit bought by block %d", first.height())
            # the first period whose DKG's receivers are recorded after the change: its DKG
            # among the five; a credit of it (or later) signed with the five's shares
            period = next(p for p in itertools.count(1) if SCHEDULE.dkg_config_height(p) > joined)
            log.info("the fifth joined by block %d: waiting for key period %d", joined, period)
            first.wait_height(SCHEDULE.period_start(period), timeout=240)
            run = first.query(f"/credit_period?period={period}")["run"]
            assert newcomer.pub_key in [pub for _, pub in run["receivers"]]
            fresh = asyncio.run(buy_credits(rpcs, payer, 1, wallet, expiry=int(time.time()) + 3600))
            assert fresh[0].period >= period
        # a later period: the period-0 credit still redeems (its key's record kept)
        [old] = [c for c in wallet.take(2) if c.period == 0]
        nonce = iter(range(2, 100))

        def by_node(body: Any) -> dict[str, Any]:
            return first.submit(sign(body, node_key, next(nonce)).encode())

        assert by_node(SetPrice("m", 0, 1)).get("code", 0) == 0
        record = CommitmentRecord("0x" + "5e" * 32, 0, 0, "0x" + "c0" * 32)
        assert by_node(CommitBatch((record,))).get("code", 0) == 0
        redeemed = by_node(CreditRedeem("m", 0, (old,)))
        assert redeemed.get("code", 0) == 0, redeemed
        assert address in _signers(first, first.height())
    finally:
        stop_network(network, timeout_s=20)
