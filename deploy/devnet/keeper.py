"""`python -m deploy.devnet.keeper PLAN READY`: own the devnet's hosts until SIGTERM.

PLAN (written by `deploy.devnet.hosts.start_lab`): `{network, hosts: [name…], services: {host:
[port…]}, shapes: [[from, to, latency_ms, jitter_ms, kbytes_per_s|null]…], behind_nat: [[host,
router, lan]…]}`. The keeper makes the hosts (`deploy.netlab.Lab`), starts the shaped links with
every service port exposed, then puts each host of `behind_nat` on its private `lan` behind its
router (`Lab.add_behind_nat`; after the links, so that host has no proxies of its own: what it
dials goes through its router's, shaped as the router's, from the router's address), and
writes READY: `{run_id, network, hosts: {name: {address, netns}}}`, or `{error, hint}` when
the lab cannot be made. Then it waits; SIGTERM or SIGINT stop the proxies and remove the lab
(namespaces, veths, bridge, and every process still inside the namespaces). It is the lab's
owner process: if it dies, `python -m deploy.netlab down` removes what it left.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from ipaddress import IPv4Network
from pathlib import Path

from deploy.netlab import Lab, Links, NetlabError, Shape

log = logging.getLogger("deploy.devnet.keeper")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    plan_path, ready_path = (Path(a) for a in (argv if argv is not None else sys.argv[1:]))
    plan = json.loads(plan_path.read_text())
    stopping = threading.Event()  # a signal during the start-up is kept, acted on after it
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    try:
        lab = Lab.create(plan["hosts"], network=IPv4Network(plan["network"]))
    except NetlabError as error:
        _write(ready_path, {"error": error.message, "hint": error.hint})
        return 1
    try:
        links = Links.start(lab, plan["services"])
        links.apply(
            {(a, b): Shape(latency, jitter, rate) for a, b, latency, jitter, rate in plan["shapes"]}
        )
        for name, router, lan in plan.get("behind_nat", []):
            lab.add_behind_nat(name, router, lan=IPv4Network(lan))
    except NetlabError as error:
        lab.down()
        _write(ready_path, {"error": error.message, "hint": error.hint})
        return 1
    hosts = {
        name: {"address": str(host.address), "netns": host.netns}
        for name, host in lab.hosts.items()
    }
    _write(ready_path, {"run_id": lab.run_id, "network": str(lab.network), "hosts": hosts})
    log.info("hosts up: run %s, %d hosts", lab.run_id, len(hosts))
    while not stopping.wait(1.0):
        pass
    log.info("stopping: removing the hosts")
    links.stop()
    lab.down()
    log.info("hosts removed")
    return 0


def _write(path: Path, body: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=1) + "\n")
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
