"""Every reader of the committee's `/nodes` follows its pages through the shared page reader
(node/chain/committee_pages.py `read_nodes`): a node listed past the first page is seen, and a
page whose cursor is not a string or does not move on is `BadPage` by name (never a list cut
short unseen). The committee here answers two nodes a page, as the app does 1 000 a page."""

from __future__ import annotations

from bisect import bisect_right
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

from node.agent.placement import MalformedPoolAnswer, read_pool
from node.chain.committee_link import CommitteeLink
from node.chain.committee_pages import BadPage, TooManyPages, read_nodes
from node.gateway.router import CommitteeNodes
from node.server.next_hops import ForwardCommittee
from protocol.stream import NextHop

pytestmark = pytest.mark.unit

MODEL = "sha256:" + "ab" * 32
FEED = "f" * 43


def key(n: int) -> str:
    return f"{n:02x}" * 32


def entry(n: int, shard: int = 1) -> dict[str, Any]:
    """A `/nodes` entry as the committee app writes it (node_view's fields the readers use)."""
    return {
        "key": key(n),
        "evm_address": "0x" + "11" * 20,
        "role": "compute",
        "model": MODEL,
        "shards": [shard],
        "endpoint": f"http://p{n}.nodes.example:18101",
        "status": "SERVING",
        "routable": True,
    }


class PagedCommittee:
    """The committee's `/nodes` over `entries` (key order), `size` a page (`after`, `next`);
    `pages` replaces the answer of the page number it names (0: the first)."""

    def __init__(self, entries: list[dict[str, Any]], size: int = 2) -> None:
        self.entries = sorted(entries, key=lambda e: e["key"])
        self.size = size
        self.asked: list[dict[str, Any]] = []
        self.pages: dict[int, Any] = {}

    def _page(self, path: str, params: dict[str, Any]) -> Any:
        assert path == "/nodes"
        self.asked.append(params)
        if len(self.asked) - 1 in self.pages:
            return self.pages[len(self.asked) - 1]
        after = params.get("after")
        keys = [e["key"] for e in self.entries]
        start = 0 if after is None else bisect_right(keys, after)
        page = self.entries[start : start + self.size]
        more = start + self.size < len(self.entries)
        return {"nodes": page, "next": page[-1]["key"] if more else None}

    async def query(self, path: str, **params: Any) -> Any:  # CommitteeLink.query
        return self._page(path, params)

    def answer(self, path: str) -> Any:
        parts = urlsplit(path)
        return self._page(parts.path, dict(parse_qsl(parts.query)))

    async def abci_query(self, path: str) -> Any:  # CommitteeRpc.abci_query
        return self.answer(path)


ENTRIES = [entry(n) for n in range(1, 6)]  # 5 nodes: 3 pages of 2


def bad_pages() -> list[Any]:
    return [
        {"nodes": [entry(3)], "next": key(2)},  # stays where it was (`after` is key 2)
        {"nodes": [entry(3)], "next": 7},
        {"nodes": [entry(1)], "next": None},  # a node read before, again
        {"nodes": [entry(4)], "next": key(3)},  # a cursor before the page's last node
        {"nodes": {"key": key(1)}, "next": None},
        {"nodes": [entry(1), "junk"], "next": None},
        ["not", "an", "object"],
    ]


# --- the shared reader --------------------------------------------------------------------------


async def test_read_nodes_follows_every_page_with_its_filters() -> None:
    committee = PagedCommittee(ENTRIES)
    nodes = await read_nodes(committee.query, model=MODEL, role="compute")
    assert [n["key"] for n in nodes] == [key(n) for n in range(1, 6)]
    assert committee.asked == [
        {"model": MODEL, "role": "compute"},
        {"model": MODEL, "role": "compute", "after": key(2)},
        {"model": MODEL, "role": "compute", "after": key(4)},
    ]


@pytest.mark.parametrize("bad", range(7))
async def test_read_nodes_refuses_a_malformed_page_by_name(bad: int) -> None:
    committee = PagedCommittee(ENTRIES)
    committee.pages[1] = bad_pages()[bad]  # the second page
    with pytest.raises(BadPage) as error:
        await read_nodes(committee.query)
    assert error.value.code == "bad_page" and error.value.message.startswith("/nodes:")


async def test_read_nodes_past_its_pages_is_too_many_pages() -> None:
    with pytest.raises(TooManyPages) as error:
        await read_nodes(PagedCommittee(ENTRIES).query, max_pages=2)
    assert error.value.code == "too_many_pages"


# --- the product's readers ----------------------------------------------------------------------


async def test_committee_link_nodes_sees_nodes_past_the_first_page() -> None:
    link = CommitteeLink(["http://127.0.0.1:1"])
    committee = PagedCommittee(ENTRIES)
    link.query = committee.query  # type: ignore[method-assign]
    try:
        assert [n["key"] for n in await link.nodes(role="compute")] == [key(n) for n in range(1, 6)]
        committee.pages[len(committee.asked) + 1] = bad_pages()[0]
        with pytest.raises(BadPage):
            await link.nodes()
    finally:
        await link.close()


async def test_gateway_router_sees_nodes_past_the_first_page() -> None:
    committee = PagedCommittee(ENTRIES)
    nodes = await CommitteeNodes(committee, MODEL).compute_nodes()
    assert [n["key"] for n in nodes] == [key(n) for n in range(1, 6)]
    assert committee.asked[-1] == {"model": MODEL, "role": "compute", "after": key(4)}
    committee.pages[len(committee.asked) + 1] = bad_pages()[1]
    with pytest.raises(BadPage):
        await CommitteeNodes(committee, MODEL).compute_nodes()


async def test_placement_sees_nodes_past_the_first_page_and_names_a_bad_page() -> None:
    committee = PagedCommittee(ENTRIES)
    pool = await read_pool(committee, MODEL)
    assert [n.key for n in pool] == [key(n) for n in range(1, 6)]
    committee.pages[len(committee.asked) + 1] = bad_pages()[0]
    with pytest.raises(MalformedPoolAnswer) as error:  # what the mover and `planet join` catch
        await read_pool(committee, MODEL)
    assert "/nodes: a page whose next" in error.value.message


async def test_next_hop_view_allows_a_node_listed_past_the_first_page() -> None:
    committee = PagedCommittee(ENTRIES)
    policy = ForwardCommittee(0, committee, MODEL)
    await policy.check(NextHop(url="http://p5.nodes.example:18101", shard=1, feed=FEED))
    assert len(committee.asked) == 3


def test_harness_reads_every_page() -> None:
    from harness.gateway_net import Committee

    committee = PagedCommittee(ENTRIES)
    harness = Committee.__new__(Committee)
    harness.query = committee.answer  # type: ignore[method-assign]
    assert len(harness.nodes(model=MODEL)) == 5
