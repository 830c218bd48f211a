"""A node takes a credit only while the chain will still redeem it when the node gets to it
(issue 42, attack 9): the credit's window is read against the committee's latest committed height
as the chain answers it at the moment of acceptance (`/credit_spent`), never against the node's
epoch cache, which may be up to `refresh_s` (5 s) behind. The rule (protocol/credits.py
`takeable`): at committed height h, a credit of issue epoch e (its key period's last block's) is
taken iff its period has started and h + M ≤ (e + lifetime)·L, M the node's redemption delay in
blocks (`--credit-margin-blocks`).

Against the in-process committee chain (abci_app's state machine) and the node's real
`Payments`/`CreditCheck`: every credit the node takes is redeemed by the chain at the latest
block the margin allows; every credit it refuses near the window's end is refused by name."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from node.client.credit_wallet import CreditWallet
from node.client.paying import CreditExpiry
from node.server.config import ServerConfig
from node.server.payments import Account, CreditCheck, CreditRefusedError, CreditSpool, Payments
from protocol.credits import (
    NODE_MARGIN_BLOCKS,
    ChainClock,
    CreditExpiringError,
    clock_from_query,
    oldest_takeable_epoch,
    takeable,
    window_end,
)
from protocol.errors import ProtocolError
from tests.credit_chain import minted, node_chain, redeem
from tests.unit.test_abci_settlement import ask
from tests.unit.test_credit_till import ChainLink

pytestmark = pytest.mark.unit

PRICE = 16
LIFETIME = 2


def test_the_rule_is_the_chains_window_less_the_margin() -> None:
    """`takeable` over every height around a window's end, several margins and epoch lengths:
    true exactly when the next block's epoch has reached e and a redemption landing M blocks
    on is still in epoch e + lifetime (the chain's `redeemable` at that block)."""
    for length in (1, 3, 5, 20):
        for margin in (1, 2, 7, 60):
            for epoch in (1, 2, 9):
                for height in range(0, (epoch + LIFETIME + 2) * length + margin + 2):
                    clock = ChainClock(height, length, LIFETIME)
                    lands = height + margin  # the latest block the node's redeem lands in
                    lands_epoch = max(1, (lands - 1) // length + 1)
                    chain_redeems = lands_epoch - LIFETIME <= epoch <= lands_epoch
                    expected = epoch <= clock.epoch and chain_redeems
                    assert takeable(epoch, clock, margin) is expected, (length, margin, height)
                    oldest = oldest_takeable_epoch(clock, margin)
                    assert (epoch >= oldest) is (height + margin <= window_end(epoch, 2, length))


async def test_a_credit_near_its_windows_end_is_refused_by_name_and_one_taken_is_redeemed(
    tmp_path: Path,
) -> None:
    """The chain walks block by block up to and past a credit epoch's window end. At each
    committed height the node is shown a fresh credit of that epoch; its epoch cache was read
    once, at the start, and is never due again (refresh 1 hour: the stale cache of the attack).
    A credit it takes is redeemed `margin` blocks later — the worst delay it promised — and the
    chain accepts every one; a credit it refuses is refused `credit_expiring` (or, past the
    window, `credit_refused`), never taken."""
    chain, node = node_chain(tmp_path, lifetime_epochs=LIFETIME)
    length = chain.state.genesis.epoch_length
    margin = 3
    credits, req = minted(chain, tmp_path, count=14)
    epoch = ask(chain, f"/mints?id={req.mint_id}")["issue_epoch"]  # its key period's last
    end = window_end(epoch, LIFETIME, length)
    check = CreditCheck(ChainLink(chain, node), refresh_s=3600.0, margin_blocks=margin)
    payments = Payments(PRICE, check, CreditSpool(tmp_path / "spool"), wait_s=0.1)
    await check.current_epoch()  # the cache, read once now: from here on it is stale
    chain.advance_to(end - margin - 6)
    due: dict[int, list] = {}  # the height whose block redeems them → credits taken
    taken, refused = 0, []
    for credit in credits:
        height = chain.state.height
        try:
            await payments.accept(Account(), credit)
        except (CreditRefusedError, CreditExpiringError) as error:
            refused.append((height, error.code))
            assert height + margin > end, f"refused at {height}: {error.message}"
            assert error.code == ("credit_expiring" if height < end else "credit_refused")
        else:
            assert height + margin <= end, f"taken at {height}, past the margin of {end}"
            taken += 1
            due.setdefault(height + margin, []).append(credit)
        # the chain moves on one block, redeeming what falls due at that block
        lands = chain.state.height + 1
        if lands in due:
            result = redeem(chain, node, due.pop(lands))  # a commit and the redeem: one block
            assert result.code == 0, f"a credit taken was not redeemable at {lands}: {result.log}"
        else:
            chain.block()
    assert taken == 7 and not due  # heights end-M-6 … end-M took one each; all redeemed
    codes = [code for _, code in refused]
    # end − M < h < end: expiring; from h = end on no later block redeems it: refused
    assert codes.count("credit_expiring") == margin - 1 and codes.count("credit_refused") == 5


async def test_the_stale_cache_no_longer_lets_an_expired_credit_in(tmp_path: Path) -> None:
    """The attack as filed: the node read the epoch just before the window closed; the chain
    moves past it within the cache's 5 s; a client shows a credit of that window. Before, the
    node took it (and then could not redeem it: CREDIT_EPOCH); now it is refused by name."""
    chain, node = node_chain(tmp_path, lifetime_epochs=LIFETIME)
    length = chain.state.genesis.epoch_length
    credits, req = minted(chain, tmp_path, count=2)
    end = window_end(ask(chain, f"/mints?id={req.mint_id}")["issue_epoch"], LIFETIME, length)
    check = CreditCheck(ChainLink(chain, node), margin_blocks=1)  # default refresh: 5 s
    payments = Payments(PRICE, check, CreditSpool(tmp_path / "spool"), wait_s=0.1)
    chain.advance_to(end - 1)
    with pytest.raises(CreditExpiringError):  # a node with margin 2: expiring, by name
        await CreditCheck(ChainLink(chain, node), margin_blocks=2).check(credits[1])
    await payments.accept(Account(), credits[0])  # the next block is the last to redeem it
    assert redeem(chain, node, [credits[0]]).code == 0  # ... and it does
    chain.advance_to(end)  # the window's last block is committed: no later block redeems it
    with pytest.raises(CreditRefusedError) as late:
        await payments.accept(Account(), credits[1])
    assert late.value.code == "credit_refused" and f"up to height {end}" in late.value.message
    assert redeem(chain, node, [credits[1]]).code != 0  # the chain agrees: CREDIT_EPOCH


async def test_the_client_drops_credits_the_nodes_would_refuse_soon(tmp_path: Path) -> None:
    """The personal client and the hosted gateway keep no credit nodes refuse `credit_expiring`:
    `CreditExpiry` drops those whose window ends within its margin of the chain's height."""
    chain, node = node_chain(tmp_path, lifetime_epochs=LIFETIME)
    length = chain.state.genesis.epoch_length
    credits, req = minted(chain, tmp_path, count=3)
    wallet = CreditWallet(tmp_path / "credits.json")
    wallet.add(credits)
    link = ChainLink(chain, node)
    end = window_end(ask(chain, f"/mints?id={req.mint_id}")["issue_epoch"], LIFETIME, length)
    expiry = CreditExpiry(wallet, link.query, every_s=0.0, margin=4)
    chain.advance_to(end - 4)
    assert await expiry.check() == 0 and wallet.count() == 3  # h + 4 ≤ end: nodes take them
    chain.block()
    assert await expiry.check() == 3 and wallet.count() == 0


def test_a_node_needs_a_margin_of_a_block_and_a_validator_that_says_its_height() -> None:
    with pytest.raises(ValueError, match="≥ 1"):
        CreditCheck(ChainLink.__new__(ChainLink), margin_blocks=0)
    defaults = {f.name: f.default for f in fields(ServerConfig)}
    assert defaults["credit_margin_blocks"] == NODE_MARGIN_BLOCKS  # one default, two homes
    with pytest.raises(ProtocolError, match="committed_height"):
        clock_from_query({"epoch": 3, "lifetime_epochs": 2, "epoch_length": 5})
    with pytest.raises(ProtocolError, match="epoch_length"):
        clock_from_query({"committed_height": 3, "lifetime_epochs": 2, "epoch_length": True})
