"""`/nodes` answers a bounded page of the registry in key order with a `next` cursor
(abci_app/queries.py `_nodes`): registering costs nothing, so no answer lists every registration
at once. A page passes at most `limit` registrations (filtered ones included), `next` is the
last key it passed while more follow, and paging until null lists every matching node once."""

from __future__ import annotations

import dataclasses
import json

import pytest

from abci_app import query_params
from abci_app.codes import Code
from abci_app.queries import query
from tests.committee_chain import Chain, seeded_key
from tests.unit.test_abci_state import ask, hexkey, make_routable, register_body

pytestmark = pytest.mark.unit


def registered(chain: Chain, labels: list[str], model: str = "m") -> list[str]:
    """Register a node per label in one block (`model` for each); their keys, sorted."""
    txs = [
        chain.tx(dataclasses.replace(register_body(label), model=model), seeded_key(label))
        for label in labels
    ]
    assert {r.code for r in chain.block(txs)} == {Code.OK}
    return sorted(hexkey(seeded_key(label)) for label in labels)


def pages(chain: Chain, path: str) -> list[dict]:
    """Every page of `path` (`?…&after=`), following `next` to null."""
    answers, after = [], None
    while True:
        sep = "&" if "?" in path else "?"
        answer = ask(chain, path + ("" if after is None else f"{sep}after={after}"))
        answers.append(answer)
        after = answer["next"]
        if after is None:
            return answers
        assert len(answers) < 50, "the cursor does not move"


def test_nodes_pages_of_limit_registrations_in_key_order() -> None:
    chain = Chain()
    keys = registered(chain, [f"n{i}" for i in range(5)])
    answers = pages(chain, "/nodes?limit=2")
    assert [[n["key"] for n in a["nodes"]] for a in answers] == [keys[:2], keys[2:4], keys[4:]]
    assert [a["next"] for a in answers] == [keys[1], keys[3], None]


def test_nodes_without_a_limit_answers_at_most_the_bound(monkeypatch) -> None:
    monkeypatch.setattr(query_params, "MAX_ITEMS", 3)
    chain = Chain()
    keys = registered(chain, [f"n{i}" for i in range(5)])
    for path in ("/nodes", "/nodes?limit=0", "/nodes?limit=1000000"):
        first = ask(chain, path)
        assert [n["key"] for n in first["nodes"]] == keys[:3] and first["next"] == keys[2], path


def test_nodes_cursor_at_the_edges() -> None:
    chain = Chain()
    keys = registered(chain, [f"n{i}" for i in range(4)])
    exactly = ask(chain, "/nodes?limit=4")  # a full page and nothing after it: the last page
    assert [n["key"] for n in exactly["nodes"]] == keys and exactly["next"] is None
    assert ask(chain, f"/nodes?after={keys[-1]}") == {"nodes": [], "next": None}
    past_last = ask(chain, "/nodes?after=" + "f" * 64)
    assert past_last == {"nodes": [], "next": None}
    before_first = ask(chain, "/nodes?limit=1&after=" + "0" * 64)  # not a registered key
    assert [n["key"] for n in before_first["nodes"]] == keys[:1]
    # a cursor whose node left the registry still pages on from where it was
    gone = keys[1][:-1] + ("0" if keys[1][-1] != "0" else "1")
    assert gone not in keys
    after_gone = ask(chain, f"/nodes?after={gone}")["nodes"]
    assert [n["key"] for n in after_gone] == [k for k in keys if k > gone]


@pytest.mark.parametrize(
    "after",
    ["xyz", "A" * 64, "0" * 63, "0" * 65, "0x" + "0" * 64, "0" * 64 + "/", 7, True],
)
def test_nodes_malformed_cursor_refused_by_name(after: object) -> None:
    chain = Chain()
    registered(chain, ["n0"])
    data = json.dumps({"after": after}).encode()
    code, _, log = query(chain.state, "/nodes", data)
    assert code == Code.BAD_QUERY and log.startswith("after:"), log


def test_nodes_filtered_pages_count_the_registrations_passed() -> None:
    """A page of `?model=` passes `limit` registrations of any model: one may list fewer nodes
    than `limit` (none, even) and still name a `next`; every page together lists each node of
    the model once."""
    chain = Chain()
    ours = registered(chain, [f"m{i}" for i in range(3)])
    theirs = registered(chain, [f"o{i}" for i in range(6)], model="other")
    answers = pages(chain, "/nodes?model=m&limit=2")
    assert all(len(a["nodes"]) <= 2 for a in answers)
    assert len(answers) == 5  # 9 registrations, 2 a page
    assert [n["key"] for a in answers for n in a["nodes"]] == ours
    assert all(n["model"] == "m" for a in answers for n in a["nodes"])
    everyone = [n["key"] for a in pages(chain, "/nodes?limit=4") for n in a["nodes"]]
    assert everyone == sorted(ours + theirs)


def test_nodes_status_and_role_filters_page_too() -> None:
    chain = Chain()
    keys = registered(chain, [f"n{i}" for i in range(4)])
    serving = next(
        label for label in [f"n{i}" for i in range(4)] if hexkey(seeded_key(label)) == keys[2]
    )
    make_routable(chain, seeded_key(serving))
    answers = pages(chain, "/nodes?status=serving&role=compute&limit=1")
    assert len(answers) == 4
    assert [n["key"] for a in answers for n in a["nodes"]] == [keys[2]]
    assert [n["routable"] for a in answers for n in a["nodes"]] == [True]


def flooded(order: list[int]) -> Chain:
    """A chain where free registrations landed in `order` (700 a block), every third on
    another model."""
    chain = Chain()
    for first in range(0, len(order), 700):
        labels = [f"flood-{i}" for i in order[first : first + 700]]
        txs = [
            chain.tx(
                dataclasses.replace(register_body(label), model="m" if i % 3 else "other"),
                seeded_key(label),
            )
            for label, i in zip(labels, order[first : first + 700], strict=True)
        ]
        assert {r.code for r in chain.block(txs)} == {Code.OK}
    return chain


async def test_a_flood_of_registrations_is_read_whole_in_key_order_by_read_nodes() -> None:
    """The product's reader over the app itself: every registration once, in key order, past
    the first page, whatever order the registrations landed in (the pages depend on the
    registered keys alone)."""
    from node.chain.committee_pages import path_query, read_nodes

    count = 1300  # more than the app's page of 1,000
    forward = flooded(list(range(count)))
    backward = flooded(list(reversed(range(count))))
    asked: list[str] = []

    def reader(chain: Chain) -> object:
        async def abci_query(path: str) -> object:
            asked.append(path)
            return ask(chain, path)

        return path_query(abci_query)

    everyone = sorted(hexkey(seeded_key(f"flood-{i}")) for i in range(count))
    on_m = sorted(hexkey(seeded_key(f"flood-{i}")) for i in range(count) if i % 3)
    listed = await read_nodes(reader(forward))  # type: ignore[arg-type]
    assert [n["key"] for n in listed] == everyone
    assert len(asked) == 2  # 1,000 + 300
    assert [n["key"] for n in await read_nodes(reader(forward), model="m")] == on_m  # type: ignore[arg-type]
    # the same registrations landed the other way round (other heights): the same pages
    for path in ("/nodes", f"/nodes?after={everyone[999]}", "/nodes?model=m&limit=7"):
        one, other = ask(forward, path), ask(backward, path)
        assert [n["key"] for n in one["nodes"]] == [n["key"] for n in other["nodes"]]
        assert one["next"] == other["next"]
