"""The pieces of Ethereum's encoding that the shared vocabulary hashes with, import-light.

    keccak(data) / keccak_text(text)    keccak256 (eth-hash, the function eth-utils wraps)
    is_address(value)                   `0x`-optional 40 hex digits (any case), or 20 raw bytes
    to_checksum_address(value)          EIP-55 spelling of an address
    abi_encode(types, values)           `abi.encode` of uintN, address, bytes32, bool and
                                        dynamic arrays of those

Every process imports protocol/, and eth-abi with eth-utils (which pulls in pydantic) cost ~0.2
CPU-s of each start-up (measured with `python -X importtime`: a compute node, the relay, the
committee app). The functions here give the same bytes for the types our structs use, checked
against eth-abi and eth-utils in tests/unit/test_abi_words.py; anything else is refused with a
`ProtocolError` rather than guessed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from eth_hash.auto import keccak as _keccak

from protocol.errors import ProtocolError

_HEX_ADDRESS = re.compile("(0x)?[0-9a-f]{40}", re.IGNORECASE | re.ASCII)
_UINT = re.compile("uint([0-9]{1,3})")
WORD = 32


def keccak(data: bytes) -> bytes:
    """keccak256 of `data`."""
    return _keccak(data)


def keccak_text(text: str) -> bytes:
    """keccak256 of `text`'s UTF-8 bytes (a type string, a domain name)."""
    return _keccak(text.encode("utf-8"))


def is_address(value: object) -> bool:
    """A text address (`0x` optional, 40 hex digits in any case, the checksum not checked) or 20
    raw bytes; what eth-utils' `is_address` accepts."""
    if isinstance(value, str):
        return _HEX_ADDRESS.fullmatch(value) is not None
    return isinstance(value, bytes | bytearray) and len(value) == 20


def to_checksum_address(value: str | bytes) -> str:
    """The EIP-55 spelling of an address given as text (see `is_address`) or 20 raw bytes;
    ValueError for anything else."""
    if isinstance(value, bytes | bytearray):
        if len(value) != 20:
            raise ValueError(f"not an address: {bytes(value)!r}")
        lower = bytes(value).hex()
    elif isinstance(value, str) and _HEX_ADDRESS.fullmatch(value):
        lower = value[-40:].lower()
    else:
        raise ValueError(f"not an address: {value!r}")
    nibbles = keccak(lower.encode("ascii")).hex()
    return "0x" + "".join(
        char.upper() if int(nibble, 16) > 7 else char
        for char, nibble in zip(lower, nibbles, strict=False)
    )


def _word(solidity_type: str, value: object) -> bytes:
    """One static value as its 32-byte ABI word."""
    if solidity_type == "address":
        if not is_address(value):
            raise ProtocolError(f"abi: not an address: {value!r}")
        raw = bytes(value) if isinstance(value, bytes | bytearray) else bytes.fromhex(value[-40:])
        return bytes(12) + raw
    if solidity_type == "bytes32":
        if not isinstance(value, bytes | bytearray) or len(value) != WORD:
            raise ProtocolError(f"abi: bytes32 wants 32 bytes, got {value!r}")
        return bytes(value)
    if solidity_type == "bool":
        if not isinstance(value, bool):
            raise ProtocolError(f"abi: bool wants True or False, got {value!r}")
        return (1 if value else 0).to_bytes(WORD, "big")
    match = _UINT.fullmatch(solidity_type)
    if match and (bits := int(match[1])) % 8 == 0 and 8 <= bits <= 256:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << bits:
            raise ProtocolError(f"abi: {value!r} does not fit {solidity_type}")
        return value.to_bytes(WORD, "big")
    raise ProtocolError(f"abi: unsupported type {solidity_type!r}")


def abi_encode(types: Sequence[str], values: Sequence[object]) -> bytes:
    """`abi.encode(values...)`: static values in place, each `T[]` as an offset in the head and
    its length and elements in the tail (in order)."""
    if len(types) != len(values):
        raise ProtocolError(f"abi: {len(types)} types but {len(values)} values")
    head: list[bytes] = []
    tails: list[bytes] = []
    tail_offset = WORD * len(types)
    for solidity_type, value in zip(types, values, strict=True):
        if not solidity_type.endswith("[]"):
            head.append(_word(solidity_type, value))
            continue
        if isinstance(value, str | bytes | bytearray) or not isinstance(value, Sequence):
            raise ProtocolError(f"abi: {solidity_type} wants a sequence, got {value!r}")
        inner = solidity_type[:-2]
        tail = len(value).to_bytes(WORD, "big") + b"".join(_word(inner, v) for v in value)
        head.append(tail_offset.to_bytes(WORD, "big"))
        tails.append(tail)
        tail_offset += len(tail)
    return b"".join(head) + b"".join(tails)
