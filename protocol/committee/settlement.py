"""Settlement txs: gateway work reports, payout votes.

`work_report` (a gateway): settled query fees and cumulative charges under payer-signed
authorizations (`ChargeItem`), each item judged on its own by the chain (nodes are paid through
the credits they redeem, never through a gateway's report); `payout_vote` (a
validator): a signature over a `PayoutRoot` statement, named by its number
(`statement_number(epoch, page)`). The chain's rules: `abci_app/settlement.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from protocol.committee.grammar import (
    ADDRESS_LOWER,
    HEX32_0X,
    SIG65,
    U64,
    UINT_DEC,
    TxDecodeError,
    check,
)

MAX_REPORT_ITEMS = 1024
_FEE_DEC = re.compile(r"(?:0|[1-9][0-9]{0,19})\Z")
MAX_FEE = (1 << 64) - 1  # the escrow's deposit cap


MAX_DEBIT_WEI = (1 << 128) - 1  # QueryEscrow keeps a prepaid balance in a uint128
CHARGE_KINDS = ("key", "voucher")  # ascending: the wire order of a report's charges

# A payout statement's number (what the escrow calls its epoch): page 0 of committee epoch e is
# e itself; page p >= 1 is e + p * 2^32, so every page has a number of its own and one-page
# epochs keep their epoch number (abci_app/settlement.py, "pages").
PAGE_SHIFT = 32
MAX_COMMITTEE_EPOCH = (1 << PAGE_SHIFT) - 1


def statement_number(epoch: int, page: int) -> int:
    """The statement number of `page` of committee epoch `epoch` (page 0 is the epoch itself)."""
    return epoch + (page << PAGE_SHIFT)


def statement_page(number: int) -> tuple[int, int]:
    """(committee epoch, page) of a statement number (the inverse of `statement_number`)."""
    return number & MAX_COMMITTEE_EPOCH, number >> PAGE_SHIFT


def _wei(value: Any, where: str) -> int:
    if not isinstance(value, str) or not UINT_DEC.match(value) or int(value) > MAX_DEBIT_WEI:
        raise TxDecodeError(f"{where}: expected a decimal wei string < 2^128")
    return int(value)


@dataclass(frozen=True, slots=True)
class ChargeItem:
    """A cumulative charge under one payer-signed authorization: "the total `gateway` charged
    `payer` under (`kind`, `id`) is now `total` wei". `kind` "voucher": a
    `protocol.payment.Voucher` for one question (`id` its query id, `cap` its fee cap);
    "key": a `protocol.payment.PaymentKey` for many questions (`id` its key id, `cap` its cap).
    The chain debits `total` minus what it charged under the same authorization before, so an
    item sent twice never charges twice. No node, circuit or session: a payer is never tied to
    nodes here.

    Wire: `[kind, gateway, payer, id, model id, total, cap, expiry, signature]`, addresses
    lowercase 0x-hex, total and cap decimal wei strings (< 2^128), expiry unix seconds."""

    kind: str
    gateway: str
    payer: str
    id: str
    model_id: str
    total: int
    cap: int
    expiry: int
    signature: str

    WIDTH: ClassVar[int] = 9

    @property
    def key(self) -> tuple[str, str, str, str]:
        """(payer, gateway, kind, id): the authorization the total is kept under."""
        return (self.payer, self.gateway, self.kind, self.id)

    @property
    def name(self) -> str:
        """`payer/gateway/kind/id`: how the chain and the reporter name this item."""
        return "/".join(self.key)

    def to_json(self) -> list[Any]:
        return [
            self.kind,
            self.gateway,
            self.payer,
            self.id,
            self.model_id,
            str(self.total),
            str(self.cap),
            self.expiry,
            self.signature,
        ]

    @classmethod
    def from_json(cls, item: list[Any]) -> ChargeItem:
        where = "body.charges[]"
        kind = item[0]
        if kind not in CHARGE_KINDS:
            raise TxDecodeError(f"{where}.kind: expected one of {', '.join(CHARGE_KINDS)}")
        return cls(
            kind=kind,
            gateway=check.text(item[1], f"{where}.gateway", ADDRESS_LOWER),
            payer=check.text(item[2], f"{where}.payer", ADDRESS_LOWER),
            id=check.text(item[3], f"{where}.id", HEX32_0X),
            model_id=check.text(item[4], f"{where}.model_id", HEX32_0X),
            total=_wei(item[5], f"{where}.total"),
            cap=_wei(item[6], f"{where}.cap"),
            expiry=check.integer(item[7], f"{where}.expiry", 0, U64),
            signature=check.text(item[8], f"{where}.signature", SIG65),
        )


@dataclass(frozen=True, slots=True)
class WorkReport:
    """A gateway's batch: the query ids it settled with their fees, and the cumulative charges
    of its prepaid payers. The two lists are not linked (no session, no node): nothing here ties
    a question to the nodes that computed it. The chain judges every item on its own.

    Wire: `{"queries": [[query id, fee wei as a decimal string], ...], "charges": [ChargeItem,
    ...]}`; queries strictly ascending by id, charges by (payer, gateway, kind, id); at most
    1024 items in each list, at least one item in all; `charges` absent when empty. Any other
    field is refused by name — the per-node served counts (`work`) reports once carried too
    (issue 45: they decided nothing, and tied a report's query ids to its nodes)."""

    queries: tuple[tuple[str, int], ...]
    charges: tuple[ChargeItem, ...] = ()

    TYPE: ClassVar[str] = "work_report"

    @property
    def items(self) -> int:
        return len(self.queries) + len(self.charges)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "queries": [[query_id, str(fee)] for query_id, fee in self.queries],
        }
        if self.charges:  # absent when empty
            doc["charges"] = [c.to_json() for c in self.charges]
        return doc

    @classmethod
    def from_json(cls, body: Any) -> WorkReport:
        keys = {"queries"}
        if isinstance(body, dict) and "charges" in body:
            keys.add("charges")
        b = check.exact_object(body, "body", keys)
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
        charges: list[ChargeItem] = []
        if "charges" in b:
            items = check.rows(b["charges"], "body.charges", ChargeItem.WIDTH, MAX_REPORT_ITEMS)
            if not items:
                raise TxDecodeError("body.charges: omit the key instead of an empty list")
            charges = [ChargeItem.from_json(item) for item in items]
            named = [c.key for c in charges]
            if named != sorted(set(named)):
                raise TxDecodeError(
                    "body.charges: must be strictly ascending by (payer, gateway, kind, id)"
                )
        if not queries and not charges:
            raise TxDecodeError("body: an empty report")
        return cls(tuple(queries), tuple(charges))


@dataclass(frozen=True, slots=True)
class PayoutVote:
    """A validator's operator-key EIP-712 signature over the chain's `PayoutRoot` statement
    number `epoch` (a page of a committee epoch, `statement_number`; the chain rebuilds the
    statement from its own record, the vote carries only the signature)."""

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
