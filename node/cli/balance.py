"""`planet balance deposit|show|withdraw`: the prepaid balance in QueryEscrow that vouchers spend.

A balance belongs to one (payer, gateway) pair: only that gateway's charges spend it, so one
deposit can never be spent at two gateways. The gateway is the running devnet's by default;
`--gateway URL` reads its address from the gateway's `/v1/pools`, and `--gateway 0x…` names the
address directly (no request: a balance at a gateway that is down can still be withdrawn).

`--credits` names the balance that pays for bearer credits instead (`planet credits buy`): the
one at the escrow's own address, read from the deployment.

One deposit pays for many questions: `planet ask --voucher` signs a voucher per question
(no transaction, no gas); the committee debits the balance once per epoch. Withdrawing is two
steps: `withdraw` requests it (that gateway stops taking vouchers within 2 s), then, after the
escrow's refund timeout, `withdraw` again pays out what is left (`--cancel` keeps the balance).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

from node.cli.ask import _open_wallet, _pay_defaults
from protocol.errors import UnavailableError, UsageError
from protocol.eth import MAX_UINT128, WEI_PER_ETH
from protocol.eth import parse_eth as parse_eth_amount

MAX_BALANCE_WEI = MAX_UINT128
ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}\Z")
URL = re.compile(r"https?://[^\s]{1,2000}\Z")

EXAMPLES = """\
examples:
  planet balance deposit 0.05          put 0.05 ETH on your prepaid balance at the devnet's
                                       gateway (one transaction)
  planet balance show --json           balance, pending withdrawal, wallet, gateway
  planet ask --voucher "Hello"         spend it: a signed voucher per question, no gas
  planet balance withdraw              request the withdrawal (the gateway stops taking vouchers)
  planet balance withdraw              ... after the delay: receive what is left
  planet balance withdraw --cancel     keep the balance after all
  planet balance deposit 0.01 --gateway http://127.0.0.1:8000   a balance at another gateway
  planet balance withdraw --gateway 0xAbC…                      by address, the gateway may be down
  planet balance deposit 0.001 --credits   the balance `planet credits buy` mints from (the
                                       escrow's own address); `show --credits` shows it
a balance pays one gateway only; defaults (gateway, EVM RPC, deployment, wallet) come from
`planet devnet up`; flags win.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "balance",
        help="your prepaid balance for paying questions by voucher",
        description="Deposit to, show, or withdraw your prepaid balance in QueryEscrow.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("action", choices=("deposit", "show", "withdraw"), help="what to do")
    parser.add_argument("amount", nargs="?", default=None, help="ETH to deposit (deposit only)")
    parser.add_argument("--cancel", action="store_true", help="withdraw: cancel a pending request")
    parser.add_argument(
        "--gateway",
        default=None,
        help="the gateway the balance pays: its URL (address read from /v1/pools) or its "
        "address 0x… (default: the devnet's gateway)",
    )
    parser.add_argument(
        "--credits",
        action="store_true",
        help="the balance that pays for bearer credits (`planet credits buy`): the escrow's "
        "own address, from the deployment",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--wallet", type=Path, default=None, help="keystore (see planet ask)")
    parser.add_argument("--password-file", type=Path, default=None, help="wallet password file")
    parser.add_argument("--evm-rpc", default=None, help="EVM RPC URL (default: the devnet's)")
    parser.add_argument(
        "--deployment", type=Path, default=None, help="contract deployment JSON (default: devnet's)"
    )
    parser.set_defaults(handler=run)


def parse_eth(text: str | None) -> int:
    """Decimal ETH (at most 18 decimals) to wei; raises `UsageError`."""
    if text is None:
        raise UsageError("deposit needs an amount in ETH", hint="planet balance deposit 0.05")
    return parse_eth_amount(text, what="amount", max_wei=MAX_BALANCE_WEI, hint="e.g. 0.05")


def parse_gateway(text: str | None) -> tuple[str | None, str | None]:
    """`--gateway` as (address, None), (None, URL), or (None, None) when absent; raises
    `UsageError` for anything else."""
    if text is None:
        return None, None
    if not isinstance(text, str) or not text.isascii():
        raise UsageError(f"not a gateway URL or address: {text!r}", hint=_GATEWAY_HINT)
    if text.startswith("0x"):
        if not ADDRESS.match(text):
            raise UsageError(f"not a gateway address: {text!r}", hint=_GATEWAY_HINT)
        return to_checksum(text), None
    if not URL.match(text):
        raise UsageError(f"not a gateway URL or address: {text!r}", hint=_GATEWAY_HINT)
    return None, text.rstrip("/")


def to_checksum(address: str) -> str:
    from eth_utils import to_checksum_address  # lazy: eth-utils

    return to_checksum_address(address)


_GATEWAY_HINT = "--gateway http://HOST:PORT (the gateway's URL) or --gateway 0x… (its address)"


def run(args: argparse.Namespace) -> int:
    amount = parse_eth(args.amount) if args.action == "deposit" else None
    address, url = parse_gateway(args.gateway)
    if args.action != "deposit" and args.amount is not None:
        raise UsageError(
            f"`balance {args.action}` takes no amount", hint="planet balance deposit AMOUNT"
        )
    if args.credits and args.gateway is not None:
        raise UsageError(
            "--credits and --gateway name two different balances",
            hint="--credits: the one credit mints are paid from; --gateway: a gateway's",
        )
    if args.cancel and args.action != "withdraw":
        raise UsageError(
            "--cancel only goes with `balance withdraw`", hint="planet balance withdraw --cancel"
        )
    args.gateway = url
    settings = _pay_defaults(args)
    if not settings["deployment"].exists():
        raise UsageError(f"no deployment file at {settings['deployment']}")
    account = _open_wallet(args, settings)
    result = asyncio.run(_act(args, settings, bytes(account.key), amount, address))
    if args.json:
        print(json.dumps(result))
    else:
        print(_describe(result))
    return 0


async def _act(
    args: argparse.Namespace,
    settings: dict[str, Any],
    key: bytes,
    amount: int | None,
    address: str | None,
) -> dict[str, Any]:
    # lazy: the web3 stack
    from node.chain.evm.account import PlanetChain
    from node.chain.evm.deployment import Deployment
    from node.chain.evm.errors import InsufficientFunds

    deployment = Deployment.load(settings["deployment"])
    chain = await asyncio.to_thread(PlanetChain, deployment, key, rpc_url=settings["evm_rpc"])
    escrow = deployment.address("QueryEscrow")
    if args.credits:  # credit mints are paid from the escrow's own address
        address = to_checksum(escrow)
    url = None if address else settings["gateway"]
    gateway = address or await _gateway_of(url, chain.chain_id, escrow)
    state = await asyncio.to_thread(chain.escrow.prepaid_of, chain.address, gateway)
    done = "shown"
    tx_hash = None
    if amount is not None:  # deposit
        wallet = await asyncio.to_thread(chain.balance)
        if wallet < amount:
            raise InsufficientFunds(
                f"{chain.address} holds {wallet} wei, the deposit is {amount} wei",
                hint="fund the wallet or deposit less",
            )
        tx_hash = (await asyncio.to_thread(chain.escrow.deposit_balance, gateway, amount)).tx_hash
        done = "deposited"
    elif args.action == "withdraw":
        tx_hash, done = await _withdraw(args, chain, gateway, state)
    state = await asyncio.to_thread(chain.escrow.prepaid_of, chain.address, gateway)
    return {
        "action": done,
        "payer": chain.address,
        "gateway": gateway,
        "gateway_url": url,
        "pays": "credits" if args.credits else "questions",
        "balance_wei": str(state["balance"]),
        "withdrawable_at": state["withdrawable_at"],
        "deposited_wei": str(amount) if amount is not None else None,
        "tx": tx_hash,
    }


async def _gateway_of(url: str, chain_id: int, escrow: str) -> str:
    """The signing address of the gateway at `url` (its /v1/pools), checked to take payments
    on this deployment's chain and escrow."""
    # lazy: aiohttp
    import aiohttp

    from node.gateway import client as gw

    timeout = aiohttp.ClientTimeout(total=30, sock_connect=10)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        try:
            pool = await gw.fetch_pool(http, url)
        except UnavailableError as error:
            raise UnavailableError(
                error.message,
                hint="start the gateway, or name its address: --gateway 0x… (a balance at a "
                "gateway that is down can still be shown and withdrawn)",
            ) from None
    gw.check_chain(pool, chain_id, escrow)
    address = str(pool.get("gateway") or "")
    if not ADDRESS.match(address):
        raise UsageError(
            f"{url}/v1/pools names no gateway address",
            hint="check --gateway names a Planet gateway",
        )
    from eth_utils import to_checksum_address  # lazy: eth-utils

    return to_checksum_address(address)


async def _withdraw(
    args: argparse.Namespace, chain: Any, gateway: str, state: dict[str, int]
) -> tuple[str | None, str]:
    pending = state["withdrawable_at"]
    if args.cancel:
        if pending == 0:
            raise UsageError(
                f"no withdrawal is pending at gateway {gateway}", hint="nothing to cancel"
            )
        tx = await asyncio.to_thread(chain.escrow.cancel_withdrawal, gateway)
        return tx.tx_hash, "cancelled"
    if pending == 0:
        if state["balance"] == 0:
            raise UsageError(
                f"the prepaid balance at gateway {gateway} is empty",
                hint="nothing to withdraw here; a balance pays one gateway: pass --gateway for "
                "another one",
            )
        tx = await asyncio.to_thread(chain.escrow.request_withdrawal, gateway)
        return tx.tx_hash, "requested"
    now = await asyncio.to_thread(lambda: chain.w3.eth.get_block("latest")["timestamp"])
    if now < pending:
        raise UsageError(
            f"the withdrawal opens at {pending} (in {pending - now} s on the chain's clock)",
            hint="run `planet balance withdraw` again then, or `--cancel` to keep the balance",
        )
    return (await asyncio.to_thread(chain.escrow.withdraw_balance, gateway)).tx_hash, "withdrawn"


def _where(result: dict[str, Any]) -> str:
    if result.get("pays") == "credits":
        return f"the escrow {result['gateway']} (pays for credits: `planet credits buy N`)"
    return f"gateway {result['gateway']}"


def _describe(result: dict[str, Any]) -> str:
    balance = int(result["balance_wei"])
    line = (
        f"prepaid balance of {result['payer']} at {_where(result)}: {balance} wei "
        f"({balance / WEI_PER_ETH:.6f} ETH)"
    )
    if result["withdrawable_at"]:
        left = max(0, result["withdrawable_at"] - int(time.time()))
        line += f"; withdrawal pending, opens at {result['withdrawable_at']} (~{left} s)"
        if result["action"] == "deposited":
            line += "\nnote: the gateway takes no voucher while it is pending (--cancel to resume)"
    lead = {
        "deposited": f"deposited {result['deposited_wei']} wei (tx {result['tx']})\n",
        "requested": f"withdrawal requested (tx {result['tx']}); the gateway stops taking "
        "vouchers from this balance\n",
        "cancelled": f"withdrawal cancelled (tx {result['tx']})\n",
        "withdrawn": f"withdrawn (tx {result['tx']})\n",
    }.get(result["action"], "")
    return lead + line
