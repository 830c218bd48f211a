"""A node's credit till (node/agent/credit_till.py) against the in-process committee chain: it
takes only credits the chain would take, refuses a credit shown twice, redeems in batches and
drops a credit another node redeemed first without losing the rest of its batch."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from nacl.signing import SigningKey

from abci_app.queries import query
from node.agent.credit_till import CreditRefused, CreditTill
from protocol.committee.credits import CreditRedeem
from protocol.credits import NODE_MARGIN_BLOCKS, CreditExpiringError, window_end
from protocol.paid_credits import CreditInvalidError
from tests.committee_chain import Chain
from tests.credit_chain import minted, node_chain
from tests.unit.test_abci_settlement import ask
from tests.unit.test_abci_state import commit_served, make_routable, price_txs, register

pytestmark = pytest.mark.unit


class ChainLink:
    """The part of `CommitteeLink` the till uses, over an in-process chain (one block per tx)."""

    def __init__(self, chain: Chain, key: SigningKey) -> None:
        self.chain = chain
        self.key = key
        self.results: dict[str, tuple[int, str]] = {}

    async def query(self, path: str, **params: Any) -> Any:
        query_string = "&".join(f"{k}={v}" for k, v in params.items())
        code, value, log = query(self.chain.state, f"{path}?{query_string}", b"")
        assert code == 0, log
        return json.loads(value)

    async def submit(self, body: Any) -> Any:
        [result] = self.chain.block([self.chain.tx(body, self.key)])
        tx_hash = str(len(self.results))
        self.results[tx_hash] = (result.code, result.log)
        return SimpleNamespace(hash=tx_hash)

    async def committed_code(self, tx_hash: str, *, timeout_s: float = 15.0) -> tuple[int, str]:
        return self.results[tx_hash]


async def test_till_accepts_valid_credits_once_and_redeems_them(tmp_path: Path) -> None:
    chain, node = node_chain(tmp_path)
    credits, _ = minted(chain, tmp_path, count=3)
    till = CreditTill(ChainLink(chain, node), "m", 0, per_tx=2)
    for credit in credits:
        await till.accept(credit)
    with pytest.raises(CreditRefused):
        await till.accept(credits[0])
    with pytest.raises(CreditInvalidError, match="does not verify"):
        await till.accept(replace(credits[1], signature=credits[2].signature))
    # the node's commitments are not on the chain yet: refused, and every credit kept
    assert await till.redeem() == 0
    assert till.held == credits
    commit_served(chain, node, 0, blocks=1)
    assert await till.redeem() == 3
    assert till.held == []


async def test_till_drops_a_credit_spent_elsewhere_and_redeems_the_rest(tmp_path: Path) -> None:
    chain, node = node_chain(tmp_path)
    other = register(chain, "other-node", shards=(0,))
    make_routable(chain, other)
    credits, _ = minted(chain, tmp_path, count=3)
    till = CreditTill(ChainLink(chain, node), "m", 0)
    for credit in credits:
        await till.accept(credit)
    # the client also paid another node with the middle credit, which redeemed it first
    commit_served(chain, other, 0, blocks=1)
    commit_served(chain, node, 0, blocks=1)
    priced = price_txs(chain, other)
    *_, first = chain.block([*priced, chain.tx(CreditRedeem("m", 0, (credits[1],)), other)])
    assert first.code == 0, first.log
    assert await till.redeem() == 2
    assert till.held == []


async def test_till_refuses_a_credit_past_its_window(tmp_path: Path) -> None:
    """The window is the chain's genesis `lifetime_epochs` (here 3) after the credit's issue
    epoch e (its key period's last block's): … e + 3."""
    chain, node = node_chain(tmp_path, lifetime_epochs=3)
    credits, req = minted(chain, tmp_path, count=2)
    issue = ask(chain, f"/mints?id={req.mint_id}")["issue_epoch"]
    length = chain.state.genesis.epoch_length
    chain.advance_to((issue + 2) * length + 1)  # e + 3
    till = CreditTill(ChainLink(chain, node), "m", 0, margin_blocks=1)
    await till.accept(credits[1])
    chain.advance_to((issue + 3) * length + 1)  # e + 4
    with pytest.raises(CreditRefused, match="redeemable up to height"):
        await till.accept(credits[0])


async def test_till_refuses_a_credit_whose_window_closes_within_its_margin(tmp_path: Path) -> None:
    """Attack 9 at the till: the window is read against the chain's latest committed height
    when the credit is shown, less the till's redemption delay M (`margin_blocks`, default
    NODE_MARGIN_BLOCKS): at h = end − M the credit is taken and the chain redeems it M blocks
    on; at h = end − M + 1 … end − 1 it is refused `credit_expiring` by name (at end, as past
    its window)."""
    chain, node = node_chain(tmp_path, lifetime_epochs=3)
    credits, req = minted(chain, tmp_path, count=3)
    issue = ask(chain, f"/mints?id={req.mint_id}")["issue_epoch"]
    end = window_end(issue, 3, chain.state.genesis.epoch_length)
    margin = 4
    till = CreditTill(ChainLink(chain, node), "m", 0, margin_blocks=margin)
    assert till.margin_blocks == margin and CreditTill(till.link, "m", 0).margin_blocks == (
        NODE_MARGIN_BLOCKS
    )
    for height in range(end - margin + 1, end):
        chain.advance_to(height)
        with pytest.raises(CreditExpiringError, match=f"up to height {end}") as refused:
            await till.accept(credits[1])
        assert refused.value.code == "credit_expiring"
    chain.advance_to(end)  # no later block redeems it: refused as past its window
    with pytest.raises(CreditRefused, match=f"redeemable up to height {end}"):
        await till.accept(credits[1])
    assert till.held == []
    # the same credit shown M blocks before the end is taken, and redeemed at the last block
    chain, node = node_chain(tmp_path / "again", lifetime_epochs=3)
    credits, req = minted(chain, tmp_path / "again", count=1)
    issue = ask(chain, f"/mints?id={req.mint_id}")["issue_epoch"]
    end = window_end(issue, 3, chain.state.genesis.epoch_length)
    till = CreditTill(ChainLink(chain, node), "m", 0, margin_blocks=margin)
    chain.advance_to(end - margin)
    await till.accept(credits[0])
    commit_served(chain, node, 0, blocks=1)
    chain.advance_to(end - 1)
    assert await till.redeem() == 1 and chain.state.height == end


async def test_till_redeems_what_its_commitments_pay_for_at_its_price_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    """A batch the node's commitments pay for only in part at its registered price is refused
    REDEMPTION_OVER_PRICE ("at most K credits"): the till sends K, keeps the rest for later."""
    from protocol.committee.prices import SetPrice

    chain, node = node_chain(tmp_path, price=None, heartbeat_timeout=10_000)
    credits, _ = minted(chain, tmp_path, count=3)
    [priced] = chain.block([chain.tx(SetPrice("m", 0, 64), node)])
    assert priced.code == 0, priced.log
    till = CreditTill(ChainLink(chain, node), "m", 0)
    for credit in credits:
        await till.accept(credit)
    commit_served(chain, node, 0, blocks=2)  # one session of 64 positions: 127 at 64 → one
    assert await till.redeem() == 1
    assert till.held == credits[1:]
    commit_served(chain, node, 0, blocks=4)  # another: 63 left + 128 + 63 → two more
    assert await till.redeem() == 2 and till.held == []
