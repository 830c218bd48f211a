"""The devnet's hosts (`planet devnet up --hosts`): every process in its own network namespace.

With `--hosts` the devnet runs on a lab of `deploy.netlab` instead of 127.0.0.1: one host per
process group, each with its own address on 10.77.0.0/24, and every link between two hosts
shaped (a flat one-way delay, or an inter-region latency matrix):

    anvil            8545                     the EVM chain
    validator<i>     26656 p2p, 26657 RPC     CometBFT + its ABCI app (26658, loopback) + the
                                              stake watcher (+ its verifier, --verifiers)
    node<i>          18100                    `planet stake` / `planet join` of operator i: the
                                              compute node and its agent (node0: also 18101,
                                              the second model's seat, and seat0's agent)
    gateway          8000                     `planet gateway serve`
    user             -                        where `planet devnet up` itself talks to the chains,
                                              and where a user's `planet ask` runs
    operator<i>      18100-18103              empty hosts for new operators (`planet devnet exec
                                              operator0 -- planet stake …`)
    relay<i>         9100, 9200-9203          empty hosts for relays (--relay-hosts N): `planet
                                              relay serve --port 9100`, and with
                                              --rendezvous-ports 9200-9203 the ports of the
                                              nodes it fronts
    router<i>        -                        nat<i>'s router (--nat-hosts N): it masquerades
                                              nat<i>'s LAN and lets in only answers
    nat<i>           (none inbound)           a host behind that NAT (10.78.<i>.2, outside the
                                              lab's network): it dials out, nothing dials in;
                                              a node there joins fronted by a relay

Services bind their host's own address (never 0.0.0.0: netlab's proxies for the other hosts'
same ports live in every namespace). The nodes' next-hop policy allows exactly the lab's range.

The lab belongs to a small keeper process (`python -m deploy.devnet.keeper`, its pid in
devnet.json) so that it outlives a detached `up`; `planet devnet down` stops the devnet's
processes, then the keeper, which removes every namespace, link and process of the lab
(`python -m deploy.netlab down` cleans up after a crashed keeper).

    Placement    where a devnet process runs: its address, its namespace, its argv there
    LinkPlan     the link shapes: a flat delay, or a matrix with the hosts placed in regions
    plan_hosts   the hosts, the ports each serves, the shapes: what the keeper makes
    start_lab    the keeper started and awaited; `stop_lab` ends it, `check_privileges` first
    inside       run this thread's network code inside one host (setns), then come back
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any

from deploy.devnet.plan import LinkPlan, Progress
from deploy.devnet.processes import StepFailed, exited, ours, spawn
from deploy.netlab import (
    DEFAULT_NETWORK,
    NetlabError,
    can_make_hosts,
    can_run_proxies,
    down_run,
    leftovers,
)
from deploy.netlab.regions import default_matrix, link_shapes, load_matrix
from deploy.netlab.shape import Shape
from node.config import DEVNET_ENV, DEVNET_PORTS_ENV
from protocol.errors import UnavailableError, UsageError

LOOPBACK = "127.0.0.1"
LOOPBACK_RANGE = "127.0.0.0/8"
CONTROL_HOST = "user"  # `up`, `status` and `fund` talk to the chains from here
ANVIL_PORT = 8545
COMMITTEE_BASE_PORT = 26656  # p2p; RPC +1, app +2 (loopback), pprof +3 (loopback)
NODE_PORT = 18100
SEAT_HOST = "node0"  # its node process also serves the second model's seat (second_model.py)
SEAT_PORT = NODE_PORT + 1  # that seat's port there
GATEWAY_PORT = 8000
FINDINGS_PORT = 8700  # a validator host's verifier serves its findings to the other verifiers
OPERATOR_PORTS = tuple(range(18100, 18104))  # exposed on the empty operator hosts
RELAY_PORT = 9100  # a relay host's `planet relay serve --port`
RENDEZVOUS_PORTS = (9200, 9203)  # its --rendezvous-ports: the nodes it fronts, one port each
MAX_RELAY_HOSTS = 8
MAX_NAT_HOSTS = 4
NAT_LAN = "10.78.{}.0/30"  # nat<i>'s private LAN behind router<i>
KEEPER_MODULE = "deploy.devnet.keeper"
KEEPER_READY_S = 60.0
KEEPER_STOP_S = 20.0
KEEPER_KILL_S = 10.0  # after SIGKILL: gone once the kernel has torn it down
MAX_OPERATOR_HOSTS = 8
MAX_LINK_MS = 10_000

_CLONE_NEWNET = 0x40000000
_NETNS_ROOT = Path("/run/netns")


class HostsUnavailable(UsageError):
    """`--hosts` cannot run here (privileges, a missing tool); the hint says how to get them."""

    code = "hosts_unavailable"


# --- where processes run --------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Where the devnet's processes run: all on 127.0.0.1, or each in its own host."""

    hosts: Mapping[str, Mapping[str, str]] | None = None  # name -> {address, netns}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Placement:
        lab = state.get("hosts") or {}
        return cls(lab.get("hosts") or None)

    @property
    def on_hosts(self) -> bool:
        return self.hosts is not None

    def address(self, host: str) -> str:
        return LOOPBACK if self.hosts is None else self._host(host)["address"]

    def netns(self, host: str) -> str | None:
        return None if self.hosts is None else self._host(host)["netns"]

    def argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """`argv` as run in `host` (`ip netns exec`), or unchanged on loopback."""
        netns = self.netns(host)
        return ["ip", "netns", "exec", netns, *argv] if netns else list(argv)

    @property
    def control_netns(self) -> str | None:
        return self.netns(CONTROL_HOST)

    def _host(self, host: str) -> Mapping[str, str]:
        assert self.hosts is not None
        if host not in self.hosts:
            raise UsageError(
                f"the devnet has no host {host!r}",
                hint=f"its hosts: {', '.join(self.hosts)}",
            )
        return self.hosts[host]


@contextlib.contextmanager
def inside(netns: str | None) -> Iterator[None]:
    """Make this thread's new sockets (and the processes it starts) live in `netns` until the
    block ends; a no-op for None. Sockets opened inside keep their namespace afterwards."""
    if netns is None:
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(_NETNS_ROOT / netns, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(libc, target, netns)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(libc, own, "this process's own network namespace")
    finally:
        os.close(own)


def _setns(libc: Any, fd: int, what: str) -> None:
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns into {what}: {os.strerror(errno)}")


# --- the plan: hosts, ports, links ----------------------------------------------------------


@dataclass(frozen=True)
class HostsPlan:
    names: tuple[str, ...]
    services: Mapping[str, tuple[int, ...]]  # host -> TCP ports it serves (exposed)
    shapes: Mapping[tuple[str, str], Shape]
    regions: Mapping[str, str]  # host -> region (matrix plans only)
    network: IPv4Network = DEFAULT_NETWORK
    behind_nat: Mapping[str, str] = dataclasses.field(default_factory=dict)  # host -> router


def nat_hosts(count: int) -> dict[str, str]:
    """nat<i> -> router<i>: the hosts behind NAT and their routers."""
    return {f"nat{i}": f"router{i}" for i in range(count)}


def host_names(
    validators: int, nodes: int, gateway: bool, operators: int, relays: int = 0, nats: int = 0
) -> list[str]:
    """The hosts on the lab's bridge (a NAT host's router among them, the NAT host not)."""
    return [
        "anvil",
        *(f"validator{i}" for i in range(validators)),
        *(f"node{i}" for i in range(nodes)),
        *(["gateway"] if gateway else []),
        CONTROL_HOST,
        *(f"operator{i}" for i in range(operators)),
        *(f"relay{i}" for i in range(relays)),
        *nat_hosts(nats).values(),
    ]


def plan_hosts(
    *,
    validators: int,
    nodes: int,
    gateway: bool,
    operators: int,
    links: LinkPlan,
    relays: int = 0,
    nats: int = 0,
) -> HostsPlan:
    """The lab for a devnet of this size (UsageError for a matrix that does not load). A NAT
    host's links are its router's: it reaches the others only through that router's proxies."""
    names = host_names(validators, nodes, gateway, operators, relays, nats)
    services = {name: ports for name in names if (ports := exposed_ports(name))}
    behind = nat_hosts(nats)
    if links.link_ms is not None:
        shape = Shape.from_latency(links.link_ms, kbytes_per_s=links.kbytes_per_s)
        shapes = {(a, b): shape for a in names for b in names if a != b}
        return HostsPlan(tuple(names), services, shapes, {}, behind_nat=behind)
    try:
        matrix = load_matrix(links.matrix) if links.matrix else default_matrix()
    except OSError as error:
        raise UsageError(
            f"--latency-matrix {links.matrix}: {error.strerror}",
            hint="a CSV like deploy/netlab/regions.csv",
        ) from None
    except NetlabError as error:  # a MatrixError (netlab stands alone: not a PlanetError)
        raise UsageError(f"--latency-matrix {links.matrix}: {error.message}") from None
    regions = {name: matrix.regions[i % len(matrix.regions)] for i, name in enumerate(names)}
    shapes = link_shapes(matrix, regions, kbytes_per_s=links.kbytes_per_s)
    return HostsPlan(tuple(names), services, shapes, regions, behind_nat=behind)


# --- the keeper -----------------------------------------------------------------------------


def check_privileges() -> None:
    """HostsUnavailable (one error line, one hint) unless namespaces and proxies can be made."""
    hosts_ok, hosts_reason = can_make_hosts()
    if not hosts_ok:
        reason = hosts_reason.split("; run as root", 1)[0]
        raise HostsUnavailable(
            f"--hosts needs network namespaces, which this process cannot make: {reason}",
            hint="run it as root (or with CAP_NET_ADMIN and CAP_SYS_ADMIN): sudo -E env "
            'PATH="$PATH" planet devnet up --hosts; `python -m deploy.netlab check` says what '
            "is missing; without --hosts the devnet runs on 127.0.0.1",
        )
    proxies_ok, proxies_reason = can_run_proxies()
    if not proxies_ok:
        raise HostsUnavailable(
            f"--hosts shapes its links with toxiproxy, which cannot run here: {proxies_reason}",
            hint="run `bash deploy/setup.sh` (it builds toxiproxy-server into .tools/bin) as "
            "root; `python -m deploy.netlab check` says what is missing",
        )


def start_lab(plan: HostsPlan, directory: Path, progress: Progress) -> dict[str, Any]:
    """Start the keeper and wait until its hosts and links are made; the `hosts` record of
    devnet.json, with the keeper's pid under "pid"."""
    plan_file, ready_file = directory / "hosts-plan.json", directory / "hosts.json"
    ready_file.unlink(missing_ok=True)
    plan_file.write_text(
        json.dumps(
            {
                "network": str(plan.network),
                "hosts": list(plan.names),
                "services": {name: list(ports) for name, ports in plan.services.items()},
                "behind_nat": [
                    [name, router, NAT_LAN.format(i)]
                    for i, (name, router) in enumerate(plan.behind_nat.items())
                ],
                "shapes": [
                    [a, b, s.latency_ms, s.jitter_ms, s.kbytes_per_s]
                    for (a, b), s in plan.shapes.items()
                ],
            },
            indent=1,
        )
    )
    log_path = directory / "logs" / "keeper.log"
    argv = [sys.executable, "-m", KEEPER_MODULE, str(plan_file), str(ready_file)]
    pid = spawn(argv, log_path)
    deadline = time.monotonic() + KEEPER_READY_S
    while not ready_file.is_file():
        if exited(pid, KEEPER_MODULE) or time.monotonic() > deadline:
            stop_lab({"hosts": {"pid": pid}})  # a keeper still starting removes what it made
            raise StepFailed("making the hosts", f"the hosts' keeper (pid {pid})", log_path)
        time.sleep(0.1)
    ready = json.loads(ready_file.read_text())
    if "error" in ready:
        raise HostsUnavailable(ready["error"], hint=ready.get("hint"))
    progress(
        f"      {len(ready['hosts'])} hosts on {ready['network']} (run {ready['run_id']}, "
        f"keeper pid {pid}, log {log_path})"
    )
    return {**ready, "pid": pid, "log": str(log_path), "regions": dict(plan.regions)}


def lab_alive(state: Mapping[str, Any]) -> bool:
    pid = (state.get("hosts") or {}).get("pid")
    return ours(pid, KEEPER_MODULE)


def stop_lab(state: Mapping[str, Any]) -> list[str]:
    """Stop the keeper (it removes the lab), and remove what a dead keeper left; what went."""
    lab = state.get("hosts") or {}
    if not lab:
        return []
    stopped = []
    pid = lab.get("pid")
    if ours(pid, KEEPER_MODULE):
        # waited for until gone (`exited`), not while `ours`: an exiting process's command line
        # is empty for a while before it is gone, and `devnet down` returned with it still there
        for sig, wait_s in ((signal.SIGTERM, KEEPER_STOP_S), (signal.SIGKILL, KEEPER_KILL_S)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), sig)
            deadline = time.monotonic() + wait_s
            while not exited(int(pid), KEEPER_MODULE) and time.monotonic() < deadline:
                time.sleep(0.05)
            if exited(int(pid), KEEPER_MODULE):
                break
        stopped.append("hosts")
    run_id = lab.get("run_id")
    if run_id and run_id in leftovers():
        down_run(str(run_id))
        stopped.append(f"leftovers of hosts run {run_id}")
    return stopped


def require_lab(state: Mapping[str, Any]) -> None:
    """UnavailableError when the devnet's hosts are gone (its keeper died)."""
    if state.get("hosts") and not lab_alive(state):
        raise UnavailableError(
            "the devnet's hosts are gone (their keeper exited)",
            hint="planet devnet down, then planet devnet up --hosts",
        )


def exec_argv(
    state: Mapping[str, Any], directory: Path, host: str, command: Sequence[str]
) -> tuple[list[str], dict[str, str]]:
    """(argv, env) that run `command` inside the devnet's `host`, with PLANET_DEVNET set so
    every `planet` command there finds this devnet, and PLANET_DEVNET_PORTS to the ports the
    other hosts reach there; `planet` is this interpreter's CLI."""
    place = Placement.from_state(state)
    if not place.on_hosts:
        raise UsageError(
            "this devnet runs on 127.0.0.1, not in hosts",
            hint="run the command directly, or start one with `planet devnet up --hosts`",
        )
    if not command:
        raise UsageError("no command to run", hint="planet devnet exec operator0 -- planet status")
    argv = list(command)
    if argv[0] == "planet":
        argv = [sys.executable, "-m", "planet", *argv[1:]]
    argv = place.argv(host, argv)  # an unknown host is refused here, naming the hosts
    require_lab(state)
    env = {**os.environ, DEVNET_ENV: str(directory)}
    ports = exposed_ports(host)
    if ports:  # `planet join` there picks one of these: other hosts reach no other port
        env[DEVNET_PORTS_ENV] = ",".join(str(port) for port in ports)
    return argv, env


def exposed_ports(host: str) -> tuple[int, ...]:
    """The ports of `host` (a `host_names` name) that the lab's links carry to the other hosts:
    what `plan_hosts` exposes and `exec_argv` names to the commands run there."""
    if host.startswith("operator"):
        return OPERATOR_PORTS
    if host.startswith("relay"):
        return (RELAY_PORT, *range(RENDEZVOUS_PORTS[0], RENDEZVOUS_PORTS[1] + 1))
    if host == SEAT_HOST:
        return (NODE_PORT, SEAT_PORT)
    if host.startswith("node"):
        return (NODE_PORT,)
    if host.startswith("validator"):
        return (COMMITTEE_BASE_PORT, COMMITTEE_BASE_PORT + 1, FINDINGS_PORT)
    return {"anvil": (ANVIL_PORT,), "gateway": (GATEWAY_PORT,)}.get(host, ())
