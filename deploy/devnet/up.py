"""`up`: the devnet's seven steps, each reported through `progress`, undone on failure."""

from __future__ import annotations

import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from deploy.anvil import ANVIL_DEV_KEY, DEVNET_CHAIN_ID, anvil_binary, rpc_call
from deploy.committee.generate import InitOptions, init_network
from deploy.committee.genesis import committee_members, set_genesis_evm
from deploy.committee.processes import pid_alive
from deploy.committee.start import start_network
from deploy.committee.watchers import start_watchers
from deploy.devnet.down import down
from deploy.devnet.operators import fund_operators, run_operator_commands
from deploy.devnet.plan import (
    DEVNET_RETENTION_EPOCHS,
    DevnetOptions,
    Progress,
    read_state,
    write_state,
)
from deploy.devnet.processes import StepFailed, free_block, free_port, spawn
from deploy.devnet.services import (
    await_gateway,
    gateway_identity,
    start_gateway,
    start_verifiers,
)
from deploy.devnet.status import running
from deploy.evm import DeployConfig, deploy_all
from node.agent.launch import model_id_bytes, read_joined
from node.chain.evm.account import PlanetChain
from node.client.nodesfile import NodeRef, NodesFile
from node.model.manifest import Manifest, verify_directory
from node.model.source import DEFAULT_MODEL_ID, models_dir
from protocol.errors import PlanetError, UsageError


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
    write_state(directory, state)
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
    write_state(directory, state)
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
    shards = min(options.nodes, 3)  # 3 shards (SmolLM2's 30 layers as 10+10+10), or fewer nodes
    manifest_file = _prepared_model(shards, options.quant, progress)
    manifest = Manifest.load(manifest_file)
    state.update(manifest=str(manifest_file), model_hash=manifest.model_hash, shards=shards)
    done(f"model {manifest.model_hash[:19]}…")

    # 2. anvil
    _step(progress, 2, "EVM chain: anvil")
    port = free_port(8545, 8999)
    anvil_log = directory / "logs" / "anvil.log"
    anvil_pid = spawn(
        [str(anvil_binary()), "--host", "127.0.0.1", "--port", str(port),
         "--chain-id", str(DEVNET_CHAIN_ID), "--accounts", "10", "--balance", "10000"],
        anvil_log,
    )  # fmt: skip
    state["pids"]["anvil"] = anvil_pid
    evm_rpc = f"http://127.0.0.1:{port}"
    state["evm_rpc"] = evm_rpc
    write_state(directory, state)
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
            base_port=free_block(10 * options.validators),
            evm_chain_id=DEVNET_CHAIN_ID,
            epoch_length=options.epoch_length,
        )
    )
    state["committee_dir"] = network.dir
    state["committee_rpc"] = [v.rpc_url for v in network.validators]
    write_state(directory, state)
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
    gateway = gateway_identity(options, state) if options.gateway else None
    set_genesis_evm(
        network,
        committee_address=deployment.address("Committee"),
        fraud_proofs_address=deployment.address("FraudProofs"),
        evm_chain_id=DEVNET_CHAIN_ID,
        models={manifest.model_hash: len(manifest.shards)},
        escrow_address=deployment.address("QueryEscrow"),
        gateways=[gateway[0]] if gateway else [],
        gateway_addresses=dict([gateway]) if gateway else None,
        retention_epochs=DEVNET_RETENTION_EPOCHS,
    )
    registrar = PlanetChain(deployment, ANVIL_DEV_KEY, rpc_url=evm_rpc)
    model_id = model_id_bytes(manifest.model_hash)
    registrar.registry.dev_register(
        model_id, model_id, [model_id_bytes(s.hash) for s in manifest.shards]
    )
    write_state(directory, state)
    done(f"model registered as {model_id.hex()[:16]}…")

    # 5. validators + watchers
    _step(progress, 5, "committee: start apps, CometBFT and stake watchers")
    start_network(network, timeout_s=90, progress=lambda line: progress("      " + line))
    start_watchers(network, deployment=deployment_path, evm_rpc=evm_rpc, progress=progress)
    done("committee committing blocks")

    # 6. operators: fund, stake, join — the operator's own commands
    _step(progress, 6, f"compute nodes: {options.nodes} operators `planet stake` + `planet join`")
    start_gateway(options, state, progress)  # loads its client model while the nodes join
    operators = fund_operators(options, state, registrar, network, progress)
    run_operator_commands(options, state, operators, progress)
    _write_nodes_file(options, state, manifest)
    done(f"{options.nodes} nodes routable")

    # 7. gateway
    _step(progress, 7, "gateway")
    await_gateway(state)
    write_state(directory, state)
    done("gateway " + ("at " + state["gateway_url"] if state.get("gateway_url") else "skipped"))
    if options.verifiers:
        start_verifiers(options, state, network, progress)
        write_state(directory, state)


def _prepared_model(shards: int, quant: str, progress: Progress) -> Path:
    """The default model's manifest in `shards` parts: the cached copy when every hash in it
    re-derives (no torch import needed), else `planet model prepare`'s code path."""
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


def _write_nodes_file(options: DevnetOptions, state: dict[str, Any], manifest: Manifest) -> None:
    """A nodes file (`planet ask --nodes`) with one joined node per shard, for unpaid questions
    straight to the nodes (the gateway is the paid path)."""
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
