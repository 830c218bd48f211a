"""CometBFT's own files for a local validator: the binary, `config.toml` values, node ids."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from deploy.committee.network import Validator
from protocol.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]
COMETBFT_VERSION = "0.38.25"
# What `deploy/setup.sh` builds: v0.38.25 with the ABCI socket client's flush timer at 1 ms (20 ns
# upstream, which re-arms itself in a loop on one Go thread); recorded in .tools/stamps/cometbft.
COMETBFT_BUILD = f"{COMETBFT_VERSION}+abci-flush-1ms"
DEFAULT_TIMEOUT_COMMIT = "300ms"


def find_cometbft() -> Path:
    """The cometbft binary: $PLANET_COMETBFT, else <repo>/.tools/bin/cometbft."""
    configured = os.environ.get("PLANET_COMETBFT")
    path = Path(configured) if configured else REPO_ROOT / ".tools" / "bin" / "cometbft"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ConfigError(
            f"cometbft not found at {path}" + (" (from PLANET_COMETBFT)" if configured else ""),
            hint="run `bash deploy/setup.sh` (it builds cometbft v"
            f"{COMETBFT_VERSION} into .tools/bin), or point PLANET_COMETBFT at the binary",
        )
    return path


def flush_patched(binary: Path) -> bool:
    """Whether `binary` is the cometbft `deploy/setup.sh` built with the 1 ms ABCI flush timer
    (only that one runs on a single Go thread without spinning; see `COMETBFT_BUILD`)."""
    tools = REPO_ROOT / ".tools"
    try:
        stamp = (tools / "stamps" / "cometbft").read_text().strip()
    except OSError:
        return False
    return binary.resolve() == (tools / "bin" / "cometbft").resolve() and stamp == COMETBFT_BUILD


def toml_literal(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)


_SECTION = re.compile(r"^\s*\[([^\]]+)\]\s*$")
_KEY = re.compile(r"^(\s*)([A-Za-z0-9_.\-]+)(\s*=\s*)(.*)$")


def set_toml_values(text: str, updates: dict[str, dict[str, str | int | bool]]) -> str:
    """Replace `key = value` lines in the given sections of a TOML text (top level: "").

    Comments and layout stay as they are. A key that is not in its section is an error: the
    config format changed, and silently appending would hide it.
    """
    pending = {section: dict(values) for section, values in updates.items()}
    section = ""
    lines = text.splitlines(keepends=True)
    for number, line in enumerate(lines):
        header = _SECTION.match(line)
        if header:
            section = header.group(1).strip()
            continue
        match = _KEY.match(line)
        if match and match.group(2) in pending.get(section, {}):
            value = pending[section].pop(match.group(2))
            ending = "\n" if line.endswith("\n") else ""
            lines[number] = f"{match.group(1)}{match.group(2)} = {toml_literal(value)}{ending}"
    missing = [f"[{s}] {k}" if s else k for s, values in pending.items() for k in values]
    if missing:
        raise ConfigError(
            f"config.toml lacks keys: {', '.join(missing)}",
            hint=f"is cometbft v{COMETBFT_VERSION}? run `bash deploy/setup.sh`",
        )
    return "".join(lines)


def node_id_from_key(node_key: dict[str, Any]) -> str:
    """A CometBFT node id: hex of the first 20 bytes of SHA-256 of the ed25519 public key."""
    private = base64.b64decode(node_key["priv_key"]["value"])
    if len(private) != 64:
        raise ConfigError("node_key.json: expected a 64-byte ed25519 key")
    return hashlib.sha256(private[32:]).digest()[:20].hex()


def validator_config(
    validator: Validator, peers: Iterable[Validator], *, timeout_commit: str, app: str
) -> dict[str, dict[str, str | int | bool]]:
    """The config.toml values a local validator needs (everything else keeps its default)."""
    return {
        "": {
            "moniker": validator.name,
            "proxy_app": validator.abci_url if app == "planet" else "kvstore",
        },
        "rpc": {
            "laddr": validator.rpc_laddr,
            "pprof_laddr": f"127.0.0.1:{validator.pprof_port}",
            "max_open_connections": 2000,
            "max_subscription_clients": 200,
            "max_subscriptions_per_client": 20,
            "experimental_subscription_buffer_size": 2000,
            "experimental_websocket_write_buffer_size": 2000,
        },
        "p2p": {
            "laddr": validator.p2p_laddr,
            "persistent_peers": ",".join(
                p.p2p_address for p in peers if p.index != validator.index
            ),
            "pex": False,
            "addr_book_strict": False,
            "allow_duplicate_ip": True,
            "send_rate": 20_480_000,
            "recv_rate": 20_480_000,
        },
        "mempool": {"size": 50_000, "cache_size": 100_000},
        "consensus": {"timeout_commit": timeout_commit},
    }
