"""Revert decoding: custom errors from ABIs become typed ContractRevert exceptions."""

from __future__ import annotations

from typing import Any

import pytest
from eth_abi import encode as abi_encode
from eth_utils import keccak
from web3.exceptions import ContractCustomError, ContractLogicError

from node.chain.evm.deployment import Deployment
from node.chain.evm.errors import (
    REVERT_TYPES,
    ContractRevert,
    InsufficientPower,
    QueryNotFunded,
    RevertDecoder,
    revert_data,
)
from protocol.errors import ConfigError, PlanetError

pytestmark = pytest.mark.unit

ABI: list[dict[str, Any]] = [
    {
        "type": "error",
        "name": "InsufficientPower",
        "inputs": [
            {"name": "signed", "type": "uint256", "internalType": "uint256"},
            {"name": "total", "type": "uint256", "internalType": "uint256"},
        ],
    },
    {
        "type": "error",
        "name": "UnknownSigner",
        "inputs": [{"name": "signer", "type": "address", "internalType": "address"}],
    },
    {
        "type": "error",
        "name": "QueryNotFunded",
        "inputs": [{"name": "queryId", "type": "bytes32", "internalType": "bytes32"}],
    },
    {"type": "error", "name": "NoArgs", "inputs": []},
    {
        "type": "error",
        "name": "WithTuple",
        "inputs": [
            {
                "name": "s",
                "type": "tuple",
                "components": [{"name": "a", "type": "uint64"}, {"name": "b", "type": "bytes32"}],
            },
            {"name": "", "type": "uint8[]"},
        ],
    },
    {"type": "function", "name": "ignored", "inputs": [], "outputs": []},
]
DECODER = RevertDecoder([ABI])


def error_data(signature: str, types: list[str], values: list[Any]) -> bytes:
    return keccak(text=signature)[:4] + abi_encode(types, values)


def test_decoder_custom_error_becomes_typed_subclass() -> None:
    data = error_data("InsufficientPower(uint256,uint256)", ["uint256", "uint256"], [3, 10])
    error = DECODER.exception(data, contract="Committee", function="verify")
    assert isinstance(error, InsufficientPower) and isinstance(error, ContractRevert)
    assert isinstance(error, PlanetError)
    assert error.error_name == "InsufficientPower"
    assert error.args == (3, 10)
    assert error.named_args == {"signed": 3, "total": 10}
    assert str(error) == "Committee.verify reverted: InsufficientPower(signed=3, total=10)"
    assert error.hint


def test_decoder_address_argument_is_checksummed() -> None:
    signer = "0x" + "ab" * 20
    data = error_data("UnknownSigner(address)", ["address"], [signer])
    error = DECODER.exception(data)
    assert error.error_name == "UnknownSigner"
    assert error.named_args["signer"] == "0xABaBaBaBABabABabAbAbABAbABabababaBaBABaB"


def test_decoder_bytes32_argument_and_typed_class() -> None:
    query = keccak(text="q")
    error = DECODER.exception(error_data("QueryNotFunded(bytes32)", ["bytes32"], [query]))
    assert isinstance(error, QueryNotFunded)
    assert error.args == (query,)
    assert "0x" + query.hex() in error.message


def test_decoder_error_without_typed_class_is_plain_contract_revert() -> None:
    error = DECODER.exception(keccak(text="NoArgs()")[:4])
    assert type(error) is ContractRevert
    assert error.error_name == "NoArgs" and error.args == ()


def test_decoder_tuple_and_array_arguments() -> None:
    data = error_data(
        "WithTuple((uint64,bytes32),uint8[])",
        ["(uint64,bytes32)", "uint8[]"],
        [
            (7, b"\x01" * 32),
            [1, 2],
        ],
    )
    name, values, named = DECODER.decode(data)
    assert name == "WithTuple"
    assert values == ((7, b"\x01" * 32), (1, 2))
    assert set(named) == {"s", "arg1"}


def test_decoder_error_string_and_panic() -> None:
    reason = bytes.fromhex("08c379a0") + abi_encode(["string"], ["nope"])
    assert DECODER.decode(reason)[:2] == ("Error", ("nope",))
    panic = bytes.fromhex("4e487b71") + abi_encode(["uint256"], [0x11])
    name, values, named = DECODER.decode(panic)
    assert (name, values) == ("Panic", (0x11,))
    assert "overflow" in named["meaning"]


def test_decoder_unknown_selector_and_empty_data() -> None:
    name, values, _ = DECODER.decode(b"\xde\xad\xbe\xef")
    assert name == "UnknownError" and values == (b"\xde\xad\xbe\xef",)
    assert DECODER.decode(b"")[0] == "EmptyRevert"


def test_decoder_truncated_arguments_are_reported_not_raised() -> None:
    data = error_data("InsufficientPower(uint256,uint256)", ["uint256", "uint256"], [3, 10])[:40]
    assert DECODER.decode(data)[0] == "UnknownError"


def test_revert_data_from_web3_exceptions() -> None:
    raw = error_data("NoArgs()", [], [])
    assert revert_data(ContractCustomError("x", data="0x" + raw.hex())) == raw
    assert revert_data(ContractLogicError("x", data={"data": "0x" + raw.hex()})) == raw
    assert revert_data(ContractLogicError("x", data=None)) == b""


def test_revert_types_are_keyed_by_their_error_name() -> None:
    for name, cls in REVERT_TYPES.items():
        assert cls.__name__ == name == cls.error_name
        assert issubclass(cls, ContractRevert)


def test_deployment_round_trip(tmp_path: Any) -> None:
    raw = Deployment(
        chain_id=31337,
        rpc_url="http://127.0.0.1:18545",
        deployer="0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266",
        block=1,
        contracts={},
        config={"challenge_window_s": 60},
    )
    path = raw.save(tmp_path / "d.json")
    assert Deployment.load(path) == raw


def test_deployment_missing_file_has_a_hint(tmp_path: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        Deployment.load(tmp_path / "none.json")
    assert "planet contracts deploy" in (caught.value.hint or "")


def test_deployment_malformed_file_is_config_error(tmp_path: Any) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"chain_id": 1}')
    with pytest.raises(ConfigError, match="not a Planet deployment"):
        Deployment.load(path)


def test_issue13_reverts_decode_from_the_compiled_abis_into_typed_classes() -> None:
    """The new FraudProofs/Staking errors are in the artifacts and map to typed classes with a
    hint (skipped when the contracts are not compiled)."""
    from deploy.evm import load_artifact

    try:
        decoder = RevertDecoder(
            [load_artifact("FraudProofs")["abi"], load_artifact("Staking")["abi"]]
        )
    except ConfigError:
        pytest.skip("contracts not compiled")
    node = "0x" + "12" * 20
    commitment = keccak(text="c")
    cases = [
        ("FraudWindowOpen(address,uint256)", ["address", "uint256"], [node, 99]),
        ("WorkAlreadyCovered(address,uint256)", ["address", "uint256"], [node, 99]),
        ("ChallengeNotCommitted(bytes32)", ["bytes32"], [commitment]),
        ("ChallengeNotMatured(bytes32,uint256)", ["bytes32", "uint256"], [commitment, 7]),
        ("WrongConsumer(address)", ["address"], [node]),
    ]
    for signature, types, values in cases:
        error = decoder.exception(error_data(signature, types, values))
        name = signature.split("(")[0]
        assert type(error) is REVERT_TYPES[name] and error.error_name == name
        assert error.hint


def test_escrow_gateway_reverts_decode_with_the_gateway_named() -> None:
    """Issue 24: the per-(payer, gateway) errors carry the gateway and map to typed classes
    with a hint (skipped when the contracts are not compiled)."""
    from deploy.evm import load_artifact

    try:
        decoder = RevertDecoder([load_artifact("QueryEscrow")["abi"]])
    except ConfigError:
        pytest.skip("contracts not compiled")
    payer, gateway = "0x" + "12" * 20, "0x" + "34" * 20
    cases = [
        ("InvalidGateway(address)", ["address"], ["0x" + "00" * 20]),
        ("NothingToWithdraw(address,address)", ["address", "address"], [payer, gateway]),
        ("WithdrawalNotRequested(address,address)", ["address", "address"], [payer, gateway]),
        (
            "WithdrawalNotYetAvailable(address,address,uint256)",
            ["address", "address", "uint256"],
            [payer, gateway, 99],
        ),
        (
            "WithdrawalAlreadyRequested(address,address,uint256)",
            ["address", "address", "uint256"],
            [payer, gateway, 99],
        ),
    ]
    for signature, types, values in cases:
        error = decoder.exception(error_data(signature, types, values))
        name = signature.split("(")[0]
        assert type(error) is REVERT_TYPES[name] and error.error_name == name
        assert error.hint
        named = values[0] if name == "InvalidGateway" else gateway
        assert error.named_args["gateway"].lower() == named
