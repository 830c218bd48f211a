"""The manifest of a local committee network (`network.json`): its validators and their ports.

`init_network` (`deploy.committee.generate`) writes it; everything else reads it back with
`load_network`. Validator i's ports, from `base_port`: p2p base+10i, RPC base+10i+1, ABCI app
base+10i+2, pprof base+10i+3 (all on 127.0.0.1). A network made for hosts (`InitOptions.hosts`,
the devnet's `--hosts`) gives every validator its own address and network namespace instead,
and the same ports from `base_port` on each: p2p and RPC on its address, app and pprof on the
loopback of its namespace.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from protocol.errors import ConfigError, UsageError

DEFAULT_BASE_PORT = 27000
DEFAULT_CHAIN_ID = "planet-committee"
APPS = ("planet", "kvstore")  # kvstore: CometBFT's built-in app, to measure CometBFT alone
MANIFEST = "network.json"


def planet_home() -> Path:
    return Path(os.environ.get("PLANET_HOME") or Path.home() / ".cache" / "planet")


def default_dir() -> Path:
    return planet_home() / "committee"


@dataclass(frozen=True)
class Validator:
    """One validator of the local network and its ports."""

    index: int
    home: str
    node_id: str
    p2p_port: int
    rpc_port: int
    abci_port: int
    pprof_port: int
    operator_address: str
    validator_address: str
    host: str = "127.0.0.1"  # the address its p2p and RPC listen on
    netns: str | None = None  # the network namespace its processes run in (None: this one)

    @property
    def name(self) -> str:
        return f"validator{self.index}"

    @property
    def rpc_url(self) -> str:
        return f"http://{self.host}:{self.rpc_port}"

    @property
    def rpc_laddr(self) -> str:
        return f"tcp://{self.host}:{self.rpc_port}"

    @property
    def abci_url(self) -> str:
        return f"tcp://127.0.0.1:{self.abci_port}"  # app and cometbft share the host

    @property
    def p2p_laddr(self) -> str:
        return f"tcp://{self.host}:{self.p2p_port}"

    @property
    def p2p_address(self) -> str:
        return f"{self.node_id}@{self.host}:{self.p2p_port}"

    def command(self, argv: list[str]) -> list[str]:
        """`argv` as run for this validator: inside its network namespace when it has one."""
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else argv


@dataclass(frozen=True)
class Network:
    """What `init` generated; read back from DIR/network.json."""

    dir: str
    chain_id: str
    app: str
    base_port: int
    timeout_commit: str
    epoch_length: int
    validators: tuple[Validator, ...]

    @property
    def path(self) -> Path:
        return Path(self.dir)

    def log_path(self, process: str, index: int) -> Path:
        return self.path / "logs" / f"{process}{index}.log"

    def pid_path(self, process: str, index: int) -> Path:
        return self.path / "run" / f"{process}{index}.pid"

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["validators"] = [asdict(v) for v in self.validators]
        return body


def load_network(directory: Path) -> Network:
    manifest = directory / MANIFEST
    if not manifest.is_file():
        raise UsageError(
            f"no committee network in {directory}",
            hint=f"create one: `planet committee init --validators 4 --dir {directory}`",
        )
    try:
        body = json.loads(manifest.read_text())
        validators = tuple(Validator(**v) for v in body.pop("validators"))
        return Network(validators=validators, **body)
    except (ValueError, TypeError, KeyError) as error:
        raise ConfigError(
            f"{manifest} is not a valid network manifest: {error}",
            hint="re-create the network: `planet committee init --force`",
        ) from error
