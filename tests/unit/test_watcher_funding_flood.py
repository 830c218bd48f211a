"""The real mint funders (node/watcher/funding.py, one per validator) against the real committee
state machine under a mint flood (issue 42): a payer's own junk no longer hides its in-flight
mint, so one balance never funds two mints; strangers' junk, ids ground below an honest mint's,
no longer hides the honest purchase, which is funded in the funders' first pass; a returning
buyer (a hosted gateway's top-up) is funded first whatever waits before it."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from nacl.signing import SigningKey

from abci_app.codes import Code
from abci_app.queries import query
from node.watcher.funding import PAYER_PAGES, MintFunder
from protocol.eip712 import address_of
from protocol.errors import RemoteError
from tests.committee_chain import Chain, seeded_evm_key
from tests.credit_chain import PAYER, PRICE
from tests.unit.test_abci_settlement import ESCROW, ask
from tests.unit.test_mint_flood import flood, flood_chain, honest_mint, strangers

pytestmark = pytest.mark.unit


@dataclass
class ValidatorLink:
    """A validator's committee link (the watcher's `Committee`) over the in-process chain: each
    `send` is one block with that validator's tx."""

    chain: Chain
    key: SigningKey

    async def query(self, path: str, **params: Any) -> Any:
        full = path + ("?" + urlencode(params) if params else "")
        code, value, log = query(self.chain.state, full, b"")
        if code != Code.OK:
            raise RemoteError("chain", f"query_{code}", log)
        return json.loads(value)

    async def send(self, body: Any, *, timeout_s: float = 15) -> tuple[int, str]:
        [result] = self.chain.block([self.chain.tx(body, self.key)])
        return int(result.code), result.log


@dataclass
class Escrow:
    """The EVM's balances at the escrow's address; counts the balance reads."""

    balances: dict[str, int] = field(default_factory=dict)
    reads: list[str] = field(default_factory=list)
    address: str = ESCROW

    def prepaid_of(self, payer: str, gateway: str) -> dict[str, int]:
        assert gateway == ESCROW
        self.reads.append(payer)
        return {"balance": self.balances.get(payer, 0), "withdrawable_at": 0}

    def epoch_of(self, epoch: int) -> dict[str, Any]:
        return {"status": 0}  # no statement posted: every funded mint stays in flight


@dataclass
class Deposits:
    """The escrow's `BalanceDeposited` log as the funder reads it."""

    payers: set[str] = field(default_factory=set)

    def depositors(self) -> set[str]:
        return self.payers


def funders(chain: Chain, escrow: Escrow, deposits: Deposits | None) -> list[MintFunder]:
    return [
        MintFunder(committee=ValidatorLink(chain, v.key), escrow=escrow, deposits=deposits)
        for v in chain.validators
    ]


def one_pass(every: list[MintFunder]) -> None:
    for funder in every:
        asyncio.run(funder.step())


def payer_of(key: bytes) -> str:
    return address_of(key).lower()


def funded_amount(chain: Chain, payer: str) -> int:
    """What the chain charges `payer` for its funded mints (read from state, not a query)."""
    return sum(
        int(record["amount"])
        for _, record in chain.state.committed_items("mint")
        if record["payer"] == payer and record["funded_height"] is not None
    )


def test_one_balance_funds_one_mint_though_its_payer_floods_1000_junk_mints(
    tmp_path: Path,
) -> None:
    chain = flood_chain(tmp_path)
    payer = payer_of(PAYER)
    escrow, deposits = Escrow({payer: PRICE}), Deposits({payer})
    every = funders(chain, escrow, deposits)
    first = honest_mint(chain)
    one_pass(every)
    assert ask(chain, f"/mints?id={first.mint_id}")["funded_height"] is not None
    flood(chain, [PAYER], 1000, below="0x1")  # ids below the in-flight one's
    for _ in range(3):
        one_pass(every)
    assert funded_amount(chain, payer) == PRICE  # the balance, not a wei beyond it


def test_strangers_1200_junk_mints_do_not_delay_an_honest_purchase(tmp_path: Path) -> None:
    chain = flood_chain(tmp_path)
    honest_key = seeded_evm_key("honest-buyer")
    honest = payer_of(honest_key)
    escrow, deposits = Escrow({honest: PRICE}), Deposits({honest})
    junk, codes = flood(chain, strangers(300), 4)  # sent first, ids below the honest one's
    assert codes == [Code.OK] * 1200
    request = honest_mint(chain, honest_key)
    one_pass(funders(chain, escrow, deposits))  # the first pass of each funder
    assert ask(chain, f"/mints?id={request.mint_id}")["funded_height"] is not None
    assert set(escrow.reads) == {honest}  # no stranger cost a balance read
    assert all(ask(chain, f"/mints?id={j}")["funded_height"] is None for j in junk[:50])


def test_a_returning_buyers_top_up_is_funded_first_behind_depositing_strangers(
    tmp_path: Path,
) -> None:
    """300 strangers each paid a deposit's gas (their balance is 0 again): they are weighed, a
    page of payers a pass, but the returning buyer's top-up goes first."""
    chain = flood_chain(tmp_path)
    gateway_key = seeded_evm_key("hosted-gateway")
    gateway = payer_of(gateway_key)
    crowd = strangers(300)
    escrow = Escrow({gateway: 2 * PRICE})
    deposits = Deposits({gateway, *(payer_of(k) for k in crowd)})
    every = funders(chain, escrow, deposits)
    first = honest_mint(chain, gateway_key)
    one_pass(every)
    assert ask(chain, f"/mints?id={first.mint_id}")["funded_height"] is not None
    flood(chain, crowd, 4, below="0x1")
    top_up = honest_mint(chain, gateway_key)
    one_pass(every)
    assert ask(chain, f"/mints?id={top_up.mint_id}")["funded_height"] is not None
    assert funded_amount(chain, gateway) == 2 * PRICE


# --- the funder reads every page (whatever a chain lets one payer hold) -------------------------


@dataclass
class PagedCommittee:
    """The committee's `/mints` lists as the app pages them (by id, `next` cursors), over a
    plain dict of mint records, for payers holding more mints than one page."""

    mints: dict[str, dict[str, Any]] = field(default_factory=dict)
    page_size: int = 1000
    sent: list[Any] = field(default_factory=list)

    def add(self, n: int, payer: str, funded: int | None = None) -> str:
        identifier = "0x" + f"{n:064x}"
        self.mints[identifier] = {
            "id": identifier,
            "payer": payer,
            "amount": str(PRICE),
            "epoch": 3,
            "height": 20 + n,
            "funded_height": funded,
        }
        return identifier

    async def query(self, path: str, **params: Any) -> Any:
        if path == "/mints":
            if params.get("pending") == "true":
                rows = [m for m in self.mints.values() if m["funded_height"] is None]
            else:
                rows = [m for m in self.mints.values() if m["payer"] == params["payer"]]
            rows.sort(key=lambda m: m["id"])
            after = params.get("after")
            rows = [m for m in rows if after is None or m["id"] > after]
            page = rows[: self.page_size]
            more = len(rows) > self.page_size
            return {"mints": page, "next": page[-1]["id"] if more else None}
        if path == "/epochs":
            return {"current": 3}
        if path == "/params":
            return {"genesis": {"epoch_length": 10}}
        if path == "/payouts":
            return {"epochs": []}
        raise AssertionError(path)

    async def send(self, body: Any, *, timeout_s: float = 15) -> tuple[int, str]:
        self.sent.append(body)
        return 0, ""


def test_the_funder_counts_an_in_flight_mint_listed_after_1500_others_of_its_payer() -> None:
    payer = "0x" + "aa" * 20
    chain = PagedCommittee()
    for n in range(1, 1501):
        chain.add(n, payer)  # unfunded, listed before the in-flight one
    chain.add(1 << 200, payer, funded=25)  # in flight: funded in epoch 3, not posted
    funder = MintFunder(committee=chain, escrow=Escrow({payer: PRICE}))  # type: ignore[arg-type]
    assert asyncio.run(funder.step()) == []
    assert chain.sent == []


def test_the_funder_weighs_no_payer_whose_mints_it_cannot_read_to_the_end() -> None:
    payer = "0x" + "aa" * 20
    chain = PagedCommittee(page_size=2)
    for n in range(1, 2 * PAYER_PAGES + 2):
        chain.add(n, payer)
    funder = MintFunder(committee=chain, escrow=Escrow({payer: 10 * PRICE}))  # type: ignore[arg-type]
    assert asyncio.run(funder.step()) == []  # its sum would be a guess: nothing vouched
    chain.mints = dict(list(chain.mints.items())[:4])
    assert len(asyncio.run(funder.step())) == 4  # a list read to its end is weighed
