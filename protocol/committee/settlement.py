"""Settlement txs: gateway work reports, node contributions, payout votes.

`work_report` (a gateway): per-node work aggregates, settled query fees and prepaid charges;
`contribution` (a compute node): its own per-shard count, credited only up to what gateways
reported; `payout_vote` (a validator): a signature over an epoch's `PayoutRoot` statement. The
chain's rules: `abci_app/settlement.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from protocol.committee.grammar import (
    ADDRESS_LOWER,
    HEX32_0X,
    HEX64,
    NAME,
    SIG65,
    U64,
    UINT_DEC,
    TxDecodeError,
    check,
)

MAX_REPORT_ITEMS = 1024
MAX_LAYERS = 65_536
MAX_TOKENS = (1 << 48) - 1  # per report item and per contribution item
_FEE_DEC = re.compile(r"(?:0|[1-9][0-9]{0,19})\Z")
MAX_FEE = (1 << 64) - 1  # the escrow's deposit cap


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
        check.text(item[0], f"{where}.model", NAME),
        check.integer(item[1], f"{where}.shard", 0, 65535),
        check.integer(item[2], f"{where}.layers", 1, MAX_LAYERS),
        check.integer(item[3], f"{where}.tokens", 1, MAX_TOKENS),
    )


MAX_DEBIT_WEI = (1 << 128) - 1  # QueryEscrow keeps a prepaid balance in a uint128


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
            if not isinstance(value, str) or not UINT_DEC.match(value):
                raise TxDecodeError(f"{where}.{name}: expected a decimal wei string < 2^128")
            if int(value) > MAX_DEBIT_WEI:
                raise TxDecodeError(f"{where}.{name}: expected a decimal wei string < 2^128")
            amounts.append(int(value))
        return cls(
            gateway=check.text(item[0], f"{where}.gateway", ADDRESS_LOWER),
            payer=check.text(item[1], f"{where}.payer", ADDRESS_LOWER),
            query_id=check.text(item[2], f"{where}.query_id", HEX32_0X),
            model_id=check.text(item[3], f"{where}.model_id", HEX32_0X),
            fee=amounts[0],
            fee_cap=amounts[1],
            expiry=check.integer(item[6], f"{where}.expiry", 0, U64),
            signature=check.text(item[7], f"{where}.signature", SIG65),
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
        b = check.exact_object(body, "body", keys)
        work = []
        for item in check.rows(b["work"], "body.work", 5, MAX_REPORT_ITEMS):
            node = check.text(item[0], "body.work[].node", HEX64)
            work.append(NodeWork(node, *_shard_fields(item[1:], "body.work[]")))
        keys = [(w.node, w.model, w.shard) for w in work]
        if keys != sorted(set(keys)):
            raise TxDecodeError("body.work: must be strictly ascending by (node, model, shard)")
        queries = []
        for item in check.rows(b["queries"], "body.queries", 2, MAX_REPORT_ITEMS):
            query_id = check.text(item[0], "body.queries[].id", HEX32_0X)
            fee = item[1]
            if not isinstance(fee, str) or not _FEE_DEC.match(fee) or int(fee) > MAX_FEE:
                raise TxDecodeError("body.queries[].fee: expected a decimal wei string < 2^64")
            queries.append((query_id, int(fee)))
        ids = [q for q, _ in queries]
        if ids != sorted(set(ids)):
            raise TxDecodeError("body.queries: must be strictly ascending by id")
        prepaid: list[PrepaidItem] = []
        if "prepaid" in b:
            items = check.rows(b["prepaid"], "body.prepaid", 8, MAX_REPORT_ITEMS)
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
        b = check.exact_object(body, "body", {"work"})
        items = check.rows(b["work"], "body.work", 4, 256)
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
        b = check.exact_object(body, "body", {"epoch", "signature"})
        return cls(
            epoch=check.integer(b["epoch"], "body.epoch", 1, U64),
            signature=check.text(b["signature"], "body.signature", SIG65),
        )
