"""Settlement: the books from receipts to claims, and the cost of an epoch close (one JSON).

**books** (the money path, in one process, real code on both sides): N questions (default
1,000) served by 2 gateways, each paid by a per-query deposit, a voucher or a payment key (by
index, one third each) of 8 payers. Each gateway's `WorkLedger` records its receipts in its
journal and its `WorkReporter` sends them to an in-process committee chain (`Chain`: the real
`StateMachine`, blocks as CometBFT drives them), split by encoded bytes (they name no node:
nodes are paid through the credits they redeem); the epoch closes into its
statements, each gateway's charges on its own pages (more when `--statement-gas` makes one too
small), 3 of 4 validators sign each, and a simulated escrow
posts them — it checks each statement's `queriesHash` against the arrays it is given and its
total, charges every listed query once and debits every listed (payer, gateway) balance, like
`QueryEscrow.postPayoutRoot` — and every row is claimed with its Merkle proof from
`/payouts/proof`. Checked: no report or item refused, every question's fee charged exactly
once (per query, or in its (payer, gateway) debit), claims sum exactly to what was collected,
each gateway claims exactly its own users' fees.

**close**: for each size N, a committee state (SQLite in memory, as the app's store) holding N
SERVING, staked compute nodes over 32 shards of one model and, committed in the block before,
N redemption records (one per node), the credit pool's draw due to them, and --pending queries of
one gateway (default 500; more than ~1,770 close into several pages); then the epoch-closing
block. Timed
(median over --repeats): `settlement.close` alone and the whole EndBlock, wall and (close) CPU;
plus one `/payouts/proof` query. Every value derives from its index (no randomness).

    .venv/bin/python bench/settlement.py                    # books 1000, sizes 100 10000 100000
    .venv/bin/python bench/settlement.py --questions 1000 --statement-gas 2000000 --sizes 100
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from abci_app import schema, settlement
from abci_app.codes import Code
from abci_app.machine import StateMachine
from abci_app.queries import query
from abci_app.state import State
from abci_app.store import Store
from bench._common import machine, median, parse_with_quick, spread
from node.gateway.settlement import WorkLedger, WorkReporter, ledger_paths
from protocol.committee.gateways import sign_binding
from protocol.committee.settlement import PayoutVote
from protocol.eip712 import PayoutRoot, address_of, committee_domain, sign_digest
from protocol.payment import PaymentKey, Voucher, payment_domain
from shares.merkle import Payout, verify
from shares.settlement import sorted_queries_hash
from tests.committee_chain import (
    CHAIN_ID,
    COMMITTEE_ADDRESS,
    EVM_CHAIN_ID,
    Chain,
    ReportingLink,
    seeded_evm_key,
    seeded_key,
)

log = logging.getLogger("bench.settlement")
MODEL = "sha256:" + "ab" * 32
SHARDS = 32
EPOCH = 10
ESCROW = "0x" + "ee" * 20
BOOKS_GATEWAY = "0x" + "9a" * 20  # the close runs' one gateway address
QUERIES_PER_CLOSE = 500  # pending queries in the close-cost runs (default of --pending)

# --- books --------------------------------------------------------------------------------------

NOW = 1_800_000_000
PRICE = 10**9  # wei per token
MODEL_ID = bytes.fromhex("4d" * 32)
PAYERS = 8
GATEWAYS = 2
BOOKS_EPOCH = 200  # blocks: every report lands in epoch 1


@dataclass
class Escrow:
    """What `QueryEscrow.postPayoutRoot` and `claim` do with money, in Python: deposits per
    query, balances per (payer, gateway), statements posted once, claims once per row."""

    deposits: dict[str, int] = field(default_factory=dict)  # query id → deposit
    settled: dict[str, int] = field(default_factory=dict)  # query id → fee charged
    balances: dict[tuple[str, str], int] = field(default_factory=dict)
    debited: dict[tuple[str, str], int] = field(default_factory=dict)
    collected: dict[int, int] = field(default_factory=dict)  # statement → wei collected
    claimed: dict[int, int] = field(default_factory=dict)
    claimed_by: dict[str, int] = field(default_factory=dict)  # account → wei claimed

    def post(self, view: dict[str, Any]) -> None:
        number = int(view["epoch"])
        if number in self.collected:
            raise AssertionError(f"statement {number} posted twice")
        if not view["confirmed"]:
            raise AssertionError(f"statement {number} is not confirmed")
        ids = tuple(bytes.fromhex(q[2:]) for q in view["query_ids"])
        fees = tuple(int(f) for f in view["fees"])
        payers, gateways = tuple(view["payers"]), tuple(view["gateways"])
        debits = tuple(int(d) for d in view["debits"])
        hashed = sorted_queries_hash(ids, fees, payers, gateways, debits)
        if "0x" + hashed.hex() != view["queries_hash"]:
            raise AssertionError(f"statement {number}: queriesHash mismatch")
        if sum(fees) + sum(debits) != int(view["total"]):
            raise AssertionError(f"statement {number}: total mismatch")
        pairs = list(zip(payers, gateways, strict=True))
        if pairs != sorted(set(pairs)):
            raise AssertionError(f"statement {number}: pairs not strictly ascending")
        collected = 0
        for query_id, fee in zip(view["query_ids"], fees, strict=True):
            if query_id in self.settled or fee > self.deposits[query_id]:
                raise AssertionError(f"query {query_id} charged twice or above its deposit")
            self.settled[query_id] = fee
            collected += fee
        for pair, debit in zip(pairs, debits, strict=True):
            charged = min(debit, self.balances.get(pair, 0))
            self.balances[pair] = self.balances.get(pair, 0) - charged
            self.debited[pair] = self.debited.get(pair, 0) + charged
            collected += charged
        self.collected[number] = collected

    def claim(self, view: dict[str, Any], proofs: dict[str, list[str]]) -> None:
        number = int(view["epoch"])
        root = bytes.fromhex(view["root"][2:])
        paid = 0
        for account, amount in view["rows"]:
            steps = [bytes.fromhex(p[2:]) for p in proofs[account]]
            if not verify(root, Payout(number, account, int(amount)), steps):
                raise AssertionError(f"statement {number}: a proof does not verify")
            paid += int(amount)
            self.claimed_by[account] = self.claimed_by.get(account, 0) + int(amount)
        self.claimed[number] = paid


def _ask(chain: Chain, path: str) -> Any:
    code, value, message = query(chain.state, path, b"")
    if code != Code.OK:
        raise AssertionError(f"{path}: {message}")
    return json.loads(value)


def _receipts(questions: int) -> list[tuple[int, dict[str, Any]]]:
    """(gateway index, receipt) of each question, by index."""
    payer_keys = [seeded_evm_key(f"payer-{p}") for p in range(PAYERS)]
    gateways = [address_of(seeded_evm_key(f"gateway-{g}")).lower() for g in range(GATEWAYS)]
    domain = payment_domain(EVM_CHAIN_ID, ESCROW)
    keys: dict[tuple[int, int], tuple[PaymentKey, str]] = {}
    totals: dict[tuple[int, int], int] = {}
    out = []
    for i in range(questions):
        g, p = i % GATEWAYS, (i // GATEWAYS) % PAYERS
        prompt, completion = 5 + i % 7, 1 + i % 11
        fee = PRICE * (prompt + completion)
        query_id = bytes.fromhex(hashlib.sha256(b"q/%d" % i).hexdigest())
        doc: dict[str, Any] = {
            "query_id": "0x" + query_id.hex(),
            "gateway": gateways[g],
            "model_id": "0x" + MODEL_ID.hex(),
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "fee_wei": str(fee),
        }
        payer = address_of(payer_keys[p]).lower()
        kind = i % 3
        if kind == 1:  # a voucher for this one question
            voucher = Voucher(gateways[g], query_id, MODEL_ID, 2 * fee, NOW + 3600, ESCROW)
            signature = sign_digest(payer_keys[p], voucher.digest(domain))
            doc["payer"] = payer
            doc["voucher"] = {
                "fee_cap_wei": str(voucher.fee_cap),
                "expiry": voucher.expiry,
                "signature": "0x" + signature.hex(),
            }
        elif kind == 2:  # the payer's one key at this gateway, charged cumulatively
            if (g, p) not in keys:
                key_id = hashlib.sha256(b"key/%d/%d" % (g, p)).digest()
                key = PaymentKey(gateways[g], key_id, MODEL_ID, 10**18, NOW + 86_400, ESCROW)
                keys[(g, p)] = (key, "0x" + sign_digest(payer_keys[p], key.digest(domain)).hex())
            key, signature_hex = keys[(g, p)]
            totals[(g, p)] = totals.get((g, p), 0) + fee
            doc["payer"] = payer
            doc["key"] = {
                "key_id": "0x" + key.key_id.hex(),
                "cap_wei": str(key.cap),
                "expiry": key.expiry,
                "signature": signature_hex,
                "total_wei": str(totals[(g, p)]),
            }
        out.append((g, doc))
    return out


def books(questions: int, statement_gas: int, directory: Path) -> dict[str, Any]:
    """The books run (module docstring): its figures, after every check passed."""
    gateway_keys = [seeded_key(f"gateway-{g}") for g in range(GATEWAYS)]
    chain = Chain(
        genesis={
            "epoch_length": BOOKS_EPOCH,
            "evm": {
                "chain_id": EVM_CHAIN_ID,
                "committee_address": COMMITTEE_ADDRESS,
                "escrow_address": ESCROW,
            },
        }
    )
    chain.time_s = NOW
    # each gateway key bound (gateway tx) to the address its receipts name: its revenue's payee
    bindings = [
        chain.tx(
            sign_binding(
                seeded_evm_key(f"gateway-{g}"),
                k.verify_key.encode().hex(),
                bound=True,
                nonce=1,
                chain_id=CHAIN_ID,
                evm_chain_id=EVM_CHAIN_ID,
                committee_address=COMMITTEE_ADDRESS,
            ),
            k,
        )
        for g, k in enumerate(gateway_keys)
    ]
    assert [r.code for r in chain.block(bindings)] == [Code.OK] * len(bindings)
    t0 = time.perf_counter()
    receipts = _receipts(questions)
    signed_s = time.perf_counter() - t0
    escrow = Escrow()
    ledgers = []
    for g in range(GATEWAYS):
        journal, refused = ledger_paths(directory / f"gateway-{g}-receipts.jsonl")
        ledgers.append(WorkLedger(journal=journal, refused_path=refused))
    owed: dict[tuple[str, str], int] = {}  # (payer, gateway) → Σ prepaid fees
    t0 = time.perf_counter()
    for g, doc in receipts:
        ledgers[g].record(doc)
        fee = int(doc["fee_wei"])
        if "payer" in doc:
            pair = (doc["payer"], doc["gateway"])
            owed[pair] = owed.get(pair, 0) + fee
            escrow.balances[pair] = escrow.balances.get(pair, 0) + 2 * fee  # funded enough
        else:
            escrow.deposits[doc["query_id"]] = 2 * fee
    record_s = time.perf_counter() - t0
    links = [ReportingLink(chain, key) for key in gateway_keys]
    t0 = time.perf_counter()
    reports = 0
    for ledger, link in zip(ledgers, links, strict=True):
        reports += asyncio.run(WorkReporter(ledger, link, settle_s=0.0).flush(force=True))
    report_s = time.perf_counter() - t0
    refused = sum(len(ledger.refused) for ledger in ledgers)
    left = sum(bool(ledger.pending or ledger.in_flight) for ledger in ledgers)
    original = settlement.MAX_STATEMENT_GAS
    settlement.MAX_STATEMENT_GAS = statement_gas
    try:
        t0 = time.perf_counter()
        chain.advance_to(BOOKS_EPOCH)
        close_s = time.perf_counter() - t0
    finally:
        settlement.MAX_STATEMENT_GAS = original
    statements = [s for s in _ask(chain, "/payouts")["epochs"] if s["committee_epoch"] == 1]
    domain = committee_domain(EVM_CHAIN_ID, COMMITTEE_ADDRESS)
    for summary in sorted(statements, key=lambda s: s["epoch"]):
        number = summary["epoch"]
        record = _ask(chain, f"/payouts?epoch={number}")["statement"]
        statement = PayoutRoot(
            number,
            bytes.fromhex(record["root"][2:]),
            int(record["total"]),
            bytes.fromhex(record["queries_hash"][2:]),
            record["consumer"],
        )
        votes = [
            chain.tx(PayoutVote(number, "0x" + statement.sign(v.operator_key, domain).hex()), v.key)
            for v in chain.validators[:3]
        ]
        assert [r.code for r in chain.block(votes)] == [Code.OK] * 3
        view = _ask(chain, f"/payouts?epoch={number}")
        escrow.post(view)
        proofs = {
            account: _ask(chain, f"/payouts/proof?epoch={number}&account={account}")["proof"]
            for account, _ in view["rows"]
        }
        escrow.claim(view, proofs)
    per_query = {doc["query_id"]: int(doc["fee_wei"]) for _, doc in receipts if "payer" not in doc}
    revenue: dict[str, int] = {}  # gateway → the fees its own users paid
    for _, doc in receipts:
        revenue[doc["gateway"]] = revenue.get(doc["gateway"], 0) + int(doc["fee_wei"])
    own_revenue = escrow.claimed_by == revenue
    every_fee_once = escrow.settled == per_query and escrow.debited == owed
    collected = sum(escrow.collected.values())
    served_fees = sum(int(doc["fee_wei"]) for _, doc in receipts)
    sizes = [len(raw) for link in links for raw in link.mined]
    result = {
        "books_questions": questions,
        "books_gateways": GATEWAYS,
        "books_per_query": len(per_query),
        "books_vouchers": sum("voucher" in doc for _, doc in receipts),
        "books_key_questions": sum("key" in doc for _, doc in receipts),
        "books_reports": reports,
        "books_report_bytes_max": max(sizes) if sizes else 0,
        "books_refused_items": refused,
        "books_unreported_ledgers": left,
        "books_statements": len(statements),
        "books_fees_served_wei": served_fees,
        "books_collected_wei": collected,
        "books_claimed_wei": sum(escrow.claimed.values()),
        "books_every_fee_debited_once": int(every_fee_once),  # 1: yes
        "books_payouts_equal_collected": int(escrow.claimed == escrow.collected),
        "books_each_gateway_paid_its_own_fees": int(own_revenue),
        "books_sign_s": round(signed_s, 3),
        "books_record_s": round(record_s, 3),
        "books_report_s": round(report_s, 3),
        "books_close_s": round(close_s, 3),
    }
    failed = [
        name
        for name, ok in (
            ("refused items", refused == 0),
            ("unreported ledger", left == 0),
            ("a fee not debited exactly once", every_fee_once),
            ("claims differ from what was collected", escrow.claimed == escrow.collected),
            ("collected differs from the fees served", collected == served_fees),
            ("a gateway was paid another's fees", own_revenue),
        )
        if not ok
    ]
    if failed:
        raise SystemExit(f"bench: books failed: {', '.join(failed)}: {result}")
    return result


# --- close ----------------------------------------------------------------------------------------


def _genesis() -> bytes:
    return json.dumps(
        {
            "epoch_length": EPOCH,
            "evm": {
                "chain_id": 31337,
                "committee_address": "0x" + "cc" * 20,
                "escrow_address": ESCROW,
            },
            "credits": {"price_wei": str(10**12), "layer_tokens": 4096},
        }
    ).encode()


def _block(machine: StateMachine, height: int, writes: list[tuple[str, str, Any]]) -> float:
    """Apply one block with `writes` staged; returns the EndBlock wall time."""
    machine.begin_block(height, hashlib.sha256(b"block/%d" % height).digest())
    for ns, key, value in writes:
        machine.state.put(ns, key, value)
    t0 = time.perf_counter()
    machine.end_block()
    elapsed = time.perf_counter() - t0
    machine.commit()
    return elapsed


def one_run(n: int, pending: int = QUERIES_PER_CLOSE) -> dict[str, float]:
    machine = StateMachine(State(Store(":memory:")))
    state = machine.state
    machine.init_chain("bench", [(hashlib.sha256(b"v").digest(), 10)], _genesis(), 0)
    writes: list[tuple[str, str, Any]] = []
    accounts = []
    for i in range(n):
        key = hashlib.sha256(b"node/%d" % i).hexdigest()
        account = "0x" + hashlib.sha256(b"evm/%d" % i).hexdigest()[:40]
        accounts.append(account)
        shard = i % SHARDS
        node = {
            "key": key, "evm_address": account, "role": "compute", "model": MODEL,
            "shards": [shard], "endpoint": "http://x", "capacity": 8, "status": "SERVING",
            "status_height": 1, "registered_height": 1, "last_heartbeat": 1,
        }  # fmt: skip
        writes.append(("node", key, node))
        writes.append(("stake", key, {"attestations": {}, "agreed": str(10**18), "height": 1}))
        writes.append(("rep", key, {"r": 500_000, "window": [], "epochs": 0, "last_epoch": 0}))
    _block(machine, 1, writes)
    for height in range(2, EPOCH - 1):
        _block(machine, height, [])
    credits = [
        (
            "credit",
            schema.credit_key(1, account, MODEL, i % SHARDS),
            {
                "account": account,
                "model": MODEL,
                "shard": i % SHARDS,
                "credits": 1,
                "layer_tokens": 4096,
            },
        )
        for i, account in enumerate(accounts)
    ]
    queries = [
        ("squery", "0x" + hashlib.sha256(b"q/%d" % i).hexdigest() + "/" + BOOKS_GATEWAY,
                                                                   {"fee": str(10**12 + i),
                                                                    "height": 2,
                                                                    "gateway": BOOKS_GATEWAY})
        for i in range(pending)
    ]  # fmt: skip
    # what the epoch's redemptions are due (one credit each), and a pool that holds it: the draw
    # the close pays
    due = [
        (schema.CREDIT_DUE, schema.epoch_key(1), str(10**12 * n)),
        (schema.CREDIT_POOL, schema.POOL_BALANCE, str(10**12 * n)),
    ]
    _block(machine, EPOCH - 1, credits + queries + due)
    timed: dict[str, float] = {}
    original = settlement.close

    def close(state: State, height: int) -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        original(state, height)
        timed["close"] = time.perf_counter() - t0
        timed["close_cpu"] = time.process_time() - c0

    settlement.close = close  # type: ignore[assignment]
    try:
        end_block = _block(machine, EPOCH, [])
    finally:
        settlement.close = original  # type: ignore[assignment]
    records = [record for _, record in state.committed_items("payout")]
    accounts_paid = {account for record in records for account, _ in record["rows"]}
    if accounts_paid != {*accounts, BOOKS_GATEWAY}:
        raise SystemExit(f"bench: epoch 1 did not pay its {n} accounts and the gateway")
    account = accounts[n // 2]
    number = next(r["epoch"] for r in records if any(a == account for a, _ in r["rows"]))
    t0 = time.perf_counter()
    code, _, message = query(state, f"/payouts/proof?epoch={number}&account={account}", b"")
    proof_s = time.perf_counter() - t0
    if code != 0:
        raise SystemExit(f"bench: proof query failed: {message}")
    pages = len(state.items("payout"))
    return {**timed, "end_block": end_block, "proof": proof_s, "pages": pages}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=1_000, help="questions in the books run")
    parser.add_argument(
        "--statement-gas",
        type=int,
        default=settlement.MAX_STATEMENT_GAS,
        help="postPayoutRoot gas one statement may use (lower it to settle in pages)",
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--pending", type=int, default=QUERIES_PER_CLOSE, help="pending queries at each close"
    )
    args = parse_with_quick(
        parser, {"sizes": [100, 1_000], "repeats": 1, "statement_gas": 1_000_000}, argv
    )
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    metrics: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-settlement-") as directory:
        metrics.update(books(args.questions, args.statement_gas, Path(directory)))
    print(f"books {metrics}", file=sys.stderr)
    for n in args.sizes:
        runs = [one_run(n, args.pending) for _ in range(args.repeats)]
        metrics[f"app_settlement_pages_{n}_nodes"] = runs[0]["pages"]
        for name, metric in (
            ("close", "app_settlement_close_s"),
            ("close_cpu", "app_settlement_close_cpu_s"),
            ("end_block", "app_epoch_end_block_s"),
            ("proof", "payout_proof_query_s"),
        ):
            values = [r[name] for r in runs]
            metrics[f"{metric}_{n}_nodes"] = round(median(values), 4)
            metrics[f"{metric}_{n}_nodes_spread"] = spread(values, 4)
        print(f"n={n} {metrics}", file=sys.stderr)
    print(
        json.dumps(
            {
                "bench": "settlement",
                "machine": machine(),
                "config": {
                    "questions": args.questions,
                    "statement_gas": args.statement_gas,
                    "sizes": args.sizes,
                    "repeats": args.repeats,
                    "quick": args.quick,
                    "shards": SHARDS,
                    "pending_queries": args.pending,
                },
                "metrics": metrics,
                "targets": {
                    "app_settlement_close_s_100000_nodes": {"op": "<", "value": 10},
                    "books_refused_items": {"op": "==", "value": 0},
                    "books_every_fee_debited_once": {"op": "==", "value": 1},
                    "books_payouts_equal_collected": {"op": "==", "value": 1},
                    "books_each_gateway_paid_its_own_fees": {"op": "==", "value": 1},
                },
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
