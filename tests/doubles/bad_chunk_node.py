"""A compute node that serves corrupted shard chunks: `planet node serve` whose chunk route
flips a byte of every chunk it sends (after the node's own check), the peer a joining node
must ban (tests/integration/test_shard_fetch_nodes.py).

    python -m tests.doubles.bad_chunk_node -v node serve --manifest M --shard 0 ...

Everything else (sessions, forward passes, /info) is the real node. The product knows nothing
of it; start it with `start_node(module=MODULE)`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from aiohttp import web

import node.server.app as server_app
from node.procs import exit_process
from node.server.config import ServerConfig
from node.server.shards import CHUNKS_KEY, ChunkServer
from planet.main import main as planet_main

MODULE = "tests.doubles.bad_chunk_node"
log = logging.getLogger(__name__)


class CorruptingChunks(ChunkServer):
    async def chunk(self, request: web.Request) -> web.Response:
        answer = await super().chunk(request)
        body = answer.body
        if answer.status == 200 and isinstance(body, bytes) and body:
            answer.body = bytes([body[0] ^ 0xFF]) + body[1:]
        return answer


def install_corrupting(app: web.Application, config: ServerConfig) -> ChunkServer:
    server = CorruptingChunks(config)
    app[CHUNKS_KEY] = server
    app.router.add_get("/v1/shards/{shard}/chunks/{index}", server.chunk)
    app.router.add_get("/v1/shards/{shard}", server.describe)
    log.warning("BAD CHUNK NODE: every chunk it serves is corrupted (tests only)")
    return server


def main(argv: Sequence[str] | None = None) -> int:
    server_app.install_chunks = install_corrupting  # create_app looks it up at call time
    return planet_main(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    exit_process(main)
