"""node.keys.create_dev_wallet: a devnet keystore that any keystore reader opens, made fast."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node.keys import KeyFileError, create_dev_wallet, load_wallet, wallet_address

pytestmark = pytest.mark.unit


def test_dev_wallet_opens_with_load_wallet_and_uses_pbkdf2(tmp_path: Path) -> None:
    path = tmp_path / "wallet.json"
    account = create_dev_wallet(path, "pw")
    assert load_wallet(path, "pw").address == account.address == wallet_address(path)
    assert json.loads(path.read_text())["crypto"]["kdf"] == "pbkdf2"
    assert path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(KeyFileError):
        load_wallet(path, "wrong")
    with pytest.raises(KeyFileError):
        create_dev_wallet(path, "pw")  # never overwrites


def test_dev_wallet_imports_a_given_key(tmp_path: Path) -> None:
    key = bytes.fromhex("5" * 64)
    account = create_dev_wallet(tmp_path / "wallet.json", "pw", key)
    assert bytes(load_wallet(tmp_path / "wallet.json", "pw").key) == key
    assert account.address == wallet_address(tmp_path / "wallet.json")
