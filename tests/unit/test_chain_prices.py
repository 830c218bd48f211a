"""What `planet ask --credits` over a nodes file pays (node/client/chain_prices.py): the price each
node registered on the committee chain, matched by its node key or endpoint, and the nodes
file's `committee_rpc` naming that chain; `--help` says so."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from node.client.chain_prices import prices_for, read_chain_prices
from node.client.nodesfile import NodesFile
from node.client.types import Hop
from planet import main as cli
from protocol.errors import ConfigError

pytestmark = pytest.mark.unit

KEY_A, KEY_B = "aa" * 32, "bb" * 32
ENTRIES = [
    {"key": KEY_A, "endpoint": "https://10.0.0.1:18100", "shards": [0], "prices": {"0": 64}},
    {"key": KEY_B, "endpoint": "http://Node.Example:9000", "shards": [1], "prices": {"1": 0}},
    {"key": "cc" * 32, "endpoint": "http://127.0.0.1:9001", "shards": [0], "prices": {}},
    {"key": "dd" * 32, "endpoint": "http://127.0.0.1:9002", "shards": [0], "prices": {"0": "8"}},
    "not an entry",
]


def test_each_hop_is_paid_the_price_its_node_registered_on_its_shard() -> None:
    hops = [
        Hop("https://10.0.0.1:18100", 0, KEY_A),  # by its key
        Hop("http://node.example:9000/", 1),  # by its endpoint (host case, a trailing /)
        Hop("http://127.0.0.1:9001", 0),  # registered, no price: none
        Hop("http://127.0.0.1:9002", 0),  # a malformed price: none
        Hop("http://127.0.0.1:9003", 0),  # not on the chain: none
        Hop("https://10.0.0.9:18100", 1, KEY_A),  # its key, another shard than it serves
    ]
    assert prices_for(ENTRIES, hops) == {
        hops[0].url: 64,
        hops[1].url: 0,
        hops[2].url: None,
        hops[3].url: None,
        hops[4].url: None,
        hops[5].url: None,
    }


def test_the_prices_are_read_from_the_committee_s_node_list(monkeypatch) -> None:
    asked: list[tuple[str, dict[str, Any]]] = []

    class Link:
        def __init__(self, urls: list[str]) -> None:
            assert urls == ["http://committee:26657"]

        async def query(self, path: str, **params: Any) -> Any:
            """Two nodes a page, in key order (the committee's paging)."""
            asked.append((path, params))
            entries = [e for e in ENTRIES if isinstance(e, dict)]
            start = (
                0
                if "after" not in params
                else 1 + [e["key"] for e in entries].index(params["after"])
            )
            page = entries[start : start + 2]
            more = start + 2 < len(entries)
            return {"nodes": page, "next": page[-1]["key"] if more else None}

        async def close(self) -> None:
            pass

    monkeypatch.setattr("node.chain.committee_link.CommitteeLink", Link)
    first = Hop("https://10.0.0.1:18100", 0, KEY_A)
    past = Hop("http://127.0.0.1:9002", 0)  # its node is listed on the second page
    prices = asyncio.run(read_chain_prices("http://committee:26657", "sha256:m", [first, past]))
    assert prices == {first.url: 64, past.url: None}  # read, and its malformed price refused
    assert asked == [
        ("/nodes", {"model": "sha256:m", "role": "compute"}),
        ("/nodes", {"model": "sha256:m", "role": "compute", "after": KEY_B}),
    ]


def test_a_node_past_the_first_page_is_priced() -> None:
    """A priced node the committee lists on its second page is paid its price (a reader that
    stopped at the first page would pay it nothing)."""
    from node.chain.committee_pages import path_query, read_nodes

    entries = [e for e in ENTRIES if isinstance(e, dict)]
    pages = {
        "/nodes?model=sha256:m&role=compute": {"nodes": entries[:1], "next": KEY_A},
        f"/nodes?model=sha256:m&role=compute&after={KEY_A}": {"nodes": entries[1:], "next": None},
    }

    async def abci_query(path: str) -> Any:
        return pages[path]

    nodes = asyncio.run(read_nodes(path_query(abci_query), model="sha256:m", role="compute"))
    hop = Hop("http://node.example:9000", 1)  # KEY_B's, on the second page: free (0)
    assert prices_for(nodes, [hop]) == {hop.url: 0}


def test_a_nodes_file_may_name_its_committee(tmp_path: Path) -> None:
    path = tmp_path / "nodes.json"
    body: dict[str, Any] = {
        "manifest": "/m.json",
        "nodes": [{"url": "http://127.0.0.1:9001", "shard": 0, "layers": [0, 2]}],
    }
    path.write_text(json.dumps(body))
    assert NodesFile.load(path).committee_rpc is None
    path.write_text(json.dumps({**body, "committee_rpc": "http://127.0.0.1:26657/"}))
    loaded = NodesFile.load(path)
    assert loaded.committee_rpc == "http://127.0.0.1:26657"
    assert loaded.to_json()["committee_rpc"] == "http://127.0.0.1:26657"
    path.write_text(json.dumps({**body, "committee_rpc": "ftp://x"}))
    with pytest.raises(ConfigError, match="committee_rpc must be an http"):
        NodesFile.load(path)


def test_ask_help_says_which_prices_it_pays(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option: no hyphens wrapped
    with pytest.raises(SystemExit):
        cli.main(["ask", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--committee-rpc URL" in text and "never from its /info alone" in text
    assert "its /info price only under an explicit --min-credit-positions" in text
    assert "(price_unregistered)" in text
