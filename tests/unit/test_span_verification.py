"""Verification of a span hop: a node serving shards 1-2 as one hop records, commits and hands
spot-check tickets for each shard of it as that shard's hop would (its own inputs and outputs,
records under that shard), so the verifier's unchanged recomputation of one shard
(node/verifier/tickets.py `judge_ticket`) passes an honest span and convicts a span whose second
shard computes wrongly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from nacl.signing import SigningKey

from node.model.prepare import prepare
from node.model.shard import ShardModel
from node.server.app import STATE_KEY, create_app
from node.server.backend import ModelShardBackend
from node.server.config import ServerConfig
from node.server.span_backend import SpanBackend
from node.server.tickets import ServedLogTickets, StaticPolicy, TicketBook, install
from node.verifier.tickets import judge_ticket
from protocol.eip712 import commitment_value
from protocol.fingerprint import Tolerance
from protocol.frames.sessions import session_tag
from protocol.spotcheck import Outcome, Triple
from protocol.tickets import TicketRequest, decode_ticket
from tests.doubles.tiny_model import make_tiny_model
from tests.unit.stream_link import Link
from tests.unit.test_served_commitments import spool

pytestmark = pytest.mark.unit

H = 64
SESSION = "session-capability-span-0001"
NODE = SigningKey(b"\x21" * 32)
VERIFIER = SigningKey(b"\x22" * 32)
SEED = "0x" + "ab" * 32
TOLERANCE = Tolerance(max_ulp=2, min_match_per_mille=900, max_mean_ulp_milli=500)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny-span-verify")
    make_tiny_model(root / "src", layers=6, hidden=H, tied=False)
    return Path(prepare(root / "src", parts=3, out=root / "p3", progress=lambda _: None))


class _Wrong:
    """A shard that adds noise to every output it hands on (and records: what it commits)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def forward(self, hidden: np.ndarray, positions: np.ndarray, cache: Any) -> np.ndarray:
        return self.inner.forward(hidden, positions, cache) * 1.05

    def forward_batch(self, hidden: np.ndarray, positions: np.ndarray, caches: Any) -> np.ndarray:
        return self.inner.forward_batch(hidden, positions, caches) * 1.05


def _span(manifest: Path, *, cheat_second: bool) -> SpanBackend:
    first = ModelShardBackend(manifest, 1, device="cpu")
    second: Any = ModelShardBackend(manifest, 2, device="cpu")
    return SpanBackend([first, _Wrong(second) if cheat_second else second])


def _request(shard: int, block: int) -> TicketRequest:
    triple = Triple(NODE.verify_key.encode().hex(), "0x" + session_tag(SESSION), block, shard)
    return TicketRequest(triple, SEED, VERIFIER.verify_key.encode().hex()).signed(VERIFIER)


async def _serve(aiohttp_client: Any, manifest: Path, tmp: Path, *, cheat_second: bool) -> Any:
    config = ServerConfig(
        manifest_path=manifest, shard_id=1, last_shard=2, commit_dir=tmp / "served"
    )
    app = create_app(config, _span(manifest, cheat_second=cheat_second))
    install(app, None, NODE, StaticPolicy(set(), [], 1_000_000))
    client = await aiohttp_client(app)
    link = Link(await client.ws_connect("/v1/stream"), H)
    await link.open(1, SESSION, 1)
    x = np.random.default_rng(3).standard_normal((1, 64, H)).astype(np.float32)
    await link.forward(1, 0, x[:, :40])
    for position in range(40, 64):  # decode steps one by one, as a circuit sends them
        await link.forward(1, position, x[:, position : position + 1])
    return app


def _judge(app: Any, manifest: Path, tmp: Path, shard: int, block: int) -> Any:
    state = app[STATE_KEY]
    (record,) = [
        r for r in spool(tmp / "served") if r.shard == shard and r.step == block
    ]  # one record per (session, block, shard)
    source = ServedLogTickets(state.served_by_shard[shard])
    ticket = decode_ticket(source.ticket_bytes(session_tag(SESSION), block))
    commitment = commitment_value(
        bytes.fromhex(session_tag(SESSION)), block, shard, record.output_hash, record.salt
    )
    verifier_shard = ShardModel.load(manifest, shard, device="cpu")
    return judge_ticket(
        ticket,
        _request(shard, block),
        shard=verifier_shard,
        commitment=commitment,
        tolerance=TOLERANCE,
    )


async def test_honest_span_commits_each_shard_and_every_ticket_passes(
    aiohttp_client, manifest: Path, tmp_path: Path
) -> None:
    app = await _serve(aiohttp_client, manifest, tmp_path, cheat_second=False)
    records = spool(tmp_path / "served")
    assert sorted((r.shard, r.step) for r in records) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    for shard in (1, 2):
        for block in (0, 1):
            result = _judge(app, manifest, tmp_path, shard, block)
            assert result.outcome is Outcome.PASSED, result.reason


async def test_span_whose_second_shard_cheats_fails_on_that_shard_only(
    aiohttp_client, manifest: Path, tmp_path: Path
) -> None:
    app = await _serve(aiohttp_client, manifest, tmp_path, cheat_second=True)
    for block in (0, 1):
        assert _judge(app, manifest, tmp_path, 1, block).outcome is Outcome.PASSED
        result = _judge(app, manifest, tmp_path, 2, block)
        assert result.outcome is Outcome.FAILED and result.evidence_hash is not None


async def test_span_tickets_without_a_commit_dir_come_from_a_book_per_shard(
    aiohttp_client, manifest: Path
) -> None:
    config = ServerConfig(manifest_path=manifest, shard_id=1, last_shard=2)
    app = create_app(config, _span(manifest, cheat_second=False))
    install(app, TicketBook(1), NODE, StaticPolicy(set(), [], 1_000_000))
    client = await aiohttp_client(app)
    link = Link(await client.ws_connect("/v1/stream"), H)
    await link.open(1, SESSION, 1)
    x = np.random.default_rng(4).standard_normal((1, 32, H)).astype(np.float32)
    await link.forward(1, 0, x)
    answer = await client.get(f"/v1/commitments/{session_tag(SESSION)}")
    rows = (await answer.json())["commitments"]
    assert sorted((row["shard"], row["step"]) for row in rows) == [(1, 0), (2, 0)]
