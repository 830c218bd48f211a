"""Operator key files: created once, reopened with the password, never overwritten or printed."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from node.keys import (
    KeyFileError,
    PasswordSource,
    create_wallet,
    load_node_key,
    load_or_create_node_key,
    load_or_create_wallet,
    load_wallet,
    node_public_key,
    wallet_address,
)

pytestmark = pytest.mark.unit

ANVIL_KEY_0 = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"
ANVIL_ADDRESS_0 = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"


def test_wallet_created_once_then_reopened_same_address(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "wallet.json"
    first = load_or_create_wallet(path, "pw")
    again = load_or_create_wallet(path, "pw")
    assert first.address == again.address == wallet_address(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert first.key.hex().removeprefix("0x") not in path.read_text()


def test_wallet_wrong_password_is_named_error_and_file_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "wallet.json"
    create_wallet(path, "right", ANVIL_KEY_0)
    before = path.read_bytes()
    with pytest.raises(KeyFileError, match="password does not open"):
        load_wallet(path, "wrong")
    assert path.read_bytes() == before
    assert load_wallet(path, "right").address == ANVIL_ADDRESS_0


def test_wallet_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "wallet.json"
    create_wallet(path, "pw")
    with pytest.raises(KeyFileError, match="already exists"):
        create_wallet(path, "pw")


@pytest.mark.parametrize("content", ["", "not json", "[]", '{"crypto": 1}'])
def test_damaged_wallet_is_named_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "wallet.json"
    path.write_text(content)
    with pytest.raises(KeyFileError):
        load_wallet(path, "pw")


def test_node_key_round_trip_and_public_half_readable(tmp_path: Path) -> None:
    path = tmp_path / "node_key.json"
    key = load_or_create_node_key(path, "pw")
    assert load_node_key(path, "pw").encode() == key.encode()
    assert node_public_key(path) == key.verify_key.encode().hex()
    assert key.encode().hex() not in path.read_text()
    with pytest.raises(KeyFileError, match="password does not open"):
        load_node_key(path, "other")


def test_node_key_with_swapped_public_key_refused(tmp_path: Path) -> None:
    path = tmp_path / "node_key.json"
    load_or_create_node_key(path, "pw")
    record = json.loads(path.read_text())
    record["public_key"] = "00" * 32
    path.write_text(json.dumps(record))
    with pytest.raises(KeyFileError, match="does not match"):
        load_node_key(path, "pw")


def test_password_sources_file_then_env_then_refusal(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PLANET_PASSWORD", "from-env")
    secret = tmp_path / "pw.txt"
    secret.write_text("from-file\n")
    assert PasswordSource(file=secret).read() == "from-file"
    assert PasswordSource().read() == "from-env"
    monkeypatch.delenv("PLANET_PASSWORD")
    with pytest.raises(KeyFileError, match="no terminal") as raised:
        PasswordSource(interactive=False).read()
    assert "PLANET_PASSWORD" in (raised.value.hint or "")
    with pytest.raises(KeyFileError, match="cannot read"):
        PasswordSource(file=tmp_path / "missing").read()
    monkeypatch.setenv("PLANET_PASSWORD", "")
    with pytest.raises(KeyFileError, match="empty"):
        PasswordSource().read()
