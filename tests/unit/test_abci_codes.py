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
