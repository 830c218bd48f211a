"""Epoch settlement inside the committee app: EndBlock of an epoch's last height (one JSON).

For each size N: a committee state (SQLite in memory, as the app's store) holding N SERVING,
staked compute nodes over 32 shards of one model and, committed in the block before, N credits
(one per node) and min(N, 500) pending queries; then the epoch-closing block. Timed (median
over --repeats): `settlement.close` alone (credits and queries read from the store, EpochWork,
close_epoch, the statement written) and the whole EndBlock (close + the next epoch's record +
the block's app-hash digest), wall and (close) this process's CPU time, steadier on a shared
machine; plus one `/payouts/proof` query (it builds and caches the epoch's tree). Every value
derives from its index (no randomness).

    .venv/bin/python bench/settlement.py                    # sizes 100 10000 100000
    .venv/bin/python bench/settlement.py --sizes 100 1000 --repeats 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from abci_app import schema, settlement
from abci_app.machine import StateMachine
from abci_app.queries import query
from abci_app.state import State
from abci_app.store import Store
from bench._common import machine, median, parse_with_quick, spread

log = logging.getLogger("bench.settlement")
MODEL = "sha256:" + "ab" * 32
SHARDS = 32
EPOCH = 10
ESCROW = "0x" + "ee" * 20


def _genesis() -> bytes:
    return json.dumps(
        {
            "epoch_length": EPOCH,
            "evm": {
                "chain_id": 31337,
                "committee_address": "0x" + "cc" * 20,
                "escrow_address": ESCROW,
            },
            "gateways": ["aa" * 32],
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


def one_run(n: int) -> dict[str, float]:
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
                "layer_tokens": 1 + int.from_bytes(hashlib.sha256(b"t/%d" % i).digest()[:3], "big"),
            },
        )
        for i, account in enumerate(accounts)
    ]
    queries = [
        ("squery", "0x" + hashlib.sha256(b"q/%d" % i).hexdigest(), {"fee": str(10**12 + i),
                                                                    "height": 2})
        for i in range(min(n, settlement.MAX_SETTLED_QUERIES))
    ]  # fmt: skip
    _block(machine, EPOCH - 1, credits + queries)
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
    record = state.committed("payout", schema.epoch_key(1))
    if record is None or len(record["rows"]) != n:
        raise SystemExit(f"bench: epoch 1 did not settle {n} rows")
    t0 = time.perf_counter()
    code, _, message = query(state, f"/payouts/proof?epoch=1&account={accounts[n // 2]}", b"")
    proof_s = time.perf_counter() - t0
    if code != 0:
        raise SystemExit(f"bench: proof query failed: {message}")
    return {**timed, "end_block": end_block, "proof": proof_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_with_quick(parser, {"sizes": [100, 1_000], "repeats": 1}, argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    metrics: dict[str, Any] = {}
    for n in args.sizes:
        runs = [one_run(n) for _ in range(args.repeats)]
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
                    "sizes": args.sizes,
                    "repeats": args.repeats,
                    "quick": args.quick,
                    "shards": SHARDS,
                    "queries_per_root": settlement.MAX_SETTLED_QUERIES,
                },
                "metrics": metrics,
                "targets": {"app_settlement_close_s_100000_nodes": {"op": "<", "value": 10}},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
