"""aiohttp app factory for a compute node. Handlers are thin: parse → check → compute → answer.

    POST   /v1/forward          binary frame in, binary frame out (same codec and dtype)
    DELETE /v1/sessions/{id}    free a session's KV cache (idempotent)
    GET    /info                model, shard, layers, quant, device, load, sessions, cache bytes
    GET    /health              {"status": "ok"} once the shard is loaded

Every refusal is JSON `{code, message}` with a 4xx/503 status (error middleware); the node keeps
serving. The forward pass runs on one worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np
from aiohttp import web

from node.server.backend import ShardBackend
from node.server.config import ServerConfig
from node.server.sessions import Session, SessionStore
from protocol.errors import PlanetError
from protocol.frames import (
    VERSION,
    Frame,
    FrameError,
    FrameLimits,
    SessionExpiredError,
    TooLargeError,
    WrongShardError,
    check_session_id,
    encode_body,
    encode_frame,
    parse_frame,
)

log = logging.getLogger(__name__)

FRAME_CONTENT_TYPE = "application/x-planet-frame"
COMPUTE_MS_HEADER = "X-Planet-Compute-Ms"


class ComputeError(PlanetError):
    """The shard failed on a valid frame; the session is dropped (its cache may be partial)."""

    code = "compute_failed"
    http_status = 500


@dataclass
class NodeState:
    backend: ShardBackend
    store: SessionStore
    limits: FrameLimits
    executor: ThreadPoolExecutor
    started_s: float = field(default_factory=time.monotonic)
    in_flight: int = 0
    forwards: int = 0
    compute_s: float = 0.0


CONFIG_KEY = web.AppKey("config", ServerConfig)
STATE_KEY = web.AppKey("state", NodeState)


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
def _compute(backend: ShardBackend, frame: Frame, cache: object) -> tuple[bytes, int, float]:
    """Worker thread: decode, run the layers, encode the answer. Returns (frame, cache bytes, s)."""
    h = frame.header
    hidden = frame.array()  # rejects NaN/Inf
    positions = np.arange(h.start, h.start + h.count, dtype=np.int64)
    t0 = time.perf_counter()
    out = backend.forward(hidden, positions, cache)
    compute_s = time.perf_counter() - t0
    out_header = replace(h, shard=backend.shard_id)
    if h.last_only and h.count > 1:
        out = out[:, -1:, :]
        out_header = replace(
            out_header, start=h.start + h.count - 1, count=1, shape=(1, 1, h.shape[2])
        )
    body = encode_body(out, h.dtype, h.codec)
    return encode_frame(out_header, body), backend.cache_bytes(cache), compute_s


async def _run_forward(state: NodeState, session: Session, frame: Frame, new: bool) -> web.Response:
    h = frame.header
    store = state.store
    loop = asyncio.get_running_loop()
    async with session.lock:
        if session.cache is None:  # closed while we waited
            raise SessionExpiredError(h.session)
        store.check_start(session, h.start)
        state.in_flight += 1
        try:
            answer, cache_bytes, compute_s = await loop.run_in_executor(
                state.executor, _compute, state.backend, frame, session.cache
            )
        except FrameError:
            if new:
                store.close(h.session, remember=False)
            raise
        except Exception as error:
            store.close(h.session, remember=False)
            log.exception("forward failed session=%s start=%d", h.session, h.start)
            raise ComputeError(f"forward failed: {type(error).__name__}: {error}") from None
        finally:
            state.in_flight -= 1
        store.advance(session, h.count, cache_bytes)
    state.forwards += 1
    state.compute_s += compute_s
    log.debug(
        "forward session=%s start=%d count=%d compute_ms=%.2f",
        h.session,
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
    if request.content_length is not None and request.content_length > config.max_request_bytes:
        raise TooLargeError(
            f"request of {request.content_length} bytes exceeds {config.max_request_bytes}"
        )
    frame = parse_frame(await request.read(), state.limits)
    h = frame.header
    if h.shard != state.backend.shard_id:
        raise WrongShardError(h.shard, state.backend.shard_id)
    # No await between lookup and open: a new session id is claimed atomically.
    session = state.store.lookup(h.session, h.start)
    new = session is None
    state.store.reserve(h.count, new_session=new)
    if session is None:
        session = state.store.open(h.session, state.backend.new_cache())
        log.info("session opened session=%s sessions=%d", h.session, len(state.store))
    return await _run_forward(state, session, frame, new)


async def delete_session(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    session_id = check_session_id(request.match_info["session"])
    closed = state.store.close(session_id)
    if closed:
        log.info("session closed session=%s sessions=%d", session_id, len(state.store))
    return web.json_response({"session": session_id, "closed": closed})


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
            "max_sessions": config.max_sessions,
            "max_cache_bytes": config.max_cache_bytes,
            "idle_timeout_s": config.idle_timeout_s,
            "load": {
                "in_flight": state.in_flight,
                "forwards": state.forwards,
                "busy_fraction": round(state.compute_s / uptime, 4) if uptime > 0 else 0.0,
            },
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
            for session_id in store.evict_idle():
                log.info("session evicted (idle) session=%s", session_id)

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
    app[STATE_KEY] = NodeState(
        backend=backend,
        store=SessionStore(
            max_sessions=config.max_sessions,
            max_cache_bytes=config.max_cache_bytes,
            idle_timeout_s=config.idle_timeout_s,
        ),
        limits=FrameLimits(
            hidden_size=backend.hidden_size,
            max_tokens=config.max_tokens_per_frame,
            max_body_bytes=config.max_request_bytes,
        ),
        executor=ThreadPoolExecutor(max_workers=1, thread_name_prefix="forward"),
    )
    app.cleanup_ctx.append(_evictor)
    app.cleanup_ctx.append(_executor)
    app.router.add_post("/v1/forward", forward)
    app.router.add_delete("/v1/sessions/{session}", delete_session)
    app.router.add_get("/info", info)
    app.router.add_get("/health", health)
    return app
