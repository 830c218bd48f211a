"""Shaped links between a lab's hosts: delay, jitter, bandwidth and cuts per ordered pair of hosts.

How a connection is shaped (the reasons for this design are in the package docstring). In host A's
namespace every other host's address is also a local address (on `lo`), and A's policy routing
rules read:

    90   to <A's address>                           lookup local  what comes to A stays in A
    95   from <A's address>, tcp source port p      lookup main   A's servers answer over the
         (one rule per exposed port p of A)                       wire, for each exposed port
    100  to <lab network>, uid PROXY_UID            lookup main   the proxies dial over the wire
    150                                             lookup 77     anything else A dials: peers
                                                                  are local, dialed from A's
                                                                  own address
    200                                             lookup local  (the usual first rule, moved)

So a program in A that dials B's real address B:p reaches A's toxiproxy listening on B:p, which
dials B:p for real, from A's address, over the bridge: B sees A's address, the bridge carries the
real addresses, and B's answers leave by rule 95 (without it B would deliver them to its own
proxy for A's address). A port of B that was not `expose`d has no listener in A: connecting to it
is refused at once (never unshaped). A host's services bind its own address: a service on
0.0.0.0:p would clash with that host's proxies for port p of the other hosts.

A's proxy for B:p shapes the bytes A sends (its upstream stream) with the Shape of A -> B and the
bytes B answers (downstream) with the Shape of B -> A; B's proxies for A's ports do the reverse.
So every byte from A to B gets the delay of A -> B whichever side opened the connection, and
the two directions of a pair may differ.

Cuts between A and B (both directions, all their connections, current and new):
- Cut.PARTITION: bytes are held, not lost, and connections stay open: programs see silence until
  their own timeouts; `restore` delivers what was held, in order (as TCP does after a healed
  partition, minus retransmission backoff). A new connection still completes its TCP handshake
  (with the local proxy), then hears nothing.
- Cut.DOWN: the proxies stop: open connections are closed, new ones refused at once.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Mapping
from subprocess import Popen
from typing import Any

from deploy.netlab.errors import UnknownHost
from deploy.netlab.hosts import HOST_INTERFACE, Host, Lab, ip, stop_processes, write_sysctls
from deploy.netlab.shape import UNSHAPED, Shape
from deploy.netlab.toxiproxy import PROXY_UID, Toxic, ToxiproxyApi, start_toxiproxy

log = logging.getLogger(__name__)

PEER_TABLE = 77  # routing table where the peers' addresses are local, reached from our own
HOLD_MS = 24 * 3600 * 1000  # a partition holds bytes "forever": until restore
STREAMS = ("upstream", "downstream")


class Cut(enum.Enum):
    PARTITION = "partition"  # bytes held until restore, connections stay open
    DOWN = "down"  # connections closed, new ones refused


def intercept(lab: Lab, host: Host) -> None:
    """Route every connection from `host` to another host of `lab` into host's own proxies."""
    write_sysctls(
        {
            "net.ipv4.conf.all.arp_ignore": "1",  # answer ARP only for eth0's own address
            "net.ipv4.conf.all.arp_announce": "2",
            "net.ipv4.conf.all.accept_local": "1",  # replies come from addresses local here too
            "net.ipv4.conf.all.rp_filter": "0",
            f"net.ipv4.conf.{HOST_INTERFACE}.rp_filter": "0",
        },
        netns=host.netns,
    )
    batch: list[str] = []
    for peer in lab.hosts.values():
        if peer is not host:
            batch.append(f"addr add {peer.address}/32 dev lo")
            batch.append(
                f"route add local {peer.address} dev lo table {PEER_TABLE} src {host.address}"
            )
    batch += [
        f"rule add to {host.address} lookup local pref 90",
        f"rule add to {lab.network} uidrange {PROXY_UID}-{PROXY_UID} lookup main pref 100",
        f"rule add lookup {PEER_TABLE} pref 150",
        "rule add lookup local pref 200",
        "rule del pref 0",
    ]
    ip("-batch", "-", netns=host.netns, stdin="\n".join(batch) + "\n")


def proxy_name(target: str, port: int) -> str:
    """The name, in a dialer's toxiproxy, of its proxy for target's port."""
    return f"{target}.{port}"


class Links:
    """The shaped links of one lab. Make them with `Links.start`; `stop()` ends the proxies."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self._apis: dict[str, ToxiproxyApi] = {}
        self._processes: list[Popen[Any]] = []
        self._ports: dict[str, set[int]] = {name: set() for name in lab.hosts}
        self._shapes: dict[tuple[str, str], Shape] = {}
        self._cuts: dict[frozenset[str], Cut] = {}
        self._installed: dict[tuple[str, str], dict[str, Toxic]] = {}
        self._enabled: dict[tuple[str, str], bool] = {}

    @classmethod
    def start(cls, lab: Lab, services: Mapping[str, Iterable[int]] | None = None) -> Links:
        """Intercept every host's connections and start its proxies; expose `services`.

        `services` maps a host to the TCP ports it serves; more can be exposed later.
        """
        links = cls(lab)
        for host in lab.hosts.values():
            intercept(lab, host)
            process, api = start_toxiproxy(host, lab.workdir / f"toxiproxy-{host.name}.log")
            links._processes.append(process)
            links._apis[host.name] = api
        for name, ports in (services or {}).items():
            for port in ports:
                links.expose(name, port)
        return links

    def stop(self) -> None:
        """Stop the proxies (the lab's hosts then cannot reach each other any more)."""
        stop_processes(self._processes)

    # --- what exists ----------------------------------------------------------------------

    def expose(self, target: str, port: int) -> None:
        """Make target's TCP `port` reachable, shaped, from every other host."""
        self._host(target)
        if not 0 < port < 65536:
            raise ValueError(f"port {port} is not a TCP port")
        if port in self._ports[target]:
            return
        self._ports[target].add(port)
        host = self.lab.hosts[target]
        answers = f"from {host.address} to {self.lab.network} ipproto tcp sport {port}"
        ip("rule", "add", *answers.split(), "lookup", "main", "pref", "95", netns=host.netns)
        address = f"{host.address}:{port}"
        for dialer in self.lab.hosts:
            if dialer != target:
                self._apis[dialer].create_proxies([(proxy_name(target, port), address, address)])
                self._installed[(dialer, proxy_name(target, port))] = {}
                self._enabled[(dialer, proxy_name(target, port))] = True
                self._sync(dialer, target, port)

    def ports(self, target: str) -> frozenset[int]:
        return frozenset(self._ports[self._host(target).name])

    # --- shaping and cuts -----------------------------------------------------------------

    def shape(self, source: str, destination: str, shape: Shape) -> None:
        """Give the bytes `source` sends to `destination` this shape (one direction)."""
        self._host(source)
        self._host(destination)
        if source == destination:
            raise ValueError(f"{source}: a host's traffic to itself is not shaped")
        self._shapes[(source, destination)] = shape
        self._sync_pair(source, destination)

    def apply(self, shapes: Mapping[tuple[str, str], Shape]) -> None:
        """Shape many directions at once, e.g. `regions.link_shapes(matrix, placement)`."""
        for (source, destination), shape in shapes.items():
            self.shape(source, destination, shape)

    def shape_of(self, source: str, destination: str) -> Shape:
        return self._shapes.get((source, destination), UNSHAPED)

    def cut(self, a: str, b: str, mode: Cut = Cut.PARTITION) -> None:
        """Cut the link between a and b, both ways (see the module docstring for the modes)."""
        self._host(a)
        self._host(b)
        self._cuts[frozenset((a, b))] = mode
        self._sync_pair(a, b)
        log.info("netlab cut %s <-> %s mode=%s", a, b, mode.value)

    def restore(self, a: str, b: str) -> None:
        """Undo a cut between a and b (nothing if there was none)."""
        if self._cuts.pop(frozenset((self._host(a).name, self._host(b).name)), None):
            self._sync_pair(a, b)
            log.info("netlab restored %s <-> %s", a, b)

    def reset(self) -> None:
        """Every link back to unshaped and uncut."""
        pairs = {tuple(sorted(pair)) for pair in [*self._shapes, *self._cuts]}
        self._shapes.clear()
        self._cuts.clear()
        for a, b in sorted(pairs):
            self._sync_pair(a, b)

    # --- keeping the proxies as wanted ----------------------------------------------------

    def _sync_pair(self, a: str, b: str) -> None:
        for port in sorted(self._ports[b]):
            self._sync(a, b, port)
        for port in sorted(self._ports[a]):
            self._sync(b, a, port)

    def _sync(self, dialer: str, target: str, port: int) -> None:
        """Make dialer's proxy for target:port carry the toxics and state wanted now."""
        key = (dialer, proxy_name(target, port))
        api, proxy = self._apis[dialer], key[1]
        cut = self._cuts.get(frozenset((dialer, target)))
        wanted = {
            toxic.name: toxic
            for stream, shape in zip(
                STREAMS, (self.shape_of(dialer, target), self.shape_of(target, dialer)), strict=True
            )
            for toxic in _toxics(stream, shape, cut)
        }
        installed = self._installed[key]
        for name in [name for name in installed if name not in wanted]:
            api.remove_toxic(proxy, name)
            del installed[name]
        for name, toxic in wanted.items():
            if name not in installed:
                api.add_toxic(proxy, toxic)
            elif installed[name] != toxic:
                api.update_toxic(proxy, toxic)
            installed[name] = toxic
        enabled = cut is not Cut.DOWN
        if self._enabled[key] != enabled:
            api.set_enabled(proxy, enabled)
            self._enabled[key] = enabled

    def _host(self, name: str) -> Host:
        if name not in self.lab.hosts:
            raise UnknownHost(name, list(self.lab.hosts))
        return self.lab.hosts[name]


def _toxics(stream: str, shape: Shape, cut: Cut | None) -> list[Toxic]:
    """The toxics one stream of one proxy needs for this shape and cut."""
    toxics = []
    if shape.latency_ms or shape.jitter_ms:
        attributes = (("latency", shape.latency_ms), ("jitter", shape.jitter_ms))
        toxics.append(Toxic(f"delay-{stream}", "latency", stream, attributes))
    if shape.kbytes_per_s is not None:
        toxics.append(Toxic(f"rate-{stream}", "bandwidth", stream, (("rate", shape.kbytes_per_s),)))
    if cut is Cut.PARTITION:
        hold = (("latency", HOLD_MS), ("jitter", 0))
        toxics.append(Toxic(f"cut-{stream}", "latency", stream, hold))
    return toxics
