"""A compute node process with spot-check tickets, for tests only (honest, or noisy on purpose).

    python -m tests.integration.spotcheck_node --manifest M --shard 1 --port P \
        --node-key HEX --seed 0xHEX --verifier HEX [--rate-ppm N] [--noise-every K]

Runs the real node server (`node.server.app.create_app` over the hash-checked shard) with
`node.server.tickets.install` (a `TicketBook` and a `StaticPolicy` of one epoch seed and one
verifier). `--noise-every K` wraps the shard in `cheats.NoisyShard` (10 % noise on every K-th
position, confirm=CHEAT): a dishonest node, possible only from this test script.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch
from aiohttp import web
from nacl.signing import SigningKey

from node.server.app import create_app
from node.server.backend import ModelShardBackend
from node.server.config import ServerConfig
from node.server.tickets import StaticPolicy, TicketBook, install
from node.verifier import cheats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--shard", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--node-key", required=True, help="ed25519 seed, 64 hex")
    parser.add_argument("--seed", required=True, help="the epoch seed, 0x + 64 hex")
    parser.add_argument("--verifier", required=True, help="the verifier's key, 64 hex")
    parser.add_argument("--rate-ppm", type=int, default=1_000_000)
    parser.add_argument("--noise-every", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    torch.set_num_threads(1)
    config = ServerConfig(manifest_path=args.manifest, shard_id=args.shard, port=args.port)
    backend = ModelShardBackend(args.manifest, args.shard, device="cpu")
    if args.noise_every:
        backend.model = cheats.NoisyShard(
            backend.model, 0.1, args.noise_every, 7, confirm=cheats.CHEAT
        )
    app = create_app(config, backend)
    policy = StaticPolicy({args.seed}, [args.verifier], args.rate_ppm)
    key = SigningKey(bytes.fromhex(args.node_key))
    install(app, TicketBook(shard=args.shard), key, policy)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
