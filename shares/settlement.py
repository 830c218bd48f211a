"""Epoch close: the payout table of an epoch becomes the statements the committee signs.

    close_epoch(work: EpochWork) -> EpochSettlement
        one statement for the whole epoch (numbered `work.epoch`): `close_epoch_pages` with one
        page holding all of `work.queries` and `work.debits`

    close_epoch_pages(work: EpochWork, pages: Sequence[PageCharges], direct=())
        -> tuple[EpochSettlement]
        an epoch settled in several statements ("pages"), each posted on its own: `work` holds
        the shares (its `queries` and `debits` stay empty), each `PageCharges(number, queries,
        debits, purchases, gateway)` a disjoint part of the charges; `direct`: (account,
        amount) rows paid from the pool pages at a fixed amount, outside the table (in the
        committee's close: the overlay relays' redeemed credits at the credit's price and the
        nodes' at the price less the verifiers' cut, abci_app/relay_payouts.py and
        node_payouts.py; the table then holds only the verifiers' shares). A page is one
        of two kinds:
        - a **gateway page** (`gateway` set): that gateway's revenue, what its own payers were
          charged (its queries' fees and its (payer, gateway) debits, every debit naming it; no
          purchases). Its rows are one: the gateway, for the page's total. A payer found short
          when the escrow posts the page scales this page only, so one gateway's short payer
          never cuts anyone else's pay;
        - a **pool page** (`gateway` None): what the epoch's shares are paid from (the draw on
          the escrow's credit pool, the (escrow, escrow) debit) and credit purchases (a payer's
          debit at the escrow itself: listed in the page's `Charges`, but paid into the
          escrow's credit pool, not out in the page's rows). The `direct` rows are paid first
          (Σ direct ≤ Σ of the pool pages' totals, else `PageError`); the epoch's table splits
          the rest of the pool pages' totals once (none left: no table); its rows and the
          direct ones, merged per account, ascending by account, are then cut into the pool
          pages in order, so that each pool page's rows sum to exactly its own total (an
          account's row is split in two where a page ends). Every account gets exactly its
          share of the epoch, whatever the number of pages. A pool page holding only purchases
          has no rows at all, and needs no share.

    EpochSettlement (one statement)
        .epoch          the statement number (what the escrow calls the epoch; the leaves use it)
        .table          the epoch's split (`shares.payouts.payout_table`)
        .rows           this statement's payout rows (account ascending, amounts > 0)
        .root           Merkle root over `rows` (`shares.merkle` leaves, OpenZeppelin
                        `StandardMerkleTree` layout: what `QueryEscrow.claim` verifies); with
                        no rows, `no_rows_root(number)`: no leaf proves against it
        .total          Σ rows == Σ fees of its queries + Σ its debits, purchases excluded
                        (the escrow's `TotalMismatch` check compares it with what the posting
                        lists)
        .query_ids, .fees   its queries, ascending by id (bytes32 as an unsigned number), fees
                        in the same order
        .payers, .gateways, .debits   its prepaid debits and purchases, (payer, gateway)
                        strictly ascending,
                        payer first: with the two above, the exact `Charges` for `postPayoutRoot`
        .queries_hash   keccak256(abi.encode(bytes32[] queryIds, uint256[] fees, address[]
                        payers, address[] gateways, uint256[] debits)) over those sorted arrays
                        (the rule of `protocol.eip712.queries_hash`, encoded here word by word
                        for speed; a test holds the two equal), so it depends only on the sets
                        of queries and debits, never on the order they were recorded in
        .statement(escrow)  `PayoutRoot(epoch, root, total, queriesHash, consumer)`: the
                        EIP-712 struct every validator signs with its operator key
        .proof(account) (amount, sibling hashes) for `QueryEscrow.claim`

Every validator that runs these on the same input gets byte-identical results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from protocol.eip712 import PayoutRoot
from shares.errors import AccountError, DuplicateError, PageError
from shares.keccak import keccak256
from shares.merkle import build_tree, payout_leaf_hashes, tree_proof
from shares.payouts import (
    MAX_EPOCH,
    EpochWork,
    PayerDebit,
    PayoutTable,
    SettledQuery,
    normalize_account,
    payout_table,
)
from shares.weights import check_int


@dataclass(frozen=True, slots=True)
class EpochSettlement:
    """One statement of a closed epoch: its rows, Merkle root, total and settled charges."""

    epoch: int  # the statement number
    table: PayoutTable  # the whole epoch's split
    rows: tuple[tuple[str, int], ...]  # this statement's payouts, account ascending
    root: bytes
    total: int
    query_ids: tuple[bytes, ...]
    fees: tuple[int, ...]
    payers: tuple[str, ...]  # lowercase 0x-hex, (payer, gateway) ascending
    gateways: tuple[str, ...]
    debits: tuple[int, ...]
    queries_hash: bytes
    tree: tuple[bytes, ...] = field(repr=False, compare=False)  # build_tree's node array
    node_of: tuple[int, ...] = field(repr=False, compare=False)  # tree node of each row
    row_of: dict[str, int] = field(repr=False, compare=False)  # account → row of `rows`

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
        return 0 if row is None else self.rows[row][1]

    def proof(self, account: str) -> tuple[int, list[bytes]]:
        """`(amount, proof)` for `QueryEscrow.claim(epoch, account, amount, proof)`."""
        row = self.row_of.get(normalize_account(account))
        if row is None:
            raise AccountError("account", f"{account} has no payout in epoch {self.epoch}")
        return self.rows[row][1], tree_proof(self.tree, self.node_of[row])


def sorted_queries_hash(
    query_ids: tuple[bytes, ...],
    fees: tuple[int, ...],
    payers: tuple[str, ...] = (),
    gateways: tuple[str, ...] = (),
    debits: tuple[int, ...] = (),
) -> bytes:
    """`keccak256(abi.encode(bytes32[] queryIds, uint256[] fees, address[] payers, address[]
    gateways, uint256[] debits))` of already-validated arrays (32-byte ids, fees < 2^64,
    lowercase 0x-hex addresses, debits < 2^128): five head offsets, then each array as its
    length and its words."""
    n, m = len(query_ids), len(payers)
    if len(fees) != n or len(gateways) != m or len(debits) != m:
        raise PageError("charges", "query ids and fees, payers, gateways and debits must pair up")
    offsets = (160, 192 + 32 * n, 224 + 64 * n, 256 + 64 * n + 32 * m, 288 + 64 * n + 64 * m)
    words = [offset.to_bytes(32, "big") for offset in offsets]
    words.append(n.to_bytes(32, "big"))
    words.extend(query_ids)
    words.append(n.to_bytes(32, "big"))
    words.extend(fee.to_bytes(32, "big") for fee in fees)
    for addresses in (payers, gateways):
        words.append(m.to_bytes(32, "big"))
        words.extend(bytes(12) + bytes.fromhex(address[2:]) for address in addresses)
    words.append(m.to_bytes(32, "big"))
    words.extend(debit.to_bytes(32, "big") for debit in debits)
    return keccak256(b"".join(words))


@dataclass(frozen=True, slots=True)
class PageCharges:
    """The charges one statement of an epoch settles: its number (what the escrow calls the
    epoch), its queries, its prepaid debits and its credit purchases (at least one of them),
    and `gateway`: the gateway whose revenue the page is (its one row), or None for a pool page
    (its rows are the epoch's shares)."""

    number: int
    queries: tuple[SettledQuery, ...] = ()
    debits: tuple[PayerDebit, ...] = ()
    purchases: tuple[PayerDebit, ...] = ()  # paid into the credit pool, not out in rows
    gateway: str | None = None

    def __post_init__(self) -> None:
        check_int(self.number, "number", 0, MAX_EPOCH)
        for query in self.queries:
            if not isinstance(query, SettledQuery):
                raise PageError("queries", f"expected SettledQuery items, got {query!r}"[:200])
        for debit in (*self.debits, *self.purchases):
            if not isinstance(debit, PayerDebit):
                raise PageError("debits", f"expected PayerDebit items, got {debit!r}"[:200])
        if self.gateway is None:
            return
        object.__setattr__(self, "gateway", normalize_account(self.gateway, "gateway"))
        if self.purchases:
            raise PageError("purchases", "a gateway page holds no credit purchases")
        for debit in self.debits:
            if debit.gateway != self.gateway:
                raise PageError(
                    "debits", f"a debit at {debit.gateway} on {self.gateway}'s page"[:200]
                )

    @property
    def total(self) -> int:
        """What the page pays out: its fees and debits (purchases go into the pool)."""
        return sum(q.fee for q in self.queries) + sum(d.amount for d in self.debits)


def close_epoch(work: EpochWork) -> EpochSettlement:
    """Split the epoch's fees, build the payout tree and hash the settled charges: one
    statement numbered `work.epoch`.

    Raises `NothingToPayError` when the epoch has no fees or no eligible share (post no root);
    invalid input was already refused when `work` was built."""
    page = PageCharges(work.epoch, work.queries, work.debits)
    bare = EpochWork(
        epoch=work.epoch,
        queries=(),
        compute=work.compute,
        verification=work.verification,
        health=work.health,
        slashed=work.slashed,
        verifier_cut_bps=work.verifier_cut_bps,
    )
    return close_epoch_pages(bare, (page,))[0]


def close_epoch_pages(
    work: EpochWork,
    pages: Sequence[PageCharges],
    direct: Sequence[tuple[str, int]] = (),
) -> tuple[EpochSettlement, ...]:
    """One statement per page (module docstring): each gateway page pays its gateway its total;
    the pool pages' totals pay the `direct` rows first, the epoch's table splits the rest, and
    the merged rows are cut into the pool pages in order.

    `PageError` when `work` carries charges itself, a page is empty or charges nothing,
    numbers repeat, a query appears in two pages of one payee, a (payer, gateway) in two
    pages, or a gateway page holds purchases or another gateway's debit; `NothingToPayError` as
    `payout_table` when the pool pages pay out (or nothing is paid, bought or earned at all)."""
    if work.queries or work.debits:
        raise PageError("work", "an epoch settled in pages carries its charges in the pages")
    if not pages:
        raise PageError("pages", "no page to settle")
    numbers: set[int] = set()
    # a query id once per payee: two gateways may both report one id (the escrow pays only the
    # page of the gateway its deposit names), one gateway never twice
    queries: set[tuple[str | None, str]] = set()
    for page in pages:
        if not isinstance(page, PageCharges):
            raise PageError("pages", f"expected PageCharges, got {type(page).__name__}")
        if page.number in numbers:
            raise DuplicateError("pages", page.number)
        numbers.add(page.number)
        for query in page.queries:
            if (page.gateway, query.query_id) in queries:
                raise DuplicateError("queries", query.query_id)
            queries.add((page.gateway, query.query_id))
        _unique_pairs((*page.debits, *page.purchases))
    pool = [page for page in pages if page.gateway is None]
    paid = sum(page.total for page in pool)
    fixed = _direct_rows(direct)
    rest = paid - sum(fixed.values())
    if rest < 0:
        raise PageError("direct", f"direct rows pay {paid - rest} wei of a pool paying {paid}")
    bought = any(d.amount for page in pool for d in page.purchases)
    revenue = any(page.gateway is not None for page in pages)
    # NothingToPayError when nothing is paid at all or the pool pays and no share is eligible
    if rest or not (bought or revenue or fixed):
        table = payout_table(work, rest)
    else:
        table = _empty_table(work.epoch)
    for page in pages:
        if page.total <= 0 and not any(d.amount for d in page.purchases):
            raise PageError("pages", f"page {page.number} charges nothing")
    merged = dict(table.payouts)
    for account, amount in fixed.items():
        merged[account] = merged.get(account, 0) + amount
    rows = tuple((account, merged[account]) for account in sorted(merged))
    cut = iter(_cut_rows(rows, [page.total for page in pool]))
    return tuple(
        _statement(
            table,
            page,
            next(cut) if page.gateway is None else ((page.gateway, page.total),),
        )
        for page in pages
    )


def _direct_rows(direct: Sequence[tuple[str, int]]) -> dict[str, int]:
    """The fixed rows by account (lowercase, each once, amounts > 0), `PageError` otherwise."""
    rows: dict[str, int] = {}
    for item in direct:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise PageError("direct", f"expected (account, amount) items, got {item!r}"[:200])
        account = normalize_account(item[0], "direct account")
        if account in rows:
            raise DuplicateError("direct", account)
        rows[account] = check_int(item[1], "direct amount", 1, 1 << 256)
    return rows


def no_rows_root(number: int) -> bytes:
    """The root of a statement that pays nothing out (only credit purchases): nonzero, as the
    escrow requires, and the hash of no leaf (a leaf hashes 96 bytes, this a 30-byte tag):
    nothing can be claimed against it."""
    return keccak256(keccak256(b"planet: no payout rows" + number.to_bytes(8, "big")))


def _empty_table(epoch: int) -> PayoutTable:
    return PayoutTable(
        epoch=epoch,
        fees=0,
        compute_pool=0,
        verifier_pool=0,
        compute_shares={},
        verification_shares={},
        compute_payouts={},
        verifier_payouts={},
        payouts=(),
    )


def _unique_pairs(debits: tuple[PayerDebit, ...]) -> None:
    seen: set[tuple[str, str]] = set()
    for debit in debits:
        if debit.pair in seen:
            raise DuplicateError("debits", debit.pair)
        seen.add(debit.pair)


def _cut_rows(
    rows: tuple[tuple[str, int], ...], totals: list[int]
) -> list[tuple[tuple[str, int], ...]]:
    """Cut `rows` (ascending, Σ == Σ totals) into consecutive runs summing to each total; a row
    that straddles a boundary is split in two."""
    cut: list[tuple[tuple[str, int], ...]] = []
    index, left = 0, rows[0][1] if rows else 0
    for total in totals:
        part: list[tuple[str, int]] = []
        need = total
        while need:
            take = min(need, left)
            part.append((rows[index][0], take))
            need -= take
            left -= take
            if not left:
                index += 1
                left = rows[index][1] if index < len(rows) else 0
        cut.append(tuple(part))
    return cut


def _statement(
    table: PayoutTable, page: PageCharges, rows: tuple[tuple[str, int], ...]
) -> EpochSettlement:
    if rows:
        tree, index_of = build_tree(payout_leaf_hashes(page.number, rows))
    else:
        tree, index_of = (no_rows_root(page.number),), ()
    fee_of = {q.query_id: q.fee for q in page.queries}
    ordered = sorted(fee_of)  # lowercase 0x-hex of equal length: the order of the bytes32 values
    query_ids = tuple(bytes.fromhex(query_id[2:]) for query_id in ordered)
    fees = tuple(fee_of[query_id] for query_id in ordered)
    debits = sorted((*page.debits, *page.purchases), key=lambda d: d.pair)  # address order
    payers = tuple(d.payer for d in debits)
    gateways = tuple(d.gateway for d in debits)
    amounts = tuple(d.amount for d in debits)
    return EpochSettlement(
        epoch=page.number,
        table=table,
        rows=rows,
        root=tree[0],
        total=sum(amount for _, amount in rows),
        query_ids=query_ids,
        fees=fees,
        payers=payers,
        gateways=gateways,
        debits=amounts,
        queries_hash=sorted_queries_hash(query_ids, fees, payers, gateways, amounts),
        tree=tree,
        node_of=index_of,
        row_of={account: row for row, (account, _) in enumerate(rows)},
    )
