"""`planet devnet fund ADDRESS [ETH]`: anvil's funded dev account sends ETH to an address.

Only a devnet's chain: the RPC (the running devnet's anvil, or --evm-rpc) must call itself
anvil (`web3_clientVersion`) and be chain 31337, else `NotADevnetChain` names what it is. The
transfer is anvil's own `eth_sendTransaction` from its unlocked dev account (the deployer, a
public key: dev only). The funded address joins devnet.json's accounts, so `planet devnet
status` lists it. With `--hosts` the RPC is reached from inside the devnet's `user` host.
"""

from __future__ import annotations

import re
import time
import urllib.error
from pathlib import Path
from typing import Any

from deploy.anvil import ANVIL_DEV_ADDRESS, DEVNET_CHAIN_ID, rpc_call
from deploy.devnet.hosts import Placement, inside, require_lab
from deploy.devnet.plan import devnet_dir, read_state, state_lock, write_state
from protocol.errors import PlanetError, UnavailableError, UsageError
from protocol.eth import NONCE_TAKEN, parse_eth
from protocol.eth import WEI_PER_ETH as ETHER  # not deploy.evm: web3 + eth-account, ~1.4 CPU-s

DEFAULT_FUND_ETH = "10"
MAX_FUND_WEI = 1000 * ETHER  # anvil's dev account holds 10000 ETH
RECEIPT_TIMEOUT_S = 30.0
SEND_TRIES = 5
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}\Z")


class NotADevnetChain(UsageError):
    """The RPC is not a devnet's anvil: funding from a dev key is refused there."""

    code = "not_a_devnet_chain"

    def __init__(self, rpc: str, client: str, chain_id: int | None) -> None:
        super().__init__(
            f"{rpc} is not a devnet chain ({client or 'unknown client'}, chain "
            f"{chain_id if chain_id is not None else '?'}): `planet devnet fund` only sends "
            f"from anvil's dev account on chain {DEVNET_CHAIN_ID}",
            hint="on another chain, send ETH from a funded wallet of your own",
        )
        self.rpc = rpc


def parse_fund_amount(text: str) -> int:
    """'10' / '0.5' ETH → wei (> 0, at most 18 decimals, at most 1000 ETH)."""
    return parse_eth(
        text,
        what="the amount",
        max_wei=MAX_FUND_WEI,
        most="a dev faucet gives (1000 ETH at most)",
        hint="e.g. 10 or 0.5",
    )


def parse_address(text: str) -> str:
    if not _ADDRESS.match(text.strip()):
        raise UsageError(
            f"{text!r} is not an EVM address",
            hint="0x and 40 hex digits; `planet status` shows your wallet's address",
        )
    return text.strip()


def fund(home: Path, address: str, wei: int, evm_rpc: str | None = None) -> dict[str, Any]:
    """Send `wei` from anvil's dev account to `address`; {address, wei, balance_wei, tx}."""
    directory = devnet_dir(home)
    state = read_state(directory)
    if state is None or state.get("status") != "up":
        raise UsageError(
            f"no devnet is up in {directory}",
            hint="start one: planet devnet up --detach (or pass --home)",
        )
    require_lab(state)
    rpc = evm_rpc or state["evm_rpc"]
    with inside(Placement.from_state(state).control_netns):
        try:
            _check_devnet_chain(rpc)
            with state_lock(directory):  # one send at a time: see _send
                tx = _send(rpc, address, wei)
            _await_receipt(rpc, tx)
            balance = int(str(rpc_call(rpc, "eth_getBalance", [address, "latest"])), 16)
        except (urllib.error.URLError, OSError, ValueError) as error:
            raise UnavailableError(
                f"EVM RPC {rpc} did not answer ({error})",
                hint="`planet devnet status` shows whether anvil runs",
            ) from None
    _list_account(directory, address)
    return {"address": address, "wei": str(wei), "balance_wei": str(balance), "tx": tx}


def _list_account(directory: Path, address: str) -> None:
    """Add `address` to devnet.json's accounts, the state read again under its lock: `fund`
    commands run side by side each keep their address (the state read before the transfer
    would lose another's, written meanwhile)."""
    with state_lock(directory):
        state = read_state(directory)
        if state is None:  # the devnet went down meanwhile
            return
        accounts = state.setdefault("accounts", [])
        if any(str(a.get("address", "")).lower() == address.lower() for a in accounts):
            return
        accounts.append({"name": "funded", "address": address, "keystore": None, "home": None})
        write_state(directory, state)


def _send(rpc: str, address: str, wei: int) -> str:
    """The transfer's hash. anvil numbers an unlocked account's transactions itself, and two
    sends that reach it at once can be given the same nonce: one is refused ("nonce too low",
    "replacement transaction underpriced"; measured: 14 of 80 transfers, 8 at a time). The
    `fund` commands of one devnet send one at a time (under its state lock); a refusal left by
    another sender of the account (a script with the dev key) never entered the pool, so it is
    sent again, up to `SEND_TRIES` times."""
    transfer = [{"from": ANVIL_DEV_ADDRESS, "to": address, "value": hex(wei)}]
    attempt = 1
    while True:
        try:
            return str(rpc_call(rpc, "eth_sendTransaction", transfer, timeout=10))
        except UnavailableError as error:
            taken = any(text in str(error).lower() for text in NONCE_TAKEN)
            if not taken or attempt == SEND_TRIES:
                raise
        time.sleep(0.05 * attempt)
        attempt += 1


def _check_devnet_chain(rpc: str) -> None:
    client, chain_id = "", None
    try:
        client = str(rpc_call(rpc, "web3_clientVersion", timeout=5))
        chain_id = int(str(rpc_call(rpc, "eth_chainId", timeout=5)), 16)
    except PlanetError:  # the method is unknown there: not anvil
        pass
    if not client.lower().startswith("anvil") or chain_id != DEVNET_CHAIN_ID:
        raise NotADevnetChain(rpc, client, chain_id)


def _await_receipt(rpc: str, tx: str) -> None:
    deadline = time.monotonic() + RECEIPT_TIMEOUT_S
    while time.monotonic() < deadline:
        receipt = rpc_call(rpc, "eth_getTransactionReceipt", [tx])
        if isinstance(receipt, dict):
            if receipt.get("status") != "0x1":
                raise UnavailableError(f"the transfer {tx} failed on chain")
            return
        time.sleep(0.05)
    raise UnavailableError(f"the transfer {tx} was not mined in {RECEIPT_TIMEOUT_S:.0f} s")
