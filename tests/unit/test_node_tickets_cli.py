"""`planet node serve` spot-check ticket flags (node/cli/node.py): --node-key and
--committee-rpc together, the key opened with the operator's password, clear errors."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from node.cli import main as cli
from node.cli import node as node_cli
from node.keys import PASSWORD_ENV, KeyFileError, create_node_key
from protocol.errors import UsageError

pytestmark = pytest.mark.unit


def _args(**kw: object) -> SimpleNamespace:
    base = {"node_key": None, "committee_rpc": None, "password_file": None, "spot_check_ppm": None}
    return SimpleNamespace(**{**base, **kw})


def test_tickets_stay_off_without_flags() -> None:
    assert node_cli._ticket_key(_args()) is None


def test_node_key_without_committee_exits_2(capsys) -> None:
    argv = ["node", "serve", "--manifest", "/nonexistent/m.json", "--shard", "0"]
    assert cli.main([*argv, "--node-key", "k.json"]) == UsageError.exit_status
    err = capsys.readouterr().err
    assert "error: --node-key needs --committee-rpc" in err and "hint:" in err
    assert "Traceback" not in err


def test_committee_without_node_key_serves_without_tickets() -> None:
    # the committee RPC alone still tells the node its next hops (--next-hops committee)
    assert node_cli._ticket_key(_args(committee_rpc="http://127.0.0.1:26657")) is None


def test_bad_rate_and_missing_key_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--spot-check-ppm"):
        node_cli._ticket_key(_args(spot_check_ppm=2_000_000))
    with pytest.raises(UsageError, match="no node key"):
        node_cli._ticket_key(_args(node_key=tmp_path / "none.json", committee_rpc="http://x"))


def test_key_opens_with_the_password_from_the_environment(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "node_key.json"
    key = create_node_key(path, "right horse")
    args = _args(node_key=path, committee_rpc="http://127.0.0.1:26657")
    monkeypatch.setenv(PASSWORD_ENV, "right horse")
    assert node_cli._ticket_key(args).verify_key == key.verify_key
    monkeypatch.setenv(PASSWORD_ENV, "wrong")
    with pytest.raises(KeyFileError):
        node_cli._ticket_key(args)


def test_join_starts_the_node_with_its_key_and_the_committee(tmp_path: Path) -> None:
    from node.agent.launch import _ticket_args

    assert _ticket_args(tmp_path, []) == []
    assert _ticket_args(tmp_path, ["http://a:26657", "http://b:26657"]) == [
        "--node-key", str(tmp_path / "node_key.json"), "--committee-rpc", "http://a:26657",
    ]  # fmt: skip
