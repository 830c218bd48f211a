"""The node's prefix cache: KV of prompt prefixes reused across sessions (docs/compute.md §prefix).

A session's positions are cut into blocks of `BLOCK_POSITIONS` from position 0. Each block is
named by a hash chain over what this shard received for it:

    root    = sha256(DOMAIN ‖ node salt ‖ user salt or nothing)
    block i = sha256(block i-1 ‖ the block's input rows as little-endian float32)

Every shard receives activations, never token ids (the client embeds: node/model/head.py), and
the KV a shard holds for positions [0, n) is a function of exactly its inputs at [0, n) (causal
attention, absolute positions from 0), so this chain is a sound key on every hop, first or not.
A block stores the KV the session computed for its positions (`export_kv`) and the outputs it
sent on for them; a later session whose frame starts with blocks of the same chain gets that KV
copied into its own cache (`import_kv`) and those outputs, and computes only the rest. The
outputs it sends on are then byte for byte what a cold computation sent the first time, so the
next hop's chain matches too and it reuses its own blocks.

What is cached: blocks all of whose positions came in multi-position frames (prefill) of a
session that never rewound; a session's first one-position frame (decode) or rewind ends its
chain (decode steps run batched, with other rounding than a prefill: kept out so a hit is what a
cold prefill computes, up to the chunking of the prefill). Bounded by a byte budget (KV plus
outputs), least recently used block evicted first; a chain's earlier blocks are touched after its
later ones, so a chain is evicted from its end.

Privacy (docs/privacy.md): nothing cached ever leaves the node except as the outputs of the same
inputs; the node salt keeps the digests meaningless to anyone else; a client that asks for
isolation sends a salt of its own in the `open` (`prefix`), and its sessions only ever share
blocks with sessions opened with the same salt.

`forward` runs on the forward worker thread (one thread: no locks among its calls); `chain`,
`summary` and `routes` run on the event loop and only read (`routes` iterates snapshots).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from node.server.backend import PrefixBackend
from protocol.prefix_routes import MAX_ADVERTISED, SALT_BYTES

log = logging.getLogger(__name__)

BLOCK_POSITIONS = 16  # protocol/prefix_routes.py BLOCK_POSITIONS: the routes' block too
MAX_ROUTES_PER_BLOCK = 4  # route keys kept per block (one per upstream path, newest kept)
DOMAIN = b"planet/prefix-block/v1"
NODE_SALT_BYTES = 32


@dataclass(eq=False)
class PrefixChain:
    """One session's place in the chain: `blocks` full blocks hashed to `digest`, then the
    inputs and outputs of the partial block that follows (fewer than BLOCK_POSITIONS rows)."""

    digest: bytes
    blocks: int = 0
    routes: tuple[str, ...] = ()  # the open's prefix-route keys (protocol/prefix_routes.py)
    inputs: list[np.ndarray] = field(default_factory=list)
    outputs: list[np.ndarray] = field(default_factory=list)
    live: bool = True  # False once it decoded or rewound: no more lookups or blocks

    @property
    def pending(self) -> int:
        return sum(int(rows.shape[0]) for rows in self.inputs)

    def end(self) -> None:
        """Nothing more of this session is looked up or cached."""
        self.live = False
        self.inputs.clear()
        self.outputs.clear()


@dataclass
class _Block:
    kv: Any  # what the backend's export_kv made
    out: np.ndarray  # [BLOCK_POSITIONS, H] float32: the outputs sent on for these positions
    nbytes: int
    sessions: int = 1  # sessions that reached it (the one that computed it, then each hit)
    routes: list[str] = field(default_factory=list)  # route keys clients sent for it (newest last)


@dataclass
class PrefixStats:
    lookups: int = 0  # frames looked up (a live chain at a block boundary)
    hit_frames: int = 0  # of which started with at least one cached block
    hit_positions: int = 0  # positions served from cached blocks
    computed_positions: int = 0  # prefill positions of live chains computed
    inserted_blocks: int = 0
    evicted_blocks: int = 0


def _block_digest(previous: bytes, rows: np.ndarray) -> bytes:
    data = np.ascontiguousarray(rows, dtype="<f4").tobytes()
    return hashlib.sha256(previous + data).digest()


class PrefixCache:
    """Blocks of KV by chain digest, within `max_bytes`, LRU."""

    def __init__(
        self,
        backend: PrefixBackend,
        max_bytes: int,
        *,
        block: int = BLOCK_POSITIONS,
        node_salt: bytes | None = None,
        advertise_min_sessions: int = 2,
    ) -> None:
        if block < 1 or max_bytes < 0:
            raise ValueError("a prefix cache needs block >= 1 and max_bytes >= 0")
        self.backend = backend
        self.max_bytes = max_bytes
        self.block = block
        self._salt = node_salt if node_salt is not None else secrets.token_bytes(NODE_SALT_BYTES)
        # public: clients key their prompts' route keys with it (protocol/prefix_routes.py)
        self.route_salt = secrets.token_hex(SALT_BYTES)
        self.advertise_min_sessions = advertise_min_sessions
        self._blocks: OrderedDict[bytes, _Block] = OrderedDict()
        self.bytes = 0
        self.stats = PrefixStats()
        per_position = backend.cache_bytes_per_position() + 4 * backend.hidden_size
        self.block_bytes = per_position * block

    def __len__(self) -> int:
        return len(self._blocks)

    def chain(self, user_salt: str | None = None, routes: Sequence[str] = ()) -> PrefixChain:
        """A new session's chain: shared with every session of the same salt (none: all
        sessions of the node that did not ask for isolation). `routes`: the prompt's route
        keys from its open, advertised for the blocks it reaches (never for an isolated
        session's)."""
        tail = b"\x00" if user_salt is None else b"\x01" + user_salt.encode("ascii")
        return PrefixChain(
            digest=hashlib.sha256(DOMAIN + self._salt + tail).digest(),
            routes=tuple(routes) if user_salt is None else (),
        )

    # ------------------------------------------------------------------------------ forward
    def forward(self, chain: PrefixChain, hidden: np.ndarray, start: int, cache: Any) -> np.ndarray:
        """What `backend.forward(hidden, positions start.., cache)` returns, with the frame's
        leading cached blocks copied into `cache` instead of computed."""
        steps = int(hidden.shape[1])
        if chain.live and (steps == 1 or start != chain.blocks * self.block + chain.pending):
            chain.end()
        if not chain.live:
            return self._compute(hidden, start, cache)
        touched: list[bytes] = []
        served: list[np.ndarray] = []
        if not chain.inputs:  # at a block boundary: look the frame's leading blocks up
            self.stats.lookups += 1
            while (len(served) + 1) * self.block <= steps:
                at = len(served) * self.block
                digest = _block_digest(chain.digest, hidden[0, at : at + self.block])
                found = self._blocks.get(digest)
                if found is None:
                    break
                self.backend.import_kv(cache, found.kv)
                served.append(found.out)
                touched.append(digest)
                chain.digest, chain.blocks = digest, chain.blocks + 1
                found.sessions += 1
                self._route(chain, found)
        hit = len(served) * self.block
        if hit:
            self.stats.hit_frames += 1
            self.stats.hit_positions += hit
        parts = [block.reshape(1, self.block, -1) for block in served]
        if hit < steps:
            computed = self._compute(hidden[:, hit:], start + hit, cache)
            self.stats.computed_positions += steps - hit
            touched += self._record(chain, hidden[0, hit:], computed[0], cache)
            parts.append(computed)
        for digest in reversed(touched):  # a chain's first blocks are evicted last
            if digest in self._blocks:
                self._blocks.move_to_end(digest)
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)

    def _compute(self, hidden: np.ndarray, start: int, cache: Any) -> np.ndarray:
        positions = np.arange(start, start + hidden.shape[1], dtype=np.int64)
        return self.backend.forward(np.ascontiguousarray(hidden), positions, cache)

    def _record(
        self, chain: PrefixChain, inputs: np.ndarray, outputs: np.ndarray, cache: Any
    ) -> list[bytes]:
        """Append computed rows to the chain; cache each block they complete. The digests of
        the blocks completed."""
        chain.inputs.append(inputs)
        chain.outputs.append(outputs)
        done: list[bytes] = []
        while chain.pending >= self.block:
            rows_in = np.concatenate(chain.inputs)
            rows_out = np.concatenate(chain.outputs)
            digest = _block_digest(chain.digest, rows_in[: self.block])
            first = chain.blocks * self.block
            held = self._blocks.get(digest)
            if held is not None:  # computed again (the frame did not start at its boundary)
                held.sessions += 1
            elif self._make_room(self.block_bytes):
                kv = self.backend.export_kv(cache, first, first + self.block)
                out = rows_out[: self.block].astype(np.float32, copy=True)
                held = self._blocks[digest] = _Block(kv=kv, out=out, nbytes=self.block_bytes)
                self.bytes += self.block_bytes
                self.stats.inserted_blocks += 1
            done.append(digest)
            chain.digest, chain.blocks = digest, chain.blocks + 1
            if held is not None:
                self._route(chain, held)
            rest_in, rest_out = rows_in[self.block :], rows_out[self.block :]
            chain.inputs = [rest_in] if rest_in.shape[0] else []
            chain.outputs = [rest_out] if rest_out.shape[0] else []
        return done

    @staticmethod
    def _route(chain: PrefixChain, block: _Block) -> None:
        """Tie the route key the session's open sent for this block (if any) to it."""
        if chain.blocks > len(chain.routes):
            return
        key = chain.routes[chain.blocks - 1]
        if key in block.routes:
            block.routes.remove(key)
        block.routes.append(key)
        del block.routes[:-MAX_ROUTES_PER_BLOCK]

    def routes(self) -> dict[str, Any]:
        """What /info advertises as `prefix_routes` (protocol/prefix_routes.py): the route keys
        of blocks reached by at least `advertise_min_sessions` sessions, most recently used
        first, at most MAX_ADVERTISED."""
        keys: list[str] = []
        seen: set[str] = set()
        # called on the event loop while the worker thread may change the blocks: iterate
        # snapshots (taken in one C call each, under the GIL)
        for block in reversed(list(self._blocks.values())):
            if block.sessions < self.advertise_min_sessions:
                continue
            for key in reversed(list(block.routes)):
                if key not in seen and len(keys) < MAX_ADVERTISED:
                    seen.add(key)
                    keys.append(key)
            if len(keys) >= MAX_ADVERTISED:
                break
        return {"salt": self.route_salt, "block_positions": self.block, "keys": keys}

    def _make_room(self, nbytes: int) -> bool:
        if nbytes > self.max_bytes:
            return False
        while self.bytes + nbytes > self.max_bytes:
            _, evicted = self._blocks.popitem(last=False)
            self.bytes -= evicted.nbytes
            self.stats.evicted_blocks += 1
        return True

    def summary(self) -> dict[str, int]:
        """What /info shows (counts only: never a digest)."""
        stats = self.stats
        return {
            "block_positions": self.block,
            "blocks": len(self._blocks),
            "bytes": self.bytes,
            "max_bytes": self.max_bytes,
            "lookups": stats.lookups,
            "hit_frames": stats.hit_frames,
            "hit_positions": stats.hit_positions,
            "computed_positions": stats.computed_positions,
            "inserted_blocks": stats.inserted_blocks,
            "evicted_blocks": stats.evicted_blocks,
        }


def install_prefix_cache(state: Any, config: Any) -> PrefixCache | None:
    """Give a node (NodeState, ServerConfig) its prefix cache when the config asks for one and
    its backend can copy KV blocks (`PrefixBackend`); the batcher then reuses it."""
    backend = state.backend
    if config.prefix_cache_bytes <= 0 or not (
        hasattr(backend, "export_kv") and hasattr(backend, "import_kv")
    ):
        return None
    if not getattr(backend, "prefix_reusable", True):
        log.info(
            "prefix cache off: this backend cannot reuse KV blocks (sliding-window layers, or "
            "a span hop, whose inner shards' inputs its commitments need)"
        )
        return None
    state.prefix = PrefixCache(
        backend,
        config.prefix_cache_bytes,
        advertise_min_sessions=config.prefix_advertise_min_sessions,
    )
    state.batcher.prefix = state.prefix
    return state.prefix
