"""protocol/eth.py: the one parser of ETH amounts people type, against hostile text."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import UsageError
from protocol.eth import MAX_UINT128, WEI_PER_ETH, parse_eth

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "wei"),
    [
        ("1", WEI_PER_ETH),
        (" 2.5 ", 25 * 10**17),
        ("0.000000000000000001", 1),
        (".5", 5 * 10**17),
        ("7.", 7 * WEI_PER_ETH),
        ("340282366920938463463.374607431768211455", MAX_UINT128),
    ],
)
def test_plain_decimals_are_exact_wei(text: str, wei: int) -> None:
    assert parse_eth(text) == wei


@pytest.mark.parametrize(
    "text",
    ["", ".", "0", "0.0", "-1", "+1", "1e3", "1e999999999", "1e-999999999", "NaN", "inf",
     "0x10", "1_0", "1 0", "١", "１０", "1" * 61, "340282366920938463463.374607431768211456",
     "0.0000000000000000001", None, 5],
)  # fmt: skip
def test_anything_else_is_a_usage_error_with_a_hint(text: object) -> None:
    with pytest.raises(UsageError) as refused:
        parse_eth(text, what="--amount")
    assert refused.value.message.startswith("--amount") and refused.value.hint


@given(st.text(max_size=80))
def test_any_text_is_wei_in_range_or_a_usage_error(text: str) -> None:
    try:
        wei = parse_eth(text, max_wei=10**21)
    except UsageError:
        return
    assert 0 < wei <= 10**21
    assert text.strip().replace(".", "", 1).isdigit() and text.strip().isascii()


@given(st.integers(1, MAX_UINT128))
def test_every_wei_amount_written_as_eth_round_trips(wei: int) -> None:
    whole, fraction = divmod(wei, WEI_PER_ETH)
    assert parse_eth(f"{whole}.{fraction:018d}") == wei
