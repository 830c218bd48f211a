"""The operator's configuration: one frozen dataclass, resolved once per command.

Sources, highest first: command-line flags > `PLANET_*` environment > `$PLANET_HOME/config.toml`
> the running devnet > defaults. `resolve_config(flags, env)` merges them and validates every
value once; everything after it receives an `OperatorConfig` and never reads the environment
again.

The running devnet (`find_devnet`, the one rule every command uses to find it): the devnet run
directory `$PLANET_DEVNET` (`planet devnet exec` sets it), else `$PLANET_HOME/devnet` (default
`~/.cache/planet/devnet`), counts while its `devnet.json` says `"status": "up"`. It gives the
EVM RPC, the first validator's RPC, the chain id, the deployment file and the devnet's
next-hop range; `planet ask` / `planet balance` also take its gateway and user wallet.

    # $PLANET_HOME/config.toml (every key optional)
    evm_rpc = "http://127.0.0.1:8545"
    committee_rpc = "http://127.0.0.1:26657"
    chain_id = 31337
    deployment = "/path/to/deployment.json"   # relative paths are relative to PLANET_HOME
    refund_margin_s = 600                     # gateway: refuse deposits refundable this soon
    next_hop_range = "10.77.0.0/24"           # join: private next hops a node may dial

Files in an operator home (`PLANET_HOME`, default `~/.cache/planet`): `wallet.json` (EVM
keystore), `node_key.json` (sealed ed25519 node key), `deployment.json` (default deployment
file), `run/` (pid files and logs of the node and agent started by `planet join`).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from protocol.errors import ConfigError

CONFIG_FILE = "config.toml"
DEFAULT_EVM_RPC = "http://127.0.0.1:8545"
DEFAULT_COMMITTEE_RPC = "http://127.0.0.1:26657"
DEFAULT_CHAIN_ID = 31337
ENV_NAMES = {
    "evm_rpc": "PLANET_EVM_RPC",
    "committee_rpc": "PLANET_COMMITTEE_RPC",
    "chain_id": "PLANET_CHAIN_ID",
    "deployment": "PLANET_DEPLOYMENT",
    "password_file": "PLANET_PASSWORD_FILE",
    "refund_margin_s": "PLANET_REFUND_MARGIN_S",
    "next_hop_range": "PLANET_NEXT_HOP_RANGE",
}
DEVNET_ENV = "PLANET_DEVNET"
DEVNET_PORTS_ENV = "PLANET_DEVNET_PORTS"  # inside a devnet host: the ports other hosts reach
DEVNET_STATE = "devnet.json"
DEVNET_KEYS = ("evm_rpc", "committee_rpc", "chain_id", "deployment", "next_hop_range")
MAX_REFUND_MARGIN_S = 30 * 86_400
_URL = re.compile(r"https?://[A-Za-z0-9._\-\[\]:]+(/[\x21-\x7e]*)?\Z")


@dataclass(frozen=True)
class OperatorConfig:
    """What an operator command needs to reach the chains and find its keys."""

    home: Path  # operator home: keys, deployment file, run/ (PLANET_HOME)
    evm_rpc: str = DEFAULT_EVM_RPC  # EVM JSON-RPC URL (settlement contracts)
    committee_rpc: str = DEFAULT_COMMITTEE_RPC  # a committee validator's CometBFT RPC URL
    chain_id: int = DEFAULT_CHAIN_ID  # the EVM chain id the operator expects (refuses others)
    deployment: Path | None = None  # deployment file (addresses + ABIs); None: home/deployment.json
    password_file: Path | None = None  # keystore password file; None: $PLANET_PASSWORD or prompt
    # gateway: a per-query deposit whose refund opens within this many seconds is refused
    # (None: derived from the settlement timeline, node/gateway/timeline.py)
    refund_margin_s: int | None = None
    # join, at a private address: the private next hops its node may dial (CIDR[,CIDR]);
    # None: every private address (a LAN); the devnet gives its own range
    next_hop_range: str | None = None
    devnet: Path | None = None  # the running devnet whose defaults filled in (not a config key)

    @property
    def deployment_path(self) -> Path:
        return self.deployment or self.home / "deployment.json"

    @property
    def wallet_path(self) -> Path:
        return self.home / "wallet.json"

    @property
    def node_key_path(self) -> Path:
        return self.home / "node_key.json"

    @property
    def run_dir(self) -> Path:
        return self.home / "run"


def default_home(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("PLANET_HOME") or "~/.cache/planet").expanduser()


def read_config_file(path: Path) -> dict[str, Any]:
    """The TOML file's keys (empty when the file does not exist); unknown keys are errors."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read {path}: {error}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path} is not valid TOML: {error}", hint="fix or delete it") from None
    known = {f.name for f in fields(OperatorConfig)} - {"home", "devnet"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(
            f"{path}: unknown keys {', '.join(unknown)}",
            hint=f"known keys: {', '.join(sorted(known))}",
        )
    return raw


def write_config_file(path: Path, values: Mapping[str, str | int | Path]) -> None:
    """Write a config.toml with these keys (strings and integers only)."""
    lines = []
    for key, value in values.items():
        if isinstance(value, int) and not isinstance(value, bool):
            lines.append(f"{key} = {value}")
        else:
            text = str(value).replace("\\", "\\\\").replace('"', '\\"')
            lines.append(f'{key} = "{text}"')
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@dataclass(frozen=True)
class RunningDevnet:
    """What a running devnet (`planet devnet up`) offers every command as defaults."""

    dir: Path  # its run directory
    evm_rpc: str
    committee_rpc: tuple[str, ...]  # every validator's RPC, the first one first
    chain_id: int
    deployment: Path
    gateway_url: str | None
    password_file: Path | None  # of the devnet's own keystores (its user wallet)
    accounts: tuple[Mapping[str, Any], ...]  # {name, address, keystore, home} it funded
    next_hop_range: str | None  # the devnet's addresses (127.0.0.0/8, or its hosts' network)
    hosts: Mapping[str, Any] | None  # {host: {address, netns}} when it runs in namespaces
    manifest: Path | None = None  # the model its nodes serve (a personal client's default)
    # the other models it registers and serves (`more_manifests` in devnet.json), in order
    more_manifests: tuple[Path, ...] = ()

    @property
    def source(self) -> str:
        return f"the devnet in {self.dir}"

    def value(self, key: str) -> Any:
        """The default this devnet gives config key `key` (DEVNET_KEYS), or None."""
        if key == "committee_rpc":
            return self.committee_rpc[0] if self.committee_rpc else None
        return getattr(self, key)


def devnet_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the running devnet is looked for: $PLANET_DEVNET, else $PLANET_HOME/devnet."""
    env = os.environ if env is None else env
    if env.get(DEVNET_ENV):
        return Path(env[DEVNET_ENV]).expanduser()
    return default_home(env) / "devnet"


def find_devnet(env: Mapping[str, str] | None = None) -> RunningDevnet | None:
    """The running devnet (see the module docstring), or None when there is none up.

    A devnet.json that is not a devnet's state is a ConfigError naming the file.
    """
    env = os.environ if env is None else env
    directory = devnet_dir(env)
    path = directory / DEVNET_STATE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if env.get(DEVNET_ENV):
            raise ConfigError(
                f"${DEVNET_ENV}: no devnet in {directory}",
                hint=f"unset {DEVNET_ENV}, or start one: planet devnet up",
            ) from None
        return None
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ConfigError(
            f"cannot read {path}: {error}", hint="planet devnet down, then planet devnet up"
        ) from None
    if not isinstance(state, dict) or state.get("status") != "up":
        return None
    try:
        rpcs = state.get("committee_rpc") or []
        return RunningDevnet(
            dir=directory,
            evm_rpc=_check("evm_rpc", state["evm_rpc"], str(path), directory),
            committee_rpc=tuple(_check("committee_rpc", url, str(path), directory) for url in rpcs),
            chain_id=_check("chain_id", state["chain_id"], str(path), directory),
            deployment=_check("deployment", state["deployment"], str(path), directory),
            gateway_url=state.get("gateway_url") or None,
            password_file=Path(state["password_file"]) if state.get("password_file") else None,
            accounts=tuple(a for a in state.get("accounts") or [] if isinstance(a, dict)),
            next_hop_range=state.get("next_hop_range") or None,
            hosts=(state.get("hosts") or {}).get("hosts") or None,
            manifest=Path(state["manifest"]) if state.get("manifest") else None,
            more_manifests=tuple(Path(m) for m in state.get("more_manifests") or ()),
        )
    except (KeyError, TypeError, AttributeError) as error:
        raise ConfigError(
            f"{path} is not a devnet's state (no {error})",
            hint="planet devnet down, then planet devnet up",
        ) from None


def resolve_config(
    flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> OperatorConfig:
    """Merge flags > env > config file > running devnet > defaults into a validated
    OperatorConfig.

    `flags` maps field names to values (None = not given); `home` may be among them.
    """
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    env = os.environ if env is None else env
    home = Path(flags["home"]).expanduser() if "home" in flags else default_home(env)
    merged: dict[str, tuple[Any, str]] = {}
    devnet = find_devnet(env)
    if devnet is not None:
        for key in DEVNET_KEYS:
            if devnet.value(key) is not None:
                merged[key] = (devnet.value(key), devnet.source)
    for key, value in read_config_file(home / CONFIG_FILE).items():
        merged[key] = (value, f"{home / CONFIG_FILE}: {key}")
    for key, name in ENV_NAMES.items():
        if env.get(name):
            merged[key] = (env[name], f"${name}")
    for key in ENV_NAMES:
        if key in flags:
            merged[key] = (flags[key], f"--{key.replace('_', '-')}")
    values: dict[str, Any] = {"home": home}
    for key, (value, source) in merged.items():
        values[key] = _check(key, value, source, home)
    if devnet is not None:
        values["devnet"] = devnet.dir
    return OperatorConfig(**values)


def rpc_url(value: Any, source: str) -> str:
    """An http(s) URL without its trailing slash; a ConfigError naming `source` otherwise."""
    text = str(value).strip().rstrip("/")
    if not _URL.match(text):
        raise ConfigError(
            f"{source}: {value!r} is not an http(s) URL",
            hint="for example http://127.0.0.1:8545",
        )
    return text


def _check(key: str, value: Any, source: str, home: Path) -> Any:
    if key in ("evm_rpc", "committee_rpc"):
        return rpc_url(value, source)
    if key == "chain_id":
        text = str(value).strip()
        if isinstance(value, bool) or not text.isdigit() or not 0 < int(text) < 2**63:
            raise ConfigError(f"{source}: chain id must be a positive integer (got {value!r})")
        return int(text)
    if key == "next_hop_range":
        text = str(value).strip()
        try:
            items = [ipaddress.ip_network(item.strip(), strict=False) for item in text.split(",")]
        except ValueError:
            raise ConfigError(
                f"{source}: next-hop range {value!r} is not CIDR[,CIDR]",
                hint="e.g. 10.77.0.0/24 or 127.0.0.0/8",
            ) from None
        return ",".join(str(item) for item in items)
    if key == "refund_margin_s":
        text = str(value).strip()
        if isinstance(value, bool) or not text.isdigit() or int(text) > MAX_REFUND_MARGIN_S:
            raise ConfigError(
                f"{source}: refund margin must be 0..{MAX_REFUND_MARGIN_S} seconds (got {value!r})",
                hint="seconds before a deposit's refund opens that the gateway still accepts it",
            )
        return int(text)
    path = Path(str(value)).expanduser()
    return path if path.is_absolute() else home / path


def devnet_ports(env: Mapping[str, str]) -> tuple[int, ...]:
    """The ports the other hosts reach in this devnet host (`planet devnet exec` sets them);
    () outside one, or when the value is not a list of ports."""
    parts = [part.strip() for part in env.get(DEVNET_PORTS_ENV, "").split(",") if part.strip()]
    if not all(part.isascii() and part.isdigit() and len(part) <= 5 for part in parts):
        return ()  # int() would take "١٨١٠٠" or "1_8100"
    ports = tuple(int(part) for part in parts)
    return ports if all(0 < port < 65536 for port in ports) else ()
