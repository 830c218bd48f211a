"""Result codes are the chain's observable behaviour (clients branch on them): each name has its
own number. An IntEnum member given a number already taken silently becomes an alias of the
first (two branches merging 109 made `PARTIALS_NOT_POSTED` answer as `VERDICT_NOT_CONFIRMED`)."""

from __future__ import annotations

import pytest

from abci_app.codes import Code

pytestmark = pytest.mark.unit


def test_codes_every_name_has_its_own_number() -> None:
    numbers = [int(code) for code in Code.__members__.values()]
    assert len(numbers) == len(set(numbers)), sorted(
        n for n in set(numbers) if numbers.count(n) > 1
    )


def test_the_copies_of_codes_outside_abci_app_name_the_same_numbers() -> None:
    """node/ may not import abci_app (layers), so its clients and watchers keep their own copy
    of the codes they branch on; a renumbering on one side must fail here (a merge moved
    PARTIALS_NOT_POSTED to 114 while the client still waited on `query_110`: every purchase
    then gave up on the first validator that had not posted yet)."""
    from node.client import credit_purchase
    from node.watcher import mint_signer

    copies = {
        credit_purchase.MINT_UNFUNDED_QUERY: Code.MINT_UNFUNDED,
        credit_purchase.PARTIALS_NOT_POSTED_QUERY: Code.PARTIALS_NOT_POSTED,
        credit_purchase.UNKNOWN_QUERY: Code.UNKNOWN_QUERY,
    }
    for copy, code in copies.items():
        assert copy == f"query_{int(code)}", (copy, code.name)
    assert mint_signer.PARTIALS_REPLAYED == Code.PARTIALS_REPLAYED
    assert mint_signer.MINT_SIGNING_CLOSED == Code.MINT_SIGNING_CLOSED
