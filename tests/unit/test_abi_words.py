"""protocol.abi_words gives eth-abi's and eth-utils' bytes and answers on the types we hash.

The start-up cut of issue 41 replaced eth-abi / eth-utils in protocol/ and shares/ with these few
functions; each is checked here against the library it replaced, on generated values, so the
EIP-712 digests and Merkle leaves stay byte-identical (tests/vectors/eip712.json pins them too).
"""

from __future__ import annotations

import eth_utils
import pytest
from eth_abi import encode as eth_abi_encode
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import abi_words
from protocol.errors import ProtocolError

STATIC = ("uint8", "uint32", "uint64", "uint256", "address", "bytes32", "bool")


def _value(solidity_type: str) -> st.SearchStrategy[object]:
    if solidity_type.startswith("uint"):
        return st.integers(0, (1 << int(solidity_type[4:])) - 1)
    if solidity_type == "address":
        return st.binary(min_size=20, max_size=20).map(eth_utils.to_checksum_address)
    if solidity_type == "bytes32":
        return st.binary(min_size=32, max_size=32)
    return st.booleans()


@st.composite
def typed_values(draw: st.DrawFn) -> tuple[list[str], list[object]]:
    types: list[str] = []
    values: list[object] = []
    for _ in range(draw(st.integers(0, 6))):
        inner = draw(st.sampled_from(STATIC))
        if draw(st.booleans()):
            types.append(inner + "[]")
            values.append(draw(st.lists(_value(inner), max_size=4)))
        else:
            types.append(inner)
            values.append(draw(_value(inner)))
    return types, values


@settings(max_examples=300, deadline=None)
@given(typed_values())
def test_abi_encode_matches_eth_abi(case: tuple[list[str], list[object]]) -> None:
    types, values = case
    assert abi_words.abi_encode(types, values) == eth_abi_encode(types, values)


def test_abi_encode_of_the_queries_hash_shape_matches_eth_abi() -> None:
    """The widest shape we hash (eip712.queries_hash): five dynamic arrays, some empty."""
    types = ["bytes32[]", "uint256[]", "address[]", "address[]", "uint256[]"]
    payer = eth_utils.to_checksum_address("0x" + "ab" * 20)
    values = [[b"\x01" * 32, b"\x02" * 32], [5, 2**255], [payer], [], [7]]
    assert abi_words.abi_encode(types, values) == eth_abi_encode(types, values)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_keccak_matches_eth_utils(data: bytes) -> None:
    assert abi_words.keccak(data) == eth_utils.keccak(data)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_keccak_text_matches_eth_utils(text: str) -> None:
    assert abi_words.keccak_text(text) == eth_utils.keccak(text=text)


def _address_texts() -> st.SearchStrategy[str]:
    hex_digits = st.text("0123456789abcdefABCDEF", min_size=38, max_size=42)
    prefix = st.sampled_from(["", "0x", "0X", "x", "00"])
    junk = st.text(max_size=44)
    return st.one_of((prefix.flatmap(lambda p: hex_digits.map(lambda h: p + h))), junk)


@settings(max_examples=400, deadline=None)
@given(st.one_of(_address_texts(), st.binary(min_size=18, max_size=22), st.integers(), st.none()))
def test_is_address_matches_eth_utils(value: object) -> None:
    assert abi_words.is_address(value) == eth_utils.is_address(value)


@settings(max_examples=400, deadline=None)
@given(st.one_of(_address_texts(), st.binary(min_size=20, max_size=20)))
def test_to_checksum_address_matches_eth_utils_on_addresses(value: str | bytes) -> None:
    if not eth_utils.is_address(value):
        with pytest.raises(ValueError):
            abi_words.to_checksum_address(value)
        return
    assert abi_words.to_checksum_address(value) == eth_utils.to_checksum_address(value)


@pytest.mark.parametrize(
    ("types", "values"),
    [
        (["uint8"], [256]),
        (["uint64"], [-1]),
        (["uint256"], [True]),
        (["bool"], [1]),
        (["bytes32"], [b"\x00" * 31]),
        (["address"], ["0x1234"]),
        (["string"], ["hi"]),
        (["uint7"], [1]),
        (["uint256[][]"], [[[1]]]),
        (["uint256[]"], ["12"]),
        (["uint256", "uint256"], [1]),
    ],
)
def test_abi_encode_refuses_what_it_does_not_encode(types: list[str], values: list[object]) -> None:
    with pytest.raises(ProtocolError):
        abi_words.abi_encode(types, values)
