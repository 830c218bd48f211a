"""`init_network`: a fresh committee network on disk, from `cometbft testnet` to our manifest.

It calls `cometbft testnet`, then gives every validator its own ports, its peers by node id, fast
blocks, vote extensions from height 1, an identical genesis carrying the app's `app_state`, and
a secp256k1 operator key (`node.keys.write_operator_key`).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from deploy.committee.cometbft import (
    DEFAULT_TIMEOUT_COMMIT,
    find_cometbft,
    node_id_from_key,
    set_toml_values,
    validator_config,
)
from deploy.committee.genesis import (
    DEFAULT_COMMITTEE_ADDRESS,
    DEFAULT_EPOCH_LENGTH,
    DEFAULT_EVM_CHAIN_ID,
    app_state,
    configure_genesis,
)
from deploy.committee.network import (
    APPS,
    DEFAULT_BASE_PORT,
    DEFAULT_CHAIN_ID,
    MANIFEST,
    Network,
    Validator,
    load_network,
)
from deploy.committee.processes import running_processes
from node.keys import operator_key_path, write_operator_key
from protocol.errors import ConfigError, UsageError


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
    # one (address, network namespace) per validator: each runs in its own host on the same
    # ports (base_port…base_port+3); None: all on 127.0.0.1, 10 ports apart
    hosts: tuple[tuple[str, str], ...] | None = None


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
    if options.hosts is not None and len(options.hosts) != options.validators:
        raise UsageError(f"{len(options.hosts)} hosts for {options.validators} validators")
    if options.app not in APPS:
        raise UsageError(f"--app must be one of {', '.join(APPS)} (got {options.app!r})")


def _validator(
    options: InitOptions, index: int, home: Path, operator: str, address: str
) -> Validator:
    """Validator `index`: on 127.0.0.1 at base+10i…, or in its host at base… (options.hosts)."""
    if options.hosts is None:
        base, host, netns = options.base_port + 10 * index, "127.0.0.1", None
    else:
        base, (host, netns) = options.base_port, options.hosts[index]
    return Validator(
        index=index,
        home=str(home),
        node_id=node_id_from_key(json.loads((home / "config" / "node_key.json").read_text())),
        p2p_port=base,
        rpc_port=base + 1,
        abci_port=base + 2,
        pprof_port=base + 3,
        operator_address=operator,
        validator_address=address,
        host=host,
        netns=netns,
    )


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
    operators = [write_operator_key(operator_key_path(h)) for h in homes]
    validators = tuple(
        _validator(options, i, home, operators[i], by_name[f"node{i}"])
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
