"""A node behind a real NAT (deploy/netlab `Lab.add_behind_nat`): network namespaces relay, client
and router on one bridge, and home on a private LAN behind router, which masquerades its
traffic (iptables MASQUERADE) and lets in only answers to what home dialled.

- home reaches the relay, which sees the router's address; the relay cannot dial home back, so
  `planet join`'s check (node/cli/nat.py `decide`) says the endpoint is not reachable and has the
  relay front it, in one line;
- a real `planet node serve --rendezvous` in home, listening only inside home, is reached by the
  client at its port on the relay with TLS pinned to its node key, while the client cannot
  reach home itself.

Skipped, with the reason, where this process cannot make namespaces (not root) or there is no
iptables. Runs under `flock /tmp/planet-devnet.lock` like the other namespace tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from nacl.signing import SigningKey

from deploy.netlab import Lab, can_make_hosts
from node.cli.nat import ListedRelay, decide
from node.keys import PASSWORD_ENV, create_node_key, load_node_key
from node.links import link_ssl

pytestmark = [pytest.mark.integration, pytest.mark.e2e_lane]

PASSWORD = "nat test"
RELAY_PORT = 9100
FRONT_PORTS = (44000, 44001)
NODE_PORT = 18100
REACHABLE = re.compile(r"reachable at (https://[0-9.]+:(\d+)) through relay")


def _unavailable() -> str | None:
    able, reason = can_make_hosts()
    if not able:
        return reason
    if shutil.which("iptables") is None:
        return "no iptables here (apt-get install iptables)"
    return None


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    with Lab.create(["relay", "client", "router"]) as made:
        made.add_behind_nat("home", "router")
        yield made


@pytest.fixture(scope="module")
def relay(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> ListedRelay:
    home = tmp_path_factory.mktemp("relay")
    address = lab["relay"].address
    process = lab["relay"].popen(
        [sys.executable, "-m", "planet", "relay", "serve", "--home", str(home),
         "--host", str(address), "--port", str(RELAY_PORT), "--no-register",
         "--allow-private-next-hops", "--rendezvous-ports", "-".join(map(str, FRONT_PORTS)),
         "--rendezvous-admit", "any"],
        stdout=subprocess.PIPE, stderr=(home / "relay.log").open("w"), text=True,
    )  # fmt: skip
    line = process.stdout.readline()
    assert line.startswith("relay on"), (home / "relay.log").read_text()[-2000:]
    key = bytes.fromhex(line.split(" key ", 1)[1].strip())
    return ListedRelay(f"http://{address}:{RELAY_PORT}", key, "ab" * 32)


def test_home_dials_out_but_is_not_reachable_and_join_says_so(lab: Lab, relay) -> None:
    home, router = lab["home"], lab["router"]
    key = SigningKey.generate()
    reach = home.call(lambda: asyncio.run(decide("check", [relay], key, str(home.address), 8443)))
    assert reach.fronted is not None
    assert f"https://{home.address}:8443 is not reachable from relay {relay.url}" in reach.line
    assert f"(it sees this machine at {router.address})" in reach.line  # masqueraded
    assert reach.fronted.endpoint.startswith(f"https://{lab['relay'].address}:")
    with pytest.raises(OSError):  # nothing on the bridge reaches home's LAN
        lab["client"].connect(home.address, 22, timeout=2.0)


def test_node_behind_nat_serves_through_the_relay(lab: Lab, relay, tmp_path: Path) -> None:
    from node.model.prepare import prepare

    manifest = Path(prepare(parts=2, quant="none", progress=lambda _msg: None))
    key_file = tmp_path / "node_key.json"
    create_node_key(key_file, PASSWORD)
    node_key = load_node_key(key_file, PASSWORD).verify_key.encode().hex()
    log = tmp_path / "node.log"
    home = lab["home"]
    home.popen(
        [sys.executable, "-m", "planet", "-v", "node", "serve", "--manifest", str(manifest),
         "--shard", "0", "--host", str(home.address), "--port", str(NODE_PORT),
         "--node-key", str(key_file), "--rendezvous", relay.url, relay.x25519.hex()],
        stdout=log.open("w"), stderr=subprocess.STDOUT,
        env={**os.environ, PASSWORD_ENV: PASSWORD, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    deadline = time.monotonic() + 240
    found: list[tuple[str, str]] = []
    while time.monotonic() < deadline and not found:
        found = REACHABLE.findall(log.read_text(errors="replace"))
        time.sleep(0.5)
    assert found, log.read_text()[-3000:]
    url = found[0][0]
    assert url.startswith(f"https://{lab['relay'].address}:")

    async def info(target: str) -> Any:
        pin = link_ssl(target, node_key, plaintext_ok=False)
        async with (
            aiohttp.ClientSession() as http,
            asyncio.timeout(60),
            http.get(f"{target}/info", ssl=pin) as answer,
        ):
            return answer.status, await answer.json()

    client = lab["client"]
    deadline = time.monotonic() + 120  # the shard loads after the link is up
    status, body = 0, None
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            status, body = client.call(lambda: asyncio.run(info(url)))
            if status == 200:
                break
        time.sleep(1)
    assert status == 200 and body["shard"] == 0, log.read_text()[-3000:]
    with pytest.raises(OSError):
        client.connect(home.address, NODE_PORT, timeout=2.0)
