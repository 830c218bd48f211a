"""Epoch close: the payout table of an epoch becomes the statement the committee signs.

    close_epoch(work: EpochWork) -> EpochSettlement
        .table          the split (`shares.payouts.payout_table`)
        .root           Merkle root over the table's rows (`shares.merkle` leaves, OpenZeppelin
                        `StandardMerkleTree` layout: what `QueryEscrow.claim` verifies)
        .total          Σ payouts == Σ fees of the settled queries (the escrow's `TotalMismatch`
                        check compares it with Σ fees of the posted queries)
        .query_ids, .fees   the settled queries, ascending by id (bytes32 as an unsigned number),
                        fees in the same order
        .payers, .debits    the prepaid payers, ascending by address, debits in the same order:
                        with the two above, the exact `Charges` to pass to `postPayoutRoot`
        .queries_hash   keccak256(abi.encode(bytes32[] queryIds, uint256[] fees, address[]
                        payers, uint256[] debits)) over those sorted arrays (the rule of
                        `protocol.eip712.queries_hash`, encoded here word by word for speed; a
                        test holds the two equal), so it depends only on the sets of settled
                        queries and debits, never on the order they were recorded in
        .statement(escrow)  `PayoutRoot(epoch, root, total, queriesHash, consumer)`: the
                        EIP-712 struct every validator signs with its operator key
        .proof(account) (amount, sibling hashes) for `QueryEscrow.claim`

    prepaid_debits(charges: Iterable[VoucherCharge]) -> tuple[PayerDebit, ...]
                        the per-payer debits of an epoch's prepaid questions (the committee's
                        input for `EpochWork.debits`): one charge per (payer, query id), each
                        fee <= its voucher's cap, summed per payer, payers ascending

Every validator that runs `close_epoch` on the same `EpochWork` gets byte-identical results.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from protocol.eip712 import PayoutRoot
from shares.errors import AccountError, DuplicateError, VoucherChargeError
from shares.keccak import keccak256
from shares.merkle import build_tree, payout_leaf_hashes, tree_proof
from shares.payouts import (
    MAX_DEBIT,
    EpochWork,
    PayerDebit,
    PayoutTable,
    normalize_account,
    payout_table,
)
from shares.weights import check_int


@dataclass(frozen=True, slots=True)
class EpochSettlement:
    """One closed epoch: its payout table, Merkle root, total and settled queries."""

    epoch: int
    table: PayoutTable
    root: bytes
    total: int
    query_ids: tuple[bytes, ...]
    fees: tuple[int, ...]
    payers: tuple[str, ...]  # lowercase 0x-hex, ascending
    debits: tuple[int, ...]
    queries_hash: bytes
    tree: tuple[bytes, ...] = field(repr=False, compare=False)  # build_tree's node array
    node_of: tuple[int, ...] = field(repr=False, compare=False)  # tree node of each row
    row_of: dict[str, int] = field(repr=False, compare=False)  # account → row of table.payouts

    def statement(self, escrow: str) -> PayoutRoot:
        """The `PayoutRoot` struct the committee signs for this epoch, bound to the `QueryEscrow`
        at `escrow` that will consume it (a root signed for one escrow is refused by another)."""
        return PayoutRoot(
            epoch=self.epoch,
            root=self.root,
            total=self.total,
            queries_hash=self.queries_hash,
            consumer=escrow,
        )

    def amount_of(self, account: str) -> int:
        """What `account` may claim for this epoch (0 when it has no row)."""
        row = self.row_of.get(normalize_account(account))
        return 0 if row is None else self.table.payouts[row][1]

    def proof(self, account: str) -> tuple[int, list[bytes]]:
        """`(amount, proof)` for `QueryEscrow.claim(epoch, account, amount, proof)`."""
        row = self.row_of.get(normalize_account(account))
        if row is None:
            raise AccountError("account", f"{account} has no payout in epoch {self.epoch}")
        return self.table.payouts[row][1], tree_proof(self.tree, self.node_of[row])


def sorted_queries_hash(
    query_ids: tuple[bytes, ...],
    fees: tuple[int, ...],
    payers: tuple[str, ...] = (),
    debits: tuple[int, ...] = (),
) -> bytes:
    """`keccak256(abi.encode(bytes32[] queryIds, uint256[] fees, address[] payers, uint256[]
    debits))` of already-validated arrays (32-byte ids, fees < 2^64, lowercase 0x-hex payers,
    debits < 2^128): four head offsets, then each array as its length and its words."""
    n, m = len(query_ids), len(payers)
    offsets = (128, 160 + 32 * n, 192 + 64 * n, 224 + 64 * n + 32 * m)
    words = [offset.to_bytes(32, "big") for offset in offsets]
    words.append(n.to_bytes(32, "big"))
    words.extend(query_ids)
    words.append(n.to_bytes(32, "big"))
    words.extend(fee.to_bytes(32, "big") for fee in fees)
    words.append(m.to_bytes(32, "big"))
    words.extend(bytes(12) + bytes.fromhex(payer[2:]) for payer in payers)
    words.append(m.to_bytes(32, "big"))
    words.extend(debit.to_bytes(32, "big") for debit in debits)
    return keccak256(b"".join(words))


_QUERY_ID_HEX = re.compile(r"0x[0-9a-fA-F]{64}\Z")


@dataclass(frozen=True, slots=True)
class VoucherCharge:
    """One prepaid question as the committee saw it: the payer (recovered from its voucher
    signature by the caller), the voucher's query id and fee cap, and the fee the gateway's
    receipt charged."""

    payer: str
    query_id: str
    fee: int
    fee_cap: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "payer", normalize_account(self.payer, "payer"))
        if not isinstance(self.query_id, str) or not _QUERY_ID_HEX.match(self.query_id):
            raise VoucherChargeError("query_id", f"not a 0x bytes32: {self.query_id!r}")
        object.__setattr__(self, "query_id", self.query_id.lower())
        check_int(self.fee_cap, "fee_cap", 0, MAX_DEBIT)
        check_int(self.fee, "fee", 0, MAX_DEBIT)
        if self.fee > self.fee_cap:
            raise VoucherChargeError(
                "fee",
                f"query {self.query_id}: fee {self.fee} above the voucher's cap {self.fee_cap}",
            )


def prepaid_debits(charges: Iterable[VoucherCharge]) -> tuple[PayerDebit, ...]:
    """Sum an epoch's prepaid charges per payer, payers ascending (the order `postPayoutRoot`
    requires). A (payer, query id) charged twice is a replayed voucher: `DuplicateError`. The
    caller checks each voucher's signature and expiry and that no earlier epoch charged it."""
    seen: set[tuple[str, str]] = set()
    totals: dict[str, int] = {}
    for charge in charges:
        if not isinstance(charge, VoucherCharge):
            raise VoucherChargeError(
                "charges", f"expected VoucherCharge, got {type(charge).__name__}"
            )
        key = (charge.payer, charge.query_id)
        if key in seen:
            raise DuplicateError("charges", key)
        seen.add(key)
        totals[charge.payer] = totals.get(charge.payer, 0) + charge.fee
    return tuple(PayerDebit(payer, totals[payer]) for payer in sorted(totals))


def close_epoch(work: EpochWork) -> EpochSettlement:
    """Split the epoch's fees, build the payout tree and hash the settled queries.

    Raises `NothingToPayError` when the epoch has no fees or no eligible share (post no root);
    invalid input was already refused when `work` was built."""
    table = payout_table(work)
    leaves = payout_leaf_hashes(table.epoch, table.payouts)
    tree, index_of = build_tree(leaves)
    fee_of = {q.query_id: q.fee for q in work.queries}
    ordered = sorted(fee_of)  # lowercase 0x-hex of equal length: the order of the bytes32 values
    query_ids = tuple(bytes.fromhex(query_id[2:]) for query_id in ordered)
    fees = tuple(fee_of[query_id] for query_id in ordered)
    debit_of = {d.payer: d.amount for d in work.debits}
    payers = tuple(sorted(debit_of))  # lowercase 0x-hex of equal length: address order
    debits = tuple(debit_of[payer] for payer in payers)
    return EpochSettlement(
        epoch=table.epoch,
        table=table,
        root=tree[0],
        total=table.total,
        query_ids=query_ids,
        fees=fees,
        payers=payers,
        debits=debits,
        queries_hash=sorted_queries_hash(query_ids, fees, payers, debits),
        tree=tree,
        node_of=index_of,
        row_of={account: row for row, (account, _) in enumerate(table.payouts)},
    )
