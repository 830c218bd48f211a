"""A network of hosts on one machine: namespaces with their own addresses, and shaped links.

Used by the multi-host devnet (issue 25) and by tests: every process of a devnet runs in its own
Linux network namespace ("host") with its own address, and the links between hosts get delay,
jitter, bandwidth limits and cuts, per ordered pair of hosts, e.g. from an inter-region matrix.

    hosts.py      namespaces, bridge, veths, addresses; run programs and open sockets in a host;
                  teardown, also of crashed runs' leftovers; `can_make_hosts()`; a host behind
                  NAT (`Lab.add_behind_nat`: a private LAN behind a router host that masquerades
                  it; the one part that needs iptables)
    links.py      the interception and the per-pair shaping and cuts (`Links`)
    toxiproxy.py  the userspace proxies that delay, throttle and hold bytes, and their API
    regions.py    inter-region latency matrices (CSV) -> a Shape per ordered pair of hosts
    shape.py      `Shape`: delay, jitter, bandwidth of one direction of one link

Why userspace proxies. This kernel has no `tc netem` ("Specified qdisc kind is unknown"), so
delay cannot be added to packets in the kernel. Toxiproxy (Shopify) adds it to the bytes of TCP
connections instead: a latency toxic (delay ± uniform jitter), a bandwidth toxic, and, for cuts, a
latency toxic long enough to hold bytes until it is removed, or a disabled proxy.

How a connection gets into a proxy. The programs dial the real addresses the chain registers, so
the proxy must sit where those connections go. Options weighed:
1. a proxy in front of each service, inside the server's namespace: every dialer would get the
   same delay (per destination, not per pair), and the service could not bind its own address;
2. DNAT in the dialer's namespace to a local proxy: needs nftables/iptables userspace (not
   installed here; the kernel has nf_tables) and a way to exempt the proxy's own connections;
3. a router namespace between host subnets, DNAT to proxies there: per-pair, but every server
   then sees the router's address instead of the dialer's, and it needs nftables too;
4. chosen: policy routing in the dialer's namespace, no netfilter at all. Every other host's
   address is also a local address in the dialer's namespace, so a connection to B:p lands on the
   dialer's own toxiproxy listening on B:p; the proxy runs as a reserved uid whose connections a
   `uidrange` rule routes to the wire. One proxy per (dialer, target host, port).

Fidelity of the chosen design:
- per ordered pair and per direction: A -> B and B -> A may differ; a round trip costs the delay
  of A -> B plus that of B -> A (the matrix gives one-way delays, as CometBFT's e2e does);
- real addresses: the bridge carries packets between the hosts' own addresses, a server sees the
  dialer's own address, and services may bind their host's address or 0.0.0.0;
- TCP only, and only ports that were exposed (`Links.expose`); other ports of a peer refuse at
  once. UDP and ICMP between hosts do not work (ping answers locally, in 0 ms);
- the delay applies to data, not to the TCP handshake: connect() completes at once (with the
  local proxy); a TLS or application handshake, being data, is delayed as it should be;
- jitter is uniform in [delay - j, delay + j] (netem's is normal); bytes stay in order;
- bandwidth is per connection and direction, not shared by the connections of a link;
- no packet loss, reordering or congestion: the proxy terminates TCP on both sides;
- a process running as the proxies' uid (64700) would bypass the shaping.

Addresses: 10.77.0.0/24 by default, inside namespaces this run created; the bridge has no address
and no host has a route out, so no traffic leaves the lab. Everything is named `pnl<run>…` and
removed by `Lab.down()` (also on `with` exit and at interpreter exit) or, after a crash, by
`down_stale()` / `python -m deploy.netlab down`. docs/netlab.md shows how to run it.
"""

from deploy.netlab.errors import (
    CommandFailed,
    HostsUnavailable,
    MatrixError,
    NetlabError,
    ProxyApiError,
    ToolMissing,
    UnknownHost,
    UnknownRegion,
)
from deploy.netlab.hosts import (
    DEFAULT_NETWORK,
    Host,
    Lab,
    can_make_hosts,
    down_run,
    down_stale,
    leftovers,
)
from deploy.netlab.links import Cut, Links
from deploy.netlab.regions import Matrix, default_matrix, link_shapes, load_matrix, parse_matrix
from deploy.netlab.shape import Shape
from deploy.netlab.toxiproxy import can_run_proxies

__all__ = [
    "DEFAULT_NETWORK",
    "CommandFailed",
    "Cut",
    "Host",
    "HostsUnavailable",
    "Lab",
    "Links",
    "Matrix",
    "MatrixError",
    "NetlabError",
    "ProxyApiError",
    "Shape",
    "ToolMissing",
    "UnknownHost",
    "UnknownRegion",
    "can_make_hosts",
    "can_run_proxies",
    "default_matrix",
    "down_run",
    "down_stale",
    "leftovers",
    "link_shapes",
    "load_matrix",
    "parse_matrix",
]
