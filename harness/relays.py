"""`planet relay serve` processes for tests: started (each prints its URL and key once it
listens), stopped.

    with relays(8, root) as started:
        hops = [relay.hop for relay in started]          # protocol.overlay.Hop: URL + X25519 key
        write_relays_file(root / "relays.txt", started)  # for `planet gateway serve --relays`
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from harness.gateway_net import terminate
from harness.ports import ephemeral_port
from node.procs import spawn_piped
from protocol.overlay import Hop


class RelayProcess:
    """`planet relay serve --no-register --allow-private-next-hops` on loopback, with `extra`
    arguments (e.g. `--committee-rpc URL`: an exit that reaches a node behind NAT at the other
    addresses its key registered)."""

    def __init__(self, home: Path, extra: Sequence[str] = (), *, wait: bool = True) -> None:
        """Started; listening once `wait` (else call `ready()`: `relays` starts them all, then
        waits for each, so their starts overlap)."""
        home.mkdir(parents=True, exist_ok=True)
        self.port = ephemeral_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = home / "relay.log"
        self.log = self.log_path.open("w")
        self.process = spawn_piped(
            [sys.executable, "-m", "planet", "relay", "serve", "--home", str(home),
             "--port", str(self.port), "--allow-private-next-hops", "--no-register", *extra],
            stdout=subprocess.PIPE, stderr=self.log, text=True,
        )  # fmt: skip
        self._hop: Hop | None = None
        if wait:
            self.ready()

    def ready(self) -> Hop:
        """Wait until it listens (its one line "relay on URL key HEX"); its hop."""
        if self._hop is None:
            assert self.process.stdout is not None
            line = self.process.stdout.readline()
            assert line.startswith("relay on"), (line, self.log_path.read_text()[-2000:])
            self._hop = Hop(self.url, bytes.fromhex(line.split(" key ", 1)[1].strip()))
        return self._hop

    @property
    def hop(self) -> Hop:
        """Its URL and X25519 key (waits until it listens)."""
        return self.ready()

    def info(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/info", timeout=5) as response:
            return json.load(response)

    def stop(self) -> None:
        terminate(self.process)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.log.close()


@contextmanager
def relays(count: int, root: Path, extra: Sequence[str] = ()) -> Iterator[list[RelayProcess]]:
    started: list[RelayProcess] = []
    try:
        for i in range(count):  # all started, then each waited for: their starts overlap
            started.append(RelayProcess(root / f"relay{i}", extra, wait=False))
        for relay in started:
            relay.ready()
        yield started
    finally:
        for relay in started:
            relay.stop()


def write_relays_file(path: Path, started: Sequence[RelayProcess]) -> Path:
    path.write_text("".join(f"{r.url} {r.hop.key.hex()}\n" for r in started))
    return path
