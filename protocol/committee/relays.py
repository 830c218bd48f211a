"""The relay registry's tx: `relay` registers an overlay relay (docs/overlay.md).

A relay's committee key registers bound to an EVM address exactly as a node's does (the EIP-191
`registration_message` of protocol/committee/registry.py, signed by the EVM key), with the two
things a user's client needs to put it on a path: its endpoint URL and its X25519 key. The
endpoint is stored and compared as written, so it must already be in its one canonical form
(`relay_endpoint`): `http(s)://IP:PORT`, an IP literal (relays dial next hops only at IP
literals, node/relay/relay.py), an explicit port, nothing after it.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from protocol.committee.grammar import ADDRESS, SIG65, TxDecodeError, check

RELAY_ROLE = "relay"  # a relay's role in its node/<key> record (and the Staking contract's Relay)
RELAY_KEY_HEX = re.compile(r"[0-9a-f]{64}\Z")  # an X25519 public key, 32 bytes
_ENDPOINT = re.compile(r"(https?)://(\[[0-9a-f:.]{2,45}\]|[0-9.]{7,15}):([1-9][0-9]{0,4})\Z")


class EndpointError(ValueError):
    """Why a text is not a relay endpoint in canonical form (`reason`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def relay_endpoint(text: Any) -> str:
    """`text` when it is a relay endpoint in canonical form, else `EndpointError`:
    `http://203.0.113.7:9100`, `https://[2001:db8::1]:443` (IPv6 compressed, lowercase)."""
    if not isinstance(text, str) or len(text) > 64:
        raise EndpointError("expected a string of at most 64 characters")
    match = _ENDPOINT.match(text)
    if match is None:
        raise EndpointError("expected http(s)://IP:PORT (an IP literal, an explicit port)")
    scheme, host, port = match.groups()
    bracketed = host.startswith("[")
    try:
        address = ipaddress.ip_address(host[1:-1] if bracketed else host)
    except ValueError:
        raise EndpointError(f"{host!r} is not an IP address") from None
    if bracketed != (address.version == 6):
        raise EndpointError("IPv6 addresses go in brackets, IPv4 ones do not")
    if int(port) > 65535:
        raise EndpointError(f"port {port} is over 65535")
    canonical = f"{scheme}://{f'[{address}]' if bracketed else address}:{int(port)}"
    if canonical != text:
        raise EndpointError(f"not in canonical form (write {canonical})")
    return text


@dataclass(frozen=True, slots=True)
class RegisterRelay:
    """Register the signer's key as a relay at `endpoint` with X25519 key `relay_key` (hex),
    bound to `evm_address` by an EIP-191 signature over `registration_message(signer)`."""

    evm_address: str
    evm_signature: str
    endpoint: str
    relay_key: str

    TYPE: ClassVar[str] = "relay"

    def to_json(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "evm_address": self.evm_address,
            "evm_signature": self.evm_signature,
            "relay_key": self.relay_key,
        }

    @classmethod
    def from_json(cls, body: Any) -> RegisterRelay:
        b = check.exact_object(
            body, "body", {"endpoint", "evm_address", "evm_signature", "relay_key"}
        )
        try:
            endpoint = relay_endpoint(b["endpoint"])
        except EndpointError as error:
            raise TxDecodeError(f"body.endpoint: {error.reason}") from None
        return cls(
            evm_address=check.text(b["evm_address"], "body.evm_address", ADDRESS),
            evm_signature=check.text(b["evm_signature"], "body.evm_signature", SIG65),
            endpoint=endpoint,
            relay_key=check.text(b["relay_key"], "body.relay_key", RELAY_KEY_HEX),
        )
