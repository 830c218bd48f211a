"""aiohttp app factory for a compute node. Handlers are thin: parse → check → compute → answer.

    POST   /v1/forward          binary frame in, binary frame out (same codec and dtype)
    DELETE /v1/sessions/{cap}   free the session this capability opened (idempotent)
    GET    /v1/stream           WebSocket: the chain's links (node/server/stream.py)
    GET    /info                model, shard, layers, quant, device, load, sessions, cache bytes
    GET    /health              {"status": "ok"} once the shard is loaded

Every refusal is JSON `{code, message}` with a 4xx/503 status (error middleware); the node keeps
serving; only a failure of the shard itself on a valid frame is a 500 (`compute_failed`).
A frame's `session` is the client's capability for this node; sessions are keyed by its tag
(`protocol.frames.session_tag`), so only its holder can append to, read through or close it.
Per-caller shares (node/server/sessions.py, node/server/peers.py) keep one caller from taking
every slot. The forward pass runs on one worker thread, off the event loop, fed by the batcher
(node/server/batcher.py): decode steps of different sessions waiting together run as one
batched forward. Streams (node/server/stream.py) use the same sessions and batcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
from aiohttp import web

from node.server.backend import ShardBackend
from node.server.batcher import Batcher
from node.server.config import ServerConfig
from node.server.peers import peer_key
from node.server.sessions import PeerQuotaError, Session, SessionStore, short_tag
from node.server.state import CONFIG_KEY, STATE_KEY, ComputeError, NodeState, after_forward
from node.server.stream import close_links, close_streams, stream
from protocol.errors import BusyError, PlanetError
from protocol.frames import (
    VERSION,
    Frame,
    FrameError,
    FrameLimits,
    NonFiniteError,
    SessionExpiredError,
    TooLargeError,
    WrongShardError,
    check_session_id,
    encode_body,
    encode_frame,
    parse_frame,
    session_tag,
)

log = logging.getLogger(__name__)

FRAME_CONTENT_TYPE = "application/x-planet-frame"
COMPUTE_MS_HEADER = "X-Planet-Compute-Ms"


class SlowRequestError(FrameError):
    """The request body did not arrive within the node's read timeout."""

    code = "slow_request"
    http_status = 408


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


# ----------------------------------------------------------------------------------- compute
class _AnswerRejected(Exception):
    """The answer could not be encoded after the cache already advanced (e.g. float16 overflow)."""

    def __init__(self, error: FrameError) -> None:
        super().__init__(error.message)
        self.error = error


def _answer(
    backend: ShardBackend, frame: Frame, out: np.ndarray, cache: object
) -> tuple[bytes, int]:
    h = frame.header
    if not np.isfinite(out).all():
        raise NonFiniteError("the layers' output is not finite (activations too large?)")
    out_header = replace(h, shard=backend.shard_id)
    if h.last_only and h.count > 1:
        out = out[:, -1:, :]
        out_header = replace(
            out_header, start=h.start + h.count - 1, count=1, shape=(1, 1, h.shape[2])
        )
    body = encode_body(out, h.dtype, h.codec)
    return encode_frame(out_header, body), backend.cache_bytes(cache)


async def _run_forward(
    state: NodeState, session: Session, frame: Frame, new: bool, peer: str
) -> web.Response:
    h = frame.header
    store = state.store
    tag = session.tag
    async with session.lock:
        if session.cache is None:  # closed while we waited
            raise SessionExpiredError(short_tag(tag))
        state.in_flight += 1
        try:
            store.check_start(session, h.start)
            hidden = frame.array()  # rejects NaN/Inf before the cache is touched
            out, compute_s = await state.batcher.run(peer, session.cache, hidden, h.start)
            if session.cache is None:  # evicted while it computed
                raise SessionExpiredError(short_tag(tag))
            after_forward(state, tag, h.start, hidden, out)
            try:
                answer, cache_bytes = _answer(state.backend, frame, out, session.cache)
            except FrameError as error:
                raise _AnswerRejected(error) from None
        except (FrameError, BusyError):  # refused before the cache moved: give the room back
            if new:
                store.close(tag, remember=False)
            else:
                store.release(session, h.count)
            raise
        except _AnswerRejected as rejected:  # the cache holds positions the client never got
            store.close(tag)
            raise rejected.error from None
        except Exception as error:
            store.close(tag, remember=False)
            log.exception("forward failed session=%s start=%d", short_tag(tag), h.start)
            raise ComputeError(f"forward failed: {type(error).__name__}: {error}") from None
        finally:
            state.in_flight -= 1
        store.advance(session, h.count, cache_bytes)
    state.forwards += 1
    log.debug(
        "forward session=%s start=%d count=%d compute_ms=%.2f",
        short_tag(tag),
        h.start,
        h.count,
        compute_s * 1000,
    )
    return web.Response(
        body=answer,
        content_type=FRAME_CONTENT_TYPE,
        headers={COMPUTE_MS_HEADER: f"{compute_s * 1000:.3f}"},
    )


# ----------------------------------------------------------------------------------- handlers
async def forward(request: web.Request) -> web.Response:
    config = request.app[CONFIG_KEY]
    state = request.app[STATE_KEY]
    peer = peer_key(request.remote)
    queued = state.peer_in_flight.get(peer, 0)
    if queued >= config.max_inflight_per_peer:
        raise PeerQuotaError(
            f"this address has {queued} frames in flight "
            f"(per-caller limit {config.max_inflight_per_peer})",
            hint="wait for answers before sending more frames",
        )
    state.peer_in_flight[peer] = queued + 1
    try:
        return await _forward(request, config, state, peer)
    finally:
        left = state.peer_in_flight[peer] - 1
        if left:
            state.peer_in_flight[peer] = left
        else:
            del state.peer_in_flight[peer]


async def _forward(
    request: web.Request, config: ServerConfig, state: NodeState, peer: str
) -> web.Response:
    if request.content_length is not None and request.content_length > config.max_request_bytes:
        raise TooLargeError(
            f"request of {request.content_length} bytes exceeds {config.max_request_bytes}"
        )
    try:
        async with asyncio.timeout(config.request_read_timeout_s):
            data = await request.read()
    except TimeoutError:
        raise SlowRequestError(
            f"request body did not arrive within {config.request_read_timeout_s:g} s"
        ) from None
    frame = parse_frame(data, state.limits)
    h = frame.header
    if h.shard != state.backend.shard_id:
        raise WrongShardError(h.shard, state.backend.shard_id)
    tag = session_tag(h.session)
    # No await between lookup and open: a new session is claimed atomically.
    session = state.store.lookup(tag, h.start)
    new = session is None
    owner = peer if session is None else session.peer  # who is charged for the positions
    for victim in state.store.reserve(h.count, new_session=new, peer=owner, session=session):
        log.info("session reclaimed for another caller session=%s", short_tag(victim))
    if session is None:
        session = state.store.open(tag, state.backend.new_cache(), peer=peer)
        state.store.hold(session, h.count)
        log.info(
            "session opened session=%s peer=%s sessions=%d", short_tag(tag), peer, len(state.store)
        )
    return await _run_forward(state, session, frame, new, peer)


async def delete_session(request: web.Request) -> web.Response:
    """Only the capability closes a session: its tag names nothing a stranger can act on."""
    state = request.app[STATE_KEY]
    tag = session_tag(check_session_id(request.match_info["session"]))
    closed = state.store.close(tag)
    if closed:
        log.info("session closed session=%s sessions=%d", short_tag(tag), len(state.store))
    return web.json_response({"session": tag, "closed": closed})


async def info(request: web.Request) -> web.Response:
    config = request.app[CONFIG_KEY]
    state = request.app[STATE_KEY]
    backend = state.backend
    uptime = time.monotonic() - state.started_s
    return web.json_response(
        {
            "model": backend.model_id,
            "model_hash": backend.model_hash,
            "shard": backend.shard_id,
            "layers": list(backend.layers),
            "hidden_size": backend.hidden_size,
            "quant": backend.quant,
            "device": backend.device,
            "protocol_version": VERSION,
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
            "load": {
                "in_flight": state.in_flight,
                "forwards": state.forwards,
                "tokens": state.tokens,
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
            "max_batch": config.max_batch,
            "max_queued": config.max_queued,
            "uptime_s": round(uptime, 1),
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
        limits=FrameLimits(
            hidden_size=backend.hidden_size,
            max_tokens=config.max_tokens_per_frame,
            max_body_bytes=config.max_request_bytes,
        ),
        executor=executor,
        batcher=Batcher(
            backend, executor, max_batch=config.max_batch, max_queued=config.max_queued
        ),
    )
    app.cleanup_ctx.append(_evictor)
    app.cleanup_ctx.append(_executor)
    if config.commit_dir is not None:
        from node.server.served import install_served  # torch: only when recording

        install_served(app, app[STATE_KEY], config)
    app.cleanup_ctx.append(close_links)
    app.on_shutdown.append(close_streams)
    app.router.add_post("/v1/forward", forward)
    app.router.add_get("/v1/stream", stream)
    app.router.add_delete("/v1/sessions/{session}", delete_session)
    app.router.add_get("/info", info)
    app.router.add_get("/health", health)
    return app
