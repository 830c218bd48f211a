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
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from node.server.backend import ShardBackend
from node.server.batcher import Batcher
from node.server.config import ServerConfig
from node.server.info_body import info_body
from node.server.overlay import install_overlay
from node.server.paid_work import install_payments
from node.server.prefix_cache import install_prefix_cache
from node.server.ring import RingHeads
from node.server.sessions import SessionStore, short_tag
from node.server.shards import install_chunks
from node.server.state import CONFIG_KEY, STATE_KEY, NodeState
from node.server.stream import close_links, close_streams, stream
from protocol.errors import PlanetError

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
    return web.json_response(info_body(request.app[STATE_KEY], request.app[CONFIG_KEY]))


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
    app[STATE_KEY].ring_heads = RingHeads(config.manifest_path, executor)
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
