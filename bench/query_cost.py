"""What one committee query costs a validator when strangers fill the registry: one JSON object.

Registering costs nothing (an unstaked registration lives `registration_ttl` blocks), so the
registry a query may read is as long as strangers make it. This registers --nodes compute nodes
in the in-process app (no sockets, no CometBFT): all on one model (`m`, one shard each, a price
each), or with --models K spread over K models (--serving: each heartbeats once, so it is
SERVING, unstaked; --staked K: the first K also staked, so routable); then asks each query
--repeat times and gives,
per query: the median CPU milliseconds (`time.process_time`, so other load on a shared machine
inflates it less than wall time would), the records it read from state (every `committed`
lookup and every record a range scan yielded) and the answer's bytes.

    .venv/bin/python bench/query_cost.py --nodes 10000            # ~1 min (mostly registering)
    .venv/bin/python bench/query_cost.py --nodes 2000 --models 2000
    .venv/bin/python bench/query_cost.py --nodes 10000 --serving --staked 100
    .venv/bin/python bench/query_cost.py --quick                  # 200 nodes, one repeat
    .venv/bin/python bench/query_cost.py --nodes 10000 --serving --staked 100 --committing

Metrics per query, named after its path (`/pool_health?model=m` -> `pool_health_model_m`):
`<name>_ms`, `<name>_records_read`, `<name>_bytes`.

With --committing, every node also sends one `commit` of 4 records (the free flood of
`cover/`: a stranger's registrations each committing), the staked ones included, and the next
epoch close is measured: `close_commits_accepted` / `close_commits_refused` (NOT_STAKED),
`close_cover_entries` (the `cover/` entries that close found), `close_records_read` (what
`coverage.close` read from state: exact) and `close_ms` (its CPU time, one close: noisy). Run
the same command over the old and the new code to compare.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from abci_app import coverage, schema
from abci_app.queries import query
from abci_app.state import State
from bench._common import machine, parse_with_quick
from protocol.committee.commitments import CommitBatch, CommitmentRecord
from protocol.committee.prices import SetPrice
from protocol.committee.registry import AttestStake, Heartbeat, RegisterNode, sign_registration
from protocol.eip712 import address_of
from tests.committee_chain import Chain, seeded_evm_key, seeded_key

BLOCK = 2000  # registrations a block


def register(chain: Chain, count: int, models: int, serving: bool) -> None:
    """`count` compute nodes, node i on model `m` (or `m<i mod models>`), shard 0, priced, and
    SERVING with `serving` (a heartbeat: free too; unstaked, so none is routable)."""
    for first in range(0, count, BLOCK):
        txs, prices = [], []
        for i in range(first, min(first + BLOCK, count)):
            key, evm = seeded_key(f"q-{i}"), seeded_evm_key(f"q-{i}")
            model = "m" if models <= 1 else f"m{i % models}"
            node = key.verify_key.encode().hex()
            body = RegisterNode(
                address_of(evm), sign_registration(evm, node), "compute", model, (0,), "e", 1
            )
            txs.append(chain.tx(body, key))
            prices.append((SetPrice(model, 0, 64), key))
        assert all(r.code == 0 for r in chain.block(txs))
        assert all(r.code == 0 for r in chain.block([chain.tx(b, k) for b, k in prices]))
        if serving:
            beats = [chain.tx(Heartbeat(), k) for _, k in prices]
            assert all(r.code == 0 for r in chain.block(beats))


def stake(chain: Chain, count: int) -> None:
    """The first `count` nodes heartbeat and are staked (1 ETH, attested by 3 of the chain's 4
    validators): in their model's staked pool and routable, what `/pool_health` counts."""
    txs = []
    for i in range(count):
        key = seeded_key(f"q-{i}")
        node = key.verify_key.encode().hex()
        txs.append(chain.tx(Heartbeat(), key))
        txs += [chain.tx(AttestStake(node, 10**18), v.key) for v in chain.validators[:3]]
    for first in range(0, len(txs), BLOCK):
        assert all(r.code == 0 for r in chain.block(txs[first : first + BLOCK]))


class Reads:
    """Counts the records `State` reads while installed (lookups and range-scan rows)."""

    def __init__(self) -> None:
        self.count = 0
        self._committed = State.committed
        self._items = State.committed_items

    def __enter__(self) -> Reads:
        counter = self
        committed, items = self._committed, self._items

        def counted(state: State, ns: str, key: str) -> Any:
            counter.count += 1
            return committed(state, ns, key)

        def counted_items(state: State, *args: Any, **kwargs: Any) -> Iterator[tuple[str, Any]]:
            for item in items(state, *args, **kwargs):
                counter.count += 1
                yield item

        State.committed = counted  # type: ignore[method-assign]
        State.committed_items = counted_items  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        State.committed = self._committed  # type: ignore[method-assign]
        State.committed_items = self._items  # type: ignore[method-assign]


def cost(chain: Chain, path: str, repeat: int) -> dict[str, Any]:
    times = []
    for _ in range(repeat):
        started = time.process_time()
        code, value, log = query(chain.state, path, b"")
        times.append(time.process_time() - started)
        assert code == 0, log
    with Reads() as reads:
        query(chain.state, path, b"")
    return {"ms": round(median(times) * 1000, 1), "records_read": reads.count, "bytes": len(value)}


def commit_all(chain: Chain, count: int) -> dict[str, int]:
    """Each of the `count` nodes sends one `commit` of 4 records (its own session): accepted
    (staked) or refused, by code."""
    codes: dict[int, int] = {}
    for first in range(0, count, BLOCK):
        txs = []
        for i in range(first, min(first + BLOCK, count)):
            session = "0x" + f"{i + 1:064x}"
            records = tuple(
                CommitmentRecord(session, step, 0, "0x" + f"{step + 1:064x}") for step in range(4)
            )
            txs.append(chain.tx(CommitBatch(records), seeded_key(f"q-{i}")))
        for result in chain.block(txs):
            codes[int(result.code)] = codes.get(int(result.code), 0) + 1
    return codes


def close_cost(chain: Chain) -> dict[str, Any]:
    """The records the next epoch close's `coverage.close` reads, and its CPU time."""
    measured: dict[str, Any] = {}
    close = coverage.close

    def measured_close(state: State, epoch: int) -> None:
        measured["cover_entries"] = sum(1 for _ in state.committed_items(schema.COVERAGE))
        with Reads() as reads:
            started = time.process_time()
            close(state, epoch)
            measured["ms"] = round((time.process_time() - started) * 1000, 1)
        measured["records_read"] = reads.count

    coverage.close = measured_close  # type: ignore[assignment]
    try:
        length = chain.state.genesis.epoch_length
        chain.advance_to((chain.state.height // length + 1) * length)
    finally:
        coverage.close = close  # type: ignore[assignment]
    return measured


def metric_name(path: str) -> str:
    """`/pool_health?model=m&shards=1` -> `pool_health_model_m_shards_1`."""
    return re.sub(r"[^a-z0-9]+", "_", path.lower()).strip("_")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--models", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--serving", action="store_true", help="each node heartbeats: SERVING")
    parser.add_argument("--staked", type=int, default=0, help="of them, staked and routable")
    parser.add_argument(
        "--committing", action="store_true", help="each node commits; the next close is measured"
    )
    args = parse_with_quick(parser, {"nodes": 200, "repeat": 1})
    logging.disable(logging.INFO)
    chain = Chain()
    started = time.monotonic()
    register(chain, args.nodes, args.models, args.serving)
    stake(chain, min(args.staked, args.nodes))
    setup_s = time.monotonic() - started
    model = "m" if args.models <= 1 else "m0"
    paths = [
        f"/pool_health?model={model}",
        f"/pool_health?model={model}&shards=1",
        "/pool_health",
        "/nodes",
        f"/nodes?model={model}",
        "/reputations",
        "/prices",
        f"/prices?model={model}",
    ]
    metrics: dict[str, float] = {"setup_s": round(setup_s, 1)}
    for path in paths:
        for field, value in cost(chain, path, args.repeat).items():
            metrics[f"{metric_name(path)}_{field}"] = value
    if args.committing:
        codes = commit_all(chain, args.nodes)
        metrics["close_commits_accepted"] = codes.pop(0, 0)
        metrics["close_commits_refused"] = sum(codes.values())
        for field, value in close_cost(chain).items():
            metrics[f"close_{field}"] = value
    config = {"nodes": args.nodes, "models": args.models, "serving": args.serving,
              "staked": args.staked, "committing": args.committing, "repeat": args.repeat,
              "quick": args.quick}  # fmt: skip
    print(
        json.dumps(
            {"bench": "query_cost", "machine": machine(), "config": config, "metrics": metrics}
        )
    )


if __name__ == "__main__":
    main()
