"""The operator's configuration: one frozen dataclass, resolved once per command.

Sources, highest first: command-line flags > `PLANET_*` environment > `$PLANET_HOME/config.toml`
> defaults. `resolve_config(flags, env)` merges them and validates every value once;
everything after it receives an `OperatorConfig` and never reads the environment again.

    # $PLANET_HOME/config.toml (every key optional)
    evm_rpc = "http://127.0.0.1:8545"
    committee_rpc = "http://127.0.0.1:26657"
    chain_id = 31337
    deployment = "/path/to/deployment.json"   # relative paths are relative to PLANET_HOME
    refund_margin_s = 600                     # gateway: refuse deposits refundable this soon

Files in an operator home (`PLANET_HOME`, default `~/.cache/planet`): `wallet.json` (EVM
keystore), `node_key.json` (sealed ed25519 node key), `deployment.json` (default deployment
file), `run/` (pid files and logs of the node and agent started by `planet join`).
"""

from __future__ import annotations

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
}
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
    known = {f.name for f in fields(OperatorConfig)} - {"home"}
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


def resolve_config(
    flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> OperatorConfig:
    """Merge flags > env > config file > defaults into a validated OperatorConfig.

    `flags` maps field names to values (None = not given); `home` may be among them.
    """
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    env = os.environ if env is None else env
    home = Path(flags["home"]).expanduser() if "home" in flags else default_home(env)
    merged: dict[str, tuple[Any, str]] = {}
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
    return OperatorConfig(**values)


def _check(key: str, value: Any, source: str, home: Path) -> Any:
    if key in ("evm_rpc", "committee_rpc"):
        text = str(value).strip().rstrip("/")
        if not _URL.match(text):
            raise ConfigError(
                f"{source}: {value!r} is not an http(s) URL",
                hint="for example http://127.0.0.1:8545",
            )
        return text
    if key == "chain_id":
        text = str(value).strip()
        if isinstance(value, bool) or not text.isdigit() or not 0 < int(text) < 2**63:
            raise ConfigError(f"{source}: chain id must be a positive integer (got {value!r})")
        return int(text)
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
