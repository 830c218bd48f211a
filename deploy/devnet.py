"""The whole Planet network on one machine: `planet devnet up | status | down`.

`up` runs, each step reported through `progress`:

1. the model prepared in N shards (cached under $PLANET_HOME/models);
2. anvil (npm), detached, on a free port;
3. a CometBFT committee of V validators (`deploy.committee`), its operator keys in genesis;
4. the contracts deployed with the Committee = those operators and powers, the genesis given
   the Committee address and the model's shard count, the model registered
   (`ModelRegistry.devRegister`, chain 31337 only);
5. the validators with their apps and stake watchers;
6. per compute node an operator home funded from anvil's dev account, then the SAME commands an
   operator types, as subprocesses: `planet stake --role compute --amount 1` and
   `planet join --model M --shard K` (which waits until the node is routable);
7. the gateway (`planet gateway serve`), when this checkout has it (started before the joins,
   so it loads its part of the model meanwhile; ready when `/health` answers).

Run directory `$PLANET_HOME/devnet/`:

    nodes.json         a nodes file over the joined nodes (`planet ask --nodes`, unpaid)
    devnet.json        what runs where (evm_rpc, chain_id, deployment, committee_rpc list,
                       gateway_url, model_hash, manifest, accounts, contracts, pids), and
                       startup_s / steps_s (seconds from the start when each step finished)
    password           the devnet keystores' password (dev only, mode 0600)
    deployment.json    contract addresses and ABIs
    logs/              anvil.log, gateway.log
    committee/         the validators (logs/app<i>.log, cometbft<i>.log, watcher<i>.log)
    operators/node<i>/ an operator home: wallet.json, node_key.json, config.toml, stake.log,
                       join.log, run/ (node-<K>.log, agent.log, joined.json)
    gateway/           the gateway's wallet
    user/wallet.json   a wallet funded with 100 ETH for paid questions (`planet ask --pay`)

A failed step raises a `PlanetError` naming the process and its log; `up` then stops what it
started. `down` stops everything (agents first, so they send `leave`) and is idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.anvil import ANVIL_DEV_ADDRESS, ANVIL_DEV_KEY, DEVNET_CHAIN_ID, anvil_binary, rpc_call
from deploy.committee.generate import InitOptions, init_network
from deploy.committee.genesis import committee_members, set_genesis_evm
from deploy.committee.network import load_network
from deploy.committee.processes import log_tail, pid_alive, stop_network
from deploy.committee.start import start_network
from deploy.committee.status import network_status
from deploy.committee.watchers import start_watchers
from deploy.evm import ETHER, DeployConfig, deploy_all
from node.net import port_is_free
from node.procs import spawn_logged
from protocol.errors import PlanetError, UnavailableError, UsageError

Progress = Callable[[str], None]
STATE_FILE = "devnet.json"
OPERATOR_FUNDS_WEI = 10 * ETHER
USER_FUNDS_WEI = 100 * ETHER
COMPUTE_STAKE_ETH = "1"
REPO_ROOT = Path(__file__).resolve().parents[1]


class StepFailed(UnavailableError):
    """A devnet step failed; names its process and log."""

    code = "devnet_step_failed"

    def __init__(self, step: str, process: str, log_path: Path, detail: str = "") -> None:
        super().__init__(
            f"{step} failed: {process} (log {log_path})"
            + (f"\n{detail}" if detail else f"\n{log_tail(log_path, 10)}"),
            hint=f"read {log_path}; `planet devnet down` cleans up",
        )


DEVNET_EPOCH_LENGTH = 20  # ≈ 6-10 s at the devnet's 300 ms blocks: settlement within a minute
# Settled epochs whose records stay (payout statements and claim proofs among them): the
# genesis default 10 is only ~1-2 minutes of 20-block epochs, too short to claim by hand
# after the escrow's 60 s window; 360 ≈ 40-60 minutes.
DEVNET_RETENTION_EPOCHS = 360
OPERATOR_GAS_WEI = 10**18  # each validator's operator key pays for relaying payout roots


@dataclass(frozen=True)
class DevnetOptions:
    home: Path  # PLANET_HOME
    validators: int = 4
    nodes: int = 3
    quant: str = "int8"
    gateway: bool = True
    join_timeout_s: float = 240.0
    epoch_length: int = DEVNET_EPOCH_LENGTH  # committee blocks per settlement epoch
    verifiers: int = 0  # `planet verifier serve` for the first N validators (needs the gateway)

    @property
    def dir(self) -> Path:
        return self.home / "devnet"


def devnet_dir(home: Path) -> Path:
    return home / "devnet"


def read_state(directory: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads((directory / STATE_FILE).read_text()))
    except (OSError, ValueError):
        return None


def _write_state(directory: Path, state: dict[str, Any]) -> None:
    tmp = directory / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1) + "\n")
    tmp.replace(directory / STATE_FILE)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _ours(pid: int | None, marker: str) -> bool:
    return bool(pid) and pid_alive(int(pid)) and marker in _cmdline(int(pid))


def _free_port(start: int, end: int) -> int:
    for port in range(start, end):
        if port_is_free(port):
            return port
    raise UnavailableError(f"no free port in {start}-{end - 1}")


def _free_ports(count: int, start: int, end: int) -> list[int]:
    ports = [p for p in range(start, end) if port_is_free(p)][:count]
    if len(ports) < count:
        raise UnavailableError(f"not {count} free ports in {start}-{end - 1}")
    return ports


def _free_block(count: int, start: int = 27000, end: int = 60000) -> int:
    """A base port with `count` consecutive free ports (the committee's 10 per validator)."""
    for base in range(start, end, 100):
        if all(port_is_free(p) for p in range(base, base + count)):
            return base
    raise UnavailableError(f"no {count} consecutive free ports in {start}-{end}")


def _spawn(argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> int:
    return spawn_logged(argv, log_path, env=env, cwd=REPO_ROOT).pid


def _planet(*args: str) -> list[str]:
    return [sys.executable, "-m", "node.cli.main", *args]


def _wait_http(url: str, pid: int, what: str, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            raise StepFailed(f"starting {what}", f"{what} (pid {pid}) exited", log_path)
        try:
            with urllib.request.urlopen(url, timeout=1.0) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.2)
    raise StepFailed(
        f"starting {what}", f"{what} did not answer {url} in {timeout_s:.0f} s", log_path
    )


# -- up ------------------------------------------------------------------------------------------


def up(options: DevnetOptions, progress: Progress) -> dict[str, Any]:
    """Bring the devnet up; returns the state written to devnet.json. On failure everything
    started is stopped again and the error names the failed process and its log."""
    directory = options.dir
    current = read_state(directory)
    if current is not None and running(current):
        raise UsageError(
            f"a devnet already runs from {directory}",
            hint="`planet devnet status` shows it; `planet devnet down` stops it",
        )
    if not 1 <= options.validators <= 16:
        raise UsageError("--validators must be 1..16")
    if not 1 <= options.nodes <= 9:
        raise UsageError("--nodes must be 1..9 (each takes ~200 MB of memory)")
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    (directory / "logs").mkdir()
    password_file = directory / "password"
    fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(16))
    state: dict[str, Any] = {
        "dir": str(directory),
        "status": "starting",
        "chain_id": DEVNET_CHAIN_ID,
        "password_file": str(password_file),
        "pids": {},
    }
    _write_state(directory, state)
    started = time.monotonic()
    try:
        _up_steps(options, state, progress)
    except BaseException:
        progress("start-up failed; stopping what was started…")
        try:
            down(options.home, progress=lambda _line: None)
        except Exception as error:  # the start-up error below is the one to report
            progress(f"clean-up incomplete ({error!r}); run `planet devnet down`")
        raise
    state["status"] = "up"
    state["startup_s"] = round(time.monotonic() - started, 1)
    _write_state(directory, state)
    return state


def _step(progress: Progress, number: int, text: str) -> None:
    progress(f"[{number}/7] {text}")


def _up_steps(options: DevnetOptions, state: dict[str, Any], progress: Progress) -> None:
    directory = options.dir
    t0 = time.monotonic()

    steps = state.setdefault("steps_s", {})  # step → seconds since the start, in order

    def done(what: str) -> None:
        elapsed = time.monotonic() - t0
        steps[str(len(steps) + 1)] = round(elapsed, 1)
        progress(f"      {what} ({elapsed:.1f} s)")

    # 1. model
    _step(progress, 1, f"model: default in {options.nodes} shards, quant {options.quant}")
    from node.model.manifest import Manifest

    shards = min(options.nodes, 3)  # 3 shards (SmolLM2's 30 layers as 10+10+10), or fewer nodes
    manifest_file = _prepared_model(shards, options.quant, progress)
    manifest = Manifest.load(manifest_file)
    state.update(manifest=str(manifest_file), model_hash=manifest.model_hash, shards=shards)
    done(f"model {manifest.model_hash[:19]}…")

    # 2. anvil
    _step(progress, 2, "EVM chain: anvil")
    port = _free_port(8545, 8999)
    anvil_log = directory / "logs" / "anvil.log"
    anvil_pid = _spawn(
        [str(anvil_binary()), "--host", "127.0.0.1", "--port", str(port),
         "--chain-id", str(DEVNET_CHAIN_ID), "--accounts", "10", "--balance", "10000"],
        anvil_log,
    )  # fmt: skip
    state["pids"]["anvil"] = anvil_pid
    evm_rpc = f"http://127.0.0.1:{port}"
    state["evm_rpc"] = evm_rpc
    _write_state(directory, state)
    deadline = time.monotonic() + 20
    while True:
        try:
            rpc_call(evm_rpc, "eth_chainId", timeout=0.5)
            break
        except (OSError, ValueError, PlanetError):
            if not pid_alive(anvil_pid) or time.monotonic() > deadline:
                raise StepFailed("starting anvil", f"anvil (pid {anvil_pid})", anvil_log) from None
            time.sleep(0.05)
    done(f"anvil at {evm_rpc}")

    # 3. committee network (not started yet)
    _step(progress, 3, f"committee: {options.validators} CometBFT validators with operator keys")
    network = init_network(
        InitOptions(
            directory=directory / "committee",
            validators=options.validators,
            base_port=_free_block(10 * options.validators),
            evm_chain_id=DEVNET_CHAIN_ID,
            epoch_length=options.epoch_length,
        )
    )
    state["committee_dir"] = network.dir
    state["committee_rpc"] = [v.rpc_url for v in network.validators]
    _write_state(directory, state)
    done("validators initialised")

    # 4. contracts + genesis + model registration
    _step(progress, 4, "contracts: deploy (Committee = the validators' operators), register model")
    members = committee_members(network)
    deployment = deploy_all(
        evm_rpc,
        ANVIL_DEV_KEY,
        DeployConfig.devnet(committee=members),
        expected_chain_id=DEVNET_CHAIN_ID,
        progress=progress,
    )
    deployment_path = deployment.save(directory / "deployment.json")
    state["deployment"] = str(deployment_path)
    state["contracts"] = {name: c.address for name, c in deployment.contracts.items()}
    set_genesis_evm(
        network,
        committee_address=deployment.address("Committee"),
        fraud_proofs_address=deployment.address("FraudProofs"),
        evm_chain_id=DEVNET_CHAIN_ID,
        models={manifest.model_hash: len(manifest.shards)},
        escrow_address=deployment.address("QueryEscrow"),
        gateways=[_gateway_committee_key(options, state)] if options.gateway else [],
        retention_epochs=DEVNET_RETENTION_EPOCHS,
    )
    from node.agent.launch import model_id_bytes
    from node.chain.evm.account import PlanetChain

    registrar = PlanetChain(deployment, ANVIL_DEV_KEY, rpc_url=evm_rpc)
    model_id = model_id_bytes(manifest.model_hash)
    registrar.registry.dev_register(
        model_id, model_id, [model_id_bytes(s.hash) for s in manifest.shards]
    )
    _write_state(directory, state)
    done(f"model registered as {model_id.hex()[:16]}…")

    # 5. validators + watchers
    _step(progress, 5, "committee: start apps, CometBFT and stake watchers")
    start_network(network, timeout_s=90, progress=lambda line: progress("      " + line))
    start_watchers(network, deployment=deployment_path, evm_rpc=evm_rpc, progress=progress)
    done("committee committing blocks")

    # 6. operators: fund, stake, join — the operator's own commands
    _step(progress, 6, f"compute nodes: {options.nodes} operators `planet stake` + `planet join`")
    _start_gateway(options, state, progress)  # loads its client model while the nodes join
    operators = _fund_operators(options, state, registrar, network, progress)
    _run_operator_commands(options, state, operators, progress)
    _write_nodes_file(options, state, manifest)
    done(f"{options.nodes} nodes routable")

    # 7. gateway
    _step(progress, 7, "gateway")
    _await_gateway(state)
    _write_state(directory, state)
    done("gateway " + ("at " + state["gateway_url"] if state.get("gateway_url") else "skipped"))
    if options.verifiers:
        _start_verifiers(options, state, network, progress)
        _write_state(directory, state)


def _prepared_model(shards: int, quant: str, progress: Progress) -> Path:
    """The default model's manifest in `shards` parts: the cached copy when every hash in it
    re-derives (no torch import needed), else `planet model prepare`'s code path."""
    from node.model.manifest import Manifest, verify_directory
    from node.model.source import DEFAULT_MODEL_ID, models_dir

    cached = models_dir() / f"{DEFAULT_MODEL_ID}-{shards}p-{quant}" / "manifest.json"
    if cached.is_file():
        try:
            manifest = Manifest.load(cached)
            if len(manifest.shards) == shards and all(s.quant == quant for s in manifest.shards):
                verify_directory(manifest, cached.parent)
                progress(f"      reusing {cached.parent} (hashes verified)")
                return cached.resolve()
        except PlanetError as error:
            progress(f"      not reusing {cached.parent}: {error.message}")
    from node.model.prepare import prepare  # imports torch: only when there is work to do

    return Path(prepare(parts=shards, quant=quant, progress=progress)).resolve()


def _fund_operators(
    options: DevnetOptions,
    state: dict[str, Any],
    registrar: Any,
    network: Any,
    progress: Progress,
) -> list[Path]:
    from node.config import write_config_file
    from node.keys import create_dev_wallet

    password = Path(state["password_file"]).read_text()
    homes = []
    accounts = []
    w3 = registrar.w3
    nonce = w3.eth.get_transaction_count(ANVIL_DEV_ADDRESS, "pending")
    hashes = []

    def send(to: str, value: int, nonce: int) -> Any:
        block = w3.eth.get_block("latest")
        tx = {
            "to": to,
            "value": value,
            "gas": 21_000,
            "nonce": nonce,
            "chainId": DEVNET_CHAIN_ID,
            "maxFeePerGas": 2 * block["baseFeePerGas"] + 10**9,
            "maxPriorityFeePerGas": 10**9,
        }
        return w3.eth.send_raw_transaction(registrar.account.sign_transaction(tx).raw_transaction)

    for index in range(options.nodes):
        home = options.dir / "operators" / f"node{index}"
        validator = network.validators[index % len(network.validators)]
        write_config_file(
            home / "config.toml",
            {
                "evm_rpc": state["evm_rpc"],
                "committee_rpc": validator.rpc_url,
                "chain_id": DEVNET_CHAIN_ID,
                "deployment": state["deployment"],
            },
        )
        wallet = create_dev_wallet(home / "wallet.json", password)
        hashes.append(send(wallet.address, OPERATOR_FUNDS_WEI, nonce))
        nonce += 1
        homes.append(home)
        accounts.append(
            {
                "name": f"node{index}",
                "address": wallet.address,
                "keystore": str(home / "wallet.json"),
                "home": str(home),
            }
        )
    # Validators' operator keys relay payout roots to the escrow: they need gas.
    for validator in network.validators:
        hashes.append(send(validator.operator_address, OPERATOR_GAS_WEI, nonce))
        nonce += 1
    # A user wallet for paid questions (`planet ask --pay --wallet …`).
    user = create_dev_wallet(options.dir / "user" / "wallet.json", password)
    hashes.append(send(user.address, USER_FUNDS_WEI, nonce))
    accounts.append(
        {"name": "user", "address": user.address,
         "keystore": str(options.dir / "user" / "wallet.json"), "home": None}
    )  # fmt: skip
    for tx_hash in hashes:
        w3.eth.wait_for_transaction_receipt(tx_hash, timeout=30, poll_latency=0.02)
    state["accounts"] = accounts
    state["operators"] = [str(h) for h in homes]
    _write_state(options.dir, state)
    progress(f"      funded {len(homes)} operator wallets (10 ETH) and a user wallet (100 ETH)")
    return homes


def _run_parallel(
    commands: list[tuple[str, list[str], Path]], timeout_s: float, progress: Progress, step: str
) -> None:
    """Run the commands at once; echo their stderr lines with a name prefix; fail on the first
    non-zero exit naming the command and its log."""
    running = []
    for name, argv, log_path in commands:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(log_path, "wb")  # noqa: SIM115 - closed below
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        running.append((name, process, log_path, handle, [0]))
    deadline = time.monotonic() + timeout_s
    try:
        while running:
            for entry in list(running):
                name, process, log_path, handle, seen = entry
                lines = log_path.read_text(errors="replace").splitlines()
                for line in lines[seen[0] :]:
                    if line.strip():
                        progress(f"      {name}: {line.strip()}")
                seen[0] = len(lines)
                code = process.poll()
                if code is None:
                    continue
                running.remove(entry)
                handle.close()
                if code != 0:
                    raise StepFailed(
                        step,
                        f"`{' '.join(argv_tail(process.args))}` ({name})",
                        log_path,
                        detail=log_tail(log_path, 8),
                    )
            if running and time.monotonic() > deadline:
                name, process, log_path, _, _ = running[0]
                raise StepFailed(step, f"{name} did not finish in {timeout_s:.0f} s", log_path)
            time.sleep(0.25)
    finally:
        for _, process, _, handle, _ in running:
            process.kill()
            process.wait()
            handle.close()


def argv_tail(argv: Any) -> list[str]:
    """`planet …` as the user would type it (drops the interpreter and module)."""
    parts = [str(a) for a in argv]
    if len(parts) > 2 and parts[1] == "-m":
        return ["planet", *parts[3:]]
    return parts


def _run_operator_commands(
    options: DevnetOptions, state: dict[str, Any], homes: list[Path], progress: Progress
) -> None:
    password_file = state["password_file"]
    stake = [
        (
            f"node{i}",
            _planet(
                "stake",
                "--role",
                "compute",
                "--amount",
                COMPUTE_STAKE_ETH,
                "--home",
                str(home),
                "--password-file",
                password_file,
            ),
            home / "stake.log",
        )
        for i, home in enumerate(homes)
    ]
    _run_parallel(stake, 120, progress, "planet stake")
    ports = _free_ports(len(homes), 18100, 19000)
    join = [
        (
            f"node{i}",
            _planet(
                "join",
                "--port",
                str(ports[i]),
                "--model",
                state["manifest"],
                "--shard",
                str(i % state["shards"]),
                "--home",
                str(home),
                "--password-file",
                password_file,
                "--timeout",
                str(int(options.join_timeout_s)),
            ),
            home / "join.log",
        )
        for i, home in enumerate(homes)
    ]
    _run_parallel(join, options.join_timeout_s + 30, progress, "planet join")


def _write_nodes_file(options: DevnetOptions, state: dict[str, Any], manifest: Any) -> None:
    """A nodes file (`planet ask --nodes`) with one joined node per shard, for unpaid questions
    straight to the nodes (the gateway is the paid path)."""
    from node.agent.launch import read_joined
    from node.client.nodesfile import NodeRef, NodesFile

    by_shard: dict[int, str] = {}
    for home in state["operators"]:
        joined = read_joined(Path(home) / "run")
        if joined is not None:
            by_shard.setdefault(joined.shard, joined.endpoint)
    if sorted(by_shard) != list(range(len(manifest.shards))):
        return
    refs = tuple(
        NodeRef(url=by_shard[s.shard_id], shard=s.shard_id, layers=tuple(s.layers))
        for s in manifest.shards
    )
    path = options.dir / "nodes.json"
    NodesFile(manifest=Path(state["manifest"]), nodes=refs).save(path)
    state["nodes_file"] = str(path)


def gateway_available() -> bool:
    return importlib.util.find_spec("node.cli.gateway") is not None


def _gateway_committee_key(options: DevnetOptions, state: dict[str, Any]) -> str:
    """The gateway's committee key (signs its work reports), made before genesis is fixed so
    its public key can be in genesis `gateways`; `planet gateway serve` finds it next to its
    wallet (`node.gateway.run.committee_key_path`)."""
    from node.keys import load_or_create_node_key

    password = Path(state["password_file"]).read_text()
    path = options.dir / "gateway" / "committee_key.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return load_or_create_node_key(path, password).verify_key.encode().hex()


def _start_gateway(options: DevnetOptions, state: dict[str, Any], progress: Progress) -> None:
    if not options.gateway:
        progress("      gateway: skipped (--no-gateway)")
        return
    if not gateway_available():
        progress("      gateway: skipped (`planet gateway` is not in this checkout yet)")
        return
    port = _free_port(8000, 8999)
    log_path = options.dir / "logs" / "gateway.log"
    from node.keys import create_dev_wallet

    password = Path(state["password_file"]).read_text()
    create_dev_wallet(options.dir / "gateway" / "wallet.json", password)  # a devnet key
    argv = _planet(
        "gateway", "serve",
        "--evm-rpc", state["evm_rpc"],
        "--deployment", state["deployment"],
        "--committee-rpc", state["committee_rpc"][0],
        "--manifest", state["manifest"],
        "--wallet", str(options.dir / "gateway" / "wallet.json"),
        "--password-file", state["password_file"],
        "--host", "127.0.0.1",
        "--port", str(port),
        "--report-min-questions", "1",  # a dev chain: settle each question quickly
    )  # fmt: skip
    pid = _spawn(argv, log_path)
    state["pids"]["gateway"] = pid
    state["gateway_pending"] = {"url": f"http://127.0.0.1:{port}", "log": str(log_path)}
    _write_state(options.dir, state)
    progress(f"      gateway: loading in the background (pid {pid}, log {log_path})")


def _start_verifiers(
    options: DevnetOptions, state: dict[str, Any], network: Any, progress: Progress
) -> None:
    """`planet verifier serve` on the first `options.verifiers` validators' homes, each with its
    own funded dev wallet (it pays for its challenges like a user); logs logs/verifier<i>.log."""
    if not state.get("gateway_url"):
        progress("      verifiers: skipped (they ask through the gateway, which is not running)")
        return
    from node.keys import create_dev_wallet

    password = Path(state["password_file"]).read_text()
    pids = state["pids"].setdefault("verifiers", [])
    for validator in network.validators[: options.verifiers]:
        wallet = options.dir / f"verifier{validator.index}" / "wallet.json"
        wallet.parent.mkdir(parents=True, exist_ok=True)
        account = create_dev_wallet(wallet, password)
        rpc_call(state["evm_rpc"], "anvil_setBalance", [account.address, hex(100 * ETHER)])
        argv = _planet(
            "verifier", "serve",
            "--home", validator.home,
            "--manifest", state["manifest"],
            "--gateway", state["gateway_url"],
            "--deployment", state["deployment"],
            "--evm-rpc", state["evm_rpc"],
            "--committee-rpc", validator.rpc_url,
            "--wallet", str(wallet),
            "--password-file", state["password_file"],
        )  # fmt: skip
        log_path = options.dir / "logs" / f"verifier{validator.index}.log"
        pids.append(_spawn(argv, log_path))
        progress(f"      verifier of validator{validator.index}: pid {pids[-1]}, log {log_path}")


def _await_gateway(state: dict[str, Any]) -> None:
    """Wait until the gateway started by `_start_gateway` answers /health."""
    pending = state.pop("gateway_pending", None)
    if pending is None:
        return
    url = pending["url"]
    _wait_http(f"{url}/health", state["pids"]["gateway"], "gateway", Path(pending["log"]), 240)
    state["gateway_url"] = url


# -- status and down -----------------------------------------------------------------------------


def running(state: dict[str, Any]) -> bool:
    """Whether any process of this devnet still runs."""
    pids = state.get("pids", {})
    if _ours(pids.get("anvil"), "anvil") or _ours(pids.get("gateway"), "gateway"):
        return True
    if any(_ours(pid, "verifier") for pid in pids.get("verifiers", [])):
        return True
    if state.get("committee_dir"):
        with contextlib.suppress(PlanetError):
            from deploy.committee.processes import running_processes

            if running_processes(load_network(Path(state["committee_dir"]))):
                return True
    from node.agent.launch import agent_alive, read_joined

    for home in state.get("operators", []):
        joined = read_joined(Path(home) / "run")
        if joined is not None and (agent_alive(joined) or pid_alive(joined.node_pid)):
            return True
    return False


def status(home: Path) -> dict[str, Any]:
    """devnet.json plus what runs now: processes, validators, nodes, pool health, gateway."""
    directory = devnet_dir(home)
    state = read_state(directory)
    if state is None:
        return {"dir": str(directory), "status": "absent"}
    out = dict(state)
    pids = state.get("pids", {})
    out["processes"] = {
        "anvil": _ours(pids.get("anvil"), "anvil"),
        "gateway": _ours(pids.get("gateway"), "gateway") if pids.get("gateway") else None,
    }
    out["validators"] = []
    if state.get("committee_dir"):
        try:
            network = load_network(Path(state["committee_dir"]))
            out["validators"] = asyncio.run(network_status(network))
        except PlanetError as error:
            out["validators_error"] = error.message
    from node.agent.launch import agent_alive, read_joined

    local = []
    for operator in state.get("operators", []):
        joined = read_joined(Path(operator) / "run")
        local.append(
            None
            if joined is None
            else {
                "home": operator,
                "shard": joined.shard,
                "endpoint": joined.endpoint,
                "node_key": joined.node_key,
                "node_alive": pid_alive(joined.node_pid),
                "agent_alive": agent_alive(joined),
            }
        )
    out["local_nodes"] = local
    out["nodes"], out["pool"] = [], None
    if state.get("committee_rpc") and state.get("model_hash"):
        try:
            out["nodes"], out["pool"] = asyncio.run(
                _chain_view(state["committee_rpc"], state["model_hash"])
            )
        except PlanetError as error:
            out["nodes_error"] = error.message
    if state.get("gateway_url"):
        try:
            with urllib.request.urlopen(state["gateway_url"] + "/health", timeout=2) as answer:
                out["gateway_healthy"] = answer.status == 200
        except (urllib.error.URLError, OSError):
            out["gateway_healthy"] = False
    out["running"] = running(state)
    return out


async def _chain_view(urls: list[str], model: str) -> tuple[list[dict[str, Any]], Any]:
    from node.chain.committee_link import CommitteeLink

    link = CommitteeLink(urls, timeout_s=3.0)
    try:
        nodes = await link.nodes(model=model, role="compute")
        pool = await link.query("/pool_health", model=model)
        return nodes, pool
    finally:
        await link.close()


def _stop_pid(pid: int | None, marker: str, grace_s: float = 10.0) -> bool:
    if not _ours(pid, marker):
        return False
    assert pid is not None
    with contextlib.suppress(ProcessLookupError):
        os.kill(int(pid), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and pid_alive(int(pid)):
        time.sleep(0.05)
    if pid_alive(int(pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    return True


def down(home: Path, progress: Progress) -> list[str]:
    """Stop every process of the devnet (gateway, agents → leave, nodes, committee, anvil).
    Idempotent; returns what was stopped."""
    from node.agent.launch import stop_joined

    directory = devnet_dir(home)
    state = read_state(directory)
    if state is None:
        return []
    stopped = []
    pids = state.get("pids", {})
    for pid in pids.get("verifiers", []):
        if _stop_pid(pid, "verifier"):
            stopped.append(f"verifier {pid}")
            progress(f"stopped the verifier (pid {pid})")
    if _stop_pid(pids.get("gateway"), "gateway"):
        stopped.append("gateway")
        progress("stopped the gateway")
    for operator in state.get("operators", []):
        result = stop_joined(Path(operator) / "run")
        name = Path(operator).name
        if result["agent"] or result["node"]:
            stopped.append(name)
            progress(f"stopped {name} (agent sent `leave`, node stopped)")
    if state.get("committee_dir"):
        with contextlib.suppress(PlanetError):
            network = load_network(Path(state["committee_dir"]))
            names = stop_network(network)
            if names:
                stopped += names
                progress(f"stopped the committee ({', '.join(names)})")
    if _stop_pid(pids.get("anvil"), "anvil"):
        stopped.append("anvil")
        progress("stopped anvil")
    state["status"] = "down"
    _write_state(directory, state)
    return stopped
