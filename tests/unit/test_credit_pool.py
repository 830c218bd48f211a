"""Who a credit purchase pays (abci_app/settlement.py, QueryEscrow's credit pool): a funded mint
is debited from its payer at the next close, into the escrow's credit pool; the pool pays each
redeemed credit to the node that redeemed it, at its price less the verifiers' cut, in the
close of the epoch that redeemed it (the cut to that epoch's verifiers; with none it stays
due). The price of credits that expired unredeemed stays in the pool (its reserve). Nothing
else is paid from it: a purchase never pays the epoch it was bought in, and the pool never pays
more than it got.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from abci_app.codes import Code
from abci_app.queries import query
from abci_app.schema import epoch_key
from protocol.blind_bls import ThresholdCredit
from protocol.eip712 import address_of
from protocol.threshold_mint import issue_epoch
from tests.committee_chain import Chain, seeded_evm_key
from tests.credit_chain import (
    PAYER,
    PRICE,
    SCHEDULE,
    close_last_blocks_epoch,
    minted,
    node_chain,
    redeem,
)
from tests.unit.test_abci_credits import _pairs, _statements
from tests.unit.test_abci_settlement import ESCROW, ask, net, next_epoch_end

pytestmark = pytest.mark.unit

NODE = address_of(seeded_evm_key("credit-node")).lower()
BUYER = address_of(PAYER).lower()


def bought(payout: dict) -> int:
    return sum(int(d) for (p, g), d in _pairs(payout).items() if g == ESCROW and p != ESCROW)


def drawn(payout: dict) -> int:
    return int(_pairs(payout).get((ESCROW, ESCROW), 0))


def statement(chain: Chain, epoch: int) -> dict:
    return ask(chain, f"/payouts?epoch={epoch}")


def pool(chain: Chain) -> int:
    return int(chain.state.get("cpool", "balance") or 0)


def due(chain: Chain) -> int:
    """Wei due to later epochs (`cdue/`)."""
    return sum(int(wei) for _, wei in chain.state.items("cdue"))


def epoch_of_last_block(chain: Chain) -> int:
    return (chain.state.height - 1) // chain.state.genesis.epoch_length + 1


def test_a_purchase_pays_the_epochs_that_redeem_its_credits_not_the_one_it_was_bought_in(
    tmp_path: Path,
) -> None:
    """The defect this fixes: a mint's whole charge was paid to the first epoch that settled
    anything, and later redemptions found nothing to pay them."""
    chain, node = node_chain(tmp_path)
    credits, _ = minted(chain, tmp_path, count=3)
    first = close_last_blocks_epoch(chain)
    bought_in = statement(chain, first)  # bought, nothing redeemed: into the pool, no rows
    assert (bought(bought_in), drawn(bought_in)) == (3 * PRICE, 0)
    assert bought_in["statement"]["total"] == "0" and bought_in["rows"] == []
    assert pool(chain) == 3 * PRICE
    for epoch, spent in ((first + 1, credits[:1]), (first + 2, credits[1:])):
        assert redeem(chain, node, spent).code == Code.OK
        assert close_last_blocks_epoch(chain) == epoch
        payout = statement(chain, epoch)
        assert (bought(payout), drawn(payout)) == (0, net(len(spent)))
        assert dict(payout["rows"]) == {NODE: str(net(len(spent)))}
    # the verifiers' part (no verifier in these epochs) is still in the pool, and due
    assert pool(chain) == 3 * PRICE - net(3) == due(chain)


def test_a_statement_of_purchases_only_has_no_rows_and_no_proof(tmp_path: Path) -> None:
    chain, _ = node_chain(tmp_path)
    minted(chain, tmp_path, count=2)
    epoch = close_last_blocks_epoch(chain)
    payout = statement(chain, epoch)
    assert payout["rows"] == [] and int(payout["statement"]["root"], 16) != 0
    code, _, log = query(chain.state, f"/payouts/proof?epoch={epoch}&account={NODE}", b"")
    assert code == Code.NOT_FOUND, log


def test_expired_credits_stay_in_the_pool_and_pay_nobody(tmp_path: Path) -> None:
    """Credits of a key period count in its issue epoch m (its last block's): redeemable until
    m + lifetime; the price of those nobody redeemed is not drawn: it stays in the pool (before
    issue 42 it was split over the workers of epoch m + lifetime by their shares)."""
    chain, node = node_chain(tmp_path, lifetime_epochs=2)
    credits, req = minted(chain, tmp_path, count=4)
    assert redeem(chain, node, credits[:1]).code == Code.OK
    m = ask(chain, f"/mints?id={req.mint_id}")["issue_epoch"]
    bought_in = close_last_blocks_epoch(chain)
    assert bought_in < m
    payout = statement(chain, bought_in)  # bought and one redeemed in one statement
    assert (bought(payout), drawn(payout)) == (4 * PRICE, net(1))
    while chain.state.height < (m + 1) * chain.state.genesis.epoch_length:  # to m + 1: nothing
        next_epoch_end(chain)
    assert ask(chain, "/payouts?limit=200")["epochs"][0]["epoch"] == bought_in
    # epoch m + 2, the last of the window: one more redeemed, the two left expire at its close
    assert redeem(chain, node, credits[3:]).code == Code.OK
    assert close_last_blocks_epoch(chain) == m + 2
    payout = statement(chain, m + 2)
    assert (bought(payout), drawn(payout)) == (0, net(1))
    assert dict(payout["rows"]) == {NODE: str(net(1))}
    assert chain.state.get("cissue", epoch_key(m)) is None
    # in the pool: the two expired credits (drawn by nobody) and the verifiers' part, due
    assert pool(chain) == 4 * PRICE - 2 * net(1) == 2 * PRICE + due(chain)
    late = redeem(chain, node, credits[1:2])
    assert late.code == Code.CREDIT_EPOCH, late.log


@pytest.mark.parametrize("seed", [3, 11, 2026])
def test_random_purchases_and_redemptions_every_credit_paid_once(tmp_path: Path, seed: int) -> None:
    """Random mints, redemptions and idle epochs; then every credit's window ends. Each close:
    the pool never pays out more than purchases put in (statement by statement, in order) and
    the chain's pool is what the statements moved. At the end every purchase was debited once,
    every redeemed credit paid its node once at its price less the verifiers' cut, and what
    was not drawn is in the pool: the verifiers' part (no verifier here: still due) and the
    expired credits. Σ draws + pool == Σ purchases == Σ funded."""
    rng = random.Random(seed)
    lifetime = 3
    chain, node = node_chain(tmp_path, lifetime_epochs=lifetime, retention_epochs=100)
    length = chain.state.genesis.epoch_length
    held: list[ThresholdCredit] = []
    funded = redeemed_count = 0
    for _ in range(8):
        action = rng.choice(["buy", "redeem", "idle"])
        if action == "buy":
            count = rng.randint(1, 3)
            credits, _ = minted(chain, tmp_path, count=count)
            held += credits
            funded += count * PRICE
        elif action == "redeem" and held:
            current = epoch_of_last_block(chain) + 1
            live = [
                c for c in held if issue_epoch(SCHEDULE, c.period, length) + lifetime >= current
            ]
            spend = live[: rng.randint(1, 2)]
            if spend:
                assert redeem(chain, node, spend).code == Code.OK
                redeemed_count += len(spend)
                held = [c for c in held if c not in spend]
        close_last_blocks_epoch(chain)
        _check_pool(chain)
    for _ in range(lifetime + 2):
        next_epoch_end(chain)
    statements = _check_pool(chain)
    assert sum(bought(s) for s in statements) == funded
    paid = sum(int(a) for s in statements for account, a in s["rows"] if account == NODE)
    assert sum(drawn(s) for s in statements) == paid == net(redeemed_count)
    assert pool(chain) == funded - paid
    assert due(chain) == redeemed_count * PRICE - paid  # the verifiers' part, waiting
    assert chain.state.items("cpend") == []


def _check_pool(chain: Chain) -> list[dict]:
    statements = sorted(_statements(chain), key=lambda s: int(s["epoch"]))
    balance = 0
    for payout in statements:
        balance += bought(payout)
        balance -= drawn(payout)
        assert balance >= 0, payout["epoch"]
        assert int(payout["statement"]["total"]) == sum(int(a) for _, a in payout["rows"])
    assert balance == pool(chain)
    return statements
