"""Epoch settlement on the committee chain: evidence-backed work → shares → a signed payout root.

Three tx types (`protocol.committee.settlement`) and one EndBlock rule:

- `work_report` (a gateway listed in genesis `gateways`): per-node aggregates of the work in the
  gateway's signed receipts, `[node, model, shard, layers, tokens]`, and the query ids it settled
  with their fees, `[query id, fee]`. The two lists are independent: no session, no per-query
  node, so nothing on chain links a question (or its payer) to the nodes that computed it.
  Effects: `backing/<node>/<model>/<shard>` += layers·tokens (the node's *uncredited* backed
  work, carried across epochs); `squery/<query id>` = `{fee, height}` (pending settlement).
  Refused whole: signer not a genesis gateway (`UNKNOWN_GATEWAY`), a node not registered or not
  a compute node (`UNKNOWN_NODE`, `WRONG_ROLE`), a query id already pending or settled
  (`DUPLICATE_QUERY`).
  Optional `prepaid`: the prepaid questions it charged, `[gateway, payer, query id, model id,
  fee, fee cap, expiry, voucher signature]` each (no node, circuit or session). Each is checked
  at this boundary: the voucher (`protocol.payment.Voucher`, payment domain of genesis `evm`,
  consumer = the escrow) must recover to `payer` and `fee ≤ cap` (`VOUCHER_INVALID`); the block
  header's time (CometBFT's BFT time, the same on every node) must not be past its `expiry`
  (`VOUCHER_EXPIRED`), nor the expiry more than `prepaid.MAX_VOUCHER_LIFETIME_S` ahead
  (`VOUCHER_EXPIRY_TOO_FAR`: the replay guard below must stay bounded); a (payer, query id)
  charged before is `VOUCHER_REPLAYED`. Effects: `vpend/<payer>/<query id>` (pending debit)
  and `vseen/<payer>/<query id>` = expiry, the replay guard, deleted once a block's time is past
  the expiry (`retention.track_until`); after that the voucher itself is refused as expired.
  The gateway's receipt signature is *not* sent: it covers the circuit hash, which over the
  public node registry names the circuit, so next to a payer it would link the payer to nodes.
  The report's own signature (a genesis gateway's committee key) is the gateway's word.
- `contribution` (a compute node, not LEFT): the node's own count `[model, shard, layers,
  tokens]` since its last contribution. Each item is credited `min(layers·tokens, backing)` and
  the backing shrinks by that much; the credit goes to `credit/<epoch>/<evm address>/<shard>/
  <model>` of the epoch the block belongs to. An item on a shard the node did not register, or
  with no backing left, refuses the whole tx (`UNBACKED_CONTRIBUTION`): the chain never credits
  work nobody paid a gateway for, and never more than a node claims for itself.
- `payout_vote` (a validator): its operator key's EIP-712 signature over the stored `PayoutRoot`
  statement of `epoch` (committee domain of genesis `evm`). The statement is fixed when the
  epoch closes and never recomputed, so re-signing it yields the same statement (the escrow's
  `disputeRoot` needs two *different* signed statements). `payout/<epoch>` accumulates `votes`
  and `power`; `confirmed` at ≥ 2/3 of the power. Refused: not a validator (`NOT_VALIDATOR`),
  no `evm.escrow_address` (`SETTLEMENT_DISABLED`), no statement for that epoch
  (`NO_STATEMENT`), a signature that does not recover to the validator's operator
  (`BAD_PAYOUT_SIGNATURE`), a second vote of the same validator (`DUPLICATE_VOTE`).

**Epoch close** (`close`, EndBlock of height e·L, before the next epoch is fixed): the epoch's
credits become `ComputeWork` items (account = the node's EVM address; the model id hashed to fit
`shares`' grammar; layers 1 and tokens = layer-tokens, which gives the same shares); the pending
queries (ascending id, at most `MAX_SETTLED_QUERIES`) are the `SettledQuery`s; the pending
prepaid charges (ascending (payer, query id), at most `MAX_SETTLED_CHARGES`, a payer's sum kept
< 2^128) become `EpochWork.debits` through `shares.settlement.prepaid_debits`; pool health per
(model, shard) = max(nodes routable there now, accounts credited there); accounts whose verdict
was confirmed in the epoch are `slashed`; the spot checks credited in the epoch
(`vwork/<e>/…`, written by `abci_app/spot_reports.py`) are the `VerificationWork`.
`shares.settlement.close_epoch` gives the root; `payout/<e>` stores the statement, the sorted
query ids and fees, the payers and debits (what `postPayoutRoot` takes), the settled prepaid
`charges` `[payer, query id]` (so gateways learn which of their charges the root covers), the
rows and the compute shares; the settled queries move to `sqdone/<id>`, the settled charges
leave `vpend/`. No pending query or charge, or `NothingToPayError` → no statement: the queries stay
pending and the epoch's credits move to the next epoch (work reported just before its fees is
not lost). The epoch's slash marks are deleted either way.
`payout/` and `sqdone/` entries are pruned with the epoch's other records (`rules.track`).
"""

from __future__ import annotations

import hashlib
from typing import Any

from abci_app import prepaid, rules, schema
from abci_app.codes import Code
from abci_app.state import State
from protocol.committee.envelope import SignedTx
from protocol.committee.settlement import Contribution, PayoutVote, PrepaidItem, WorkReport
from protocol.eip712 import PayoutRoot, committee_domain, recover_digest
from protocol.errors import ProtocolError
from protocol.payment import Voucher, payment_domain
from shares.errors import NothingToPayError
from shares.payouts import (
    MAX_DEBIT,
    ComputeWork,
    EpochWork,
    SettledQuery,
    ShardHealth,
    VerificationWork,
)
from shares.settlement import VoucherCharge, close_epoch, prepaid_debits

MAX_SETTLED_QUERIES = 500  # queries per root: postPayoutRoot's gas grows with each one
MAX_LAYER_TOKENS = (1 << 63) - 1
MAX_SETTLED_CHARGES = 500  # prepaid charges per root (their payers cost postPayoutRoot gas)


def model_key(model: str) -> str:
    """`shares` accepts model ids of ≤ 64 chars of a small alphabet; the registry's are longer
    (manifest hashes), so the payout input names each model by a prefix of its sha256."""
    return hashlib.sha256(model.encode()).hexdigest()[:48]


# --- tx handlers --------------------------------------------------------------------------------


def work_report(state: State, tx: SignedTx) -> None:
    body: WorkReport = tx.body
    if tx.signer not in state.genesis.gateways:
        rules.reject(Code.UNKNOWN_GATEWAY, f"signer {tx.signer} is not a genesis gateway")
    for charge in body.prepaid:
        _check_charge(state, charge)
    for query_id, _ in body.queries:
        if (
            state.get(schema.PENDING_QUERY, query_id) is not None
            or state.get(schema.SETTLED_QUERY, query_id) is not None
        ):
            rules.reject(Code.DUPLICATE_QUERY, f"query {query_id} was already reported")
    for item in body.work:
        node = state.get(schema.NODE, item.node)
        if node is None:
            rules.reject(Code.UNKNOWN_NODE, f"node {item.node} is not registered")
        if node["role"] != "compute":
            rules.reject(Code.WRONG_ROLE, f"node {item.node} is not a compute node")
    for item in body.work:
        key = schema.backing_key(item.node, item.model, item.shard)
        current = state.get(schema.BACKING, key) or 0
        state.put(schema.BACKING, key, min(MAX_LAYER_TOKENS, current + item.layers * item.tokens))
    for query_id, fee in body.queries:
        state.put(schema.PENDING_QUERY, query_id, {"fee": str(fee), "height": state.block_height})
    for charge in body.prepaid:
        prepaid.record(
            state, charge.payer, charge.query_id, charge.fee, charge.fee_cap, charge.expiry
        )
    state.emit(
        "planet.work_report",
        gateway=tx.signer,
        nodes=len(body.work),
        queries=len(body.queries),
        prepaid=len(body.prepaid),
    )


def _check_charge(state: State, charge: PrepaidItem) -> None:
    """Refuse a prepaid charge the chain must not debit (module docstring); no writes."""
    genesis = state.genesis
    where = f"voucher {charge.query_id} of {charge.payer}"
    prepaid.check_new(
        state, charge.payer, charge.query_id, charge.fee, charge.fee_cap, charge.expiry, where
    )
    try:
        voucher = Voucher(
            gateway=charge.gateway,
            query_id=bytes.fromhex(charge.query_id[2:]),
            model_id=bytes.fromhex(charge.model_id[2:]),
            fee_cap=charge.fee_cap,
            expiry=charge.expiry,
            consumer=genesis.escrow_address,
        )
        domain = payment_domain(genesis.evm_chain_id, genesis.escrow_address)
        signer = recover_digest(voucher.digest(domain), bytes.fromhex(charge.signature[2:]))
    except ProtocolError as error:
        rules.reject(Code.VOUCHER_INVALID, f"{where}: {error.message}")
    if signer.lower() != charge.payer:
        rules.reject(Code.VOUCHER_INVALID, f"{where}: signed by {signer}, not by its payer")


def contribution(state: State, tx: SignedTx) -> None:
    body: Contribution = tx.body
    node = rules.registered_node(state, tx.signer)
    if node["role"] != "compute":
        rules.reject(Code.WRONG_ROLE, f"node {tx.signer} is not a compute node")
    if node["status"] == schema.LEFT:
        rules.reject(Code.INVALID_LIFECYCLE, f"node {tx.signer} has left")
    credits: list[tuple[str, int, int, int]] = []
    for item in body.work:
        if item.model != node["model"] or item.shard not in node["shards"]:
            rules.reject(
                Code.UNBACKED_CONTRIBUTION,
                f"shard {item.shard} of {item.model} is not registered by this node",
            )
        backed = (
            state.get(schema.BACKING, schema.backing_key(tx.signer, item.model, item.shard)) or 0
        )
        if backed == 0:
            rules.reject(
                Code.UNBACKED_CONTRIBUTION,
                f"no gateway-reported work for this node on shard {item.shard}",
            )
        credits.append((item.model, item.shard, min(item.layers * item.tokens, backed), backed))
    epoch = rules.epoch_of(state, state.block_height)
    account = str(node["evm_address"]).lower()
    total = 0
    for model, shard, credited, backed in credits:
        backing = schema.backing_key(tx.signer, model, shard)
        if credited == backed:
            state.delete(schema.BACKING, backing)
        else:
            state.put(schema.BACKING, backing, backed - credited)
        key = schema.credit_key(epoch, account, model, shard)
        previous = state.get(schema.CREDIT, key)
        layer_tokens = (previous["layer_tokens"] if previous else 0) + credited
        state.put(
            schema.CREDIT,
            key,
            {"account": account, "model": model, "shard": shard, "layer_tokens": layer_tokens},
        )
        total += credited
    state.emit("planet.contribution", node=tx.signer, epoch=epoch, layer_tokens=total)


def payout_domain_ok(state: State) -> bool:
    genesis = state.genesis
    return bool(genesis.escrow_address and genesis.committee_address and genesis.evm_chain_id)


def statement_of(record: dict[str, Any]) -> PayoutRoot:
    """The `PayoutRoot` a stored `payout/<e>` record stands for."""
    return PayoutRoot(
        epoch=record["epoch"],
        root=bytes.fromhex(record["root"][2:]),
        total=int(record["total"]),
        queries_hash=bytes.fromhex(record["queries_hash"][2:]),
        consumer=record["consumer"],
    )


def payout_vote(state: State, tx: SignedTx) -> None:
    body: PayoutVote = tx.body
    validator = rules.validator(state, tx.signer)
    genesis = state.genesis
    if not payout_domain_ok(state):
        rules.reject(
            Code.SETTLEMENT_DISABLED,
            "genesis has no evm {chain_id, committee_address, escrow_address}",
        )
    record = state.get(schema.PAYOUT, schema.epoch_key(body.epoch))
    if record is None:
        rules.reject(Code.NO_STATEMENT, f"epoch {body.epoch} has no payout statement")
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
    state.put(schema.PAYOUT, schema.epoch_key(body.epoch), updated)


# --- epoch close --------------------------------------------------------------------------------


def _routable_counts(state: State) -> dict[tuple[str, int], int]:
    """Routable compute nodes per (model, shard), as `/pool_health` counts them. Three ordered
    range scans (node, stake, rep) instead of two point lookups per node."""
    counts: dict[tuple[str, int], int] = {}
    untrusted_below = state.genesis.reputation.untrusted_below
    minimum = state.genesis.min_stake.get("compute", 0)
    stakes = dict(state.items(schema.STAKE))
    reps = dict(state.items(schema.REPUTATION))
    for key, node in state.items(schema.NODE):
        if node["role"] != "compute" or node["status"] != schema.SERVING:
            continue
        rep, stake = reps.get(key), stakes.get(key)
        if rep is None or rep["r"] < untrusted_below:
            continue
        if stake is None or stake["agreed"] is None or int(stake["agreed"]) < minimum:
            continue
        for shard in node["shards"]:
            counts[(node["model"], shard)] = counts.get((node["model"], shard), 0) + 1
    return counts


def _carry_forward(
    state: State, epoch: int, credits: list[tuple[str, Any]], slashed: list[tuple[str, Any]]
) -> None:
    """Credited work of an epoch that paid nothing moves to the next epoch (merged per
    account and shard), so work done just before its fees were reported is not lost; the work
    of accounts slashed in the epoch is dropped."""
    dropped = {key.split("/", 1)[1] for key, _ in slashed}
    for _, credit in credits:
        if credit["account"] in dropped:
            continue
        key = schema.credit_key(epoch + 1, credit["account"], credit["model"], credit["shard"])
        later = state.get(schema.CREDIT, key)
        total = credit["layer_tokens"] + (later["layer_tokens"] if later else 0)
        state.put(schema.CREDIT, key, {**credit, "layer_tokens": min(total, MAX_LAYER_TOKENS)})


def _pending_charges(state: State) -> list[VoucherCharge]:
    """The pending prepaid charges this epoch settles: ascending (payer, query id), at most
    `MAX_SETTLED_CHARGES`; a payer's charges stop where its sum would pass `MAX_DEBIT` (the rest
    wait for a later epoch), so `prepaid_debits` cannot overflow a debit."""
    charges: list[VoucherCharge] = []
    totals: dict[str, int] = {}
    for key, entry in state.items(schema.PENDING_CHARGE):
        if len(charges) == MAX_SETTLED_CHARGES:
            break
        payer, query_id = key.split("/", 1)
        fee = int(entry["fee"])
        if totals.get(payer, 0) + fee > MAX_DEBIT:
            continue
        totals[payer] = totals.get(payer, 0) + fee
        charges.append(VoucherCharge(payer, query_id, fee, int(entry["cap"])))
    return charges


def close(state: State, height: int) -> None:
    """EndBlock of the epoch's last height: settle the epoch (module docstring)."""
    epoch = height // state.genesis.epoch_length
    prefix = schema.epoch_key(epoch)
    credits = state.items(schema.CREDIT, *schema.epoch_range(epoch))
    slashed = state.items(schema.SLASHED, *schema.epoch_range(epoch))
    for key, _ in credits:
        state.delete(schema.CREDIT, key)
    for key, _ in slashed:
        state.delete(schema.SLASHED, key)
    escrow = state.genesis.escrow_address
    if escrow is None or not credits:
        return
    pending = state.items(schema.PENDING_QUERY)[:MAX_SETTLED_QUERIES]
    charges = _pending_charges(state)
    if not pending and not charges:
        _carry_forward(state, epoch, credits, slashed)
        return
    routable = _routable_counts(state)
    served: dict[tuple[str, int], set[str]] = {}
    compute = []
    for _, credit in credits:
        place = (credit["model"], credit["shard"])
        served.setdefault(place, set()).add(credit["account"])
        compute.append(
            ComputeWork(
                account=credit["account"],
                model=model_key(credit["model"]),
                shard=credit["shard"],
                layers=1,
                tokens=credit["layer_tokens"],
            )
        )
    health = tuple(
        ShardHealth(model_key(model), shard, max(routable.get((model, shard), 0), len(accounts)))
        for (model, shard), accounts in sorted(served.items())
    )
    work = EpochWork(
        epoch=epoch,
        queries=tuple(SettledQuery(query_id, int(entry["fee"])) for query_id, entry in pending),
        compute=tuple(compute),
        health=health,
        verification=verification_work(state, epoch),
        slashed=tuple(key.split("/", 1)[1] for key, _ in slashed),
        verifier_cut_bps=state.genesis.verifier_cut_bps,
        debits=prepaid_debits(charges),
    )
    try:
        settled = close_epoch(work)
    except NothingToPayError:  # no root: queries and credits wait for the next epoch
        _carry_forward(state, epoch, credits, slashed)
        return
    for query_id, _ in pending:
        state.delete(schema.PENDING_QUERY, query_id)
        state.put(schema.SETTLED_QUERY, query_id, epoch)
        rules.track(state, schema.SETTLED_QUERY, query_id)
    for charge in charges:
        state.delete(schema.PENDING_CHARGE, schema.charge_key(charge.payer, charge.query_id))
    table = settled.table
    state.put(
        schema.PAYOUT,
        prefix,
        {
            "epoch": epoch,
            "root": "0x" + settled.root.hex(),
            "total": str(settled.total),
            "queries_hash": "0x" + settled.queries_hash.hex(),
            "consumer": escrow,
            "query_ids": ["0x" + q.hex() for q in settled.query_ids],
            "fees": [str(fee) for fee in settled.fees],
            "payers": list(settled.payers),
            "debits": [str(debit) for debit in settled.debits],
            "charges": [[c.payer, c.query_id] for c in charges],
            "rows": [[account, str(amount)] for account, amount in table.payouts],
            "shares": {a: str(s) for a, s in sorted(table.compute_shares.items())},
            "closed_height": height,
            "votes": {},
            "power": 0,
            "confirmed": False,
            "confirmed_height": None,
        },
    )
    rules.track(state, schema.PAYOUT, prefix)


def verification_work(state: State, epoch: int) -> tuple[VerificationWork, ...]:
    """The spot checks credited in `epoch` (`vwork/`), per operator account, in key order."""
    start, stop = schema.epoch_range(epoch)
    return tuple(
        VerificationWork(account=key[len(start) :], spot_checks=count)
        for key, count in state.items(schema.SPOT_CREDIT, start, stop)
        if count > 0
    )
