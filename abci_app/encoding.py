"""Protobuf wire helpers the app needs without generated classes (pure, deterministic).

    encode_uvarint / decode_uvarint   base-128 varints: ABCI's length prefix, protobuf lengths
    proto_tx_size                     the bytes one tx takes in a block's `Data` message

`FramingError` is the one error: bytes that cannot be a varint-prefixed frame.
"""

from __future__ import annotations

from protocol.errors import ProtocolError


class FramingError(ProtocolError):
    """The peer sent a length prefix or message that cannot be a valid ABCI frame."""

    code = "abci_framing"


def encode_uvarint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer (ABCI's length prefix)."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode_uvarint(buf: bytes | bytearray, pos: int) -> tuple[int, int] | None:
    """(value, position after it), or None when `buf` ends inside the varint."""
    result = 0
    shift = 0
    while pos < len(buf):
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise FramingError("varint length prefix longer than 10 bytes")
    return None


def proto_tx_size(tx: bytes) -> int:
    """Bytes a tx takes in the block's `Data` message (CometBFT's `ComputeProtoSizeForTxs`):
    field tag + uvarint length + the tx; PrepareProposal must stay within `max_tx_bytes`."""
    return 1 + len(encode_uvarint(len(tx))) + len(tx)
