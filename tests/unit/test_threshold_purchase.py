"""The default purchase path once the key period's committee key is formed: `buy_credits`
mints ONE list (`credit_mint`), gathers the validators' partials, combines and unblinds them
into threshold credits in the wallet; `--min-anonymity` refuses a period with too few buyers;
a node's `CreditCheck` and the agent's till take the credits and redeem them as `credit_redeem`.
The chain is the in-process committee app with its DKG played (tests/unit/test_credit_dkg_chain)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from abci_app.codes import Code
from abci_app.threshold_queries import partials
from node.agent.credit_till import CreditTill
from node.client import credit_purchase
from node.client.credit_wallet import CreditWallet
from node.client.mint_request import AnonymitySetTooSmall
from node.server.payments import CreditCheck
from protocol.blind_bls import ThresholdCredit
from protocol.committee.credits import CreditMint, CreditRedeem, FundMint
from protocol.paid_credits import CreditInvalidError
from protocol.threshold_mint import threshold_mint_id
from tests.credit_chain import PAYER, post_with
from tests.unit.test_credit_purchase_resume import ChainLink
from tests.unit.test_threshold_credits_chain import keyed_chain

pytestmark = pytest.mark.unit


class FundingLink(ChainLink):
    """Each mint that lands is vouched for by every validator in the next block (their
    watchers, node/watcher/funding.py, once the payer's balance covers it)."""

    stores: list[Any]

    async def submit(self, body: Any) -> Any:
        sent = await super().submit(body)
        if isinstance(body, CreditMint) and self.results[sent.hash][0] == Code.OK:
            mint_id = threshold_mint_id(body.payer, body.period, body.blinded)
            chain = self.chain
            chain.block([chain.tx(FundMint(mint_id), v.key) for v in chain.validators])
            post_with(chain, self.stores, mint_id)  # then each one's watcher posts its partials
        return sent


def _wire(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, FundingLink, Any]:
    chain, stores, node = keyed_chain(tmp_path)
    link = FundingLink(chain)
    link.stores = stores
    monkeypatch.setattr(credit_purchase, "CommitteeLink", lambda *a, **k: link)

    def gather(*_: Any) -> Any:
        async def run(mint_id: str, enough: int | None = None) -> list[dict]:
            answers = [partials(chain.state, store, {"mint": mint_id}) for store in stores]
            return answers if enough is None else answers[:enough]

        return run

    monkeypatch.setattr(credit_purchase, "partials_from", gather)
    return chain, link, node


def test_buy_mints_one_list_and_the_node_takes_and_redeems_the_credits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chain, link, _ = _wire(tmp_path, monkeypatch)
    wallet = CreditWallet(tmp_path / "credits.json")
    bought = asyncio.run(
        credit_purchase.buy_credits(["http://v"], PAYER, 3, wallet, expiry=1_800_003_600)
    )
    assert len(bought) == 3 and all(isinstance(c, ThresholdCredit) for c in bought)
    assert wallet.count() == 3 and wallet.pending() == []
    reread = CreditWallet(tmp_path / "credits.json").take(3)  # the file holds them as such
    assert reread == bought
    check = CreditCheck(link)
    asyncio.run(check.check(bought[0]))
    forged = ThresholdCredit(bought[0].period, bought[1].nonce, bought[0].signature)
    with pytest.raises(CreditInvalidError):
        asyncio.run(check.check(forged))
    sent: list[Any] = []

    class Recording(ChainLink):
        async def submit(self, body: Any) -> Any:
            sent.append(body)
            return await super().submit(body)

    till = CreditTill(Recording(chain), "m", 0)
    for credit in bought:
        asyncio.run(till.accept(credit))
    asyncio.run(till.redeem())  # (refused: this link's key is no node; the body is the point)
    assert isinstance(sent[0], CreditRedeem) and len(sent[0].credits) == 3


def test_min_anonymity_refuses_a_period_with_too_few_buyers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, link, _ = _wire(tmp_path, monkeypatch)
    wallet = CreditWallet(tmp_path / "credits.json")
    with pytest.raises(AnonymitySetTooSmall) as small:
        asyncio.run(
            credit_purchase.buy_credits(
                ["http://v"], PAYER, 1, wallet, expiry=1_800_003_600, min_anonymity=2
            )
        )
    assert "0 other buyers" in small.value.message and small.value.hint
    assert link.submitted == 0 and wallet.pending() == []  # nothing sent, nothing held
    asyncio.run(credit_purchase.buy_credits(["http://v"], PAYER, 1, wallet, expiry=1_800_003_600))
    assert link.chain.state.committed("cbuyers", "000000000000") == 1
