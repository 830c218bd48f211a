"""`planet credits`: the count parser, argument mistakes (error + hint, exit 2, no traceback) and
`show` over a credit file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from node.cli.credits import MAX_BUY, parse_count
from node.client.credit_wallet import CreditWallet
from planet.main import main
from protocol.errors import UsageError
from tests.credit_fakes import fake_credit

pytestmark = pytest.mark.unit


def test_parse_count_bounds() -> None:
    assert parse_count("1") == 1 and parse_count(str(MAX_BUY)) == MAX_BUY
    for text in (None, "", "0", str(MAX_BUY + 1), "-1", "1.5", "١", "abc", "9999"):
        with pytest.raises(UsageError) as caught:
            parse_count(text)
        assert caught.value.hint


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["credits", "buy"], "needs a number"),
        (["credits", "buy", "0"], "out of range"),
        (["credits", "show", "3"], "takes no count"),
        (["credits", "finish", "3"], "takes no count"),
        (["credits", "buy", "2", "--ttl", "5"], "--ttl"),
        (["credits", "buy", "2", "--ttl", "8d"], "--ttl"),
        (["credits", "buy", "2", "--wait", "0"], "--wait"),
        (["credits", "buy", "2", "--wait", "2h"], "--wait"),
        (["credits", "buy", "2", "--wait", "nan"], "not a duration"),
        (["credits", "buy", "2", "--wait", "-5"], "not a duration"),
        (["credits", "buy", "2", "--wait", "١٠"], "not a duration"),  # Arabic-Indic digits
        (["credits", "buy", "2", "--wait", "9" * 400], "not a duration"),
    ],
)
def test_credits_cli_mistakes_exit_2_with_error_and_hint(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main([*argv, "--credits-file", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert needle in err and "hint:" in err and "Traceback" not in err


def test_credits_buy_without_a_committee_names_the_fix(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLANET_HOME", str(tmp_path / "home"))
    assert main(["credits", "buy", "2", "--credits-file", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert "no committee RPC" in err and "--committee-rpc" in err


def test_credits_show_counts_the_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    CreditWallet(path).add([fake_credit(1), fake_credit(2)])
    assert main(["credits", "show", "--json", "--credits-file", str(path)]) == 0
    assert '"credits": 2' in capsys.readouterr().out


def test_credits_show_names_old_rsa_credits_and_does_not_count_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import json

    from protocol.paid_credits import credit_json
    from tests.credit_fakes import rsa_credit_json

    path = tmp_path / "c.json"
    items = [rsa_credit_json(0), credit_json(fake_credit(1)), rsa_credit_json(2)]
    path.write_text(json.dumps({"credits": items, "pending": []}))
    assert main(["credits", "show", "--credits-file", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "1"
    assert "2 old RSA credits can no longer be spent" in err and "Traceback" not in err


def test_one_mint_buys_up_to_the_chains_bound_and_its_tx_fits() -> None:
    """A client buys as many credits in one mint as the chain takes (issue 42's 100-credit
    mint is one purchase): MAX_BUY is the chain's MAX_MINT, a mint of that many points is a
    valid signed tx under the size limit, and one more point is refused on both sides."""
    from types import SimpleNamespace

    from nacl.signing import SigningKey

    from node.client.mint_request import MintRequest
    from protocol.committee.credits import MAX_MINT, CreditMint
    from protocol.committee.envelope import MAX_TX_BYTES, decode, sign
    from protocol.errors import ProtocolError

    assert MAX_BUY == MAX_MINT >= 100 and parse_count("100") == 100
    period: Any = SimpleNamespace(period=3)
    payer = bytes(range(1, 33))
    args = (payer, 10**12, 31337, "0x" + "11" * 20, 2_000_000_000)
    request = MintRequest.create(period, MAX_MINT, *args)
    raw = sign(request.body, SigningKey.generate(), 1).raw
    assert len(raw) < MAX_TX_BYTES and decode(raw).body == request.body
    with pytest.raises(ProtocolError):
        MintRequest.create(period, MAX_MINT + 1, *args)
    doc, extra = request.body.to_json(), MintRequest.create(period, 1, *args).body.to_json()
    assert CreditMint.from_json(doc) == request.body
    with pytest.raises(ProtocolError, match=str(MAX_MINT)):
        CreditMint.from_json({**doc, "blinded": [*doc["blinded"], *extra["blinded"]]})
