"""Node registry txs: `register_node`, `heartbeat`, `leave`, `attest_stake`, `move_shards`,
`set_numerics`.

A node key registers bound to an EVM address: the EVM key signs `registration_message(node
key)` (EIP-191 personal_sign, `sign_registration`), and the chain recovers the address from it
(`recover_registration`) before it accepts the registration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from protocol.committee.grammar import (
    ADDRESS,
    HEX64,
    NAME,
    SIG65,
    TxDecodeError,
    check,
    uint256_decimal,
)
from protocol.numerics import MAX_NUMERICS

EIP191_REGISTER_PREFIX = "Planet node registration\nnode key: "
ROLES = ("compute", "verifier")
MAX_RENDEZVOUS = 3  # relays one node may name as its rendezvous points


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """A relay that fronts a node behind NAT (docs/overlay.md, *NAT rendezvous*): the relay's
    committee key, and the node's address at that relay (`http(s)://IP:PORT`, the relay's IP
    and the port it gave the node)."""

    relay: str
    endpoint: str

    def to_json(self) -> dict[str, str]:
        return {"endpoint": self.endpoint, "relay": self.relay}

    @classmethod
    def from_json(cls, value: Any) -> Rendezvous:
        from protocol.committee.relays import EndpointError, relay_endpoint

        b = check.exact_object(value, "body.rendezvous[]", {"endpoint", "relay"})
        try:
            endpoint = relay_endpoint(b["endpoint"])
        except EndpointError as error:
            raise TxDecodeError(f"body.rendezvous[].endpoint: {error.reason}") from None
        return cls(check.text(b["relay"], "body.rendezvous[].relay", HEX64), endpoint)

    @property
    def host(self) -> str:
        """The IP literal of `endpoint` (as written, brackets included)."""
        return self.endpoint.split("://", 1)[1].rsplit(":", 1)[0]


@dataclass(frozen=True, slots=True)
class RegisterNode:
    """Register the signer's node key, bound to `evm_address` by an EIP-191 signature over
    `registration_message(signer)` made with that address's key."""

    evm_address: str
    evm_signature: str
    role: str
    model: str
    shards: tuple[int, ...]
    endpoint: str
    capacity: int
    # relays fronting the node behind NAT, in the order clients should try them; empty: none
    # (the field is then left out of the tx, so a registration without it encodes as before)
    rendezvous: tuple[Rendezvous, ...] = ()
    # the numerics the node's shards compute with (protocol/numerics.py, 1..65535); None:
    # unannounced (the field is left out: a registration of an older release, judged as before)
    numerics: int | None = None
    # whether the node's agent rebalances (moves itself to another shard when the pool gains:
    # node/agent/rebalance.py); False: pinned to its shard (`planet join --shard K`), never a
    # swap's partner; None: unannounced (the field is left out: an older release, unknown)
    rebalances: bool | None = None

    TYPE: ClassVar[str] = "register_node"

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "capacity": self.capacity,
            "endpoint": self.endpoint,
            "evm_address": self.evm_address,
            "evm_signature": self.evm_signature,
            "model": self.model,
            "role": self.role,
            "shards": list(self.shards),
        }
        if self.rendezvous:
            body["rendezvous"] = [r.to_json() for r in self.rendezvous]
        if self.numerics is not None:
            body["numerics"] = self.numerics
        if self.rebalances is not None:
            body["rebalances"] = self.rebalances
        return body

    @classmethod
    def from_json(cls, body: Any) -> RegisterNode:
        keys = {"capacity", "endpoint", "evm_address", "evm_signature", "model", "role", "shards"}
        for optional in ("numerics", "rebalances", "rendezvous"):
            if isinstance(body, dict) and optional in body:
                keys.add(optional)
        b = check.exact_object(body, "body", keys)
        role = b["role"]
        if role not in ROLES:
            raise TxDecodeError(f"body.role: expected one of {ROLES}")
        shards = _shards(b["shards"])
        endpoint = _endpoint(b["endpoint"])
        return cls(
            evm_address=check.text(b["evm_address"], "body.evm_address", ADDRESS),
            evm_signature=check.text(b["evm_signature"], "body.evm_signature", SIG65),
            role=role,
            model=check.text(b["model"], "body.model", NAME),
            shards=shards,
            endpoint=endpoint,
            capacity=check.integer(b["capacity"], "body.capacity", 1, 1_000_000),
            rendezvous=_rendezvous(b.get("rendezvous")),
            numerics=_numerics(b),
            rebalances=_rebalances(b),
        )


def _rebalances(body: dict[str, Any]) -> bool | None:
    """Absent: None (unannounced); present: true or false (null, numbers, strings refused)."""
    if "rebalances" not in body:
        return None
    value = body["rebalances"]
    if not isinstance(value, bool):
        raise TxDecodeError("body.rebalances: expected true or false")
    return value


def _numerics(body: dict[str, Any]) -> int | None:
    """Absent: None (unannounced); present: an integer 1..MAX_NUMERICS (null, bools, floats and
    strings refused: one encoding per registration)."""
    if "numerics" not in body:
        return None
    return check.integer(body["numerics"], "body.numerics", 1, MAX_NUMERICS)


def _rendezvous(value: Any) -> tuple[Rendezvous, ...]:
    """Absent: none; else 1..MAX_RENDEZVOUS entries naming distinct relays."""
    if value is None:
        return ()
    entries = tuple(
        Rendezvous.from_json(v) for v in check.items(value, "body.rendezvous", MAX_RENDEZVOUS)
    )
    if len({e.relay for e in entries}) != len(entries):
        raise TxDecodeError("body.rendezvous: a relay is named twice")
    return entries


def _shards(value: Any) -> tuple[int, ...]:
    """1-256 strictly ascending shard indexes 0-65535."""
    shards = tuple(
        check.integer(s, "body.shards[]", 0, 65535) for s in check.items(value, "shards", 256)
    )
    if list(shards) != sorted(set(shards)):
        raise TxDecodeError("body.shards: must be strictly ascending")
    return shards


def _endpoint(value: Any) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= 256 or not value.isprintable():
        raise TxDecodeError("body.endpoint: expected a printable string of 1..256 chars")
    return value


@dataclass(frozen=True, slots=True)
class MoveShards:
    """A registered compute node now serves `shards` of its model at `endpoint` (rebalancing:
    node/agent/rebalance.py). Its key, stake, reputation and status stay; the chain refuses a
    move to what it already serves, to a shard its model does not have, and a second move
    within `MOVE_COOLDOWN_BLOCKS` (abci_app/registry.py)."""

    shards: tuple[int, ...]
    endpoint: str

    TYPE: ClassVar[str] = "move_shards"

    def to_json(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "shards": list(self.shards)}

    @classmethod
    def from_json(cls, body: Any) -> MoveShards:
        b = check.exact_object(body, "body", {"endpoint", "shards"})
        return cls(shards=_shards(b["shards"]), endpoint=_endpoint(b["endpoint"]))


@dataclass(frozen=True, slots=True)
class SetNumerics:
    """A registered compute node will compute with numerics `numerics` (protocol/numerics.py)
    from the next epoch on: its kernels were upgraded. The chain refuses a version its genesis
    does not list, the version the node already has, and a change within
    `NUMERICS_COOLDOWN_EPOCHS` of the last (abci_app/numerics.py)."""

    numerics: int

    TYPE: ClassVar[str] = "set_numerics"

    def to_json(self) -> dict[str, Any]:
        return {"numerics": self.numerics}

    @classmethod
    def from_json(cls, body: Any) -> SetNumerics:
        b = check.exact_object(body, "body", {"numerics"})
        return cls(numerics=check.integer(b["numerics"], "body.numerics", 1, MAX_NUMERICS))


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The node is alive and serving (no fields)."""

    TYPE: ClassVar[str] = "heartbeat"

    def to_json(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_json(cls, body: Any) -> Heartbeat:
        check.exact_object(body, "body", set())
        return cls()


@dataclass(frozen=True, slots=True)
class Leave:
    """The node leaves for good (LEFT is final)."""

    TYPE: ClassVar[str] = "leave"

    def to_json(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_json(cls, body: Any) -> Leave:
        check.exact_object(body, "body", set())
        return cls()


@dataclass(frozen=True, slots=True)
class AttestStake:
    """A validator attests that `node`'s EVM address has `amount` wei staked."""

    node: str
    amount: int

    TYPE: ClassVar[str] = "attest_stake"

    def to_json(self) -> dict[str, Any]:
        return {"amount": str(self.amount), "node": self.node}

    @classmethod
    def from_json(cls, body: Any) -> AttestStake:
        b = check.exact_object(body, "body", {"amount", "node"})
        return cls(
            node=check.text(b["node"], "body.node", HEX64),
            amount=uint256_decimal(b["amount"], "amount"),
        )


def registration_message(node_key_hex: str) -> str:
    """The EIP-191 (personal_sign) text an EVM key signs to bind itself to a node key."""
    return EIP191_REGISTER_PREFIX + node_key_hex


def sign_registration(evm_private_key: bytes | str, node_key_hex: str) -> str:
    """0x-hex 65-byte EIP-191 signature binding an EVM key to `node_key_hex` (eth-account)."""
    from eth_account import Account
    from eth_account.messages import encode_defunct

    signed = Account.sign_message(
        encode_defunct(text=registration_message(node_key_hex)), evm_private_key
    )
    return "0x" + bytes(signed.signature).hex()


def recover_registration(node_key_hex: str, signature_hex: str) -> str:
    """The checksummed EVM address that signed `registration_message(node_key_hex)`;
    raises `ProtocolError` when the signature does not recover."""
    from eth_account.messages import encode_defunct

    from protocol.abi_words import keccak
    from protocol.eip712 import recover_digest

    message = encode_defunct(text=registration_message(node_key_hex))
    digest = keccak(b"\x19" + message.version + message.header + message.body)
    return recover_digest(digest, bytes.fromhex(signature_hex[2:]))
