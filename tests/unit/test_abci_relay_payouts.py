"""Relays paid out at the epoch close (abci_app/relay_payouts.py, settlement.py; issue 43): a
relay's redeemed credits owe their price to the epoch, and the close pays it as a row for the
relay's staking address on the epoch's pool page, at the credit's price, once; a relay whose
redemption was refused, or that left, gets nothing; a node and a relay of one epoch are both
paid in full; the page's total is the sum of its rows."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from abci_app import schema, settlement
from abci_app.codes import Code
from abci_app.relay_payouts import RelayEarnings
from node.cli.earnings import statements_of
from node.keys import create_wallet, wallet_address
from protocol.committee.registry import Leave
from protocol.committee.relay_credits import RelayRedeem
from protocol.eip712 import address_of
from shares.errors import DuplicateError, PageError
from shares.payouts import ComputeWork, EpochWork, PayerDebit, ShardHealth
from shares.settlement import PageCharges, close_epoch_pages
from tests.committee_chain import Chain, seeded_evm_key
from tests.credit_chain import PRICE, minted, node_chain, redeem, send
from tests.unit.test_abci_relays import add_relay
from tests.unit.test_abci_settlement import ESCROW, net
from tests.unit.test_abci_state import ask

pytestmark = pytest.mark.unit

NODE = address_of(seeded_evm_key("credit-node")).lower()


def account(label: str) -> str:
    return address_of(seeded_evm_key(label)).lower()


def fresh_epoch(chain: Chain) -> int:
    """Advance to the end of the current epoch: the next blocks open a new one; its number."""
    length = chain.state.genesis.epoch_length
    epoch = chain.state.height // length + 1
    chain.advance_to(epoch * length)
    return epoch + 1


def close(chain: Chain, epoch: int) -> dict[str, Any]:
    """Close `epoch` (its blocks must be behind or ahead) and return its page 0."""
    chain.advance_to(epoch * chain.state.genesis.epoch_length)
    return ask(chain, f"/payouts?epoch={epoch}")


def rows_of(payout: dict[str, Any]) -> dict[str, int]:
    return {a: int(amount) for a, amount in payout["rows"]}


def draw_of(payout: dict[str, Any]) -> int:
    pairs = zip(payout["payers"], payout["gateways"], payout["debits"], strict=True)
    return sum(int(d) for p, g, d in pairs if (p, g) == (ESCROW, ESCROW))


def test_a_relay_and_a_node_of_one_epoch_are_both_paid_in_full_once(tmp_path: Path) -> None:
    chain, node = node_chain(tmp_path)
    relay = add_relay(chain, "payout-r1")
    credits, _ = minted(chain, tmp_path, count=5)
    epoch = fresh_epoch(chain)
    done = send(chain, RelayRedeem(tuple(credits[:2])), relay)
    assert done.code == Code.OK, done.log
    assert redeem(chain, node, credits[2:]).code == Code.OK
    assert chain.state.height // chain.state.genesis.epoch_length + 1 == epoch  # one epoch
    payout = close(chain, epoch)
    rows = rows_of(payout)
    # the relay's staking address at the credit's price, the node's three credits beside it
    # at their price less the verifiers' cut
    assert rows == {account("payout-r1"): 2 * PRICE, NODE: net(3)}
    assert int(payout["statement"]["total"]) == sum(rows.values()) == draw_of(payout)
    assert payout["shares"].get(account("payout-r1")) is None  # a row, not a share
    proof = ask(chain, f"/payouts/proof?epoch={epoch}&account={account('payout-r1')}")
    assert proof["amount"] == str(2 * PRICE) and proof["root"] == payout["root"]
    # left in the pool: only the verifiers' part (no verifier: due to the next epoch); every
    # credit paid once, and never again
    cut = str(3 * PRICE - net(3))
    assert chain.state.get(schema.CREDIT_POOL, schema.POOL_BALANCE) == cut
    assert chain.state.get(schema.CREDIT_DUE, schema.epoch_key(epoch + 1)) == cut
    chain.advance_to((epoch + 2) * chain.state.genesis.epoch_length)
    listing = [int(s["epoch"]) for s in ask(chain, "/payouts?limit=200")["epochs"]]
    statements = [ask(chain, f"/payouts?epoch={number}") for number in listing]
    assert [p["epoch"] for p in statements if account("payout-r1") in rows_of(p)] == [epoch]
    # `planet earnings` / `claim --home <relay home>` read the rows of the home's staking
    # wallet (the address the relay registered with): the relay's pay is listed for it
    create_wallet(tmp_path / "relay-home" / "wallet.json", "pw", seeded_evm_key("payout-r1"))
    assert wallet_address(tmp_path / "relay-home" / "wallet.json").lower() == account("payout-r1")
    listed = asyncio.run(statements_of(_Link(chain).query, account("payout-r1")))
    assert [(s["epoch"], s["amount"]) for s in listed if s["amount"] != "0"] == [
        (epoch, str(2 * PRICE))
    ]
    # /relay_credits still tells what it redeemed then
    assert ask(chain, f"/relay_credits?key={relay.verify_key.encode().hex()}")["epochs"] == [
        {"epoch": epoch, "credits": 2}
    ]


class _Link:
    """The query side of `CommitteeLink` over the in-process chain."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain

    async def query(self, path: str, **params: Any) -> Any:
        return ask(self.chain, path + ("?" + urlencode(params) if params else ""))


def test_a_relay_alone_in_an_epoch_is_paid_and_the_page_total_is_its_rows(
    tmp_path: Path,
) -> None:
    chain, _ = node_chain(tmp_path)
    first, second = add_relay(chain, "payout-r2"), add_relay(chain, "payout-r3")
    credits, _ = minted(chain, tmp_path, count=4)
    epoch = fresh_epoch(chain)
    results = chain.block(
        [
            chain.tx(RelayRedeem((credits[0],)), first),
            chain.tx(RelayRedeem(tuple(credits[1:])), second),
        ]
    )
    assert [r.code for r in results] == [Code.OK, Code.OK]
    payout = close(chain, epoch)
    rows = rows_of(payout)
    assert rows == {account("payout-r2"): PRICE, account("payout-r3"): 3 * PRICE}
    assert int(payout["statement"]["total"]) == sum(rows.values()) == draw_of(payout) == 4 * PRICE
    assert chain.state.get(schema.CREDIT_POOL, schema.POOL_BALANCE) == "0"


def test_a_refused_or_departed_relay_gets_nothing_and_the_credit_pays_once(
    tmp_path: Path,
) -> None:
    chain, node = node_chain(tmp_path)
    paid, refused = add_relay(chain, "payout-r4"), add_relay(chain, "payout-r5")
    gone = add_relay(chain, "payout-r6")
    credits, _ = minted(chain, tmp_path, count=3)
    assert send(chain, Leave(), gone).code == Code.OK
    epoch = fresh_epoch(chain)
    assert send(chain, RelayRedeem((credits[0],)), paid).code == Code.OK
    # the same credit to another relay, a relay that left, and then the node
    assert send(chain, RelayRedeem((credits[0],)), refused).code == Code.CREDIT_SPENT
    assert send(chain, RelayRedeem((credits[1],)), gone).code == Code.INVALID_LIFECYCLE
    assert redeem(chain, node, [credits[0]]).code == Code.CREDIT_SPENT
    assert redeem(chain, node, [credits[1]]).code == Code.OK  # the departed relay's credit
    payout = close(chain, epoch)
    rows = rows_of(payout)
    assert rows == {account("payout-r4"): PRICE, NODE: net(1)}
    assert int(payout["statement"]["total"]) == sum(rows.values()) == PRICE + net(1)


def test_the_relays_are_paid_first_and_by_credits_when_the_draw_falls_short() -> None:
    earnings = RelayEarnings({"0x" + "a" * 40: 1, "0x" + "b" * 40: 3}, {}, 10)
    assert earnings.owed == 40
    assert earnings.rows(40) == (("0x" + "a" * 40, 10), ("0x" + "b" * 40, 30))
    assert earnings.rows(50) == earnings.rows(40)  # never above the credits' price
    assert earnings.rows(9) == (("0x" + "a" * 40, 2), ("0x" + "b" * 40, 7))
    assert sum(a for _, a in earnings.rows(9)) == 9
    assert earnings.rows(0) == ()


def test_a_close_that_draws_nothing_moves_the_relays_credits_once(tmp_path: Path) -> None:
    chain, _ = node_chain(tmp_path)
    relay = add_relay(chain, "payout-r7")
    credits, _ = minted(chain, tmp_path, count=2)
    epoch = fresh_epoch(chain)  # the purchase was debited into the pool by that close
    assert chain.state.get(schema.CREDIT_POOL, schema.POOL_BALANCE) == str(2 * PRICE)
    assert send(chain, RelayRedeem(tuple(credits)), relay).code == Code.OK
    # the close, in process, over a pool the committee counts empty: nothing to draw
    length = chain.state.genesis.epoch_length
    chain.advance_to(epoch * length - 1)
    state = chain.state
    state.begin_block(epoch * length, b"\x00" * 32, chain.time_s)
    state.put(schema.CREDIT_POOL, schema.POOL_BALANCE, "0")
    settlement.close(state, epoch * length)
    assert state.get(schema.PAYOUT, schema.epoch_key(epoch)) is None
    moved = state.get(schema.RELAY_PAY, schema.in_epoch(epoch + 1, account("payout-r7")))
    assert moved == {"account": account("payout-r7"), "credits": 2, "carried": 2}
    assert state.get(schema.CREDIT_DUE, schema.epoch_key(epoch + 1)) == str(2 * PRICE)
    # moved once: the next close with nothing to draw drops them (their price stays due)
    settlement.close(state, (epoch + 1) * length)
    assert state.get(schema.RELAY_PAY, schema.in_epoch(epoch + 2, account("payout-r7"))) is None


def _work() -> EpochWork:
    node = "0x" + "1" * 40
    return EpochWork(
        epoch=3,
        queries=(),
        compute=(ComputeWork(node, "m", 0, 1, 10),),
        health=(ShardHealth("m", 0, 3),),
    )


def test_direct_rows_are_paid_first_and_merged_into_the_pool_pages() -> None:
    draw = PayerDebit(ESCROW, ESCROW, 100)
    relay, node = "0x" + "2" * 40, "0x" + "1" * 40
    [statement] = close_epoch_pages(_work(), [PageCharges(3, debits=(draw,))], ((relay, 30),))
    assert statement.rows == ((node, 70), (relay, 30))
    assert statement.total == 100 == sum(a for _, a in statement.rows)
    assert statement.table.compute_shares.keys() == {node}
    # all of it direct: no share needed, no table
    [only] = close_epoch_pages(
        EpochWork(epoch=3, queries=(), compute=()),
        [PageCharges(3, debits=(draw,))],
        ((relay, 100),),
    )
    assert only.rows == ((relay, 100),) and only.total == 100
    with pytest.raises(PageError, match="direct"):
        close_epoch_pages(_work(), [PageCharges(3, debits=(draw,))], ((relay, 101),))
    with pytest.raises(DuplicateError):
        close_epoch_pages(_work(), [PageCharges(3, debits=(draw,))], ((relay, 1), (relay, 2)))


def _close_in_process(chain: Chain, epoch: int, slashed: list[str]) -> Any:
    """The close of `epoch` run in process, with `slashed` accounts' verdicts confirmed in it;
    the state after it (uncommitted)."""
    length = chain.state.genesis.epoch_length
    chain.advance_to(epoch * length - 1)
    state = chain.state
    state.begin_block(epoch * length, b"\x00" * 32, chain.time_s)
    for who in slashed:
        state.put(schema.SLASHED, schema.in_epoch(epoch, who), ["failed_verification"])
    settlement.close(state, epoch * length)
    return state


def test_a_slashed_node_never_voids_a_relay_nor_a_slashed_relay_a_node(tmp_path: Path) -> None:
    for slashed, paid in ((NODE, account("payout-r8")), (account("payout-r8"), NODE)):
        chain, node = node_chain(tmp_path / slashed)
        relay = add_relay(chain, "payout-r8")
        credits, _ = minted(chain, tmp_path / slashed, count=3)
        epoch = fresh_epoch(chain)
        assert send(chain, RelayRedeem((credits[0],)), relay).code == Code.OK
        assert redeem(chain, node, credits[1:]).code == Code.OK
        state = _close_in_process(chain, epoch, [slashed])
        page = state.get(schema.PAYOUT, schema.epoch_key(epoch))
        rows = {a: int(amount) for a, amount in page["rows"]}
        assert slashed not in rows and int(page["total"]) == sum(rows.values())
        # a slashed account's credits are not drawn: their price stays in the pool, due to
        # nobody (before issue 42 a slashed relay's went to the node)
        if paid == NODE:  # the node its two credits less the cut (the cut due, no verifier)
            assert rows == {NODE: net(2)}
            due = 2 * PRICE - net(2)
        else:  # the relay in full; the slashed node's two credits owed to nobody
            assert rows == {paid: PRICE}
            due = 0
        assert int(state.get(schema.CREDIT_DUE, schema.epoch_key(epoch + 1)) or 0) == due
        assert state.get(schema.CREDIT_POOL, schema.POOL_BALANCE) == str(
            3 * PRICE - sum(rows.values())
        )
