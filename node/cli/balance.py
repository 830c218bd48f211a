"""`planet balance deposit|show|withdraw`: the prepaid balance in QueryEscrow that vouchers spend.

One deposit pays for many questions: `planet ask --voucher` signs a voucher per question
(no transaction, no gas); the committee debits the balance once per epoch. Withdrawing is two
steps: `withdraw` requests it (gateways stop taking vouchers at once), then, after the escrow's
refund timeout, `withdraw` again pays out what is left (`--cancel` keeps the balance).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from decimal import Decimal, InvalidOperation, localcontext
from pathlib import Path
from typing import Any

from node.cli.ask import _open_wallet, _pay_defaults
from protocol.errors import UsageError

WEI_PER_ETH = 10**18
MAX_BALANCE_WEI = (1 << 128) - 1

EXAMPLES = """\
examples:
  planet balance deposit 0.05          put 0.05 ETH on your prepaid balance (one transaction)
  planet balance show --json           balance, pending withdrawal, wallet
  planet ask --voucher "Hello"         spend it: a signed voucher per question, no gas
  planet balance withdraw              request the withdrawal (gateways stop taking vouchers)
  planet balance withdraw              ... after the delay: receive what is left
  planet balance withdraw --cancel     keep the balance after all
defaults (gateway, EVM RPC, deployment, wallet) come from `planet devnet up`; flags win.
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
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--wallet", type=Path, default=None, help="keystore (see planet ask)")
    parser.add_argument("--password-file", type=Path, default=None, help="wallet password file")
    parser.add_argument("--evm-rpc", default=None, help="EVM RPC URL (default: the devnet's)")
    parser.add_argument(
        "--deployment", type=Path, default=None, help="contract deployment JSON (default: devnet's)"
    )
    parser.set_defaults(handler=run, gateway=None)


def parse_eth(text: str | None) -> int:
    """Decimal ETH (at most 18 decimals) to wei; raises `UsageError`."""
    if text is None:
        raise UsageError("deposit needs an amount in ETH", hint="planet balance deposit 0.05")
    if not isinstance(text, str) or len(text) > 40 or not text.isascii():
        raise UsageError(f"not an amount of ETH: {text!r}", hint="e.g. 0.05")
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise UsageError(f"not an amount of ETH: {text!r}", hint="e.g. 0.05") from None
    if not value.is_finite():
        raise UsageError(f"not an amount of ETH: {text!r}", hint="e.g. 0.05")
    with localcontext() as exact:
        exact.prec = 80  # 40 input characters + 18 decimals: no rounding
        wei = value * WEI_PER_ETH
    if wei != wei.to_integral_value():
        raise UsageError(f"{text} ETH is not a whole number of wei", hint="at most 18 decimals")
    if not 0 < wei <= MAX_BALANCE_WEI:
        raise UsageError(f"{text} ETH is out of range", hint="a positive amount")
    return int(wei)


def run(args: argparse.Namespace) -> int:
    amount = parse_eth(args.amount) if args.action == "deposit" else None
    if args.action != "deposit" and args.amount is not None:
        raise UsageError(
            f"`balance {args.action}` takes no amount", hint="planet balance deposit AMOUNT"
        )
    if args.cancel and args.action != "withdraw":
        raise UsageError(
            "--cancel only goes with `balance withdraw`", hint="planet balance withdraw --cancel"
        )
    settings = _pay_defaults(args)
    if not settings["deployment"].exists():
        raise UsageError(f"no deployment file at {settings['deployment']}")
    account = _open_wallet(args, settings)
    result = asyncio.run(_act(args, settings, bytes(account.key), amount))
    if args.json:
        print(json.dumps(result))
    else:
        print(_describe(result))
    return 0


async def _act(
    args: argparse.Namespace, settings: dict[str, Any], key: bytes, amount: int | None
) -> dict[str, Any]:
    # lazy: the web3 stack
    from node.chain.evm.account import PlanetChain
    from node.chain.evm.deployment import Deployment
    from node.chain.evm.errors import InsufficientFunds

    chain = await asyncio.to_thread(
        PlanetChain, Deployment.load(settings["deployment"]), key, rpc_url=settings["evm_rpc"]
    )
    state = await asyncio.to_thread(chain.escrow.prepaid_of)
    done = "shown"
    tx_hash = None
    if amount is not None:  # deposit
        wallet = await asyncio.to_thread(chain.balance)
        if wallet < amount:
            raise InsufficientFunds(
                f"{chain.address} holds {wallet} wei, the deposit is {amount} wei",
                hint="fund the wallet or deposit less",
            )
        tx_hash = (await asyncio.to_thread(chain.escrow.deposit_balance, amount)).tx_hash
        done = "deposited"
    elif args.action == "withdraw":
        tx_hash, done = await _withdraw(args, chain, state)
    state = await asyncio.to_thread(chain.escrow.prepaid_of)
    return {
        "action": done,
        "payer": chain.address,
        "balance_wei": str(state["balance"]),
        "withdrawable_at": state["withdrawable_at"],
        "deposited_wei": str(amount) if amount is not None else None,
        "tx": tx_hash,
    }


async def _withdraw(
    args: argparse.Namespace, chain: Any, state: dict[str, int]
) -> tuple[str | None, str]:
    pending = state["withdrawable_at"]
    if args.cancel:
        if pending == 0:
            raise UsageError("no withdrawal is pending", hint="nothing to cancel")
        return (await asyncio.to_thread(chain.escrow.cancel_withdrawal)).tx_hash, "cancelled"
    if pending == 0:
        if state["balance"] == 0:
            raise UsageError("the prepaid balance is empty", hint="nothing to withdraw")
        return (await asyncio.to_thread(chain.escrow.request_withdrawal)).tx_hash, "requested"
    now = await asyncio.to_thread(lambda: chain.w3.eth.get_block("latest")["timestamp"])
    if now < pending:
        raise UsageError(
            f"the withdrawal opens at {pending} (in {pending - now} s on the chain's clock)",
            hint="run `planet balance withdraw` again then, or `--cancel` to keep the balance",
        )
    return (await asyncio.to_thread(chain.escrow.withdraw_balance)).tx_hash, "withdrawn"


def _describe(result: dict[str, Any]) -> str:
    balance = int(result["balance_wei"])
    line = f"prepaid balance of {result['payer']}: {balance} wei ({balance / WEI_PER_ETH:.6f} ETH)"
    if result["withdrawable_at"]:
        left = max(0, result["withdrawable_at"] - int(time.time()))
        line += f"; withdrawal pending, opens at {result['withdrawable_at']} (~{left} s)"
    lead = {
        "deposited": f"deposited {result['deposited_wei']} wei (tx {result['tx']})\n",
        "requested": f"withdrawal requested (tx {result['tx']}); gateways stop taking vouchers\n",
        "cancelled": f"withdrawal cancelled (tx {result['tx']})\n",
        "withdrawn": f"withdrawn (tx {result['tx']})\n",
    }.get(result["action"], "")
    return lead + line
