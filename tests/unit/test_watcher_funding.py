"""MintFunder (node/watcher/funding.py): a validator vouches for a credit mint only when its EVM
read of the payer's balance covers it and every mint of that payer still in flight — the
committee blind-signs nothing unfunded, so a payer with no balance gets no credits, and one
balance never pays for two mints."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from node.watcher.funding import MintFunder, funding_epoch
from protocol.committee.credits import FundMint
from protocol.committee.settlement import statement_number, statement_page

pytestmark = pytest.mark.unit

PAYER = "0x" + "aa" * 20
OTHER = "0x" + "bb" * 20
ESCROW = "0x" + "ee" * 20
PRICE = 10**15
LENGTH = 10


def _id(n: int) -> str:
    return "0x" + f"{n:064x}"


@dataclass
class Chain:
    """The committee queries the funder makes, answered from its mints and statements."""

    current: int = 3
    mints: dict[str, dict[str, Any]] = field(default_factory=dict)
    statements: list[int] = field(default_factory=list)  # stored payout statement numbers
    sent: list[Any] = field(default_factory=list)
    refuse: int = 0  # the code the next fund_mint gets (then 0)
    statement_page: int = 1000  # statements a `/payouts` page lists
    payout_reads: int = 0
    queried: list[str] = field(default_factory=list)  # every query's path, in order

    def _payouts(self, after: str | None) -> dict[str, Any]:
        """A page of the statements as abci_app/payout_queries.py lists them: newest first by
        key (epoch, then page), each with its epoch's `pages`, and the cursor `next`."""
        self.payout_reads += 1
        order = sorted(self.statements, key=lambda n: statement_page(n), reverse=True)
        if after is not None:
            order = order[order.index(int(after)) + 1 :]
        page = order[: self.statement_page]
        more = len(order) > len(page)
        pages = Counter(statement_page(n)[0] for n in self.statements)
        return {
            "epochs": [{"epoch": n, "pages": pages[statement_page(n)[0]]} for n in page],
            "next": str(page[-1]) if more else None,
        }

    def mint(self, n: int, payer: str = PAYER, amount: int = PRICE, epoch: int = 3) -> str:
        self.mints[_id(n)] = {
            "id": _id(n),
            "payer": payer,
            "amount": str(amount),
            "epoch": epoch,
            "height": 20 + n,
            "funded_height": None,
        }
        return _id(n)

    async def query(self, path: str, **params: Any) -> Any:
        self.queried.append(path)
        if path == "/mints" and params.get("pending") == "true":
            return {"mints": [m for m in self.mints.values() if m["funded_height"] is None]}
        if path == "/mints":
            return {"mints": [m for m in self.mints.values() if m["payer"] == params["payer"]]}
        if path == "/epochs":
            return {"current": self.current}
        if path == "/params":
            return {"genesis": {"epoch_length": LENGTH}}
        if path == "/payouts":
            return self._payouts(params.get("after"))
        raise AssertionError(path)

    async def send(self, body: Any, *, timeout_s: float = 15) -> tuple[int, str]:
        code, self.refuse = self.refuse, 0
        if code == 0:
            self.sent.append(body)
        return code, "refused" if code else ""


@dataclass
class Escrow:
    balances: dict[str, int] = field(default_factory=dict)
    withdrawing: set[str] = field(default_factory=set)
    posted: set[int] = field(default_factory=set)
    address: str = ESCROW

    def prepaid_of(self, payer: str, gateway: str) -> dict[str, int]:
        assert gateway == ESCROW  # mints pay from the balance at the escrow's own address
        return {
            "balance": self.balances.get(payer, 0),
            "withdrawable_at": 1_900_000_000 if payer in self.withdrawing else 0,
        }

    def epoch_of(self, epoch: int) -> dict[str, Any]:
        return {"status": 1 if epoch in self.posted else 0}


def _funder(chain: Chain, escrow: Escrow) -> MintFunder:
    return MintFunder(committee=chain, escrow=escrow)  # type: ignore[arg-type]


async def test_a_covered_mint_is_vouched_for_and_a_payer_without_balance_is_not() -> None:
    chain, escrow = Chain(), Escrow(balances={PAYER: PRICE})
    covered, broke = chain.mint(1), chain.mint(2, payer=OTHER)
    assert await _funder(chain, escrow).step() == [covered]
    assert chain.sent == [FundMint(covered)] and broke not in {b.mint for b in chain.sent}


async def test_a_pass_with_no_mint_waiting_reads_only_the_waiting_list() -> None:
    """The usual pass (every watcher, every second): one `/mints` read, no `/epochs`."""
    chain = Chain()
    assert await _funder(chain, Escrow()).step() == []
    assert chain.queried == ["/mints"]


async def test_one_balance_never_vouches_for_two_mints_that_each_need_all_of_it() -> None:
    chain, escrow = Chain(), Escrow(balances={PAYER: PRICE})
    first, second = chain.mint(1), chain.mint(2)
    funder = _funder(chain, escrow)
    assert await funder.step() == [first]
    assert await funder.step() == []  # the first is in flight (vouched, not funded yet)
    chain.mints[first]["funded_height"] = 25
    assert await funder.step() == []  # funded, its epoch's statement not posted: in flight
    assert chain.sent == [FundMint(first)]
    assert second in {m["id"] for m in (await chain.query("/mints", pending="true"))["mints"]}


async def test_in_flight_ends_when_the_funding_epochs_statements_are_posted() -> None:
    """Balance 2 prices; mint 1 funded in epoch 3 (in flight), mint 2 vouched, mint 3 waits.
    Epoch 3's statement (two pages) posted and the balance debited to 1 price: mint 1 no longer
    counts, mint 2 still does, so mint 3 still waits — the funder never counts a debit twice
    nor forgets one not yet on the EVM."""
    chain, escrow = Chain(), Escrow(balances={PAYER: 2 * PRICE})
    one = chain.mint(1)
    chain.mints[one]["funded_height"] = 3 * LENGTH  # the last block of epoch 3
    assert funding_epoch(3 * LENGTH, LENGTH) == 3
    two, three = chain.mint(2), chain.mint(3)
    funder = _funder(chain, escrow)
    assert await funder.step() == [two]
    chain.statements = [3, 3 + (1 << 32)]
    escrow.posted = {3}  # page 1 not posted yet: still in flight
    assert await funder.step() == []
    escrow.posted.add(3 + (1 << 32))
    escrow.balances[PAYER] = PRICE  # the EVM debited mint 1
    assert await funder.step() == []  # 1 price − mint 2 in flight < mint 3
    escrow.balances[PAYER] = 2 * PRICE  # the payer deposits one more price
    assert await funder.step() == [three]


async def test_an_open_withdrawal_gets_no_vouch() -> None:
    chain, escrow = Chain(), Escrow(balances={PAYER: 10 * PRICE}, withdrawing={PAYER})
    chain.mint(1)
    assert await _funder(chain, escrow).step() == [] and chain.sent == []


async def test_a_mint_past_its_funding_window_is_not_vouched_nor_counted() -> None:
    chain, escrow = Chain(current=3), Escrow(balances={PAYER: PRICE})
    stale = chain.mint(1, epoch=1)  # fundable in epochs 1 and 2 only
    assert await _funder(chain, escrow).step() == [] and chain.sent == []
    vouched = chain.mint(2, epoch=3)
    funder = _funder(chain, escrow)
    assert await funder.step() == [vouched]  # never funded by the others …
    chain.current = 5
    later = chain.mint(3, epoch=5)
    assert await funder.step() == [later]  # … and past epoch 4 it no longer counts
    assert stale not in {b.mint for b in chain.sent}


async def test_a_refused_vouch_is_not_counted_and_is_tried_again() -> None:
    chain, escrow = Chain(refuse=3), Escrow(balances={PAYER: PRICE})
    mint = chain.mint(1)
    funder = _funder(chain, escrow)
    assert await funder.step() == []
    assert await funder.step() == [mint]


async def test_a_flood_of_payers_without_balance_is_weighed_a_few_per_pass_in_turn() -> None:
    """Mint txs are free: 40 payers with nothing cost at most `payers_per_pass` EVM reads a
    pass, and the one payer with a balance still gets its turn within ⌈41 / 16⌉ passes."""
    chain, escrow = Chain(), Escrow(balances={PAYER: PRICE})
    for n in range(40):
        chain.mint(n, payer="0x" + f"{n:040x}")
    mine = chain.mint(99)  # the newest mint: last in line
    reads: list[str] = []
    prepaid_of = escrow.prepaid_of

    def counting(payer: str, gateway: str) -> dict[str, int]:
        reads.append(payer)
        return prepaid_of(payer, gateway)

    escrow.prepaid_of = counting  # type: ignore[method-assign]
    funder = _funder(chain, escrow)
    vouched: list[str] = []
    while not vouched and funder.passes < 5:
        before = len(reads)
        vouched += await funder.step()
        assert len(reads) - before <= funder.payers_per_pass
    assert vouched == [mine] and funder.passes == 3


async def test_a_waiting_mint_is_logged_once_per_balance(caplog: pytest.LogCaptureFixture) -> None:
    chain, escrow = Chain(), Escrow(balances={PAYER: PRICE // 2})
    chain.mint(1)
    funder = _funder(chain, escrow)
    with caplog.at_level("INFO", logger="node.watcher.funding"):
        for _ in range(3):
            assert await funder.step() == []
        escrow.balances[PAYER] = PRICE - 1
        assert await funder.step() == []
    assert sum("not vouched for" in r.getMessage() for r in caplog.records) == 2


async def test_every_page_of_statements_is_read_past_the_old_200() -> None:
    """The funder reads `/payouts` to its last page (issue 42): a mint funded in epoch 3, whose
    statements list after 250 newer ones (pages of 100), leaves flight once they are posted —
    with `limit=200` they fell out of the window and the payer's balance stayed held forever.
    An epoch whose pages the read did not reach in full counts as not debited."""
    chain, escrow = Chain(current=300), Escrow(balances={PAYER: PRICE})
    chain.statement_page = 100
    one = chain.mint(1, epoch=299)
    chain.mints[one]["funded_height"] = 3 * LENGTH  # funded in epoch 3
    two = chain.mint(2, epoch=299)
    old = [statement_number(3, page) for page in range(2)]
    chain.statements = old + [statement_number(e, 0) for e in range(4, 254)]
    escrow.posted = set(chain.statements)
    escrow.balances[PAYER] = PRICE  # mint 1 debited: the balance covers mint 2 alone
    funder = _funder(chain, escrow)
    assert await funder.step() == [two]
    assert chain.payout_reads == 3  # 252 statements, 100 a page
    # a read that ends among an epoch's pages does not count that epoch as debited
    chain, escrow = Chain(current=300), Escrow(balances={PAYER: PRICE})
    chain.statement_page = 1
    one = chain.mint(1, epoch=299)
    chain.mints[one]["funded_height"] = 3 * LENGTH
    chain.mint(2, epoch=299)
    chain.statements = old
    escrow.posted = set(old)
    statements = await _funder(chain, escrow)._statements()
    assert statements == {3: sorted(old, reverse=True)}
    monkey = pytest.MonkeyPatch()
    monkey.setattr("node.watcher.funding.STATEMENT_PAGES", 1)
    try:
        assert await _funder(chain, escrow)._statements() == {}
        assert await _funder(chain, escrow).step() == []  # mint 1 still in flight: held
    finally:
        monkey.undo()
