"""Deployment plumbing without a chain: config validation, committee parsing, constructor plans."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from deploy.evm import (
    COMPILE_STAMP,
    ZERO_ADDRESS,
    DeployConfig,
    _artifacts_stale,
    constructor_args,
    parse_committee,
)
from protocol.errors import ConfigError, UsageError

pytestmark = pytest.mark.unit

A = "0x00000000000000000000000000000000000000AA"
B = "0x0000000000000000000000000000000000000001"
DEPLOYER = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
ADDRESSES = {
    "Committee": "0x5FbDB2315678afecb367f032d93F642f64180aa3",
    "Staking": "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512",
}


def constructor(*names: str) -> list[dict[str, Any]]:
    return [{"type": "constructor", "inputs": [{"name": n, "type": "uint256"} for n in names]}]


def test_config_unstake_delay_defaults_to_window_plus_one() -> None:
    config = DeployConfig.devnet(committee=[(A, 1)], challenge_window_s=60)
    assert config.unstake_delay == 61
    assert DeployConfig.production(committee=[(A, 1)]).challenge_window_s == 24 * 3600


@pytest.mark.parametrize(
    ("committee", "overrides", "message"),
    [
        ([], {}, "at least one"),
        ([(A, 1), (A.lower(), 2)], {}, "twice"),
        ([(A, 0)], {}, "powers"),
        ([(A, 2**64)], {}, "powers"),
        ([(A, 1)], {"unstake_delay_s": 60}, "longer than the challenge window"),
        ([(A, 1)], {"challenge_window_s": 0}, "positive"),
    ],
)
def test_config_invalid_is_usage_error(
    committee: list[tuple[str, int]], overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        DeployConfig.devnet(committee=committee, **overrides)


def test_config_sorted_committee_is_ascending_with_powers_aligned() -> None:
    config = DeployConfig.devnet(committee=[(A, 5), (B, 7)])
    assert config.sorted_committee() == ([B, A], [7, 5])


def test_parse_committee_power_defaults_to_one() -> None:
    assert parse_committee([f"{A}:3", B]) == ((A, 3), (B, 1))


@pytest.mark.parametrize("value", ["0x12:1", f"{A}:x", "nothing", f"{A.lower()[:-1]}A:1"])
def test_parse_committee_bad_value_is_usage_error(value: str) -> None:
    with pytest.raises(UsageError):
        parse_committee([value])


def test_constructor_args_matched_by_parameter_name() -> None:
    config = DeployConfig.devnet(committee=[(A, 1)], challenge_window_s=30)
    abi = constructor(
        "committee",
        "faultVerifier",
        "minCompute",
        "minVerifier",
        "minRelay",
        "challengeWindow_",
        "unstakeDelay_",
    )
    args = constructor_args("Staking", abi, config, ADDRESSES, 31337, DEPLOYER)
    assert args == [ADDRESSES["Committee"], ZERO_ADDRESS, 10**18, 10**18 // 2, 10**17, 30, 31]
    reordered = constructor("refundTimeout_", "committee_", "challengeWindow_")
    assert constructor_args("QueryEscrow", reordered, config, ADDRESSES, 31337, DEPLOYER) == [
        600,
        ADDRESSES["Committee"],
        30,
    ]


def test_constructor_args_dev_owner_only_on_devnet_chain() -> None:
    config = DeployConfig.devnet(committee=[(A, 1)])
    abi = constructor("committee_", "devOwner_")
    assert constructor_args("ModelRegistry", abi, config, ADDRESSES, 31337, DEPLOYER)[1] == DEPLOYER
    assert constructor_args("ModelRegistry", abi, config, ADDRESSES, 1, DEPLOYER)[1] == ZERO_ADDRESS


def test_constructor_args_unknown_parameter_is_config_error() -> None:
    config = DeployConfig.devnet(committee=[(A, 1)])
    with pytest.raises(ConfigError, match="'mystery'"):
        constructor_args("X", constructor("mystery"), config, ADDRESSES, 31337, DEPLOYER)


def test_artifacts_stale_when_missing_or_older_than_source(tmp_path: Path) -> None:
    source = tmp_path / "contracts" / "Thing.sol"
    source.parent.mkdir()
    source.write_text("// x")
    assert _artifacts_stale(tmp_path)
    built = tmp_path / "artifacts" / "contracts" / "Thing.sol" / "Thing.json"
    built.parent.mkdir(parents=True)
    built.write_text("{}")
    os.utime(source, (1_000, 1_000))
    assert not _artifacts_stale(tmp_path)
    os.utime(built, (500, 500))
    assert _artifacts_stale(tmp_path)
    # A successful compile that found nothing to rebuild leaves a newer stamp.
    stamp = tmp_path / "artifacts" / COMPILE_STAMP
    stamp.touch()
    os.utime(stamp, (2_000, 2_000))
    assert not _artifacts_stale(tmp_path)
    os.utime(source, (3_000, 3_000))
    assert _artifacts_stale(tmp_path)


def test_artifacts_stale_source_without_contract_uses_the_stamp(tmp_path: Path) -> None:
    """Hardhat writes no artifact for a file of structs/enums only."""
    source = tmp_path / "contracts" / "Types.sol"
    source.parent.mkdir()
    source.write_text("// struct only")
    os.utime(source, (1_000, 1_000))
    assert _artifacts_stale(tmp_path)
    stamp = tmp_path / "artifacts" / COMPILE_STAMP
    stamp.parent.mkdir()
    stamp.touch()
    assert not _artifacts_stale(tmp_path)


def test_artifacts_stale_without_sources_is_config_error(tmp_path: Path) -> None:
    (tmp_path / "contracts").mkdir()
    with pytest.raises(ConfigError, match="no Solidity sources"):
        _artifacts_stale(tmp_path)
