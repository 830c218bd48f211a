"""The personal client's relays from the committee (node/client/relay_registry.py): `/relays`
answers parsed at the boundary, malformed entries refused by name without voiding the others,
broken pages ending the read, and every page of the in-process chain's real answer read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from abci_app.queries import query
from node.cli.overlay_args import CHAIN_RELAYS, relays_source
from node.client.relay_registry import (
    MalformedRelayEntry,
    MalformedRelaysAnswer,
    RelayList,
    parse_entry,
    read_chain_relays,
)
from protocol.errors import UnavailableError
from tests.committee_chain import Chain
from tests.unit.test_abci_relays import add_relay, relay_body, stake

pytestmark = pytest.mark.unit

KEY = "ab" * 32
GOOD = {"key": "01" * 32, "endpoint": "http://198.51.100.1:9100", "relay_key": KEY}


def entry(**changes: Any) -> dict[str, Any]:
    return {**GOOD, **changes}


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("not an object", "expected an object"),
        (entry(endpoint="http://relay.example:9100"), "endpoint"),
        (entry(endpoint="http://198.51.100.1:9100/"), "endpoint"),
        (entry(endpoint=7), "endpoint"),
        (entry(relay_key=KEY[:-2]), "relay_key"),
        (entry(relay_key=KEY.upper()), "relay_key"),
        ({"endpoint": GOOD["endpoint"]}, "relay_key"),
    ],
)
def test_a_malformed_entry_is_refused_by_name(bad: Any, reason: str) -> None:
    with pytest.raises(MalformedRelayEntry, match=reason):
        parse_entry(bad)


def test_bad_entries_never_void_the_good_ones() -> None:
    relays = RelayList()
    other = entry(endpoint="http://198.51.100.2:9100", relay_key="cd" * 32)
    page = {
        "relays": [
            entry(endpoint="http://x:1"),
            GOOD,
            None,
            entry(relay_key="zz"),
            other,
            entry(endpoint="http://198.51.100.3:9100"),  # GOOD's X25519 key again
            entry(relay_key="ef" * 32),  # GOOD's endpoint again
        ],
        "next": None,
    }
    assert relays.add_page(page, None) is None
    assert [hop.url for hop in relays.hops] == [GOOD["endpoint"], other["endpoint"]]
    assert relays.hops[0].key == bytes.fromhex(KEY)
    assert len(relays.refused) == 5
    assert "endpoint" in relays.refused[0] and "relay_key" in relays.refused[2]
    assert all("twice" in reason for reason in relays.refused[3:])


@pytest.mark.parametrize(
    "answer",
    [
        None,
        [],
        {"relays": {}, "next": None},
        {"next": None},
        {"relays": [], "next": "zz"},
        {"relays": [], "next": "11" * 32},  # not after the cursor it answered
        {"relays": [], "next": "22" * 32},  # the same cursor again: a loop
        {"relays": [GOOD] * 1001, "next": None},
    ],
)
def test_a_broken_page_ends_the_read_by_name(answer: Any) -> None:
    with pytest.raises(MalformedRelaysAnswer):
        RelayList().add_page(answer, "22" * 32)


async def test_every_page_of_the_chains_answer_is_read() -> None:
    chain = Chain(genesis={"heartbeat_timeout": 100})
    keys = [add_relay(chain, f"r{i}") for i in range(7)]
    for key in keys[1:]:  # r0 stays unstaked: not listed
        stake(chain, key)
    paths: list[str] = []

    async def ask(path: str) -> Any:
        paths.append(path)
        code, value, log = query(chain.state, path, b"")
        assert code == 0, log
        return json.loads(value)

    hops = await read_chain_relays(ask, limit=2)
    assert sorted(hop.url for hop in hops) == sorted(
        relay_body(f"r{i}").endpoint for i in range(1, 7)
    )
    assert len(paths) == 4  # 7 registered, 2 per page
    assert all("limit=2" in path for path in paths)


async def test_no_listed_relay_is_one_named_error() -> None:
    async def empty(path: str) -> Any:
        return {"relays": [entry(relay_key="bad")], "next": None}

    with pytest.raises(UnavailableError, match="lists no relay") as refused:
        await read_chain_relays(empty)
    assert "planet relay serve" in (refused.value.hint or "")


def test_relays_flag_chain_or_a_file() -> None:
    assert relays_source("chain") == CHAIN_RELAYS
    assert relays_source("./chain") == Path("chain")
    assert relays_source("relays.txt") == Path("relays.txt")
