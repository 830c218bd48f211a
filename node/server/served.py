"""What a compute node keeps of the work it served, for commit-reveal and spot checks.

For every session the node serves (when `ServerConfig.commit_dir` is set) it records, after each
forward pass (a `NodeState.forward_hooks` entry), the fingerprint of its output activations
(`node.model.fingerprint`) and the input activations it received. Each completed block of 32
positions becomes a `protocol.served` record (session = the hop's public tag, block index,
shard, output hash = keccak256 of the fingerprint bytes and of the session's input hash chain
up to the block's end, a random salt) appended to the spool in
`commit_dir`, from which the node agent commits and later reveals (`node.agent.commitments`).
A session's last, partial block is recorded once the session is gone from the node's session
store (closed, idle-evicted after `idle_timeout_s`, aged out), or, when `seal_idle_s` is set, has
been idle that long; positions after a seal are not recorded (counted), so a block is never
committed twice with different contents.

**Rewinds** (speculative decoding drops rejected guesses: the next frame starts before the last
one's end) keep being recorded, so a speculating session commits every position it was paid
for (docs/committee.md, *Commitment coverage*: both sides count every frame's positions). A
rewind to position p seals the current segment (its partial block recorded) and opens the
next segment of the session, committed under `protocol.served.segment_session(tag, i)`: the
sequence the cache now holds — the previous segment's inputs of positions [0, p) (shared, not
copied) and what comes next — with its own inputs hash chain (restarted from the previous
segment's digest at the start of p's block) and blocks over absolute positions. Its first
block repeats the rows [32·⌊p/32⌋, p) the previous segment computed (their fingerprint bytes
carried over), so any ticket of it is recomputed from its inputs alone. A rewind before the
current segment's first block (no replay does that) stops the session's recording as before.

Memory is bounded: inputs + fingerprints of all sessions stay under `max_bytes`; beyond it the
least recently used sessions (segments) are dropped whole (counted in `stats()`); their records
stay in the spool (and on chain) but tickets for them can no longer be answered. A segment's
shared prefix is counted once, in the segment that received it (a dropped segment's inputs
stay in memory while a later segment of its session still holds them).

For spot checks (the verifier's ticket) the node reads back what it served:

    log.ticket(session, block) -> Ticket(session, block, start, inputs [1, T, H] float32
                                        for positions [0, end of the block),
                                        fingerprint bytes of the block, record)
    (session: "0x" + tag, as on chain, or the bare 64-hex tag)

Threads: `hook` runs on the forward worker thread, everything else on the event loop; one lock
guards the state. The log of a running node is `app[SERVED_KEY]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web

from node.model.fingerprint import FingerprintRecorder
from node.server.backend import served_span
from node.server.config import ServerConfig
from protocol import served as spool_format
from protocol.fingerprint import BLOCK_POSITIONS, BYTES_PER_POSITION, HEADER_BYTES
from protocol.served import (
    SPOOL_MAGIC,
    SPOOL_PREFIX,
    SPOOL_SUFFIX,
    InputsChain,
    ServedRecord,
    segment_session,
    served_output_hash,
)

log = logging.getLogger(__name__)

SESSION_OVERHEAD_BYTES = 1024  # accounted per held session (objects, dict entries)


@dataclass(frozen=True)
class Ticket:
    """What a node hands a selected verifier for one block (no capability, tag, user or query)."""

    session: str  # "0x" + the hop's session tag (as on chain)
    block: int
    start: int  # first position of the block (32 * block)
    inputs: np.ndarray  # [1, end, H] float32: the inputs of positions [0, end)
    fingerprint: bytes  # the block's fingerprint bytes (protocol.fingerprint)
    record: ServedRecord  # output_hash and salt of the block's commitment


@dataclass
class _Served:
    """One segment of a session (the whole session until its first rewind)."""

    session: bytes  # the commitment's session: the tag's 32 bytes, or `segment_session`
    origin: str = ""  # the hop's session tag (hex) the segment belongs to
    index: int = 0  # segment number within the session
    first_block: int = 0  # the block the segment's first position falls in
    carry: bytes = b""  # fingerprint bytes of that block's positions before the segment's start
    recorder: FingerprintRecorder = field(default_factory=FingerprintRecorder)
    inputs: list[np.ndarray] = field(default_factory=list)  # [T_i, H] chunks from position 0
    blocks: dict[int, tuple[bytes, ServedRecord]] = field(default_factory=dict)
    chain: InputsChain = field(default_factory=InputsChain)  # the inputs hash chain
    digests: list[bytes] = field(default_factory=list)  # the chain after each block, by block
    last_s: float = 0.0
    sealed: bool = False
    nbytes: int = 0


class ServedLog:
    """Per-session fingerprints and inputs of one shard, and the spool of block records."""

    def __init__(
        self,
        commit_dir: Path,
        shard: int,
        *,
        max_bytes: int = 256 * 1024 * 1024,
        seal_idle_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        spool_tag: str = "",
    ) -> None:
        self.dir = Path(commit_dir)
        # added to its spool files' names: the logs of a span's shards share one directory
        self.spool_tag = spool_tag
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.shard = shard
        self.max_bytes = max_bytes
        self.seal_idle_s = seal_idle_s
        self._clock = clock
        self._lock = threading.Lock()
        # segment session (hex) → segment, least recently used first; a session's first
        # segment is keyed by its tag
        self._by_tag: OrderedDict[str, _Served] = OrderedDict()
        self._live: dict[str, str] = {}  # session tag → the key of its segment being recorded
        self._bytes = 0
        self._spool: Path | None = None
        self._spool_bytes = 0
        self.counters = {
            "blocks": 0,
            "partial_blocks": 0,
            "positions": 0,
            "unrecorded_positions": 0,
            "evicted_sessions": 0,
            "segments": 0,
            "evicted_bytes": 0,
            "record_s": 0.0,
        }

    # -- recording (forward worker thread) -----------------------------------------------------

    def hook(self, tag: str, positions: np.ndarray, hidden: np.ndarray, out: np.ndarray) -> None:
        """The `NodeState.forward_hooks` entry: (session tag, positions, inputs, outputs)."""
        self.record(tag, hidden, positions, out)

    def record(self, tag: str, hidden: np.ndarray, positions: np.ndarray, out: np.ndarray) -> None:
        started = time.perf_counter()
        count = int(positions.shape[0])
        start = int(positions[0])
        with self._lock:
            served = self._by_tag.get(self._live.get(tag, tag))
            if served is None:
                session = _tag_bytes(tag)
                if start != 0 or session is None:  # evicted earlier, or no tag
                    self.counters["unrecorded_positions"] += count
                    return
                served = _Served(session=session, origin=tag, nbytes=SESSION_OVERHEAD_BYTES)
                self._by_tag[tag] = served
                self._live[tag] = tag
                self._bytes += SESSION_OVERHEAD_BYTES
            if not served.sealed and start < served.recorder.next_position:
                # a rewind (speculative decoding): the cache holds positions [0, start) now
                served = self._rewound(served, start)
            if served.sealed or start != served.recorder.next_position:
                self.counters["unrecorded_positions"] += count
                return
            key = served.session.hex()
            self._by_tag.move_to_end(key)
            served.last_s = self._clock()
            before = len(served.recorder.blocks)
            served.recorder.add(out, positions.tolist())
            chunk = np.array(hidden[0], dtype=np.float32, copy=True)  # [T, H]
            served.inputs.append(chunk)
            served.chain.add(chunk)
            added = chunk.nbytes
            for index in range(before, len(served.recorder.blocks)):
                block = served.first_block + index
                fingerprint = _spliced(served, block, served.recorder.blocks[index])
                added += self._commit_block(served, block, fingerprint)
            served.nbytes += added
            self._bytes += added
            self.counters["positions"] += count
            self._evict_over_cap(keep=key)
        self.counters["record_s"] += time.perf_counter() - started

    def _rewound(self, served: _Served, start: int) -> _Served:
        """Seal `served` and open the session's next segment at position `start` (module
        doc); `served` itself, sealed, when `start` lies before its first block."""
        self._seal(served)
        block, carried = divmod(start, BLOCK_POSITIONS)
        if block < served.first_block or len(served.digests) < block:
            return served
        carry = b""
        if carried and block not in served.blocks:  # nothing recorded there (never: a fresh
            return served  # segment records the frame that opened it)
        if carried:
            fingerprint = served.blocks[block][0]
            carry = fingerprint[HEADER_BYTES : HEADER_BYTES + carried * BYTES_PER_POSITION]
        prefix = _rows(served.inputs, 0, start)
        chain = InputsChain()
        chain.digest = served.digests[block - 1] if block else None
        for rows in _rows(prefix, block * BLOCK_POSITIONS, start):
            chain.add(rows)
        index = served.index + 1
        segment = _Served(
            session=segment_session(bytes.fromhex(served.origin), index),
            origin=served.origin,
            index=index,
            first_block=block,
            carry=carry,
            recorder=FingerprintRecorder(next_position=start),
            inputs=prefix,
            chain=chain,
            digests=served.digests[:block],
            nbytes=SESSION_OVERHEAD_BYTES,
        )
        key = segment.session.hex()
        self._by_tag[key] = segment
        self._live[served.origin] = key
        self._bytes += SESSION_OVERHEAD_BYTES
        self.counters["segments"] += 1
        return segment

    def _commit_block(
        self, served: _Served, block: int, fingerprint: bytes, rows: int = BLOCK_POSITIONS
    ) -> int:
        digest = served.chain.close_block(rows)
        served.digests.append(digest)
        record = ServedRecord(
            session=served.session,
            step=block,
            shard=self.shard,
            output_hash=served_output_hash(fingerprint, digest),
            salt=os.urandom(32),
        )
        served.blocks[block] = (fingerprint, record)
        self._append(record)
        self.counters["blocks"] += 1
        return len(fingerprint) + 160

    def _append(self, record: ServedRecord) -> None:
        if self._spool is None or self._spool_bytes >= spool_format.SPOOL_FILE_BYTES:
            stamp = f"{time.time_ns():020d}-{os.getpid()}{self.spool_tag}"
            name = f"{SPOOL_PREFIX}{stamp}{SPOOL_SUFFIX}"
            self._spool = self.dir / name
            fd = os.open(self._spool, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(SPOOL_MAGIC)
            self._spool_bytes = len(SPOOL_MAGIC)
        data = record.encode()
        with self._spool.open("ab") as handle:  # one write of one whole record
            handle.write(data)
        self._spool_bytes += len(data)

    def _evict_over_cap(self, keep: str) -> None:
        while self._bytes > self.max_bytes and len(self._by_tag) > 1:
            tag, victim = next(iter(self._by_tag.items()))
            if tag == keep:
                self._by_tag.move_to_end(tag)
                continue
            self._drop(tag, victim)
            self.counters["evicted_sessions"] += 1
            self.counters["evicted_bytes"] += victim.nbytes

    def _drop(self, key: str, served: _Served) -> None:
        del self._by_tag[key]
        if self._live.get(served.origin) == key:
            del self._live[served.origin]
        self._bytes -= served.nbytes

    # -- sealing (event loop) ------------------------------------------------------------------

    def seal(self, tag: str) -> bool:
        """Record the session's partial last block (the session closed); True if one was."""
        with self._lock:
            served = self._by_tag.get(self._live.get(tag, tag))
            if served is None or served.sealed:
                return False
            return self._seal(served)

    def _seal(self, served: _Served) -> bool:
        served.sealed = True
        pending = served.recorder.flush()
        if pending is None:
            return False
        block = (served.recorder.next_position - 1) // BLOCK_POSITIONS
        rows = served.recorder.next_position - block * BLOCK_POSITIONS
        added = self._commit_block(served, block, _spliced(served, block, pending), rows)
        served.nbytes += added
        self._bytes += added
        self.counters["partial_blocks"] += 1
        return True

    def seal_idle(self, open_tags: Callable[[str], bool] = lambda _tag: True) -> int:
        """Seal every session no longer open (`open_tags(tag)` false, or idle for `seal_idle_s`:
        closed or evicted by the node); how many partial blocks were recorded."""
        now = self._clock()
        sealed = 0
        with self._lock:
            for served in list(self._by_tag.values()):
                if served.sealed:
                    continue
                idle = self.seal_idle_s is not None and now - served.last_s >= self.seal_idle_s
                if idle or not open_tags(served.origin):
                    sealed += self._seal(served)
        return sealed

    def seal_all(self) -> int:
        """Seal every session (the node is stopping)."""
        with self._lock:
            return sum(self._seal(s) for s in self._by_tag.values() if not s.sealed)

    # -- reading back (spot checks) -------------------------------------------------------------

    def ticket(self, session: str, block: int) -> Ticket | None:
        """The inputs up to the end of `block` and its fingerprint, or None if not held."""
        tag = session[2:] if session.startswith("0x") else session
        with self._lock:
            served = self._by_tag.get(tag)
            if served is None or block not in served.blocks:
                return None
            fingerprint, record = served.blocks[block]
            start = block * BLOCK_POSITIONS
            end = min(start + BLOCK_POSITIONS, served.recorder.next_position)
            inputs = np.concatenate(served.inputs, axis=0)[:end]
        return Ticket(
            session="0x" + tag,
            block=block,
            start=start,
            inputs=inputs[None],
            fingerprint=fingerprint,
            record=record,
        )

    def sessions(self) -> list[str]:
        """Sessions held ("0x" + tag), least recently used first."""
        with self._lock:
            return ["0x" + tag for tag in self._by_tag]

    def stats(self) -> dict[str, float | int]:
        with self._lock:
            return {
                **self.counters,
                "sessions": len(self._by_tag),
                "bytes": self._bytes,
                "max_bytes": self.max_bytes,
            }


def _spliced(served: _Served, block: int, fingerprint: bytes) -> bytes:
    """A segment's block fingerprint with the rows it carried over prepended (its first block
    only): one block of positions [32·block, …) as `protocol.fingerprint` encodes it."""
    if block != served.first_block or not served.carry:
        return fingerprint
    positions = fingerprint[1] + len(served.carry) // BYTES_PER_POSITION
    return bytes((fingerprint[0], positions)) + served.carry + fingerprint[HEADER_BYTES:]


def _rows(chunks: list[np.ndarray], start: int, end: int) -> list[np.ndarray]:
    """Views of the rows [start, end) of consecutive [T_i, H] `chunks` (nothing copied)."""
    out, at = [], 0
    for chunk in chunks:
        lo, hi = max(start - at, 0), min(end - at, chunk.shape[0])
        if lo < hi:
            out.append(chunk[lo:hi])
        at += chunk.shape[0]
        if at >= end:
            break
    return out


def _tag_bytes(tag: str) -> bytes | None:
    """The 32 bytes of a session tag (64 lowercase hex, `protocol.frames.sessions.session_tag`)."""
    if len(tag) != 64 or any(c not in "0123456789abcdef" for c in tag):
        return None
    return bytes.fromhex(tag)


SERVED_KEY = web.AppKey("served", ServedLog)


def install_served(app: web.Application, state: Any, config: ServerConfig) -> ServedLog:
    """Record a node app's served work (`app[SERVED_KEY]`, a forward hook); seal sessions that
    closed or idled, checked every second."""
    if config.commit_dir is None:
        raise ValueError("install_served needs config.commit_dir")
    span = served_span(state.backend)
    if span.size > 1:
        return _install_span(app, state, config)
    served = ServedLog(
        config.commit_dir,
        config.shard_id,
        max_bytes=config.served_max_bytes,
        seal_idle_s=config.served_seal_idle_s,
    )
    app[SERVED_KEY] = served
    state.served = served  # what node.server.tickets serves spot-check tickets from
    state.forward_hooks.append(served.hook)  # failures are logged by the forward path

    async def sealer(_: web.Application) -> AsyncIterator[None]:
        async def loop() -> None:
            while True:
                await asyncio.sleep(1.0)
                sealed = served.seal_idle(lambda tag: tag in state.store)
                if sealed:
                    log.debug("sealed idle sessions partial_blocks=%d", sealed)

        task = asyncio.create_task(loop())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        served.seal_all()

    app.cleanup_ctx.append(sealer)
    log.info(
        "recording served work dir=%s shard=%d max_bytes=%d",
        config.commit_dir,
        config.shard_id,
        config.served_max_bytes,
    )
    return served


def _install_span(app: web.Application, state: Any, config: ServerConfig) -> ServedLog:
    """A span hop records each shard's work as that shard's hop would (its own inputs and
    outputs, `NodeState.stage_hooks`; records under that shard), all spooled to the one
    commit dir for the agent (docs/compute.md, *Span hops*). Returns the first shard's log."""
    assert config.commit_dir is not None
    logs = {
        shard: ServedLog(
            config.commit_dir,
            shard,
            max_bytes=max(1, config.served_max_bytes // config.span.size),
            seal_idle_s=config.served_seal_idle_s,
            spool_tag=f"-shard{shard}",
        )
        for shard in config.span
    }
    for shard, served in logs.items():
        state.stage_hooks.setdefault(shard, []).append(served.hook)
    state.served_by_shard = logs
    state.backend.keep_stages = True
    first = logs[config.span.first]
    app[SERVED_KEY] = first
    state.served = first

    async def sealer(_: web.Application) -> AsyncIterator[None]:
        async def loop() -> None:
            while True:
                await asyncio.sleep(1.0)
                for served in logs.values():
                    served.seal_idle(lambda tag: tag in state.store)

        task = asyncio.create_task(loop())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for served in logs.values():
            served.seal_all()

    app.cleanup_ctx.append(sealer)
    log.info("recording served work dir=%s shards=%s, a log each", config.commit_dir, config.span)
    return first
