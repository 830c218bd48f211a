"""A relay's side of `planet earnings` (docs/overlay.md "Relays are paid").

A relay is paid for the credits it redeems (`relay_redeem`): each owes its epoch the credit's
price, and the epoch's close pays the relay's staking (EVM) address credits · price as a row
on the credit pool's payout page. Before the close, nothing of it is in `/credits` (a node's
layer-tokens) nor in any payout statement, so `planet earnings` reads the relay's own record:

    /node?key=<home's committee key>          is this home's key a relay's (role `relay`)
    /relay_credits?key=<key>                  credits it redeemed, per retained epoch
    /params                                   genesis `credits.price_wei`: what each pays

The home's committee key is read without the password (`<home>/node_key.json`'s public half).
A home without one, or whose key is a node's, has no relay part. Every answer is parsed into
typed values; one of another shape is refused by name (`relay_answer_invalid`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.errors import ProtocolError, RemoteError

RELAY_ROLE = "relay"
NOT_FOUND = "query_42"  # the committee's NOT_FOUND answer (abci_app/codes.py)
MAX_WEI = 1 << 256
MAX_EPOCH = (1 << 63) - 1
_ADDRESS = re.compile(r"0x[0-9a-f]{40}")

Query = Callable[..., Awaitable[Any]]


class RelayAnswerInvalid(ProtocolError):
    code = "relay_answer_invalid"


@dataclass(frozen=True)
class RelayEarnings:
    """What the committee holds of one relay: credits redeemed per epoch, and their price."""

    key: str  # the relay's committee key
    account: str  # its staking (EVM) address: the payee of its rows, lower case
    status: str  # its lifecycle: JOIN, SERVING, DOWN, LEFT ("unregistered" once deleted)
    price_wei: int  # what each credit pays at its epoch's close (genesis credits.price_wei)
    credits: dict[int, int]  # epoch → credits the relay redeemed in it (retained epochs)

    def due(self, epoch: int) -> int:
        """Wei the close of `epoch` owes the relay for what it redeemed in it."""
        return self.credits.get(epoch, 0) * self.price_wei

    def closed(self, current: int) -> list[int]:
        """The epochs before `current` in which the relay redeemed credits, ascending."""
        return sorted(e for e, n in self.credits.items() if e < current and n > 0)

    def to_json(self, current: int, rows: dict[int, int]) -> dict[str, Any]:
        """The relay's part of `planet earnings --json`: `rows` is wei in this account's
        payout rows per committee epoch (what each close paid it)."""
        return {
            "key": self.key,
            "account": self.account,
            "status": self.status,
            "price_wei": str(self.price_wei),
            "current_epoch": {
                "epoch": current,
                "credits": self.credits.get(current, 0),
                "due": str(self.due(current)),
            },
            "epochs": [
                {
                    "epoch": epoch,
                    "credits": self.credits[epoch],
                    "due": str(self.due(epoch)),
                    "paid": str(rows.get(epoch, 0)),
                }
                for epoch in self.closed(current)
            ],
        }


def read_relay(committee_rpc: str, node_key_path: Path) -> RelayEarnings | None:
    """The relay part of the home whose committee key is at `node_key_path`, or None when the
    home has no key, or its key is not a relay's."""
    from node.chain.committee_link import CommitteeLink  # lazy: aiohttp
    from node.keys import node_public_key

    if not node_key_path.exists():
        return None
    key = node_public_key(node_key_path)

    async def run() -> RelayEarnings | None:
        link = CommitteeLink([committee_rpc])
        try:
            return await relay_earnings(link.query, key)
        finally:
            await link.close()

    return asyncio.run(run())


async def relay_earnings(query: Query, key: str) -> RelayEarnings | None:
    """The committee's record of relay `key` (None: `key` is a node's, or was never a relay)."""
    try:
        view = await query("/node", key=key)
    except RemoteError as error:
        if error.code != NOT_FOUND:
            raise
        view = None
    if view is not None:
        if not isinstance(view, dict) or not isinstance(view.get("role"), str):
            raise RelayAnswerInvalid(f"/node?key={key[:16]}…: expected a node with a role")
        if view["role"] != RELAY_ROLE:
            return None
    credits, account = parse_relay_credits(await query("/relay_credits", key=key), key)
    if view is None and not credits:
        return None  # never registered, or deleted before it redeemed anything
    price = parse_price(await query("/params"))
    status = str(view["status"]) if view is not None else "unregistered"
    if account is None and view is not None:
        account = _address(view.get("evm_address"), "/node evm_address")
    return RelayEarnings(key, account or "", status, price, credits)


def parse_relay_credits(answer: Any, key: str) -> tuple[dict[int, int], str | None]:
    """`/relay_credits?key=`: (credits per epoch, the relay's EVM address or None)."""
    where = "/relay_credits"
    if not isinstance(answer, dict) or answer.get("key") != key:
        raise RelayAnswerInvalid(f"{where}: expected the record of relay {key[:16]}…")
    rows = answer.get("epochs")
    if not isinstance(rows, list):
        raise RelayAnswerInvalid(f"{where}: `epochs` is not a list")
    credits: dict[int, int] = {}
    for row in rows:
        if not isinstance(row, dict):
            raise RelayAnswerInvalid(f"{where}: an epoch entry is not an object")
        epoch = _int(row.get("epoch"), f"{where} epoch", 1, MAX_EPOCH)
        if epoch in credits:
            raise RelayAnswerInvalid(f"{where}: epoch {epoch} listed twice")
        credits[epoch] = _int(row.get("credits"), f"{where} credits", 0, MAX_WEI)
    address = answer.get("evm_address")
    return credits, None if address is None else _address(address, f"{where} evm_address")


def parse_price(answer: Any) -> int:
    """Genesis `credits.price_wei` from `/params` (0 when the chain sells no credits)."""
    genesis = answer.get("genesis") if isinstance(answer, dict) else None
    if not isinstance(genesis, dict):
        raise RelayAnswerInvalid("/params: expected an object with a `genesis` object")
    credits = genesis.get("credits")
    if credits is None:
        return 0
    if not isinstance(credits, dict) or not isinstance(credits.get("price_wei"), str):
        raise RelayAnswerInvalid("/params: genesis `credits` has no `price_wei` string")
    return _int(credits["price_wei"], "/params credits.price_wei", 0, MAX_WEI)


def _int(value: Any, what: str, lo: int, hi: int) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 78:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value < hi:
        raise RelayAnswerInvalid(f"{what}: {ascii(value)[:40]} is not an integer in [{lo}, {hi})")
    return value


def _address(value: Any, what: str) -> str:
    text = value.lower() if isinstance(value, str) else ""
    if not _ADDRESS.fullmatch(text):
        raise RelayAnswerInvalid(f"{what}: {ascii(value)[:60]} is not an EVM address")
    return text
