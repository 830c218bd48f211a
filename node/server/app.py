"""aiohttp app factory for a compute node. Handlers are thin: parse → check → compute → answer.

    GET    /v1/stream           WebSocket: a circuit's links (node/server/stream.py)
    GET    /v1/shards/{k}[/chunks/{i}]  its shard file by chunks (node/server/shards.py)
    GET    /info                model, node key, shard, layers, quant, device, numerics, load,
                                sessions, cache bytes
    GET    /health              {"status": "ok"} once the shard is loaded

An HTTP refusal is JSON `{code, message}` with a 4xx/503 status (error middleware); a refusal
on a link is a named control message (protocol/stream.py); the node keeps serving either way.
A session is opened with the client's capability for this node and keyed by its tag
(`protocol.frames.sessions.session_tag`), so only its holder can read through or close it.
Per-caller shares (node/server/sessions.py, node/server/peers.py) keep one caller from taking
every slot. The forward pass runs on one worker thread, off the event loop, fed by the batcher
(node/server/batcher.py): decode steps of different sessions waiting together run as one
batched forward.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from node.server.backend import ShardBackend
from node.server.batcher import Batcher
from node.server.config import ServerConfig
from node.server.overlay import install_overlay
from node.server.payments import install_payments
from node.server.prefix_cache import install_prefix_cache
from node.server.sessions import SessionStore, short_tag
from node.server.shards import install_chunks
from node.server.state import CONFIG_KEY, STATE_KEY, NodeState
from node.server.stream import close_links, close_streams, stream
from protocol.errors import PlanetError
from protocol.frames.header import FRAME_VERSION
from protocol.numerics import NUMERICS

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------- middleware
def _error_response(code: str, message: str, status: int, hint: str | None = None) -> web.Response:
    body = {"code": code, "message": message}
    if hint:
        body["hint"] = hint
    return web.json_response(body, status=status)


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except PlanetError as error:
        log.info("refused path=%s code=%s message=%s", request.path, error.code, error.message)
        return _error_response(error.code, error.message, error.http_status, error.hint)
    except web.HTTPRequestEntityTooLarge as error:
        return _error_response("too_large", error.text or "request body too large", 413)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status, "http_error")
        return _error_response(code, error.reason, error.status)
    except Exception:
        log.exception("internal error path=%s", request.path)
        return _error_response("internal", "internal error on the node", 500)


# ----------------------------------------------------------------------------------- handlers
async def info(request: web.Request) -> web.Response:
    config = request.app[CONFIG_KEY]
    state = request.app[STATE_KEY]
    backend = state.backend
    uptime = time.monotonic() - state.started_s
    return web.json_response(
        {
            "model": backend.model_id,
            "model_hash": backend.model_hash,
            # the key its credits must be assigned to (docs/credits.md; None: it has none)
            "node_key": state.node_key,
            "shard": backend.shard_id,
            "layers": list(backend.layers),
            "hidden_size": backend.hidden_size,
            "quant": backend.quant,
            "device": backend.device,
            "protocol_version": FRAME_VERSION,
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
                "busy_fraction": (
                    round(state.batcher.stats.busy_s / uptime, 4) if uptime > 0 else 0.0
                ),
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
    )


async def health(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    return web.json_response({"status": "ok", "shard": state.backend.shard_id})


# ----------------------------------------------------------------------------------- factory
async def _evictor(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG_KEY]
    store = app[STATE_KEY].store

    async def loop() -> None:
        while True:
            await asyncio.sleep(config.evict_interval_s)
            for tag in store.evict_idle():
                log.info("session evicted (idle or too old) session=%s", short_tag(tag))

    task = asyncio.create_task(loop())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _executor(app: web.Application) -> AsyncIterator[None]:
    yield
    app[STATE_KEY].executor.shutdown(wait=False, cancel_futures=True)


def create_app(config: ServerConfig, backend: ShardBackend) -> web.Application:
    """The node's aiohttp application around an already-loaded shard."""
    config.validate()
    app = web.Application(client_max_size=config.max_request_bytes, middlewares=[error_middleware])
    app[CONFIG_KEY] = config
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forward")
    per_position = getattr(backend, "cache_bytes_per_position", None)
    app[STATE_KEY] = NodeState(
        backend=backend,
        store=SessionStore(
            max_sessions=config.max_sessions,
            max_cache_bytes=config.max_cache_bytes,
            idle_timeout_s=config.idle_timeout_s,
            max_sessions_per_peer=config.max_sessions_per_peer,
            max_cache_bytes_per_peer=config.max_cache_bytes_per_peer,
            max_session_age_s=config.max_session_age_s,
            reclaim_idle_s=config.reclaim_idle_s,
            bytes_per_position=int(per_position()) if per_position else 0,
        ),
        max_tokens_per_frame=config.max_tokens_per_frame,
        executor=executor,
        batcher=Batcher(
            backend, executor, max_batch=config.max_batch, max_queued=config.max_queued
        ),
    )
    install_prefix_cache(app[STATE_KEY], config)
    app.cleanup_ctx.append(_evictor)
    app.cleanup_ctx.append(_executor)
    if config.commit_dir is not None:
        from node.server.served import install_served  # torch: only when recording

        install_served(app, app[STATE_KEY], config)
    if config.credit_positions:
        install_payments(app, app[STATE_KEY], config)
    app.cleanup_ctx.append(close_links)
    app.on_shutdown.append(close_streams)
    app.router.add_get("/v1/stream", stream)
    install_overlay(app)  # the same links, reached through users' relay paths
    install_chunks(app, config)  # its shard file by chunks, for joining nodes
    app.router.add_get("/info", info)
    app.router.add_get("/health", health)
    return app
