"""The paid-work flags at the command line: `planet node serve --credit-positions`, `planet join
--credit-positions` (what it passes to the node and its agent) and `planet gateway serve
--personal` refuse what they cannot do by name, with exit status 2 and no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.agent.launch import CREDITS_DIR, _credit_args
from planet import main as cli

pytestmark = pytest.mark.unit


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    status = cli.main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return status, err


def test_a_charging_node_needs_a_committee_and_a_credits_dir(capsys, tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}")
    argv = ["node", "serve", "--manifest", str(manifest), "--shard", "0", "--plaintext-links"]
    status, err = _run(capsys, [*argv, "--credit-positions", "8"])
    assert status == 2 and "needs a committee RPC and a credits dir" in err
    status, err = _run(capsys, [*argv, "--credit-positions", "-1"])
    assert status == 2 and "positions per credit must be >= 0" in err


def test_join_passes_the_price_to_the_node_and_the_spool_to_both(tmp_path: Path) -> None:
    assert _credit_args(0, tmp_path, 1) == []  # free: nothing to redeem
    assert _credit_args(8, tmp_path, 1) == [  # the agent gets the base, the node its shard's
        "--credit-positions",
        "8",
        "--credits-dir",
        str(tmp_path / CREDITS_DIR / "shard-1"),
    ]


def test_the_personal_client_serves_loopback_only_and_refuses_a_bad_floor(
    capsys, tmp_path: Path
) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}")
    argv = ["gateway", "serve", "--personal", "--manifest", str(manifest)]
    status, err = _run(capsys, [*argv, "--host", "0.0.0.0"])
    assert status == 2 and "0.0.0.0 is not a loopback address" in err
    status, err = _run(capsys, [*argv, "--min-credit-positions", "0"])
    assert status == 2 and "--min-credit-positions must be >= 1" in err
    status, err = _run(capsys, ["gateway", "serve", "--manifest", str(manifest)])
    assert status == 2 and "needs --deployment, --wallet and --manifest" in err
    assert "--personal" in err


def test_the_spent_query_refuses_what_a_stranger_sends_by_name(tmp_path: Path) -> None:
    from abci_app.queries import query
    from tests.credit_chain import node_chain

    chain, _ = node_chain(tmp_path)
    for bad in ("", "zz" * 32, "AB" * 32, "١" * 64, "a" * 63, "a" * 5000, "a" * 64 + "&id=b"):
        code, _, log = query(chain.state, f"/credit_spent?id={bad}", b"")
        assert code != 0 and log, bad
    code, value, _ = query(chain.state, "/credit_spent?id=" + "ab" * 32, b"")
    assert code == 0 and b'"height":null' in value.replace(b" ", b"")
