"""Settlement keeps up: an epoch settles everything pending, oldest reported first, in as many
payout statements ("pages") as posting needs; each page is its own committee-signed root whose
rows pay exactly its charges, and every account gets its exact share of the epoch
(abci_app/settlement.py, shares.settlement.close_epoch_pages)."""

from __future__ import annotations

import pytest

from abci_app import settlement
from abci_app.codes import Code
from protocol.committee.settlement import Contribution, NodeWork, ShardWork, statement_number
from shares.merkle import Payout, verify
from shares.payouts import ComputeWork, EpochWork, SettledQuery, ShardHealth
from shares.settlement import close_epoch
from tests.committee_chain import Chain, seeded_key
from tests.unit.test_abci_settlement import (
    GATEWAY,
    ask,
    evm_of,
    next_epoch_end,
    one,
    refused_codes,
    report,
    settled_chain,
    two_nodes,
    vote,
)
from tests.unit.test_abci_state import hexkey

pytestmark = pytest.mark.unit


def query_id(n: int) -> str:
    return "0x" + f"{n:064x}"


def serve(chain: Chain, queries: list[tuple[str, int]], per_report: int = 500) -> None:
    """Both nodes backed and credited; `queries` reported `per_report` at a time, in order."""
    a, b = two_nodes(chain)
    work = report(NodeWork(hexkey(a), "m", 0, 2, 10), NodeWork(hexkey(b), "m", 1, 3, 10))
    assert refused_codes(one(chain, work, GATEWAY)) == []
    for start in range(0, len(queries), per_report):
        batch = tuple(sorted(queries[start : start + per_report]))
        assert refused_codes(one(chain, report(queries=batch), GATEWAY)) == []
    results = chain.block(
        [
            chain.tx(Contribution((ShardWork("m", 0, 2, 10),)), a),
            chain.tx(Contribution((ShardWork("m", 1, 3, 10),)), b),
        ]
    )
    assert [r.code for r in results] == [Code.OK, Code.OK]


def test_an_epoch_settles_more_than_the_old_500_queries_in_one_statement() -> None:
    chain = settled_chain()
    queries = [(query_id(i), 1_000 + i) for i in range(1, 1_201)]
    serve(chain, queries, per_report=600)
    epoch = next_epoch_end(chain)
    view = ask(chain, f"/payouts?epoch={epoch}")
    assert len(view["query_ids"]) == 1_200 and view["pages"] == 1
    assert int(view["total"]) == sum(fee for _, fee in queries)
    assert chain.state.items("squery") == []


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three queries per statement (its gas budget), at most three statements per close."""
    gas = settlement.BASE_GAS + 3 * settlement.QUERY_GAS
    monkeypatch.setattr(settlement, "MAX_STATEMENT_GAS", gas)
    monkeypatch.setattr(settlement, "MAX_PAGES", 3)


def test_pages_each_pay_their_own_charges_and_sum_to_the_epochs_split(small_pages: None) -> None:
    chain = settled_chain(epoch_length=20)
    queries = [(query_id(i), 100 * i + 1) for i in range(1, 9)]
    serve(chain, queries, per_report=3)  # heights: q1-3, q4-6, q7-8
    epoch = next_epoch_end(chain)
    numbers = [statement_number(epoch, page) for page in range(3)]
    assert numbers == [epoch, epoch + (1 << 32), epoch + (2 << 32)]
    listing = ask(chain, "/payouts")["epochs"]
    assert [s["epoch"] for s in listing] == numbers[::-1]
    assert all(s["committee_epoch"] == epoch and s["pages"] == 3 for s in listing)
    views = [ask(chain, f"/payouts?epoch={n}") for n in numbers]
    assert [len(v["query_ids"]) for v in views] == [3, 3, 2]
    fee_of = dict(queries)
    whole = close_epoch(
        EpochWork(
            epoch=epoch,
            queries=tuple(SettledQuery(q, f) for q, f in queries),
            compute=(
                ComputeWork(evm_of("node-a"), "m", 0, 2, 10),
                ComputeWork(evm_of("node-b"), "m", 1, 3, 10),
            ),
            health=(ShardHealth("m", 0, 1), ShardHealth("m", 1, 1)),
        )
    )
    paid: dict[str, int] = {}
    for number, view in zip(numbers, views, strict=True):
        total = sum(fee_of[q] for q in view["query_ids"])
        assert int(view["total"]) == total == sum(int(amount) for _, amount in view["rows"])
        root = bytes.fromhex(view["root"][2:])
        for account, amount in view["rows"]:
            paid[account] = paid.get(account, 0) + int(amount)
            proof = ask(chain, f"/payouts/proof?epoch={number}&account={account}")
            steps = [bytes.fromhex(p[2:]) for p in proof["proof"]]
            assert verify(root, Payout(number, account, int(amount)), steps)
    # every account's pages add up to exactly its share of the whole epoch
    assert paid == dict(whole.table.payouts)
    assert chain.state.committed("sqdone", query_id(8)) == {"fee": "801", "statement": numbers[2]}
    # a page is signed and confirmed on its own
    for index in range(3):
        assert vote(chain, index, numbers[1]).code == Code.OK
    assert ask(chain, f"/payouts?epoch={numbers[1]}")["confirmed"] is True
    assert ask(chain, f"/payouts?epoch={numbers[0]}")["confirmed"] is False


def test_the_oldest_reported_settle_first_and_the_rest_next_close(small_pages: None) -> None:
    chain = settled_chain(epoch_length=40)
    # reported newest-id first: the ascending-id order of the old rule would pick the wrong ones
    queries = [(query_id(100 - i), 10 + i) for i in range(11)]
    serve(chain, queries, per_report=1)
    epoch = next_epoch_end(chain)
    settled = [
        q for n in range(3) for q in ask(chain, f"/payouts?epoch={epoch + (n << 32)}")["query_ids"]
    ]
    assert sorted(settled) == sorted(q for q, _ in queries[:9])  # 3 pages × 3, oldest first
    assert [key for key, _ in chain.state.items("squery")] == sorted(q for q, _ in queries[9:])
    # the next epoch has work again: the two left over settle there, first in line
    a, b = (seeded_key("node-a"), seeded_key("node-b"))
    work = report(NodeWork(hexkey(a), "m", 0, 1, 1), NodeWork(hexkey(b), "m", 1, 1, 1))
    assert refused_codes(one(chain, work, GATEWAY)) == []
    assert one(chain, report(queries=((query_id(1), 5),)), GATEWAY).code == Code.OK
    assert one(chain, Contribution((ShardWork("m", 0, 1, 1),)), a).code == Code.OK
    following = next_epoch_end(chain)
    view = ask(chain, f"/payouts?epoch={following}")
    assert sorted(view["query_ids"]) == sorted([*(q for q, _ in queries[9:]), query_id(1)])
    assert chain.state.items("squery") == []
