"""`planet node serve` key flags (node/cli/serve_args.py): --node-key (the TLS certificate's key;
spot-check tickets with --committee-rpc too) or --plaintext-links, the key opened with the
operator's password, clear errors."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from node.cli import serve_args as node_cli
from node.keys import PASSWORD_ENV, KeyFileError, create_node_key
from planet import main as cli
from protocol.errors import UsageError

pytestmark = pytest.mark.unit


def _args(**kw: object) -> SimpleNamespace:
    base = {"node_key": None, "committee_rpc": None, "password_file": None, "spot_check_ppm": None}
    return SimpleNamespace(**{**base, **kw})


def test_no_key_without_flags() -> None:
    assert node_cli._node_key(_args()) is None


def test_serve_without_key_or_plaintext_exits_2_naming_both(capsys, tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}")
    argv = ["node", "serve", "--manifest", str(manifest), "--shard", "0"]
    assert cli.main(argv) == UsageError.exit_status
    err = capsys.readouterr().err
    assert "error: a node serves TLS links bound to its node key" in err
    assert "--plaintext-links" in err and "Traceback" not in err


def test_node_key_without_committee_is_the_tls_key(tmp_path: Path, monkeypatch) -> None:
    # the key alone serves TLS (no tickets: they need the committee too)
    path = tmp_path / "node_key.json"
    key = create_node_key(path, "pw")
    monkeypatch.setenv(PASSWORD_ENV, "pw")
    assert node_cli._node_key(_args(node_key=path)).verify_key == key.verify_key


def test_committee_without_node_key_serves_without_tickets() -> None:
    # the committee RPC alone still tells the node its next hops (--next-hops committee)
    assert node_cli._node_key(_args(committee_rpc="http://127.0.0.1:26657")) is None


def test_bad_rate_and_missing_key_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--spot-check-ppm"):
        node_cli._node_key(_args(spot_check_ppm=2_000_000))
    with pytest.raises(UsageError, match="no node key"):
        node_cli._node_key(_args(node_key=tmp_path / "none.json", committee_rpc="http://x"))


def test_key_opens_with_the_password_from_the_environment(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "node_key.json"
    key = create_node_key(path, "right horse")
    args = _args(node_key=path, committee_rpc="http://127.0.0.1:26657")
    monkeypatch.setenv(PASSWORD_ENV, "right horse")
    assert node_cli._node_key(args).verify_key == key.verify_key
    monkeypatch.setenv(PASSWORD_ENV, "wrong")
    with pytest.raises(KeyFileError):
        node_cli._node_key(args)


def test_join_starts_the_node_with_its_key_and_the_committee(tmp_path: Path) -> None:
    from node.agent.launch import _ticket_args

    assert _ticket_args([]) == []
    assert _ticket_args(["http://a:26657", "http://b:26657"]) == [
        "--committee-rpc",
        "http://a:26657",
    ]
