"""What paying nodes with credits costs per token: the same questions through a 2-node circuit,
free and paid, side by side in one run. One JSON object.

In-process: two aiohttp nodes of a tiny model (`tests/doubles/tiny_model.py`, so the figures are
the payment's own overhead, not hidden under a big model's compute) and the in-process 4-validator
committee chain (`tests/committee_chain.py`) the nodes check credits against: each credit's
threshold BLS signature under its key period's key, its window and the spent set
(`/credit_spent`) — a real node asks its validator over RPC instead (add one round trip per
credit to `node_accept_ms_per_credit`).
The paid run uses `planet ask --credits --min-credit-positions 1`'s path
(`ReplicaCircuits(credits=…, info_prices=True)`: no chain here, so the price paid is `/info`'s,
which only an explicit cap allows), --positions positions per credit.

- `decode_tok_s_{free,paid}`, `ratio_tok_s_paid_vs_free`: medians over --repeats questions.
- `node_accept_ms_per_credit`: a node's time to take one credit (check, spool with fsync).
- `pay_bytes_per_credit`: one `pay` message on the wire (WebSocket framing included).
- `bytes_per_token_credit_payment` / `ms_per_token_credit_payment`: per position computed, on
  each node: pay bytes / positions per credit, and node accept time / positions per credit.
- `credits_per_question`: what one question cost (both nodes).

    .venv/bin/python bench/paid_circuit.py          # ~1 min
    .venv/bin/python bench/paid_circuit.py --quick  # 4 tokens, one question each way, no warm-up
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
from aiohttp.test_utils import TestServer

from bench._common import machine, parse_with_quick
from node.client.credit_wallet import CreditWallet
from node.client.failover import FailoverPolicy, generate
from node.client.replicas import ReplicaCircuits
from node.client.types import Hop
from node.model.backends import skip_unused_backends
from node.model.head import ClientHead
from node.model.manifest import Manifest
from node.model.prepare import prepare
from node.server.app import STATE_KEY, create_app
from node.server.backend import ModelShardBackend
from node.server.config import ServerConfig
from node.server.next_hops import ForwardList
from node.server.payments import CreditCheck, CreditSpool, Payments
from protocol.stream import pay_message, ws_frame_bytes
from tests.credit_chain import minted, node_chain
from tests.doubles.tiny_model import make_tiny_model
from tests.unit.test_credit_till import ChainLink

PROMPT = "w1 w7 w3 w40 w5 w99 w12 w8 w9 w10 w11 w2"


class TimedPayments(Payments):
    """Payments that add up the time spent taking credits."""

    accept_s = 0.0

    async def accept(self, account: Any, credit: Any) -> None:
        started = time.perf_counter()
        try:
            await super().accept(account, credit)
        finally:
            TimedPayments.accept_s += time.perf_counter() - started


async def _serve(root: Path, manifest: Path, positions: int, chain: Any, node: Any) -> Any:
    servers = []
    for shard in range(2):
        config = ServerConfig(
            manifest_path=manifest,
            shard_id=shard,
            credit_positions=positions,
            committee_rpc="http://127.0.0.1:9",  # replaced below: the in-process chain
            credits_dir=root / f"spool-{shard}",
        )
        server = TestServer(create_app(config, ModelShardBackend(manifest, shard, device="cpu")))
        await server.start_server()
        servers.append(server)
    hops = [Hop(url=str(s.make_url("")).rstrip("/"), shard=i) for i, s in enumerate(servers)]
    for shard, server in enumerate(servers):
        state = server.app[STATE_KEY]
        state.next_hops = ForwardList(shard, frozenset(h.url for h in hops))
        if positions:
            spool = CreditSpool(root / f"spool-{shard}")
            check = CreditCheck(ChainLink(chain, node))
            state.payments = TimedPayments(positions, check, spool)
    return servers, hops


async def _question(
    http: Any, hops: list[Hop], plan: Manifest, head: Any, ids: list[int], tokens: int, wallet: Any
) -> tuple[float, int]:
    source = ReplicaCircuits(
        http,
        hops,
        expected={s.shard_id: (plan.model_hash, s.layers) for s in plan.shards},
        hidden_size=plan.hidden_size,
        credits=wallet,
        min_credit_positions=1,
        info_prices=True,  # no chain prices here: /info's, as `planet ask --min-credit-positions`
    )
    started = time.perf_counter()
    count = 0
    async for _ in generate(
        source,
        head,
        ids,
        max_new_tokens=tokens,
        stop_on_eos=False,
        policy=FailoverPolicy(attempts=0),
    ):
        count += 1
    elapsed = time.perf_counter() - started
    return count / elapsed, 0 if source.payer is None else source.payer.spent


async def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-paid-"))
    make_tiny_model(root / "src", layers=4, hidden=64, tied=False)
    manifest = Path(prepare(root / "src", parts=2, out=root / "p2", progress=lambda _: None))
    plan = Manifest.load(manifest)
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    fed = len(ids) + args.tokens - 1
    per_question = 2 * -(-fed // args.positions)
    chain, node = node_chain(root)
    credits = []
    while len(credits) < per_question * args.repeats:
        batch, _ = minted(chain, root, count=min(32, per_question * args.repeats))
        credits += batch
    wallet = CreditWallet(root / "credits.json")
    wallet.add(credits)
    free_servers, free_hops = await _serve(root / "free", manifest, 0, chain, node)
    paid_servers, paid_hops = await _serve(root / "paid", manifest, args.positions, chain, node)
    free, paid, spent = [], [], []
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(args.warm_ups):
                await _question(http, free_hops, plan, head, ids, args.tokens, None)
            for _ in range(args.repeats):
                tok_s, _ = await _question(http, free_hops, plan, head, ids, args.tokens, None)
                free.append(tok_s)
                tok_s, cost = await _question(http, paid_hops, plan, head, ids, args.tokens, wallet)
                paid.append(tok_s)
                spent.append(cost)
    finally:
        for server in free_servers + paid_servers:
            await server.close()
    accepted = sum(s.app[STATE_KEY].payments.accepted for s in paid_servers)
    accept_ms = 1000 * TimedPayments.accept_s / max(accepted, 1)
    pay_bytes = ws_frame_bytes(
        len(json.dumps(pay_message(1, credits[0]), separators=(", ", ": "))), masked=True
    )
    return {
        "bench": "paid_circuit",
        "machine": machine(),
        "config": {
            "model": "tiny (4 layers, hidden 64), 2 nodes in-process",
            "validators": 4,
            "positions_per_credit": args.positions,
            "prompt_tokens": len(ids),
            "max_new_tokens": args.tokens,
            "repeats": args.repeats,
            "warm_ups": args.warm_ups,
            "quick": args.quick,
        },
        "metrics": {
            "decode_tok_s_free": round(median(free), 1),
            "decode_tok_s_paid": round(median(paid), 1),
            "ratio_tok_s_paid_vs_free": round(median(paid) / median(free), 3),
            "credits_per_question": median(spent),
            "node_accept_ms_per_credit": round(accept_ms, 2),
            "pay_bytes_per_credit": pay_bytes,
            "bytes_per_token_credit_payment": round(pay_bytes / args.positions, 1),
            "ms_per_token_credit_payment": round(accept_ms / args.positions, 4),
        },
        "targets": {},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--positions", type=int, default=64, help="positions per credit (64)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per question (64)")
    parser.add_argument("--repeats", type=int, default=5, help="questions each way (5)")
    parser.add_argument("--warm-ups", type=int, default=1, help="free questions first, untimed (1)")
    args = parse_with_quick(parser, {"tokens": 4, "repeats": 1, "warm_ups": 0}, argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # the tiny model's shards are fp32: neither hqq (int4) nor torchao (int8) runs here, and
    # transformers (which makes the tiny model) would import both (~1 CPU-s): as a node does
    skip_unused_backends({"none"})
    print(json.dumps(asyncio.run(run(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
