"""The gateway's work ledger: receipts become per-node aggregates and a query list, nothing
that ties a query to its nodes."""

from __future__ import annotations

from typing import Any

import pytest

from node.chain.committee_rpc import TxRejectedError
from node.gateway.router import Circuit, RoutableNode
from node.gateway.settlement import WorkLedger, WorkReporter
from protocol.committee.envelope import decode, sign
from protocol.committee.settlement import WorkReport
from tests.unit.test_abci_settlement import GATEWAY

pytestmark = pytest.mark.unit

A, B, C = "aa" * 32, "bb" * 32, "cc" * 32


def receipt(query: int, prompt: int, completion: int, fee: int) -> dict[str, Any]:
    return {
        "query_id": "0x" + f"{query:064x}",
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "fee_wei": str(fee),
    }


def circuit(*keys: str) -> Circuit:
    return Circuit(tuple(RoutableNode(k, f"http://{i}", i) for i, k in enumerate(keys)))


def test_ledger_aggregates_per_node_and_lists_queries_apart() -> None:
    ledger = WorkLedger("sha256:" + "0" * 64, [(0, 10), (10, 30)])
    ledger.record(receipt(2, 5, 3, 80), circuit(A, B))
    ledger.record(receipt(1, 2, 2, 40), circuit(C, B))
    ledger.record(receipt(3, 1, 1, 0), circuit(A, B))  # a free question: work, no query
    report = ledger.take()
    assert report is not None
    assert [(w.node, w.shard, w.layers, w.tokens) for w in report.work] == [
        (A, 0, 10, 10),
        (B, 1, 20, 14),
        (C, 0, 10, 4),
    ]
    assert report.queries == (("0x" + f"{1:064x}", 40), ("0x" + f"{2:064x}", 80))
    assert ledger.take() is None
    # the wire form is a valid, canonical work_report
    assert decode(sign(report, GATEWAY, 1).encode()).body == report


class FlakyLink:
    def __init__(self, error: Exception | None) -> None:
        self.error = error
        self.sent: list[WorkReport] = []

    async def submit(self, body: Any) -> Any:
        if self.error is not None:
            raise self.error
        self.sent.append(body)


async def test_reporter_batches_questions_until_enough_or_the_oldest_waited() -> None:
    now = [0.0]
    ledger = WorkLedger("m", [(0, 2)], min_questions=3, max_wait_s=60, clock=lambda: now[0])
    link = FlakyLink(None)
    reporter = WorkReporter(ledger, link)
    ledger.record(receipt(1, 1, 1, 5), circuit(A))
    ledger.record(receipt(2, 1, 1, 5), circuit(A))
    assert await reporter.flush() == 0  # 2 questions: one report would narrow them down
    ledger.record(receipt(3, 1, 1, 5), circuit(A))
    assert await reporter.flush() == 1 and len(link.sent[0].queries) == 3
    ledger.record(receipt(4, 1, 1, 5), circuit(A))
    now[0] = 59.0
    assert await reporter.flush() == 0
    now[0] = 61.0  # the oldest waited long enough: reported alone
    assert await reporter.flush() == 1 and len(link.sent[1].queries) == 1
    ledger.record(receipt(5, 1, 1, 5), circuit(A))
    assert await reporter.flush(force=True) == 1  # at shutdown


async def test_reporter_puts_back_what_did_not_reach_the_chain() -> None:
    ledger = WorkLedger("m", [(0, 2)], min_questions=1)
    ledger.record(receipt(1, 1, 1, 5), circuit(A))
    down = WorkReporter(ledger, FlakyLink(OSError("down")))
    with pytest.raises(OSError):
        await down.flush()
    link = FlakyLink(None)
    assert await WorkReporter(ledger, link).flush() == 1
    [report] = link.sent
    assert report.work[0].tokens == 2 and report.queries[0][1] == 5
    ledger.record(receipt(2, 1, 1, 5), circuit(A))
    refused = FlakyLink(TxRejectedError("rpc", code=30, log_text="not a gateway"))
    assert await WorkReporter(ledger, refused).flush() == 0
    assert ledger.take() is None  # a refused report is not resent forever
