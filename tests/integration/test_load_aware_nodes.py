"""Load-aware choice with real node processes (harness/replica_net.py): SmolLM2 int8 in 2
shards, one node for shard 0 and two for shard 1, one of them 8x slower
(tests/doubles/slow_node.py); the client in this process (node/client/failover.py over
node/client/replicas.py) with its own cost book.

A client that has seen the fast replica (its first question, over it alone) tries the slow
replica next (not seen yet, so counted as cheap as the cheapest; the book's randomness picks
it here), and after its first 3 decode passes moves to the fast one mid-answer: the same greedy
text, one `outpriced` record with what the slow circuit served, the slow node not avoided. A
third question does not try it again (its trials back off) and runs on the fast replica alone.

Why 8x: the client moves off a node priced above `MOVE_FACTOR` (2) x its replica + `SLACK_S`
(10 ms), and a node's price is what its passes took beyond what the circuit's other hops cost
(node/client/costs.py), so the noise in the fast replica's earlier passes comes off the slow
one's price. Measured on the idle 2-core box (a shard-1 step ~15 ms): at 3x the slow node was
priced 32 ms against a line of 12 ms, a 20 ms margin that the load of the CI's other lane once
ate (clean-clone CI of 7c7da8b: the answer stayed on the slow node); at 5x, 67 ms; at 8x,
116 ms.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from harness.gateway_net import prepared_manifest
from harness.replica_net import ReplicaNet
from node.client.costs import CostBook
from tests.doubles.choice import FirstOrLast

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKENS = 16
QUESTION = "Why is the sky blue?"


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaNet]:
    manifest = prepared_manifest(parts=2, quant="int8")
    network = ReplicaNet.start(
        tmp_path_factory.mktemp("load-aware"), manifest, [0, 1, 1], slow={2: 8.0}
    )
    try:
        yield network
    finally:
        network.close()


def test_a_slow_replica_tried_is_left_after_3_passes_and_not_tried_again_soon(
    net: ReplicaNet,
) -> None:
    from node.model.head import ClientHead

    head = ClientHead.load(net.manifest_path, device="cpu")
    ids = head.chat_ids([{"role": "user", "content": QUESTION}])
    first_hop, fast, slow = (r.hop for r in net.replicas)
    pick = FirstOrLast()
    book = CostBook(rng=pick)

    def ask(*only: Any) -> tuple[list[int], Any, Any]:
        args: dict[str, Any] = {"costs": book} | ({"hops": only} if only else {})
        return asyncio.run(net.answer(head, ids, max_new_tokens=TOKENS, source_args=args))

    quiet, timings, source = ask(first_hop, fast)  # the client has seen the fast one only
    assert source.circuits == [(first_hop, fast)] and timings.failovers == []
    pick.last = True  # the slow one, not seen yet and tied with the fast one: tried
    tokens, timings, source = ask()
    assert tokens == quiet
    assert source.circuits == [(first_hop, slow), (first_hop, fast)]
    (moved,) = timings.failovers
    assert moved.code == "outpriced" and moved.hops == (1,)
    assert moved.served == len(ids) + 3 and moved.replayed == len(ids) + 4
    assert book.get(slow.url).trials == 1 and book.get(slow.url).rtt_s < 1.0
    again, timings, source = ask()  # seen slow and backed off: not tried
    assert again == quiet
    assert source.circuits == [(first_hop, fast)] and timings.failovers == []
