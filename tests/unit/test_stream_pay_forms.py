"""A node's `pay` handler (node/server/stream.py `_pay`) takes a credit (88 bytes: period ‖
nonce ‖ σ) and names it by its spent id, so a pay for a session that is not open comes back
`credit_not_taken` naming it (the client puts it back in its wallet), and a pay that is taken
reaches the node's payments."""

from __future__ import annotations

import hashlib
import os
from types import SimpleNamespace

import pytest

from node.server import stream
from protocol.blind_bls import ThresholdCredit
from protocol.stream import Control, CreditNotTakenError, not_taken_id

pytestmark = pytest.mark.unit


def threshold_credit() -> ThresholdCredit:
    return ThresholdCredit(3, os.urandom(32), bytes(48))


async def test_a_threshold_credit_for_a_session_not_open_is_named_and_not_taken() -> None:
    credit = threshold_credit()
    link = SimpleNamespace(opened={})
    state = SimpleNamespace(payments=object())
    with pytest.raises(CreditNotTakenError) as refused:
        await stream._pay(state, link, Control("pay", 7, credit=credit))  # type: ignore[arg-type]
    assert not_taken_id(refused.value.message) == hashlib.sha256(credit.nonce).hexdigest()


async def test_a_threshold_credit_for_an_open_session_reaches_the_payments() -> None:
    credit = threshold_credit()
    taken = []

    class Payments:
        wait_s = 5.0  # node.server.payments.PAY_WAIT_S

        async def accept(self, account: object, paid: object) -> None:
            taken.append((account, paid))

    account = object()
    link = SimpleNamespace(opened={7: SimpleNamespace(account=account)})
    state = SimpleNamespace(payments=Payments())
    await stream._pay(state, link, Control("pay", 7, credit=credit))  # type: ignore[arg-type]
    assert taken == [(account, credit)]
