"""Epoch close: the payout table of an epoch becomes the statement the committee signs.

    close_epoch(work: EpochWork) -> EpochSettlement
        .table          the split (`shares.payouts.payout_table`)
        .root           Merkle root over the table's rows (`shares.merkle` leaves, OpenZeppelin
                        `StandardMerkleTree` layout: what `QueryEscrow.claim` verifies)
        .total          Σ payouts == Σ fees of the settled queries (the escrow's `TotalMismatch`
                        check compares it with Σ fees of the posted queries)
        .query_ids, .fees   the settled queries, ascending by id (bytes32 as an unsigned number),
                        fees in the same order: the exact arrays to pass to `postPayoutRoot`
        .queries_hash   keccak256(abi.encode(bytes32[] queryIds, uint256[] fees)) over those
                        sorted arrays (the rule of `protocol.eip712.queries_hash`, encoded here
                        word by word for speed; a test holds the two equal), so it depends only
                        on the set of settled queries, never on the order they were recorded in
        .statement()    `PayoutRoot(epoch, root, total, queriesHash)`, the EIP-712 struct every
                        validator signs with its operator key
        .proof(account) (amount, sibling hashes) for `QueryEscrow.claim`

Every validator that runs `close_epoch` on the same `EpochWork` gets byte-identical results.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.eip712 import PayoutRoot
from shares.errors import AccountError
from shares.keccak import keccak256
from shares.merkle import build_tree, payout_leaf_hashes, tree_proof
from shares.payouts import EpochWork, PayoutTable, normalize_account, payout_table


@dataclass(frozen=True, slots=True)
class EpochSettlement:
    """One closed epoch: its payout table, Merkle root, total and settled queries."""

    epoch: int
    table: PayoutTable
    root: bytes
    total: int
    query_ids: tuple[bytes, ...]
    fees: tuple[int, ...]
    queries_hash: bytes
    tree: tuple[bytes, ...] = field(repr=False, compare=False)  # build_tree's node array
    node_of: tuple[int, ...] = field(repr=False, compare=False)  # tree node of each row
    row_of: dict[str, int] = field(repr=False, compare=False)  # account → row of table.payouts

    def statement(self) -> PayoutRoot:
        """The `PayoutRoot` struct the committee signs for this epoch."""
        return PayoutRoot(
            epoch=self.epoch, root=self.root, total=self.total, queries_hash=self.queries_hash
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


def sorted_queries_hash(query_ids: tuple[bytes, ...], fees: tuple[int, ...]) -> bytes:
    """`keccak256(abi.encode(bytes32[] queryIds, uint256[] fees))` of already-validated arrays
    (32-byte ids, fees < 2^64): two head offsets, then each array as its length and its words."""
    n = len(query_ids)
    words = [(64).to_bytes(32, "big"), (96 + 32 * n).to_bytes(32, "big")]
    words.append(n.to_bytes(32, "big"))
    words.extend(query_ids)
    words.append(n.to_bytes(32, "big"))
    words.extend(fee.to_bytes(32, "big") for fee in fees)
    return keccak256(b"".join(words))


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
    return EpochSettlement(
        epoch=table.epoch,
        table=table,
        root=tree[0],
        total=table.total,
        query_ids=query_ids,
        fees=fees,
        queries_hash=sorted_queries_hash(query_ids, fees),
        tree=tree,
        node_of=index_of,
        row_of={account: row for row, (account, _) in enumerate(table.payouts)},
    )
