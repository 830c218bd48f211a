"""What every committee tx body shares: the decode error, field patterns, limits, checks.

`check` is `protocol.fields.Fields` raising `TxDecodeError`: every body's `from_json` reads its
fields through it, so a malformed field always answers the same named error and message.
"""

from __future__ import annotations

import re
from typing import Any

from protocol.errors import ProtocolError
from protocol.fields import Fields

MAX_NONCE = (1 << 63) - 1
MAX_BATCH = 1024  # records in one commit or reveal tx
U64 = (1 << 64) - 1
U32 = (1 << 32) - 1

HEX64 = re.compile(r"[0-9a-f]{64}\Z")  # an ed25519 key (node key, validator consensus key)
HEX32_0X = re.compile(r"0x[0-9a-f]{64}\Z")  # a 32-byte value: session, hash, salt, query id
ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}\Z")  # an EVM address, any spelling
ADDRESS_LOWER = re.compile(r"0x[0-9a-f]{40}\Z")  # an EVM address, lowercase
SIG65 = re.compile(r"0x[0-9a-f]{130}\Z")  # a secp256k1 signature r‖s‖v
NAME = re.compile(r"[A-Za-z0-9._:/@+-]{1,128}\Z")  # a model id
# wei amounts: ASCII digits only (str.isdigit/int accept other scripts' digits), no leading zero
UINT_DEC = re.compile(r"(?:0|[1-9][0-9]{0,77})\Z")


class TxDecodeError(ProtocolError):
    """The tx bytes are not a well-formed committee tx; `reason` says which rule failed."""

    code = "tx_malformed"

    def __init__(self, reason: str) -> None:
        super().__init__(f"malformed committee tx: {reason}")
        self.reason = reason


check = Fields(TxDecodeError)


def uint256_decimal(value: Any, where: str) -> int:
    """A wei amount: an ASCII decimal string without leading zeros, below 2^256."""
    if not isinstance(value, str) or not UINT_DEC.match(value):
        raise TxDecodeError(f"{where}: expected an ASCII decimal string without leading zeros")
    number = int(value)
    if number >= 1 << 256:
        raise TxDecodeError(f"{where}: exceeds uint256")
    return number
