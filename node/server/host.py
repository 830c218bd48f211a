"""`planet node host`: one process serving several seats (shards of one or more models), each
its own shard app (node/server/app.py: its sessions, batcher, caches, price, credit and
served-work spools) on its own port with its own TLS identity, under one memory budget
(node/server/seats.py).

The process reads its seats file at start and again on SIGHUP (`planet node add` appends a
seat and signals), and starts each listed seat it does not run yet: parsed (`parse`, the
`planet node serve` arguments), admitted by the memory budget (refused by name when it does
not fit, before its shard is loaded), loaded, then listening; a running seat no longer
listed stops (`planet leave` of a seat takes it out of the file); a running seat's line edited
in place changes nothing until it is taken out and added again. After each pass it writes the
status file `<seats file>.status.json`: its pid, the pass number, the budget and every seat's
state (`serving` with its URL, or `refused` with the error's code and message). A seat that
fails leaves the others serving. SIGINT/SIGTERM stop every seat (their links closed as a
single node's are).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from node.model.manifest import Manifest
from node.server.backend import ShardBackend
from node.server.config import ServerConfig
from node.server.seats import (
    MemoryBudget,
    SeatCost,
    SeatSpec,
    read_seats,
    resident_weight_bytes,
    seat_cost,
    status_path,
    write_json,
)
from protocol.errors import PlanetError, UsageError

log = logging.getLogger(__name__)

# `planet node serve` arguments → (validated config, node key or None); PlanetError when bad
ParseSeat = Callable[[tuple[str, ...]], tuple[ServerConfig, Any]]
# (config, node key) → (app, TLS context or None, backend): node/server/run.py `shard_app`
LoadSeat = Callable[[ServerConfig, Any], tuple[web.Application, ssl.SSLContext | None, Any]]


def manifest_cost(config: ServerConfig) -> SeatCost:
    """What a seat may hold: its weights as loaded (from the manifest's shard size and quant)
    plus its KV caps."""
    manifest = Manifest.load(config.manifest_path)
    kv = config.max_cache_bytes + config.prefix_cache_bytes
    weights = sum(  # a span seat holds every shard of it
        resident_weight_bytes(manifest.shard(shard).size, manifest.shard(shard).quant)
        for shard in config.span
    )
    return seat_cost(manifest.model_hash, config.shard_id, weights, kv)


@dataclass
class Seat:
    port: int
    cost: SeatCost
    url: str
    runner: web.AppRunner


@dataclass
class SeatHost:
    seats_file: Path
    budget: MemoryBudget
    parse: ParseSeat
    load: LoadSeat
    cost: Callable[[ServerConfig], SeatCost] = manifest_cost
    running: dict[int, Seat] = field(default_factory=dict)
    passes: int = 0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def reload(self) -> list[dict[str, Any]]:
        """One pass over the seats file: start what is listed and not running; write and
        return the status of every listed seat."""
        async with self._lock:
            entries: list[dict[str, Any]] = []
            try:
                specs = read_seats(self.seats_file)
            except PlanetError as error:
                log.warning("seats file refused: %s", error.message)
                specs, entries = [], [_refused({}, error)]
            else:
                listed = {spec.port() for spec in specs}
                for port in [port for port in self.running if port not in listed]:
                    await self._stop(port)  # taken out of the file: `planet leave`
            for spec in specs:
                entries.append(await self._ensure(spec))
            self.passes += 1
            self._write_status(entries)
            return entries

    async def _ensure(self, spec: SeatSpec) -> dict[str, Any]:
        port = spec.port()
        if port is not None and port in self.running:  # not parsed (its key opened) again
            return _serving(self.running[port])
        try:  # off the loop: opening the node key takes a key derivation
            if port is None or port == 0:
                raise UsageError("a seat names its own port: `--port P` (P > 0), as two words")
            config, node_key = await asyncio.to_thread(self.parse, spec.argv)
            if config.port != port:
                raise UsageError(f"the seat names --port {port} and then {config.port}")
        except PlanetError as error:  # a bad flag, a key its password does not open
            return _refused({"port": port, "argv": list(spec.argv)}, error)
        where: dict[str, Any] = {"port": config.port, "shard": config.shard_id}
        try:
            cost = self.cost(config)
            where["model"] = cost.model
            self.budget.admit(config.port, cost)
        except PlanetError as error:
            log.warning("seat on port %d refused: %s", config.port, error.message)
            return _refused(where, error)
        try:
            seat = await self._start(config, node_key, cost)
        except (PlanetError, OSError) as error:
            self.budget.release(config.port)
            log.warning("seat on port %d failed to start: %s", config.port, error)
            if isinstance(error, OSError):
                return {**where, "state": "refused", "code": "listen_failed", "message": str(error)}
            return _refused(where, error)
        self.running[config.port] = seat
        return _serving(seat)

    async def _start(self, config: ServerConfig, node_key: Any, cost: SeatCost) -> Seat:
        app, context, backend = await asyncio.to_thread(self.load, config, node_key)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, config.host, config.port, ssl_context=context)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        scheme = "http" if context is None else "https"
        url = f"{scheme}://{config.host}:{config.port}"
        _say_started(backend, cost, url)
        return Seat(config.port, cost, url, runner)

    def _write_status(self, entries: list[dict[str, Any]]) -> None:
        write_json(
            status_path(self.seats_file),
            {
                "pid": os.getpid(),
                "pass": self.passes,
                "budget_bytes": self.budget.budget,
                "used_bytes": self.budget.used(),
                "seats": entries,
            },
        )

    async def _stop(self, port: int) -> None:
        seat = self.running.pop(port)
        log.info("seat on port %d (shard %d of %s) stops", port, seat.cost.shard, seat.cost.model)
        await seat.runner.cleanup()
        self.budget.release(port)

    async def close(self) -> None:
        for port in list(self.running):
            await self._stop(port)


def _serving(seat: Seat) -> dict[str, Any]:
    return {
        "port": seat.port,
        "model": seat.cost.model,
        "shard": seat.cost.shard,
        "state": "serving",
        "url": seat.url,
        "bytes": seat.cost.bytes,
    }


def _refused(where: dict[str, Any], error: PlanetError) -> dict[str, Any]:
    return {**where, "state": "refused", "code": error.code, "message": error.message}


def _say_started(backend: ShardBackend | Any, cost: SeatCost, url: str) -> None:
    layers = getattr(backend, "layers", ("?", "?"))
    print(
        f"planet node host: shard {cost.shard} layers {layers[0]}-{layers[1]} of {cost.model} "
        f"on {url}",
        flush=True,
    )


async def run_host(host: SeatHost) -> None:
    """Serve until SIGINT/SIGTERM; SIGHUP re-reads the seats file."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    reloads: set[asyncio.Task[Any]] = set()

    def reload() -> None:
        task = loop.create_task(host.reload())
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, reload)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    try:
        await host.reload()
        await stop.wait()
    finally:
        for task in list(reloads):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await host.close()
