"""The client's `CreditPayer` bookkeeping alone: a credit a hop refuses `credit_not_taken` comes
back into the wallet whether the refusal comes while its session runs or after it closed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from node.client.circuit import CircuitClient
from node.client.credit_wallet import CreditWallet
from node.client.paying import CLOSED_KEPT, CreditPayer
from node.client.types import Hop
from protocol.paid_credits import parse_paid_credit, spent_id
from tests.credit_fakes import fake_credits

pytestmark = pytest.mark.unit

URLS = ["http://a:1", "http://b:2"]


def _payer(tmp_path: Path, count: int) -> CreditPayer:
    wallet = CreditWallet(tmp_path / "credits.json")
    wallet.add(fake_credits(count))
    return CreditPayer(wallet, {url: 8 for url in URLS}, min_positions=8)


def _pay(payer: CreditPayer, sid: int, used: int) -> list[str]:
    """Pay `sid`'s hops for `used` positions; the spent ids sent, hop by hop."""
    sent = []
    for index, credits in enumerate(payer.take(payer.due(sid, URLS, used))):
        for credit in credits:
            payer.paid(sid, index, URLS[index], credit)
            sent.append(spent_id(credit))
    return sent


def test_a_refusal_while_the_session_runs_pays_that_hop_again(tmp_path: Path) -> None:
    payer = _payer(tmp_path, 4)
    first, _ = _pay(payer, 1, 8)
    assert payer.give_back(1, 0, first) and payer.wallet.count() == 3 and payer.spent == 1
    assert payer.due(1, URLS, 8) == [1, 0]  # hop 0 is owed its credit again


def test_a_refusal_after_the_session_closed_still_returns_the_credit(tmp_path: Path) -> None:
    """A node that could not check a credit in time refuses it after the client's session
    failed and closed (both hops opened it): the credit, never taken, is the user's again."""
    payer = _payer(tmp_path, 4)
    first, second = _pay(payer, 1, 8)
    payer.forget(1, {0, 1})
    assert payer.wallet.count() == 2 and payer.spent == 2
    assert payer.give_back(1, 0, first)
    assert payer.wallet.count() == 3 and payer.spent == 1
    assert not payer.give_back(1, 0, first)  # once
    # a later session on the same sid (circuits share a hosted payer) keeps its own tally
    _pay(payer, 1, 8)
    assert payer.give_back(1, 1, second) and payer.due(1, URLS, 8) == [0, 0]


def test_closed_sessions_are_kept_for_late_refusals_up_to_a_bound(tmp_path: Path) -> None:
    payer = _payer(tmp_path, 2 * (CLOSED_KEPT + 1))
    oldest, _ = _pay(payer, 1, 8)
    payer.forget(1, {0, 1})
    for sid in range(2, CLOSED_KEPT + 2):
        _pay(payer, sid, 8)
        payer.forget(sid, {0, 1})
    assert not payer.give_back(1, 0, oldest)  # the oldest closed session's record went
    assert len(payer._closed) == CLOSED_KEPT


class _Ws:
    """A hop's WebSocket that keeps what the client sends it."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send_json(self, message: dict[str, Any]) -> None:
        self.sent.append(message)


def _circuit(payer: CreditPayer, urls: list[str]) -> tuple[CircuitClient, list[_Ws]]:
    """A circuit client over `urls` paid by `payer`, its links fakes that keep each `pay`."""
    client = CircuitClient(
        [Hop(url, shard) for shard, url in enumerate(urls)], hidden_size=8, payer=payer
    )
    sockets = [_Ws() for _ in urls]
    client.links = [SimpleNamespace(ws=ws, opened=set()) for ws in sockets]  # type: ignore[misc]
    return client, sockets


async def test_circuits_sharing_a_payer_keep_their_sessions_tallies_apart(tmp_path: Path) -> None:
    """The hosted gateway's circuits share one payer: a session of one circuit never counts as
    paid what another circuit's session paid, and closing one leaves the other's tally."""
    wallet = CreditWallet(tmp_path / "credits.json")
    wallet.add(fake_credits(8))
    others = ["http://c:3", "http://d:4"]
    payer = CreditPayer(wallet, {url: 8 for url in URLS + others}, min_positions=8)
    first, first_hops = _circuit(payer, URLS)
    second, second_hops = _circuit(payer, others)
    one, two = first.new_sid(), second.new_sid()
    assert one != two
    await first._pay(one, 8)
    await second._pay(two, 8)  # the same first chunk, on other nodes: paid too
    assert [len(ws.sent) for ws in first_hops + second_hops] == [1, 1, 1, 1]
    # a closing circuit waits for its own hops' unsettled credits, not another circuit's
    assert payer.unsettled(lambda *_: False) == 4
    assert payer.unsettled(lambda *_: False, first.paid_sids) == 2
    await first.close(one)  # one's close does not forget two's tally
    await second._pay(two, 0)  # no new position: nothing more owed
    assert [len(ws.sent) for ws in second_hops] == [1, 1]
    credit = second_hops[0].sent[0]["credit"]
    assert payer.give_back(two, 0, spent_id(parse_paid_credit(credit)))
    assert payer.due(two, others, 8) == [1, 0]  # refused at two's hop 0: owed there again
    assert payer.spent == 3 and wallet.count() == 5
