"""Epoch close: payout table, Merkle root and queries hash for 10 … 100,000 nodes (one JSON).

For each size N, a synthetic but deterministic epoch (no randomness: every value derives from
sha256 of its index):

- N contributing accounts: 90 % compute nodes, each serving one of 32 shards of one model (the
  first shard has 1 routable node, the second 2, so the 5× and 2× bonuses are exercised), with
  1 … 4,096 tokens through 1 … 8 layers; 10 % verifiers with 1 … 64 spot checks;
- 1 % of the accounts slashed; N settled queries with fees of 1 … 10^15 wei;
- verifier cut 1,000 bps.

Timed (wall clock and this process's CPU time, median over --repeats): building the validated
`EpochWork` from plain values (what the ABCI app does from its state) plus `close_epoch` (split,
leaves, tree, root, queries hash). Metrics: `epoch_close_s_<N>_nodes` (wall),
`epoch_close_cpu_s_<N>_nodes`, `..._spread` ([min, max] wall), `payouts_<N>_nodes` (rows, i.e.
leaves), `proof_bytes_max_<N>_nodes` (the longest claim proof), `root_bytes` (the root posted on
chain: one bytes32, whatever N). The machine is shared: `machine.loadavg_1m_at_start` says how
busy it was; the CPU time is the steadier figure.

    .venv/bin/python bench/epoch.py                 # ~1 minute
    .venv/bin/python bench/epoch.py --sizes 10 1000 --repeats 5
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, median, parse_with_quick, spread
from shares.merkle import tree_proof
from shares.payouts import (
    ComputeWork,
    EpochWork,
    SettledQuery,
    ShardHealth,
    VerificationWork,
)
from shares.settlement import close_epoch

log = logging.getLogger("bench.epoch")
MODEL = "smollm2-135m"
SHARDS = 32
VERIFIER_CUT_BPS = 1_000


def _num(label: str, i: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{label}/{i}".encode()).digest()[:8], "big")


def _hex(label: str, i: int, digits: int) -> str:
    return "0x" + hashlib.sha256(f"{label}/{i}".encode()).hexdigest()[:digits]


def raw_epoch(n: int) -> dict[str, Any]:
    """Plain values of one synthetic epoch with `n` contributing accounts (see module doc)."""
    accounts = [_hex("account", i, 40) for i in range(n)]
    verifiers = max(1, n // 10)
    computes = accounts[: n - verifiers]
    shard_of = [0 if i == 0 else 1 if i in (1, 2) else 2 + i % (SHARDS - 2) for i in range(n)]
    compute = [
        (account, shard_of[i], 1 + _num("layers", i) % 8, 1 + _num("tokens", i) % 4096)
        for i, account in enumerate(computes)
    ]
    served: dict[int, int] = {}
    for _, shard, _, _ in compute:
        served[shard] = served.get(shard, 0) + 1
    return {
        "queries": [(_hex("query", i, 64), 1 + _num("fee", i) % 10**15) for i in range(n)],
        "compute": compute,
        "verification": [
            (account, 1 + _num("checks", i) % 64) for i, account in enumerate(accounts[-verifiers:])
        ],
        "health": sorted(served.items()),
        "slashed": accounts[::100][1:],
    }


def close(epoch: int, raw: dict[str, Any]) -> Any:
    """What the ABCI app does at epoch end: validated inputs, then `close_epoch`."""
    work = EpochWork(
        epoch=epoch,
        queries=tuple(SettledQuery(q, fee) for q, fee in raw["queries"]),
        compute=tuple(ComputeWork(a, MODEL, s, layers, t) for a, s, layers, t in raw["compute"]),
        verification=tuple(VerificationWork(a, c) for a, c in raw["verification"]),
        health=tuple(ShardHealth(MODEL, s, count) for s, count in raw["health"]),
        slashed=tuple(raw["slashed"]),
        verifier_cut_bps=VERIFIER_CUT_BPS,
    )
    return close_epoch(work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 1_000, 100_000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_with_quick(parser, {"sizes": [10, 1_000], "repeats": 1})
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    info = machine()
    info["loadavg_1m_at_start"] = round(os.getloadavg()[0], 2)
    metrics: dict[str, Any] = {}
    for n in args.sizes:
        raw = raw_epoch(n)
        walls: list[float] = []
        cpus: list[float] = []
        roots: set[bytes] = set()
        settlement = None
        for _ in range(args.repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            settlement = close(7, raw)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
            roots.add(settlement.root)
        if settlement is None or len(roots) != 1:
            raise SystemExit(f"n={n}: {len(roots)} different roots over the repeats")
        longest = len(tree_proof(settlement.tree, max(settlement.node_of)))  # deepest leaf
        metrics[f"epoch_close_s_{n}_nodes"] = round(median(walls), 4)
        metrics[f"epoch_close_cpu_s_{n}_nodes"] = round(median(cpus), 4)
        metrics[f"epoch_close_s_{n}_nodes_spread"] = spread(walls, 4)
        metrics[f"payouts_{n}_nodes"] = len(settlement.table.payouts)
        metrics[f"proof_bytes_max_{n}_nodes"] = 32 * longest
        metrics["root_bytes"] = len(settlement.root)
        log.info("n=%d wall=%s cpu=%s", n, spread(walls, 3), spread(cpus, 3))
    print(
        json.dumps(
            {
                "bench": "epoch",
                "machine": info,
                "config": {
                    "sizes": args.sizes,
                    "repeats": args.repeats,
                    "quick": args.quick,
                    "shards": SHARDS,
                    "verifier_share_of_nodes": 0.1,
                    "slashed_share_of_nodes": 0.01,
                    "queries_per_node": 1,
                    "verifier_cut_bps": VERIFIER_CUT_BPS,
                },
                "metrics": metrics,
                "targets": {"epoch_close_s_100000_nodes": {"op": "<", "value": 10}},
            }
        )
    )


if __name__ == "__main__":
    main()
