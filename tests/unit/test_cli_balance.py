"""`planet balance`: the ETH amount parser, the `--gateway` parser and the argument mistakes
(error + hint, exit 2)."""

from __future__ import annotations

import pytest

from node.cli.balance import MAX_BALANCE_WEI, parse_eth, parse_gateway
from planet.main import main
from protocol.errors import UsageError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "text,wei",
    [("1", 10**18), ("0.05", 5 * 10**16), ("0.000000000000000001", 1), ("2.5", 25 * 10**17)],
)
def test_parse_eth_decimal_to_wei(text: str, wei: int) -> None:
    assert parse_eth(text) == wei


@pytest.mark.parametrize(
    "text",
    [None, "", "abc", "0", "-1", "1e-30", "NaN", "sNaN", "inf", "0x10", "١", "1" * 41, "1e40"],
)
def test_parse_eth_refuses_with_hint(text: str | None) -> None:
    with pytest.raises(UsageError) as caught:
        parse_eth(text)
    assert caught.value.hint


def test_parse_eth_upper_bound_is_the_escrow_balance_width() -> None:
    assert parse_eth("340282366920938463463.374607431768211455") == MAX_BALANCE_WEI
    with pytest.raises(UsageError):
        parse_eth(str(2**129))


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["balance", "show", "5"], "takes no amount"),
        (["balance", "deposit"], "needs an amount"),
        (["balance", "show", "--cancel"], "--cancel"),
        (["balance", "show", "--gateway", "0x1234"], "not a gateway address"),
        (["balance", "show", "--gateway", "gateway.example"], "not a gateway URL or address"),
        (["balance", "show", "--credits", "--gateway", "0x" + "ab" * 20], "two different balances"),
    ],
)
def test_balance_cli_mistakes_exit_2_with_error_and_hint(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "hint:" in err and "Traceback" not in err


def test_parse_gateway_address_url_or_default() -> None:
    address = "0x" + "ab" * 20
    checksummed, url = parse_gateway(address)
    assert url is None and checksummed.lower() == address and checksummed != address
    assert parse_gateway("http://127.0.0.1:8000/") == (None, "http://127.0.0.1:8000")
    assert parse_gateway("https://gw.example") == (None, "https://gw.example")
    assert parse_gateway(None) == (None, None)


@pytest.mark.parametrize(
    "text", ["0x", "0x" + "g" * 40, "0x" + "ab" * 21, "ftp://x", "127.0.0.1:8000", "http://a b"]
)
def test_parse_gateway_refuses_with_hint(text: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_gateway(text)
    assert "--gateway" in (caught.value.hint or "")
