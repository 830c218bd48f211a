"""The epoch payout table: the fees of the queries settled in an epoch, split by shares.

Input (`EpochWork`, frozen, validated when built; any bad value raises a `shares.errors`
subclass of `ProtocolError`):

- `queries`: the settled queries, `SettledQuery(query_id, fee)`: bytes32 id, fee in wei
  (0 … 2^64 − 1, the escrow's deposit cap); ids unique.
- `compute`: `ComputeWork(account, model, shard, layers, tokens)`: an account ran `layers`
  decoder layers of shard `shard` of `model` over `tokens` tokens this epoch; one item per
  (account, model, shard).
- `verification`: `VerificationWork(account, spot_checks)`: one item per verifier account.
- `health`: `ShardHealth(model, shard, routable_nodes)`: nodes routable on that shard in the
  epoch; one item per (model, shard); every served shard needs one, with a count no smaller than
  the number of accounts that served it.
- `slashed`: accounts slashed in this epoch (unique).
- `verifier_cut_bps`: the verifiers' part of the fees in basis points (0 … 10,000; default 1,000).
- `debits`: prepaid debits, `PayerDebit(payer, gateway, amount)`: what `payer`'s balance at
  `gateway` owes (0 … 2^128 − 1 wei, (payer, gateway) unique; default none): distributed
  exactly like query fees.

Accounts are EVM addresses, `0x` + 40 hex digits in any case; they are compared and returned in
lowercase (the registry checked their checksums when the node registered).

The split (all integers, exact; `shares.weights` gives the shares):

1. `fees = Σ query fees + Σ debits`: everything is distributed, nothing is kept, created or lost;
   `Σ payouts == fees` always.
2. A slashed account earns nothing for the epoch: its compute and verification shares are
   removed before the split, so the pools are divided among the other accounts only (its part
   goes to them, pro rata). An account with zero shares (zero tokens or spot checks) is not
   eligible either.
3. `verifier_pool = ⌊fees · verifier_cut_bps / 10,000⌋`, `compute_pool = fees − verifier_pool`
   (the rounding wei goes to the compute pool). If no verifier is eligible the verifier pool is
   added to the compute pool; if no compute account is eligible the compute pool is added to the
   verifier pool; if neither, or `fees == 0`, there is nothing to pay (`NothingToPayError`: the
   caller posts no root and leaves the queries unsettled).
4. Each pool `P` is split over its eligible accounts by shares `s_i` (`S = Σ s_i`), largest
   remainder: account i first gets `⌊P · s_i / S⌋`; the `r = P − Σ ⌊…⌋` wei left (`r` < number
   of accounts) go one each to the `r` accounts with the largest `(P · s_i) mod S`, ties broken by
   account ascending (lowercase hex, i.e. by address as a number).
5. An account's payout is its compute amount plus its verifier amount; accounts whose payout is
   0 get no row (the escrow refuses zero claims). Rows are sorted by account ascending. The
   table also keeps, per account, the eligible shares and each pool's amount (read-only maps).

`net_of_cut(amount, verifier_cut_bps)` = `⌊amount · (10,000 − cut) / 10,000⌋`: what the
committee's close pays a node for credits worth `amount` (a direct row, outside the table: issue
42); the rest is the verifiers' part, which the close splits by a table of verification shares
only. The close passes no compute work: the compute side and the scarcity bonus (step 3, 4 and
`shares.weights`) are this library's rule, not what a node is paid.

The result does not depend on the order of any input list. Pure and deterministic: integers and
strings only; imports only the standard library and `shares`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from shares.errors import (
    AccountError,
    BasisPointsError,
    CountError,
    DuplicateError,
    NothingToPayError,
    PoolHealthError,
    QueryIdError,
    ShareInputError,
)
from shares.weights import MAX_COUNT, MAX_LAYERS, check_int, compute_shares, verification_shares

BPS_DENOMINATOR = 10_000
DEFAULT_VERIFIER_CUT_BPS = 1_000
MAX_FEE = (1 << 64) - 1
MAX_DEBIT = (1 << 128) - 1  # QueryEscrow stores a prepaid balance in a uint128
MAX_EPOCH = (1 << 64) - 1
MAX_SHARD = (1 << 32) - 1

_ACCOUNT = re.compile(r"0x[0-9a-fA-F]{40}\Z")
_QUERY_ID = re.compile(r"0x[0-9a-fA-F]{64}\Z")
_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,63}\Z")


def normalize_account(value: object, field: str = "account") -> str:
    """The lowercase spelling of an EVM address `0x` + 40 hex, else `AccountError`."""
    if not isinstance(value, str) or not _ACCOUNT.match(value):
        raise AccountError(field, value)
    return "0x" + value[2:].lower()


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


def _model(value: object, field: str) -> str:
    if not isinstance(value, str) or not _MODEL.match(value):
        raise ShareInputError(field, f"expected a model id [A-Za-z0-9._:/-]{{1,64}}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class SettledQuery:
    """A query settled this epoch: its bytes32 id (lowercase `0x` hex) and its fee in wei."""

    query_id: str
    fee: int

    def __post_init__(self) -> None:
        if not isinstance(self.query_id, str) or not _QUERY_ID.match(self.query_id):
            raise QueryIdError("query_id", self.query_id)
        _set(self, "query_id", "0x" + self.query_id[2:].lower())
        check_int(self.fee, "fee", 0, MAX_FEE)


@dataclass(frozen=True, slots=True)
class PayerDebit:
    """What one prepaid payer's balance at one gateway owes: the sum of the charges that
    gateway made under the payer's authorizations (the committee adds them up)."""

    payer: str
    gateway: str
    amount: int

    def __post_init__(self) -> None:
        _set(self, "payer", normalize_account(self.payer, "payer"))
        _set(self, "gateway", normalize_account(self.gateway, "gateway"))
        check_int(self.amount, "debit", 0, MAX_DEBIT)

    @property
    def pair(self) -> tuple[str, str]:
        return (self.payer, self.gateway)


@dataclass(frozen=True, slots=True)
class ComputeWork:
    """`account` ran `layers` decoder layers of (`model`, `shard`) over `tokens` tokens."""

    account: str
    model: str
    shard: int
    layers: int
    tokens: int

    def __post_init__(self) -> None:
        _set(self, "account", normalize_account(self.account))
        _model(self.model, "model")
        check_int(self.shard, "shard", 0, MAX_SHARD)
        check_int(self.layers, "layers", 1, MAX_LAYERS)
        check_int(self.tokens, "tokens", 0, MAX_COUNT)


@dataclass(frozen=True, slots=True)
class VerificationWork:
    """`account` completed `spot_checks` spot checks this epoch."""

    account: str
    spot_checks: int

    def __post_init__(self) -> None:
        _set(self, "account", normalize_account(self.account))
        check_int(self.spot_checks, "spot_checks", 0, MAX_COUNT)


@dataclass(frozen=True, slots=True)
class ShardHealth:
    """How many distinct nodes were routable on (`model`, `shard`) during the epoch."""

    model: str
    shard: int
    routable_nodes: int

    def __post_init__(self) -> None:
        _model(self.model, "model")
        check_int(self.shard, "shard", 0, MAX_SHARD)
        check_int(self.routable_nodes, "routable_nodes", 0, MAX_COUNT)


def _items(value: object, kind: type, field: str) -> tuple:
    if not isinstance(value, tuple):
        raise ShareInputError(field, f"expected a tuple, got {type(value).__name__}")
    for item in value:
        if not isinstance(item, kind):
            raise ShareInputError(field, f"expected {kind.__name__} items, got {item!r}"[:200])
    return value


def _unique(keys: Iterable[object], field: str) -> None:
    seen: set[object] = set()
    for key in keys:
        if key in seen:
            raise DuplicateError(field, key)
        seen.add(key)


@dataclass(frozen=True, slots=True)
class EpochWork:
    """Everything one epoch's payout table is computed from (see the module docstring)."""

    epoch: int
    queries: tuple[SettledQuery, ...]
    compute: tuple[ComputeWork, ...]
    verification: tuple[VerificationWork, ...] = ()
    health: tuple[ShardHealth, ...] = ()
    slashed: tuple[str, ...] = ()
    verifier_cut_bps: int = DEFAULT_VERIFIER_CUT_BPS
    debits: tuple[PayerDebit, ...] = ()  # prepaid debits per (payer, gateway), like fees

    def __post_init__(self) -> None:
        check_int(self.epoch, "epoch", 0, MAX_EPOCH)
        if (
            isinstance(self.verifier_cut_bps, bool)
            or not isinstance(self.verifier_cut_bps, int)
            or not 0 <= self.verifier_cut_bps <= BPS_DENOMINATOR
        ):
            raise BasisPointsError("verifier_cut_bps", self.verifier_cut_bps)
        _items(self.queries, SettledQuery, "queries")
        _items(self.compute, ComputeWork, "compute")
        _items(self.verification, VerificationWork, "verification")
        _items(self.health, ShardHealth, "health")
        _items(self.slashed, str, "slashed")
        _items(self.debits, PayerDebit, "debits")
        _unique((d.pair for d in self.debits), "debits")
        _set(self, "slashed", tuple(normalize_account(a, "slashed") for a in self.slashed))
        _unique((q.query_id for q in self.queries), "queries")
        _unique(((w.account, w.model, w.shard) for w in self.compute), "compute")
        _unique((w.account for w in self.verification), "verification")
        _unique(((h.model, h.shard) for h in self.health), "health")
        _unique(self.slashed, "slashed")
        routable = {(h.model, h.shard): h.routable_nodes for h in self.health}
        served: dict[tuple[str, int], int] = {}
        for w in self.compute:
            key = (w.model, w.shard)
            served[key] = served.get(key, 0) + 1
        for key, accounts in served.items():
            if key not in routable:
                raise PoolHealthError("health", f"no routable-node count for shard {key!r}")
            if routable[key] < accounts:
                raise PoolHealthError(
                    "health",
                    f"shard {key!r}: {routable[key]} routable nodes but {accounts} accounts served",
                )

    @property
    def fees(self) -> int:
        """Σ fees of the settled queries + Σ prepaid debits: what the epoch distributes."""
        return sum(q.fee for q in self.queries) + sum(d.amount for d in self.debits)


@dataclass(frozen=True, slots=True)
class PayoutTable:
    """One epoch's split: read-only per-account mappings, and the payout rows sorted by account."""

    epoch: int
    fees: int  # Σ query fees + Σ debits == Σ payouts
    compute_pool: int  # after the fold of step 3
    verifier_pool: int
    compute_shares: Mapping[str, int]  # eligible accounts only
    verification_shares: Mapping[str, int]
    compute_payouts: Mapping[str, int]  # per eligible account, zero amounts included
    verifier_payouts: Mapping[str, int]
    payouts: tuple[tuple[str, int], ...]  # merged, amounts > 0, ascending: the Merkle leaves

    @property
    def total(self) -> int:
        return sum(amount for _, amount in self.payouts)


def split_pro_rata(pool: int, shares: Mapping[str, int]) -> dict[str, int]:
    """Split `pool` wei over accounts by `shares` (all > 0), largest remainder, ties by account
    ascending: the amounts sum to `pool` exactly, each within 1 wei of the exact proportion."""
    check_int(pool, "pool", 0, 1 << 256)
    if not shares:
        raise ShareInputError("shares", "nothing to split over")
    total = 0
    for account, count in shares.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise CountError(f"shares[{account}]", count, 1, 1 << 256)
        total += count
    accounts = sorted(shares)  # ascending: the tie order of the remainder rule
    amounts: list[int] = []
    remainders: list[int] = []
    for account in accounts:
        amount, remainder = divmod(pool * shares[account], total)
        amounts.append(amount)
        remainders.append(remainder)
    left = pool - sum(amounts)
    if left:
        # A stable sort by remainder, largest first (sort stability holds with reverse=True):
        # equal remainders keep the ascending account order.
        ranked = sorted(range(len(accounts)), key=remainders.__getitem__, reverse=True)
        for i in ranked[:left]:
            amounts[i] += 1
    return dict(zip(accounts, amounts, strict=True))


def rows_out_of(drawn: int, full: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """Direct rows paying `full` (account → wei due) out of `drawn` wei: each in full when
    `drawn` covers them all, else `drawn` split by them (`split_pro_rata`); ascending by
    account, zero amounts get no row."""
    due = {account: amount for account, amount in full.items() if amount}
    if drawn >= sum(due.values()):
        amounts = due
    elif drawn > 0:
        amounts = split_pro_rata(drawn, due)
    else:
        return ()
    return tuple((account, amounts[account]) for account in sorted(amounts) if amounts[account])


def net_of_cut(amount: int, verifier_cut_bps: int) -> int:
    """What a node is paid for credits worth `amount` wei: `⌊amount · (10,000 − cut) / 10,000⌋`
    (exact integers); the rest, rounding included, is the verifiers' part."""
    check_int(amount, "amount", 0, 1 << 256)
    check_int(verifier_cut_bps, "verifier_cut_bps", 0, BPS_DENOMINATOR)
    return amount * (BPS_DENOMINATOR - verifier_cut_bps) // BPS_DENOMINATOR


def eligible_shares(work: EpochWork) -> tuple[dict[str, int], dict[str, int]]:
    """Compute and verification shares per eligible account (unslashed, shares > 0)."""
    slashed = set(work.slashed)
    # Shares per layer-token on each shard, bonus included (`compute_shares` for one layer and
    # one token); the counts themselves were range-checked when `work` was built.
    rate = {
        (h.model, h.shard): compute_shares(1, 1, h.routable_nodes)
        for h in work.health
        if h.routable_nodes
    }
    compute: dict[str, int] = {}
    for w in work.compute:
        if w.account in slashed or not w.tokens:
            continue
        compute[w.account] = (
            compute.get(w.account, 0) + w.layers * w.tokens * rate[(w.model, w.shard)]
        )
    verification: dict[str, int] = {}
    for v in work.verification:
        if v.account in slashed:
            continue
        shares = verification_shares(v.spot_checks)
        if shares:
            verification[v.account] = shares
    return compute, verification


def payout_table(work: EpochWork, fees: int | None = None) -> PayoutTable:
    """The epoch's payout table (the module docstring states every rule). `fees`: split this
    amount instead of `work.fees` (an epoch settled in pages passes the sum of its pages)."""
    if fees is None:
        fees = work.fees
    else:
        check_int(fees, "fees", 0, 1 << 256)
    if fees == 0:
        raise NothingToPayError(work.epoch, "the settled queries carry no fees")
    compute, verification = eligible_shares(work)
    if not compute and not verification:
        raise NothingToPayError(work.epoch, "no unslashed account has any share")
    verifier_pool = fees * work.verifier_cut_bps // BPS_DENOMINATOR
    compute_pool = fees - verifier_pool
    if not verification:
        compute_pool, verifier_pool = fees, 0
    elif not compute:
        compute_pool, verifier_pool = 0, fees
    compute_amounts = split_pro_rata(compute_pool, compute) if compute else {}
    verifier_amounts = split_pro_rata(verifier_pool, verification) if verification else {}
    merged = dict(compute_amounts)
    for account, amount in verifier_amounts.items():
        merged[account] = merged.get(account, 0) + amount
    return PayoutTable(
        epoch=work.epoch,
        fees=fees,
        compute_pool=compute_pool,
        verifier_pool=verifier_pool,
        compute_shares=MappingProxyType(compute),
        verification_shares=MappingProxyType(verification),
        compute_payouts=MappingProxyType(compute_amounts),
        verifier_payouts=MappingProxyType(verifier_amounts),
        payouts=tuple((a, merged[a]) for a in sorted(merged) if merged[a] > 0),
    )
