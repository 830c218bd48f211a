"""Epoch settlement on the committee chain: what payers owe → signed payout roots.

Two tx types (`protocol.committee.settlement`) and one EndBlock rule. There is one way a node is
paid: the credits it redeems (abci_app/credits.py). Whoever pays it — a user's personal client
or a hosted gateway — bought those credits from a balance at the escrow; each redeemed credit
is paid to the node at its price less the verifiers' cut, from the escrow's credit pool. A
gateway's users pay the gateway: their charges are its revenue, paid to its own address.
Nothing a gateway reports is the basis of anyone else's pay.

**`work_report`** (a gateway: a key bound to its payee address by a `gateway` tx,
gateway_bindings.py; there is no genesis list of gateways). Refused whole only for what
concerns the whole tx: a signer not bound (`UNKNOWN_GATEWAY`; malformed or oversized bytes never
get this far). Every item is then judged on its own: a refused item is skipped and
named in the tx result by a `planet.item_refused` event (`kind` query | charge, `id`,
`code` name, `reason`), the others apply. The lists are independent and name no node, so
nothing on chain links a question (or its payer) to the nodes that computed it. Reports carry
no per-node served counts (issue 45: they decided nothing — any key can bind itself as a
gateway — and tied a report's query ids to its nodes); the decoder refuses a `work` field by
name (`MALFORMED_TX`). Coverage and liveness read only the node's own txs: its commitments,
credit locks and redemptions, its heartbeats.

- query `[query id, fee]`: a per-query deposit the gateway settled, paid to the address the
  reporting key is bound to (`gwkey/`). The escrow pays it only if the deposit names that
  address (the page rule, docs/contracts.md): a key reporting another gateway's query id is
  never paid for it.
  The same id with the same fee again (pending or settled) changes nothing; a
  fee of 0 changes nothing (nothing to charge); another fee is refused (`DUPLICATE_QUERY`).
  Effect: `squery/<id>/<gateway>` = {fee, height, gateway}.
- charge `ChargeItem(kind, gateway, payer, id, model id, total, cap, expiry, signature)`: "the
  total charged under this payer-signed authorization is now `total`", paid to the gateway it
  names. Checked in this order: no escrow in genesis (`SETTLEMENT_DISABLED`); a gateway other
  than the one the reporting key is bound to, or the escrow itself (`WRONG_GATEWAY`);
  total > cap (`CHARGE_OVER_CAP`); block time (CometBFT's BFT time, the same on every node)
  past the expiry (`AUTHORIZATION_EXPIRED`); expiry more than `MAX_LIFETIME_S[kind]` ahead
  (`AUTHORIZATION_EXPIRY_TOO_FAR`: the guard below must stay bounded); the authorization
  charged before under another expiry (`AUTHORIZATION_INVALID`); total below what was charged
  before (`CHARGE_BELOW_PREVIOUS`); total equal to it: nothing to do (a resent item never
  charges twice); the signature does not recover to `payer` (`AUTHORIZATION_INVALID`;
  `protocol.payment.Voucher` for "voucher" with query id = id and fee cap = cap, `PaymentKey`
  for "key" with key id = id; payment domain of genesis `evm`, consumer = the escrow). Effect:
  `spent/<payer>/<gateway>/<kind>/<id>` = {total, expiry}, deleted once a block's time is past
  the expiry (`retention.track_until`; the authorization is refused as expired after that), and
  the increase joins the pending debit `cpend/<payer>/<gateway>/<kind>/<id>` = {from, total,
  height}.
  The gateway's receipt signature is *not* sent: it covers the circuit hash, which over the
  public node registry names the circuit, so next to a payer it would link the payer to nodes.
  The report's own signature (the gateway's committee key) is the gateway's word.

**`payout_vote`** (a validator): its operator key's EIP-712 signature over the stored `PayoutRoot`
statement number `epoch` (committee domain of genesis `evm`). A statement is fixed when written
and never recomputed, so re-signing it yields the same statement (the escrow's `disputeRoot`
needs two *different* signed statements). The record accumulates `votes` and `power`;
`confirmed` at ≥ 2/3 of the power. Refused: not a validator (`NOT_VALIDATOR`), no
`evm.escrow_address` (`SETTLEMENT_DISABLED`), no such statement (`NO_STATEMENT`), a signature
that does not recover to the validator's operator (`BAD_PAYOUT_SIGNATURE`), a second vote of the
same validator (`DUPLICATE_VOTE`).

**Epoch close** (`close`, EndBlock of height e·L, before the next epoch is fixed). The epoch's
redemption records (`credit/<e>/…`, node_payouts.py) and the overlay relays' (`rpay/<e>/…`,
relay_payouts.py) are taken; accounts whose verdict was confirmed in the epoch are `slashed`;
the spot checks credited in the epoch (`vwork/<e>/…`) are the `VerificationWork`, the only
shares of the epoch's table. Then **everything pending is settled, in pages**
(`shares.settlement.close_epoch_pages`), in this order:
1. *The pool's pages.* Credit purchases (funded mints' charges, kind "mint", oldest first) are
   debited at every close, whole, into the escrow's credit pool (`PageCharges.purchases`:
   listed, not paid out). Then, when the epoch has redemptions of unslashed accounts, the
   draw: the (escrow, escrow) debit of what the pool owes this epoch — `cdue/<e>` (the price
   of the credits redeemed in it, and what was due before and not drawn) less the price of
   the slashed accounts' credits (never drawn: it stays in the pool) — at most the pool
   (`cpool/balance`) plus this close's purchases; the rest is due to e+1. The credits whose
   window ends with this close unredeemed (`cissue/`) are forgotten: their price stays in the
   pool, its reserve against a deficit. The draw pays *direct* rows first: each relay's
   staking address credits · credit price, then each node's EVM address its credits' price
   less the verifiers' cut, ⌊credits · price · (10,000 − cut) / 10,000⌋ (node_payouts.py; no
   weight, no scarcity bonus: a node that buys credits and redeems them itself gets back
   (1 − cut) of what it paid, never more, and the other nodes' rows do not change). When the
   draw falls short, the relays are paid first, then the nodes by their rows, pro rata. The
   rest of the draw (the nodes' credits' verifiers' part, rounding included, and what was due
   from before) is split over the epoch's eligible verifiers by the table (docs/shares.md,
   verifiers only); its rows and the direct ones, merged per account, are the pool pages'
   rows. With no eligible verifier (`NothingToPayError`) that part is not drawn (due to e+1,
   to the verifiers of a later epoch); the direct rows are drawn all the same. A close that
   draws nothing for the nodes (or the relays) — an empty pool, or a draw left off the
   close's pages — moves their credits to e+1 once (a credit moved in is dropped if e+1 pays
   nothing either: its price stays due).
2. *Each gateway's pages*, the gateway with the oldest pending item first: its pending queries
   and charges, oldest reported first (then by id). A gateway page has one row: the gateway,
   for the page's total. So a payer the escrow finds short when it posts the page (its balance
   left before the debit) scales that page only: one gateway's short payer never cuts the pay
   of a node or of another gateway.
A new page starts where the payee changes (the pool, or a gateway) or where the page is full:
its `postPayoutRoot` stays within `MAX_STATEMENT_GAS` (estimated `BASE_GAS` + `QUERY_GAS` per
query + `DEBIT_GAS` per (payer, gateway) debit), it names at most `MAX_STATEMENT_CHARGES`
queries and authorizations, and a pair's debit in one page stays below 2^128 (the escrow's
uint128 balance). At most `MAX_PAGES` pages per close: what is left waits, still first in line,
for the next close (a purchase stays pending, the draw stays due). Page p of epoch e is
statement number `statement_number(e, p)` = e + p·2^32 (page 0 is e itself), stored at
`payout/<e>[/<p>]`. Each record holds its statement, its sorted query ids and fees, payers /
gateways / debits (what `postPayoutRoot` takes), the authorizations it debits with their totals
`charges` [[payer, gateway, kind, id, total]] (so gateways learn what a root covered; purchases
too, the draw not), its rows, the epoch's verification shares (`shares`, page 0 only), and
`committee_epoch`, `page`, `pages`. Settled queries move to `sqdone/<id>` = {fee, statement},
settled charges leave `cpend/`. The epoch's slash marks are deleted either way. `payout/` and
`sqdone/` entries are pruned with the epoch's other records (`rules.track`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from abci_app import gateway_bindings, mint_partials, node_payouts, relay_payouts, rules, schema
from abci_app.codes import Code, Rejected
from abci_app.credits import MINT_KIND, owe
from abci_app.state import State
from protocol.committee.envelope import SignedTx
from protocol.committee.settlement import (
    MAX_COMMITTEE_EPOCH,
    ChargeItem,
    PayoutVote,
    WorkReport,
    statement_number,
    statement_page,
)
from protocol.eip712 import PayoutRoot, committee_domain, recover_digest
from protocol.errors import ProtocolError
from protocol.payment import PaymentKey, Voucher, payment_domain
from shares.errors import NothingToPayError
from shares.payouts import (
    MAX_DEBIT,
    EpochWork,
    PayerDebit,
    SettledQuery,
    VerificationWork,
)
from shares.settlement import EpochSettlement, PageCharges, close_epoch_pages

# bounds how long an authorization's replay guard (`spent/`) is kept, per kind
MAX_LIFETIME_S = {"voucher": 7 * 86_400, "key": 366 * 86_400}
MAX_VOUCHER_LIFETIME_S = MAX_LIFETIME_S["voucher"]
# What one statement may cost to post (gas of `QueryEscrow.postPayoutRoot`, bench/gas.js:
# 1,019,382 for 100 queries (each query's gateway binding is read and compared), 8,841 per extra
# (payer, gateway) debit, ~124,000 with 4 signatures), kept far below a block's 30 M gas.
BASE_GAS = 150_000
QUERY_GAS = 9_000
DEBIT_GAS = 9_000
MAX_STATEMENT_GAS = 12_000_000
MAX_STATEMENT_CHARGES = 4_096  # queries + authorizations one statement names (its record size)
MAX_PAGES = 64  # statements per close; the rest stays pending, first in line


# --- work_report: every item judged on its own ------------------------------------------------


def work_report(state: State, tx: SignedTx) -> None:
    body: WorkReport = tx.body
    bound = gateway_bindings.bound_address(state, tx.signer)
    if bound is None:
        rules.reject(
            Code.UNKNOWN_GATEWAY,
            f"signer {tx.signer} is not a gateway: bind it to its payee address by a gateway tx",
        )
    outcome = _Outcome()
    for query_id, fee in body.queries:
        outcome.judge(
            state, "query", query_id, lambda q=query_id, f=fee: _query(state, q, f, bound)
        )
    for charge in body.charges:
        outcome.judge(state, "charge", charge.name, lambda c=charge: _charge(state, c, bound))
    state.emit(
        "planet.work_report",
        gateway=tx.signer,
        queries=len(body.queries),
        charges=len(body.charges),
        applied=outcome.applied,
        unchanged=outcome.unchanged,
        refused=outcome.refused,
    )


@dataclass
class _Outcome:
    """Counts of a report's items: applied, unchanged (a repeat), refused (each named)."""

    applied: int = 0
    unchanged: int = 0
    refused: int = 0

    def judge(self, state: State, kind: str, name: str, apply: Any) -> None:
        """Run one item's rule (`apply()` → True when it changed state); a `Rejected` refuses
        that item only: every rule checks before it writes."""
        try:
            changed = apply()
        except Rejected as refused:
            self.refused += 1
            state.emit(
                "planet.item_refused",
                kind=kind,
                id=name,
                code=refused.code.name,
                reason=refused.message,
            )
            return
        if changed:
            self.applied += 1
        else:
            self.unchanged += 1


def _query(state: State, query_id: str, fee: int, bound: str) -> bool:
    # keyed per (query, payee): another key's report of the same id (a gateway reporting a deposit
    # it does not hold) neither blocks nor changes this one; the escrow pays only the deposit's own
    key = schema.query_key(query_id, bound.lower())
    known = state.get(schema.PENDING_QUERY, key) or state.get(schema.SETTLED_QUERY, key)
    if known is not None:
        if int(known["fee"]) != fee:
            rules.reject(
                Code.DUPLICATE_QUERY,
                f"query {query_id} was reported with fee {known['fee']}, not {fee}",
            )
        return False
    if fee == 0:
        return False  # nothing to charge: the deposit stays refundable
    state.put(
        schema.PENDING_QUERY,
        key,
        {"fee": str(fee), "height": state.block_height, "gateway": bound.lower()},
    )
    return True


def _charge(state: State, item: ChargeItem, bound: str) -> bool:
    genesis = state.genesis
    if not (genesis.escrow_address and genesis.evm_chain_id):
        rules.reject(Code.SETTLEMENT_DISABLED, "genesis has no evm {chain_id, escrow_address}")
    if item.gateway != bound:
        rules.reject(
            Code.WRONG_GATEWAY, f"this gateway key reports for {bound}, not {item.gateway}"
        )
    if item.gateway.lower() == genesis.escrow_address.lower():
        # a (payer, escrow) debit is a credit purchase on the escrow: never a gateway's charge
        rules.reject(Code.WRONG_GATEWAY, "the escrow is not a gateway: its balances buy credits")
    if item.total > item.cap:
        rules.reject(Code.CHARGE_OVER_CAP, f"total {item.total} above its cap {item.cap}")
    if state.block_time > item.expiry:
        rules.reject(
            Code.AUTHORIZATION_EXPIRED,
            f"expired at {item.expiry} < block time {state.block_time}",
        )
    lifetime = MAX_LIFETIME_S[item.kind]
    if item.expiry > state.block_time + lifetime:
        rules.reject(
            Code.AUTHORIZATION_EXPIRY_TOO_FAR,
            f"expiry {item.expiry} is more than {lifetime} s ahead of block time",
        )
    key = schema.charge_key(*item.key)
    spent = state.get(schema.SPENT, key)
    previous = 0
    if spent is not None:
        if spent["expiry"] != item.expiry:
            rules.reject(
                Code.AUTHORIZATION_INVALID,
                f"charged before under expiry {spent['expiry']}, not {item.expiry}",
            )
        previous = int(spent["total"])
    if item.total < previous:
        rules.reject(
            Code.CHARGE_BELOW_PREVIOUS,
            f"total {item.total} is below the {previous} charged under it before",
        )
    if item.total == previous:
        return False  # a resent item: charged already
    _check_signature(state, item)
    state.put(schema.SPENT, key, {"total": str(item.total), "expiry": item.expiry})
    if spent is None:
        rules.track_until(state, schema.SPENT, key, item.expiry)
    pending = state.get(schema.PENDING_CHARGE, key)
    state.put(
        schema.PENDING_CHARGE,
        key,
        {
            "from": pending["from"] if pending else str(previous),
            "total": str(item.total),
            "height": pending["height"] if pending else state.block_height,
        },
    )
    return True


def _check_signature(state: State, item: ChargeItem) -> None:
    genesis = state.genesis
    escrow = genesis.escrow_address
    assert escrow is not None and genesis.evm_chain_id is not None  # checked by the caller
    try:
        struct: Voucher | PaymentKey
        if item.kind == "voucher":
            struct = Voucher(
                gateway=item.gateway,
                query_id=bytes.fromhex(item.id[2:]),
                model_id=bytes.fromhex(item.model_id[2:]),
                fee_cap=item.cap,
                expiry=item.expiry,
                consumer=escrow,
            )
        else:
            struct = PaymentKey(
                gateway=item.gateway,
                key_id=bytes.fromhex(item.id[2:]),
                model_id=bytes.fromhex(item.model_id[2:]),
                cap=item.cap,
                expiry=item.expiry,
                consumer=escrow,
            )
        domain = payment_domain(genesis.evm_chain_id, escrow)
        signer = recover_digest(struct.digest(domain), bytes.fromhex(item.signature[2:]))
    except ProtocolError as error:
        rules.reject(Code.AUTHORIZATION_INVALID, error.message)
    if signer.lower() != item.payer:
        rules.reject(Code.AUTHORIZATION_INVALID, f"signed by {signer}, not by its payer")


# --- payout_vote ----------------------------------------------------------------------------------


def payout_domain_ok(state: State) -> bool:
    genesis = state.genesis
    return bool(genesis.escrow_address and genesis.committee_address and genesis.evm_chain_id)


def statement_of(record: dict[str, Any]) -> PayoutRoot:
    """The `PayoutRoot` a stored `payout/` record stands for."""
    return PayoutRoot(
        epoch=record["epoch"],
        root=bytes.fromhex(record["root"][2:]),
        total=int(record["total"]),
        queries_hash=bytes.fromhex(record["queries_hash"][2:]),
        consumer=record["consumer"],
    )


def statement_record_key(number: int) -> str | None:
    """The `payout/` key of statement `number`, or None when no statement can have it."""
    epoch, page = statement_page(number)
    if epoch < 1 or page >= MAX_PAGES:
        return None
    return schema.statement_key(epoch, page)


def payout_vote(state: State, tx: SignedTx) -> None:
    body: PayoutVote = tx.body
    validator = rules.validator(state, tx.signer)
    genesis = state.genesis
    if not payout_domain_ok(state):
        rules.reject(
            Code.SETTLEMENT_DISABLED,
            "genesis has no evm {chain_id, committee_address, escrow_address}",
        )
    key = statement_record_key(body.epoch)
    record = state.get(schema.PAYOUT, key) if key is not None else None
    if record is None or key is None:
        rules.reject(Code.NO_STATEMENT, f"no payout statement number {body.epoch}")
    operator = validator.get("operator")
    if not operator:
        rules.reject(
            Code.BAD_PAYOUT_SIGNATURE, f"validator {validator['address']} has no operator address"
        )
    if validator["address"] in record["votes"]:
        rules.reject(Code.DUPLICATE_VOTE, f"validator {validator['address']} already signed")
    try:
        domain = committee_domain(genesis.evm_chain_id, genesis.committee_address)
        digest = statement_of(record).digest(domain)
        recovered = recover_digest(digest, bytes.fromhex(body.signature[2:]))
    except ProtocolError as error:
        rules.reject(Code.BAD_PAYOUT_SIGNATURE, error.message)
    if recovered.lower() != operator.lower():
        rules.reject(
            Code.BAD_PAYOUT_SIGNATURE, f"signature recovers {recovered}, not operator {operator}"
        )
    updated = rules.add_vote(state, record, validator, operator, body.signature)
    if updated["confirmed"] and not record["confirmed"]:
        state.emit("planet.payout", epoch=body.epoch, confirmed="true")
    state.put(schema.PAYOUT, key, updated)


# --- epoch close ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Unit:
    """One pending charge to settle: a query (`fee`), an authorization's pending increase, a
    credit purchase (a funded mint's charge) or the draw from the credit pool."""

    height: int
    order: tuple[str, ...]  # ("q", id, gateway) or ("c", payer, gateway, kind, id)
    amount: int
    total: int = 0  # an authorization's cumulative total once this is debited
    gateway: str = ""  # a query's payee (a charge names its gateway in `order`)

    @property
    def kind(self) -> str:
        """ "query", "charge", "purchase" (kind mint) or "draw" (kind pool)."""
        if self.order[0] == "q":
            return "query"
        return {MINT_KIND: "purchase", POOL_KIND: "draw"}.get(self.order[3], "charge")

    @property
    def payee(self) -> str:
        """The gateway a query or charge pays; "" for a purchase or the draw (the pool)."""
        if self.kind == "query":
            return self.gateway
        return self.order[2] if self.kind == "charge" else ""


POOL_KIND = "pool"  # the draw's kind: the pair (escrow, escrow), the escrow's credit pool


def _pending_units(state: State) -> tuple[list[_Unit], list[_Unit]]:
    """(credit purchases, every gateway's queries and charges) waiting for a statement. The
    purchases oldest reported first (then by id); the gateways' grouped per gateway, the
    gateway with the oldest pending item first, each group oldest first (then by id)."""
    purchases: list[_Unit] = []
    units = [
        # (a query pending from before fees had a payee has none: the pool's, as it was then)
        _Unit(
            entry["height"],
            ("q", key.partition("/")[0], entry.get("gateway", "")),
            int(entry["fee"]),
            gateway=entry.get("gateway", ""),
        )
        for key, entry in state.items(schema.PENDING_QUERY)
    ]
    for key, entry in state.items(schema.PENDING_CHARGE):
        payer, gateway, kind, id = key.split("/")
        total = int(entry["total"])
        increase = total - int(entry["from"])
        unit = _Unit(entry["height"], ("c", payer, gateway, kind, id), increase, total)
        (purchases if kind == MINT_KIND else units).append(unit)
    purchases.sort(key=lambda u: (u.height, u.order))
    units.sort(key=lambda u: (u.height, u.order))
    first: dict[str, int] = {}
    for position, unit in enumerate(units):
        first.setdefault(unit.payee, position)
    units.sort(key=lambda u: first[u.payee])  # stable: each group keeps its order
    return purchases, units


@dataclass
class _Page:
    payee: str  # the gateway whose revenue the page is, or "" for a pool page
    queries: list[_Unit] = field(default_factory=list)
    charges: list[_Unit] = field(default_factory=list)  # authorizations, purchases, the draw
    debits: dict[tuple[str, str], int] = field(default_factory=dict)  # paid out in the rows
    purchases: dict[tuple[str, str], int] = field(default_factory=dict)  # into the pool
    gas: int = BASE_GAS

    def fits(self, unit: _Unit) -> bool:
        if unit.payee != self.payee:
            return False
        if len(self.queries) + len(self.charges) >= MAX_STATEMENT_CHARGES:
            return False
        if unit.order[0] == "q":
            return self.gas + QUERY_GAS <= MAX_STATEMENT_GAS
        pairs = self.purchases if unit.kind == "purchase" else self.debits
        pair = (unit.order[1], unit.order[2])
        if pair in pairs:
            return pairs[pair] + unit.amount <= MAX_DEBIT
        return self.gas + DEBIT_GAS <= MAX_STATEMENT_GAS

    def add(self, unit: _Unit) -> None:
        if unit.order[0] == "q":
            self.queries.append(unit)
            self.gas += QUERY_GAS
            return
        pairs = self.purchases if unit.kind == "purchase" else self.debits
        pair = (unit.order[1], unit.order[2])
        if pair not in pairs:
            self.gas += DEBIT_GAS
        pairs[pair] = pairs.get(pair, 0) + unit.amount
        self.charges.append(unit)

    def page_charges(self, number: int) -> PageCharges:
        return PageCharges(
            number,
            tuple(SettledQuery(u.order[1], u.amount) for u in self.queries),
            tuple(PayerDebit(p, g, amount) for (p, g), amount in sorted(self.debits.items())),
            tuple(PayerDebit(p, g, amount) for (p, g), amount in sorted(self.purchases.items())),
            gateway=self.payee or None,
        )


def _plan_pages(units: list[_Unit]) -> list[_Page]:
    """Cut the ordered units greedily into at most `MAX_PAGES` pages, a new one where the payee
    changes (module docstring)."""
    pages: list[_Page] = []
    for unit in units:
        if not pages or not pages[-1].fits(unit):
            if len(pages) == MAX_PAGES:
                break
            pages.append(_Page(unit.payee))
        pages[-1].add(unit)
    return pages


def _forget_expired(state: State, epoch: int) -> None:
    """Forget the issue counts of the credits whose window ends with this close: the price of
    those never redeemed is not drawn (it stays in the credit pool, its reserve)."""
    last = epoch - state.genesis.credit_lifetime_epochs  # credits of ≤ last expire now
    if last < 0:
        return
    for key, _ in state.items(schema.CREDIT_ISSUED, "", schema.epoch_key(last + 1)):
        state.delete(schema.CREDIT_ISSUED, key)


def _direct_rows(
    relays: relay_payouts.RelayEarnings, nodes: node_payouts.NodeEarnings, amount: int
) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]:
    """(the relays' rows, the nodes' rows) out of a draw of `amount`: the relays first, then
    the nodes; the rest of the draw is the verifiers'."""
    relay_rows = relays.rows(min(amount, relays.owed))
    left = amount - sum(a for _, a in relay_rows)
    return relay_rows, nodes.rows(min(left, nodes.owed))


def _merged(*parts: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    """Rows of several parts, one per account (an account may be a relay's and a node's)."""
    rows: dict[str, int] = {}
    for part in parts:
        for account, amount in part:
            rows[account] = rows.get(account, 0) + amount
    return tuple(sorted(rows.items()))


def close(state: State, height: int) -> None:
    """EndBlock of the epoch's last height: settle the epoch (module docstring)."""
    epoch = height // state.genesis.epoch_length
    slashed = state.items(schema.SLASHED, *schema.epoch_range(epoch))
    for key, _ in slashed:
        state.delete(schema.SLASHED, key)
    accounts = tuple(key.split("/", 1)[1] for key, _ in slashed)
    nodes = node_payouts.take(state, epoch, set(accounts))
    relays = relay_payouts.take(state, epoch, set(accounts))
    escrow = state.genesis.escrow_address
    if escrow is None or epoch > MAX_COMMITTEE_EPOCH:
        return
    escrow = escrow.lower()
    due = int(state.get(schema.CREDIT_DUE, schema.epoch_key(epoch)) or 0)
    state.delete(schema.CREDIT_DUE, schema.epoch_key(epoch))
    _forget_expired(state, epoch)
    # a slashed account's credits are not drawn: their price stays in the pool
    due -= min(due, (nodes.forfeit + relays.forfeit) * (state.genesis.credit_price_wei or 0))
    pool = int(state.get(schema.CREDIT_POOL, schema.POOL_BALANCE) or 0)
    purchases, revenue = _pending_units(state)
    # the pool pays, after this close's purchases: the refunds of unsigned mints first, each
    # whole (mint_partials.py), then what this epoch is due: the relays' credits, the nodes' at
    # their price less the verifiers' cut, the verifiers the rest
    available = pool + sum(u.amount for u in purchases)
    refunds = mint_partials.take_refunds(state, epoch)
    paying = refunds[: mint_partials.payable(refunds, available)]
    refunded = sum(amount for _, _, amount in paying)
    refund_rows = _merged(tuple((payer, amount) for _, payer, amount in paying))
    others = min(due, available - refunded) if nodes.credits or relays.credits else 0
    amount = refunded + others
    relay_rows, node_rows = _direct_rows(relays, nodes, others)
    rows = _merged(refund_rows, relay_rows, node_rows)
    pages, direct = _plan_draw(escrow, purchases, revenue, amount, rows)
    work = EpochWork(
        epoch=epoch,
        queries=(),
        compute=(),
        verification=verification_work(state, epoch),
        slashed=accounts,
        verifier_cut_bps=state.genesis.verifier_cut_bps,
    )
    settled: tuple[EpochSettlement, ...] = ()
    if pages:
        try:
            settled = _settle(work, epoch, pages, direct)
        except NothingToPayError:  # no eligible verifier: their part waits (due to e+1)
            part = sum(a for _, a in direct)
            pages, direct = _plan_draw(escrow, purchases, revenue, part, direct)
            settled = _settle(work, epoch, pages, direct) if pages else ()
    if nodes.owed and not (direct and node_rows):
        node_payouts.carry_forward(state, epoch, nodes)
    if relays.credits and not (direct and relay_rows):
        relay_payouts.carry_forward(state, epoch, relays)
    if not direct:
        refunded = 0  # the draw is not on this close's pages: every refund waits, whole
    mint_partials.carry_refunds(state, epoch, refunds[len(paying) if refunded else 0 :])
    drawn = 0
    for index, (page, statement) in enumerate(zip(pages, settled, strict=True)):
        for unit in page.queries:
            key = schema.query_key(unit.order[1], unit.gateway)
            state.delete(schema.PENDING_QUERY, key)
            state.put(
                schema.SETTLED_QUERY,
                key,
                {"fee": str(unit.amount), "statement": statement.epoch},
            )
            rules.track(state, schema.SETTLED_QUERY, key)
        for unit in page.charges:
            if unit.kind == "draw":
                pool -= unit.amount
                drawn += unit.amount
                continue
            if unit.kind == "purchase":
                pool += unit.amount
            state.delete(schema.PENDING_CHARGE, schema.charge_key(*unit.order[1:]))
        _store_statement(state, epoch, index, len(pages), page, statement, height)
    state.put(schema.CREDIT_POOL, schema.POOL_BALANCE, str(pool))
    due -= drawn - refunded  # the refunds were drawn besides what the epoch was due
    owe(state, epoch + 1, due)  # what this close did not pay: due to the next epoch


def _plan_draw(
    escrow: str,
    purchases: list[_Unit],
    revenue: list[_Unit],
    amount: int,
    direct: tuple[tuple[str, int], ...],
) -> tuple[list[_Page], tuple[tuple[str, int], ...]]:
    """The close's pages with a draw of `amount` (none at 0), and the relays' and nodes'
    `direct` rows it pays: none when the draw did not fit in the close's pages (it waits,
    still due)."""
    draw = [_Unit(0, ("c", escrow, escrow, POOL_KIND, "draw"), amount)] if amount else []
    pages = _plan_pages(purchases + draw + revenue)
    return pages, direct if _drawn(pages) else ()


def _drawn(pages: list[_Page]) -> int:
    """Wei the pages draw from the credit pool."""
    return sum(unit.amount for page in pages for unit in page.charges if unit.kind == "draw")


def _settle(
    work: EpochWork,
    epoch: int,
    pages: list[_Page],
    direct: tuple[tuple[str, int], ...] = (),
) -> tuple[EpochSettlement, ...]:
    """One statement per planned page (`NothingToPayError` as `close_epoch_pages`); the
    relays' and nodes' `direct` rows paid first from the draw, the verifiers' table the rest."""
    numbered = [page.page_charges(statement_number(epoch, i)) for i, page in enumerate(pages)]
    return close_epoch_pages(work, numbered, direct)


def _store_statement(
    state: State,
    epoch: int,
    index: int,
    pages: int,
    page: _Page,
    statement: EpochSettlement,
    height: int,
) -> None:
    key = schema.statement_key(epoch, index)
    table = statement.table
    state.put(
        schema.PAYOUT,
        key,
        {
            "epoch": statement.epoch,
            "committee_epoch": epoch,
            "page": index,
            "pages": pages,
            "root": "0x" + statement.root.hex(),
            "total": str(statement.total),
            "queries_hash": "0x" + statement.queries_hash.hex(),
            "consumer": state.genesis.escrow_address,
            "query_ids": ["0x" + q.hex() for q in statement.query_ids],
            "fees": [str(fee) for fee in statement.fees],
            "payers": list(statement.payers),
            "gateways": list(statement.gateways),
            "debits": [str(debit) for debit in statement.debits],
            "charges": [[*u.order[1:], str(u.total)] for u in page.charges if u.kind != "draw"],
            "rows": [[account, str(amount)] for account, amount in statement.rows],
            "shares": (
                {a: str(s) for a, s in sorted(table.verification_shares.items())}
                if index == 0
                else {}
            ),
            "closed_height": height,
            "votes": {},
            "power": 0,
            "confirmed": False,
            "confirmed_height": None,
        },
    )
    rules.track(state, schema.PAYOUT, key)


def verification_work(state: State, epoch: int) -> tuple[VerificationWork, ...]:
    """The spot checks credited in `epoch` (`vwork/`), per operator account, in key order."""
    start, stop = schema.epoch_range(epoch)
    return tuple(
        VerificationWork(account=key[len(start) :], spot_checks=count)
        for key, count in state.items(schema.SPOT_CREDIT, start, stop)
        if count > 0
    )
