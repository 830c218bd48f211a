"""`planet credits buy|finish|show`: bearer credits the committee blind-signs (docs/credits.md).

`buy N` mints N credits paid from your balance at the escrow's own address (deposit it with
`planet balance deposit AMOUNT --credits`), waits (`--wait`, 60 s) until
the validators have checked that the balance covers it (nothing is charged otherwise), gathers
every validator's blind signatures, unblinds them here and stores the credits in your credit
file (default
`$PLANET_HOME/credits.json`, mode 0600). The committee sees your address and how many credits you
bought, never which credits: the blinding factors stay in this process and that file. A
purchase is written to the file before its mint is sent: if this command is stopped (or the
validators take longer than `--wait`), `finish` — and every later `buy` — completes it, so a
paid purchase is never lost. `show` counts credits and purchases in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from node.cli.key import parse_duration
from node.client.credit_sizes import MAX_BUY
from node.client.nodesfile import planet_home
from protocol.errors import UsageError

DEFAULT_TTL_S = 3600
DEFAULT_WAIT_S = 60
DEFAULT_MIN_ANONYMITY = 1  # node/client/credit_purchase.py DEFAULT_MIN_ANONYMITY
MAX_MIN_ANONYMITY = 1_000_000

EXAMPLES = """\
examples:
  planet balance deposit 0.001 --credits
                                        prepay credits: your balance at the escrow's own
                                        address (`planet balance show --credits` shows it)
  planet credits buy 20                 mint 20 credits from that balance, once the
                                        validators saw it covers them (--wait, 60 s)
  planet credits finish                 complete purchases an earlier run left in flight
  planet credits show --json            credits held and purchases in flight
defaults (committee RPCs, wallet) come from `planet devnet up`; flags win.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "credits",
        help="bearer credits for paying nodes without being linked to your questions",
        description="Buy credits from the committee (blind-signed), finish purchases an earlier "
        "run left in flight, or count the credits you hold.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("action", choices=("buy", "finish", "show"), help="what to do")
    parser.add_argument("count", nargs="?", default=None, help=f"credits to buy (1 … {MAX_BUY})")
    parser.add_argument(
        "--committee-rpc",
        action="append",
        default=None,
        help="a validator's CometBFT RPC URL; give one per validator (default: the devnet's)",
    )
    parser.add_argument("--credits-file", type=Path, default=None, help="where credits are kept")
    parser.add_argument("--wallet", type=Path, default=None, help="keystore that pays")
    parser.add_argument("--password-file", type=Path, default=None, help="wallet password file")
    parser.add_argument(
        "--ttl", default=str(DEFAULT_TTL_S), help="purchase lifetime: 3600, 90m, 2h, 7d (1 h)"
    )
    parser.add_argument(
        "--wait",
        default=str(DEFAULT_WAIT_S),
        help=f"how long the validators may take to check your balance: 60, 5m ({DEFAULT_WAIT_S} s)",
    )
    parser.add_argument(
        "--min-anonymity",
        default=str(DEFAULT_MIN_ANONYMITY),
        help="refuse to buy under a key period with fewer buyers than this, you included: a "
        "credit names its period, so it points at one of that period's buyers "
        f"(default {DEFAULT_MIN_ANONYMITY}: refuses nothing; docs/privacy.md)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def parse_count(text: str | None) -> int:
    """The number of credits to buy: ASCII digits, 1 … MAX_BUY; raises `UsageError`."""
    if text is None:
        raise UsageError("buy needs a number of credits", hint="planet credits buy 10")
    if not (isinstance(text, str) and text.isascii() and text.isdigit() and len(text) <= 3):
        raise UsageError(f"not a number of credits: {text!r}", hint=f"1 … {MAX_BUY}")
    count = int(text)
    if not 1 <= count <= MAX_BUY:
        raise UsageError(f"{count} credits is out of range", hint=f"buy 1 … {MAX_BUY} at a time")
    return count


def _devnet() -> dict[str, Any]:
    path = planet_home() / "devnet" / "devnet.json"
    if not path.exists():
        return {}
    try:
        doc = json.loads(path.read_text())
    except ValueError:
        raise UsageError(f"{path} is not JSON", hint="run `planet devnet up` again") from None
    return doc if isinstance(doc, dict) else {}


def run(args: argparse.Namespace) -> int:
    # lazy: the BLS and committee codecs, a noticeable part of every `planet` start
    from node.client.credit_wallet import CreditWallet

    wallet_file = args.credits_file or planet_home() / "credits.json"
    wallet = CreditWallet(wallet_file)
    if args.action in ("show", "finish") and args.count is not None:
        raise UsageError(
            f"`credits {args.action}` takes no count", hint=f"planet credits {args.action}"
        )
    if args.action == "show":
        held, pending = wallet.count(), len(wallet.pending())
        _note_retired(wallet)
        if args.json:
            print(json.dumps({"credits": held, "pending": pending, "file": str(wallet_file)}))
        else:
            print(held if not pending else f"{held} ({pending} purchase(s) in flight: finish)")
        return 0
    count = parse_count(args.count) if args.action == "buy" else 0
    ttl, wait = _seconds("--ttl", args.ttl), _seconds("--wait", args.wait)
    if not 60 <= ttl <= 7 * 86_400:
        raise UsageError(f"--ttl {args.ttl} is out of range", hint="60 s … 7 days")
    if not 1 <= wait <= 3600:
        raise UsageError(f"--wait {args.wait} is out of range", hint="1 s … 1 hour")
    min_anonymity = _min_anonymity(args.min_anonymity)
    devnet = _devnet()
    rpcs = args.committee_rpc or [str(u) for u in devnet.get("committee_rpc") or []]
    if not rpcs:
        raise UsageError(
            "no committee RPC to buy from",
            hint="pass --committee-rpc URL once per validator, or start `planet devnet up`",
        )
    from node.client.credit_purchase import buy_credits, finish_pending  # lazy: aiohttp

    def progress(line: str) -> None:
        print(line, file=sys.stderr)

    if args.action == "finish":
        _note_retired(wallet)
        finished = asyncio.run(finish_pending(rpcs, wallet, fund_timeout_s=wait, progress=progress))
        credits = len(finished)
    else:
        key = _payer_key(args, devnet)
        credits = len(
            asyncio.run(
                buy_credits(
                    rpcs,
                    key,
                    count,
                    wallet,
                    expiry=int(time.time()) + ttl,
                    fund_timeout_s=wait,
                    progress=progress,
                    min_anonymity=min_anonymity,
                )
            )
        )
    held, pending = wallet.count(), len(wallet.pending())
    if args.json:
        doc = {"credits": held, "pending": pending, "file": str(wallet_file)}
        print(json.dumps({"bought" if args.action == "buy" else "finished": credits, **doc}))
    else:
        verb = "bought" if args.action == "buy" else "finished"
        left = f"; {pending} purchase(s) still in flight" if pending else ""
        print(f"{verb} {credits} credits; {held} held in {wallet_file}{left}")
    return 0


def _note_retired(wallet: Any) -> None:
    """One line on stderr about the RSA credits of before a credit file holds (never spent)."""
    from node.client.credit_wallet import retired_note

    retired = wallet.retired()
    if retired:
        print(f"note: {retired_note(retired)}", file=sys.stderr)


def _min_anonymity(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_MIN_ANONYMITY:
        raise UsageError(
            f"--min-anonymity {text!a} is not a count of buyers",
            hint=f"1 … {MAX_MIN_ANONYMITY}, e.g. --min-anonymity 20",
        )
    return int(text)


def _seconds(flag: str, text: str) -> int:
    """A duration flag (`parse_duration`), its error naming the flag."""
    try:
        return parse_duration(text)
    except UsageError as error:
        raise UsageError(f"{flag}: {error.message}", hint=error.hint) from None


def _payer_key(args: argparse.Namespace, devnet: dict[str, Any]) -> bytes:
    from node.keys import PasswordSource, load_wallet  # lazy: eth-account

    wallet, password_file = args.wallet, args.password_file
    if wallet is None:
        wallet = planet_home() / "wallet.json"
        users = [
            a
            for a in devnet.get("accounts") or []
            if isinstance(a, dict) and a.get("name") == "user"
        ]
        if not wallet.exists() and users and users[0].get("keystore"):
            wallet = Path(users[0]["keystore"])
            if password_file is None and "PLANET_PASSWORD" not in os.environ:
                password_file = devnet.get("password_file")
    if not Path(wallet).exists():
        raise UsageError(f"no wallet at {wallet}", hint="pass --wallet FILE (a funded keystore)")
    password = PasswordSource(file=Path(password_file) if password_file else None).read()
    return bytes(load_wallet(Path(wallet), password).key)
