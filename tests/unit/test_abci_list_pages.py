"""`/reputations` and `/prices` answer bounded pages in key order with a `next` cursor, as
`/nodes` does (abci_app/queries.py `_reputations`, abci_app/prices.py `prices_query`):
registering costs nothing, so no answer lists every registration's record at once. A page reads
at most `limit` records, `next` is the last key it passed while more follow, and paging until
null lists every record once; a malformed cursor is refused by name."""

from __future__ import annotations

import dataclasses
import json

import pytest

from abci_app import query_params
from abci_app.codes import Code
from abci_app.queries import query
from protocol.committee.prices import SetPrice
from tests.committee_chain import Chain, seeded_key
from tests.unit.test_abci_nodes_pages import pages, registered
from tests.unit.test_abci_state import ask, register_body

pytestmark = pytest.mark.unit

LABELS = [f"n{i}" for i in range(5)]


def priced(chain: Chain, labels: list[str], model: str = "m", shards: tuple[int, ...] = (0,)):
    """Register a node per label on `shards` of `model` and set a price on each shard (64 + the
    shard); the price record keys (`<node>/<shard, 5 digits>`), sorted."""
    txs = [
        chain.tx(
            dataclasses.replace(register_body(label, shards=shards), model=model),
            seeded_key(label),
        )
        for label in labels
    ]
    assert {r.code for r in chain.block(txs)} == {Code.OK}
    txs = [
        chain.tx(SetPrice(model, shard, 64 + shard), seeded_key(label))
        for label in labels
        for shard in shards
    ]
    assert {r.code for r in chain.block(txs)} == {Code.OK}
    keys = [seeded_key(label).verify_key.encode().hex() for label in labels]
    return sorted(f"{key}/{shard:05d}" for key in keys for shard in shards)


def row_key(row: dict) -> str:
    return f"{row['node']}/{row['shard']:05d}"


# --- /reputations ---------------------------------------------------------------------------------


def test_reputations_pages_of_limit_records_in_key_order() -> None:
    chain = Chain()
    keys = registered(chain, LABELS)
    answers = pages(chain, "/reputations?limit=2")
    assert [sorted(a["reputations"]) for a in answers] == [keys[:2], keys[2:4], keys[4:]]
    assert [a["next"] for a in answers] == [keys[1], keys[3], None]
    assert all(a["untrusted_below"] == 400_000 and a["scale"] == 1_000_000 for a in answers)
    record = answers[2]["reputations"][keys[4]]
    assert record["r"] == 500_000 and record["untrusted"] is False


def test_reputations_without_a_limit_answers_at_most_the_bound(monkeypatch) -> None:
    monkeypatch.setattr(query_params, "MAX_ITEMS", 3)
    chain = Chain()
    keys = registered(chain, LABELS)
    for path in ("/reputations", "/reputations?limit=0", "/reputations?limit=1000000"):
        first = ask(chain, path)
        assert sorted(first["reputations"]) == keys[:3] and first["next"] == keys[2], path


def test_reputations_cursor_at_the_edges() -> None:
    chain = Chain()
    keys = registered(chain, LABELS[:4])
    exactly = ask(chain, "/reputations?limit=4")  # a full page and nothing after it: the last
    assert sorted(exactly["reputations"]) == keys and exactly["next"] is None
    assert ask(chain, f"/reputations?after={keys[-1]}")["reputations"] == {}
    assert ask(chain, "/reputations?after=" + "f" * 64)["next"] is None
    before_first = ask(chain, "/reputations?limit=1&after=" + "0" * 64)
    assert sorted(before_first["reputations"]) == keys[:1]


# --- /prices ------------------------------------------------------------------------------------


def test_prices_pages_of_limit_records_in_key_order() -> None:
    chain = Chain()
    keys = priced(chain, LABELS[:3], shards=(0, 1))  # 6 price records
    answers = pages(chain, "/prices?limit=4")
    assert [[row_key(r) for r in a["prices"]] for a in answers] == [keys[:4], keys[4:]]
    assert [a["next"] for a in answers] == [keys[3], None]
    assert all("going_price" not in a for a in answers)  # the reader's, from every page
    assert [r["positions"] for r in answers[1]["prices"]] == [64, 65]


def test_prices_without_a_limit_answers_at_most_the_bound(monkeypatch) -> None:
    monkeypatch.setattr(query_params, "MAX_ITEMS", 3)
    chain = Chain()
    keys = priced(chain, LABELS)
    for path in ("/prices", "/prices?model=m", "/prices?limit=1000000"):
        first = ask(chain, path)
        assert [row_key(r) for r in first["prices"]] == keys[:3] and first["next"] == keys[2]


def test_prices_of_one_node_page_within_its_records() -> None:
    chain = Chain()
    keys = priced(chain, LABELS[:3], shards=(0, 1, 2))
    node = keys[3].split("/")[0]  # the second node's
    answers = pages(chain, f"/prices?node={node}&limit=2")
    assert [[row_key(r) for r in a["prices"]] for a in answers] == [keys[3:5], keys[5:6]]
    # a cursor before the node's records starts at its first one, one past them lists none
    assert [row_key(r) for r in ask(chain, f"/prices?node={node}&after={keys[0]}")["prices"]] == (
        keys[3:6]
    )
    assert ask(chain, f"/prices?node={node}&after={keys[6]}") == {
        "epoch": ask(chain, "/prices")["epoch"],
        "prices": [],
        "next": None,
    }


def test_prices_filtered_pages_count_the_records_passed() -> None:
    """A page of `?model=` passes `limit` records of any model: it may list fewer rows (none,
    even) and still name a `next`; every page together lists each of the model's rows once."""
    chain = Chain()
    ours = priced(chain, [f"m{i}" for i in range(2)])
    theirs = priced(chain, [f"o{i}" for i in range(5)], model="other")
    answers = pages(chain, "/prices?model=m&limit=2")
    assert len(answers) == 4  # 7 records, 2 a page
    assert [row_key(r) for a in answers for r in a["prices"]] == ours
    everyone = [row_key(r) for a in pages(chain, "/prices?limit=3") for r in a["prices"]]
    assert everyone == sorted(ours + theirs)


# --- malformed cursors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "after"),
    [
        *(("/reputations", a) for a in ["xyz", "A" * 64, "0" * 63, "0" * 65, 7, True]),
        *(
            ("/prices", a)
            for a in [
                "0" * 64,  # a node key is not a price record's key
                "0" * 64 + "/1",
                "0" * 64 + "/000001",
                "A" * 64 + "/00001",
                "0" * 64 + "/0000a",
                "0" * 64 + "/00001/",
                7,
            ]
        ),
    ],
)
def test_malformed_cursor_refused_by_name(path: str, after: object) -> None:
    chain = Chain()
    priced(chain, ["n0"])
    code, _, log = query(chain.state, path, json.dumps({"after": after}).encode())
    assert code == Code.BAD_QUERY and log.startswith("after:"), log


# --- the readers over the app ---------------------------------------------------------------


async def test_the_readers_page_through_the_app(monkeypatch) -> None:
    """`read_prices` and `read_reputations` over the app's own answers, two records a page,
    their cursors through a query string (a price cursor holds a `/`: `%2F` on the way)."""
    from node.chain.committee_pages import path_query, read_prices, read_reputations

    monkeypatch.setattr(query_params, "MAX_ITEMS", 2)
    chain = Chain()
    keys = priced(chain, LABELS[:3], shards=(0, 1))
    asked: list[str] = []

    async def abci_query(path: str) -> object:
        asked.append(path)
        code, value, log = query(chain.state, path, b"")
        assert code == Code.OK, log
        return json.loads(value)

    rows = await read_prices(path_query(abci_query), model="m")
    assert [row_key(r) for r in rows] == keys and len(asked) == 3
    assert asked[1] == f"/prices?model=m&after={keys[1].replace('/', '%2F')}"
    records = await read_reputations(path_query(abci_query))
    assert sorted(records) == sorted({k.split("/")[0] for k in keys})
