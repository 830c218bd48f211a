"""Compute node server: serves one layer shard over HTTP (binary activation frames in and out).

config.py    ServerConfig (frozen, units in field names)
sessions.py  per-session KV caches keyed by capability tag: open, advance, evict, fair shares
batcher.py   the compute queue: continuous batching of decode steps, round-robin, bounded
stream.py    GET /v1/stream: node-to-node forwarding (the chain), downstream links
state.py     what a serving node holds (NodeState), the app keys
peers.py     who a caller is (peer address, IPv6 /64) for per-caller limits
backend.py   what the server needs from a shard (ShardBackend) and the real one (node.model)
app.py       aiohttp app factory, thin handlers (POST /v1/forward, /info, ...), error middleware
run.py       `serve(config)`: load the shard, set torch threads, run the app
launcher.py  start/stop shard node processes on loopback (`planet local`, tests, bench)
"""

from node.server.app import create_app
from node.server.config import ServerConfig

__all__ = ["ServerConfig", "create_app"]
