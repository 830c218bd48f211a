"""node/config.py: flags > env > $PLANET_HOME/config.toml > defaults, validated once."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.config import (
    DEFAULT_COMMITTEE_RPC,
    DEFAULT_EVM_RPC,
    OperatorConfig,
    resolve_config,
    write_config_file,
)
from protocol.errors import ConfigError

pytestmark = pytest.mark.unit


def _home(tmp_path: Path, **values: object) -> Path:
    write_config_file(tmp_path / "config.toml", values)  # type: ignore[arg-type]
    return tmp_path


def test_config_defaults_without_file_env_or_flags(tmp_path: Path) -> None:
    config = resolve_config({"home": tmp_path}, env={})
    assert config == OperatorConfig(home=tmp_path)
    assert config.evm_rpc == DEFAULT_EVM_RPC and config.committee_rpc == DEFAULT_COMMITTEE_RPC
    assert config.chain_id == 31337
    assert config.deployment_path == tmp_path / "deployment.json"
    assert config.wallet_path == tmp_path / "wallet.json"


def test_config_file_beats_defaults_env_beats_file_flag_beats_env(tmp_path: Path) -> None:
    home = _home(tmp_path, evm_rpc="http://file:1", committee_rpc="http://file:2", chain_id=5)
    from_file = resolve_config({"home": home}, env={})
    assert (from_file.evm_rpc, from_file.committee_rpc, from_file.chain_id) == (
        "http://file:1",
        "http://file:2",
        5,
    )
    env = {"PLANET_EVM_RPC": "http://env:1", "PLANET_CHAIN_ID": "7"}
    from_env = resolve_config({"home": home}, env=env)
    assert (from_env.evm_rpc, from_env.committee_rpc, from_env.chain_id) == (
        "http://env:1",
        "http://file:2",
        7,
    )
    from_flags = resolve_config({"home": home, "evm_rpc": "http://flag:1", "chain_id": None}, env)
    assert (from_flags.evm_rpc, from_flags.chain_id) == ("http://flag:1", 7)


def test_config_home_from_planet_home_env(tmp_path: Path) -> None:
    _home(tmp_path, committee_rpc="http://file:9")
    config = resolve_config({}, env={"PLANET_HOME": str(tmp_path)})
    assert config.home == tmp_path and config.committee_rpc == "http://file:9"


def test_config_relative_deployment_in_file_is_relative_to_home(tmp_path: Path) -> None:
    home = _home(tmp_path, deployment="d/deployment.json")
    assert resolve_config({"home": home}, env={}).deployment_path == home / "d/deployment.json"


@pytest.mark.parametrize(
    ("values", "env", "fragment"),
    [
        ({"evm_rpc": "ftp://x"}, {}, "not an http(s) URL"),
        ({}, {"PLANET_CHAIN_ID": "abc"}, "$PLANET_CHAIN_ID: chain id must be a positive integer"),
        ({"chain_id": 0}, {}, "chain id must be a positive integer"),
        ({"colour": "red"}, {}, "unknown keys colour"),
        ({"refund_margin_s": -1}, {}, "refund margin must be 0..2592000 seconds"),
        ({}, {"PLANET_REFUND_MARGIN_S": "1.5"}, "$PLANET_REFUND_MARGIN_S: refund margin"),
    ],
)
def test_config_bad_value_is_a_config_error_naming_its_source(
    tmp_path: Path, values: dict, env: dict, fragment: str
) -> None:
    home = _home(tmp_path, **values)
    with pytest.raises(ConfigError) as raised:
        resolve_config({"home": home}, env=env)
    assert fragment in raised.value.message


def test_config_invalid_toml_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text("evm_rpc = [unclosed\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        resolve_config({"home": tmp_path}, env={})


def test_config_is_frozen(tmp_path: Path) -> None:
    config = resolve_config({"home": tmp_path}, env={})
    with pytest.raises(AttributeError):
        config.evm_rpc = "http://other:1"  # type: ignore[misc]
