"""The compute nodes' operators: funded homes, then `planet stake` and `planet join` as typed.

The second model's seat homes (second_model.py: `seat<i>`) are funded and staked with the
others; node0 joins as a multi-model host (`--memory-budget-mb`), and the seats join into it
later (`second_model.start_seat_joins`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from deploy.anvil import ANVIL_DEV_ADDRESS, DEVNET_CHAIN_ID
from deploy.committee.network import Network
from deploy.devnet.hosts import NODE_PORT, Placement
from deploy.devnet.plan import (
    CHEAT_JOIN_MODULE,
    COMPUTE_STAKE_ETH,
    OPERATOR_FUNDS_WEI,
    OPERATOR_GAS_WEI,
    USER_FUNDS_WEI,
    DevnetOptions,
    Progress,
    write_state,
)
from deploy.devnet.processes import free_ports, planet_argv, run_parallel
from deploy.devnet.second_model import HOST_OPERATOR, host_join_args, seat_homes
from node.agent.launch import read_joined
from node.chain.evm.account import PlanetChain
from node.config import write_config_file
from node.keys import create_dev_wallet


def fund_operators(
    options: DevnetOptions,
    state: dict[str, Any],
    registrar: PlanetChain,
    network: Network,
    progress: Progress,
) -> list[Path]:
    """An operator home per compute node (config, dev wallet funded from anvil's dev account)
    and per seat of the second model, gas for the validators' operator keys (they relay payout
    roots), and a user wallet. Returns the compute nodes' homes (state["operators"] lists the
    seats' after them, state["seats"] the seats' alone)."""
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

    nodes = [options.dir / "operators" / f"node{index}" for index in range(options.all_nodes)]
    for index, home in enumerate([*nodes, *seat_homes(options)]):
        validator = network.validators[index % len(network.validators)]
        write_config_file(
            home / "config.toml",
            {
                "evm_rpc": state["evm_rpc"],
                "committee_rpc": validator.rpc_url,
                "chain_id": DEVNET_CHAIN_ID,
                "deployment": state["deployment"],
                "next_hop_range": state["next_hop_range"],
            },
        )
        wallet = create_dev_wallet(home / "wallet.json", password)
        hashes.append(send(wallet.address, OPERATOR_FUNDS_WEI, nonce))
        nonce += 1
        homes.append(home)
        accounts.append(
            {
                "name": home.name,
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
    state["seats"] = [str(h) for h in homes[len(nodes) :]]
    write_state(options.dir, state)
    progress(f"      funded {len(homes)} operator wallets (10 ETH) and a user wallet (100 ETH)")
    return nodes


def run_operator_commands(
    options: DevnetOptions,
    state: dict[str, Any],
    homes: list[Path],
    place: Placement,
    progress: Progress,
) -> None:
    """Each operator's `planet stake` then `planet join`, as typed, in the operator's host:
    `join` binds and registers the address it reaches the committee from (its host's)."""
    password_file = state["password_file"]
    seats = seat_homes(options)  # staked from node0's host, whose process serves them
    hosts = [f"node{i}" for i in range(len(homes))] + [f"node{HOST_OPERATOR}"] * len(seats)
    stake = [
        (
            home.name,
            place.argv(
                hosts[i],
                planet_argv(
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
            ),
            home / "stake.log",
        )
        for i, home in enumerate([*homes, *seats])
    ]
    run_parallel(stake, 120, progress, "planet stake")
    ports = [NODE_PORT] * len(homes) if place.on_hosts else free_ports(len(homes), 18100, 19000)
    join = [
        (
            f"node{i}",
            place.argv(
                f"node{i}",
                _join_argv(options, i)(
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
                    "--credit-positions",  # paid by the gateway's credits as answers run
                    str(options.node_price),
                    *host_join_args(options, i),  # node0: a multi-model host
                ),
            ),
            home / "join.log",
        )
        for i, home in enumerate(homes)
    ]
    run_parallel(join, options.join_timeout_s + 30, progress, "planet join")
    cheaters = [read_joined(home / "run") for home in homes[options.nodes :]]
    state["pids"]["cheat_nodes"] = [j.node_pid for j in cheaters if j is not None]
    write_state(options.dir, state)


def _join_argv(options: DevnetOptions, index: int) -> Any:
    """`planet join` for the honest nodes; for the extra ones the test entry point that joins
    a node with a cheat mode (`--cheat-node`: the product has no cheat flag)."""
    if index < options.nodes:
        return planet_argv
    mode = options.cheat_nodes[index - options.nodes]
    return lambda *args: [sys.executable, "-m", CHEAT_JOIN_MODULE, "--cheat", mode, *args]
