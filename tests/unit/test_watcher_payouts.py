"""The watcher's payout relay against an in-process committee chain and a fake escrow: each
validator signs once, the first to see 2/3 posts, another relayer's post counts as done."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from abci_app.codes import Code
from abci_app.queries import query
from node.chain.evm.errors import ContractRevert
from node.watcher.payouts import PayoutRelay, statement_of
from protocol.errors import UnavailableError
from tests.committee_chain import Chain
from tests.unit.test_abci_settlement import (
    DOMAIN,
    ESCROW,
    GATEWAY,
    Q1,
    Q2,
    next_epoch_end,
    one,
    report,
    settled_chain,
)

pytestmark = pytest.mark.unit


@dataclass
class ChainLink:
    """`CommitteeLink`'s query/submit over a `Chain`, as one validator."""

    chain: Chain
    index: int

    async def query(self, path: str, **params: Any) -> Any:
        full = path + ("?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else "")
        code, value, log = query(self.chain.state, full, b"")
        if code != Code.OK:
            raise AssertionError(log)
        return json.loads(value)

    lost: int = 0  # the next sends lose their nonce to another signer (refused in the block)

    async def send(self, body: Any, *, timeout_s: float = 15) -> tuple[int, str]:
        if self.lost:
            self.lost -= 1
            return int(Code.BAD_NONCE), "nonce taken"
        [result] = self.chain.block([self.chain.tx(body, self.chain.validators[self.index].key)])
        return int(result.code), result.log


@dataclass
class FakeEscrow:
    address: str = ESCROW
    posts: list[tuple[Any, ...]] = field(default_factory=list)
    already: bool = False
    revert: str = ""  # every posting reverts with this error (the page rule)
    tries: int = 0

    def epoch_of(self, epoch: int) -> dict[str, Any]:
        return {"status": 1 if self.posts else 0}

    debits: list[tuple[Any, Any]] = field(default_factory=list)

    def post_payout_root(
        self,
        statement: Any,
        query_ids: Any,
        fees: Any,
        sigs: Any,
        *,
        payers: Any,
        gateways: Any,
        debits: Any,
    ) -> Any:
        self.tries += 1
        if self.already:
            raise ContractRevert("EpochAlreadyPosted", (statement.epoch,))
        if self.revert:
            raise ContractRevert(self.revert, (statement.epoch,))
        self.posts.append((statement, query_ids, fees, sigs))
        self.debits.append((payers, gateways, debits))


def fees_epoch(chain: Chain) -> tuple[None, None, int]:
    """The gateway reports two query fees (600 and 401); the epoch closes: one statement."""
    assert one(chain, report(queries=((Q1, 600), (Q2, 401))), GATEWAY).code == Code.OK
    return None, None, next_epoch_end(chain)


def relay(chain: Chain, index: int, escrow: FakeEscrow) -> PayoutRelay:
    return PayoutRelay(
        committee=ChainLink(chain, index),
        escrow=escrow,
        escrow_address=ESCROW,
        operator_key=chain.validators[index].operator_key,
        domain=DOMAIN,
    )


async def test_payout_relay_signs_once_posts_at_two_thirds_once() -> None:
    chain = settled_chain()
    _, _, epoch = fees_epoch(chain)
    escrow = FakeEscrow()
    relays = [relay(chain, i, escrow) for i in range(4)]
    assert await relays[0].step() == [("signed", epoch)]
    assert await relays[1].step() == [("signed", epoch)]
    assert escrow.posts == []
    assert await relays[2].step() == [("signed", epoch), ("posted", epoch)]
    [(statement, query_ids, fees, sigs)] = escrow.posts
    view = await relays[0].committee.query("/payouts", epoch=epoch)
    assert statement == statement_of(view)
    assert [q.hex() for q in query_ids] == [q[2:] for q in view["query_ids"]]
    assert fees == [600, 401] and len(sigs) == 3
    # the fourth signs too; nobody posts again, nobody signs twice (also after a restart)
    assert await relays[3].step() == [("signed", epoch)]
    assert await relays[0].step() == []
    assert await relay(chain, 1, escrow).step() == []
    assert len(escrow.posts) == 1
    assert (await relays[0].committee.query("/payouts", epoch=epoch))["power"] == 40


async def test_payout_relay_another_relayer_first_is_success() -> None:
    chain = settled_chain()
    _, _, epoch = fees_epoch(chain)
    escrow = FakeEscrow(already=True)
    for i in range(3):
        await relay(chain, i, escrow).step()
    last = relay(chain, 3, escrow)
    assert await last.step() == [("signed", epoch)]
    assert epoch in last.posted and escrow.posts == []


async def test_payout_relay_skips_a_statement_for_another_escrow() -> None:
    chain = settled_chain()
    _, _, epoch = fees_epoch(chain)
    escrow = FakeEscrow()
    other = relay(chain, 0, escrow)
    other.escrow_address = "0x" + "12" * 20
    assert await other.step() == []
    view = await other.committee.query("/payouts", epoch=epoch)
    assert view["signers"] == []


async def test_payout_relay_posts_the_statements_prepaid_debits() -> None:
    from tests.unit.test_abci_prepaid import (
        GATEWAY_EVM,
        NOW,
        charge,
        payer,
        reported_with,
    )

    chain = settled_chain()
    chain.time_s = NOW
    reported_with(chain, charge("payer-1", 1, 300), charge("payer-2", 2, 5))
    epoch = next_epoch_end(chain)
    escrow = FakeEscrow()
    for i in range(3):
        await relay(chain, i, escrow).step()
    [(payers, gateways, debits)] = escrow.debits
    expected = sorted([(payer("payer-1"), GATEWAY_EVM, 300), (payer("payer-2"), GATEWAY_EVM, 5)])
    assert list(zip(payers, gateways, debits, strict=True)) == expected
    view = await relay(chain, 0, escrow).committee.query("/payouts", epoch=epoch)
    assert view["payers"] == [p for p, _, _ in expected]


async def test_payout_relay_vote_lost_in_its_block_is_signed_again() -> None:
    chain = settled_chain()
    _, _, epoch = fees_epoch(chain)
    escrow = FakeEscrow()
    first = relay(chain, 0, escrow)
    first.committee.lost = 1  # type: ignore[attr-defined]
    assert await first.step() == []
    assert await first.step() == [("signed", epoch)]


@pytest.mark.parametrize("error", ["WrongGatewayQuery", "RootNotPayee", "WrongGatewayDebit"])
async def test_payout_relay_a_page_the_escrow_can_never_post_is_not_tried_again(
    error: str,
) -> None:
    """A page listing a deposit another gateway holds reverts at every try (the escrow's page
    rule): the relay says so once and moves on; other reverts are tried again next pass."""
    chain = settled_chain()
    fees_epoch(chain)
    escrow = FakeEscrow(revert=error)
    relays = [relay(chain, i, escrow) for i in range(3)]
    for r in relays:
        await r.step()
    assert escrow.tries == 1 and escrow.posts == []
    await relays[2].step()
    assert escrow.tries == 1
    retried = FakeEscrow(revert="ChallengeWindowOpen")
    chain2 = settled_chain()
    fees_epoch(chain2)
    again = [relay(chain2, i, retried) for i in range(3)]
    for r in again:
        await r.step()
    await again[2].step()
    assert retried.tries == 2


@dataclass
class NumberedEscrow(FakeEscrow):
    """The escrow's status per statement number (posted once its own root is)."""

    def epoch_of(self, epoch: int) -> dict[str, Any]:
        return {"status": 1 if any(s.epoch == epoch for s, *_ in self.posts) else 0}


async def test_payout_relay_reads_every_page_and_a_capped_read_posts_nothing_twice(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 42: the relay follows `/payouts` page by page (the committee answers 2 a page
    here, as it answers 1,000 of a longer list): every statement of a 3-page epoch is signed and
    posted once; with `limit=200` the oldest page was never posted. Past `max_pages` it handles
    the newest pages, says so, and the older statement waits for a full pass."""
    from abci_app import query_params, settlement
    from tests.unit.test_abci_pages import query_id, serve

    gas = settlement.BASE_GAS + 3 * settlement.QUERY_GAS  # 3 queries a statement
    monkeypatch.setattr(settlement, "MAX_STATEMENT_GAS", gas)
    chain = settled_chain()
    serve(chain, [(query_id(i), 100 + i) for i in range(1, 9)], per_report=3)
    next_epoch_end(chain)
    monkeypatch.setattr(query_params, "MAX_ITEMS", 2)
    numbers = sorted(s.number for s in (await _listed(chain)))
    assert len(numbers) == 3
    escrow = NumberedEscrow()
    capped = relay(chain, 0, escrow)
    capped.max_pages = 1
    with caplog.at_level("WARNING", logger="node.watcher.payouts"):
        assert await capped.step() == [("signed", n) for n in numbers[1:]]
    assert any("older ones are not signed or posted" in r.getMessage() for r in caplog.records)
    relays = [relay(chain, i, escrow) for i in range(3)]
    for r in relays[:2]:
        await r.step()
    assert await relays[2].step() == [
        step for n in numbers for step in (("signed", n), ("posted", n))
    ]
    for r in [capped, *relays]:
        await r.step()
    assert sorted(s.epoch for s, *_ in escrow.posts) == numbers  # each once


async def _listed(chain: Chain) -> list[Any]:
    from node.chain.committee_pages import read_statements

    listed, whole = await read_statements(ChainLink(chain, 0).query)
    assert whole
    return listed


@dataclass
class CountingLink(ChainLink):
    """Counts the reads of the `/payouts` listing (not of one statement's view)."""

    listings: int = 0

    async def query(self, path: str, **params: Any) -> Any:
        if path == "/payouts" and "epoch" not in params:
            self.listings += 1
        return await super().query(path, **params)


async def test_the_listing_is_read_once_an_epoch_and_a_closed_epoch_is_signed_at_once() -> None:
    """Issue 41: with the pass's committed height known, the relay reads the `/payouts` listing
    once while no epoch closes (was: every pass), and still signs a statement in the first pass
    after its epoch closed."""
    chain = settled_chain()
    length = chain.state.genesis.epoch_length
    link = CountingLink(chain, 0)
    payouts = PayoutRelay(
        committee=link,
        escrow=FakeEscrow(),
        escrow_address=ESCROW,
        operator_key=chain.validators[0].operator_key,
        domain=DOMAIN,
        height=lambda: chain.state.height,
    )
    passes = 0
    while (chain.state.height + 2) % length != 0:  # a new block every pass, no epoch closing
        assert await payouts.step() == []
        chain.block([])
        passes += 1
    assert passes > 1 and link.listings == 1
    _, _, epoch = fees_epoch(chain)
    assert await payouts.step() == [("signed", epoch)]
    assert link.listings == 2
    chain.block([])
    assert await payouts.step() == [] and link.listings == 2  # the same epoch: no new listing


async def test_a_failed_pass_reads_the_listing_again() -> None:
    """A pass that fails (here a statement's view unreadable) forgets the listing it read: the
    next pass lists again (a statement pruned meanwhile is not asked for again)."""
    chain = settled_chain()
    fees_epoch(chain)
    link = CountingLink(chain, 0)
    payouts = PayoutRelay(
        committee=link,
        escrow=FakeEscrow(),
        escrow_address=ESCROW,
        operator_key=chain.validators[0].operator_key,
        domain=DOMAIN,
        height=lambda: chain.state.height,
    )
    real = link.query

    async def unreadable(path: str, **params: Any) -> Any:
        if "epoch" in params:
            raise UnavailableError("validator down")
        return await real(path, **params)

    link.query = unreadable  # type: ignore[method-assign]
    with pytest.raises(UnavailableError):
        await payouts.step()
    link.query = real  # type: ignore[method-assign]
    assert link.listings == 1
    assert len(await payouts.step()) == 1  # signed
    assert link.listings == 2
