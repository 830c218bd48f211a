"""`planet key`: the duration parser and the argument mistakes (error + hint, exit 2, no
traceback). The whole command against a live gateway is in
tests/integration/test_gateway_payments_network.py."""

from __future__ import annotations

import pytest

from node.cli.key import MAX_KEY_SECONDS, parse_duration
from planet.main import main
from protocol.errors import UsageError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "text,seconds",
    [("3600", 3600), ("45s", 45), ("90m", 5400), ("12h", 43_200), ("7d", 604_800)],
)
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "0", "7w", "-1d", "1.5h", "d", "7 d", "٧d", "1e3", "99999999999d", "0x10"]
)
def test_parse_duration_refuses_with_hint(text: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_duration(text)
    assert caught.value.hint


def test_parse_duration_upper_bound() -> None:
    assert parse_duration("3650d") == MAX_KEY_SECONDS
    with pytest.raises(UsageError):
        parse_duration("3651d")


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["key", "new"], "needs --cap"),
        (["key", "new", "--cap", "0"], "out of range"),
        (["key", "new", "--cap", "0.01", "--expires", "soon"], "not a duration"),
        (["key", "new", "planet-key-v1.x", "--cap", "1"], "takes no key"),
        (["key", "revoke"], "needs the key"),
        (["key", "show"], "needs the key"),
    ],
)
def test_key_cli_mistakes_exit_2_with_error_and_hint(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "hint:" in err and "Traceback" not in err
