"""Which node keys a rendezvous relay fronts (node/relay/admission.py, node/relay/fronting.py):
a stranger with fresh keys holds no more than its leases (per address and in all), a staked node
still gets a port while strangers flood the relay, a lease that runs out frees its port (and
closes its link) unless the key is registered by then, and the committee's word is read from
`/node` and `/params` (an in-process fake committee; the relay over loopback)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from harness.ports import ephemeral_port, port_free
from node.relay.admission import (
    Standing,
    committee_standing,
    min_stakes,
    standing_of,
)
from node.relay.fronting import PORTS_FILE, Fronting, install_fronting
from node.relay.relay import Relay, create_app
from node.server.rendezvous import RendezvousLink, RendezvousRelay, claim_port
from protocol.errors import UnavailableError
from protocol.rendezvous import RefuseCode, Refused

pytestmark = pytest.mark.unit

MIN = {"compute": 10**18, "verifier": 5 * 10**17}


def _key() -> str:
    return os.urandom(32).hex()


def _view(role: str = "compute", status: str = "SERVING", stake: Any = str(10**18)) -> dict:
    return {"key": _key(), "role": role, "status": status, "stake": stake}


@pytest.mark.parametrize(
    ("view", "standing"),
    [
        (None, Standing.STRANGER),  # not registered
        (_view(), Standing.MEMBER),
        (_view(status="JOIN"), Standing.MEMBER),  # staked, first heartbeat to come
        (_view(status="DOWN"), Standing.MEMBER),  # a member restarting keeps its port
        (_view(role="verifier", stake=str(5 * 10**17)), Standing.MEMBER),
        (_view(status="JOIN", stake=None), Standing.PENDING),  # registered, stake to come
        (_view(stake=str(10**18 - 1)), Standing.PENDING),  # below its role's minimum
        (_view(stake="1e30"), Standing.PENDING),  # not an amount the app writes
        (_view(stake="١" * 19), Standing.PENDING),  # other scripts' digits: int() reads them
        (_view(stake="9" * 5000), Standing.PENDING),  # past int()'s digit limit, no raise
        (_view(stake=True), Standing.PENDING),
        (_view(stake=10**18), Standing.MEMBER),
        (_view(status="LEFT"), Standing.STRANGER),
        (_view(role="relay"), Standing.STRANGER),  # relays are not fronted
        ("not a view", Standing.STRANGER),
    ],
)
def test_standing_of_a_node_view(view: Any, standing: Standing) -> None:
    assert standing_of(view, MIN) is standing


def test_min_stakes_keep_only_node_roles_in_ascii_digits() -> None:
    params = {"genesis": {"min_stake": {"compute": "7", "verifier": "٣", "relay": "1"}}}
    assert min_stakes(params) == {"compute": 7}
    assert min_stakes({"genesis": None}) == {}


class FakeCommittee:
    """`/node` and `/params` as CommitteeLink answers them; `down`: no validator answers."""

    def __init__(self) -> None:
        self.views: dict[str, dict[str, Any]] = {}
        self.down = False
        self.reads = 0

    def register(self, key: str, *, staked: bool) -> None:
        self.views[key] = {
            "key": key,
            "role": "compute",
            "status": "SERVING" if staked else "JOIN",
            "stake": str(10**18) if staked else None,
        }

    async def node(self, key: str) -> dict[str, Any] | None:
        self.reads += 1
        if self.down:
            raise UnavailableError("no committee validator answered /node")
        return self.views.get(key)

    async def params(self) -> dict[str, Any]:
        if self.down:
            raise UnavailableError("no committee validator answered /params")
        return {"genesis": {"min_stake": {"compute": str(10**18)}}}


async def test_committee_standing_reads_the_registry_silent_committee_is_a_stranger() -> None:
    committee = FakeCommittee()
    staked, joining, stranger = _key(), _key(), _key()
    committee.register(staked, staked=True)
    committee.register(joining, staked=False)
    look_up = committee_standing(committee)
    assert await look_up(staked) is Standing.MEMBER
    assert await look_up(joining) is Standing.PENDING
    assert await look_up(stranger) is Standing.STRANGER
    committee.down = True
    assert await look_up(staked) is Standing.STRANGER


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _fronting(committee: FakeCommittee, clock: Clock, **kw: Any) -> Fronting:
    return Fronting(
        PrivateKey.generate(),
        kw.pop("ports", (44000, 44007)),
        "h",
        per_address=64,
        look_up=committee_standing(committee),
        lease_s=60.0,
        clock=clock,
        **kw,
    )


async def _admit(fronting: Fronting, key: str, address: str, wanted: int = 0) -> Any:
    """What `Fronting.serve` does after a HELLO checks: ask the committee, then admit."""
    standing = Standing.MEMBER if key in fronting.assigned else await fronting.look_up(key)
    return fronting.admit(key, address, wanted, standing)


async def test_stranger_with_fresh_keys_holds_no_more_than_its_leases() -> None:
    committee, clock = FakeCommittee(), Clock()
    fronting = _fronting(committee, clock)  # 8 ports: 2 leases in all, 2 per address
    from_a = [await _admit(fronting, _key(), "10.0.0.1") for _ in range(20)]
    assert from_a[:2] == [44000, 44001]
    assert set(from_a[2:]) == {RefuseCode.NOT_REGISTERED}
    from_others = [await _admit(fronting, _key(), f"10.0.1.{i}") for i in range(20)]
    assert set(from_others) == {RefuseCode.NOT_REGISTERED}  # the relay's leases are all out
    assert len(fronting.leases) == 2 and fronting.assigned == {}


async def test_staked_nodes_get_every_other_port_while_strangers_flood() -> None:
    committee, clock = FakeCommittee(), Clock()
    fronting = _fronting(committee, clock)
    for i in range(40):
        await _admit(fronting, _key(), f"10.0.2.{i % 5}")
    members = [_key() for _ in range(6)]
    for key in members:
        committee.register(key, staked=True)
    # the flooder's own address too: a member is not counted against the leases
    ports = [await _admit(fronting, key, "10.0.2.0") for key in members]
    assert sorted(ports) == list(range(44002, 44008))
    assert fronting.assigned == dict(zip(members, ports, strict=True))
    assert await _admit(fronting, members[0], "10.0.2.0") == ports[0]  # one port per key


async def test_registered_not_staked_key_leases_and_is_renewed_until_staked(
    tmp_path: Path,
) -> None:
    committee, clock = FakeCommittee(), Clock()
    fronting = _fronting(committee, clock, home=tmp_path)
    key = _key()
    port = await _admit(fronting, key, "10.0.3.1")  # `planet join` claims before it registers
    assert key in fronting.leases and key not in fronting.assigned
    committee.register(key, staked=False)
    clock.now += 61
    await fronting.sweep()
    assert fronting.leases[key].expires == clock.now + 60  # renewed: its stake is on the way
    committee.register(key, staked=True)
    clock.now += 61
    await fronting.sweep()
    assert fronting.assigned == {key: port} and fronting.leases == {}
    assert json.loads((tmp_path / PORTS_FILE).read_text()) == {key: port}


async def test_linking_again_does_not_renew_a_lease() -> None:
    committee, clock = FakeCommittee(), Clock()
    fronting = _fronting(committee, clock)
    key = _key()
    port = await _admit(fronting, key, "10.0.4.1")
    expires = fronting.leases[key].expires
    clock.now += 30
    assert await _admit(fronting, key, "10.0.4.1") == port  # claim_port, then the node's link
    assert fronting.leases[key].expires == expires


async def test_lease_running_out_unregistered_frees_the_port() -> None:
    committee, clock = FakeCommittee(), Clock()
    fronting = _fronting(committee, clock)
    keys = [_key(), _key()]
    ports = [await _admit(fronting, k, "10.0.5.1") for k in keys]
    assert await _admit(fronting, _key(), "10.0.5.1") is RefuseCode.NOT_REGISTERED
    clock.now += 59
    await fronting.sweep()
    assert set(fronting.leases) == set(keys)  # not run out yet
    clock.now += 2
    await fronting.sweep()
    assert fronting.leases == {}
    assert await _admit(fronting, _key(), "10.0.5.1") == ports[0]  # free again


async def test_key_whose_lease_ran_out_gets_its_port_again_when_free() -> None:
    """A node whose model loads for longer than the lease relinks after it ran out: it asks
    for any port and gets the one it claimed (and registered), not the lowest free."""
    committee, clock = FakeCommittee(), Clock()
    fronting = _fronting(committee, clock)
    early, slow = _key(), _key()
    await _admit(fronting, early, "10.0.7.1")
    port = await _admit(fronting, slow, "10.0.7.2")
    assert port == 44001
    clock.now += 61
    await fronting.sweep()  # neither registered: both leases end, both ports free
    assert await _admit(fronting, slow, "10.0.7.2") == port


async def test_kept_port_of_a_key_no_longer_staked_is_taken_back_for_a_member() -> None:
    committee, clock = FakeCommittee(), Clock()
    fronting = _fronting(committee, clock, ports=(44000, 44001))
    old = [_key(), _key()]
    fronting.assigned = {old[0]: 44000, old[1]: 44001}  # e.g. kept by a relay fronting any key
    newcomer = _key()
    committee.register(newcomer, staked=True)
    committee.register(old[1], staked=True)
    assert await _admit(fronting, newcomer, "10.0.6.1") is RefuseCode.FULL
    assert await fronting.reclaim() == 1
    assert await _admit(fronting, newcomer, "10.0.6.1") == 44000
    assert fronting.assigned == {old[1]: 44001, newcomer: 44000}


# -- over loopback: the relay's /v1/rendezvous and the node's link ------------------------------


class Relay1:
    def __init__(self, fronting: Fronting, url: str) -> None:
        self.fronting, self.url = fronting, url
        self.target = RendezvousRelay(url, bytes(fronting.private.public_key))


@pytest.fixture
async def relay() -> AsyncIterator[tuple[Relay1, FakeCommittee, Clock]]:
    committee, clock = FakeCommittee(), Clock()
    first = ephemeral_port()
    while not all(port_free(first + i) for i in range(1, 8)):
        first = ephemeral_port()
    fronting = Fronting(
        PrivateKey.generate(),
        (first, first + 7),
        "127.0.0.1",
        look_up=committee_standing(committee),
        lease_s=60.0,
        clock=clock,
    )
    app = create_app(Relay(fronting.private, allow_private=True))
    install_fronting(app, fronting)
    runner = web.AppRunner(app)
    await runner.setup()
    port = ephemeral_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield Relay1(fronting, f"http://127.0.0.1:{port}"), committee, clock
    finally:
        await runner.cleanup()


async def test_relay_refuses_fresh_keys_past_the_bound_by_name_and_fronts_a_staked_node(
    relay: tuple[Relay1, FakeCommittee, Clock],
) -> None:
    front, committee, _ = relay
    async with aiohttp.ClientSession() as http:
        got: list[Any] = []
        for _ in range(5):
            try:
                got.append((await claim_port(http, front.target, SigningKey.generate())).port)
            except Refused as error:
                got.append(error)
        assert len([g for g in got if isinstance(g, int)]) == 2
        refused = [g for g in got if not isinstance(g, int)]
        assert {r.refusal for r in refused} == {RefuseCode.NOT_REGISTERED}
        assert refused[0].code == "rendezvous_refused" and "not_registered" in refused[0].message
        member = SigningKey.generate()
        committee.register(member.verify_key.encode().hex(), staked=True)
        welcome = await claim_port(http, front.target, member)
        assert welcome.port not in got
        assert front.fronting.assigned == {member.verify_key.encode().hex(): welcome.port}


async def test_lease_running_out_closes_the_strangers_link(
    relay: tuple[Relay1, FakeCommittee, Clock],
) -> None:
    front, _, clock = relay
    server = await asyncio.start_server(lambda _r, w: w.close(), "127.0.0.1", 0)
    local = server.sockets[0].getsockname()[:2]
    up = asyncio.Event()
    async with server, aiohttp.ClientSession() as http:
        link = RendezvousLink(
            front.target, SigningKey.generate(), local, reached=lambda _r, _w: up.set()
        )
        task = asyncio.create_task(link.run(http))
        try:
            async with asyncio.timeout(10):
                await up.wait()
            key = link.node_key.verify_key.encode().hex()
            assert key in front.fronting.leases and key in front.fronting.nodes
            clock.now += 61
            await front.fronting.sweep()
            assert key not in front.fronting.leases  # the port is free
            async with asyncio.timeout(10):
                while key in front.fronting.nodes:  # and the link is gone
                    await asyncio.sleep(0.02)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
