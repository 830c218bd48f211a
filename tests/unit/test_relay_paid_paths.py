"""Relays paid for the cloves that arrived, end to end in one process (issue 43): the client's
real `OverlayLink` over real `Relay`s (aiohttp on loopback) to a real `OverlayDoor` whose links
echo what they get. The door acknowledges what each path delivered; the client pays each
path's relays exactly floor(clove bytes that arrived / rate) credits, each in a PAY cell only that
relay opens; a relay that drops cloves is not paid for that path; a replayed PAY pays nothing;
no credit goes to two relays; a link hung up mid-answer leaves every path paid for what it
delivered and nothing more; a node cannot make the client pay for cloves it never sent; and a
relay redeems what it holds, dropping by name what the committee refuses."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from nacl.public import PrivateKey

from harness.ports import ephemeral_port
from node.client.overlay import OverlayLink
from node.client.relay_paying import RelayPurse, parse_rate
from node.relay.earnings import Earnings
from node.relay.redeem import redeem_held
from node.relay.relay import Link as RelayLink
from node.relay.relay import Path as RelayPath
from node.relay.relay import Relay, create_app
from node.server.overlay import DOOR_KEY, OverlayDoor, overlay
from protocol.blind_bls import ThresholdCredit
from protocol.errors import ProtocolError
from protocol.overlay import Cell, CellKind, Hop
from protocol.paid_credits import spent_id
from protocol.relay_pay import Acks, PayInvalid, PayMisdirected, wrap_pay
from tests.credit_fakes import fake_credits

pytestmark = pytest.mark.unit

RATE = 1024  # clove bytes per credit


class Wallet:
    """The user's credits as the purse sees them (take / give back), in memory."""

    def __init__(self, count: int) -> None:
        self.credits = fake_credits(count)
        self.given: list[ThresholdCredit] = []

    def take(self, n: int) -> list[ThresholdCredit]:
        if n > len(self.credits):
            raise ProtocolError(f"the wallet holds {len(self.credits)} credits, {n} asked")
        out, self.credits = self.credits[:n], self.credits[n:]
        self.given += out
        return out

    def give_back(self, credits: Sequence[ThresholdCredit]) -> None:
        self.credits = [*credits, *self.credits]
        for credit in credits:
            self.given.remove(credit)

    def purse(self) -> RelayPurse:
        return RelayPurse(RATE, self.take, self.give_back)


class Dropper(Relay):
    """A relay that forwards set-up but drops every DATA cell it should pass on."""

    async def inbound(self, ws: Any, cell: Cell) -> None:
        if cell.kind is CellKind.DATA:
            return
        await super().inbound(ws, cell)


async def echo(link: Any, _caller: str) -> None:
    async for message in link:
        if message.type == aiohttp.WSMsgType.BINARY:
            await link.send_bytes(message.data)


class Net:
    def __init__(self) -> None:
        self.runners: list[web.AppRunner] = []
        self.relays: list[Relay] = []
        self.hops: list[Hop] = []
        self.node_url = ""

    async def serve(self, app: web.Application) -> str:
        runner = web.AppRunner(app, shutdown_timeout=0.2)
        await runner.setup()
        port = ephemeral_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        self.runners.append(runner)
        return f"http://127.0.0.1:{port}"

    async def start(self, relays: int, droppers: Sequence[int] = ()) -> None:
        door = OverlayDoor(None, None, serve=echo)  # type: ignore[arg-type]
        app = web.Application()
        app[DOOR_KEY] = door
        app.router.add_get("/v1/overlay", overlay)
        self.door = door
        self.node_url = await self.serve(app)
        for i in range(relays):
            private = PrivateKey.generate()
            kind = Dropper if i in droppers else Relay
            relay = kind(private, allow_private=True)
            self.relays.append(relay)
            url = await self.serve(create_app(relay))
            self.hops.append(Hop(url, bytes(private.public_key)))

    async def stop(self) -> None:
        for relay in self.relays:  # their links to next hops first: nothing waits on them
            await relay.close()
        for runner in reversed(self.runners):
            await runner.cleanup()

    def paths(self, n: int, length: int) -> list[list[Hop]]:
        return [self.hops[i * length : (i + 1) * length] for i in range(n)]

    def relay_of(self, hop: Hop) -> Relay:
        return self.relays[self.hops.index(hop)]


class FakeConfig:
    max_request_bytes = 4 * 1024 * 1024


@contextlib.asynccontextmanager
async def network(relays: int, droppers: Sequence[int] = ()) -> AsyncIterator[Net]:
    net = Net()
    try:
        await net.start(relays, droppers)
        net.door.config = FakeConfig()  # type: ignore[assignment]
        yield net
    finally:
        await net.stop()


async def exchange(link: OverlayLink, count: int) -> list[bytes]:
    got = []
    for i in range(count):
        await link.send_bytes(b"message %d" % i + os.urandom(40))
        message = await asyncio.wait_for(link.__anext__(), 10)
        got.append(message.data)
    return got


def expected_pay(link: OverlayLink, index: int) -> int:
    path = link.paths[index]
    return (path.acked + path.delivered_bytes) // RATE


def earned(net: Net, hops: Sequence[Hop]) -> list[int]:
    return [net.relay_of(hop).earnings.received for hop in hops]


async def settle_down() -> None:
    for _ in range(15):  # PAY cells in flight reach their relays
        await asyncio.sleep(0.02)


async def test_each_relay_is_paid_for_the_cloves_its_path_delivered_and_no_credit_twice() -> None:
    async with network(8) as net, aiohttp.ClientSession() as http:
        wallet = Wallet(200)
        paths = net.paths(4, 2)
        link = OverlayLink(http, paths, net.node_url, k=3, purse=wallet.purse())
        await link.__aenter__()
        assert len(await exchange(link, 40)) == 40
        await link.close()
        await settle_down()
        assert link.acks >= 2  # every ACK_EVERY messages, and the last one at the close
        for i, path in enumerate(link.paths):
            assert path.acked == path.sent > 41 * 100  # 40 messages and the CLOSE, all arrived
            assert path.delivered >= 40 and path.delivered_bytes > 40 * 100
            owed = expected_pay(link, i)
            assert owed > 0 and path.paid == [owed, owed]
            assert earned(net, paths[i]) == [owed, owed]
        paid = sum(net.relay_of(hop).earnings.received for hop in net.hops)
        assert paid == len(wallet.given) == 200 - len(wallet.credits)
        held = [spent_id(c) for relay in net.relays for c in relay.earnings.pending()]
        assert len(held) == len(set(held)) == paid  # no credit given to two relays
        # a link that went on paying after the close pays nothing more
        assert await link.pay() == 0


async def test_a_relay_that_drops_cloves_is_not_paid_for_that_path() -> None:
    async with network(8, droppers=[5]) as net, aiohttp.ClientSession() as http:
        wallet = Wallet(200)
        paths = net.paths(4, 2)  # relay 5 is path 2's second relay
        link = OverlayLink(http, paths, net.node_url, k=3, purse=wallet.purse())
        await link.__aenter__()
        assert len(await exchange(link, 35)) == 35
        await link.close()
        await settle_down()
        assert link.paths[2].acked == 0 and link.paths[2].delivered == 0
        assert earned(net, paths[2]) == [0, 0]  # neither relay of the dropping path
        for i in (0, 1, 3):
            owed = expected_pay(link, i)
            assert owed > 0 and earned(net, paths[i]) == [owed, owed]


async def test_a_hang_up_mid_answer_leaves_each_path_paid_for_what_it_delivered() -> None:
    async with network(8) as net, aiohttp.ClientSession() as http:
        wallet = Wallet(200)
        paths = net.paths(4, 2)
        link = OverlayLink(http, paths, net.node_url, k=3, purse=wallet.purse())
        await link.__aenter__()
        await exchange(link, 34)  # one acknowledgement came (ACK_EVERY = 32)
        await settle_down()
        # path 3's first relay goes away mid-answer: its path is torn down
        runner = net.runners[1 + net.hops.index(paths[3][0])]
        await runner.cleanup()
        await settle_down()
        paid_before = list(link.paths[3].paid)
        await exchange(link, 5)
        await link.close()  # the user hangs up
        await settle_down()
        assert link.paths[3].paid == paid_before  # nothing more once torn down
        assert earned(net, paths[3])[1] == paid_before[1]
        for i in range(3):
            owed = expected_pay(link, i)
            assert earned(net, paths[i]) == [owed, owed]
        assert sum(sum(p.paid) for p in link.paths) == len(wallet.given)


async def test_a_node_cannot_make_the_client_pay_for_cloves_it_did_not_send() -> None:
    async with aiohttp.ClientSession() as http:
        link = OverlayLink(http, [[Hop("http://x", b"\0" * 32)]] * 4, "http://n", k=3)
        for path, sent in zip(link.paths, (5, 0, 9, 2), strict=True):
            path.sent = sent
        link._acknowledged(Acks((10**9, 10**9, 3, 10**9)).to_bytes())
        assert [p.acked for p in link.paths] == [5, 0, 3, 2]
        link._acknowledged(Acks((1, 1, 1, 1)).to_bytes())  # counts never go back
        assert [p.acked for p in link.paths] == [5, 0, 3, 2]
        link._acknowledged(Acks((9, 9)).to_bytes())  # another link's shape: refused
        link._acknowledged(b"\x04")  # malformed: refused by name, nothing changes
        assert [p.acked for p in link.paths] == [5, 0, 3, 2] and link.acks == 2


class FakeWs:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = False

    async def send_bytes(self, data: bytes) -> None:
        self.sent.append(data)


async def test_a_replayed_or_misdirected_pay_cell_pays_nothing_and_ends_no_path() -> None:
    relay = Relay(PrivateKey.generate())
    inbound, outbound = FakeWs(), FakeWs()
    key = os.urandom(32)
    link = RelayLink("http://next/v1/overlay", outbound)  # type: ignore[arg-type]
    path = RelayPath(key, inbound, 7, outbound=link, out_id=9, exit=True)
    relay.paths[(id(inbound), 7)] = path
    credits = fake_credits(2, first=50)
    cell = Cell(CellKind.PAY, 7, wrap_pay([key], [0], 0, credits))
    await relay.inbound(inbound, cell)
    assert relay.earnings.received == 2
    with pytest.raises(PayInvalid):  # the same cell again
        await relay.inbound(inbound, cell)
    assert relay.earnings.received == 2 and relay.paths[(id(inbound), 7)] is path
    # a note for a relay after the exit
    onward = Cell(CellKind.PAY, 7, wrap_pay([key, os.urandom(32)], [1, 0], 1, credits))
    with pytest.raises(PayMisdirected):
        await relay.inbound(inbound, onward)
    # the same credits in a fresh, valid note: taken once only (pay_replayed)
    again = Cell(CellKind.PAY, 7, wrap_pay([key], [1], 0, credits))
    await relay.inbound(inbound, again)
    assert relay.earnings.received == 2 and relay.earnings.refused == 2
    # a middle relay passes a note for the next relay on, sealed, and keeps nothing
    middle = Relay(PrivateKey.generate())
    mid_in, mid_out = FakeWs(), FakeWs()
    k1, k2 = os.urandom(32), os.urandom(32)
    mid_link = RelayLink("http://next/v1/relay", mid_out)  # type: ignore[arg-type]
    middle.paths[(id(mid_in), 3)] = RelayPath(k1, mid_in, 3, outbound=mid_link, out_id=11)
    await middle.inbound(mid_in, Cell(CellKind.PAY, 3, wrap_pay([k1, k2], [0, 0], 1, credits)))
    assert middle.earnings.received == 0
    [forwarded] = mid_out.sent
    passed = Cell.from_bytes(forwarded)
    assert passed.kind is CellKind.PAY and passed.path == 11
    assert not any(c.nonce in passed.body for c in credits)


class FakeCommittee:
    """`relay_redeem` answers in order: (code, log) per send."""

    def __init__(self, answers: list[tuple[int, str]]) -> None:
        self.answers = answers
        self.sent: list[Any] = []

    async def send(self, body: Any, *, timeout_s: float = 15.0) -> tuple[int, str]:
        self.sent.append(body)
        return self.answers.pop(0)


async def test_the_relay_redeems_and_drops_by_name_what_the_committee_refuses(tmp_path) -> None:
    earnings = Earnings(tmp_path / "relay-credits")
    credits = fake_credits(3, first=70)
    earnings.take(credits)
    assert len(list((tmp_path / "relay-credits").glob("*.json"))) == 3
    restarted = Earnings(tmp_path / "relay-credits").pending()  # kept across a restart
    assert sorted(restarted, key=spent_id) == sorted(credits, key=spent_id)
    committee = FakeCommittee([(78, "credit 1: already redeemed"), (0, "")])
    done = await redeem_held(committee, earnings)
    assert done.credits == 2 and done.refused == {"CREDIT_SPENT": 1}
    assert [len(body.credits) for body in committee.sent] == [3, 2]
    assert not earnings.pending() and not list((tmp_path / "relay-credits").glob("*.json"))
    # the committee away or the relay refused as a whole: everything kept for the next pass
    earnings.take(fake_credits(2, first=90))
    done = await redeem_held(FakeCommittee([(10, "node is not registered")]), earnings)
    assert done.credits == 0 and len(earnings.pending()) == 2


def test_the_relay_rate_is_read_from_the_chain_answer_and_checked() -> None:
    assert parse_rate({"relay_bytes": 16}) == 16
    for bad in ({}, {"relay_bytes": 0}, {"relay_bytes": True}, {"relay_bytes": "16"}, []):
        with pytest.raises(ProtocolError) as caught:
            parse_rate(bad)
        assert caught.value.code == "relay_rate_invalid"


async def test_the_node_acknowledges_each_intact_clove_once() -> None:
    """An exit repeating a clove, or sending one altered after its message was whole, does
    not raise its path's count: the node counts distinct cloves that agree with the message."""
    from dataclasses import replace

    from protocol import sida
    from protocol.overlay import LinkMessage, MessageKind

    served: list[Any] = []

    async def keep(link: Any, _caller: str) -> None:
        served.append(link)
        async for _ in link:
            pass

    door = OverlayDoor(None, None, serve=keep)  # type: ignore[arg-type]
    ident = os.urandom(16)
    for sequence in range(2):
        message = LinkMessage(ident, sequence, MessageKind.BINARY, b"x" * 50).to_bytes()
        cloves = sida.disperse(message, 4, 3)
        for clove in (cloves[0], cloves[0], cloves[1], cloves[2], cloves[2], cloves[3]):
            door.clove("exit", clove.index, clove.to_bytes())  # type: ignore[arg-type]
        altered = replace(cloves[1], block=bytes(len(cloves[1].block)))
        door.clove("exit", 1, altered.to_bytes())  # type: ignore[arg-type]
    await asyncio.sleep(0)
    [link] = served
    sizes = [2 * len(clove.to_bytes()) for clove in cloves]  # both messages' are alike
    assert link.received == sizes
    assert link.acks_now() == Acks(tuple(sizes))
    await door.close()


async def test_a_serving_relay_redeems_what_it_is_paid_until_stopped(tmp_path) -> None:
    from node.relay.redeem import keep_redeeming
    from protocol.errors import UnavailableError

    earnings = Earnings(tmp_path / "relay-credits")
    earnings.take(fake_credits(2, first=120))

    class Flaky(FakeCommittee):
        async def send(self, body: Any, *, timeout_s: float = 15.0) -> tuple[int, str]:
            if not self.sent:
                self.sent.append(None)
                raise UnavailableError("no validator answered")  # kept for the next pass
            return await super().send(body, timeout_s=timeout_s)

    committee = Flaky([(0, ""), (0, "")])
    stop = asyncio.Event()
    task = asyncio.create_task(keep_redeeming(committee, earnings, stop, every_s=0.01))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if not earnings.pending():
            break
    assert not earnings.pending() and len(committee.sent[1].credits) == 2
    earnings.take(fake_credits(1, first=130))  # paid while stopping: redeemed once more
    stop.set()
    await asyncio.wait_for(task, 5)
    assert not earnings.pending() and len(committee.sent) == 3
