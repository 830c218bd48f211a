"""The node's ticket book and POST /v1/tickets (node/server/tickets.py) with the fake shard."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from nacl.signing import SigningKey

from node.server.app import create_app
from node.server.config import ServerConfig
from node.server.tickets import StaticPolicy, TicketBook, install, topk_rows_np
from node.verifier.fingerprint import fingerprint_bytes, topk_rows
from protocol.eip712 import commitment_value
from protocol.frames.sessions import session_tag
from protocol.served import inputs_digests, served_output_hash
from protocol.spotcheck import Triple
from protocol.tickets import TicketRequest, decode_ticket, open_sealed
from tests.doubles.fake_shard import FakeShard
from tests.unit.stream_link import Link

pytestmark = pytest.mark.unit

H = 8
CAP = "session-0001-capability-a"
TAG = session_tag(CAP)
NODE = SigningKey(b"\x11" * 32)
VERIFIER = SigningKey(b"\x12" * 32)
STRANGER = SigningKey(b"\x13" * 32)
SEED = "0x" + hashlib.sha256(b"seed").hexdigest()


def test_topk_rows_np_equals_the_verifier_rule() -> None:
    rng = np.random.default_rng(1)
    out = rng.standard_normal((1, 50, 64)).astype("f4") * 30
    out[0, 3, :] = 1.5  # all tied: lower channels first
    out[0, 4, 7] = 1e6  # saturates at 65504
    out[0, 5, 9] = -0.0
    assert topk_rows_np(out) == topk_rows(torch.from_numpy(out))


SEQUENCE = np.random.default_rng(2).standard_normal((1, 200, H)).astype("f4")


def _inputs(start: int, count: int) -> np.ndarray:
    return SEQUENCE[:, start : start + count]


def _record(book: TicketBook, tag: str, start: int, count: int) -> None:
    hidden = _inputs(start, count)
    book.record(tag, np.arange(start, start + count), hidden, hidden * 3)


def test_book_blocks_commitments_and_ticket_bytes() -> None:
    book = TicketBook(shard=1)
    _record(book, TAG, 0, 20)  # a prefill, then decode steps one by one
    for position in range(20, 70):
        _record(book, TAG, position, 1)
    commitments = book.block_commitments(TAG)
    assert [c.step for c in commitments] == [0, 1]  # positions 64..69 are not a full block
    full = _inputs(0, 70)
    expected_fp = fingerprint_bytes(torch.from_numpy(full * 3)[:, 32:64], 32)
    second = commitments[1]
    assert second.output_hash == served_output_hash(expected_fp, inputs_digests(full[:, :64])[1])
    assert second.commitment == commitment_value(
        bytes.fromhex(TAG), 1, 1, second.output_hash, second.salt
    )
    ticket = decode_ticket(book.ticket_bytes(TAG, 1))
    assert ticket.fingerprint == expected_fp and ticket.salt == second.salt
    assert np.array_equal(ticket.inputs, full[:, :64])
    assert commitments[0].salt != commitments[1].salt


def test_book_gap_or_late_start_drops_the_session() -> None:
    book = TicketBook(shard=0)
    _record(book, TAG, 5, 3)  # never saw position 0
    assert len(book) == 0
    _record(book, TAG, 0, 4)
    _record(book, TAG, 6, 1)  # gap
    assert len(book) == 0 and book.dropped_sessions == 1 and book.total_bytes == 0


def test_book_memory_cap_evicts_oldest_and_counts() -> None:
    per_session = 40 * H * 4
    book = TicketBook(shard=0, max_bytes=2 * per_session)
    for i in range(3):
        _record(book, f"{i:064x}", 0, 40)
    assert len(book) == 2 and book.evicted_sessions == 1
    assert book.total_bytes <= book.max_bytes
    assert book.block_commitments(f"{0:064x}") == []


def _config() -> ServerConfig:
    return ServerConfig(manifest_path=Path("unused.json"), shard_id=1)  # type: ignore[call-arg]


async def _served_client(aiohttp_client, rate_ppm: int = 1_000_000):
    app = create_app(_config(), FakeShard(shard_id=1, hidden_size=H, layers=(10, 20)))
    book = TicketBook(shard=1)
    verifiers = [VERIFIER.verify_key.encode().hex()]
    install(app, book, NODE, StaticPolicy({SEED}, verifiers, rate_ppm))
    client = await aiohttp_client(app)
    x = _inputs(0, 40)
    link = Link(await client.ws_connect("/v1/stream"), H)
    await link.open(1, CAP, 1)
    await link.forward(1, 0, x)
    return client, book, x


def _request(block: int = 0, verifier: SigningKey = VERIFIER, node: SigningKey = NODE, **kw):
    triple = Triple(node.verify_key.encode().hex(), "0x" + TAG, block, kw.get("shard", 1))
    return TicketRequest(triple, kw.get("seed", SEED), verifier.verify_key.encode().hex()).signed(
        verifier
    )


async def test_tickets_selected_request_gets_sealed_inputs(aiohttp_client) -> None:
    client, book, x = await _served_client(aiohttp_client)
    request = _request()
    answer = await client.post("/v1/tickets", data=request.encode())
    assert answer.status == 200, await answer.text()
    ticket = open_sealed(await answer.read(), request, VERIFIER)
    assert np.array_equal(ticket.inputs, x[:, :32])
    fake_out = torch.from_numpy(x[:, :32] + np.float32(2))
    assert ticket.fingerprint == fingerprint_bytes(fake_out, 0)
    assert book.block_commitments(TAG)[0].salt == ticket.salt


async def _code(answer) -> str:
    return (await answer.json())["code"]


@pytest.mark.parametrize(
    ("build", "status", "code"),
    [
        (lambda: _request(verifier=STRANGER), 403, "ticket_refused"),  # not in the set
        (lambda: _request(seed="0x" + "00" * 32), 403, "ticket_refused"),  # not a chain seed
        (lambda: _request(node=STRANGER), 403, "ticket_refused"),  # another node's triple
        (lambda: _request(shard=2), 403, "ticket_refused"),
        (lambda: _request(block=1), 404, "ticket_unavailable"),  # block 1 incomplete
    ],
)
async def test_tickets_refusals_named(aiohttp_client, build, status: int, code: str) -> None:
    client, _, _ = await _served_client(aiohttp_client)
    answer = await client.post("/v1/tickets", data=build().encode())
    assert answer.status == status and await _code(answer) == code


async def test_tickets_not_selected_refused(aiohttp_client) -> None:
    client, _, _ = await _served_client(aiohttp_client, rate_ppm=0)
    answer = await client.post("/v1/tickets", data=_request().encode())
    assert answer.status == 403 and await _code(answer) == "ticket_refused"


@pytest.mark.parametrize("body", [b"", b"{}", b"x" * 5000])
async def test_tickets_malformed_request_400(aiohttp_client, body: bytes) -> None:
    client, _, _ = await _served_client(aiohttp_client)
    answer = await client.post("/v1/tickets", data=body)
    assert answer.status == 400 and await _code(answer) == "ticket_request"


async def test_tickets_forged_signature_400(aiohttp_client) -> None:
    client, _, _ = await _served_client(aiohttp_client)
    good = _request()
    forged = TicketRequest(
        good.triple, good.seed, good.verifier, STRANGER.sign(b"x").signature.hex()
    )
    answer = await client.post("/v1/tickets", data=forged.encode())
    assert answer.status == 400 and await _code(answer) == "ticket_request"


class _FakeCommittee:
    """Answers /epochs like the committee app (unit test stand-in for the RPC): epoch 3's
    record holds SEED and names `verifiers`; the other epochs name STRANGER only."""

    def __init__(self, verifiers: list[str], fail: bool = False, blocks: int = 0) -> None:
        self.verifiers = verifiers
        self.fail = fail
        self.blocks = blocks  # the node's committed blocks of epoch 2 (the floor's count)
        self.calls = 0

    async def abci_query(self, path: str) -> dict:
        from protocol.errors import UnavailableError

        self.calls += 1
        if self.fail:
            raise UnavailableError("committee down")
        if path == "/epochs":
            return {"current": 4, "epochs": [{"epoch": 4, "seed": "11" * 32}]}
        if path.startswith("/epochs?epoch="):
            epoch = int(path.rsplit("=", 1)[1])
            seed = SEED[2:] if epoch == 3 else f"{epoch:064x}"
            others = [STRANGER.verify_key.encode().hex()]
            verifiers = [*self.verifiers, "bad", 7] if epoch == 3 else others
            record = {"epoch": epoch, "seed": seed, "verifiers": verifiers}
            return {"current": 4, "epochs": [record, "junk"]}
        if path == "/params":
            return {"genesis": {"epoch_length": 10}}  # spot_check_floor: the default 1
        if path.startswith("/coverage?node="):
            return {"shards": [{"shard": 1, "blocks": {"2": self.blocks, "3": "junk"}}]}
        raise AssertionError(path)


async def test_committee_policy_accepts_chain_seed_and_assigned_verifier() -> None:
    from node.server.tickets import CommitteePolicy, TicketRefusedError

    rpc = _FakeCommittee([VERIFIER.verify_key.encode().hex()])
    policy = CommitteePolicy(rpc, rate_ppm=1_000_000)
    await policy.authorize(_request())  # epoch 3's seed, the only verifier
    calls = rpc.calls
    await policy.authorize(_request())
    assert rpc.calls == calls  # cached view
    with pytest.raises(TicketRefusedError):
        await policy.authorize(_request(seed="0x" + "22" * 32))
    with pytest.raises(TicketRefusedError):
        await policy.authorize(_request(verifier=STRANGER))


async def test_committee_policy_uses_the_set_fixed_by_the_seeds_epoch() -> None:
    """A verifier of another epoch's set (STRANGER serves epochs 1, 2, 4) is refused for
    epoch 3's seed; an epoch record with no verifiers assigns nothing."""
    from node.server.tickets import CommitteePolicy, TicketRefusedError
    from protocol.spotcheck import epoch_verifiers

    policy = CommitteePolicy(_FakeCommittee([]), rate_ppm=1_000_000)
    with pytest.raises(TicketRefusedError, match="not a spot-check verifier"):
        await policy.authorize(_request())
    with pytest.raises(TicketRefusedError, match="not a spot-check verifier"):
        await policy.authorize(_request(verifier=STRANGER))
    await policy.authorize(_request(verifier=STRANGER, seed="0x" + f"{2:064x}"))
    with pytest.raises(TicketRefusedError, match="not a spot-check verifier"):
        await policy.authorize(_request(seed="0x" + f"{2:064x}"))
    assert epoch_verifiers({"seed": "11" * 32}) == ("0x" + "11" * 32, [])
    assert epoch_verifiers({"seed": "short", "verifiers": []}) is None
    assert epoch_verifiers([]) is None


async def test_committee_policy_any_verifier_of_the_set_may_rejudge() -> None:
    """Every verifier of the epoch's set gets its own ticket for a selected triple (the
    assigned one checks first; the others re-judge a peer's finding)."""
    from node.server.tickets import CommitteePolicy

    both = [VERIFIER.verify_key.encode().hex(), STRANGER.verify_key.encode().hex()]
    policy = CommitteePolicy(_FakeCommittee(both), rate_ppm=1_000_000)
    await policy.authorize(_request())
    await policy.authorize(_request(verifier=STRANGER))


async def test_committee_policy_draws_a_small_node_at_the_floor_rate() -> None:
    """At a base rate of 0 only the floor selects: a node with one committed block in the
    epoch has it drawn (rate 10^6); with many blocks almost none is."""
    from node.server.tickets import CommitteePolicy, TicketRefusedError

    verifiers = [VERIFIER.verify_key.encode().hex()]
    await CommitteePolicy(_FakeCommittee(verifiers, blocks=1), rate_ppm=0).authorize(_request())
    many = CommitteePolicy(_FakeCommittee(verifiers, blocks=10**9), rate_ppm=0)
    with pytest.raises(TicketRefusedError, match="not selected"):
        await many.authorize(_request())


async def test_committee_policy_chain_down_is_a_refusal_not_a_crash() -> None:
    from node.server.tickets import CommitteePolicy, TicketRefusedError

    policy = CommitteePolicy(_FakeCommittee([], fail=True), rate_ppm=1_000_000)
    with pytest.raises(TicketRefusedError, match="cannot confirm"):
        await policy.authorize(_request())


class _FakeServedTicket:
    def __init__(self, inputs: np.ndarray, fingerprint: bytes, salt: bytes) -> None:
        self.block, self.inputs, self.fingerprint = 1, inputs, fingerprint
        self.record = type("Record", (), {"salt": salt})()


class _FakeServedLog:
    """The read-back interface of node.server.served.ServedLog (helper batch's recorder)."""

    def __init__(self) -> None:
        full = _inputs(0, 40)
        fp = fingerprint_bytes(torch.from_numpy(full[:, 32:40] * 5), 32)
        self.held = _FakeServedTicket(full, fp, b"\x05" * 32)

    def ticket(self, session: str, block: int):
        return self.held if (session, block) == (TAG, 1) else None


async def test_install_prefers_the_nodes_served_log(aiohttp_client) -> None:
    from node.server.app import STATE_KEY
    from node.server.tickets import ServedLogTickets

    app = create_app(_config(), FakeShard(shard_id=1, hidden_size=H, layers=(10, 20)))
    app[STATE_KEY].served = _FakeServedLog()  # what a node with --commit-dir holds
    book = TicketBook(shard=1)
    verifiers = [VERIFIER.verify_key.encode().hex()]
    source = install(app, book, NODE, StaticPolicy({SEED}, verifiers, 1_000_000))
    assert isinstance(source, ServedLogTickets) and not app[STATE_KEY].forward_hooks
    client = await aiohttp_client(app)
    request = _request(block=1)
    answer = await client.post("/v1/tickets", data=request.encode())
    assert answer.status == 200, await answer.text()
    ticket = open_sealed(await answer.read(), request, VERIFIER)
    assert ticket.salt == b"\x05" * 32 and ticket.count == 40
    missing = await client.post("/v1/tickets", data=_request(block=0).encode())
    assert missing.status == 404 and await _code(missing) == "ticket_unavailable"


async def test_enable_tickets_asks_the_committee_over_json_rpc(aiohttp_client, aiohttp_server):
    """enable_tickets wires CommitteePolicy to a real CommitteeRpc client; the committee here is
    a stand-in CometBFT JSON-RPC endpoint answering abci_query like the app."""
    import base64
    import json

    from aiohttp import web

    from node.server.tickets import enable_tickets

    fake = _FakeCommittee([VERIFIER.verify_key.encode().hex()])

    async def rpc(request: web.Request) -> web.Response:
        body = await request.json()
        value = await fake.abci_query(body["params"]["path"])
        encoded = base64.b64encode(json.dumps(value).encode()).decode()
        return web.json_response(
            {
                "jsonrpc": "2.0",
                "id": body["id"],
                "result": {"response": {"code": 0, "value": encoded}},
            }
        )

    committee = web.Application()
    committee.router.add_post("/", rpc)
    server = await aiohttp_server(committee)
    app = create_app(_config(), FakeShard(shard_id=1, hidden_size=H, layers=(10, 20)))
    enable_tickets(app, NODE, str(server.make_url("/")), rate_ppm=1_000_000)
    client = await aiohttp_client(app)
    link = Link(await client.ws_connect("/v1/stream"), H)
    await link.open(1, CAP, 1)
    await link.forward(1, 0, _inputs(0, 40))
    request = _request()
    answer = await client.post("/v1/tickets", data=request.encode())
    assert answer.status == 200, await answer.text()
    assert open_sealed(await answer.read(), request, VERIFIER).count == 32
    refused = await client.post("/v1/tickets", data=_request(verifier=STRANGER).encode())
    assert refused.status == 403


@pytest.mark.parametrize(
    "tag",
    [
        "A" * 64,  # uppercase
        "0" * 63,  # short
        "0" * 65,  # long
        "٣" * 64,  # non-ASCII digits
        "0x" + "0" * 62,
        "%00" * 30,
        "0" * 5000,
    ],
)
async def test_commitments_hostile_tag_named_refusal_and_node_keeps_serving(
    aiohttp_client, tag: str
) -> None:
    client, _, _ = await _served_client(aiohttp_client)
    answer = await client.get(f"/v1/commitments/{tag}")
    assert 400 <= answer.status < 500
    assert (await answer.json())["code"]
    listed = await client.get(f"/v1/commitments/{TAG}")
    assert listed.status == 200
    assert [c["step"] for c in (await listed.json())["commitments"]] == [0]
