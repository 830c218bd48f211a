"""Bearer credits through one real CometBFT v0.38 validator and the committee app's socket.

The validator forms the first key period's committee key by the on-chain DKG (its watcher's
messages, `node.watcher.credit_dkg.plan`, its share written to `<home>/credit_shares/` where
its app signs with it); a payer that asks before the key exists waits for it with progress
lines, then buys credits (`buy_credits`: the `credit_mint` through `broadcast_tx_sync`, the
app's partial signatures through CometBFT's `abci_query /credit_partials`, combined into the
wallet), a registered compute node redeems them: refused `REDEMPTION_UNPRICED` before it
registers a price; it registers a credit per 32 positions, then raises it mid-epoch to a credit
per 8 (counted from the next epoch, `/prices` says so); with one committed session (32
positions, + 31 for its last credit paid ahead) two credits are refused `REDEMPTION_OVER_PRICE`
naming the registered 32 (at the raised 8 they would fit), one is accepted, then refused as
`CREDIT_SPENT`, the second still over the price, and an altered credit `CREDIT_INVALID`; the
node's credited work (one credit's) shows in `/credits`. The retired RSA `mint` is refused by
name as an unknown tx kind. A `planet credits buy` killed with SIGKILL while its mint waits
for funding leaves the purchase in its credit file, and `planet credits finish` turns it into
credits once it is funded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from node.client.credit_purchase import buy_credits, finish_pending
from node.client.credit_wallet import CreditWallet
from node.client.mint_request import MintIncomplete
from node.keys import create_dev_wallet
from node.procs import spawn_piped
from node.watcher.credit_dkg import plan
from node.watcher.mint_signer import MintSigner
from planet.main import main
from protocol.canonical import canonical_json
from protocol.committee.commitments import CommitBatch, CommitmentRecord
from protocol.committee.credits import CreditRedeem, FundMint
from protocol.committee.envelope import sign
from protocol.committee.prices import SetPrice
from protocol.committee.registry import AttestStake, RegisterNode, sign_registration
from protocol.credit_shares import CREDIT_SHARES_DIR, CreditShareStore
from protocol.eip712 import address_of
from tests.committee_chain import seeded_evm_key, seeded_key
from tests.integration.test_abci_cometbft import (
    COMMITTEE,
    EVM_CHAIN_ID,
    FRAUD_PROOFS,
    OPERATOR_KEY,
    open_net,
    validator_key,
)

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)

ESCROW = "0x" + "ee" * 20
PRICE = 10**12
LAYER_TOKENS = 4096


class NetCommittee:
    """The watcher's `Committee` over this test's network (what `MintSigner` reads and sends
    through)."""

    def __init__(self, net: Any, send: Callable[[Any], dict[str, Any]]) -> None:
        self.net, self._send = net, send

    async def query(self, path: str, **params: Any) -> Any:
        return self.net.query(f"{path}?{urllib.parse.urlencode(params)}" if params else path)

    async def send(self, body: Any, *, timeout_s: float = 20.0) -> tuple[int, str]:
        answer = self._send(body)
        return int(answer.get("code", 0)), str(answer.get("log", ""))


def _genesis(net: Any, *, epoch_length: int, **credits: int) -> None:
    """The test chain's genesis: this validator bound to OPERATOR_KEY, the EVM section, and
    the first key period's DKG in 3 × 4 blocks (room for a loaded machine's pass: the key at
    block 13); `credits` adds to its credits section (e.g. `sign_blocks`). Registrations live
    100,000 blocks: the default 100 deleted the node's before it redeemed on a loaded machine
    (CI of d8b007d)."""
    path = net.home / "config" / "genesis.json"
    genesis = json.loads(path.read_text())
    genesis["app_state"] = {
        "epoch_length": epoch_length,
        "heartbeat_timeout": 100_000,
        "registration_ttl": 100_000,
        "evm": {
            "chain_id": EVM_CHAIN_ID,
            "committee_address": COMMITTEE,
            "fraud_proofs_address": FRAUD_PROOFS,
            "escrow_address": ESCROW,
        },
        "validators": {net.validator_address: address_of(OPERATOR_KEY)},
        "credits": {
            "price_wei": str(PRICE),
            "layer_tokens": LAYER_TOKENS,
            "key_period_blocks": 100_000,
            "dkg_phase_blocks": 4,
            **credits,
        },
    }
    path.write_text(json.dumps(genesis, indent=1))


@contextlib.contextmanager
def _vouching(net: Any, *, sign_partials: bool = True) -> Iterator[None]:
    """While open, the validator does what its watcher would: its key period DKG messages
    (`plan`, its share into the home its app reads), `fund_mint` for every mint waiting for
    funding (no EVM here: every mint counts as covered) and, unless `sign_partials` is False
    (a validator that vouches and then withholds its partials), the real `MintSigner`'s pass:
    its partial signatures for every funded mint, posted on the chain. A DKG message the chain
    refuses (it
    landed after its phase on a loaded machine; the chain runs the DKG again) is logged and the
    next pass goes on, as in the watcher; any other failure ends the loop and is raised when
    the block exits."""
    stop = threading.Event()
    key = validator_key(net.home)
    signer = key.verify_key.encode().hex()
    store = CreditShareStore(net.home / CREDIT_SHARES_DIR)
    crashed: list[BaseException] = []

    def send(body: Any) -> dict[str, Any]:
        nonce = net.query(f"/nonce?account={signer}")["nonce"] + 1
        return net.submit(sign(body, key, nonce).encode())

    signer_pass = MintSigner(NetCommittee(net, send), store)

    def vouch() -> None:
        done: set[str] = set()
        while not stop.wait(0.3):
            if sign_partials:
                asyncio.run(signer_pass.step())
            for body in plan(net.query("/credit_period"), key, store):
                answer = send(body)
                if answer.get("code", 0) != 0:
                    log.warning("%s refused: %s", body.TYPE, answer)
            for mint in net.query("/mints?pending=true")["mints"]:
                if mint["id"] not in done:
                    answer = send(FundMint(mint["id"]))
                    assert answer.get("code", 0) == 0, answer
                    done.add(mint["id"])

    def run() -> None:
        try:
            vouch()
        except BaseException as error:  # surfaced to the test below
            crashed.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
        if crashed:
            raise crashed[0]


def _mints_of(net: Any, payer: bytes) -> list[dict[str, Any]]:
    return net.query(f"/mints?payer={address_of(payer).lower()}")["mints"]


def test_credits_mint_sign_finalize_redeem_on_cometbft(tmp_path: Path) -> None:
    with open_net(tmp_path, app_state={}) as net:
        _genesis(net, epoch_length=100_000)
        net.start_app()
        net.start_node()
        net.wait_height(1)

        node_key = seeded_key("credits-integration-node")
        node = node_key.verify_key.encode().hex()
        evm = seeded_evm_key("credits-integration-node")
        body = RegisterNode(
            address_of(evm), sign_registration(evm, node), "compute", "m", (0,), "http://n", 1
        )
        assert net.submit(sign(body, node_key, 1).encode()).get("code", 0) == 0
        # only staked nodes commit: the validator attests the node's stake (its stake watcher's
        # job; no EVM here)
        validator = validator_key(net.home)
        account = validator.verify_key.encode().hex()
        v_nonce = net.query(f"/nonce?account={account}")["nonce"] + 1
        attested = net.submit(sign(AttestStake(node, 10**18), validator, v_nonce).encode())
        assert attested.get("code", 0) == 0, attested

        run = net.query("/credit_period")["run"]
        assert not (run and run.get("result"))  # no key yet: the purchase below waits for it
        payer = seeded_evm_key("credits-integration-payer")
        wallet = CreditWallet(tmp_path / "wallet.json")
        # no EVM here: the validator vouches for every mint itself, as its watcher does for
        # a covered one (tests/integration/test_agent_watcher.py runs the real watcher)
        lines: list[str] = []
        with _vouching(net):
            credits = asyncio.run(
                buy_credits(
                    [net.rpc],
                    payer,
                    3,
                    wallet,
                    expiry=int(time.time()) + 3600,
                    progress=lines.append,
                )
            )
            assert len(credits) == 3 and wallet.count() == 3
            waits = [line for line in lines if "credit key (DKG) — block" in line]
            assert waits and waits[0].startswith("waiting for the committee's credit key"), lines
            # the same through the CLI, from an encrypted keystore
            keystore, password = tmp_path / "payer.json", tmp_path / "password"
            password.write_text("credits-test")
            create_dev_wallet(keystore, "credits-test", payer)
            cli_file = tmp_path / "cli-credits.json"
            argv = ["credits", "buy", "2", "--committee-rpc", net.rpc, "--wallet", str(keystore)]
            argv += ["--password-file", str(password), "--credits-file", str(cli_file)]
            assert main(argv) == 0
            assert CreditWallet(cli_file).count() == 2

        # a buyer killed (-9) while the validators check its balance loses nothing: the next
        # run (`planet credits finish`) gathers the partials of the mint it paid for
        killed_file = tmp_path / "killed-credits.json"
        argv = [*argv[:-1], str(killed_file), "--wait", "300"]
        buyer = spawn_piped([sys.executable, "-m", "planet", *argv])
        try:
            deadline = time.monotonic() + 60
            while not [m for m in _mints_of(net, payer) if m["funded_height"] is None]:
                assert buyer.poll() is None and time.monotonic() < deadline, "mint never landed"
                time.sleep(0.2)
        finally:
            buyer.kill()
            buyer.wait(timeout=10)
        killed = CreditWallet(killed_file)
        assert killed.count() == 0 and len(killed.pending()) == 1
        finish = ["credits", "finish", "--committee-rpc", net.rpc, "--credits-file"]
        with _vouching(net):
            assert main([*finish, str(killed_file)]) == 0
        assert killed.count() == 2 and killed.pending() == []
        assert all(m["funded_height"] is not None for m in _mints_of(net, payer))

        spend = wallet.take(2)
        nonce = iter(range(2, 100))

        def by_node(body: Any) -> dict[str, Any]:
            return net.submit(sign(body, node_key, next(nonce)).encode())

        # a credit buys what the node's price on the chain says, and nothing without one
        unpriced = by_node(CreditRedeem("m", 0, tuple(spend)))
        assert unpriced["code"] == 97, unpriced  # REDEMPTION_UNPRICED
        assert by_node(SetPrice("m", 0, 32)).get("code", 0) == 0  # the first price: counts now
        # a raise mid-epoch (a credit per 8 positions): counts from the next epoch only
        assert by_node(SetPrice("m", 0, 8)).get("code", 0) == 0
        [row] = net.query(f"/prices?model=m&node={node}")["prices"]
        epoch = net.query("/prices?model=m")["epoch"]
        assert row["positions"] == 32 and row["next"] == {"epoch": epoch + 1, "positions": 8}, row
        # the node commits what it served (one record, 32 positions): no commitment, no pay
        uncommitted = by_node(CreditRedeem("m", 0, tuple(spend)))
        assert uncommitted["code"] == 84, uncommitted  # UNCOMMITTED_REDEMPTION
        record = CommitmentRecord("0x" + "5e" * 32, 0, 0, "0x" + "c0" * 32)
        committed = by_node(CommitBatch((record,)))
        assert committed.get("code", 0) == 0, committed
        # one session: 32 positions + 31 for its last credit paid ahead pay one credit at the
        # registered 32 (two at the raised 8 would need 16): two are refused by name
        over = by_node(CreditRedeem("m", 0, tuple(spend)))
        assert over["code"] == 91, over  # REDEMPTION_OVER_PRICE
        assert "registered price of 32 positions each need 64" in over["log"], over
        assert "at most 1 credits" in over["log"], over
        first = by_node(CreditRedeem("m", 0, tuple(spend[:1])))
        assert first.get("code", 0) == 0, first
        again = by_node(CreditRedeem("m", 0, tuple(spend[:1])))
        assert again["code"] == 78 and "already redeemed" in again["log"], again  # CREDIT_SPENT
        rest = by_node(CreditRedeem("m", 0, tuple(spend[1:])))  # 31 positions left: under 32
        assert rest["code"] == 91 and "31 are left" in rest["log"], rest
        [last] = wallet.take(1)
        altered = replace(last, nonce=last.nonce[:-1] + bytes([last.nonce[-1] ^ 1]))
        refused = by_node(CreditRedeem("m", 0, (altered,)))
        assert refused["code"] == 77, refused  # CREDIT_INVALID
        credited = net.query(f"/credits?account={address_of(evm).lower()}")["credits"]
        assert credited == [{"layer_tokens": LAYER_TOKENS, "model": "m", "shard": 0}]
        # the retired RSA `mint` kind: refused by name at the door (CheckTx), nothing listed
        unsigned = {
            "body": {
                "amount": "0",
                "blinded": [],
                "epoch": 1,
                "expiry": 0,
                "payer": "0x",
                "signature": "",
            },
            "nonce": 9,
            "signer": node,
            "type": "mint",
        }
        raw = canonical_json({**unsigned, "sig": "00" * 64})
        old = net.call("broadcast_tx_sync", tx="0x" + raw.hex())
        assert old["code"] == 1 and "unknown tx type 'mint'" in old["log"], old  # MALFORMED_TX


def test_credits_withheld_partials_are_refunded_after_the_deadline_on_cometbft(
    tmp_path: Path,
) -> None:
    """The validator (all of the power: more than 1/3) vouches for a mint and then withholds
    its partial signatures: the client gets no credit (no set on the chain, `/credit_partials`
    answers none), the mint is refunded at its deadline (`credits.sign_blocks` after funding),
    the payer's row of exactly its price is on the pool page of that epoch's close, and the
    purchase in the wallet is dropped with the refund named."""
    with open_net(tmp_path, app_state={}) as net:
        length = 10
        _genesis(net, epoch_length=length, sign_blocks=5)
        net.start_app()
        net.start_node()
        net.wait_height(1)
        payer = seeded_evm_key("credits-refund-payer")
        wallet = CreditWallet(tmp_path / "wallet.json")
        lines: list[str] = []
        with _vouching(net, sign_partials=False), pytest.raises(MintIncomplete):
            asyncio.run(
                buy_credits(
                    [net.rpc],
                    payer,
                    2,
                    wallet,
                    expiry=int(time.time()) + 3600,
                    timeout_s=2.0,
                    progress=lines.append,
                )
            )
        assert wallet.count() == 0 and len(wallet.pending()) == 1  # kept: it may still complete
        [mint] = _mints_of(net, payer)
        assert mint["funded_height"] is not None and mint["signers"] == []
        assert mint["deadline"] == mint["funded_height"] + 5
        close = -(-mint["deadline"] // length) * length  # the close of the deadline's epoch
        net.wait_height(close + 1, timeout=120)
        record = net.query(f"/mints?id={mint['id']}")
        assert record["refunded_height"] == mint["deadline"]
        statement = net.query(f"/payouts?epoch={close // length}")
        rows = {account: int(amount) for account, amount in statement["rows"]}
        assert rows[address_of(payer).lower()] == 2 * PRICE == int(mint["amount"])
        assert net.query(f"/mint_partials?mint={mint['id']}")["sets"] == []
        # the purchase: dropped, the refund named; nothing was ever signed for it
        asyncio.run(finish_pending([net.rpc], wallet, progress=lines.append))
        assert wallet.count() == 0 and wallet.pending() == []
        assert any("refunded at block" in line for line in lines), lines
