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
from deploy.devnet.hosts import (
    ANVIL_PORT,
    COMMITTEE_BASE_PORT,
    LOOPBACK_RANGE,
    MAX_NAT_HOSTS,
    MAX_OPERATOR_HOSTS,
    MAX_RELAY_HOSTS,
    Placement,
    check_privileges,
    inside,
    plan_hosts,
    start_lab,
)
from deploy.devnet.operators import fund_operators, run_operator_commands
from deploy.devnet.plan import (
    DEVNET_CREDITS,
    DEVNET_RETENTION_EPOCHS,
    SECOND_MODEL_PARTS,
    SECOND_MODEL_QUANT,
    DevnetOptions,
    Progress,
    read_state,
    write_state,
)
from deploy.devnet.processes import StepFailed, free_block, free_port, spawn
from deploy.devnet.second_model import SeatJoins
from deploy.devnet.services import (
    await_gateway,
    await_gateway_credits,
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
    if not 1 <= options.nodes <= 9 or options.all_nodes > 12:
        raise UsageError("--nodes must be 1..9, with --cheat-node 12 in all (~1 GB each)")
    hosts_plan = None
    if options.hosts is not None:
        if not 0 <= options.operator_hosts <= MAX_OPERATOR_HOSTS:
            raise UsageError(f"--operator-hosts must be 0..{MAX_OPERATOR_HOSTS}")
        if not 0 <= options.relay_hosts <= MAX_RELAY_HOSTS:
            raise UsageError(f"--relay-hosts must be 0..{MAX_RELAY_HOSTS}")
        if not 0 <= options.nat_hosts <= MAX_NAT_HOSTS:
            raise UsageError(f"--nat-hosts must be 0..{MAX_NAT_HOSTS}")
        hosts_plan = plan_hosts(
            validators=options.validators,
            nodes=options.nodes,
            gateway=options.gateway,
            operators=options.operator_hosts,
            links=options.hosts,
            relays=options.relay_hosts,
            nats=options.nat_hosts,
        )
        check_privileges()
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
        "next_hop_range": LOOPBACK_RANGE,  # what the nodes' next-hop policy may dial
    }
    write_state(directory, state)
    started = time.monotonic()
    try:
        if hosts_plan is not None:
            assert options.hosts is not None
            progress(f"[0/7] hosts: {len(hosts_plan.names)} namespaces, {options.hosts.describe()}")
            state["hosts"] = start_lab(hosts_plan, directory, progress)
            state["hosts"]["links"] = options.hosts.describe()
            state["next_hop_range"] = state["hosts"]["network"]
            write_state(directory, state)
        place = Placement.from_state(state)
        with inside(place.control_netns):
            _up_steps(options, state, place, progress)
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


def _up_steps(
    options: DevnetOptions, state: dict[str, Any], place: Placement, progress: Progress
) -> None:
    directory = options.dir
    t0 = time.monotonic()

    steps = state.setdefault("steps_s", {})  # step → seconds since the start, in order

    def done(what: str) -> None:
        elapsed = time.monotonic() - t0
        steps[str(len(steps) + 1)] = round(elapsed, 1)
        progress(f"      {what} ({elapsed:.1f} s)")

    # 1. model
    shards = options.shards
    _step(progress, 1, f"model: default in {shards} shards, quant {options.quant}")
    if options.nodes_note:
        progress(f"      compute nodes: {options.nodes}, {options.nodes_note}")
    manifest_file = _prepared_model(shards, options.quant, progress)
    manifest = Manifest.load(manifest_file)
    state.update(manifest=str(manifest_file), model_hash=manifest.model_hash, shards=shards)
    more: list[Manifest] = []  # the second model (second_model.py), served by a seat of node0
    if options.with_second_model:
        second_file = _prepared_model(SECOND_MODEL_PARTS, SECOND_MODEL_QUANT, progress)
        more.append(Manifest.load(second_file))
        state.update(more_manifests=[str(second_file)], more_model_hashes=[more[0].model_hash])
    elif options.second_model:
        progress("      no second model: the first is the 1-part int8 set itself")
    done(f"model {manifest.model_hash[:19]}…" + "".join(f", {m.model_hash[:19]}…" for m in more))

    # 2. anvil
    _step(progress, 2, "EVM chain: anvil")
    port = ANVIL_PORT if place.on_hosts else free_port(8545, 8999)
    host = place.address("anvil")
    anvil_log = directory / "logs" / "anvil.log"
    anvil_pid = spawn(
        place.argv("anvil", [
            str(anvil_binary()), "--host", host, "--port", str(port),
            "--chain-id", str(DEVNET_CHAIN_ID), "--accounts", "10", "--balance", "10000",
        ]),
        anvil_log,
    )  # fmt: skip
    state["pids"]["anvil"] = anvil_pid
    evm_rpc = f"http://{host}:{port}"
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
            base_port=(
                COMMITTEE_BASE_PORT if place.on_hosts else free_block(10 * options.validators)
            ),
            evm_chain_id=DEVNET_CHAIN_ID,
            epoch_length=options.epoch_length,
            hosts=(
                tuple(
                    (place.address(f"validator{i}"), str(place.netns(f"validator{i}")))
                    for i in range(options.validators)
                )
                if place.on_hosts
                else None
            ),
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
    set_genesis_evm(
        network,
        committee_address=deployment.address("Committee"),
        fraud_proofs_address=deployment.address("FraudProofs"),
        evm_chain_id=DEVNET_CHAIN_ID,
        models={m.model_hash: len(m.shards) for m in (manifest, *more)},
        escrow_address=deployment.address("QueryEscrow"),
        retention_epochs=DEVNET_RETENTION_EPOCHS,
        credits=DEVNET_CREDITS,
    )
    registrar = PlanetChain(deployment, ANVIL_DEV_KEY, rpc_url=evm_rpc)
    model_ids = []
    for registered in (manifest, *more):
        model_id = model_id_bytes(registered.model_hash)
        registrar.registry.dev_register(
            model_id, model_id, [model_id_bytes(s.hash) for s in registered.shards]
        )
        model_ids.append(model_id.hex()[:16] + "…")
    write_state(directory, state)
    done(f"models registered as {', '.join(model_ids)}")

    # 5. validators + watchers
    _step(progress, 5, "committee: start apps, CometBFT and stake watchers")
    start_network(network, timeout_s=90, progress=lambda line: progress("      " + line))
    start_watchers(network, deployment=deployment_path, evm_rpc=evm_rpc, progress=progress)
    done("committee committing blocks")

    # 6. operators: fund, stake, join — the operator's own commands
    cheats = f" (+{len(options.cheat_nodes)} cheating)" if options.cheat_nodes else ""
    price = f"each charging a credit per {options.node_price} positions"
    price = price if options.node_price else "free"
    _step(progress, 6, f"compute nodes: {options.nodes}{cheats} operators stake and join, {price}")
    start_gateway(options, state, place, progress)  # loads its models while the nodes join
    operators = fund_operators(options, state, registrar, network, progress)
    # the second model's seats join node0's process as soon as it serves (second_model.py)
    seat_joins = SeatJoins(options, state, place, progress)
    try:
        run_operator_commands(options, state, operators, place, progress)
        _write_nodes_file(options, state, manifest)
        done(f"{options.all_nodes} nodes routable")

        # 7. gateway
        _step(progress, 7, "gateway")
        await_gateway(state)
        write_state(directory, state)
        done("gateway " + ("at " + state["gateway_url"] if state.get("gateway_url") else "skipped"))
        if options.verifier_count:
            start_verifiers(options, state, network, place, progress)
            write_state(directory, state)
        await_gateway_credits(options, state, progress)  # minted with the keys watchers publish
    except BaseException:
        seat_joins.stop()  # `up` fails: `down` stops what they started
        raise
    seat_joins.wait(progress)
    if seat_joins.joins:
        done(f"{len(seat_joins.joins)} seat(s) of model 2 routable")


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
    by_shard: dict[int, tuple[str, str]] = {}
    for home in state["operators"]:
        joined = read_joined(Path(home) / "run")
        if joined is not None:
            by_shard.setdefault(joined.shard, (joined.endpoint, joined.node_key))
    if sorted(by_shard) != list(range(len(manifest.shards))):
        return
    refs = tuple(
        NodeRef(
            url=by_shard[s.shard_id][0],
            shard=s.shard_id,
            layers=tuple(s.layers),
            key=by_shard[s.shard_id][1],  # pinned: the joined nodes serve TLS (https://)
        )
        for s in manifest.shards
    )
    path = options.dir / "nodes.json"
    NodesFile(manifest=Path(state["manifest"]), nodes=refs).save(path)
    state["nodes_file"] = str(path)
