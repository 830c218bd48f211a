"""`serve(config)`: load the shard (hash-checked), set torch threads, run until signalled."""

from __future__ import annotations

import logging
import os
import ssl
from typing import Any

from aiohttp import web

from node.http_logs import quiet_malformed_http_logs
from node.links import server_context
from node.model.backends import skip_unused_backends
from node.model.manifest import Manifest
from node.server.app import create_app
from node.server.backend import ModelShardBackend, ShardBackend, served_span
from node.server.config import ServerConfig
from protocol.errors import ConfigError, PlanetError, UnavailableError
from protocol.links import is_loopback_host

log = logging.getLogger(__name__)


def default_torch_threads() -> int:
    """Half the cores, 1 to 4. Measured here (2 shared cores): with 2 threads one decode-step
    attention call took ~16 ms whenever another process held a core (the OpenMP barrier waits
    for a descheduled thread), against 0.03 ms with 1 thread; a local pipeline runs several
    processes on the same cores, so leaving headroom matters more than intra-op speed-up."""
    return max(1, min(4, (os.cpu_count() or 1) // 2))


def configure_torch_threads(threads: int) -> int:
    """Set torch's intra-op threads (0 = `default_torch_threads()`). Returns the value used."""
    import torch

    if threads <= 0:
        threads = default_torch_threads()
    torch.set_num_threads(threads)
    return threads


def _skip_unused_backends(config: ServerConfig) -> None:
    """This process serves one shard: keep the other quants' libraries out of it (hqq alone is
    ~1 s of every fp32/int8 node's start; node/model/backends.py). A manifest that does not
    load is left for the shard's load to report, as before."""
    try:
        manifest = Manifest.load(config.manifest_path)
        quants = {manifest.shard(shard).quant for shard in config.span}
    except PlanetError:
        return
    skipped = skip_unused_backends(quants)
    log.debug("quant=%s: not importing %s", ",".join(sorted(quants)), ", ".join(skipped) or "-")


def load_backend(config: ServerConfig) -> ShardBackend:
    """Config's shard, or its span of shards as one backend (node/server/span_backend.py)."""
    if config.last_shard is None:
        return ModelShardBackend(config.manifest_path, config.shard_id, device=config.device)
    from node.server.span_backend import load_span

    return load_span(config.manifest_path, config.span, device=config.device)


def shard_app(
    config: ServerConfig, node_key: Any = None, *, backend: ShardBackend | None = None
) -> tuple[web.Application, ssl.SSLContext | None, ShardBackend]:
    """One shard's app, loaded and wired (prices, tickets), and its TLS context (None:
    plaintext links); `serve` runs one, node/server/host.py several in one process."""
    config.validate()
    if node_key is None and not config.plaintext_links:
        raise ConfigError(
            "a node serves TLS bound to its node key, and none was given",
            hint="pass --node-key FILE, or --plaintext-links for loopback/local tests",
        )
    if backend is None:
        _skip_unused_backends(config)
        backend = load_backend(config)
    app = create_app(config, backend)
    if node_key is not None:
        from node.server.state import STATE_KEY
        from protocol.committee.credit_holder import node_party

        key = node_key.verify_key.encode()
        app[STATE_KEY].credit_party = node_party(key, backend.model_hash, backend.shard_id)
        app[STATE_KEY].credit_parties = {
            shard: node_party(key, backend.model_hash, shard) for shard in served_span(backend)
        }
        app[STATE_KEY].node_key = key.hex()
    if node_key is not None and config.committee_rpc and config.credit_positions:
        from node.server.chain_price import follow_chain_price

        key_hex = node_key.verify_key.encode().hex()
        follow_chain_price(app, key_hex, backend.model_hash, backend.shard_id)
    if node_key is not None and config.committee_rpc:
        from node.server.tickets import enable_tickets

        enable_tickets(
            app,
            node_key,
            config.committee_rpc,
            rate_ppm=config.spot_check_ppm,
            max_bytes=config.served_max_bytes,
        )
        log.info(
            "spot-check tickets on committee=%s rate_ppm=%d",
            config.committee_rpc,
            config.spot_check_ppm,
        )
    context = None if config.plaintext_links else server_context(node_key)
    if config.rendezvous and node_key is not None:
        from node.server.rendezvous import local_target, start_rendezvous

        scheme = "http" if context is None else "https"
        target = local_target(config.host, config.port)
        start_rendezvous(app, config.rendezvous, node_key, target, scheme)
    return app, context, backend


def serve(
    config: ServerConfig, node_key: Any = None, *, backend: ShardBackend | None = None
) -> None:
    """Blocks until SIGINT/SIGTERM. Raises IntegrityError/ConfigError before binding the port.
    `node_key` (the node's ed25519 SigningKey) is the key of the node's TLS certificate
    (node/links.py; required unless `config.plaintext_links`); with `config.committee_rpc`
    too, the node answers spot-check ticket requests (`node.server.tickets.enable_tickets`)
    from its served-work log (`--commit-dir`) or a ticket book. `backend`: serve this
    ShardBackend instead of loading config's shard (a test entry point wraps the loaded one:
    tests/doubles/cheating_node.py)."""
    threads = configure_torch_threads(config.torch_threads)
    app, context, backend = shard_app(config, node_key, backend=backend)
    log.info(
        "shard loaded shard=%d layers=%s quant=%s device=%s torch_threads=%d",
        backend.shard_id,
        backend.layers,
        backend.quant,
        backend.device,
        threads,
    )
    quiet_malformed_http_logs()
    if context is None:
        where = "" if is_loopback_host(config.host) else f" ON {config.host}, NOT LOOPBACK"
        log.warning(
            "links are PLAINTEXT (--plaintext-links, local mode)%s: anyone on the path reads "
            "and rewrites every activation",
            where,
        )
        links = "plaintext"
    else:
        links = f"TLS, node key {node_key.verify_key.encode().hex()}"
    scheme = "http" if context is None else "https"
    span = served_span(backend)
    print(
        f"planet node: shard{'s' if span.size > 1 else ''} {span} "
        f"layers {backend.layers[0]}-{backend.layers[1]} "
        f"of {backend.model_id} on {scheme}://{config.host}:{config.port} ({backend.device}; "
        f"{links})",
        flush=True,
    )
    try:
        web.run_app(
            app,
            host=config.host,
            port=config.port,
            ssl_context=context,
            print=None,
            access_log=None,
        )
    except OSError as error:
        raise UnavailableError(
            f"cannot listen on {config.host}:{config.port}: {error.strerror or error}",
            hint="pick another --port or stop what uses it",
        ) from None
