"""What one node process holds while it serves: the shard, its sessions, the compute queue,
the downstream links of its streams, and counters. Shared by the HTTP and stream handlers."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from node.server.backend import ShardBackend
from node.server.batcher import Batcher
from node.server.config import ServerConfig
from node.server.sessions import SessionStore
from protocol.errors import PlanetError
from protocol.frames import FrameLimits


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
    batcher: Batcher
    started_s: float = field(default_factory=time.monotonic)
    in_flight: int = 0
    peer_in_flight: dict[str, int] = field(default_factory=dict)
    forwards: int = 0
    # streams (node/server/stream.py)
    routes_by_feed: dict[str, Any] = field(default_factory=dict)  # feed tag -> Route
    links: Any = None  # DownLinks, created with the app's client session
    streams: set[Any] = field(default_factory=set)  # accepted WebSockets (closed on shutdown)
    stream_bytes_in: int = 0  # WebSocket bytes received on streams (framing included)
    stream_bytes_out: int = 0  # WebSocket bytes sent on streams (framing included)
    stream_bytes_forwarded: int = 0  # of which to the next hop (data messages)


CONFIG_KEY = web.AppKey("config", ServerConfig)
STATE_KEY = web.AppKey("state", NodeState)
