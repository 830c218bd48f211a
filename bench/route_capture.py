"""What an adversary's node draws of a client's hops under each route, and what a route costs.

In-process, on the real `Router` and its `CostBook` (node/gateway/router.py, guards.py); no
sockets: the directory is a list, every node verifies, and each node's cost is what the book
saw of it (its compute per decode step from two `/info` answers, as the router measures it).
One shard of `--replicas` nodes, one of them the adversary's (f = 1 / replicas). `--clients`
fresh clients each ask `--questions` questions, under each route:

- `cost`: the hosted gateway's choice (uniform among the near-cheapest, afresh per question);
- `private`: the personal client's default (one node drawn uniformly and kept);
- `uniform`: a fresh uniform draw per question (a verifier's client).

Two worlds: **fast**, the adversary really is 3× faster than every honest node (and says so);
**spread**, no adversary advantage, the honest nodes' steps spread evenly from 1× to 3× the
fastest (what not choosing by speed costs).

Metrics, per route and world:
- `adversary_hop_share_{route}_fast`: the share of all questions whose hop was the adversary's;
- `clients_ever_met_{route}_fast`: the share of clients that met it at least once in their
  questions (a guard keeps this at f; a fresh draw per question tends to 1 − (1 − f)^n);
- `cost_ratio_{route}_spread`: the mean expected cost of the hops taken ÷ the cheapest node's
  (1.0: always the fastest).

    .venv/bin/python bench/route_capture.py [--replicas 5] [--clients 200] [--questions 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, parse_with_quick
from node.gateway.router import ROUTES, RoutableNode, Router

MODEL = "sha256:" + "0" * 64
BASE_STEP_S = 0.05  # the fastest node's compute per decode step


class Directory:
    """The committee's /nodes answer: every node routable on shard 0."""

    def __init__(self, count: int) -> None:
        self.entries = [
            {
                "key": f"{i + 1:064x}",
                "endpoint": f"http://127.0.0.1:{9000 + i}",
                "shards": [0],
                "routable": True,
            }
            for i in range(count)
        ]

    async def compute_nodes(self) -> list[dict[str, Any]]:
        return self.entries


class TrustingRouter(Router):
    """Every node answers /info for this model and shard (no sockets in this bench)."""

    async def _verify(self, node: RoutableNode) -> bool:
        return True


def _observe(router: Router, endpoint: str, step_s: float) -> None:
    """Two /info answers ten decode steps of `step_s` apart, as the router's refresh sees them."""
    caps = {"max_batch": 32, "max_sessions": 64, "max_queued": 256}
    router.costs.observe_info(endpoint, {**caps, "load": {"decode_s": 0, "decode_batches": 0}}, 0)
    later = {**caps, "load": {"decode_s": 10 * step_s, "decode_batches": 10}}
    router.costs.observe_info(endpoint, later, 0.002)


async def _client(route: str, steps: list[float], questions: int) -> list[int]:
    """One fresh client's hops (node indices) for its questions."""
    directory = Directory(len(steps))
    router = TrustingRouter(
        directory,
        model_hash=MODEL,
        shard_layers=[(0, 30)],
        http=None,  # type: ignore[arg-type]
        refresh_s=0,
        public_only=False,
        route=route,
    )
    for i, step in enumerate(steps):
        _observe(router, directory.entries[i]["endpoint"], step)
    keys = [entry["key"] for entry in directory.entries]
    return [keys.index((await router.circuit()).keys[0]) for _ in range(questions)]


async def measure(replicas: int, clients: int, questions: int) -> dict[str, float]:
    metrics: dict[str, float] = {}
    fast = [BASE_STEP_S / 3] + [BASE_STEP_S] * (replicas - 1)  # node 0: the adversary
    spread = [BASE_STEP_S * (1 + 2 * i / max(1, replicas - 1)) for i in range(replicas)]
    for route in ROUTES:
        hops = [await _client(route, fast, questions) for _ in range(clients)]
        taken = sum(hop == 0 for client in hops for hop in client)
        metrics[f"adversary_hop_share_{route}_fast"] = round(taken / (clients * questions), 3)
        met = sum(any(hop == 0 for hop in client) for client in hops)
        metrics[f"clients_ever_met_{route}_fast"] = round(met / clients, 3)
        hops = [await _client(route, spread, questions) for _ in range(clients)]
        mean = sum(spread[hop] for client in hops for hop in client) / (clients * questions)
        metrics[f"cost_ratio_{route}_spread"] = round(mean / min(spread), 3)
    metrics["adversary_fraction"] = round(1 / replicas, 3)
    metrics["expected_ever_met_fresh_draws"] = round(1 - (1 - 1 / replicas) ** questions, 3)
    return metrics


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=5, help="nodes on the shard (5)")
    parser.add_argument("--clients", type=int, default=200, help="fresh clients per route (200)")
    parser.add_argument("--questions", type=int, default=20, help="questions per client (20)")
    args = parse_with_quick(parser, {"clients": 20, "questions": 5}, argv)
    if args.replicas < 2 or args.clients < 1 or args.questions < 1:
        parser.error("--replicas must be >= 2, --clients and --questions >= 1")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    started = time.perf_counter()
    metrics = asyncio.run(measure(args.replicas, args.clients, args.questions))
    metrics["wall_s"] = round(time.perf_counter() - started, 2)
    print(
        json.dumps(
            {
                "bench": "route_capture",
                "machine": machine(),
                "config": {
                    "replicas": args.replicas,
                    "clients": args.clients,
                    "questions": args.questions,
                    "adversary_speedup": 3,
                },
                "metrics": metrics,
                "targets": {
                    "adversary_hop_share_private_fast": {"op": "<=", "value": "about 1/replicas"},
                    "clients_ever_met_private_fast": {"op": "<=", "value": "about 1/replicas"},
                },
            }
        )
    )


if __name__ == "__main__":
    main()
