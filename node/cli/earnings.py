"""`planet earnings` and `planet claim`: what an operator's served work earned, and taking it.

Each closed epoch the committee pays the credits redeemed in it (a node's at the credit's
price less the verifiers' cut, which the verifiers share by their spot checks: docs/shares.md),
its validators sign the payout root and relay it to the QueryEscrow. Then,
after the escrow's challenge window, every account with a row claims its amount itself:

    planet earnings [--epoch N] [--json]   shares, pending, claimable and claimed per epoch
    planet claim [--epoch N]               claim one epoch, or every claimable one

The account is the operator wallet's address (`<home>/wallet.json`, read without the password
for `earnings`). Amounts and proofs come from the committee (`/payouts`, `/payouts/proof`), the
epoch's state from the escrow (`epochOf`, `claimed`) and the time from the EVM chain's latest
block. Chains and files: the same flags, environment and config.toml as `planet stake`.

A relay's home (its `node_key.json` is a registered relay's committee key) also gets the
relay's part (node/cli/relay_earnings.py): the credits it redeemed so far this epoch and the
wei they are due at the close, and per closed epoch its credits beside the row its close paid
(`relay` in --json). Its rows are claimed like any other.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from node.chain.committee_pages import STATEMENT_PAGES, Query, read_statements
from node.cli.operator import _chain, _check_chain, _common, _config, _password, format_eth
from protocol.committee.settlement import statement_page
from protocol.errors import RemoteError, UsageError

if TYPE_CHECKING:
    from node.cli.relay_earnings import RelayEarnings

log = logging.getLogger(__name__)

ESCROW_STATUS = {0: "not posted", 1: "posted", 2: "disputed"}

EXAMPLES = {
    "earnings": """\
examples:
  planet earnings                       every stored epoch with a row for this wallet
  planet earnings --epoch 12 --json     one epoch, as JSON
""",
    "claim": """\
examples:
  planet claim                          claim every epoch whose challenge window has passed
  planet claim --epoch 12               one epoch
""",
}


class NothingToClaim(UsageError):
    code = "nothing_to_claim"


class ChallengeWindowOpen(UsageError):
    code = "challenge_window_open"


class AlreadyClaimed(UsageError):
    code = "already_claimed"


class RootNotPosted(UsageError):
    code = "root_not_posted"


@dataclass(frozen=True)
class EpochEarning:
    epoch: int
    shares: int  # compute shares credited to the account
    amount: int  # wei in the payout root (0: no row)
    payable: int  # wei the escrow pays for it: `amount`, scaled down when the epoch was short
    confirmed: bool  # ≥ 2/3 of the committee signed the statement
    escrow_status: int  # 0 not posted, 1 posted, 2 disputed
    claimable_at: int  # unix time (0 when not posted)
    claimed: bool

    def state(self, now: int) -> str:
        if self.claimed:
            return "claimed"
        if self.escrow_status == 2:
            return "disputed"
        if self.escrow_status == 0:
            return "signing" if not self.confirmed else "posting"
        return "claimable" if now >= self.claimable_at else "challenge window"

    def to_json(self, now: int) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "shares": str(self.shares),
            "amount": str(self.amount),
            "payable": str(self.payable),
            "state": self.state(now),
            "claimable_at": self.claimable_at,
            "claimed": self.claimed,
        }


def register(subparsers: argparse._SubParsersAction) -> None:
    for name, help_text, handler in (
        ("earnings", "shares, pending, claimable and claimed amounts per epoch", _earnings),
        ("claim", "claim your payout of settled epochs from the escrow", _claim),
    ):
        parser = subparsers.add_parser(
            name,
            help=help_text,
            description=help_text[0].upper() + help_text[1:] + ".",
            epilog=EXAMPLES[name],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.set_defaults(handler=handler)
        parser.add_argument("--epoch", type=_epoch, help="one epoch (default: all stored)")
        if name == "earnings":
            parser.add_argument("--json", action="store_true", help="print one JSON object")
        _common(parser)


def _epoch(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) < 1 << 63:
        raise argparse.ArgumentTypeError(f"{text!r} is not an epoch number (1, 2, …)")
    return int(text)


# -- reading both chains ---------------------------------------------------------------------------


def _account(config: Any) -> str:
    from node.keys import wallet_address  # lazy: eth-account

    if not config.wallet_path.exists():
        raise UsageError(
            f"no wallet at {config.wallet_path}",
            hint="pass the operator home with --home (where `planet stake` created wallet.json)",
        )
    return wallet_address(config.wallet_path)


async def _committee(config: Any, path: str, **params: Any) -> Any:
    from node.chain.committee_link import CommitteeLink  # lazy: aiohttp

    link = CommitteeLink([config.committee_rpc])
    try:
        return await link.query(path, **params)
    finally:
        await link.close()


async def statements_of(query: Query, account: str) -> list[dict[str, Any]]:
    """Every stored statement's summary with `amount` for `account`: all pages of `/payouts`
    (newest first), at most `STATEMENT_PAGES`; past them the older epochs are not listed, and
    a warning says so (`planet claim --epoch N` still claims one of them)."""
    listed, whole = await read_statements(query, max_pages=STATEMENT_PAGES, account=account)
    if not whole:
        log.warning(
            "over %d payout statements stored (%d pages read): only the newest are listed; "
            "claim an older epoch with `planet claim --epoch N`",
            len(listed),
            STATEMENT_PAGES,
        )
    return [statement.summary for statement in listed]


async def _account_statements(config: Any, account: str) -> list[dict[str, Any]]:
    from node.chain.committee_link import CommitteeLink  # lazy: aiohttp

    link = CommitteeLink([config.committee_rpc])
    try:
        return await statements_of(link.query, account)
    finally:
        await link.close()


def _not_found(error: RemoteError) -> bool:
    return error.code == "query_42"


class EscrowView:
    """Read-only QueryEscrow calls (no key needed)."""

    def __init__(self, config: Any) -> None:
        from node.chain.evm.deployment import Deployment  # lazy: eth-utils

        self.w3 = _check_chain(config)
        deployment = Deployment.load(config.deployment_path)
        escrow = deployment.contracts.get("QueryEscrow")
        if escrow is None:
            raise UsageError(f"{config.deployment_path} has no QueryEscrow")
        self.contract = self.w3.eth.contract(address=escrow.address, abi=escrow.abi)

    def now(self) -> int:
        return int(self.w3.eth.get_block("latest")["timestamp"])

    def payable(self, epoch: int, amount: int) -> int:
        """What a claim of `amount` pays: amount × collected ÷ total when the epoch was short."""
        total, collected = self.contract.functions.shortfallOf(epoch).call()
        if int(total) == 0:
            return amount
        return amount * int(collected) // int(total)

    def epoch_of(self, epoch: int) -> tuple[int, int]:
        """(status, claimable_at)."""
        _root, _unclaimed, claimable_at, status = self.contract.functions.epochOf(epoch).call()
        return int(status), int(claimable_at)

    def claimed(self, epoch: int, account: str) -> bool:
        return bool(self.contract.functions.claimed(epoch, account).call())


def earnings_of(config: Any, account: str, epoch: int | None) -> tuple[list[EpochEarning], Any]:
    """Per-epoch earnings of `account` (epochs where it has a row), and the current credits."""
    escrow = EscrowView(config)
    if epoch is not None:
        try:
            view = asyncio.run(_committee(config, "/payouts", epoch=epoch, account=account))
        except RemoteError as error:
            if not _not_found(error):
                raise
            raise UsageError(
                f"epoch {epoch} has no payout statement on the committee",
                hint="it closed without fees or work, was pruned, or has not closed yet",
            ) from None
        summaries = [{**view, "shares": view["shares"].get(account.lower(), "0")}]
    else:
        summaries = asyncio.run(_account_statements(config, account))
    credits = asyncio.run(_committee(config, "/credits", account=account))
    out = []
    for summary in sorted(summaries, key=lambda s: int(s["epoch"])):
        amount = int(summary.get("amount", "0"))
        if amount == 0 and epoch is None:
            continue
        number = int(summary["epoch"])
        status, claimable_at = escrow.epoch_of(number)
        out.append(
            EpochEarning(
                epoch=number,
                shares=int(summary.get("shares", "0")),
                amount=amount,
                payable=escrow.payable(number, amount) if status == 1 else amount,
                confirmed=bool(summary["confirmed"]),
                escrow_status=status,
                claimable_at=claimable_at,
                claimed=bool(amount) and escrow.claimed(number, account),
            )
        )
    return out, (credits, escrow.now())


def _earnings(args: argparse.Namespace) -> int:
    from node.cli.relay_earnings import read_relay

    config = _config(args)
    account = _account(config)
    rows, (credits, now) = earnings_of(config, account, args.epoch)
    relay = read_relay(config.committee_rpc, config.node_key_path)
    totals = {"pending": 0, "claimable": 0, "claimed": 0}
    for row in rows:
        state = row.state(now)
        key = state if state in ("claimable", "claimed") else "pending"
        if state != "disputed":
            totals[key] += row.payable
    current = sum(int(c["layer_tokens"]) for c in credits["credits"])
    epoch_now = int(credits["epoch"])
    paid = paid_per_epoch(rows)
    if relay is not None and args.epoch is not None:
        only = statement_page(args.epoch)[0]
        relay = replace(relay, credits={e: n for e, n in relay.credits.items() if e == only})
    if args.json:
        doc = {
            "account": account,
            "now": now,
            "epochs": [row.to_json(now) for row in rows],
            **{k: str(v) for k, v in totals.items()},
            "current_epoch": {"epoch": credits["epoch"], "layer_tokens": current},
        }
        if relay is not None:
            doc["relay"] = relay.to_json(epoch_now, paid)
        print(json.dumps(doc, sort_keys=True))
        return 0
    print(f"account     {account}")
    if relay is None or current:
        print(f"this epoch  {credits['epoch']}: {current} layer-tokens credited so far")
    if relay is not None:
        _print_relay(relay, account, epoch_now)
    if not rows:
        print("no settled epoch pays this account yet")
    for row in rows:
        state = row.state(now)
        if state == "challenge window":
            state += f" (claimable in {max(0, row.claimable_at - now)} s)"
        if row.payable != row.amount:
            state += f" (short epoch: pays {format_eth(row.payable)} of the signed amount)"
        # a verifier's row is its shares' part of the cut; a node's and a relay's pay their
        # redeemed credits at the credit's price (a node's less the verifiers' cut)
        work = f"shares {row.shares:<12}" if row.shares else f"{'redeemed credits':<19}"
        redeemed = relay.credits.get(statement_page(row.epoch)[0], 0) if relay else 0
        if redeemed and not row.shares:
            work = f"credits {redeemed:<11}"  # a relay's: credits it redeemed in the epoch
        print(f"epoch {row.epoch:<5} {format_eth(row.amount):>24}  {work} {state}")
    if relay is not None:
        for epoch in relay.closed(epoch_now):
            if not paid.get(epoch):
                print(
                    f"epoch {epoch:<5} {relay.credits[epoch]} credits redeemed: no row at its "
                    "close (moved to the next epoch's, or slashed)"
                )
    for name, value in totals.items():
        print(f"{name:<11} {format_eth(value)}")
    return 0


def paid_per_epoch(rows: list[EpochEarning]) -> dict[int, int]:
    """Wei in the account's payout rows per committee epoch (its pages summed)."""
    paid: dict[int, int] = {}
    for row in rows:
        epoch = statement_page(row.epoch)[0]
        paid[epoch] = paid.get(epoch, 0) + row.amount
    return paid


def _print_relay(relay: RelayEarnings, account: str, epoch: int) -> None:
    payee = "" if relay.account == account.lower() else f" to {relay.account}"
    print(
        f"relay       {relay.key[:16]}… ({relay.status}): {format_eth(relay.price_wei)} a "
        f"credit it redeems, paid{payee} at the epoch's close"
    )
    redeemed = relay.credits.get(epoch, 0)
    print(
        f"this epoch  {epoch}: {redeemed} credits redeemed by the relay so far: "
        f"{format_eth(relay.due(epoch))} due at the close"
    )


def _earn_how(config: Any) -> str:
    """How this home earns: a relay's home by the credits it redeems, any other by serving."""
    from node.cli.relay_earnings import read_relay

    if read_relay(config.committee_rpc, config.node_key_path) is not None:
        return "keep `planet relay serve` running: the credits it redeems are paid at the close"
    return "serve questions"


def _claim(args: argparse.Namespace) -> int:
    config = _config(args)
    account = _account(config)
    rows, (_credits, now) = earnings_of(config, account, args.epoch)
    if args.epoch is not None:
        [row] = rows
        _check_claimable(row, now)
        due = [row]
    else:
        due = [row for row in rows if row.state(now) == "claimable"]
        if not due:
            waiting = [row for row in rows if row.state(now) not in ("claimed", "disputed")]
            if waiting:
                hint = f"epoch {waiting[0].epoch} is {waiting[0].state(now)}: see `planet earnings`"
            else:
                hint = f"{_earn_how(config)}; `planet earnings` shows what each epoch paid"
            raise NothingToClaim("nothing to claim for " + account, hint=hint)
    chain = _chain(config, _password(config))
    for row in due:
        proof = asyncio.run(_committee(config, "/payouts/proof", epoch=row.epoch, account=account))
        amount = int(proof["amount"])
        steps = [bytes.fromhex(str(p)[2:]) for p in proof["proof"]]
        result = chain.escrow.claim(row.epoch, amount, steps)
        paid = row.payable if amount == row.amount else amount
        print(f"claimed {format_eth(paid)} for epoch {row.epoch} (tx {result.tx_hash})")
    return 0


def _check_claimable(row: EpochEarning, now: int) -> None:
    state = row.state(now)
    if row.amount == 0:
        raise NothingToClaim(f"epoch {row.epoch} pays nothing to this account")
    if state == "claimed":
        raise AlreadyClaimed(f"epoch {row.epoch} is already claimed by this account")
    if state == "disputed":
        raise RootNotPosted(
            f"epoch {row.epoch}'s root was disputed: its fees went back to the payers"
        )
    if state in ("signing", "posting"):
        raise RootNotPosted(
            f"epoch {row.epoch}'s payout root is not on the escrow yet ({state})",
            hint="validators sign and relay it within a few blocks; try again shortly",
        )
    if state == "challenge window":
        wait = row.claimable_at - now
        when = time.strftime("%H:%M:%S", time.localtime(time.time() + wait))
        raise ChallengeWindowOpen(
            f"epoch {row.epoch} is in its challenge window for {wait} s more (until ≈ {when})",
            hint="claims open when the window has passed: run `planet claim` again then",
        )
