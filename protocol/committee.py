"""Committee-chain transactions: the shared vocabulary of the ABCI app and its clients.

Wire format (one CometBFT tx = the UTF-8 bytes of one canonical JSON object, see
`protocol.canonical`: sorted keys, no whitespace, no floats):

    {"body": {...}, "nonce": 7, "sig": "<128 hex>", "signer": "<64 hex>", "type": "heartbeat"}

- `signer`: the ed25519 public key (32 bytes, lowercase hex) of a node key or a validator's
  CometBFT consensus key. It is also the account id (nonces are per signer).
- `nonce`: strictly greater than the signer's last committed nonce (gaps allowed), < 2**63.
  A tx that passes decoding, signature and nonce checks consumes its nonce even when a state
  rule then rejects it (so its bytes can never be replayed later).
- `sig`: ed25519 signature over `SIGN_DOMAIN + canonical_json({body, nonce, signer, type})`.
- `body`: the type's fields (below). Integers that may exceed 2**53 (`amount`) are decimal
  strings; 32-byte values are `0x`-hex; EVM addresses are 0x-hex (checksum spelling on output).
- A tx whose bytes are not exactly the canonical encoding is rejected (no malleable tx hashes).

Tx types (`type` → dataclass):

    register_node   RegisterNode   node key + EVM address (EIP-191 signature) + role + model/shards
    heartbeat       Heartbeat      keeps a node SERVING (JOIN/DOWN → SERVING)
    leave           Leave          SERVING/JOIN/DOWN → LEFT (final)
    attest_stake    AttestStake    a validator saw `amount` wei staked by `node` on the EVM chain
    commit          CommitBatch    many (session, step, shard, commitment) records
    reveal          RevealBatch    many (session, step, shard, output_hash, salt) openings
    verdict_vote    VerdictVote    a validator's EIP-712 signature over a `Verdict`
    work_report     WorkReport     a gateway's per-node work aggregates + settled query fees
    contribution    Contribution   a compute node's own per-shard layer/token count
    payout_vote     PayoutVote     a validator's EIP-712 signature over an epoch's `PayoutRoot`
    spot_check_report SpotCheckReport  a validator's verifier lists the spot checks it did
    seed_commit     SeedCommit     a validator's verifier commits to its secret challenge seed
                                   for a future epoch (`seed_commitment`)
    seed_reveal     SeedReveal     ... and opens it once that epoch has closed

`TxDecodeError` (malformed bytes or fields) and `TxSignatureError` (bad ed25519 signature) are
typed `ProtocolError`s; the ABCI app maps them to named result codes.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from protocol.canonical import JsonInputError, canonical_json, canonical_text, parse_json
from protocol.errors import ProtocolError

SIGN_DOMAIN = b"planet-committee-tx/v1\n"
EIP191_REGISTER_PREFIX = "Planet node registration\nnode key: "
MAX_TX_BYTES = 64 * 1024
MAX_BATCH = 1024
MAX_NONCE = (1 << 63) - 1
MAX_TX_DEPTH = 8  # deepest valid tx: envelope → body → list → item (4)
ROLES = ("compute", "verifier")

_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_HEX32_0X = re.compile(r"0x[0-9a-f]{64}\Z")
_U64 = (1 << 64) - 1
_U32 = (1 << 32) - 1
_COMMITMENT_KEYS = {"commitment": 0, "session": 0, "shard": 0, "step": 0}.keys()
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}\Z")
_SIG65 = re.compile(r"0x[0-9a-f]{130}\Z")
_HEX128 = re.compile(r"[0-9a-f]{128}\Z")
_NAME = re.compile(r"[A-Za-z0-9._:/@+-]{1,128}\Z")
# wei amounts: ASCII digits only (str.isdigit/int accept other scripts' digits), no leading zero
_UINT_DEC = re.compile(r"(?:0|[1-9][0-9]{0,77})\Z")


class TxDecodeError(ProtocolError):
    """The tx bytes are not a well-formed committee tx; `reason` says which rule failed."""

    code = "tx_malformed"

    def __init__(self, reason: str) -> None:
        super().__init__(f"malformed committee tx: {reason}")
        self.reason = reason


class TxSignatureError(ProtocolError):
    """The ed25519 signature does not verify under the tx's `signer`."""

    code = "tx_bad_signature"

    def __init__(self, signer: str) -> None:
        super().__init__(f"bad ed25519 signature for signer {signer}")
        self.signer = signer


# --- field checks -------------------------------------------------------------------------------


def _obj(value: Any, where: str, keys: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TxDecodeError(f"{where}: expected an object")
    if set(value) != keys:
        got = ascii(sorted(value))[:200]
        raise TxDecodeError(f"{where}: expected keys {sorted(keys)}, got {got}")
    return value


def _int(value: Any, where: str, lo: int = 0, hi: int = MAX_NONCE) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise TxDecodeError(f"{where}: expected an integer in [{lo}, {hi}]")
    return value


def _str(value: Any, where: str, pattern: re.Pattern[str], max_len: int = 256) -> str:
    if not isinstance(value, str) or len(value) > max_len or not pattern.match(value):
        raise TxDecodeError(f"{where}: bad value {ascii(value)[:120]}")
    return value


def _uint256_str(value: Any, where: str) -> int:
    if not isinstance(value, str) or not _UINT_DEC.match(value):
        raise TxDecodeError(f"{where}: expected an ASCII decimal string without leading zeros")
    number = int(value)
    if number >= 1 << 256:
        raise TxDecodeError(f"{where}: exceeds uint256")
    return number


def _list(value: Any, where: str, max_len: int = MAX_BATCH) -> list[Any]:
    if not isinstance(value, list) or not 0 < len(value) <= max_len:
        raise TxDecodeError(f"{where}: expected a list of 1..{max_len} items")
    return value


# --- tx bodies ----------------------------------------------------------------------------------


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

    TYPE: ClassVar[str] = "register_node"

    def to_json(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "endpoint": self.endpoint,
            "evm_address": self.evm_address,
            "evm_signature": self.evm_signature,
            "model": self.model,
            "role": self.role,
            "shards": list(self.shards),
        }

    @classmethod
    def from_json(cls, body: Any) -> RegisterNode:
        keys = {"capacity", "endpoint", "evm_address", "evm_signature", "model", "role", "shards"}
        b = _obj(body, "body", keys)
        role = b["role"]
        if role not in ROLES:
            raise TxDecodeError(f"body.role: expected one of {ROLES}")
        shards = tuple(
            _int(s, "body.shards[]", 0, 65535) for s in _list(b["shards"], "shards", 256)
        )
        if list(shards) != sorted(set(shards)):
            raise TxDecodeError("body.shards: must be strictly ascending")
        endpoint = b["endpoint"]
        if (
            not isinstance(endpoint, str)
            or not 0 < len(endpoint) <= 256
            or not endpoint.isprintable()
        ):
            raise TxDecodeError("body.endpoint: expected a printable string of 1..256 chars")
        return cls(
            evm_address=_str(b["evm_address"], "body.evm_address", _ADDRESS),
            evm_signature=_str(b["evm_signature"], "body.evm_signature", _SIG65),
            role=role,
            model=_str(b["model"], "body.model", _NAME),
            shards=shards,
            endpoint=endpoint,
            capacity=_int(b["capacity"], "body.capacity", 1, 1_000_000),
        )


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The node is alive and serving (no fields)."""

    TYPE: ClassVar[str] = "heartbeat"

    def to_json(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_json(cls, body: Any) -> Heartbeat:
        _obj(body, "body", set())
        return cls()


@dataclass(frozen=True, slots=True)
class Leave:
    """The node leaves for good (LEFT is final)."""

    TYPE: ClassVar[str] = "leave"

    def to_json(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_json(cls, body: Any) -> Leave:
        _obj(body, "body", set())
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
        b = _obj(body, "body", {"amount", "node"})
        return cls(
            node=_str(b["node"], "body.node", _HEX64), amount=_uint256_str(b["amount"], "amount")
        )


@dataclass(frozen=True, slots=True)
class CommitmentRecord:
    """One commitment: `commitment = keccak256(abi.encode(session, step, shard, output_hash,
    salt))` (see `protocol.eip712.commitment_value`)."""

    session: str
    step: int
    shard: int
    commitment: str

    def to_json(self) -> dict[str, Any]:
        return {
            "commitment": self.commitment,
            "session": self.session,
            "shard": self.shard,
            "step": self.step,
        }

    @classmethod
    def from_json(cls, item: Any) -> CommitmentRecord:
        # the hot path of the busiest tx type: plain type checks, one regex per hex field
        if type(item) is dict and item.keys() == _COMMITMENT_KEYS:
            session, step = item["session"], item["step"]
            shard, value = item["shard"], item["commitment"]
            if (
                type(session) is str
                and type(value) is str
                and type(step) is int
                and type(shard) is int
                and 0 <= step <= _U64
                and 0 <= shard <= _U32
                and _HEX32_0X.match(session)
                and _HEX32_0X.match(value)
            ):
                return cls(session, step, shard, value)
        b = _obj(item, "commitment", set(_COMMITMENT_KEYS))
        return cls(  # one of these raises with the precise reason
            session=_str(b["session"], "session", _HEX32_0X),
            step=_int(b["step"], "step", 0, _U64),
            shard=_int(b["shard"], "shard", 0, _U32),
            commitment=_str(b["commitment"], "commitment", _HEX32_0X),
        )


@dataclass(frozen=True, slots=True)
class CommitBatch:
    """Many commitments in one tx (no two for the same session/step/shard)."""

    commitments: tuple[CommitmentRecord, ...]

    TYPE: ClassVar[str] = "commit"

    def to_json(self) -> dict[str, Any]:
        return {"commitments": [c.to_json() for c in self.commitments]}

    @classmethod
    def from_json(cls, body: Any) -> CommitBatch:
        b = _obj(body, "body", {"commitments"})
        items = tuple(CommitmentRecord.from_json(i) for i in _list(b["commitments"], "commitments"))
        if len({(c.session, c.step, c.shard) for c in items}) != len(items):
            raise TxDecodeError("body.commitments: duplicate (session, step, shard)")
        return cls(items)


@dataclass(frozen=True, slots=True)
class RevealRecord:
    """The opening of one commitment."""

    session: str
    step: int
    shard: int
    output_hash: str
    salt: str

    def to_json(self) -> dict[str, Any]:
        return {
            "output_hash": self.output_hash,
            "salt": self.salt,
            "session": self.session,
            "shard": self.shard,
            "step": self.step,
        }

    @classmethod
    def from_json(cls, item: Any) -> RevealRecord:
        b = _obj(item, "reveal", {"output_hash", "salt", "session", "shard", "step"})
        return cls(
            session=_str(b["session"], "session", _HEX32_0X),
            step=_int(b["step"], "step", 0, (1 << 64) - 1),
            shard=_int(b["shard"], "shard", 0, (1 << 32) - 1),
            output_hash=_str(b["output_hash"], "output_hash", _HEX32_0X),
            salt=_str(b["salt"], "salt", _HEX32_0X),
        )


@dataclass(frozen=True, slots=True)
class RevealBatch:
    """Many reveals in one tx; each must match a commitment by the same node."""

    reveals: tuple[RevealRecord, ...]

    TYPE: ClassVar[str] = "reveal"

    def to_json(self) -> dict[str, Any]:
        return {"reveals": [r.to_json() for r in self.reveals]}

    @classmethod
    def from_json(cls, body: Any) -> RevealBatch:
        b = _obj(body, "body", {"reveals"})
        items = tuple(RevealRecord.from_json(i) for i in _list(b["reveals"], "reveals"))
        if len({(r.session, r.step, r.shard) for r in items}) != len(items):
            raise TxDecodeError("body.reveals: duplicate (session, step, shard)")
        return cls(items)


@dataclass(frozen=True, slots=True)
class VerdictVote:
    """A validator's vote for `Verdict(node, offence, evidenceHash, challenger, nonce)`:
    `signature` is its operator key's EIP-712 signature (65 bytes r‖s‖v, 0x-hex) under the
    "Planet Committee" domain from genesis."""

    node: str
    offence: int
    evidence_hash: str
    challenger: str
    verdict_nonce: int
    signature: str

    TYPE: ClassVar[str] = "verdict_vote"

    def to_json(self) -> dict[str, Any]:
        return {
            "challenger": self.challenger,
            "evidence_hash": self.evidence_hash,
            "node": self.node,
            "offence": self.offence,
            "signature": self.signature,
            "verdict_nonce": self.verdict_nonce,
        }

    @classmethod
    def from_json(cls, body: Any) -> VerdictVote:
        keys = {"challenger", "evidence_hash", "node", "offence", "signature", "verdict_nonce"}
        b = _obj(body, "body", keys)
        return cls(
            node=_str(b["node"], "body.node", _ADDRESS),
            offence=_int(b["offence"], "body.offence", 1, 5),
            evidence_hash=_str(b["evidence_hash"], "body.evidence_hash", _HEX32_0X),
            challenger=_str(b["challenger"], "body.challenger", _ADDRESS),
            verdict_nonce=_int(b["verdict_nonce"], "body.verdict_nonce", 0, (1 << 64) - 1),
            signature=_str(b["signature"], "body.signature", _SIG65),
        )


# --- settlement: gateway work reports, node contributions, payout votes ------------------------

MAX_REPORT_ITEMS = 1024
MAX_LAYERS = 65_536
MAX_TOKENS = (1 << 48) - 1  # per report item and per contribution item
_FEE_DEC = re.compile(r"(?:0|[1-9][0-9]{0,19})\Z")
MAX_FEE = (1 << 64) - 1  # the escrow's deposit cap


def _pair_list(value: Any, where: str, size: int, max_len: int) -> list[list[Any]]:
    if not isinstance(value, list) or len(value) > max_len:
        raise TxDecodeError(f"{where}: expected a list of at most {max_len} items")
    for item in value:
        if not isinstance(item, list) or len(item) != size:
            raise TxDecodeError(f"{where}: expected items of {size} values")
    return value


@dataclass(frozen=True, slots=True)
class NodeWork:
    """Per-node aggregate a gateway vouches for: `node` (key hex) ran `layers` layers of
    (`model`, `shard`) over `tokens` tokens of the questions the gateway was paid for."""

    node: str
    model: str
    shard: int
    layers: int
    tokens: int

    def to_json(self) -> list[Any]:
        return [self.node, self.model, self.shard, self.layers, self.tokens]


@dataclass(frozen=True, slots=True)
class ShardWork:
    """A compute node's own count: `layers` layers of (`model`, `shard`) over `tokens` tokens."""

    model: str
    shard: int
    layers: int
    tokens: int

    def to_json(self) -> list[Any]:
        return [self.model, self.shard, self.layers, self.tokens]


def _shard_fields(item: list[Any], where: str) -> tuple[str, int, int, int]:
    return (
        _str(item[0], f"{where}.model", _NAME),
        _int(item[1], f"{where}.shard", 0, 65535),
        _int(item[2], f"{where}.layers", 1, MAX_LAYERS),
        _int(item[3], f"{where}.tokens", 1, MAX_TOKENS),
    )


MAX_DEBIT_WEI = (1 << 128) - 1  # QueryEscrow keeps a prepaid balance in a uint128
_ADDRESS_LOWER = re.compile(r"0x[0-9a-f]{40}\Z")


@dataclass(frozen=True, slots=True)
class PrepaidItem:
    """One prepaid question a gateway charged: what the chain needs to debit `payer` — the
    payer-signed voucher (`gateway`, `query_id`, `model_id`, `fee_cap`, `expiry`, signature)
    and the `fee` charged. No node, circuit or session: a payer is never tied to nodes here.

    Wire: `[gateway, payer, query id, model id, fee, fee cap, expiry, voucher signature]`,
    addresses lowercase 0x-hex, fee and cap decimal wei strings (< 2^128), expiry unix seconds."""

    gateway: str
    payer: str
    query_id: str
    model_id: str
    fee: int
    fee_cap: int
    expiry: int
    signature: str

    def to_json(self) -> list[Any]:
        return [
            self.gateway,
            self.payer,
            self.query_id,
            self.model_id,
            str(self.fee),
            str(self.fee_cap),
            self.expiry,
            self.signature,
        ]

    @classmethod
    def from_json(cls, item: list[Any]) -> PrepaidItem:
        where = "body.prepaid[]"
        amounts = []
        for value, name in ((item[4], "fee"), (item[5], "fee_cap")):
            if not isinstance(value, str) or not _UINT_DEC.match(value):
                raise TxDecodeError(f"{where}.{name}: expected a decimal wei string < 2^128")
            if int(value) > MAX_DEBIT_WEI:
                raise TxDecodeError(f"{where}.{name}: expected a decimal wei string < 2^128")
            amounts.append(int(value))
        return cls(
            gateway=_str(item[0], f"{where}.gateway", _ADDRESS_LOWER),
            payer=_str(item[1], f"{where}.payer", _ADDRESS_LOWER),
            query_id=_str(item[2], f"{where}.query_id", _HEX32_0X),
            model_id=_str(item[3], f"{where}.model_id", _HEX32_0X),
            fee=amounts[0],
            fee_cap=amounts[1],
            expiry=_int(item[6], f"{where}.expiry", 0, _U64),
            signature=_str(item[7], f"{where}.signature", _SIG65),
        )


@dataclass(frozen=True, slots=True)
class WorkReport:
    """A gateway's batch: per-node aggregates of the work in its signed receipts, and the query
    ids it settled with their fees. The two lists are not linked to each other (no session, no
    per-query node): nothing here ties a question to the nodes that computed it.

    Wire: `{"work": [[node, model, shard, layers, tokens], ...], "queries": [[query id, fee wei
    as a decimal string], ...]}`; work strictly ascending by (node, model, shard), queries
    strictly ascending by id, at most 1024 each, at least one item in all."""

    work: tuple[NodeWork, ...]
    queries: tuple[tuple[str, int], ...]
    prepaid: tuple[PrepaidItem, ...] = ()

    TYPE: ClassVar[str] = "work_report"

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "queries": [[query_id, str(fee)] for query_id, fee in self.queries],
            "work": [w.to_json() for w in self.work],
        }
        if self.prepaid:  # absent when empty: reports without prepaid charges keep their bytes
            doc["prepaid"] = [p.to_json() for p in self.prepaid]
        return doc

    @classmethod
    def from_json(cls, body: Any) -> WorkReport:
        keys = {"queries", "work"}
        if isinstance(body, dict) and "prepaid" in body:
            keys.add("prepaid")
        b = _obj(body, "body", keys)
        work = []
        for item in _pair_list(b["work"], "body.work", 5, MAX_REPORT_ITEMS):
            node = _str(item[0], "body.work[].node", _HEX64)
            work.append(NodeWork(node, *_shard_fields(item[1:], "body.work[]")))
        keys = [(w.node, w.model, w.shard) for w in work]
        if keys != sorted(set(keys)):
            raise TxDecodeError("body.work: must be strictly ascending by (node, model, shard)")
        queries = []
        for item in _pair_list(b["queries"], "body.queries", 2, MAX_REPORT_ITEMS):
            query_id = _str(item[0], "body.queries[].id", _HEX32_0X)
            fee = item[1]
            if not isinstance(fee, str) or not _FEE_DEC.match(fee) or int(fee) > MAX_FEE:
                raise TxDecodeError("body.queries[].fee: expected a decimal wei string < 2^64")
            queries.append((query_id, int(fee)))
        ids = [q for q, _ in queries]
        if ids != sorted(set(ids)):
            raise TxDecodeError("body.queries: must be strictly ascending by id")
        prepaid: list[PrepaidItem] = []
        if "prepaid" in b:
            items = _pair_list(b["prepaid"], "body.prepaid", 8, MAX_REPORT_ITEMS)
            if not items:
                raise TxDecodeError("body.prepaid: omit the key instead of an empty list")
            prepaid = [PrepaidItem.from_json(item) for item in items]
            charged = [(p.payer, p.query_id) for p in prepaid]
            if charged != sorted(set(charged)):
                raise TxDecodeError("body.prepaid: must be strictly ascending by (payer, query id)")
        if not work and not queries and not prepaid:
            raise TxDecodeError("body: an empty report")
        return cls(tuple(work), tuple(queries), tuple(prepaid))


@dataclass(frozen=True, slots=True)
class Contribution:
    """A compute node's own per-shard count since its last contribution. The chain credits it
    only up to the work gateways reported for this node (see `abci_app/settlement.py`).

    Wire: `{"work": [[model, shard, layers, tokens], ...]}`, 1–256 items strictly ascending by
    (model, shard)."""

    work: tuple[ShardWork, ...]

    TYPE: ClassVar[str] = "contribution"

    def to_json(self) -> dict[str, Any]:
        return {"work": [w.to_json() for w in self.work]}

    @classmethod
    def from_json(cls, body: Any) -> Contribution:
        b = _obj(body, "body", {"work"})
        items = _pair_list(b["work"], "body.work", 4, 256)
        if not items:
            raise TxDecodeError("body.work: expected 1..256 items")
        work = tuple(ShardWork(*_shard_fields(item, "body.work[]")) for item in items)
        keys = [(w.model, w.shard) for w in work]
        if keys != sorted(set(keys)):
            raise TxDecodeError("body.work: must be strictly ascending by (model, shard)")
        return cls(work)


@dataclass(frozen=True, slots=True)
class PayoutVote:
    """A validator's operator-key EIP-712 signature over the chain's `PayoutRoot` statement of
    `epoch` (the chain rebuilds the statement from its own record; the vote carries only the
    signature)."""

    epoch: int
    signature: str

    TYPE: ClassVar[str] = "payout_vote"

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "signature": self.signature}

    @classmethod
    def from_json(cls, body: Any) -> PayoutVote:
        b = _obj(body, "body", {"epoch", "signature"})
        return cls(
            epoch=_int(b["epoch"], "body.epoch", 1, _U64),
            signature=_str(b["signature"], "body.signature", _SIG65),
        )


SEED_DOMAIN = b"planet/seed/v1\n"


def seed_commitment(signer_hex: str, epoch: int, seed: bytes) -> str:
    """`0x` + sha256(SEED_DOMAIN ‖ signer key (32 B) ‖ uint64_be(epoch) ‖ seed (32 B)): bound to
    its signer and epoch, so nobody can copy another verifier's commitment or reuse one."""
    if len(seed) != 32 or not _HEX64.match(signer_hex) or not 0 <= epoch <= _U64:
        raise ValueError("seed_commitment needs a 64-hex signer, a u64 epoch, a 32-byte seed")
    digest = hashlib.sha256(
        SEED_DOMAIN + bytes.fromhex(signer_hex) + epoch.to_bytes(8, "big") + seed
    ).hexdigest()
    return "0x" + digest


@dataclass(frozen=True, slots=True)
class SeedCommit:
    """A validator's verifier commits to the secret seed its challenges of `epoch` derive from
    (sent before that epoch starts; see docs/verification.md)."""

    epoch: int
    commitment: str  # seed_commitment(signer, epoch, seed)

    TYPE: ClassVar[str] = "seed_commit"

    def to_json(self) -> dict[str, Any]:
        return {"commitment": self.commitment, "epoch": self.epoch}

    @classmethod
    def from_json(cls, body: Any) -> SeedCommit:
        b = _obj(body, "body", {"commitment", "epoch"})
        return cls(
            epoch=_int(b["epoch"], "body.epoch", 1, MAX_NONCE),
            commitment=_str(b["commitment"], "body.commitment", _HEX32_0X),
        )


@dataclass(frozen=True, slots=True)
class SeedReveal:
    """Opens the seed committed for `epoch` once it has closed (the chain checks it)."""

    epoch: int
    seed: str  # 0x + 64 hex

    TYPE: ClassVar[str] = "seed_reveal"

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "seed": self.seed}

    @classmethod
    def from_json(cls, body: Any) -> SeedReveal:
        b = _obj(body, "body", {"epoch", "seed"})
        return cls(
            epoch=_int(b["epoch"], "body.epoch", 1, MAX_NONCE),
            seed=_str(b["seed"], "body.seed", _HEX32_0X),
        )


MAX_SPOT_REPORT = 256


@dataclass(frozen=True, slots=True)
class SpotCheckReport:
    """A validator's verifier lists the spot checks it completed (any outcome) on the blocks
    committed during `epoch`: `[node key hex, session 0x-hex, step (block), shard]`, 1–256
    items strictly ascending. The chain credits only triples that were committed in `epoch`,
    selected under the seed of epoch + 1 and assigned to the signer (abci_app/spot_reports.py)."""

    epoch: int
    checks: tuple[tuple[str, str, int, int], ...]

    TYPE: ClassVar[str] = "spot_check_report"

    def to_json(self) -> dict[str, Any]:
        return {"checks": [list(c) for c in self.checks], "epoch": self.epoch}

    @classmethod
    def from_json(cls, body: Any) -> SpotCheckReport:
        b = _obj(body, "body", {"checks", "epoch"})
        items = _pair_list(b["checks"], "body.checks", 4, MAX_SPOT_REPORT)
        if not items:
            raise TxDecodeError(f"body.checks: expected 1..{MAX_SPOT_REPORT} items")
        checks = tuple(
            (
                _str(i[0], "body.checks[].node", _HEX64),
                _str(i[1], "body.checks[].session", _HEX32_0X),
                _int(i[2], "body.checks[].step", 0, _U64),
                _int(i[3], "body.checks[].shard", 0, 65535),
            )
            for i in items
        )
        if list(checks) != sorted(set(checks)):
            raise TxDecodeError("body.checks: must be strictly ascending")
        return cls(epoch=_int(b["epoch"], "body.epoch", 1, _U64), checks=checks)


TxBody = (
    RegisterNode
    | Heartbeat
    | Leave
    | AttestStake
    | CommitBatch
    | RevealBatch
    | VerdictVote
    | WorkReport
    | Contribution
    | PayoutVote
    | SeedCommit
    | SeedReveal
    | SpotCheckReport
)
BODY_TYPES: dict[str, Any] = {
    cls.TYPE: cls
    for cls in (
        RegisterNode,
        Heartbeat,
        Leave,
        AttestStake,
        CommitBatch,
        RevealBatch,
        VerdictVote,
        WorkReport,
        Contribution,
        PayoutVote,
        SeedCommit,
        SeedReveal,
        SpotCheckReport,
    )
}


# --- the signed envelope ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SignedTx:
    """A tx body with its signer, nonce and ed25519 signature (`sig` empty until signed).
    `raw` is the canonical tx bytes, set only by `decode` and `sign`."""

    body: Any
    signer: str
    nonce: int
    sig: str = ""
    raw: bytes = field(default=b"", compare=False, repr=False)

    @property
    def type(self) -> str:
        return self.body.TYPE

    def unsigned_json(self) -> dict[str, Any]:
        return {
            "body": self.body.to_json(),
            "nonce": self.nonce,
            "signer": self.signer,
            "type": self.type,
        }

    def sign_bytes(self) -> bytes:
        """What the signer signs: `SIGN_DOMAIN + canonical_json(envelope without sig)`."""
        if self.raw and self.sig:
            # `raw` is always the canonical encoding (set only by `decode` and `sign`), where the
            # signature is the one `"sig"` member: dropping it gives the unsigned canonical form
            # without re-encoding.
            return SIGN_DOMAIN + self.raw.replace(b',"sig":"' + self.sig.encode() + b'"', b"", 1)
        return SIGN_DOMAIN + canonical_json(self.unsigned_json())

    def encode(self) -> bytes:
        """The tx bytes sent to CometBFT (canonical JSON with `sig`)."""
        if not self.sig:
            raise ProtocolError("encode: tx is not signed")
        return canonical_json({**self.unsigned_json(), "sig": self.sig})

    def verify(self) -> None:
        """Check the ed25519 signature; raises `TxSignatureError`."""
        try:
            VerifyKey(bytes.fromhex(self.signer)).verify(self.sign_bytes(), bytes.fromhex(self.sig))
        except (BadSignatureError, ValueError):
            raise TxSignatureError(self.signer) from None


def sign(body: Any, key: SigningKey, nonce: int) -> SignedTx:
    """Build and sign a tx: `signer` is `key`'s public key."""
    if type(body).TYPE not in BODY_TYPES:
        raise ProtocolError(f"sign: unknown body type {type(body).__name__}")
    _int(nonce, "nonce", 1)
    unsigned = SignedTx(body=body, signer=key.verify_key.encode().hex(), nonce=nonce)
    sig = key.sign(unsigned.sign_bytes()).signature.hex()
    signed = SignedTx(body=body, signer=unsigned.signer, nonce=nonce, sig=sig)
    return replace(signed, raw=signed.encode())


def encode(tx: SignedTx) -> bytes:
    """Canonical tx bytes (same as `tx.encode()`)."""
    return tx.encode()


def decode(raw: bytes) -> SignedTx:
    """Parse and validate tx bytes (no signature check: call `.verify()`); raises
    `TxDecodeError`."""
    if not isinstance(raw, bytes | bytearray):
        raise TxDecodeError("expected bytes")
    if len(raw) > MAX_TX_BYTES:
        raise TxDecodeError(f"tx is {len(raw)} bytes, over the {MAX_TX_BYTES}-byte limit")
    if raw[:1] != b"{":
        raise TxDecodeError("not a JSON object")
    try:
        doc = parse_json(raw, max_bytes=MAX_TX_BYTES, max_depth=MAX_TX_DEPTH, max_int_digits=20)
    except JsonInputError as error:
        raise TxDecodeError(error.message) from None
    envelope = _obj(doc, "tx", {"body", "nonce", "sig", "signer", "type"})
    kind = envelope["type"]
    body_cls = BODY_TYPES.get(kind) if isinstance(kind, str) else None
    if body_cls is None:
        raise TxDecodeError(f"unknown tx type {ascii(kind)[:80]}")
    tx = SignedTx(
        body=body_cls.from_json(envelope["body"]),
        signer=_str(envelope["signer"], "signer", _HEX64),
        nonce=_int(envelope["nonce"], "nonce", 1),
        sig=_str(envelope["sig"], "sig", _HEX128),
        raw=bytes(raw),
    )
    # The schema checks above admit only strings, integers and lists/objects of them (no
    # floats), so plain sorted compact json.dumps is the canonical encoding here.
    if canonical_text(doc).encode() != raw:
        raise TxDecodeError("bytes are not the canonical encoding")
    return tx


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
    from eth_utils import keccak

    from protocol.eip712 import recover_digest

    message = encode_defunct(text=registration_message(node_key_hex))
    digest = keccak(b"\x19" + message.version + message.header + message.body)
    return recover_digest(digest, bytes.fromhex(signature_hex[2:]))
