"""Every reader of the committee's `/reputations` and `/prices` follows their pages through the
shared page reader (node/chain/committee_pages.py `read_reputations`, `read_prices`): a record
listed past the first page is seen, and a page that is malformed or leaves key order is
`BadPage` by name (never a list cut short unseen). The committee here answers one or two
records a page, as the app does 1 000 a page. (The verifier's verdict votes:
tests/unit/test_verifier_worker.py; the gateway's `/v1/network`: tests/dapp/test_dapp_routes.py.)
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

from node.agent.pricing import PriceKeeper
from node.chain.committee_link import CommitteeLink
from node.chain.committee_pages import (
    BadPage,
    TooManyPages,
    price_row_key,
    read_prices,
    read_reputations,
)
from node.cli import join_price
from node.server.chain_price import refresh
from protocol.errors import UsageError

pytestmark = pytest.mark.unit

MODEL = "sha256:" + "ab" * 32


def key(n: int) -> str:
    return f"{n:02x}" * 32


def price_row(n: int, shard: int, positions: int) -> dict[str, Any]:
    return {"node": key(n), "model": MODEL, "shard": shard, "positions": positions, "next": None}


class PagedList:
    """The committee's `path` over `rows` (key order by `key_of`), `size` a page (`after`,
    `next`); `/reputations` answers its rows as {key: record}. `pages` replaces the answer of
    the page number it names (0: the first)."""

    def __init__(
        self, path: str, rows: list[dict[str, Any]], key_of: Callable[[dict], Any], size: int = 1
    ) -> None:
        self.path = path
        self.rows = sorted(rows, key=key_of)
        self.key_of = key_of
        self.size = size
        self.asked: list[dict[str, Any]] = []
        self.pages: dict[int, Any] = {}

    def _page(self, path: str, params: dict[str, Any]) -> Any:
        assert path == self.path, path
        self.asked.append(params)
        if len(self.asked) - 1 in self.pages:
            return self.pages[len(self.asked) - 1]
        rows = [r for r in self.rows if params.get("node") in (None, r.get("node"))]
        keys = [self.key_of(r) for r in rows]
        start = 0 if params.get("after") is None else bisect_right(keys, params["after"])
        page = rows[start : start + self.size]
        cursor = keys[start + self.size - 1] if start + self.size < len(rows) else None
        if self.path == "/reputations":
            listed = {r["key"]: {k: v for k, v in r.items() if k != "key"} for r in page}
            return {
                "scale": 1_000_000,
                "untrusted_below": 400_000,
                "reputations": listed,
                "next": cursor,
            }
        return {"epoch": 3, "prices": page, "next": cursor}

    async def query(self, path: str, **params: Any) -> Any:  # CommitteeLink.query
        return self._page(path, params)

    def answer(self, path: str) -> Any:
        parts = urlsplit(path)
        return self._page(parts.path, dict(parse_qsl(parts.query)))


def reputations(n: int = 3) -> PagedList:
    rows = [{"key": key(i), "r": 100_000 * i, "window": [i]} for i in range(1, n + 1)]
    return PagedList("/reputations", rows, lambda r: r["key"])


def prices(rows: list[dict[str, Any]]) -> PagedList:
    return PagedList("/prices", rows, price_row_key)


def bad_reputation_pages() -> list[Any]:
    return [
        {"reputations": {key(2): {"r": 1}}, "next": key(1)},  # stays where it was
        {"reputations": {key(1): {"r": 1}}, "next": None},  # a record read before, again
        {"reputations": {key(3): {"r": 1}}, "next": key(2)},  # a cursor before its record
        {"reputations": [{"key": key(2)}], "next": None},  # a list, not an object
        {"reputations": {key(2): 5}, "next": None},
        {"reputations": {key(2): {"r": 1}}, "next": 7},
        ["not", "an", "object"],
    ]


def bad_price_pages() -> list[Any]:
    return [
        {"prices": [price_row(2, 0, 8)], "next": f"{key(1)}/00000"},  # stays where it was
        {"prices": [price_row(1, 0, 8)], "next": None},  # a row read before, again
        {"prices": [price_row(3, 0, 8)], "next": f"{key(2)}/00000"},  # a cursor before its row
        {"prices": {"node": key(2)}, "next": None},
        {"prices": [price_row(2, 0, 8), "junk"], "next": None},
        {"prices": [], "next": 7},
        "odd",
    ]


# --- the shared readers ---------------------------------------------------------------------


async def test_read_reputations_follows_every_page() -> None:
    committee = reputations()
    records = await read_reputations(committee.query)
    assert records == {key(i): {"r": 100_000 * i, "window": [i]} for i in (1, 2, 3)}
    assert committee.asked == [{}, {"after": key(1)}, {"after": key(2)}]


@pytest.mark.parametrize("bad", range(7))
async def test_read_reputations_refuses_a_malformed_page_by_name(bad: int) -> None:
    committee = reputations()
    committee.pages[1] = bad_reputation_pages()[bad]  # the second page
    with pytest.raises(BadPage) as error:
        await read_reputations(committee.query)
    assert error.value.code == "bad_page" and error.value.message.startswith("/reputations:")


async def test_read_prices_follows_every_page_with_its_filters() -> None:
    committee = prices([price_row(1, 0, 16), price_row(1, 1, 32), price_row(2, 0, 48)])
    rows = await read_prices(committee.query, model=MODEL)
    assert [(r["node"], r["shard"]) for r in rows] == [(key(1), 0), (key(1), 1), (key(2), 0)]
    assert committee.asked == [
        {"model": MODEL},
        {"model": MODEL, "after": f"{key(1)}/00000"},
        {"model": MODEL, "after": f"{key(1)}/00001"},
    ]


@pytest.mark.parametrize("bad", range(7))
async def test_read_prices_refuses_a_malformed_page_by_name(bad: int) -> None:
    committee = prices([price_row(n, 0, 16) for n in (1, 2, 3)])
    committee.pages[1] = bad_price_pages()[bad]
    with pytest.raises(BadPage) as error:
        await read_prices(committee.query)
    assert error.value.code == "bad_page" and error.value.message.startswith("/prices:")


async def test_the_list_readers_past_their_pages_are_too_many_pages() -> None:
    with pytest.raises(TooManyPages):
        await read_reputations(reputations().query, max_pages=2)
    with pytest.raises(TooManyPages):
        await read_prices(prices([price_row(n, 0, 16) for n in (1, 2, 3)]).query, max_pages=2)


# --- the product's readers ------------------------------------------------------------------


class PriceLink:
    """`CommitteeLink.query` over `committee`, and the `submit` the agent's keeper uses."""

    def __init__(self, committee: PagedList, signer: str) -> None:
        self.committee = committee
        self.signer = signer
        self.sent: list[Any] = []

    async def query(self, path: str, **params: Any) -> Any:
        return await self.committee.query(path, **params)

    async def submit(self, body: Any) -> Any:
        self.sent.append(body)


async def test_the_agent_sees_its_price_past_the_first_page() -> None:
    committee = prices([price_row(1, 0, 16), price_row(1, 1, 32), price_row(1, 2, 64)])
    link = PriceLink(committee, key(1))
    keeper = PriceKeeper(link, MODEL, 2, 64)
    await keeper.step()
    assert keeper.settled and link.sent == []  # registered already: on the third page
    assert committee.asked[0] == {"model": MODEL, "node": key(1)}
    committee.pages[len(committee.asked) + 1] = bad_price_pages()[0]
    with pytest.raises(BadPage):  # the agent's pass logs it and tries again
        await PriceKeeper(link, MODEL, 2, 64).step()
    assert link.sent == []  # nothing sent on a list it could not read


async def test_the_node_charges_its_chain_price_past_the_first_page() -> None:
    committee = prices([price_row(1, 0, 16), price_row(1, 1, 32), price_row(1, 2, 48)])
    state = SimpleNamespace(payments=SimpleNamespace(positions=8))
    await refresh(state, PriceLink(committee, key(1)), key(1), MODEL, 2)
    assert state.payments.positions == 48
    committee.pages[len(committee.asked) + 1] = bad_price_pages()[4]
    with pytest.raises(BadPage):  # `follow_chain_price` logs it; the price stays
        await refresh(state, PriceLink(committee, key(1)), key(1), MODEL, 1)
    assert state.payments.positions == 48


def test_join_works_out_the_going_price_from_every_page(monkeypatch) -> None:
    committee = prices([price_row(1, 0, 16), price_row(2, 0, 0), price_row(3, 0, 32)])
    committee.rows.append(price_row(4, 0, 48))
    monkeypatch.setattr(CommitteeLink, "query", lambda self, path, **p: committee.query(path, **p))
    assert join_price.going_price("http://127.0.0.1:1", MODEL) == 32  # of 16 32 48 (0: free)
    committee.pages[len(committee.asked) + 1] = bad_price_pages()[1]
    with pytest.raises(UsageError) as error:  # `planet join` prints error: and the hint
        join_price.going_price("http://127.0.0.1:1", MODEL)
    assert "bad_page" in error.value.message and "--credit-positions" in (error.value.hint or "")


def test_harness_reads_every_reputation_page() -> None:
    from harness.gateway_net import Committee

    committee = reputations()
    harness = Committee.__new__(Committee)
    harness.query = committee.answer  # type: ignore[method-assign]
    assert sorted(harness.reputations()) == [key(1), key(2), key(3)]
