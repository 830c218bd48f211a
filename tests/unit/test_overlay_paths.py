"""How the overlay's client draws its paths (node/client/overlay.py `choose_paths`,
`OverlayRoute`) and keeps its entry relays (node/client/relay_guards.py)."""

from __future__ import annotations

import json

import pytest

from node.client.overlay import OverlayRoute, choose_paths, network_of
from node.client.relay_guards import ROTATE_S, RelayGuards
from protocol.errors import UsageError
from protocol.overlay import Hop

pytestmark = pytest.mark.unit


def relay(host: str, port: int = 9100) -> Hop:
    return Hop(f"http://{host}:{port}", bytes([port % 256]) * 32)


TWO_NETWORKS = [relay(f"198.{51 + i % 2}.0.{i}", 9000 + i) for i in range(12)]


def test_paths_share_no_relay_and_mix_networks() -> None:
    for _ in range(50):
        paths = choose_paths(TWO_NETWORKS, n=4, length=2)
        urls = [hop.url for path in paths for hop in path]
        assert len(urls) == len(set(urls)) == 8
        for path in paths:  # two /16s are offered: no path stays in one
            assert len({network_of(hop.url) for hop in path}) == 2
    assert network_of("http://198.51.7.9:1") == "198.51.0.0/16"
    assert network_of("http://[2001:db8::1]:1") == "2001:db8::/32"
    assert network_of("http://relay.example:1") == "relay.example"
    with pytest.raises(UsageError, match="need 12 distinct relays"):
        choose_paths(TWO_NETWORKS[:11], n=4, length=3)


def test_one_network_still_gives_paths() -> None:
    same = [relay("203.0.113.1", 9000 + i) for i in range(6)]
    assert len(choose_paths(same, n=3, length=2)) == 3


def test_guards_enter_every_path_and_are_kept_across_runs(tmp_path) -> None:
    file = tmp_path / "relay-guards.json"
    now = [1_000_000.0]
    guards = RelayGuards(file, clock=lambda: now[0])
    route = OverlayRoute(tuple(TWO_NETWORKS), paths=4, needed=3, length=2, guards=guards)
    first = [path[0].url for path in route.draw()]
    for _ in range(20):  # the same entries, the rest drawn afresh
        assert [path[0].url for path in route.draw()] == first
    assert file.stat().st_mode & 0o777 == 0o600
    again = RelayGuards(file, clock=lambda: now[0])  # the next run
    route = OverlayRoute(tuple(TWO_NETWORKS), paths=4, needed=3, length=2, guards=again)
    assert [path[0].url for path in route.draw()] == first
    # a suspected guard is replaced, alone
    route.avoided.add(first[1])
    replaced = [path[0].url for path in route.draw()]
    assert replaced[0] == first[0] and replaced[2:] == first[2:] and replaced[1] != first[1]
    assert first[1] not in {hop.url for path in route.draw() for hop in path}
    # every guard is drawn again once it is due
    now[0] += ROTATE_S
    route.draw()
    assert all(g.drawn_at == int(now[0]) for g in again.guards)


def test_a_guard_that_leaves_the_list_or_changes_key_is_replaced(tmp_path) -> None:
    guards = RelayGuards(tmp_path / "g.json")
    kept = guards.entries(TWO_NETWORKS, 4, set())
    rekeyed = [Hop(h.url, b"\x01" * 32) if h.url == kept[0].url else h for h in TWO_NETWORKS]
    assert kept[0] not in guards.entries(rekeyed, 4, set())
    gone = [h for h in TWO_NETWORKS if h.url != kept[1].url]
    assert kept[1].url not in {h.url for h in guards.entries(gone, 4, set())}


@pytest.mark.parametrize(
    "text",
    ["not json", '{"version": 2, "guards": []}', '{"version": 1, "guards": [{"url": 5}]}',
     '{"version": 1, "guards": [{"url": "ftp://x", "key": "00", "drawn_at": 1}]}'],
)  # fmt: skip
def test_a_bad_guards_file_is_not_trusted(tmp_path, text: str, caplog) -> None:
    file = tmp_path / "relay-guards.json"
    file.write_text(text)
    guards = RelayGuards(file)
    assert guards.guards == [] and "not trusted" in caplog.text
    assert len(guards.entries(TWO_NETWORKS, 4, set())) == 4
    assert json.loads(file.read_text())["version"] == 1  # rewritten whole
