"""A compute node's side of spot checks: keep what a ticket needs, answer selected requests.

    book = TicketBook(shard=0, max_bytes=256 << 20)
    install(app, book, node_key, policy)   # after create_app: records every forward, serves
                                           # POST /v1/tickets
    book.block_commitments(tag)            # what the node's agent commits on the chain

Per session (keyed by the hop's public tag) the book keeps, in the forward thread:
- the shard's **inputs** for every position served (float32, as decoded from the frames) —
  a ticket for block b carries positions [0, end of b), so a verifier recomputes the block
  with its context in one prefill;
- the **fingerprint** of each completed 32-position block of outputs (`protocol.fingerprint`),
  and a random 32-byte salt per block; `block_commitments` gives (step = block, output_hash =
  keccak256(fingerprint ‖ inputs hash chain), `protocol.served.served_output_hash`, salt,
  commitment value) for the commit-reveal batches.

Memory is capped (`max_bytes`, inputs dominate: 4·H bytes per position); the oldest sessions
go first and are counted (`evicted_sessions`); a session that would outgrow
`protocol.tickets.MAX_POSITIONS` stops being recorded. A selected block whose session was
evicted cannot be ticketed: sizing the book for one epoch plus the ticket deadline is the
operator's job (a missing ticket is a 5 % slash).

`GET /v1/commitments/{tag}` lists the commitment values of a session's completed blocks (what
the agent puts on the chain; salts and fingerprints stay on the node until the reveal).
`POST /v1/tickets` takes a `TicketRequest` (canonical JSON signed by the verifier), checks the
signature, that it names this node, and `policy.authorize` (the triple is selected under a seed
the committee fixed and the verifier is the assigned one), then answers the sealed ticket
(`application/octet-stream`). Refusals are the node's usual `{code, message}` JSON.

The outputs' top-k selection here is numpy (the server stays torch-free at this boundary); it is
the same rule as `node.verifier.fingerprint.topk_rows` (a unit test holds them equal).
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from aiohttp import web
from nacl.signing import SigningKey

from node.server.app import STATE_KEY
from node.server.backend import served_span
from protocol.eip712 import commitment_value
from protocol.errors import PlanetError
from protocol.fingerprint import BLOCK_POSITIONS, TOPK, encode_block
from protocol.served import InputsChain, served_output_hash
from protocol.spotcheck import (
    TICKET_LOOKBACK_EPOCHS,
    epoch_verifiers,
    is_selected,
    node_rate_ppm,
)
from protocol.tickets import (
    MAX_POSITIONS,
    MAX_REQUEST_BYTES,
    TicketRequest,
    TicketRequestError,
    decode_request,
    encode_ticket,
    seal,
)

log = logging.getLogger(__name__)
_TAG = re.compile(r"[0-9a-f]{64}\Z")

FP16_MAX = 65504.0
TICKET_CONTENT_TYPE = "application/octet-stream"


class TicketRefusedError(PlanetError):
    """The node will not hand out this ticket (not selected, not the assigned verifier, …)."""

    code = "ticket_refused"
    http_status = 403


class TicketUnavailableError(PlanetError):
    """The node has no record of the requested block (never served, evicted, incomplete)."""

    code = "ticket_unavailable"
    http_status = 404


def topk_rows_np(out: np.ndarray, k: int = TOPK) -> list[list[tuple[int, int]]]:
    """Per position the k (channel, fp16 bits) points with the largest |value|, ties to the
    lower channel; values saturated at ±65504 then rounded to fp16 (round to nearest even)."""
    matrix = np.asarray(out, dtype=np.float32).reshape(-1, out.shape[-1])  # [T, H]
    order = np.argsort(-np.abs(matrix), axis=1, kind="stable")[:, :k]
    values = np.take_along_axis(matrix, order, axis=1)
    bits = np.clip(values, -FP16_MAX, FP16_MAX).astype(np.float16).view(np.uint16)
    return [
        list(zip(channels, patterns, strict=True))
        for channels, patterns in zip(order.tolist(), bits.tolist(), strict=True)
    ]


@dataclass(frozen=True, slots=True)
class BlockCommitment:
    """One completed block of a session: what the node commits and later reveals."""

    session: str  # 0x + the hop tag
    step: int  # block index
    shard: int
    output_hash: bytes
    salt: bytes
    commitment: bytes


@dataclass
class _Record:
    inputs: list[np.ndarray] = field(default_factory=list)  # [T_i, H] float32 chunks
    positions: int = 0
    pending: list[list[tuple[int, int]]] = field(default_factory=list)
    blocks: list[bytes] = field(default_factory=list)  # fingerprint bytes per completed block
    digests: list[bytes] = field(default_factory=list)  # the inputs hash chain per block
    chain: InputsChain = field(default_factory=InputsChain)
    salts: list[bytes] = field(default_factory=list)
    nbytes: int = 0
    full: bool = False  # grew past MAX_POSITIONS: no longer recorded


class TicketBook:
    """Bounded per-session record of inputs and block fingerprints (thread-safe)."""

    def __init__(self, shard: int, max_bytes: int = 256 << 20) -> None:
        if max_bytes < 1:
            raise ValueError("max_bytes must be positive")
        self.shard = shard
        self.max_bytes = max_bytes
        self.total_bytes = 0
        self.evicted_sessions = 0
        self.dropped_sessions = 0  # positions out of order (replays) or past MAX_POSITIONS
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._records)

    # forward thread ------------------------------------------------------------------------
    def record(self, tag: str, positions: np.ndarray, hidden: np.ndarray, out: np.ndarray) -> None:
        """After a forward of session `tag`: inputs `hidden` and outputs `out` ([1, T, H]) at
        `positions` (contiguous)."""
        count = int(positions.shape[0])
        if count == 0:
            return
        first = int(positions[0])
        rows = topk_rows_np(out)
        chunk = np.array(hidden, dtype=np.float32).reshape(count, -1)
        with self._lock:
            record = self._records.get(tag)
            if record is None:
                if first != 0:
                    return  # a session this book never saw from its start
                record = self._records[tag] = _Record()
            if record.full:
                return
            if first != record.positions or record.positions + count > MAX_POSITIONS:
                self._drop(tag, record)
                self.dropped_sessions += 1
                log.info("spot-check record dropped session=%s at=%d", tag[:16], first)
                return
            record.inputs.append(chunk)
            record.chain.add(chunk)
            record.nbytes += chunk.nbytes
            self.total_bytes += chunk.nbytes
            for row in rows:
                record.pending.append(row)
                record.positions += 1
                if record.positions % BLOCK_POSITIONS == 0:
                    record.blocks.append(encode_block(record.pending))
                    record.digests.append(record.chain.close_block(BLOCK_POSITIONS))
                    record.salts.append(secrets.token_bytes(32))
                    record.pending = []
            self._evict()

    def _drop(self, tag: str, record: _Record) -> None:
        self.total_bytes -= record.nbytes
        del self._records[tag]

    def _evict(self) -> None:
        while self.total_bytes > self.max_bytes and self._records:
            tag, record = next(iter(self._records.items()))
            self._drop(tag, record)
            self.evicted_sessions += 1
            log.info("spot-check record evicted session=%s", tag[:16])

    # readers -------------------------------------------------------------------------------
    def block_commitments(self, tag: str) -> list[BlockCommitment]:
        """The commitments of every completed block of session `tag` (empty if unknown)."""
        with self._lock:
            record = self._records.get(tag)
            if record is None:
                return []
            blocks, salts = list(record.blocks), list(record.salts)
            chained = list(record.digests)
        session = bytes.fromhex(tag)
        out = []
        for step, (fingerprint, salt) in enumerate(zip(blocks, salts, strict=True)):
            digest = served_output_hash(fingerprint, chained[step])
            value = commitment_value(session, step, self.shard, digest, salt)
            out.append(BlockCommitment("0x" + tag, step, self.shard, digest, salt, value))
        return out

    def ticket_bytes(self, tag: str, block: int) -> bytes:
        """The plain ticket for completed block `block` of session `tag`."""
        with self._lock:
            record = self._records.get(tag)
            if record is None or block >= len(record.blocks):
                raise TicketUnavailableError(
                    f"no record of block {block} of session {tag[:16]}…",
                    hint="the session was never served here, evicted, or the block is incomplete",
                )
            end = (block + 1) * BLOCK_POSITIONS
            inputs = np.concatenate(record.inputs, axis=0)[:end]
            fingerprint, salt = record.blocks[block], record.salts[block]
        return encode_ticket(block, salt, fingerprint, inputs)


class TicketPolicy(Protocol):
    async def authorize(self, request: TicketRequest) -> None:
        """Raise TicketRefusedError unless the committee selected this triple under
        `request.seed` and `request.verifier` is one of that epoch's verifiers."""
        ...


@dataclass
class StaticPolicy:
    """Seeds and verifiers known up front (tests, a node that mirrors the chain itself);
    `blocks`: the node's committed blocks of the epoch (the floor's count), 0 when unknown."""

    seeds: set[str]
    verifiers: Sequence[str]
    rate_ppm: int
    floor: int = 0
    blocks: int = 0

    async def authorize(self, request: TicketRequest) -> None:
        authorize_selection(
            request, self.seeds, self.verifiers, self.rate_ppm, floor=self.floor, blocks=self.blocks
        )


class CommitteePolicy:
    """Seeds and verifier sets read from the committee chain (one validator's RPC, refreshed at
    most every `refresh_s`): the epoch records of the current epoch and the `lookback` before it
    (a ticket may be asked for while later epochs run). Each record fixes its seed and its
    spot-check verifiers (`verifiers`: the validators that committed a verifier seed for it,
    abci_app/epochs.py); a request is checked against the set of the record whose seed it
    names, the same set every verifier assigns with. The draw rate of the node's blocks is the
    chain's (`node_rate_ppm` with genesis `spot_check_floor` and the node's committed blocks of
    the epoch from `/coverage`). `rpc` is a `node.chain.committee_rpc.CommitteeRpc` (anything
    with `async abci_query(path)`)."""

    def __init__(
        self,
        rpc: object,
        *,
        rate_ppm: int,
        lookback: int = TICKET_LOOKBACK_EPOCHS,
        refresh_s: float = 5.0,
    ) -> None:
        self.rpc = rpc
        self.rate_ppm = rate_ppm
        self.lookback = lookback
        self.refresh_s = refresh_s
        self._view: tuple[float, dict[str, tuple[int, list[str]]], int] | None = None
        self._blocks: dict[tuple[str, int], tuple[float, int]] = {}

    async def _refresh(self) -> tuple[dict[str, tuple[int, list[str]]], int]:
        now = time.monotonic()
        if self._view is not None and now - self._view[0] < self.refresh_s:
            return self._view[1], self._view[2]
        query = self.rpc.abci_query  # type: ignore[attr-defined]
        current = (await query("/epochs")).get("current", 1)
        sets: dict[str, tuple[int, list[str]]] = {}
        for epoch in range(max(1, int(current) - self.lookback), int(current) + 1):
            for record in (await query(f"/epochs?epoch={epoch}")).get("epochs", []):
                parsed = epoch_verifiers(record)
                if parsed is not None:
                    sets[parsed[0]] = (epoch, parsed[1])
        genesis = (await query("/params")).get("genesis", {})
        floor = genesis.get("spot_check_floor", 1) if isinstance(genesis, dict) else 1
        floor = floor if type(floor) is int and floor >= 0 else 1
        self._view = (now, sets, floor)
        return sets, floor

    async def _node_blocks(self, node: str, epoch: int) -> int:
        """The node's committed blocks of `epoch`, as the chain counts them."""
        now = time.monotonic()
        held = self._blocks.get((node, epoch))
        if held is not None and now - held[0] < self.refresh_s:
            return held[1]
        answer = await self.rpc.abci_query(f"/coverage?node={node}")  # type: ignore[attr-defined]
        count = 0
        for shard in answer.get("shards", []):
            value = (shard.get("blocks") or {}).get(str(epoch), 0)
            count += value if type(value) is int and value > 0 else 0
        self._blocks[(node, epoch)] = (now, count)
        return count

    async def authorize(self, request: TicketRequest) -> None:
        try:
            sets, floor = await self._refresh()
            epoch, verifiers = sets.get(request.seed, (0, []))
            blocks = await self._node_blocks(request.triple.node, epoch - 1) if epoch else 0
        except PlanetError as error:
            raise TicketRefusedError(
                f"the committee chain cannot confirm the selection now: {error.message}",
                hint="retry before the ticket deadline",
            ) from None
        authorize_selection(
            request, set(sets), verifiers, self.rate_ppm, floor=floor, blocks=blocks
        )


def authorize_selection(
    request: TicketRequest,
    seeds: set[str],
    verifiers: Sequence[str],
    rate_ppm: int,
    *,
    floor: int = 0,
    blocks: int = 0,
) -> None:
    """The triple must be selected under a seed the committee fixed, and the requester one of
    that epoch's verifiers: the assigned verifier checks it first, any other verifier of the
    set re-judges it when a peer reports a finding (so a failed check can reach 2/3)."""
    if request.seed not in seeds:
        raise TicketRefusedError("the seed is not an epoch seed the committee fixed")
    if not is_selected(request.seed, request.triple, node_rate_ppm(rate_ppm, floor, blocks)):
        raise TicketRefusedError("this block is not selected for a spot check")
    if request.verifier not in verifiers:
        raise TicketRefusedError("the requester is not a spot-check verifier of that epoch")


TICKET_BOOK_KEY = web.AppKey("ticket_book", TicketBook)


async def _read_request(request: web.Request) -> bytes:
    """The whole body of a ticket request, refused (as a malformed request) past the limit."""
    declared = request.content_length
    if declared is not None and declared > MAX_REQUEST_BYTES:
        raise TicketRequestError(f"request of {declared} bytes, at most {MAX_REQUEST_BYTES}")
    body = bytearray()
    while chunk := await request.content.read(MAX_REQUEST_BYTES + 1 - len(body)):
        body += chunk
        if len(body) > MAX_REQUEST_BYTES:
            raise TicketRequestError(f"request over {MAX_REQUEST_BYTES} bytes")
    return bytes(body)


class TicketSource(Protocol):
    def ticket_bytes(self, session: str, block: int) -> bytes:
        """Plain ticket bytes for `block` of `session` (64 hex, the committed session id);
        TicketUnavailableError when not held."""
        ...


class ServedLogTickets:
    """Tickets from a `node.server.served.ServedLog` (the served-work recorder a node runs with
    `--commit-dir`, whose records its agent commits): `served.ticket(session, block)` gives the
    inputs up to the block's end, the fingerprint and the commitment's salt."""

    def __init__(self, served: object) -> None:
        self.served = served

    def ticket_bytes(self, session: str, block: int) -> bytes:
        held = self.served.ticket(session, block)  # type: ignore[attr-defined]
        if held is None:
            raise TicketUnavailableError(
                f"no record of block {block} of session {session[:16]}…",
                hint="the session was never served here, evicted, or the block is incomplete",
            )
        return encode_ticket(held.block, held.record.salt, held.fingerprint, held.inputs)


def install(
    app: web.Application,
    book: TicketBook | None,
    node_key: SigningKey,
    policy: TicketPolicy,
) -> TicketSource:
    """Serve `POST /v1/tickets` and `GET /v1/commitments/{tag}` (call before start). The
    tickets come from the node's served-work log when it runs one (`NodeState.served`, the
    records its agent commits); else from `book`, recorded on every forward. Returns the source.
    """
    state = app[STATE_KEY]
    served = getattr(state, "served", None)
    span = served_span(state.backend)
    source: TicketSource
    sources: dict[int, TicketSource] = {}
    books: list[TicketBook] = []
    if span.size > 1 and state.served_by_shard:  # a span's served log per shard
        sources = {s: ServedLogTickets(log) for s, log in state.served_by_shard.items()}
        source = sources[span.first]
    elif span.size > 1 and book is not None:  # a span's ticket book per shard
        for shard in span:
            own = TicketBook(shard, max_bytes=max(1, book.max_bytes // span.size))
            state.stage_hooks.setdefault(shard, []).append(own.record)
            sources[shard] = own
            books.append(own)
        state.backend.keep_stages = True
        app[TICKET_BOOK_KEY] = books[0]
        source = sources[span.first]
    elif served is not None:
        source = ServedLogTickets(served)
    elif book is not None:
        state.forward_hooks.append(book.record)
        app[TICKET_BOOK_KEY] = book
        source = book
        books.append(book)
    else:
        raise ValueError("no ticket source: give a TicketBook or run the served-work log")
    sources = sources or {span.first: source}
    me = node_key.verify_key.encode().hex()

    def book_commitments(tag: str) -> list[BlockCommitment]:
        return [c for own in books for c in own.block_commitments(tag)]

    async def tickets(request: web.Request) -> web.Response:
        parsed = decode_request(await _read_request(request))
        parsed.verify()
        own = sources.get(parsed.triple.shard)
        if parsed.triple.node != me or own is None:
            raise TicketRefusedError("the request names another node or shard")
        await policy.authorize(parsed)
        tag = parsed.triple.session[2:]
        plain = own.ticket_bytes(tag, parsed.triple.block)
        log.info("ticket sealed session=%s block=%d", tag[:16], parsed.triple.block)
        return web.Response(body=seal(plain, parsed, node_key), content_type=TICKET_CONTENT_TYPE)

    async def commitments(request: web.Request) -> web.Response:
        """The commitment values of a session's completed blocks (public; salts stay here)."""
        tag = request.match_info["tag"]
        if not _TAG.match(tag):
            raise TicketUnavailableError("session tags are 64 lowercase hex")
        rows = [
            {"step": c.step, "shard": c.shard, "commitment": "0x" + c.commitment.hex()}
            for c in book_commitments(tag)
        ]
        return web.json_response({"session": "0x" + tag, "commitments": rows})

    app.router.add_post("/v1/tickets", tickets)
    if books:  # a served-work log's records go to the chain instead
        app.router.add_get("/v1/commitments/{tag}", commitments)
    return source


def enable_tickets(
    app: web.Application,
    node_key: SigningKey,
    committee_url: str,
    *,
    rate_ppm: int,
    max_bytes: int = 256 << 20,
) -> None:
    """Production wiring in one call: a `CommitteePolicy` over a `CommitteeRpc` to
    `committee_url` opened and closed with the app, and the served-work log (or a `TicketBook`
    of `max_bytes`) as the ticket source. Call after `create_app`, before the app starts."""
    from node.chain.committee_rpc import CommitteeRpc

    rpc = CommitteeRpc(committee_url)

    async def close_rpc(_app: web.Application) -> AsyncIterator[None]:
        yield
        await rpc.close()

    app.cleanup_ctx.append(close_rpc)
    book = TicketBook(app[STATE_KEY].backend.shard_id, max_bytes=max_bytes)
    install(app, book, node_key, CommitteePolicy(rpc, rate_ppm=rate_ppm))


ForwardHook = Callable[[str, np.ndarray, np.ndarray, np.ndarray], None]
__all__ = [
    "BlockCommitment",
    "CommitteePolicy",
    "ForwardHook",
    "ServedLogTickets",
    "StaticPolicy",
    "TicketBook",
    "TicketRefusedError",
    "TicketSource",
    "TicketUnavailableError",
    "authorize_selection",
    "enable_tickets",
    "install",
    "topk_rows_np",
]
