"""Per-tx cost of the committee ABCI app in-process (no sockets, no CometBFT): one JSON object.

For `commit` txs (batches of --batch commitments, the tx `bench/committee.py` sends) and
`heartbeat` txs, over --blocks blocks of --block-txs txs each:

- check_tx_us: CheckTx of a fresh tx (decode + canonical check + ed25519 verify + nonce)
- recheck_us: CheckTx of the same bytes again (decode cache hit, as on mempool recheck)
- process_proposal_us_per_tx, finalize_us_per_tx (after CheckTx, as in a live node),
  finalize_uncached_us_per_tx (a replaying node that never saw the txs), commit_ms_per_block
  (app hash + one SQLite transaction, on a file in a temporary directory).

Times are this process's CPU time (`time.process_time`), so other load on a shared machine
inflates them less than wall time would.

    .venv/bin/python bench/abci_tx_cost.py            # ~20 s
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, parse_with_quick
from protocol.committee.commitments import CommitBatch, CommitmentRecord
from protocol.committee.registry import AttestStake, Heartbeat, RegisterNode, sign_registration
from protocol.eip712 import address_of
from tests.committee_chain import Chain, seeded_evm_key, seeded_key


def register(chain: Chain, count: int) -> list[Any]:
    keys = [seeded_key(f"bench-{i}") for i in range(count)]
    txs = []
    for i, key in enumerate(keys):
        evm = seeded_evm_key(f"bench-{i}")
        node = key.verify_key.encode().hex()
        body = RegisterNode(
            address_of(evm), sign_registration(evm, node), "compute", "m", (0,), "e", 1
        )
        txs.append(chain.tx(body, key))
    assert all(r.code == 0 for r in chain.block(txs))
    # staked (3 of the 4 validators attest): only staked nodes commit (NOT_STAKED otherwise)
    attests = [
        chain.tx(AttestStake(key.verify_key.encode().hex(), 10**18), v.key)
        for key in keys
        for v in chain.validators[:3]
    ]
    assert all(r.code == 0 for r in chain.block(attests))
    return keys


def measure(
    chain: Chain, keys: list[Any], kind: str, blocks: int, per_block: int, batch: int
) -> dict[str, float]:
    state = chain.state
    state_machine = chain.machine
    check, recheck, process, finalize, commit = [], [], [], [], []
    counter = 0
    for _ in range(blocks):
        txs = []
        for i in range(per_block):
            key = keys[i % len(keys)]
            counter += 1
            if kind == "heartbeat":
                body: Any = Heartbeat()
            else:
                body = CommitBatch(
                    tuple(
                        CommitmentRecord(
                            "0x" + counter.to_bytes(32, "big").hex(), step, 0, "0x" + "ab" * 32
                        )
                        for step in range(batch)
                    )
                )
            txs.append(chain.tx(body, key))
        start = time.process_time()
        for raw in txs:
            assert state_machine.check_tx(raw).code == 0
        check.append((time.process_time() - start) / len(txs))
        start = time.process_time()
        for raw in txs:
            state_machine.check_tx(raw)
        recheck.append((time.process_time() - start) / len(txs))
        height = state.height + 1
        vx = chain.extended_commit(height - 1) if state_machine.vx_required(height) else None
        proposal = state_machine.prepare_proposal(height, txs, 1 << 24, vx)
        start = time.process_time()
        ok, reason = state_machine.process_proposal(height, proposal)
        process.append((time.process_time() - start) / len(txs))
        assert ok, reason
        start = time.process_time()
        state_machine.begin_block(height, height.to_bytes(32, "big"))
        results = [state_machine.deliver_tx(raw, i) for i, raw in enumerate(proposal)]
        state_machine.end_block()
        finalize.append((time.process_time() - start) / len(txs))
        assert all(r.code == 0 for r in results), results[:3]
        start = time.process_time()
        state_machine.commit()
        commit.append(time.process_time() - start)
    return {
        "check_tx_us": median(check) * 1e6,
        "recheck_us": median(recheck) * 1e6,
        "process_proposal_us_per_tx": median(process) * 1e6,
        "finalize_us_per_tx": median(finalize) * 1e6,
        "commit_ms_per_block": median(commit) * 1e3,
    }


def uncached_finalize(chain: Chain, keys: list[Any], per_block: int) -> float:
    """FinalizeBlock of txs this process never checked (decode + verify inside)."""
    state = chain.state
    state_machine = chain.machine
    txs = [chain.tx(Heartbeat(), keys[i % len(keys)]) for i in range(per_block)]
    height = state.height + 1
    if state_machine.vx_required(height):
        chain.block()
        height += 1
    start = time.process_time()
    state_machine.begin_block(height, height.to_bytes(32, "big"))
    results = [state_machine.deliver_tx(raw, i) for i, raw in enumerate(txs)]
    state_machine.end_block()
    elapsed = (time.process_time() - start) / len(txs)
    state_machine.commit()
    assert all(r.code == 0 for r in results)
    return elapsed * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--block-txs", type=int, default=500)
    parser.add_argument("--batch", type=int, default=1, help="commitments per commit tx")
    parser.add_argument("--accounts", type=int, default=64)
    args = parse_with_quick(parser, {"blocks": 2, "block_txs": 50, "accounts": 8})
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    metrics: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="abci-bench-") as tmp:
        chain = Chain(
            db=Path(tmp) / "app.sqlite",
            genesis={"epoch_length": 1000, "heartbeat_timeout": 100_000},
        )
        keys = register(chain, args.accounts)
        for kind in ("commit", "heartbeat"):
            result = measure(chain, keys, kind, args.blocks, args.block_txs, args.batch)
            metrics.update({f"{kind}_{name}": round(value, 1) for name, value in result.items()})
        metrics["heartbeat_finalize_uncached_us_per_tx"] = round(
            uncached_finalize(chain, keys, args.block_txs), 1
        )
    per_tx = metrics["commit_check_tx_us"] + metrics["commit_process_proposal_us_per_tx"]
    per_tx += (
        metrics["commit_finalize_us_per_tx"]
        + metrics["commit_commit_ms_per_block"] * 1e3 / args.block_txs
    )
    metrics["commit_app_cpu_us_per_tx"] = round(per_tx, 1)
    print(
        json.dumps(
            {
                "bench": "abci_tx_cost",
                "machine": machine(),
                "config": vars(args),
                "metrics": metrics,
                "targets": {"commit_app_cpu_us_per_tx": {"op": "<=", "value": 1000}},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
