"""`start_network`: start a network's validators (app, then cometbft) and wait for blocks."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from deploy.committee.cometbft import find_cometbft, flush_patched
from deploy.committee.network import Network, Validator
from deploy.committee.processes import (
    ProcessDiedError,
    pid_alive,
    read_pid,
    spawn,
    split_name,
    stop_pids,
)
from deploy.netlab.hosts import call_in_netns
from node.chain.committee_rpc import CommitteeRpc
from node.net import port_is_free
from protocol.errors import PlanetError, UnavailableError


class PortBusyError(UnavailableError):
    """A port the network needs is taken by another process."""

    code = "port_busy"

    def __init__(self, port: int, what: str) -> None:
        super().__init__(
            f"port {port} ({what}) is already in use",
            hint=f"stop what uses it (`ss -ltnp | grep :{port}`), or init with another --base-port",
        )
        self.port = port


def require_ports(ports: dict[int, str]) -> None:
    for port, what in ports.items():
        if not port_is_free(port):
            raise PortBusyError(port, what)


def app_command(validator: Validator) -> list[str]:
    return [
        sys.executable,
        "-m",
        "abci_app",
        "--home",
        validator.home,
        "--listen",
        validator.abci_url,
    ]


def cometbft_command(network: Network, validator: Validator) -> list[str]:
    argv = [str(find_cometbft()), "node", "--home", validator.home]
    if network.app == "kvstore":
        argv += ["--proxy_app", "kvstore"]
    return argv


def cometbft_env(
    network: Network, environ: Mapping[str, str], *, patched: bool, cores: int | None = None
) -> dict[str, str]:
    """cometbft's environment: `environ` with GOMAXPROCS = this host's cores shared among the
    network's validators (at least 1), unless `environ` sets GOMAXPROCS itself or the binary
    is not `patched` (`flush_patched`: upstream's 20 ns ABCI flush timer spins on one thread).

    Every validator of a local network runs on the same cores; with Go's default (one thread
    per core each) the idle validators spent about 40% of their CPU waking and parking threads
    (runtime.findRunnable/futex in a CPU profile). Blocks come as fast with one thread each.
    """
    env = dict(environ)
    if patched and "GOMAXPROCS" not in env:
        available = cores if cores is not None else _usable_cores()
        env["GOMAXPROCS"] = str(max(1, available // max(1, len(network.validators))))
    return env


def _usable_cores() -> int:
    """The cores this process may run on (Linux: its affinity; elsewhere: the machine's)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def _listens(port: int, netns: str | None) -> bool:
    """Whether something accepts connections on 127.0.0.1:port (of namespace `netns`)."""

    def probe() -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            return sock.connect_ex(("127.0.0.1", port)) == 0

    return probe() if netns is None else call_in_netns(netns, probe)


def wait_port_open(
    port: int, pid: int, name: str, log_path: Path, timeout_s: float, netns: str | None = None
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            raise ProcessDiedError(name, log_path)
        if _listens(port, netns):
            return
        time.sleep(0.05)
    raise UnavailableError(
        f"{name} did not listen on port {port} within {timeout_s:g} s", hint=f"read {log_path}"
    )


def start_network(
    network: Network,
    *,
    only: Iterable[int] | None = None,
    wait: bool = True,
    timeout_s: float = 60.0,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, int]:
    """Start every validator of the network that is not running; returns {name: pid} started.

    A validator is its app process and its cometbft process: when only one of them runs, it is
    stopped and both are started again (CometBFT cannot reconnect to a new app process, and a
    fresh app replays from its store during CometBFT's handshake). All needed ports are checked
    before anything starts. With `wait`, returns once every node's RPC answers, none is catching
    up, and all have committed a block after the start. On failure, the processes started by
    this call are stopped again.
    """
    indexes = sorted(set(only)) if only is not None else [v.index for v in network.validators]
    processes = ("app", "cometbft") if network.app == "planet" else ("cometbft",)
    planned: list[Validator] = []
    for index in indexes:
        pids = {f"{p}{index}": read_pid(network, p, index) for p in processes}
        live = {name: pid for name, pid in pids.items() if pid is not None}
        if len(live) == len(processes):
            continue
        if live:
            progress(f"validator{index}: {', '.join(live)} still running alone; restarting it")
            stop_pids(live, timeout_s=10)
        planned.append(network.validators[index])
    ports: dict[int, str] = {}
    for validator in [v for v in planned if v.netns is None]:  # a host's ports are its own
        ports[validator.p2p_port] = f"p2p of validator{validator.index}"
        ports[validator.rpc_port] = f"rpc of validator{validator.index}"
        if network.app == "planet":
            ports[validator.abci_port] = f"app of validator{validator.index}"
    require_ports(ports)
    started: dict[str, int] = {}
    try:
        for validator in planned:
            index = validator.index
            if network.app == "planet":
                pid = spawn(network, "app", index, app_command(validator))
                started[f"app{index}"] = pid
                wait_port_open(
                    validator.abci_port,
                    pid,
                    f"app{index}",
                    network.log_path("app", index),
                    timeout_s=min(timeout_s, 60),
                    netns=validator.netns,
                )
            started[f"cometbft{index}"] = spawn(
                network,
                "cometbft",
                index,
                cometbft_command(network, validator),
                env=cometbft_env(network, os.environ, patched=flush_patched(find_cometbft())),
            )
            progress(f"validator{index}: started")
        if wait:
            asyncio.run(wait_committing(network, started, timeout_s, progress))
    except BaseException:
        stop_pids({name: pid for name, pid in started.items() if pid_alive(pid)}, timeout_s=10)
        for name in started:
            network.pid_path(*split_name(name)).unlink(missing_ok=True)
        raise
    return started


async def wait_committing(
    network: Network,
    started: dict[str, int],
    timeout_s: float,
    progress: Callable[[str], None],
) -> None:
    """Until every running node answers, is connected to all other running nodes, is caught
    up, and has a block above the height seen when they all first answered."""
    running = [v for v in network.validators if read_pid(network, "cometbft", v.index) is not None]
    clients = [CommitteeRpc(v.rpc_url, timeout_s=2) for v in running]
    deadline = time.monotonic() + timeout_s
    target: int | None = None
    last_line = ""

    async def probe(client: CommitteeRpc) -> tuple[int, bool, int] | None:
        try:
            status = await client.status()
            peers = int((await client.net_info()).get("n_peers") or 0)
        except PlanetError:
            return None
        return status.latest_block_height, status.catching_up, peers

    try:
        while True:
            for name, pid in started.items():
                if not pid_alive(pid):
                    raise ProcessDiedError(name, network.log_path(*split_name(name)))
            results = await asyncio.gather(*(probe(c) for c in clients))
            heights = [r[0] if r is not None else None for r in results]
            answering = [h for h in heights if h is not None]
            if len(answering) == len(clients) and target is None:
                target = max(answering, default=0) + 1
            ready = target is not None and all(
                r is not None and not r[1] and r[0] >= target and r[2] >= len(clients) - 1
                for r in results
            )
            line = "heights " + " ".join("-" if h is None else str(h) for h in heights)
            line += "  peers " + " ".join("-" if r is None else str(r[2]) for r in results)
            if line != last_line:
                progress(line)
                last_line = line
            if ready:
                return
            if time.monotonic() > deadline:
                silent = [running[i].name for i, h in enumerate(heights) if h is None]
                raise UnavailableError(
                    f"the network did not commit blocks within {timeout_s:g} s ({line}"
                    + (f"; not answering: {', '.join(silent)}" if silent else "")
                    + ")",
                    hint=f"read the logs in {network.path / 'logs'}",
                )
            await asyncio.sleep(0.25)
    finally:
        for client in clients:
            await client.close()
