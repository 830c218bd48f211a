"""`planet join` behind NAT (node/cli/nat.py) against an in-process relay on loopback: a reachable
endpoint is said reachable and registered as it is; one the relay cannot dial back gets a port
on the relay, said in one line; `auto` skips the check; a relay that fronts no node, or a URL
the committee does not list, end in one named error."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from harness.ports import ephemeral_port
from node.cli.nat import ListedRelay, decide, parse_listed
from node.relay.fronting import Fronting, install_fronting
from node.relay.relay import Relay, create_app
from protocol.errors import UnavailableError, UsageError

pytestmark = pytest.mark.unit


async def _relay(fronts: bool) -> tuple[web.AppRunner, ListedRelay]:
    private = PrivateKey.generate()
    app = create_app(Relay(private, allow_private=True))
    if fronts:
        first = ephemeral_port()
        install_fronting(app, Fronting(private, (first, first), "127.0.0.1"))
    runner = web.AppRunner(app)
    await runner.setup()
    port = ephemeral_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, ListedRelay(f"http://127.0.0.1:{port}", bytes(private.public_key), "ab" * 32)


@pytest.fixture
async def fronting() -> AsyncIterator[ListedRelay]:
    runner, relay = await _relay(True)
    yield relay
    await runner.cleanup()


def _can_bind(host: str) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, 0))
        except OSError:
            return False
    return True


async def test_reachable_endpoint_is_registered_as_it_is(fronting: ListedRelay) -> None:
    port = ephemeral_port()
    reach = await decide("check", [fronting], SigningKey.generate(), "127.0.0.1", port)
    assert reach.fronted is None
    assert f"https://127.0.0.1:{port} is reachable (relay {fronting.url}" in reach.line


async def test_unreachable_endpoint_is_fronted_by_the_relay(fronting: ListedRelay) -> None:
    """The node listens at 127.0.0.2 while the relay sees it come from 127.0.0.1: the dial
    back finds nothing there, as behind a NAT."""
    if not _can_bind("127.0.0.2"):
        pytest.skip("no 127.0.0.2 here")
    port = ephemeral_port()
    reach = await decide("check", [fronting], SigningKey.generate(), "127.0.0.2", port)
    assert reach.fronted is not None and reach.fronted.relay_url == fronting.url
    assert reach.fronted.endpoint.startswith("https://127.0.0.1:")
    assert reach.line.startswith(f"reachability: https://127.0.0.2:{port} is not reachable")
    assert f"reached at {reach.fronted.endpoint} through relay {fronting.url}" in reach.line
    assert "\n" not in reach.line


async def test_auto_fronts_without_asking_and_keeps_the_port(fronting: ListedRelay) -> None:
    key = SigningKey.generate()
    first = await decide("auto", [fronting], key, "127.0.0.1", ephemeral_port())
    again = await decide(fronting.url, [fronting], key, "127.0.0.1", ephemeral_port())
    assert first.fronted is not None and again.fronted == first.fronted
    with pytest.raises(UnavailableError) as full:  # the relay's one port is that node's
        await decide("auto", [fronting], SigningKey.generate(), "127.0.0.1", 1)
    assert "relay refused (full)" in full.value.message


async def test_off_registers_unchecked() -> None:
    reach = await decide("off", [], SigningKey.generate(), "203.0.113.7", 18100)
    assert reach.fronted is None and "not checked" in reach.line


async def test_no_fronting_relay_or_an_unlisted_url_is_one_named_error(
    fronting: ListedRelay,
) -> None:
    runner, plain = await _relay(False)
    try:
        with pytest.raises(UnavailableError) as refused:
            await decide("auto", [plain], SigningKey.generate(), "127.0.0.1", 1)
        assert "no listed relay fronts nodes" in refused.value.message and refused.value.hint
    finally:
        await runner.cleanup()
    with pytest.raises(UsageError):
        await decide("http://192.0.2.1:9100", [fronting], SigningKey.generate(), "127.0.0.1", 1)


def test_listed_entries_are_parsed_strictly() -> None:
    entry = {"endpoint": "http://203.0.113.7:9100", "relay_key": "cd" * 32, "key": "ab" * 32}
    assert parse_listed(entry).key == "ab" * 32
    for bad in ({**entry, "key": "AB" * 32}, {**entry, "endpoint": "http://x:1"}, {}):
        with pytest.raises(Exception) as refused:
            parse_listed(bad)
        assert getattr(refused.value, "code", "") == "relay_entry_malformed"


async def test_auto_claims_a_second_relay_for_clients_to_fall_over_to(
    fronting: ListedRelay,
) -> None:
    runner, other = await _relay(True)
    try:
        key = SigningKey.generate()
        reach = await decide("auto", [fronting, other], key, "127.0.0.1", ephemeral_port())
        assert {r.relay_url for r in reach.relays} == {fronting.url, other.url}
        first, second = reach.relays
        assert reach.fronted == first and first.endpoint != second.endpoint
        assert f"also at {second.endpoint} through relay {second.relay_url}" in reach.line
        named = await decide(other.url, [fronting, other], key, "127.0.0.1", ephemeral_port())
        assert [r.relay_url for r in named.relays] == [other.url]  # that relay only
    finally:
        await runner.cleanup()
