"""A mint flood through one real CometBFT v0.38 validator (issue 42, attack 3): 1,200 junk mints
from 300 fresh addresses, ids ground below 0x01…, sent before an honest purchase, leave that
purchase funded within its usual time. The validator's real mint funder
(node/watcher/funding.py) runs over a real `CommitteeLink`; the EVM side is a stand-in (no EVM
here): the honest payer's balance covers its purchases, and only it ever deposited
(tests/integration/test_agent_watcher.py runs the watcher against a real EVM). The honest
purchase is `buy_credits`, the client's own path, timed once before the flood and once after
(the first also waits for the first key period's committee key: the validator's real DKG
driver, node/watcher/credit_dkg.py, and its mint signer, node/watcher/mint_signer.py, run beside
the funder).
Ports: 26600-26689 (test_abci_cometbft.py); run under the devnet lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from node.chain.committee_link import CommitteeLink
from node.client.credit_purchase import buy_credits
from node.client.credit_wallet import CreditWallet
from node.watcher.credit_dkg import CreditDkgDriver
from node.watcher.funding import MintFunder
from node.watcher.mint_signer import MintSigner
from protocol.committee.envelope import sign
from protocol.eip712 import address_of
from protocol.errors import PlanetError
from tests.committee_chain import seeded_evm_key, seeded_key
from tests.integration.test_abci_cometbft import (
    COMMITTEE,
    EVM_CHAIN_ID,
    FRAUD_PROOFS,
    OPERATOR_KEY,
    Net,
    open_net,
    validator_key,
)
from tests.mint_flood import junk_mint

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)

ESCROW = "0x" + "ee" * 20
PRICE = 10**12
STRANGERS, PER_STRANGER = 300, 4  # the most each may hold (credits.max_pending_mints)
USUAL_S = 20.0  # an honest purchase's wait beyond the unflooded one's, at most (shared CPU)


@dataclass
class Escrow:
    balances: dict[str, int]
    reads: list[str] = field(default_factory=list)
    address: str = ESCROW

    def prepaid_of(self, payer: str, gateway: str) -> dict[str, int]:
        self.reads.append(payer)
        return {"balance": self.balances.get(payer, 0), "withdrawable_at": 0}

    def epoch_of(self, epoch: int) -> dict[str, Any]:
        return {"status": 0}


@dataclass
class Deposits:
    payers: set[str]

    def depositors(self) -> set[str]:
        return self.payers


@contextlib.contextmanager
def _funder(net: Net, escrow: Escrow, deposits: Deposits) -> Iterator[None]:
    """The validator's real mint funder, DKG driver and mint signer, one pass every 0.3 s, on
    its own event loop (one link: the watcher's). A pass that fails by name (a DKG message that
    reached the chain after its phase on a loaded machine: refused, and the chain runs the DKG
    again) is logged and the next pass runs, as in the watcher (node/watcher/__main__.py); any
    other error ends the loop and is raised when the block exits."""
    stop = threading.Event()
    crashed: list[BaseException] = []

    def run() -> None:
        async def loop() -> None:
            link = CommitteeLink([net.rpc], validator_key(net.home))
            funder = MintFunder(committee=link, escrow=escrow, deposits=deposits)
            dkg = CreditDkgDriver.of_validator(link, validator_key(net.home), net.home)
            signer = MintSigner(link, dkg.store)  # its partials of each funded mint, on chain
            try:
                while not stop.is_set():
                    for relay in (dkg, signer, funder):
                        try:
                            await relay.step()
                        except PlanetError as error:
                            log.warning("%s pass failed: %s", type(relay).__name__, error)
                    await asyncio.sleep(0.3)
            finally:
                await link.close()

        try:
            asyncio.run(loop())
        except BaseException as error:  # surfaced to the test below
            crashed.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)
        if crashed:
            raise crashed[0]


def _buy(net: Net, payer: bytes, wallet: CreditWallet) -> float:
    started = time.monotonic()
    credits = asyncio.run(
        buy_credits([net.rpc], payer, 1, wallet, expiry=int(time.time()) + 3600, fund_timeout_s=60)
    )
    assert len(credits) == 1
    return time.monotonic() - started


def _landed(net: Net, mint_id: str) -> bool:
    response = net.call("abci_query", path=json.dumps(f"/mints?id={mint_id}"))["response"]
    return response.get("code", 0) == 0


def _pending(net: Net) -> int:
    count, after = 0, None
    for _ in range(100):
        page = net.query("/mints?pending=true" + (f"&after={after}" if after else ""))
        count += len(page["mints"])
        after = page["next"]
        if after is None:
            return count
    raise AssertionError("more than 100 pages")


def test_a_mint_flood_leaves_an_honest_purchase_funded_in_its_usual_time(tmp_path: Path) -> None:
    with open_net(tmp_path, app_state={}) as net:
        genesis_path = net.home / "config" / "genesis.json"
        genesis = json.loads(genesis_path.read_text())
        genesis["app_state"] = {
            "epoch_length": 100_000,
            "heartbeat_timeout": 100_000,
            "evm": {
                "chain_id": EVM_CHAIN_ID,
                "committee_address": COMMITTEE,
                "fraud_proofs_address": FRAUD_PROOFS,
                "escrow_address": ESCROW,
            },
            "validators": {net.validator_address: address_of(OPERATOR_KEY)},
            "credits": {
                "price_wei": str(PRICE),
                "layer_tokens": 4096,
                "key_period_blocks": 100_000,
                "dkg_phase_blocks": 4,
            },
        }
        genesis_path.write_text(json.dumps(genesis, indent=1))
        net.start_app()
        net.start_node()
        net.wait_height(1)

        honest = seeded_evm_key("flood-honest-payer")
        payer = address_of(honest).lower()
        escrow = Escrow({payer: 10 * PRICE})
        wallet = CreditWallet(tmp_path / "wallet.json")
        with _funder(net, escrow, Deposits({payer})):
            _buy(net, honest, wallet)  # the first waits for the key period's key (DKG)
            usual = _buy(net, honest, wallet)

            sender, expiry = seeded_key("flood-sender"), int(time.time()) + 3600
            last = ""
            for index in range(STRANGERS):
                key = seeded_evm_key(f"flood-stranger-{index}")
                for n in range(PER_STRANGER):
                    last, body = junk_mint(
                        0, key, PRICE, EVM_CHAIN_ID, ESCROW, expiry, index * 16 + n, "0x01"
                    )
                    raw = sign(body, sender, index * PER_STRANGER + n + 1).encode()
                    checked = net.call("broadcast_tx_sync", tx="0x" + raw.hex())
                    assert checked["code"] == 0, checked
            deadline = time.monotonic() + 120
            while not _landed(net, last):  # one sender's txs land in nonce order
                assert time.monotonic() < deadline, "the flood never landed"
                time.sleep(0.5)

            flooded = _buy(net, honest, wallet)
        print(f"honest purchase: {usual:.2f} s alone, {flooded:.2f} s after 1,200 junk mints")
        assert _pending(net) == STRANGERS * PER_STRANGER  # the junk waits, listed in full
        assert flooded <= usual + USUAL_S
        assert wallet.count() == 3
        assert set(escrow.reads) == {payer}  # the junk cost the funder no balance read
