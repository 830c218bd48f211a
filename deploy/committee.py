"""Generate and run a CometBFT committee network on one host: N validators, one app process each.

`init_network` calls `cometbft testnet`, then gives every validator its own ports, its peers by
node id, fast blocks, vote extensions from height 1, an identical genesis carrying the app's
`app_state`, and a secp256k1 operator key. `start_network` / `stop_network` run the processes
detached (they outlive the command that started them); `network_status` asks each node's RPC.

Layout of a network directory (default `$PLANET_HOME/committee`, PLANET_HOME=~/.cache/planet):

    network.json                 what init made: chain id, app, validators, ports, node ids
    node<i>/                     CometBFT home of validator i (config/, data/)
    node<i>/app.sqlite           the ABCI app's state (written by the app)
    node<i>/config/operator_key.json   operator key (eth-account keystore, empty password, 0600)
    logs/app<i>.log, logs/cometbft<i>.log, logs/watcher<i>.log
    run/app<i>.pid, run/cometbft<i>.pid, run/watcher<i>.pid

Each validator's operator key (secp256k1) is in genesis `app_state.validators` with the
validator's power; `committee_members` returns (operator address, power) pairs to deploy the
`Committee` contract with the same powers, and `set_genesis_evm` writes the contract's address
(and the served models) into every genesis before the first start. `start_watchers` runs one
stake watcher per validator (`python -m node.watcher`, signing with that validator's consensus
key); `stop_network` stops them with the rest.

Ports of validator i, from `base_port` (default 27000): p2p base+10i, RPC base+10i+1,
ABCI app base+10i+2, pprof base+10i+3 (all on 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from node.net import port_is_free
from node.procs import since_last_start, spawn_logged
from protocol.errors import ConfigError, PlanetError, UnavailableError, UsageError

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
COMETBFT_VERSION = "0.38.25"
DEFAULT_BASE_PORT = 27000
DEFAULT_TIMEOUT_COMMIT = "300ms"
DEFAULT_EPOCH_LENGTH = 100
DEFAULT_CHAIN_ID = "planet-committee"
DEFAULT_EVM_CHAIN_ID = 31337
# Where the devnet's settlement contract will live is not known at init time: zero until deployed.
DEFAULT_COMMITTEE_ADDRESS = "0x" + "00" * 20
VOTE_EXTENSIONS_ENABLE_HEIGHT = 1
APPS = ("planet", "kvstore")
MANIFEST = "network.json"
OPERATOR_KEY_FILE = "operator_key.json"


class PortBusyError(UnavailableError):
    """A port the network needs is taken by another process."""

    code = "port_busy"

    def __init__(self, port: int, what: str) -> None:
        super().__init__(
            f"port {port} ({what}) is already in use",
            hint=f"stop what uses it (`ss -ltnp | grep :{port}`), or init with another --base-port",
        )
        self.port = port


# -- locating things ---------------------------------------------------------------------------


def planet_home() -> Path:
    return Path(os.environ.get("PLANET_HOME") or Path.home() / ".cache" / "planet")


def default_dir() -> Path:
    return planet_home() / "committee"


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


# -- the manifest ------------------------------------------------------------------------------


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

    @property
    def name(self) -> str:
        return f"validator{self.index}"

    @property
    def rpc_url(self) -> str:
        return f"http://127.0.0.1:{self.rpc_port}"

    @property
    def abci_url(self) -> str:
        return f"tcp://127.0.0.1:{self.abci_port}"

    @property
    def p2p_address(self) -> str:
        return f"{self.node_id}@127.0.0.1:{self.p2p_port}"


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


# -- config rewriting --------------------------------------------------------------------------


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
            "laddr": f"tcp://127.0.0.1:{validator.rpc_port}",
            "pprof_laddr": f"127.0.0.1:{validator.pprof_port}",
            "max_open_connections": 2000,
            "max_subscription_clients": 200,
            "max_subscriptions_per_client": 20,
            "experimental_subscription_buffer_size": 2000,
            "experimental_websocket_write_buffer_size": 2000,
        },
        "p2p": {
            "laddr": f"tcp://127.0.0.1:{validator.p2p_port}",
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


def app_state(
    operators: dict[str, str],
    *,
    epoch_length: int,
    evm_chain_id: int = DEFAULT_EVM_CHAIN_ID,
    committee_address: str = DEFAULT_COMMITTEE_ADDRESS,
) -> dict[str, Any]:
    """The genesis `app_state` of the Planet ABCI app (`abci_app.genesis.Genesis.parse` reads it).

    `operators` maps each CometBFT validator address (uppercase hex) to its operator's EVM
    address; the EVM part is the EIP-712 domain of the committee's verdict signatures.
    """
    return {
        "epoch_length": epoch_length,
        "evm": {"chain_id": evm_chain_id, "committee_address": committee_address},
        "validators": dict(sorted(operators.items())),
    }


def configure_genesis(
    genesis: dict[str, Any], *, chain_id: str, state: dict[str, Any] | None
) -> dict[str, Any]:
    """Genesis with our chain id, vote extensions from height 1 and the app's state."""
    updated = json.loads(json.dumps(genesis))
    updated["chain_id"] = chain_id
    params = updated.setdefault("consensus_params", {})
    params.setdefault("abci", {})["vote_extensions_enable_height"] = str(
        VOTE_EXTENSIONS_ENABLE_HEIGHT
    )
    if state is not None:
        updated["app_state"] = state
    return updated


def write_operator_key(path: Path) -> str:
    """A fresh secp256k1 operator key as an eth-account keystore (empty password), mode 0600."""
    from eth_account import Account  # slow import: only init needs it

    account = Account.create()
    keystore = Account.encrypt(account.key, "", kdf="pbkdf2", iterations=2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(keystore, handle)
    return str(account.address)


def read_operator_key(path: Path) -> bytes:
    """The private key from an operator key file written by `write_operator_key`."""
    from eth_account import Account

    return bytes(Account.decrypt(json.loads(path.read_text()), ""))


# -- init --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InitOptions:
    directory: Path
    validators: int = 4
    base_port: int = DEFAULT_BASE_PORT
    timeout_commit: str = DEFAULT_TIMEOUT_COMMIT
    epoch_length: int = DEFAULT_EPOCH_LENGTH
    chain_id: str = DEFAULT_CHAIN_ID
    app: str = "planet"
    evm_chain_id: int = DEFAULT_EVM_CHAIN_ID
    committee_address: str = DEFAULT_COMMITTEE_ADDRESS
    force: bool = False


def _validate(options: InitOptions) -> None:
    if not 1 <= options.validators <= 64:
        raise UsageError(f"--validators must be 1..64 (got {options.validators})")
    last = options.base_port + 10 * options.validators
    if options.base_port < 1024 or last > 65535:
        raise UsageError(
            f"--base-port {options.base_port} leaves no room for "
            f"{options.validators} validators (each takes 10 ports)"
        )
    if not re.fullmatch(r"\d+(ms|s)", options.timeout_commit):
        raise UsageError(
            f"--timeout-commit must look like 300ms or 1s (got {options.timeout_commit!r})"
        )
    if options.epoch_length < 1:
        raise UsageError(f"--epoch-length must be >= 1 (got {options.epoch_length})")
    if not re.fullmatch(r"0x[0-9a-fA-F]{40}", options.committee_address):
        raise UsageError(
            f"--committee-address must be a 0x EVM address (got {options.committee_address!r})"
        )
    if options.app not in APPS:
        raise UsageError(f"--app must be one of {', '.join(APPS)} (got {options.app!r})")


def init_network(options: InitOptions) -> Network:
    """Generate a fresh network in options.directory (refuses to overwrite without force)."""
    _validate(options)
    directory = options.directory.resolve()
    if (directory / MANIFEST).exists() or any(directory.glob("node*")):
        if not options.force:
            raise UsageError(
                f"{directory} already holds a committee network",
                hint="start it with `planet committee up`, or re-create it with --force "
                "(this deletes its chain data)",
            )
        if (directory / MANIFEST).exists() and running_processes(load_network(directory)):
            raise UsageError(
                f"the network in {directory} is running",
                hint="stop it first: `planet committee down`",
            )
        for child in [*directory.glob("node*"), directory / "logs", directory / "run"]:
            shutil.rmtree(child, ignore_errors=True)
        (directory / MANIFEST).unlink(missing_ok=True)
    directory.mkdir(parents=True, exist_ok=True)
    cometbft = find_cometbft()
    command = [
        str(cometbft),
        "testnet",
        "--v",
        str(options.validators),
        "--o",
        str(directory),
        "--starting-ip-address",
        "127.0.0.1",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise ConfigError(f"`{' '.join(command)}` failed: {done.stderr.strip()[-500:]}")

    homes = [directory / f"node{i}" for i in range(options.validators)]
    genesis = json.loads((homes[0] / "config" / "genesis.json").read_text())
    by_name = {v["name"]: v["address"] for v in genesis["validators"]}
    operators = [write_operator_key(h / "config" / OPERATOR_KEY_FILE) for h in homes]
    validators = tuple(
        Validator(
            index=i,
            home=str(home),
            node_id=node_id_from_key(json.loads((home / "config" / "node_key.json").read_text())),
            p2p_port=options.base_port + 10 * i,
            rpc_port=options.base_port + 10 * i + 1,
            abci_port=options.base_port + 10 * i + 2,
            pprof_port=options.base_port + 10 * i + 3,
            operator_address=operators[i],
            validator_address=by_name[f"node{i}"],
        )
        for i, home in enumerate(homes)
    )
    state = (
        app_state(
            {v.validator_address: v.operator_address for v in validators},
            epoch_length=options.epoch_length,
            evm_chain_id=options.evm_chain_id,
            committee_address=options.committee_address,
        )
        if options.app == "planet"
        else None
    )
    genesis_text = (
        json.dumps(configure_genesis(genesis, chain_id=options.chain_id, state=state), indent=2)
        + "\n"
    )
    for validator in validators:
        config_path = Path(validator.home) / "config" / "config.toml"
        values = validator_config(
            validator, validators, timeout_commit=options.timeout_commit, app=options.app
        )
        config_path.write_text(set_toml_values(config_path.read_text(), values))
        (Path(validator.home) / "config" / "genesis.json").write_text(genesis_text)
    network = Network(
        dir=str(directory),
        chain_id=options.chain_id,
        app=options.app,
        base_port=options.base_port,
        timeout_commit=options.timeout_commit,
        epoch_length=options.epoch_length,
        validators=validators,
    )
    (directory / "logs").mkdir(exist_ok=True)
    (directory / "run").mkdir(exist_ok=True)
    (directory / MANIFEST).write_text(json.dumps(network.to_json(), indent=2) + "\n")
    return network


# -- processes ---------------------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """True if the process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust kill -0
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def read_pid(network: Network, process: str, index: int) -> int | None:
    """The pid in run/<process><i>.pid if that process is alive and is ours (its home matches)."""
    path = network.pid_path(process, index)
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    if not pid_alive(pid):
        return None
    cmdline = _cmdline(pid)
    if cmdline and network.validators[index].home not in cmdline:
        return None  # the pid was reused by someone else's process
    return pid


def running_processes(network: Network) -> dict[str, int]:
    """{"app0": pid, "cometbft0": pid, ...} for every live process of the network."""
    found: dict[str, int] = {}
    for validator in network.validators:
        for process in ("app", "cometbft", "watcher"):
            pid = read_pid(network, process, validator.index)
            if pid is not None:
                found[f"{process}{validator.index}"] = pid
    return found


def _require_ports(ports: dict[int, str]) -> None:
    for port, what in ports.items():
        if not port_is_free(port):
            raise PortBusyError(port, what)


def _split_name(name: str) -> tuple[str, int]:
    """ "cometbft2" -> ("cometbft", 2)."""
    process = name.rstrip("0123456789")
    return process, int(name[len(process) :])


def _spawn(network: Network, process: str, index: int, argv: list[str]) -> int:
    log_path = network.log_path(process, index)
    network.pid_path(process, index).parent.mkdir(parents=True, exist_ok=True)
    child = spawn_logged(argv, log_path, cwd=network.validators[index].home)
    network.pid_path(process, index).write_text(f"{child.pid}\n")
    log.info("started process=%s%d pid=%d log=%s", process, index, child.pid, log_path)
    return child.pid


def app_command(validator: Validator) -> list[str]:
    return [
        sys.executable,
        "-m",
        "abci_app",
        "--home",
        validator.home,
        "--listen",
        validator.abci_url,
    ]


def cometbft_command(network: Network, validator: Validator) -> list[str]:
    argv = [str(find_cometbft()), "node", "--home", validator.home]
    if network.app == "kvstore":
        argv += ["--proxy_app", "kvstore"]
    return argv


def log_tail(path: Path, lines: int = 15) -> str:
    """The last lines a process wrote since its latest start (see `_spawn`'s marker)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(since_last_start(text).splitlines()[-lines:]) or "(no output)"


class ProcessDiedError(UnavailableError):
    """A process of the network exited during start-up."""

    code = "process_died"

    def __init__(self, name: str, log_path: Path) -> None:
        super().__init__(
            f"{name} exited during start-up; last lines of {log_path}:\n{log_tail(log_path)}",
            hint=f"read {log_path}",
        )


def _wait_port_open(port: int, pid: int, name: str, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            raise ProcessDiedError(name, log_path)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise UnavailableError(
        f"{name} did not listen on port {port} within {timeout_s:g} s", hint=f"read {log_path}"
    )


def start_network(
    network: Network,
    *,
    only: Iterable[int] | None = None,
    wait: bool = True,
    timeout_s: float = 60.0,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, int]:
    """Start every validator of the network that is not running; returns {name: pid} started.

    A validator is its app process and its cometbft process: when only one of them runs, it is
    stopped and both are started again (CometBFT cannot reconnect to a new app process, and a
    fresh app replays from its store during CometBFT's handshake). All needed ports are checked
    before anything starts. With `wait`, returns once every node's RPC answers, none is catching
    up, and all have committed a block after the start. On failure, the processes started by
    this call are stopped again.
    """
    indexes = sorted(set(only)) if only is not None else [v.index for v in network.validators]
    processes = ("app", "cometbft") if network.app == "planet" else ("cometbft",)
    planned: list[Validator] = []
    for index in indexes:
        pids = {f"{p}{index}": read_pid(network, p, index) for p in processes}
        live = {name: pid for name, pid in pids.items() if pid is not None}
        if len(live) == len(processes):
            continue
        if live:
            progress(f"validator{index}: {', '.join(live)} still running alone; restarting it")
            _stop_pids(live, timeout_s=10)
        planned.append(network.validators[index])
    ports: dict[int, str] = {}
    for validator in planned:
        ports[validator.p2p_port] = f"p2p of validator{validator.index}"
        ports[validator.rpc_port] = f"rpc of validator{validator.index}"
        if network.app == "planet":
            ports[validator.abci_port] = f"app of validator{validator.index}"
    _require_ports(ports)
    started: dict[str, int] = {}
    try:
        for validator in planned:
            index = validator.index
            if network.app == "planet":
                pid = _spawn(network, "app", index, app_command(validator))
                started[f"app{index}"] = pid
                _wait_port_open(
                    validator.abci_port,
                    pid,
                    f"app{index}",
                    network.log_path("app", index),
                    timeout_s=min(timeout_s, 60),
                )
            started[f"cometbft{index}"] = _spawn(
                network, "cometbft", index, cometbft_command(network, validator)
            )
            progress(f"validator{index}: started")
        if wait:
            asyncio.run(_wait_committing(network, started, timeout_s, progress))
    except BaseException:
        _stop_pids({name: pid for name, pid in started.items() if pid_alive(pid)}, timeout_s=10)
        for name in started:
            network.pid_path(*_split_name(name)).unlink(missing_ok=True)
        raise
    return started


async def _wait_committing(
    network: Network,
    started: dict[str, int],
    timeout_s: float,
    progress: Callable[[str], None],
) -> None:
    """Until every running node answers, is connected to all other running nodes, is caught
    up, and has a block above the height seen when they all first answered."""
    from node.chain.committee_rpc import CommitteeRpc

    running = [v for v in network.validators if read_pid(network, "cometbft", v.index) is not None]
    clients = [CommitteeRpc(v.rpc_url, timeout_s=2) for v in running]
    deadline = time.monotonic() + timeout_s
    target: int | None = None
    last_line = ""

    async def probe(client: CommitteeRpc) -> tuple[int, bool, int] | None:
        try:
            status = await client.status()
            peers = int((await client.net_info()).get("n_peers") or 0)
        except PlanetError:
            return None
        return status.latest_block_height, status.catching_up, peers

    try:
        while True:
            for name, pid in started.items():
                if not pid_alive(pid):
                    raise ProcessDiedError(name, network.log_path(*_split_name(name)))
            results = await asyncio.gather(*(probe(c) for c in clients))
            heights = [r[0] if r is not None else None for r in results]
            answering = [h for h in heights if h is not None]
            if len(answering) == len(clients) and target is None:
                target = max(answering, default=0) + 1
            ready = target is not None and all(
                r is not None and not r[1] and r[0] >= target and r[2] >= len(clients) - 1
                for r in results
            )
            line = "heights " + " ".join("-" if h is None else str(h) for h in heights)
            line += "  peers " + " ".join("-" if r is None else str(r[2]) for r in results)
            if line != last_line:
                progress(line)
                last_line = line
            if ready:
                return
            if time.monotonic() > deadline:
                silent = [running[i].name for i, h in enumerate(heights) if h is None]
                raise UnavailableError(
                    f"the network did not commit blocks within {timeout_s:g} s ({line}"
                    + (f"; not answering: {', '.join(silent)}" if silent else "")
                    + ")",
                    hint=f"read the logs in {network.path / 'logs'}",
                )
            await asyncio.sleep(0.25)
    finally:
        for client in clients:
            await client.close()


def _stop_pids(pids: dict[str, int], *, timeout_s: float) -> list[str]:
    """SIGTERM each process group, wait, SIGKILL what is left; returns the names stopped."""
    for name, pid in pids.items():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
        log.info("sent SIGTERM process=%s pid=%d", name, pid)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids.values()):
        time.sleep(0.05)
    for name, pid in pids.items():
        if pid_alive(pid):
            log.warning("process=%s pid=%d ignored SIGTERM; sending SIGKILL", name, pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return list(pids)


def stop_network(
    network: Network, *, only: Iterable[int] | None = None, timeout_s: float = 15.0
) -> list[str]:
    """Stop the network's processes (cometbft first, then apps). Idempotent."""
    indexes = set(only) if only is not None else {v.index for v in network.validators}
    stopped: list[str] = []
    for process in ("watcher", "cometbft", "app"):
        pids = {
            f"{process}{i}": pid
            for i in sorted(indexes)
            if (pid := read_pid(network, process, i)) is not None
        }
        stopped += _stop_pids(pids, timeout_s=timeout_s)
        for i in indexes:
            network.pid_path(process, i).unlink(missing_ok=True)
    return stopped


# -- the EVM side: operators, genesis, stake watchers ------------------------------------------


def committee_members(network: Network) -> list[tuple[str, int]]:
    """(operator address, voting power) per validator, as genesis has them: deploy the
    `Committee` contract with exactly these, so the chain's 2/3 is the contract's 2/3."""
    genesis = json.loads((Path(network.validators[0].home) / "config" / "genesis.json").read_text())
    powers = {v["address"].upper(): int(v["power"]) for v in genesis["validators"]}
    return [(v.operator_address, powers[v.validator_address.upper()]) for v in network.validators]


def set_genesis_evm(
    network: Network,
    *,
    committee_address: str,
    evm_chain_id: int = DEFAULT_EVM_CHAIN_ID,
    fraud_proofs_address: str | None = None,
    models: dict[str, int] | None = None,
    escrow_address: str | None = None,
    gateways: list[str] | None = None,
    retention_epochs: int | None = None,
) -> None:
    """Write the deployed Committee address (and FraudProofs, the verdicts' consumer), the EVM
    chain id and the served models ({model: shard count}) into every validator's genesis; with
    `escrow_address` (the QueryEscrow that consumes payout roots) and `gateways` (their ed25519
    committee keys, 64 hex) epoch settlement is on; `retention_epochs` (genesis default 10)
    is how many settled epochs keep their records, payout statements and claim proofs
    included. Only before the first start."""
    for address in (
        committee_address,
        fraud_proofs_address or committee_address,
        escrow_address or committee_address,
    ):
        if not re.fullmatch(r"0x[0-9a-fA-F]{40}", address):
            raise UsageError(f"not an EVM address: {address!r}")
    for validator in network.validators:
        if (Path(validator.home) / "app.sqlite").exists():
            raise UsageError(
                f"validator{validator.index} has already started: its genesis is fixed",
                hint="re-create the network (`planet committee init --force`)",
            )
    for validator in network.validators:
        path = Path(validator.home) / "config" / "genesis.json"
        genesis = json.loads(path.read_text())
        state = genesis.setdefault("app_state", {})
        state["evm"] = {"chain_id": evm_chain_id, "committee_address": committee_address}
        if fraud_proofs_address is not None:
            state["evm"]["fraud_proofs_address"] = fraud_proofs_address
        if escrow_address is not None:
            state["evm"]["escrow_address"] = escrow_address
        if gateways:
            state["gateways"] = sorted(gateways)
        if retention_epochs is not None:
            state["retention_epochs"] = retention_epochs
        if models:
            state["models"] = {name: {"shards": n} for name, n in sorted(models.items())}
        path.write_text(json.dumps(genesis, indent=2) + "\n")


def watcher_command(
    network: Network, validator: Validator, *, deployment: Path, evm_rpc: str
) -> list[str]:
    """The stake watcher of `validator`; it falls back to the other validators' RPCs."""
    others = [v for v in network.validators if v.index != validator.index]
    argv = [
        sys.executable, "-m", "node.watcher",
        "--home", validator.home,
        "--deployment", str(deployment),
        "--evm-rpc", evm_rpc,
    ]  # fmt: skip
    for peer in [validator, *others]:
        argv += ["--committee-rpc", peer.rpc_url]
    return argv


def start_watchers(
    network: Network,
    *,
    deployment: Path,
    evm_rpc: str,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, int]:
    """Start a stake watcher for every validator that has none running; {name: pid}."""
    started: dict[str, int] = {}
    for validator in network.validators:
        if read_pid(network, "watcher", validator.index) is not None:
            continue
        argv = watcher_command(network, validator, deployment=deployment, evm_rpc=evm_rpc)
        started[f"watcher{validator.index}"] = _spawn(network, "watcher", validator.index, argv)
    time.sleep(0.5)
    for name, pid in started.items():
        if not pid_alive(pid):
            raise ProcessDiedError(name, network.log_path(*_split_name(name)))
    progress(f"stake watchers started: {', '.join(started) or 'all were running'}")
    return started


# -- status ------------------------------------------------------------------------------------


async def network_status(network: Network, *, timeout_s: float = 3.0) -> list[dict[str, Any]]:
    """Per validator: pids and liveness, and what its RPC says (height, hashes, peers)."""
    from node.chain.committee_rpc import CommitteeRpc

    async def one(validator: Validator) -> dict[str, Any]:
        row: dict[str, Any] = {
            "validator": validator.index,
            "rpc": validator.rpc_url,
            "node_id": validator.node_id,
            "operator_address": validator.operator_address,
        }
        for process in ("app", "cometbft", "watcher"):
            path = network.pid_path(process, validator.index)
            try:
                pid: int | None = int(path.read_text().strip())
            except (OSError, ValueError):
                pid = None
            row[f"{process}_pid"] = pid
            row[f"{process}_alive"] = read_pid(network, process, validator.index) is not None
        if network.app != "planet":
            row["app_alive"] = row["cometbft_alive"]
        if not row["cometbft_alive"]:
            row.update(
                height=None,
                app_hash=None,
                block_hash=None,
                catching_up=None,
                peers=None,
                error="cometbft is not running",
            )
            return row
        async with CommitteeRpc(validator.rpc_url, timeout_s=timeout_s) as rpc:
            try:
                status = await rpc.status()
                peers = await rpc.net_info()
            except Exception as error:  # reported per node, the others still answer
                row.update(
                    height=None,
                    app_hash=None,
                    block_hash=None,
                    catching_up=None,
                    peers=None,
                    error=getattr(error, "message", str(error)),
                )
                return row
        row.update(
            height=status.latest_block_height,
            app_hash=status.latest_app_hash,
            block_hash=status.latest_block_hash,
            block_time=status.latest_block_time,
            catching_up=status.catching_up,
            peers=int(peers.get("n_peers", 0)),
            error=None,
        )
        return row

    return list(await asyncio.gather(*(one(v) for v in network.validators)))
