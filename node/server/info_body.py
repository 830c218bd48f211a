"""What a node's GET /info answers (node/server/app.py), and its overlay door answers to an
INFO_ASK on a user's link (node/server/overlay.py): one body, so a client reading it over the
overlay sees what a direct reader sees."""

from __future__ import annotations

import time
from typing import Any

from node.server.backend import served_span
from node.server.config import ServerConfig
from node.server.state import NodeState
from protocol.frames.header import FRAME_VERSION
from protocol.numerics import NUMERICS
from protocol.open_features import ADVERTISED, RING


def info_body(state: NodeState, config: ServerConfig) -> dict[str, Any]:
    backend = state.backend
    uptime = time.monotonic() - state.started_s
    return {
        "model": backend.model_id,
        "model_hash": backend.model_hash,
        # the key its credits must be assigned to (docs/credits.md; None: it has none)
        "node_key": state.node_key,
        "shard": backend.shard_id,
        # the shards it runs as one hop, in order (a span: node/server/span_backend.py)
        "shards": list(served_span(backend).shards),
        "layers": list(backend.layers),
        "hidden_size": backend.hidden_size,
        "quant": backend.quant,
        "device": backend.device,
        "protocol_version": FRAME_VERSION,
        # the open fields it takes beyond the first open (protocol/open_features.py): a
        # client sends `next.alternates` only to a previous hop that lists it
        "open_features": [*ADVERTISED, *((RING,) if _ring(state) else ())],
        # sessions whose decode loop this node ran (docs/overlay.md, *The ring*)
        "ring_sessions": 0 if state.ring_heads is None else state.ring_heads.sessions,
        # the numerics its shard computes with (protocol/numerics.py): verifiers compare
        # its outputs bitwise only when theirs is the same
        "numerics": NUMERICS,
        "sessions": len(state.store),
        "cache_bytes": state.store.total_cache_bytes,
        "peers": state.store.peers(),
        "max_sessions": config.max_sessions,
        "max_cache_bytes": config.max_cache_bytes,
        "max_sessions_per_peer": state.store.max_sessions_per_peer,
        "max_cache_bytes_per_peer": state.store.max_cache_bytes_per_peer,
        "max_inflight_per_peer": config.max_inflight_per_peer,
        "idle_timeout_s": config.idle_timeout_s,
        "next_hops": config.next_hops.mode,  # the policy only, never its URLs
        # positions one credit pays for on this node (0: free; node/server/payments.py):
        # its price registered on the chain once read (node/server/chain_price.py)
        "credit_positions": config.credit_positions
        if state.payments is None
        else state.payments.positions,
        # a span hop's price of each of its shards (docs/compute.md, *Span hops*)
        "shard_prices": getattr(state.payments, "shard_prices", lambda: None)(),
        "credits": None
        if state.payments is None
        else {
            "accepted": state.payments.accepted,
            "refused": state.payments.refused,
            # sessions stopped credit_double_spent (node/server/credit_locks.py)
            "double_spent": state.payments.double_spent,
        },
        "load": {
            "in_flight": state.in_flight,
            "forwards": state.forwards,
            "tokens": state.tokens,
            # decode forwards and their compute time (clients' cost models read these)
            "decode_batches": state.batcher.stats.decode_batches,
            "decode_s": round(state.batcher.stats.decode_s, 6),
            "busy_fraction": (round(state.batcher.stats.busy_s / uptime, 4) if uptime > 0 else 0.0),
            "queued": state.batcher.queued,
            "batches": state.batcher.stats.batches,
            "batched_rows": state.batcher.stats.rows,
            "largest_batch": state.batcher.stats.largest_batch,
            "stream_bytes_in": state.stream_bytes_in,
            "stream_bytes_out": state.stream_bytes_out,
            "stream_bytes_forwarded": state.stream_bytes_forwarded,
        },
        # prefix cache counters (node/server/prefix_cache.py; null: none on this node)
        "prefix_cache": None if state.prefix is None else state.prefix.summary(),
        # the route keys of prompt prefixes it holds (protocol/prefix_routes.py)
        "prefix_routes": None if state.prefix is None else state.prefix.routes(),
        # links to next hops (node/server/link_pool.py): open now, and handshakes so far
        "links": state.links.info() if state.links is not None else None,
        "max_batch": config.max_batch,
        "max_queued": config.max_queued,
        "uptime_s": round(uptime, 1),
        "instance": state.instance,
    }


def _ring(state: NodeState) -> bool:
    """Whether this node runs rings: it holds the model's client head (node/server/ring.py)."""
    return state.ring_heads is not None and state.ring_heads.available
