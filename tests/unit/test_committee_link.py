"""CommitteeLink: failover across validator RPCs, nonces, and answers lost to timeouts."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from nacl.signing import SigningKey

from node.chain.committee_link import CommitteeLink
from node.chain.committee_pages import BadPage
from node.chain.committee_rpc import BroadcastResult, TxRejectedError, TxResult, tx_hash
from protocol.committee.envelope import decode
from protocol.committee.registry import Heartbeat
from protocol.errors import RemoteError, UnavailableError

pytestmark = pytest.mark.unit


DROPPED = -1  # FakeRpc.delivered: the tx never reaches a block (evicted on recheck)


@dataclass
class FakeRpc:
    """Stands in for one validator's CommitteeRpc."""

    url: str
    down: bool = False
    committed_nonce: int = 4
    answers: list[Any] = field(default_factory=list)  # queued exceptions for broadcast
    broadcast: list[bytes] = field(default_factory=list)
    delivered: list[int] = field(default_factory=list)  # queued FinalizeBlock codes (else 0)
    landed: dict[str, TxResult] = field(default_factory=dict)
    dropped: set[str] = field(default_factory=set)

    def _check(self) -> None:
        if self.down:
            raise UnavailableError(f"{self.url} down")

    async def abci_query(self, path: str, data: bytes = b"") -> Any:
        self._check()
        if path.startswith("/nonce"):
            return {"account": "x", "nonce": self.committed_nonce}
        if path.startswith("/node"):
            raise RemoteError(self.url, "query_42", "not registered")
        return {}

    async def broadcast_tx_sync(self, raw: bytes) -> BroadcastResult:
        self._check()
        await asyncio.sleep(0)  # a real RPC yields here: concurrent submits interleave
        self.broadcast.append(raw)
        if self.answers:
            raise self.answers.pop(0)
        return BroadcastResult(hash=tx_hash(raw))

    async def tx(self, hash_hex: str) -> TxResult | None:
        """The last broadcast tx goes into a block when first looked up, with the next queued
        code (`DROPPED`: another signer's tx used its nonce and it left the mempool)."""
        self._check()
        last = self.broadcast[-1]
        if tx_hash(last) != hash_hex:
            return self.landed.get(hash_hex)
        if hash_hex not in self.landed and hash_hex not in self.dropped:
            code = self.delivered.pop(0) if self.delivered else 0
            # the block used the tx's nonce: that tx's own, or another signer's tx with it
            self.committed_nonce = decode(last).nonce
            if code == DROPPED:
                self.dropped.add(hash_hex)
            else:
                self.landed[hash_hex] = TxResult(hash_hex, 9, 0, code, "taken" if code else "")
        return self.landed.get(hash_hex)

    async def status(self) -> Any:
        self._check()
        return type("Status", (), {"latest_block_height": 7})()

    async def close(self) -> None:
        return None


def _link(*rpcs: FakeRpc) -> CommitteeLink:
    link = CommitteeLink([r.url for r in rpcs], SigningKey(b"\x01" * 32))
    link._clients = list(rpcs)  # type: ignore[assignment]
    return link


async def test_link_fails_over_to_the_next_validator_and_stays_there() -> None:
    first, second = FakeRpc("http://a", down=True), FakeRpc("http://b")
    link = _link(first, second)
    submitted = await link.submit(Heartbeat())
    assert submitted.nonce == 5 and len(second.broadcast) == 1
    first.down = False
    await link.submit(Heartbeat())
    assert len(second.broadcast) == 2 and first.broadcast == []  # sticks to the one that answered


async def test_link_all_validators_down_is_one_unavailable_error_with_hint() -> None:
    link = _link(FakeRpc("http://a", down=True), FakeRpc("http://b", down=True))
    with pytest.raises(UnavailableError) as raised:
        await link.height()
    assert "no committee validator answered" in raised.value.message
    assert raised.value.hint and "--committee-rpc" in raised.value.hint


async def test_link_counts_nonces_locally_and_rereads_after_bad_nonce() -> None:
    rpc = FakeRpc("http://a")
    link = _link(rpc)
    assert [(await link.submit(Heartbeat())).nonce for _ in range(3)] == [5, 6, 7]
    rpc.committed_nonce = 20
    rpc.answers.append(TxRejectedError("http://a", code=3, log_text="bad nonce"))
    assert (await link.submit(Heartbeat())).nonce == 21
    assert [decode(raw).nonce for raw in rpc.broadcast] == [5, 6, 7, 8, 21]


async def test_link_concurrent_submits_never_share_a_nonce() -> None:
    """The verifier's challenge worker and its spot checker submit through one link at once:
    each tx gets its own nonce (two with one nonce: the second fails in its block)."""
    rpc = FakeRpc("http://a")
    link = _link(rpc)
    sent = await asyncio.gather(*(link.submit(Heartbeat()) for _ in range(4)))
    assert sorted(s.nonce for s in sent) == [5, 6, 7, 8]


async def test_link_send_signs_again_when_another_signer_took_the_nonce() -> None:
    """A validator's watcher and verifier sign with one key from two processes: the tx whose
    nonce the other used first is refused in its block (BAD_NONCE, no effect) and is signed
    again with the nonce read afresh; other refusals come back as they are, once."""
    rpc = FakeRpc("http://a")
    link = _link(rpc)
    rpc.delivered = [3]  # nonce 5 was the watcher's
    assert await link.send(Heartbeat()) == (0, "")
    assert [decode(raw).nonce for raw in rpc.broadcast] == [5, 6]
    rpc.delivered = [3, 3, 3]
    assert (await link.send(Heartbeat()))[0] == 3  # bounded: three tries, then the code
    assert [decode(raw).nonce for raw in rpc.broadcast[2:]] == [7, 8, 9]
    rpc.delivered = [54]
    assert await link.send(Heartbeat()) == (54, "taken")
    assert len(rpc.broadcast) == 6
    # evicted from the mempool (the other signer's tx with its nonce committed): signed again
    # as soon as the nonce shows as used, not after a timeout
    rpc.delivered = [DROPPED]
    assert await link.send(Heartbeat(), timeout_s=60) == (0, "")
    assert [decode(raw).nonce for raw in rpc.broadcast[6:]] == [11, 12]


async def test_link_send_names_a_tx_neither_committed_nor_outrun() -> None:
    rpc = FakeRpc("http://a")
    link = _link(rpc)

    async def never(hash_hex: str) -> None:
        return None

    rpc.tx = never  # type: ignore[method-assign]  # the chain halted: no block at all
    with pytest.raises(UnavailableError) as raised:
        await link.send(Heartbeat(), timeout_s=0.6)
    assert "not committed within 0.6 s" in raised.value.message


async def test_link_tx_already_in_cache_counts_as_sent() -> None:
    rpc = FakeRpc("http://a")
    rpc.answers.append(RemoteError("http://a", "rpc_-32603", "tx already exists in cache"))
    link = _link(rpc)
    submitted = await link.submit(Heartbeat())
    assert submitted.hash == tx_hash(rpc.broadcast[0]) and submitted.nonce == 5
    assert (await link.submit(Heartbeat())).nonce == 6


async def test_link_other_rejections_reach_the_caller() -> None:
    rpc = FakeRpc("http://a")
    rpc.answers.append(TxRejectedError("http://a", code=2, log_text="bad signature"))
    with pytest.raises(TxRejectedError):
        await _link(rpc).submit(Heartbeat())


async def test_link_unknown_node_is_none() -> None:
    assert await _link(FakeRpc("http://a")).node("ab" * 32) is None


async def test_link_nodes_drops_malformed_entries_from_a_peer() -> None:
    good = {
        "key": "ab" * 32,
        "evm_address": "0x" + "11" * 20,
        "status": "SERVING",
        "role": "compute",
    }
    hostile = [
        {**good, "key": "AB" * 32},
        {**good, "key": "ab" * 31},
        {**good, "evm_address": "0x12"},
        {**good, "status": "ROUTABLE"},
        {**good, "role": "admin"},
        {k: v for k, v in good.items() if k != "evm_address"},
    ]
    rpc = FakeRpc("http://a")

    async def nodes_answer(path: str, data: bytes = b"") -> Any:
        return {"nodes": [good, *hostile]}

    rpc.abci_query = nodes_answer  # type: ignore[method-assign]
    assert await _link(rpc).nodes() == [good]


async def test_link_nodes_without_a_list_of_objects_is_a_bad_page() -> None:
    for odd_page in ({"nodes": "all of them"}, {"nodes": ["not an object"]}, ["nodes"]):
        rpc = FakeRpc("http://a")

        async def odd(path: str, data: bytes = b"", page: Any = odd_page) -> Any:
            return page

        rpc.abci_query = odd  # type: ignore[method-assign]
        with pytest.raises(BadPage, match=r"^/nodes: a page without a list of nodes"):
            await _link(rpc).nodes()


async def test_link_broadcasts_signed_bytes_as_given_and_reads_nonce_and_tx() -> None:
    first, second = FakeRpc("http://a", down=True), FakeRpc("http://b", committed_nonce=9)
    link = _link(first, second)
    raw = b'{"already":"signed"}'
    assert await link.broadcast(raw) == tx_hash(raw)  # failover to b, bytes untouched
    assert second.broadcast == [raw]
    second.answers.append(RemoteError("http://b", "rpc", "tx already exists in cache"))
    assert await link.broadcast(raw) == tx_hash(raw)  # an earlier copy in the mempool: fine
    second.answers.append(RemoteError("http://b", "rpc_-32603", "mempool is full"))
    with pytest.raises(RemoteError):
        await link.broadcast(raw)
    second.answers.append(TxRejectedError("http://b", code=3, log_text="bad nonce"))
    with pytest.raises(TxRejectedError):
        await link.broadcast(raw)
    assert await link.committed_nonce() == 9


async def test_two_processes_signing_with_one_key_share_its_nonces_through_the_file(
    tmp_path,
) -> None:
    """A validator's watcher and verifier sign with its consensus key from two processes (two
    links here, each its own nonce counter): through the shared nonce file they never sign one
    nonce twice, and the txs reach the validator's mempool in nonce order (a tx that overtook
    a lower nonce would make that one fail in its block). Without the file they collide."""
    rpc = FakeRpc("http://a")
    nonce_file = tmp_path / "data" / "planet_signer_nonce"
    watcher, verifier = (
        CommitteeLink([rpc.url], SigningKey(b"\x01" * 32), nonce_file=nonce_file) for _ in "ab"
    )
    for link in (watcher, verifier):
        link._clients = [rpc]  # type: ignore[assignment]
    await asyncio.gather(
        *(link.submit(Heartbeat()) for _ in range(6) for link in (watcher, verifier))
    )
    nonces = [decode(raw).nonce for raw in rpc.broadcast]
    assert nonces == list(range(5, 17))  # 12 txs, each nonce once, broadcast in order
    assert nonce_file.read_text() == "16"
    rpc.committed_nonce = 40  # txs signed elsewhere meanwhile: the chain's count still wins
    watcher._next_nonce = None
    assert (await watcher.submit(Heartbeat())).nonce == 41
    assert (await verifier.submit(Heartbeat())).nonce == 42

    alone = FakeRpc("http://b")
    apart = [_link(alone), _link(alone)]
    await asyncio.gather(*(link.submit(Heartbeat()) for link in apart))
    assert [decode(raw).nonce for raw in alone.broadcast] == [5, 5]  # what the file prevents


@dataclass
class WaitingRpc:
    """A validator that answers but whose blocks never hold the tx waited for (another signer
    took its nonce: it left the mempool), unless `holds` names it; waiting advances `clock`."""

    url: str
    clock: list[float]
    holds: dict[str, TxResult] = field(default_factory=dict)
    down: bool = False
    waits: list[float] = field(default_factory=list)
    lookups: int = 0

    async def wait_for_tx(self, hash_hex: str, *, timeout_s: float) -> TxResult:
        if self.down:
            raise UnavailableError(f"{self.url} down")
        self.waits.append(timeout_s)
        if hash_hex in self.holds:
            return self.holds[hash_hex]
        self.clock[0] += timeout_s
        raise UnavailableError(f"{self.url}: tx {hash_hex[:16]} not committed within {timeout_s} s")

    async def tx(self, hash_hex: str) -> TxResult | None:
        self.lookups += 1
        return self.holds.get(hash_hex)

    async def close(self) -> None:
        return None


def _waiting_link(*rpcs: WaitingRpc, clock: list[float]) -> CommitteeLink:
    link = CommitteeLink([r.url for r in rpcs], SigningKey(b"\x01" * 32), clock=lambda: clock[0])
    link._clients = list(rpcs)  # type: ignore[assignment]
    return link


async def test_link_waits_for_a_tx_that_never_lands_its_timeout_in_all_not_per_validator() -> None:
    """A dropped tx costs the caller `timeout_s`, not `timeout_s` × 4: the validator that
    answered waited it out; the others are only asked whether their index holds the tx."""
    clock = [100.0]
    rpcs = [WaitingRpc(f"http://v{i}", clock) for i in range(4)]
    link = _waiting_link(*rpcs, clock=clock)
    with pytest.raises(UnavailableError) as raised:
        await link.committed_code("AB" * 32, timeout_s=30)
    assert "not committed within 30 s" in raised.value.message
    assert [r.waits for r in rpcs] == [[30], [], [], []]
    assert [r.lookups for r in rpcs] == [0, 1, 1, 1]
    assert clock[0] == 130.0  # 30 s of waiting in all (each waiting 30 s was 120 s)


async def test_link_waits_on_the_next_validator_with_what_is_left_and_finds_the_tx() -> None:
    """An unreachable validator costs no waiting; one behind the others (its index lacks the
    tx when the time is spent) does not hide a tx another validator holds."""
    clock = [0.0]
    landed = TxResult("CD" * 32, 9, 0, 30, "unknown gateway")
    down = WaitingRpc("http://down", clock, down=True)
    behind = WaitingRpc("http://behind", clock)
    ahead = WaitingRpc("http://ahead", clock, holds={"CD" * 32: landed})
    link = _waiting_link(down, behind, ahead, clock=clock)
    assert await link.committed_code("CD" * 32, timeout_s=15) == (30, "unknown gateway")
    assert behind.waits == [15] and ahead.waits == [] and ahead.lookups == 1
