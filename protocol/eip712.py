"""EIP-712 domains, typed structs and signatures shared with the settlement contracts.

The type strings, field order and encodings are normative (docs/contracts.md); the golden
vectors in tests/vectors/eip712.json are asserted by both this module's tests and the Hardhat
tests, so the Python signers and the Solidity verifiers cannot drift.

    Domain                       {name, version, chainId, verifyingContract}
    committee_domain(...)        "Planet Committee" v1   — committee-signed structs
    fraud_proofs_domain(...)     "Planet Fraud Proofs" v1 — node-signed structs

    TypedStruct (frozen dataclasses, one per primary type)
    ├── CommitteeUpdate(address[] signers,uint256[] powers,uint64 nonce)
    ├── Verdict(address node,uint8 offence,bytes32 evidenceHash,address challenger,uint64 nonce,
    │           address consumer)                                    consumer = FraudProofs
    ├── PayoutRoot(uint64 epoch,bytes32 root,uint256 total,bytes32 queriesHash,address consumer)
    │                                                                consumer = QueryEscrow
    ├── ModelRegistration(bytes32 modelId,bytes32 manifestHash,bytes32[] shardHashes,uint64 nonce,
    │                     address consumer)                          consumer = ModelRegistry
    ├── GatewayBinding(bytes32 gatewayKey,address gateway,bool bound,uint64 nonce,
    │                  bytes32 chain)                 signed by `gateway`, committee domain
    ├── Commitment(bytes32 session,uint64 step,uint32 shard,bytes32 commitment,uint64 signedAt)
    └── Reveal(bytes32 session,uint64 step,uint32 shard,bytes32 manifestHash,bytes32 inputHash,
               bytes32 outputHash,bytes32 salt,uint64 signedAt)

Every committee-signed struct names the contract that consumes it (`consumer`; a
`CommitteeUpdate` is consumed by the `Committee`, its domain's verifyingContract), so a second
deployment sharing the committee refuses old signatures. Node-signed structs carry `signedAt`
(unix seconds) and a reveal carries the model and input the node claims it computed on.

Encoding (EIP-712 `encodeData`): each atomic field is its 32-byte ABI word; an array field is
`keccak256` of the concatenated 32-byte words of its elements. `struct_hash = keccak256(typeHash
‖ encodeData)`, `digest = keccak256(0x1901 ‖ domainSeparator ‖ struct_hash)`.

Signatures are 65 bytes `r‖s‖v` with `v ∈ {27, 28}` and low `s` (what OpenZeppelin's `ECDSA`
accepts); signing is deterministic (RFC 6979, libsecp256k1 through coincurve). Values are
validated when a struct is built: bytes32 fields are exactly 32 bytes, integers fit their width,
addresses are normalised to their checksum spelling. Invalid input raises `ProtocolError`.

Import-light on purpose: protocol.abi_words (eth-hash) and coincurve only — no web3 provider,
no eth-abi or eth-utils (each process's start-up paid ~0.2 CPU-s for them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import coincurve

from protocol.abi_words import abi_encode, is_address, keccak, keccak_text, to_checksum_address
from protocol.canonical import HASH_PREFIX
from protocol.errors import ProtocolError

EIP712_DOMAIN_TYPE = (
    "EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"
)
COMMITTEE_DOMAIN_NAME = "Planet Committee"
FRAUD_PROOFS_DOMAIN_NAME = "Planet Fraud Proofs"
DOMAIN_VERSION = "1"

SIGNATURE_LENGTH = 65
# secp256k1 group order and half of it: OpenZeppelin's ECDSA rejects s > n/2 (malleability).
SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
SECP256K1_HALF_N = SECP256K1_N // 2

# Offence codes (enum Offence in the contracts) and slashed basis points per offence.
OFFENCE_NONE = 0
OFFENCE_COMMIT_REVEAL_MISMATCH = 1
OFFENCE_EQUIVOCATION = 2
OFFENCE_FAILED_VERIFICATION = 3
OFFENCE_TIMEOUT = 4
OFFENCE_COLLUSION = 5
SLASH_BPS: dict[int, int] = {1: 10_000, 2: 10_000, 3: 5_000, 4: 500, 5: 10_000}

# Roles (enum Role in the contracts).
ROLE_NONE = 0
ROLE_COMPUTE = 1
ROLE_VERIFIER = 2


# --- value checks -------------------------------------------------------------------------------


def as_bytes32(value: bytes | str, field: str = "value") -> bytes:
    """Exactly 32 bytes from bytes, `0x`-hex, or a manifest hash `sha256:<hex>`."""
    if isinstance(value, str):
        text = value[len(HASH_PREFIX) :] if value.startswith(HASH_PREFIX) else value
        text = text[2:] if text[:2] in ("0x", "0X") else text
        try:
            value = bytes.fromhex(text)
        except ValueError as error:
            raise ProtocolError(f"{field}: not hex ({error})") from None
    if not isinstance(value, bytes | bytearray) or len(value) != 32:
        raise ProtocolError(f"{field}: expected 32 bytes, got {value!r}")
    return bytes(value)


def as_address(value: str | bytes, field: str = "address") -> str:
    """Checksummed address from a hex string (any case) or 20 raw bytes."""
    if isinstance(value, bytes | bytearray):
        if len(value) != 20:
            raise ProtocolError(f"{field}: expected 20 bytes, got {len(value)}")
        return to_checksum_address(bytes(value))
    if not isinstance(value, str) or not is_address(value):
        raise ProtocolError(f"{field}: not an address: {value!r}")
    body = value[2:]
    mixed_case = body not in (body.lower(), body.upper())
    if mixed_case and to_checksum_address(value) != value:
        raise ProtocolError(f"{field}: bad address checksum: {value!r}")
    return to_checksum_address(value)


def as_uint(value: int, bits: int, field: str = "value") -> int:
    """An integer in [0, 2**bits)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"{field}: expected an integer, got {value!r}")
    if not 0 <= value < (1 << bits):
        raise ProtocolError(f"{field}: {value} does not fit uint{bits}")
    return value


def _hex(data: bytes) -> str:
    return "0x" + data.hex()


# --- domains ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Domain:
    """An EIP-712 domain: `{name, version, chainId, verifyingContract}` (no salt)."""

    name: str
    version: str
    chain_id: int
    verifying_contract: str

    def __post_init__(self) -> None:
        as_uint(self.chain_id, 256, "chainId")
        object.__setattr__(
            self, "verifying_contract", as_address(self.verifying_contract, "verifyingContract")
        )

    def separator(self) -> bytes:
        """The domain separator: `hashStruct(EIP712Domain)`."""
        return keccak(
            keccak_text(EIP712_DOMAIN_TYPE)
            + keccak_text(self.name)
            + keccak_text(self.version)
            + abi_encode(["uint256", "address"], [self.chain_id, self.verifying_contract])
        )

    def to_json(self) -> dict[str, Any]:
        """The domain as ethers / eth-account write it."""
        return {
            "name": self.name,
            "version": self.version,
            "chainId": self.chain_id,
            "verifyingContract": self.verifying_contract,
        }


def committee_domain(chain_id: int, committee: str) -> Domain:
    """Domain of committee-signed structs, verified by the `Committee` contract."""
    return Domain(COMMITTEE_DOMAIN_NAME, DOMAIN_VERSION, chain_id, committee)


def fraud_proofs_domain(chain_id: int, fraud_proofs: str) -> Domain:
    """Domain of node-signed structs (commitments, reveals), verified by `FraudProofs`."""
    return Domain(FRAUD_PROOFS_DOMAIN_NAME, DOMAIN_VERSION, chain_id, fraud_proofs)


# --- typed structs ------------------------------------------------------------------------------


def _check_field(value: Any, solidity_type: str, field: str) -> Any:
    if solidity_type.endswith("[]"):
        if isinstance(value, str | bytes) or not isinstance(value, Iterable):
            raise ProtocolError(f"{field}: expected a sequence, got {value!r}")
        inner = solidity_type[:-2]
        return tuple(_check_field(item, inner, f"{field}[{i}]") for i, item in enumerate(value))
    if solidity_type == "address":
        return as_address(value, field)
    if solidity_type == "bytes32":
        return as_bytes32(value, field)
    if solidity_type.startswith("uint"):
        return as_uint(value, int(solidity_type[4:]), field)
    if solidity_type == "bool":
        if not isinstance(value, bool):
            raise ProtocolError(f"{field}: expected a boolean, got {value!r}")
        return value
    raise ProtocolError(f"{field}: unsupported type {solidity_type}")  # pragma: no cover


def _encode_field(value: Any, solidity_type: str) -> bytes:
    if solidity_type.endswith("[]"):
        inner = solidity_type[:-2]
        return keccak(b"".join(abi_encode([inner], [item]) for item in value))
    return abi_encode([solidity_type], [value])


def _json_value(value: Any, solidity_type: str) -> Any:
    if solidity_type.endswith("[]"):
        return [_json_value(item, solidity_type[:-2]) for item in value]
    if isinstance(value, bytes):
        return _hex(value)
    if solidity_type in ("uint64", "uint256"):
        return str(value)  # may exceed 2^53: JavaScript's JSON.parse would round it
    return value


class TypedStruct:
    """Base of the frozen EIP-712 structs: subclasses set `PRIMARY_TYPE` and `FIELDS`."""

    PRIMARY_TYPE: ClassVar[str]
    # (solidity name, python attribute, solidity type) in type-string order.
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]]

    def __post_init__(self) -> None:
        for name, attr, solidity_type in self.FIELDS:
            checked = _check_field(getattr(self, attr), solidity_type, name)
            object.__setattr__(self, attr, checked)

    @classmethod
    def type_string(cls) -> str:
        """`Name(type1 name1,type2 name2,...)`: what the type hash hashes."""
        members = ",".join(f"{solidity_type} {name}" for name, _, solidity_type in cls.FIELDS)
        return f"{cls.PRIMARY_TYPE}({members})"

    @classmethod
    def type_hash(cls) -> bytes:
        return keccak_text(cls.type_string())

    @classmethod
    def eip712_types(cls) -> dict[str, list[dict[str, str]]]:
        """The `types` object of an `eth_signTypedData_v4` payload (without EIP712Domain)."""
        return {
            cls.PRIMARY_TYPE: [{"name": name, "type": t} for name, _, t in cls.FIELDS],
        }

    def to_message(self) -> dict[str, Any]:
        """The struct as a typed-data message: hex strings for bytes, ints for integers."""
        out: dict[str, Any] = {}
        for name, attr, solidity_type in self.FIELDS:
            value = getattr(self, attr)
            if solidity_type.endswith("[]"):
                out[name] = [_hex(v) if isinstance(v, bytes) else v for v in value]
            else:
                out[name] = _hex(value) if isinstance(value, bytes) else value
        return out

    def to_json_message(self) -> dict[str, Any]:
        """Like `to_message`, with uint64/uint256 values as decimal strings (JSON-safe: they
        can exceed 2^53, which JavaScript numbers cannot hold exactly)."""
        return {
            name: _json_value(getattr(self, attr), solidity_type)
            for name, attr, solidity_type in self.FIELDS
        }

    def encode_data(self) -> bytes:
        return b"".join(
            _encode_field(getattr(self, attr), solidity_type)
            for _, attr, solidity_type in self.FIELDS
        )

    def struct_hash(self) -> bytes:
        """`hashStruct(s) = keccak256(typeHash ‖ encodeData(s))`."""
        return keccak(self.type_hash() + self.encode_data())

    def digest(self, domain: Domain) -> bytes:
        """The 32 bytes that are signed: `keccak256(0x1901 ‖ separator ‖ structHash)`."""
        return typed_data_digest(domain, self.struct_hash())

    def typed_data(self, domain: Domain) -> dict[str, Any]:
        """A full `eth_signTypedData_v4` payload (for wallets and cross-checks)."""
        types = {
            "EIP712Domain": [
                {"name": "name", "type": "string"},
                {"name": "version", "type": "string"},
                {"name": "chainId", "type": "uint256"},
                {"name": "verifyingContract", "type": "address"},
            ],
            **self.eip712_types(),
        }
        return {
            "types": types,
            "primaryType": self.PRIMARY_TYPE,
            "domain": domain.to_json(),
            "message": self.to_message(),
        }

    def sign(self, private_key: bytes | str, domain: Domain) -> bytes:
        """65-byte `r‖s‖v` signature of `digest(domain)`."""
        return sign_digest(private_key, self.digest(domain))

    def recover(self, signature: bytes, domain: Domain) -> str:
        """The checksummed address that signed this struct under `domain`."""
        return recover_digest(self.digest(domain), signature)

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> Self:
        """Build from a typed-data message (uint256 may be decimal strings)."""
        kwargs: dict[str, Any] = {}
        for name, attr, solidity_type in cls.FIELDS:
            if name not in message:
                raise ProtocolError(f"{cls.PRIMARY_TYPE}: missing field {name}")
            kwargs[attr] = _from_json_value(message[name], solidity_type)
        return cls(**kwargs)


def _from_json_value(value: Any, solidity_type: str) -> Any:
    if solidity_type.endswith("[]"):
        if not isinstance(value, list | tuple):
            raise ProtocolError(f"expected a list for {solidity_type}, got {value!r}")
        return tuple(_from_json_value(item, solidity_type[:-2]) for item in value)
    if solidity_type.startswith("uint") and isinstance(value, str):
        if not value.isdigit():
            raise ProtocolError(f"expected a decimal string for {solidity_type}, got {value!r}")
        return int(value)
    return value


@dataclass(frozen=True, slots=True)
class CommitteeUpdate(TypedStruct):
    """A new committee (signers ascending, powers aligned), signed by the current one."""

    signers: tuple[str, ...]
    powers: tuple[int, ...]
    nonce: int

    PRIMARY_TYPE: ClassVar[str] = "CommitteeUpdate"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("signers", "signers", "address[]"),
        ("powers", "powers", "uint256[]"),
        ("nonce", "nonce", "uint64"),
    )


@dataclass(frozen=True, slots=True)
class Verdict(TypedStruct):
    """A committee's decision that `node` committed `offence` (single-use `nonce`), for the
    `FraudProofs` contract `consumer`."""

    node: str
    offence: int
    evidence_hash: bytes
    challenger: str
    nonce: int
    consumer: str

    PRIMARY_TYPE: ClassVar[str] = "Verdict"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("node", "node", "address"),
        ("offence", "offence", "uint8"),
        ("evidenceHash", "evidence_hash", "bytes32"),
        ("challenger", "challenger", "address"),
        ("nonce", "nonce", "uint64"),
        ("consumer", "consumer", "address"),
    )


@dataclass(frozen=True, slots=True)
class PayoutRoot(TypedStruct):
    """The Merkle root of an epoch's payouts, their total and the settled queries' hash, for the
    `QueryEscrow` contract `consumer`."""

    epoch: int
    root: bytes
    total: int
    queries_hash: bytes
    consumer: str

    PRIMARY_TYPE: ClassVar[str] = "PayoutRoot"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("epoch", "epoch", "uint64"),
        ("root", "root", "bytes32"),
        ("total", "total", "uint256"),
        ("queriesHash", "queries_hash", "bytes32"),
        ("consumer", "consumer", "address"),
    )


@dataclass(frozen=True, slots=True)
class ModelRegistration(TypedStruct):
    """A model id bound to its manifest hash and shard hashes (registry nonce), for the
    `ModelRegistry` contract `consumer`."""

    model_id: bytes
    manifest_hash: bytes
    shard_hashes: tuple[bytes, ...]
    nonce: int
    consumer: str

    PRIMARY_TYPE: ClassVar[str] = "ModelRegistration"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("modelId", "model_id", "bytes32"),
        ("manifestHash", "manifest_hash", "bytes32"),
        ("shardHashes", "shard_hashes", "bytes32[]"),
        ("nonce", "nonce", "uint64"),
        ("consumer", "consumer", "address"),
    )


@dataclass(frozen=True, slots=True)
class GatewayBinding(TypedStruct):
    """An EVM address's consent that the gateway committee key `gateway_key` (ed25519, 32 bytes)
    is paid at it (`bound`), or no longer (`bound` false: revoked), on the committee chain whose
    CometBFT chain id hashes to `chain`; `nonce` strictly above the address's last one. Signed by
    `gateway` under the committee domain (docs/committee.md, *Gateway bindings*)."""

    gateway_key: bytes
    gateway: str
    bound: bool
    nonce: int
    chain: bytes

    PRIMARY_TYPE: ClassVar[str] = "GatewayBinding"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("gatewayKey", "gateway_key", "bytes32"),
        ("gateway", "gateway", "address"),
        ("bound", "bound", "bool"),
        ("nonce", "nonce", "uint64"),
        ("chain", "chain", "bytes32"),
    )


def committee_chain_hash(chain_id: str) -> bytes:
    """`GatewayBinding.chain`: keccak256 of the committee chain's CometBFT chain id (UTF-8)."""
    return keccak_text(chain_id)


@dataclass(frozen=True, slots=True)
class Commitment(TypedStruct):
    """A node's signed commitment to one (session, step, shard) output, signed at `signed_at`
    (unix seconds)."""

    session: bytes
    step: int
    shard: int
    commitment: bytes
    signed_at: int

    PRIMARY_TYPE: ClassVar[str] = "Commitment"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("session", "session", "bytes32"),
        ("step", "step", "uint64"),
        ("shard", "shard", "uint32"),
        ("commitment", "commitment", "bytes32"),
        ("signedAt", "signed_at", "uint64"),
    )


@dataclass(frozen=True, slots=True)
class Reveal(TypedStruct):
    """A node's signed opening of a commitment and its claim about the computation: shard
    `shard` of the model with manifest hash `manifest_hash` turned the input hashing to
    `input_hash` into the output hashing to `output_hash`."""

    session: bytes
    step: int
    shard: int
    manifest_hash: bytes
    input_hash: bytes
    output_hash: bytes
    salt: bytes
    signed_at: int

    PRIMARY_TYPE: ClassVar[str] = "Reveal"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("session", "session", "bytes32"),
        ("step", "step", "uint64"),
        ("shard", "shard", "uint32"),
        ("manifestHash", "manifest_hash", "bytes32"),
        ("inputHash", "input_hash", "bytes32"),
        ("outputHash", "output_hash", "bytes32"),
        ("salt", "salt", "bytes32"),
        ("signedAt", "signed_at", "uint64"),
    )

    def commitment_value(self) -> bytes:
        """What an honest `Commitment.commitment` for this reveal is."""
        return commitment_value(self.session, self.step, self.shard, self.output_hash, self.salt)


STRUCT_TYPES: tuple[type[TypedStruct], ...] = (
    CommitteeUpdate,
    Verdict,
    PayoutRoot,
    ModelRegistration,
    Commitment,
    Reveal,
)


# --- hashing helpers ----------------------------------------------------------------------------


def typed_data_digest(domain: Domain, struct_hash: bytes) -> bytes:
    """`keccak256(0x1901 ‖ domainSeparator ‖ structHash)`."""
    return keccak(b"\x19\x01" + domain.separator() + as_bytes32(struct_hash, "structHash"))


def commitment_value(
    session: bytes | str, step: int, shard: int, output_hash: bytes | str, salt: bytes | str
) -> bytes:
    """`keccak256(abi.encode(bytes32 session, uint64 step, uint32 shard, bytes32 outputHash,
    bytes32 salt))`: the value a node commits to before revealing."""
    # abi.encode of static types is five 32-byte words (uints left-padded): packed directly, as
    # the committee app checks every revealed record with it (eth_abi cost ~30 µs per call)
    return keccak(
        as_bytes32(session, "session")
        + as_uint(step, 64, "step").to_bytes(32, "big")
        + as_uint(shard, 32, "shard").to_bytes(32, "big")
        + as_bytes32(output_hash, "outputHash")
        + as_bytes32(salt, "salt")
    )


def evidence_id(node: str, session: bytes | str, step: int, shard: int) -> bytes:
    """`FraudProofs.evidenceId`: `keccak256(abi.encode(address node, bytes32 session,
    uint64 step, uint32 shard))`."""
    return keccak(
        abi_encode(
            ["address", "bytes32", "uint64", "uint32"],
            [
                as_address(node, "node"),
                as_bytes32(session, "session"),
                as_uint(step, 64, "step"),
                as_uint(shard, 32, "shard"),
            ],
        )
    )


def verdict_evidence_id(node: str, evidence_hash: bytes | str) -> bytes:
    """`FraudProofs.verdictEvidenceId`: `keccak256(abi.encode(address node, bytes32 hash))`."""
    return keccak(
        abi_encode(
            ["address", "bytes32"],
            [as_address(node, "node"), as_bytes32(evidence_hash, "evidenceHash")],
        )
    )


def challenge_commitment(
    challenger: str, evidence: bytes | str, offence: int, salt: bytes | str
) -> bytes:
    """`FraudProofs.challengeCommitment`: `keccak256(abi.encode(address challenger,
    bytes32 evidenceId, uint8 offence, bytes32 salt))`, committed a block before the proof."""
    if offence not in SLASH_BPS:
        raise ProtocolError(f"offence: expected 1..5, got {offence!r}")
    return keccak(
        abi_encode(
            ["address", "bytes32", "uint8", "bytes32"],
            [
                as_address(challenger, "challenger"),
                as_bytes32(evidence, "evidenceId"),
                offence,
                as_bytes32(salt, "salt"),
            ],
        )
    )


def queries_hash(
    query_ids: Sequence[bytes | str],
    fees: Sequence[int],
    payers: Sequence[str] = (),
    gateways: Sequence[str] = (),
    debits: Sequence[int] = (),
) -> bytes:
    """`keccak256(abi.encode(bytes32[] queryIds, uint256[] fees, address[] payers, address[]
    gateways, uint256[] debits))` (dynamic ABI encoding): the per-query fees and the prepaid
    debits per (payer, gateway) an epoch charges, bound into its `PayoutRoot`. The escrow wants
    the (payer, gateway) pairs strictly ascending; this hashes them in the order given."""
    if len(query_ids) != len(fees):
        raise ProtocolError(f"{len(query_ids)} query ids but {len(fees)} fees")
    if not len(payers) == len(gateways) == len(debits):
        raise ProtocolError(
            f"{len(payers)} payers, {len(gateways)} gateways and {len(debits)} debits: "
            "one of each per prepaid debit"
        )
    ids = [as_bytes32(q, f"queryIds[{i}]") for i, q in enumerate(query_ids)]
    amounts = [as_uint(f, 256, f"fees[{i}]") for i, f in enumerate(fees)]
    addresses = [as_address(p, f"payers[{i}]") for i, p in enumerate(payers)]
    spenders = [as_address(g, f"gateways[{i}]") for i, g in enumerate(gateways)]
    owed = [as_uint(d, 256, f"debits[{i}]") for i, d in enumerate(debits)]
    return keccak(
        abi_encode(
            ["bytes32[]", "uint256[]", "address[]", "address[]", "uint256[]"],
            [ids, amounts, addresses, spenders, owed],
        )
    )


# --- keys and signatures ------------------------------------------------------------------------


def _private_key_bytes(private_key: bytes | str) -> bytes:
    key = as_bytes32(private_key, "private key") if isinstance(private_key, str) else private_key
    if not isinstance(key, bytes | bytearray) or len(key) != 32:
        raise ProtocolError("private key: expected 32 bytes")
    if not 0 < int.from_bytes(key, "big") < SECP256K1_N:
        raise ProtocolError("private key: out of the secp256k1 range")
    return bytes(key)


def _address_of_public_key(public_key: coincurve.PublicKey) -> str:
    return to_checksum_address(keccak(public_key.format(compressed=False)[1:])[-20:])


def address_of(private_key: bytes | str) -> str:
    """The checksummed EVM address of a secp256k1 private key."""
    return _address_of_public_key(coincurve.PrivateKey(_private_key_bytes(private_key)).public_key)


def sign_digest(private_key: bytes | str, digest: bytes) -> bytes:
    """65-byte `r‖s‖v` (v = 27 + recovery id) over a 32-byte digest; low s, deterministic."""
    key = coincurve.PrivateKey(_private_key_bytes(private_key))
    raw = key.sign_recoverable(as_bytes32(digest, "digest"), hasher=None)
    return raw[:64] + bytes([27 + raw[64]])


def recover_digest(digest: bytes, signature: bytes) -> str:
    """Signer of `digest`, with OpenZeppelin ECDSA's rules: 65 bytes, v ∈ {27, 28}, low s."""
    if not isinstance(signature, bytes | bytearray) or len(signature) != SIGNATURE_LENGTH:
        raise ProtocolError(f"signature: expected {SIGNATURE_LENGTH} bytes")
    r = int.from_bytes(signature[:32], "big")
    s = int.from_bytes(signature[32:64], "big")
    v = signature[64]
    if v not in (27, 28):
        raise ProtocolError(f"signature: v must be 27 or 28, got {v}")
    if not 0 < r < SECP256K1_N or not 0 < s <= SECP256K1_HALF_N:
        raise ProtocolError("signature: r or s out of range (high s is malleable)")
    try:
        public_key = coincurve.PublicKey.from_signature_and_message(
            bytes(signature[:64]) + bytes([v - 27]), as_bytes32(digest, "digest"), hasher=None
        )
    except Exception as error:  # coincurve raises a bare Exception on unrecoverable input
        raise ProtocolError(f"signature: not recoverable ({error})") from None
    return _address_of_public_key(public_key)


def committee_signatures(
    struct: TypedStruct, private_keys: Iterable[bytes | str], domain: Domain
) -> list[bytes]:
    """Signatures of `struct` by each key, ordered by ascending signer address (as
    `Committee.verify` requires); duplicate keys are rejected."""
    signed: dict[str, bytes] = {}
    digest = struct.digest(domain)
    for key in private_keys:
        signer = address_of(key)
        if signer in signed:
            raise ProtocolError(f"committee_signatures: duplicate signer {signer}")
        signed[signer] = sign_digest(key, digest)
    return [signed[a] for a in sorted(signed, key=lambda a: int(a, 16))]


def replace(struct: TypedStruct, **changes: Any) -> TypedStruct:
    """A copy of `struct` with some fields changed (re-validated)."""
    return dataclasses.replace(struct, **changes)  # type: ignore[type-var]
