"""Compute node server: serves one layer shard to circuits (frames over WebSocket links).

config.py     ServerConfig (frozen, units in field names)
app.py        aiohttp app factory, thin handlers (/info, /health), error middleware
stream.py     GET /v1/stream: a node's end of a circuit's links, sessions attached downstream
link_pool.py  links to next hops: one multiplexed link each, dialled ahead, bounded, replaced
warm_targets.py  which next hops the pool dials ahead (the next shard's replicas)
next_hops.py  which next hops an `open` may make this node dial (none, list, committee, any)
state.py      what a serving node holds (NodeState), the app keys
sessions.py   per-session KV caches keyed by capability tag: open, advance, evict, fair shares
peers.py      who a caller is (peer address, IPv6 /64) for per-caller limits
batcher.py    the compute queue: continuous batching of decode steps, round-robin, bounded
backend.py    what the server needs from a shard (ShardBackend) and the real one (node.model)
served.py     the served-work log for commit-reveal and spot checks (`--commit-dir`)
tickets.py    spot-check tickets: POST /v1/tickets, GET /v1/commitments/{tag}
run.py        `serve(config)`: load the shard, set torch threads, run the app
launcher.py   start/stop shard node processes on loopback (`planet local`, tests, bench)

The package imports nothing itself: `planet local`, the node agent and `planet devnet status`
import launcher.py alone and do not pay for the server's app (aiohttp.web, numpy; issue 41).
"""
