"""Settlement keeps up: an epoch settles everything pending, oldest reported first, in as many
payout statements ("pages") as posting needs; each page is its own committee-signed root: the
pool's pages split the credit pool's draw over the epoch's redemptions, each gateway's pages pay
that gateway exactly its own charges (abci_app/settlement.py,
shares.settlement.close_epoch_pages)."""

from __future__ import annotations

from pathlib import Path

import pytest
from nacl.signing import SigningKey

from abci_app import settlement
from abci_app.codes import Code
from protocol.committee.settlement import statement_number
from protocol.eip712 import address_of
from shares.merkle import Payout, verify
from tests.committee_chain import Chain, seeded_evm_key, seeded_key
from tests.unit.test_abci_settlement import (
    ESCROW,
    GATEWAY,
    GATEWAY_EVM,
    GATEWAY_EVM_KEY,
    ask,
    ask_code,
    evm_of,
    net,
    next_epoch_end,
    one,
    redeemed,
    refused_codes,
    report,
    settled_chain,
    two_nodes,
    vote,
)
from tests.unit.test_abci_state import hexkey

pytestmark = pytest.mark.unit

OTHER = seeded_key("other-gateway")
OTHER_EVM_KEY = seeded_evm_key("other-gateway")
OTHER_EVM = address_of(OTHER_EVM_KEY).lower()


def query_id(n: int) -> str:
    return "0x" + f"{n:064x}"


def serve(
    chain: Chain, queries: list[tuple[str, int]], per_report: int = 500, key: SigningKey = GATEWAY
) -> None:
    """`queries` reported by the gateway `key`, `per_report` at a time, in order."""
    for start in range(0, len(queries), per_report):
        batch = tuple(sorted(queries[start : start + per_report]))
        assert refused_codes(one(chain, report(queries=batch), key)) == []


def test_an_epoch_settles_more_than_the_old_500_queries_in_one_statement() -> None:
    chain = settled_chain()
    queries = [(query_id(i), 1_000 + i) for i in range(1, 1_201)]
    serve(chain, queries, per_report=600)
    epoch = next_epoch_end(chain)
    view = ask(chain, f"/payouts?epoch={epoch}")
    assert len(view["query_ids"]) == 1_200 and view["pages"] == 1
    assert int(view["total"]) == sum(fee for _, fee in queries)
    assert view["rows"] == [[GATEWAY_EVM, view["total"]]]
    assert chain.state.items("squery") == []


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three queries per statement (its gas budget), at most four statements per close."""
    gas = settlement.BASE_GAS + 3 * settlement.QUERY_GAS
    monkeypatch.setattr(settlement, "MAX_STATEMENT_GAS", gas)
    monkeypatch.setattr(settlement, "MAX_PAGES", 4)


def test_the_pools_page_splits_the_draw_and_each_revenue_page_pays_its_own_charges(
    small_pages: None, tmp_path: Path
) -> None:
    from tests.credit_chain import ensure_key

    chain = settled_chain(epoch_length=20)
    ensure_key(chain, tmp_path)  # the credit key first (its DKG's blocks): all below in 1 epoch
    a, b = two_nodes(chain)
    queries = [(query_id(i), 100 * i + 1) for i in range(1, 9)]
    serve(chain, queries, per_report=3)  # heights: q1-3, q4-6, q7-8
    results = redeemed(chain, tmp_path, {a: (0, 2), b: (1, 3)})
    assert [r.code for r in results] == [Code.OK] * 4
    epoch = next_epoch_end(chain)
    numbers = [statement_number(epoch, page) for page in range(4)]
    assert numbers == [epoch, epoch + (1 << 32), epoch + (2 << 32), epoch + (3 << 32)]
    listing = ask(chain, "/payouts")["epochs"]
    assert [s["epoch"] for s in listing] == numbers[::-1]
    assert all(s["committee_epoch"] == epoch and s["pages"] == 4 for s in listing)
    views = [ask(chain, f"/payouts?epoch={n}") for n in numbers]
    # page 0, the pool's: the purchase in, the draw out, each node its credits less the cut
    assert views[0]["query_ids"] == [] and views[0]["gateways"] == [ESCROW, ESCROW]
    assert dict(views[0]["rows"]) == {evm_of("node-a"): str(net(2)), evm_of("node-b"): str(net(3))}
    # pages 1-3, the gateway's: its queries oldest first, one row each, its exact charges
    assert [len(v["query_ids"]) for v in views[1:]] == [3, 3, 2]
    fee_of = dict(queries)
    for number, view in zip(numbers, views, strict=True):
        root = bytes.fromhex(view["root"][2:])
        assert int(view["total"]) == sum(int(amount) for _, amount in view["rows"])
        for account, amount in view["rows"]:
            proof = ask(chain, f"/payouts/proof?epoch={number}&account={account}")
            steps = [bytes.fromhex(p[2:]) for p in proof["proof"]]
            assert verify(root, Payout(number, account, int(amount)), steps)
    for view in views[1:]:
        total = sum(fee_of[q] for q in view["query_ids"])
        assert view["rows"] == [[GATEWAY_EVM, str(total)]]
    assert chain.state.committed("sqdone", f"{query_id(8)}/{GATEWAY_EVM}") == {
        "fee": "801",
        "statement": numbers[3],
    }
    # a page is signed and confirmed on its own
    for index in range(3):
        assert vote(chain, index, numbers[1]).code == Code.OK
    assert ask(chain, f"/payouts?epoch={numbers[1]}")["confirmed"] is True
    assert ask(chain, f"/payouts?epoch={numbers[0]}")["confirmed"] is False


def test_the_oldest_reported_settle_first_and_the_rest_next_close(small_pages: None) -> None:
    chain = settled_chain(epoch_length=40)
    # reported newest-id first: the ascending-id order of the old rule would pick the wrong ones
    queries = [(query_id(100 - i), 10 + i) for i in range(14)]
    serve(chain, queries, per_report=1)
    epoch = next_epoch_end(chain)
    settled = [
        q for n in range(4) for q in ask(chain, f"/payouts?epoch={epoch + (n << 32)}")["query_ids"]
    ]
    assert sorted(settled) == sorted(q for q, _ in queries[:12])  # 4 pages × 3, oldest first
    assert [key for key, _ in chain.state.items("squery")] == sorted(
        f"{q}/{GATEWAY_EVM}" for q, _ in queries[12:]
    )
    # the two left over settle at the next close, first in line
    assert one(chain, report(queries=((query_id(1), 5),)), GATEWAY).code == Code.OK
    following = next_epoch_end(chain)
    view = ask(chain, f"/payouts?epoch={following}")
    assert sorted(view["query_ids"]) == sorted([*(q for q, _ in queries[12:]), query_id(1)])
    assert chain.state.items("squery") == []


def test_each_gateway_has_its_own_pages_the_oldest_pending_first(small_pages: None) -> None:
    chain = settled_chain(bindings={GATEWAY: GATEWAY_EVM_KEY, OTHER: OTHER_EVM_KEY})
    serve(chain, [(query_id(50), 7)], key=OTHER)  # the other gateway reported first
    serve(chain, [(query_id(1), 100), (query_id(2), 200)])
    serve(chain, [(query_id(51), 9)], key=OTHER)
    epoch = next_epoch_end(chain)
    views = [ask(chain, f"/payouts?epoch={statement_number(epoch, p)}") for p in range(2)]
    assert [v["rows"] for v in views] == [[[OTHER_EVM, "16"]], [[GATEWAY_EVM, "300"]]]
    assert [sorted(v["query_ids"]) for v in views] == [
        [query_id(50), query_id(51)],
        [query_id(1), query_id(2)],
    ]
    # a key cannot report for another: the query's payee is the reporting key's own address
    assert (
        chain.state.committed("sqdone", f"{query_id(1)}/{GATEWAY_EVM}")["statement"]
        == views[1]["epoch"]
    )


def test_the_statement_list_pages_with_a_cursor_every_statement_once(small_pages: None) -> None:
    """`/payouts` without `epoch` answers a page of at most `limit` statements, newest first,
    and `next`, the `after` of the next page (null on the last): followed, every stored
    statement comes once, in the one-page order, also when an epoch's pages straddle two
    pages of the list (issue 42: a reader with `limit=200` lost every statement past 200)."""
    chain = settled_chain(epoch_length=40)
    serve(chain, [(query_id(i), 10 + i) for i in range(1, 8)], per_report=1)  # 3 pages
    first = next_epoch_end(chain)
    serve(chain, [(query_id(i), 10 + i) for i in range(8, 12)], per_report=1)  # 2 pages
    second = next_epoch_end(chain)
    whole = ask(chain, "/payouts")
    assert whole["next"] is None
    expected = [statement_number(second, p) for p in (1, 0)] + [
        statement_number(first, p) for p in (2, 1, 0)
    ]
    assert [s["epoch"] for s in whole["epochs"]] == expected
    for limit in (1, 2, 4):
        read, after, pages = [], "", 0
        while after is not None:
            page = ask(chain, f"/payouts?limit={limit}" + (f"&after={after}" if after else ""))
            assert 0 < len(page["epochs"]) <= limit
            read += page["epochs"]
            after, pages = page["next"], pages + 1
        assert read == whole["epochs"] and pages == -(-len(expected) // limit)
    # a cursor that is no statement number, or past the oldest: refused by name / empty
    assert ask_code(chain, f"/payouts?after={statement_number(1, 64)}") == Code.BAD_QUERY
    assert ask_code(chain, "/payouts?after=0x5") == Code.BAD_QUERY
    for hostile in ("\u0665", "5" * 5000, "-1", "1e3"):  # non-ASCII digit, huge, sign, float
        assert ask_code(chain, f"/payouts?after={hostile}") == Code.BAD_QUERY, hostile
    assert ask(chain, "/payouts") == whole  # and it still answers
    assert ask(chain, f"/payouts?after={first}") == {**whole, "epochs": [], "next": None}


def pages(chain: Chain, path: str, key: str, **params: object) -> list[list[object]]:
    """Every page of `path` (one item a page), following `next` as `after`."""
    out: list[list[object]] = []
    after: object = None
    while True:
        query = "&".join(f"{k}={v}" for k, v in {**params, "limit": 1}.items())
        answer = ask(chain, f"{path}?{query}" + ("" if after is None else f"&after={after}"))
        out.append(answer[key])
        after = answer["next"]
        if after is None:
            return out


def test_evidence_and_flagged_coverage_page_with_a_cursor() -> None:
    """`/evidence` and `/coverage` (without `node`) answered their first `limit` and no more
    (issue 42: no silent cap): both page like `/commitments`, `next` the `after` of the next
    page, null on the last, every record once."""
    from protocol.committee.commitments import (
        CommitBatch,
        CommitmentRecord,
        RevealBatch,
        RevealRecord,
    )
    from tests.unit.test_abci_coverage import routable_node, sold

    chain = settled_chain(commit_grace_epochs=1, heartbeat_timeout=10_000)
    silent = [routable_node(chain, f"silent-{i}", shard=i) for i in range(3)]
    for i in range(3):  # each sold 200 positions it never commits
        sold(chain, seeded_key(f"silent-{i}"), i, 2, 100)
    length = chain.state.genesis.epoch_length
    sold_by = (chain.state.height - 1) // length + 1  # the epoch of the last sale
    session = "0x" + "01" * 32
    cheat = seeded_key("silent-0")
    records = tuple(CommitmentRecord(session, s, 0, "0x" + f"{s:064x}") for s in (1, 2, 3))
    assert one(chain, CommitBatch(records), cheat).code == Code.OK
    reveals = tuple(
        RevealRecord(session, s, 0, "0x" + "00" * 32, "0x" + "00" * 32) for s in (1, 2, 3)
    )
    assert one(chain, RevealBatch(reveals), cheat).code == Code.OK
    whole = ask(chain, "/evidence")
    assert len(whole["evidence"]) == 3 and whole["next"] is None
    listed = pages(chain, "/evidence", "evidence")
    assert [len(p) for p in listed] == [1, 1, 1]
    assert [p[0] for p in listed] == whole["evidence"]
    assert pages(chain, "/evidence", "evidence", node=hexkey(cheat)) == listed
    chain.advance_to((sold_by + 1) * length)  # past the grace epoch: every silent node flagged
    flagged = ask(chain, "/coverage")
    assert sorted(flagged["uncommitted"]) == sorted(silent) and flagged["next"] is None
    listed = pages(chain, "/coverage", "uncommitted")
    assert [node for page in listed for node in page] == flagged["uncommitted"]
    assert len(listed) == 3
