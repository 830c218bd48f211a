"""The client's end of a ring session: the circuit's first node runs the decode loop
(docs/overlay.md, *The ring*; node/server/ring.py), the client checks every token and pays.

    async for token in generate_ring(client, head, prompt_ids, max_new_tokens=64): ...

The client opens the session with the ring spec (the prompt's length, the token limit, its stop
ids, its sampling), sends the prompt as ordinary prefill frames (paid ahead of each chunk, as
always) and then only reads: ring tokens messages from the first hop, each token with the
hidden row it was chosen from. For each token it computes the logits from that row with its
own head and draws its own sample from its own Generator (the same seed, one draw per token):
a token that differs stops the session (`RingMismatchError`, the first hop blamed) and nothing
more is paid (greedy: a token whose logit ties the client's argmax within `TIE_TOLERANCE`, as
the same head computed elsewhere may round its last bits otherwise, is the node's to pick).
With K > 1 and a last hop that vouches (`CircuitClient.vouch_ready`), each token's row is
first checked against the digest the last hop sent on the client's own link for that position
(`check_vouched`, node/client/ring_vouch.py): a first node that fabricates a row AND the token
that row gives is caught there. It yields the tokens the client-driven loop would yield
(`CircuitClient.generate`: same stop rule, same limit).

Payment ahead of the loop: right after the prompt's last chunk went, and after each tokens
message, every charging hop i is paid up to min(next + price_i, N + M − 1) positions, where
`next` is the positions the circuit holds once the loop's next frame is computed (N + max(1,
chosen)). So a hop holds credits for less than two chunks beyond what it computed, and its
loop stalls for a `pay` only when it computes a whole chunk faster than one client round trip.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

import numpy as np

from node.client.capabilities import new_session_id
from node.client.ring_vouch import VouchBook
from node.client.types import Head, Timings
from protocol.frames.codecs import decode_values
from protocol.ring import MAX_RING_TOKENS, RingMismatchError, RingSpec
from protocol.ring_vouch import VouchError
from protocol.sampling import SamplingConfig, sample


class RingCircuit(Protocol):
    """What the ring needs of `node.client.circuit.CircuitClient` (named here, not imported:
    the circuit's `generate` reaches this module through failover.py)."""

    hops: tuple[Any, ...]
    payees: list[tuple[int, int | None, str]]  # (hop index, span shard, payee name)
    hidden_size: int
    payer: Any
    ring_sids: set[int]
    vouches: dict[int, VouchBook]
    request_timeout_s: float
    bytes_sent: int
    bytes_received: int

    def new_sid(self) -> int: ...

    def vouch_ready(self) -> bool: ...

    async def open(self, secret: str, sid: int | None = None, **kwargs: Any) -> int: ...

    async def prefill(self, sid: int, ids_hidden: np.ndarray, **kwargs: Any) -> np.ndarray: ...

    async def receive_ring(self, sid: int, start: int, timeout_s: float | None = None) -> Any: ...

    async def logits(self, head: Head, hidden_last: np.ndarray) -> np.ndarray: ...

    async def pay_upto(self, sid: int, targets: Sequence[int]) -> None: ...

    def blame_hop(
        self, sid: int, index: int, *, named_by: int | None = None, also: Sequence[int] = ()
    ) -> None: ...

    async def close(self, sid: int) -> None: ...


# greedy: a token whose logit is this close to the client's own argmax is the node's to pick
# (the same head on another machine or thread count may round the last bits differently)
TIE_TOLERANCE = 1e-4


def near_tie(logits: np.ndarray, mine: int, token: int, sampling: SamplingConfig) -> bool:
    """Greedy only: `token` (the node's) ties the client's choice `mine` within rounding. A
    sampled token is checked exactly (the draw is the client's to replay)."""
    if not sampling.greedy or not 0 <= token < logits.shape[-1]:
        return False
    top = float(logits[mine])
    return float(logits[token]) >= top - TIE_TOLERANCE * max(1.0, abs(top))


def ring_targets(client: RingCircuit, spec: RingSpec, chosen: int) -> list[int]:
    """Per payee (a hop, or one shard of a span hop), the positions to have paid once `chosen`
    tokens were read (module docstring)."""
    payer = client.payer
    assert payer is not None
    after_next = spec.prompt + max(1, chosen)
    ceiling = spec.last_position + 1
    return [min(after_next + max(0, payer.price(name)), ceiling) for _, _, name in client.payees]


async def check_vouched(
    client: RingCircuit, sid: int, book: VouchBook, position: int, row: bytes
) -> None:
    """The row a ring token came with is the one the last hop vouched for (node/client/
    ring_vouch.py), else the session stops `ring_token_mismatch`. The client cannot tell who
    lied: the first hop (it relayed a row the last hop did not produce), the last hop (it
    vouched falsely) or a middle hop (K ≥ 3: it altered the row on its way back up); so every
    hop of the circuit is blamed and the failover replaces them all (blaming the first hop
    alone would let a lying last or middle hop eject honest first nodes for free, and stay).
    A vouch out of its session's grammar (`bad_vouch`) is the last hop's alone."""
    last = len(client.hops) - 1
    try:
        await book.check(position, row, f"nodes {client.hops[0].url} … {client.hops[-1].url}")
    except RingMismatchError:
        client.blame_hop(sid, 0, also=range(1, last + 1))
        raise
    except VouchError:
        client.blame_hop(sid, last)
        raise


async def ring_tokens(
    client: RingCircuit,
    sid: int,
    head: Head,
    history: Sequence[int],
    *,
    max_new: int,
    stop: frozenset[int],
    sampling: SamplingConfig,
    rng: np.random.Generator,
    split_at: int | None = None,
    prefill_last_only: bool = True,
    on_prefill: Callable[[int, np.ndarray], None] | None = None,
    timeout_s: float | None = None,
) -> AsyncIterator[tuple[int, np.ndarray]]:
    """Open `sid` as a ring session over `history` (sent as prefill frames, split at
    `split_at` as the failover's replay splits it), and yield each token the first hop chose
    with its logits, once the client's own head and sampler (`rng`, one draw per token) chose
    it too; the last one is a stop id or the `max_new`-th. The caller closes `sid`."""
    spec = RingSpec(
        prompt=len(history),
        max_new=min(max_new, MAX_RING_TOKENS),
        stop=stop,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        seed=sampling.seed,
    )

    async def pay_ahead(chosen: int) -> None:
        if client.payer is not None:
            await client.pay_upto(sid, ring_targets(client, spec, chosen))

    client.ring_sids.add(sid)
    book = None
    if client.vouch_ready():  # K > 1 and the last hop vouches for its rows
        wait_s = client.request_timeout_s if timeout_s is None else timeout_s
        book = VouchBook(first=spec.prompt - 1, last=spec.last_position, wait_s=wait_s)
        client.vouches[sid] = book
    await client.open(
        new_session_id(), sid, wait=False, prompt=list(history), ring=spec, vouch=book is not None
    )
    await client.prefill(
        sid,
        head.embed_np(list(history)),
        last_only=prefill_last_only,
        on_chunk=on_prefill,
        split_at=split_at,
        timeout_s=timeout_s,
        on_sent=lambda: pay_ahead(0),
    )
    chosen = 0
    while True:
        batch = await client.receive_ring(sid, spec.prompt - 1 + chosen, timeout_s)
        for token, row in zip(batch.tokens, batch.rows, strict=True):
            if book is not None:
                await check_vouched(client, sid, book, spec.prompt - 1 + chosen, row)
            hidden = decode_values(batch.dtype, batch.codec, (1, 1, client.hidden_size), row)
            logits = await client.logits(head, hidden[0, -1])
            mine = sample(logits, sampling, rng)
            if mine != token and not near_tie(logits, mine, token, sampling):
                client.blame_hop(sid, 0)
                raise RingMismatchError(
                    f"node {client.hops[0].url} sent token {token} at position "
                    f"{spec.prompt + chosen}; its own hidden state gives {mine}"
                )
            chosen += 1
            yield token, logits
            if token in stop or chosen == spec.max_new:
                return
        await pay_ahead(chosen)


async def generate_ring(
    client: RingCircuit,
    head: Head,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int,
    sampling: SamplingConfig | None = None,
    timings: Timings | None = None,
    stop_on_eos: bool = True,
    on_logits: Callable[[np.ndarray], None] | None = None,
    timeout_s: float | None = None,
) -> AsyncIterator[int]:
    """Yield the ring's tokens once checked, on this one circuit (module docstring; the first
    failure is raised: `node.client.failover.generate(ring=True)` replaces failed hops)."""
    sampling = (sampling or SamplingConfig()).validate()
    timings = timings if timings is not None else Timings()
    prompt = list(prompt_ids)
    timings.begin(len(prompt))
    stop = frozenset(head.eos_token_ids) if stop_on_eos else frozenset()
    sid = client.new_sid()
    sent0, received0 = client.bytes_sent, client.bytes_received
    chosen = 0
    tokens = ring_tokens(
        client,
        sid,
        head,
        prompt,
        max_new=max_new_tokens,
        stop=stop,
        sampling=sampling,
        rng=sampling.rng(),
        timeout_s=timeout_s,
    )
    try:
        async with contextlib.aclosing(tokens):
            async for token, logits in tokens:
                if on_logits is not None:
                    on_logits(logits)
                chosen += 1
                timings.chose(chosen)
                if token in stop:
                    return
                timings.new_tokens += 1
                yield token
    finally:
        timings.wire_bytes_sent += client.bytes_sent - sent0
        timings.wire_bytes_received += client.bytes_received - received0
        await client.close(sid)
