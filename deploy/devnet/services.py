"""The services `up` starts after the committee: the gateway and the verifiers.

Both are the `planet` commands an operator would run (`planet gateway serve`, `planet verifier
serve`), started detached with the devnet's dev wallets; the gateway starts before the nodes
join, so it loads its part of the model meanwhile, and is awaited after the joins. The nodes
charge credits: before the gateway starts, its wallet deposits a balance at the escrow's own
address (what `planet balance deposit X --credits` does), which its top-up buys credits from;
`up` is done once the gateway holds its first credits.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from deploy.anvil import rpc_call
from deploy.committee.network import Network
from deploy.committee.processes import pid_alive
from deploy.devnet.hosts import FINDINGS_PORT, GATEWAY_PORT, LOOPBACK_RANGE, Placement
from deploy.devnet.plan import (
    GATEWAY_CREDIT_DEPOSIT_WEI,
    GATEWAY_CREDITS_WAIT_S,
    GATEWAY_FUNDS_WEI,
    GATEWAY_READY_CREDITS,
    GATEWAY_TOP_UP,
    GATEWAY_TOP_UP_BELOW,
    DevnetOptions,
    Progress,
    write_state,
)
from deploy.devnet.processes import (
    StepFailed,
    free_port,
    free_ports,
    planet_argv,
    spawn,
    wait_http,
)
from deploy.evm import ETHER
from node.chain.evm.account import PlanetChain
from node.chain.evm.deployment import Deployment
from node.client.credit_wallet import CreditWallet
from node.keys import create_dev_wallet, load_or_create_node_key, load_wallet, wallet_address


def gateway_identity(options: DevnetOptions, state: dict[str, Any]) -> tuple[str, str]:
    """The gateway's committee key (signs its work reports, 64 hex) and its EVM address (no
    genesis lists gateways: the key binds itself); `planet gateway serve` finds the committee
    key next to its wallet
    (`node.gateway.run.committee_key_path`) and binds it to the wallet's address on chain at its
    first start (node/gateway/binding.py)."""
    password = Path(state["password_file"]).read_text()
    home = options.dir / "gateway"
    home.mkdir(parents=True, exist_ok=True)
    key = load_or_create_node_key(home / "committee_key.json", password)
    wallet = home / "wallet.json"
    if not wallet.exists():
        create_dev_wallet(wallet, password)  # a devnet key
    return key.verify_key.encode().hex(), wallet_address(wallet)


def start_gateway(
    options: DevnetOptions, state: dict[str, Any], place: Placement, progress: Progress
) -> None:
    if not options.gateway:
        progress("      gateway: skipped (--no-gateway)")
        return
    port = GATEWAY_PORT if place.on_hosts else free_port(8000, 8999)
    host = place.address("gateway")
    log_path = options.dir / "logs" / "gateway.log"
    gateway_identity(options, state)  # the committee key it reports with, and the wallet
    credits = options.dir / "gateway" / "credits.json"
    state["gateway_credits"] = str(credits)
    if options.node_price:  # the nodes charge: the gateway buys credits to pay them
        fund_gateway_credits(options, state, progress)
        buy = ["--top-up-below", str(GATEWAY_TOP_UP_BELOW), "--top-up", str(GATEWAY_TOP_UP)]
        buy += [arg for url in state["committee_rpc"] for arg in ("--validator-rpc", url)]
    else:  # free nodes: nothing to buy
        buy = ["--top-up", "0"]
    cooldown = options.gateway_node_cooldown_s  # a failed node's time out of the routes
    sit_out = [] if cooldown is None else ["--node-cooldown-s", f"{cooldown:g}"]
    # every model the devnet registers: a question names its model (node/gateway/models.py)
    more = [arg for path in state.get("more_manifests", []) for arg in ("--manifest", path)]
    argv = place.argv("gateway", planet_argv(
        "gateway", "serve",
        "--evm-rpc", state["evm_rpc"],
        "--deployment", state["deployment"],
        "--committee-rpc", state["committee_rpc"][0],
        "--manifest", state["manifest"],
        *more,
        "--wallet", str(options.dir / "gateway" / "wallet.json"),
        "--password-file", state["password_file"],
        "--host", host,
        "--port", str(port),
        "--report-min-questions", "1",  # a dev chain: settle each question quickly
        "--private-endpoints",  # the devnet's nodes register loopback or 10.77.0.x endpoints
        "--credits-file", str(credits),  # pays the nodes that charge
        *buy,  # its top-up, from every validator: each blind-signs its share of a mint
        *sit_out,
    ))  # fmt: skip
    pid = spawn(argv, log_path)
    state["pids"]["gateway"] = pid
    state["gateway_pending"] = {"url": f"http://{host}:{port}", "log": str(log_path)}
    write_state(options.dir, state)
    progress(f"      gateway: loading in the background (pid {pid}, log {log_path})")


def fund_gateway_credits(options: DevnetOptions, state: dict[str, Any], progress: Progress) -> None:
    """The gateway wallet gets ETH from anvil and deposits GATEWAY_CREDIT_DEPOSIT_WEI at the
    escrow's own address: the balance its credit mints are paid from (its top-up buys them)."""
    password = Path(state["password_file"]).read_text()
    account = load_wallet(options.dir / "gateway" / "wallet.json", password)
    rpc_call(state["evm_rpc"], "anvil_setBalance", [account.address, hex(GATEWAY_FUNDS_WEI)])
    deployment = Deployment.load(Path(state["deployment"]))
    chain = PlanetChain(deployment, bytes(account.key), rpc_url=state["evm_rpc"])
    escrow = deployment.address("QueryEscrow")
    tx = chain.escrow.deposit_balance(escrow, GATEWAY_CREDIT_DEPOSIT_WEI)
    progress(
        f"      gateway: {account.address} deposited {GATEWAY_CREDIT_DEPOSIT_WEI / ETHER:g} ETH "
        f"at the escrow for its credits (tx {tx.tx_hash[:18]}…)"
    )


def start_verifiers(
    options: DevnetOptions,
    state: dict[str, Any],
    network: Network,
    place: Placement,
    progress: Progress,
) -> None:
    """`planet verifier serve` on the first `options.verifier_count` validators' homes (every
    validator by default), each with its own funded dev wallet (it pays for its challenges like
    a user), serving its failed spot checks to the others (`--findings-listen`, the devnet's
    private range allowed: `--private-peers`); logs logs/verifier<i>.log."""
    if not state.get("gateway_url"):
        progress("      verifiers: skipped (they ask through the gateway, which is not running)")
        return
    password = Path(state["password_file"]).read_text()
    pids = state["pids"].setdefault("verifiers", [])
    chosen = network.validators[: options.verifier_count]
    ports = [FINDINGS_PORT] * len(chosen) if place.on_hosts else free_ports(len(chosen), 8700, 8900)
    asks = options.verifier_challenges  # None: the verifier's default
    challenges = [] if asks is None else ["--challenges-per-epoch", str(asks)]
    if asks == 0:  # no prompts to sample from either: spot checks and findings only
        challenges += ["--sampled-per-epoch", "0"]
    for validator, port in zip(chosen, ports, strict=True):
        wallet = options.dir / f"verifier{validator.index}" / "wallet.json"
        wallet.parent.mkdir(parents=True, exist_ok=True)
        account = create_dev_wallet(wallet, password)
        rpc_call(state["evm_rpc"], "anvil_setBalance", [account.address, hex(100 * ETHER)])
        argv = planet_argv(
            "verifier", "serve",
            "--home", validator.home,
            "--manifest", state["manifest"],
            "--gateway", state["gateway_url"],
            "--deployment", state["deployment"],
            "--evm-rpc", state["evm_rpc"],
            "--committee-rpc", validator.rpc_url,
            "--wallet", str(wallet),
            "--password-file", state["password_file"],
            # one machine runs every verifier: the public corpus, not text each verifier's
            # model writes per epoch (~10 s of CPU each); a real verifier keeps the default
            "--challenge-source", "corpus",
            # one node timed alone per epoch, one probe of 4 sessions × 8 positions (a real
            # verifier: 2 nodes, up to 16 sessions)
            "--hop-probes-per-epoch", "1", "--hop-sessions", "4",
            "--findings-listen", f"{place.address(validator.name)}:{port}",
            "--private-peers", state.get("next_hop_range", LOOPBACK_RANGE),
            *challenges,
        )  # fmt: skip
        log_path = options.dir / "logs" / f"verifier{validator.index}.log"
        pids.append(spawn(place.argv(validator.name, argv), log_path))
        progress(f"      verifier of validator{validator.index}: pid {pids[-1]}, log {log_path}")


def await_gateway(state: dict[str, Any]) -> None:
    """Wait until the gateway started by `start_gateway` answers /health."""
    pending = state.pop("gateway_pending", None)
    if pending is None:
        return
    url = pending["url"]
    wait_http(f"{url}/health", state["pids"]["gateway"], "gateway", Path(pending["log"]), 240)
    state["gateway_url"] = url


def await_gateway_credits(
    options: DevnetOptions, state: dict[str, Any], progress: Progress
) -> None:
    """When the nodes charge, wait until the gateway holds its first GATEWAY_READY_CREDITS
    credits (its top-up buys on meanwhile). Minting needs the credit keys the validators'
    stake watchers publish: call it once they run."""
    if not options.node_price or not state.get("gateway_url"):
        return
    log_path, pid = options.dir / "logs" / "gateway.log", state["pids"]["gateway"]
    wallet = CreditWallet(Path(state["gateway_credits"]))
    deadline = time.monotonic() + GATEWAY_CREDITS_WAIT_S
    while wallet.count() < GATEWAY_READY_CREDITS:
        if not pid_alive(pid):
            step = "buying the gateway's credits"
            raise StepFailed(step, f"gateway (pid {pid}) exited", log_path)
        if time.monotonic() > deadline:
            raise StepFailed(
                "buying the gateway's credits",
                f"the gateway holds {wallet.count()} credits after "
                f"{GATEWAY_CREDITS_WAIT_S:.0f} s (its top-up: `credit top-up` lines)",
                log_path,
            )
        time.sleep(0.5)
    progress(
        f"      gateway: {wallet.count()} credits to pay the nodes with (it buys "
        f"{GATEWAY_TOP_UP} whenever it holds fewer than {GATEWAY_TOP_UP_BELOW})"
    )
