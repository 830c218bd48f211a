"""A credit a node refuses `credit_not_assigned` (its holder's assignment names another node,
model or shard) was never taken: the node checks the assignment before it takes a credit.
The paying client puts a holder-bound credit back into the wallet as unspent, unassigned, and
the session still fails over; a bare credit of before (refused by every node of a chain that
binds holders) is not given back."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from nacl.signing import SigningKey

from node.client.circuit import CircuitClient, _Link
from node.client.credit_wallet import CreditWallet
from node.client.paying import CreditPayer
from node.client.types import Hop
from node.server.payments import Account, CreditCheck, CreditNotAssignedError, Payments
from protocol.blind_bls import ThresholdCredit
from protocol.committee import credit_holder
from protocol.errors import RemoteError
from protocol.paid_credits import AssignedCredit, HeldCredit, held, spent_id
from protocol.stream import error_message, not_assigned_id, parse_control
from tests.credit_fakes import SIGMA, fake_credits

pytestmark = pytest.mark.unit

URL = "https://a:1"
STALE = credit_holder.node_party(SigningKey(b"\x01" * 32).verify_key.encode(), "m", 0)
ACTUAL = credit_holder.node_party(SigningKey(b"\x02" * 32).verify_key.encode(), "m", 1)


def held_credits(count: int) -> list[HeldCredit]:
    """Holder-bound credits (their seeds kept, as `planet credits buy` keeps them)."""
    seeds = [bytes([9, i]) * 16 for i in range(count)]
    return [held(ThresholdCredit(7, credit_holder.holder_of(seed), SIGMA), seed) for seed in seeds]


class _Ws:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send_json(self, message: dict[str, Any]) -> None:
        self.sent.append(message)


def _circuit(payer: CreditPayer) -> tuple[CircuitClient, _Link, _Ws]:
    """A one-hop circuit paid by `payer` and its link, whose refusals the test feeds in."""
    client = CircuitClient([Hop(URL, 0)], hidden_size=8, payer=payer)
    ws = _Ws()
    client.links = [SimpleNamespace(ws=ws, opened=set())]  # type: ignore[misc]
    link = _Link.__new__(_Link)  # its reader task left out: the test hands it each message
    link.client, link.index, link.hop, link.ws = client, 0, client.hops[0], ws  # type: ignore[assignment]
    link.pending, link.opened = {}, set()
    return client, link, ws


async def _refusal(sid: int, ws: _Ws) -> str:
    """What the node (its own `Payments`, its party other than the one assigned) answers the
    `pay` the client sent: the refusal's JSON text."""
    pay = parse_control(json.dumps(ws.sent[-1]), frozenset({"pay"}))
    assert isinstance(pay.credit, AssignedCredit)
    payments = Payments(8, CreditCheck(SimpleNamespace()), spool=None, party=ACTUAL)  # type: ignore[arg-type]
    with pytest.raises(CreditNotAssignedError) as refused:
        await payments.accept(Account(), pay.credit)  # refused before any query or spool write
    assert payments.accepted == 0 and not payments.seen
    assert not_assigned_id(refused.value.message) == spent_id(pay.credit)
    return json.dumps(error_message(sid, refused.value))


async def test_credit_not_assigned_goes_back_to_the_wallet_and_the_session_fails(
    tmp_path: Path,
) -> None:
    wallet = CreditWallet(tmp_path / "credits.json")
    wallet.add(held_credits(3))
    payer = CreditPayer(wallet, {URL: 8}, min_positions=8, parties={URL: STALE})
    client, link, ws = _circuit(payer)
    sid = client.new_sid()
    client.outputs[sid] = asyncio.Queue()
    await client._pay(sid, 8)
    assert wallet.count() == 2 and payer.spent == 1
    refusal = await _refusal(sid, ws)
    link._control(refusal)
    assert wallet.count() == 3 and payer.spent == 0  # back, unspent
    returned = wallet.take(3)[-1]  # given back last, with its seed, unassigned
    assert isinstance(returned, HeldCredit) and not isinstance(returned, AssignedCredit)
    assert spent_id(returned) == not_assigned_id(json.loads(refusal)["message"])
    error = client.outputs[sid].get_nowait()  # the session still fails over, the hop blamed
    assert isinstance(error, RemoteError) and error.code == "credit_not_assigned"


async def test_a_bare_credit_refused_not_assigned_is_not_given_back(tmp_path: Path) -> None:
    """A credit of before holder keys: every node of a holder-bound chain refuses it, so it is
    not put back (it would be handed out and refused again)."""
    wallet = CreditWallet(tmp_path / "credits.json")
    wallet.add(fake_credits(2))
    payer = CreditPayer(wallet, {URL: 8}, min_positions=8, parties={URL: STALE})
    [[credit]] = payer.take([1])
    payer.paid(1, 0, URL, credit)
    assert not payer.not_assigned(1, 0, spent_id(credit))
    assert wallet.count() == 1 and payer.spent == 1


def test_a_refusal_naming_a_credit_not_sent_there_gives_nothing_back(tmp_path: Path) -> None:
    wallet = CreditWallet(tmp_path / "credits.json")
    wallet.add(held_credits(2))
    payer = CreditPayer(wallet, {URL: 8, "https://b:2": 8}, min_positions=8)
    [[credit]] = payer.take([1])
    payer.paid(1, 0, URL, credit)
    assert not payer.not_assigned(1, 1, spent_id(credit))  # another hop's credit
    assert not payer.not_assigned(2, 0, spent_id(credit))  # another session's
    assert payer.not_assigned(1, 0, spent_id(credit)) and wallet.count() == 2
    assert not payer.not_assigned(1, 0, spent_id(credit))  # once


def test_a_refusal_after_the_session_closed_still_gives_the_credit_back(tmp_path: Path) -> None:
    wallet = CreditWallet(tmp_path / "credits.json")
    wallet.add(held_credits(2))
    payer = CreditPayer(wallet, {URL: 8}, min_positions=8)
    [[credit]] = payer.take([1])
    payer.paid(1, 0, URL, credit)
    payer.forget(1, {0})
    assert payer.not_assigned(1, 0, spent_id(credit)) and wallet.count() == 2
