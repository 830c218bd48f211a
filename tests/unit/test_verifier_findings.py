"""Findings forwarded from verifier to verifier (node/verifier/findings.py, SpotChecker.forwarded):
a node that answers only the assigned verifier and withholds its ticket from the others is
convicted all the same, because the finder forwards the node's own signed ticket and each peer
judges it. Real HTTP between a stand-in node that withholds, the finder's findings server and
the re-judging peer; the chain is a fake of the queries SpotChecker makes."""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import torch
from aiohttp import web
from nacl.signing import SigningKey

from harness.ports import ephemeral_port
from node.verifier.findings import (
    FINDINGS_PATH,
    FindingBook,
    PeerFindings,
    PeerNotAllowedError,
    serve_findings,
)
from node.verifier.fingerprint import fingerprint_bytes
from node.verifier.spotchecks import SpotChecker
from protocol.eip712 import commitment_value
from protocol.fingerprint import Tolerance
from protocol.served import inputs_digests, served_output_hash
from protocol.spotcheck import Outcome, Triple, assign_verifier, evidence_hash
from protocol.tickets import (
    TicketRequest,
    decode_request,
    encode_ticket,
    open_forwarded,
    seal,
    unseal,
)
from tests.unit.test_verifier_tickets import INPUTS, TinyShard

pytestmark = pytest.mark.unit

NODE = SigningKey(b"\x51" * 32)
SEED = hashlib.sha256(b"findings seed").hexdigest()  # as /epochs answers it (no 0x)
SESSION = hashlib.sha256(b"findings session").digest()
TOLERANCE = Tolerance(max_ulp=2, min_match_per_mille=900, max_mean_ulp_milli=500)
LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)
TRIPLE = Triple(NODE.verify_key.encode().hex(), "0x" + SESSION.hex(), 1, 2)


def _hex(key: SigningKey) -> str:
    return key.verify_key.encode().hex()


def _keys() -> tuple[SigningKey, SigningKey, SigningKey]:
    """(finder, peer, third): three verifier keys, the check assigned to the finder."""
    keys = [SigningKey(bytes([b]) * 32) for b in range(0x60, 0x63)]
    finder = assign_verifier("0x" + SEED, TRIPLE, [_hex(k) for k in keys])
    ordered = sorted(keys, key=lambda k: _hex(k) != finder)
    return ordered[0], ordered[1], ordered[2]


FINDER, PEER, THIRD = _keys()


def _noisy_ticket() -> tuple[bytes, bytes]:
    """A ticket whose committed outputs are wrong at one position (FAILED), and the commitment
    it opens."""
    outputs = TinyShard().forward(INPUTS, torch.arange(64), None).clone()
    outputs[0, 40] = outputs[0, 40] * 0.9
    fingerprint = fingerprint_bytes(outputs[:, 32:64], 32)
    salt = b"\x09" * 32
    bound = served_output_hash(fingerprint, inputs_digests(INPUTS[:, :64].numpy())[1])
    commitment = commitment_value(SESSION, 1, 2, bound, salt)
    return encode_ticket(1, salt, fingerprint, INPUTS[:, :64].numpy()), commitment


PLAIN, COMMITMENT = _noisy_ticket()


class _Chain:
    """What the committee answers both verifiers: one committed block of NODE in epoch 2, the
    three verifiers fixed for epoch 3, the verdict votes cast so far, the published URLs."""

    def __init__(self, node_url: str) -> None:
        self.node_url = node_url
        self.verdicts: list[dict] = []
        self.endpoints: dict[str, str] = {}


class _Link:
    def __init__(self, chain: _Chain, key: SigningKey) -> None:
        self.chain = chain
        self.key = key

    async def send(self, body: object, *, timeout_s: float = 15) -> tuple[int, str]:
        return 0, ""

    async def query(self, path: str, **params: object) -> dict:
        if path == "/params":
            return {"genesis": {"epoch_length": 5}}
        if path == "/epochs":
            if params.get("epoch") == 3:
                keys = [_hex(k) for k in (FINDER, PEER, THIRD)]
                return {"epochs": [{"epoch": 3, "seed": SEED, "verifiers": keys}]}
            return {"current": 3, "epochs": []}
        if path == "/commitments":
            record = {"node": TRIPLE.node, "session": TRIPLE.session, "step": 1, "shard": 2,
                      "height": 7, "commitment": "0x" + COMMITMENT.hex()}  # fmt: skip
            return {"commitments": [record]}
        if path == "/coverage":
            return {"node": TRIPLE.node, "shards": [{"shard": 2, "blocks": {"2": 1}}]}
        if path == "/verdicts":
            return {"verdicts": self.chain.verdicts}
        if path == "/verifier_endpoints":
            return {"endpoints": dict(self.chain.endpoints)}
        raise AssertionError(path)

    async def nodes(self) -> list[dict]:
        return [{"key": TRIPLE.node}]

    async def node(self, key: str) -> dict:
        return {"key": key, "endpoint": self.chain.node_url}


async def _withholding_node(port: int) -> web.AppRunner:
    """POST /v1/tickets: the node's signed ticket, sealed, to the assigned verifier only."""

    async def tickets(request: web.Request) -> web.Response:
        parsed = decode_request(await request.read())
        parsed.verify()
        if parsed.verifier != _hex(FINDER):
            return web.json_response({"code": "ticket_refused", "message": "no"}, status=403)
        return web.Response(body=seal(PLAIN, parsed, NODE))

    app = web.Application()
    app.router.add_post("/v1/tickets", tickets)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


@pytest.fixture
async def chain() -> AsyncIterator[_Chain]:
    port = ephemeral_port()
    runner = await _withholding_node(port)
    try:
        yield _Chain(f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()


def _checker(
    chain: _Chain, key: SigningKey, http: aiohttp.ClientSession, votes: list, home: Path,
    peers: PeerFindings | None,
) -> SpotChecker:  # fmt: skip
    async def vote(result, node_key, epoch) -> None:
        votes.append((result.outcome, "0x" + result.evidence_hash.hex()))
        chain.verdicts.append({"evidence_hash": "0x" + result.evidence_hash.hex()})

    shards = [TinyShard(), TinyShard(), TinyShard()]
    return SpotChecker(
        _Link(chain, key), shards, TOLERANCE, http, vote, home=home, rate_ppm=10**6,
        deadline_s=0.5, retry_s=0.1, peers=peers,
    )  # type: ignore[arg-type]  # fmt: skip


async def test_a_withheld_ticket_reaches_the_peers_through_the_finder(
    chain: _Chain, tmp_path: Path
) -> None:
    failed = "0x" + evidence_hash("0x" + SEED, TRIPLE, Outcome.FAILED).hex()
    finder_votes: list = []
    peer_votes: list = []
    port = ephemeral_port()
    peers = PeerFindings(LOOPBACK)
    async with aiohttp.ClientSession() as http:
        finder = _checker(chain, FINDER, http, finder_votes, tmp_path / "f", None)
        runner = await serve_findings(finder.book, "127.0.0.1", port)
        try:
            chain.endpoints[_hex(FINDER)] = f"http://127.0.0.1:{port}"
            [found] = await finder.check_epoch(2)
            assert found.outcome is Outcome.FAILED and finder_votes == [(Outcome.FAILED, failed)]
            peer = _checker(chain, PEER, http, peer_votes, tmp_path / "p", peers)
            assert await peer.check_epoch(2) == []  # assigned nothing: it only re-judges
            [again] = await peer.rejudge()
            # the node refused this verifier its own ticket; the finder's copy convicts it
            assert again.outcome is Outcome.FAILED and again.bad_positions == (40,)
            assert peer_votes == [(Outcome.FAILED, failed)]
            # the peer now holds the finding too, forwardable to the third verifier
            assert peer.book.sealed_for(failed, _hex(THIRD)) is not None
            # a key outside the epoch's set, or the finder itself, gets nothing
            async with http.get(
                f"http://127.0.0.1:{port}{FINDINGS_PATH}/{failed}/{'77' * 32}"
            ) as answer:
                assert answer.status == 404
            assert finder.book.sealed_for(failed, _hex(FINDER)) is None
            async with http.get(f"http://127.0.0.1:{port}{FINDINGS_PATH}/junk/{'77' * 32}") as a:
                assert a.status == 400
        finally:
            await runner.cleanup()
            await peers.close()


async def test_without_a_finders_copy_the_withheld_ticket_is_a_timeout_vote(
    chain: _Chain, tmp_path: Path
) -> None:
    """The finder publishes no URL (or is down): the peer asks the node, is refused until the
    deadline and votes its own finding, the timeout verdict — as before forwarding existed."""
    finder_votes: list = []
    peer_votes: list = []
    peers = PeerFindings(LOOPBACK)
    async with aiohttp.ClientSession() as http:
        finder = _checker(chain, FINDER, http, finder_votes, tmp_path / "f", None)
        await finder.check_epoch(2)
        chain.endpoints[_hex(FINDER)] = f"http://127.0.0.1:{ephemeral_port()}"  # nobody there
        peer = _checker(chain, PEER, http, peer_votes, tmp_path / "p", peers)
        await peer.check_epoch(2)
        [result] = await peer.rejudge()
        await peers.close()
    timed_out = "0x" + evidence_hash("0x" + SEED, TRIPLE, Outcome.TIMEOUT).hex()
    assert result.outcome is Outcome.TIMEOUT and peer_votes == [(Outcome.TIMEOUT, timed_out)]


async def test_a_forwarded_ticket_of_another_check_convicts_nobody(
    chain: _Chain, tmp_path: Path
) -> None:
    """A finder that serves the copy of another finding under this evidence (a wrong or
    malicious peer) is ignored: the request inside names another check."""
    peer_votes: list = []
    port = ephemeral_port()
    other = Triple(TRIPLE.node, "0x" + "ee" * 32, 1, 2)
    request = TicketRequest(other, "0x" + SEED, _hex(FINDER)).signed(FINDER)
    book = FindingBook()
    statement = unseal(seal(PLAIN, request, NODE), request, FINDER)
    failed = "0x" + evidence_hash("0x" + SEED, TRIPLE, Outcome.FAILED).hex()
    verifiers = [_hex(k) for k in (FINDER, PEER, THIRD)]
    book.keep(failed, 2, verifiers, request, statement)  # under the evidence of TRIPLE
    runner = await serve_findings(book, "127.0.0.1", port)
    peers = PeerFindings(LOOPBACK)
    try:
        chain.endpoints[_hex(FINDER)] = f"http://127.0.0.1:{port}"
        chain.verdicts.append({"evidence_hash": failed})
        async with aiohttp.ClientSession() as http:
            peer = _checker(chain, PEER, http, peer_votes, tmp_path / "p", peers)
            await peer.check_epoch(2)
            [result] = await peer.rejudge()
    finally:
        await runner.cleanup()
        await peers.close()
    assert result.outcome is Outcome.TIMEOUT  # its own ticket was withheld: no conviction
    assert all(outcome is Outcome.TIMEOUT for outcome, _ in peer_votes)


async def test_the_dial_policy_refuses_private_addresses_unless_allowed() -> None:
    public_only = PeerFindings()
    for url in ("http://127.0.0.1:8700", "http://10.0.0.5:8700", "http://[::1]:8700",
                "http://192.168.1.1:8700/x", "gopher://1.1.1.1"):  # fmt: skip
        with pytest.raises(PeerNotAllowedError):
            public_only.check(url)
    assert public_only.check("http://8.8.8.8:8700") == "http://8.8.8.8:8700"
    assert public_only.check("https://verifier.example") == "https://verifier.example:443"
    ranged = PeerFindings(LOOPBACK)
    assert ranged.check("http://127.0.0.1:8700") == "http://127.0.0.1:8700"
    for url in ("http://10.0.0.5:8700", "https://verifier.example"):
        with pytest.raises(PeerNotAllowedError):
            ranged.check(url)
    with pytest.raises(PeerNotAllowedError):
        await public_only.fetch("http://127.0.0.1:1", "0x" + "00" * 32, "11" * 32)
    await public_only.close()
    await ranged.close()


def test_a_restarted_verifier_still_hands_over_its_findings(tmp_path: Path) -> None:
    """Findings are written to the verifier's home and read back: a restart between finding
    and the peers' fetch loses nothing; a damaged file is skipped with a warning, and pruning
    removes the files of old epochs."""
    request = TicketRequest(TRIPLE, "0x" + SEED, _hex(FINDER)).signed(FINDER)
    statement = unseal(seal(PLAIN, request, NODE), request, FINDER)
    failed = "0x" + evidence_hash("0x" + SEED, TRIPLE, Outcome.FAILED).hex()
    verifiers = [_hex(k) for k in (FINDER, PEER, THIRD)]
    directory = tmp_path / "findings"
    FindingBook(directory).keep(failed, 2, verifiers, request, statement)
    (directory / ("0x" + "ab" * 32 + ".finding")).write_bytes(b"\x00\x00\x00\x09not json!")
    restarted = FindingBook(directory)
    assert len(restarted) == 1
    sealed = restarted.sealed_for(failed, _hex(PEER))
    assert sealed is not None
    got, got_statement, _ = open_forwarded(sealed, PEER)
    assert got == request and got_statement == statement
    restarted.prune(3)
    assert len(restarted) == 0 and not (directory / f"{failed}.finding").exists()
    assert len(FindingBook(directory)) == 0


async def test_the_findings_server_refuses_strangers_by_name_and_keeps_answering() -> None:
    """Malformed evidence or keys, non-ASCII, a huge path, another method: each refused by name
    (400 / 404 / 405 / 414-ish), and the server answers its health check afterwards."""
    port = ephemeral_port()
    runner = await serve_findings(FindingBook(), "127.0.0.1", port)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            for path, status in (
                (f"{FINDINGS_PATH}/0x{'ab' * 32}/{'77' * 32}", 404),
                (f"{FINDINGS_PATH}/0x{'AB' * 32}/{'77' * 32}", 400),
                (f"{FINDINGS_PATH}/0x{'ab' * 32}/{'7' * 63}\u0667", 400),
                (f"{FINDINGS_PATH}/{'0' * 5000}/{'77' * 32}", 400),
            ):
                async with http.get(base + path) as answer:
                    assert answer.status == status, path
                    if status in (400, 404):
                        assert (await answer.json())["code"] in ("bad_request", "not_found")
            async with http.post(f"{base}{FINDINGS_PATH}/0x{'ab' * 32}/{'77' * 32}") as answer:
                assert answer.status == 405
            async with http.get(f"{base}/{'x' * 20_000}") as answer:
                assert answer.status >= 400
            async with http.get(f"{base}/health") as answer:
                assert answer.status == 200 and (await answer.json())["findings"] == 0
    finally:
        await runner.cleanup()
