"""Paying the nodes of a circuit with bearer credits as the answer runs (issue 28).

    payer = CreditPayer(CreditWallet(path), {hop.url: info["credit_positions"], ...})
    CircuitClient(hops, ..., payer=payer)

`prices` is each node's price in positions per credit: the gateway's router fills it with the
price the node registered on the committee chain (node/gateway/router.py; docs/committee.md,
*Prices*), `planet ask` over a nodes file with the chain's too, or with each node's /info where
the user capped it (an explicit `--min-credit-positions`, node/client/replicas.py). A node not
in `prices` has no price anybody can check (none on the chain: the chain redeems nothing there,
abci_app/prices.py), and this client pays it nothing: the question stops `price_unregistered`
before a credit goes.

A node that charges (`credit_positions` > 0 in its /info; node/server/payments.py) computes a
session's positions only while credits paid for that session cover them. Before the client
sends a frame it pays every charging hop, on the client's own link to that hop, enough credits
to cover every position sent so far plus the frame's: one `pay` per credit, `positions` each
(protocol/stream.py). So the client is at most one credit per hop ahead of the work, and a node
never works unpaid. A free hop (0) is never paid.

Credits are taken out of the wallet file before they are sent (a credit shown to a node is the
node's: a client that died after sending must not show it to another node, whose redemption
would then fail). A session that fails after a hop opened it keeps what that hop was paid: a
failover's replay is paid again on the new session (a hop keeps at most the credits paid ahead
of its work: one chunk, or the first frame's positions). A credit a hop did not keep (the
session was not open there, or its open failed after the `pay`) comes back refused
`credit_not_taken`, naming it: it goes back into the wallet (`give_back`). Such a refusal may
come after the session closed (a node that could not check the credit in time, the client's
session already failed): the credits sent to the last `CLOSED_KEPT` closed sessions' hops are
kept for it, so a credit the node never took is never lost to the wallet. A credit a hop
refuses `credit_not_assigned` (its holder's assignment names another node, model or shard: the
client's listing of that node was stale or wrong) was not taken either: the node checks the
assignment before it takes a credit, and the chain would not let it lock one assigned to
another party. It goes back to the wallet as unspent (`not_assigned`) while the session fails
over like any other refusal; the next node it pays gets its own assignment. On either refusal
the client takes the node at its word, as it must for `credit_not_taken`: a node that lied and
locked the credit anyway makes its next use fail as locked or spent, and costs the user that
one credit, as keeping it would.

A payer is shared by every circuit of a gateway (node/gateway/circuits.py): its tallies are
keyed by (sid, hop), so the session ids come from the payer (`new_sid`), never from a counter
of each circuit, and two circuits' sessions never share a tally, a give-back or a close.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Container, Mapping
from dataclasses import dataclass, field
from typing import Any

from node.client.credit_sizes import MIN_POSITIONS as MIN_POSITIONS  # re-exported
from node.client.credit_wallet import CreditWallet
from node.client.types import payee as payee  # re-exported
from protocol.credits import (
    CLIENT_MARGIN_BLOCKS,
    NODE_MARGIN_BLOCKS,
    clock_from_query,
    lifetime_from_query,
    oldest_takeable_epoch,
)
from protocol.errors import PlanetError, ProtocolError, RemoteError
from protocol.paid_credits import HeldCredit, PaidCredit, spent_id
from protocol.stream import MAX_SID

log = logging.getLogger(__name__)


class OutOfCreditsError(ProtocolError):
    """The credit wallet has no credit left to pay the circuit's nodes with."""

    code = "out_of_credits"
    http_status = 402

    def __init__(self, needed: int, held: int) -> None:
        super().__init__(
            f"the nodes ask for {needed} more credits and the credit wallet holds {held}",
            hint="buy credits with `planet credits buy N` (see `planet credits show`)",
        )


class PriceTooHighError(ProtocolError):
    """A node asks more than this client pays: fewer positions per credit than its floor."""

    code = "price_too_high"
    http_status = 402

    def __init__(self, url: str, price: int, floor: int) -> None:
        super().__init__(
            f"node {url} asks a credit per {price} positions; this client pays at most one per "
            f"{floor}",
            hint="ask other nodes, or lower --min-credit-positions if you accept the price",
        )


class PriceUnregisteredError(ProtocolError):
    """A hop of the circuit has no price this client can check (not in its `prices`: none on
    the committee chain, or `planet ask --nodes` with no chain and no explicit
    `--min-credit-positions`): paying
    it would pay what nobody agreed, and the chain would not redeem it."""

    code = "price_unregistered"
    http_status = 402

    def __init__(self, url: str) -> None:
        super().__init__(
            f"node {url} has no price on the committee chain; this client pays only a price "
            "it can check",
            hint="ask nodes that registered a price (`planet join` registers one); `planet ask "
            "--nodes FILE`: give it the committee (`--committee-rpc URL`), or accept the nodes' "
            "own /info price up to a credit per N positions (`--min-credit-positions N`)",
        )


class UnpaidError(RemoteError):
    """A node refused a session `payment_required` that this client sent it unpaid, knowing
    the node charges (its price as the client learned it) and paying no node (`planet ask`
    without `--credits`). It is the client's own doing, not the node's: every node this client
    would be routed to instead charges too (a client that pays nobody is routed to a charging
    node only when no free one serves the shard) and refuses the same. So it is final for the
    question, like `OutOfCreditsError`: no replay, the node neither blamed nor avoided.

    A `payment_required` from a node the client *did* pay (or believed free) is not this: that
    node did not count what it was paid (a price above the one it announced, a credit it could
    not check, a `pay` that came late), which another replica would not share, so it stays an
    ordinary node failure (a `RemoteError`) and the question fails over."""

    def __init__(self, url: str, shard: int, message: str) -> None:
        peer = f"node {url} (shard {shard})"
        super().__init__(peer, "payment_required", message, http_status=402)
        self.hint = (
            "the node computes only positions paid with credits: ask with `--credits` "
            "(buy some with `planet credits buy N`; see `planet credits show`)"
        )


def accepts_price(min_positions: int) -> Callable[[int], bool]:
    """The nodes a payer with floor `min_positions` takes into a circuit, by their price
    (positions per credit): free ones, and charging ones no dearer than the floor (a dearer one
    would stop the question with `PriceTooHighError`). A router's `accept_price`."""
    return lambda price: price == 0 or price >= min_positions


# what stops a question for good: the wallet's or the user's limit, or nodes that charge a
# client that pays none; another circuit would pay (or be paid) no better, so no failover
FINAL_PAYMENT_ERRORS = (OutOfCreditsError, PriceTooHighError, PriceUnregisteredError, UnpaidError)


def split(credits: list[PaidCredit], owed: list[int]) -> list[list[PaidCredit]]:
    """`credits` cut into consecutive runs of `owed[i]` each (one run per hop)."""
    out, at = [], 0
    for count in owed:
        out.append(credits[at : at + count])
        at += count
    return out


CLOSED_KEPT = 256  # closed (sid, hop)s whose sent credits a late `credit_not_taken` still finds


@dataclass
class CreditPayer:
    """The wallet credits come from, and each charging node's price (positions per credit)."""

    wallet: CreditWallet
    # node URL → positions one credit pays for (0: free); absent: no price, never paid
    prices: Mapping[str, int]
    spent: int = 0  # credits sent to nodes by this payer
    min_positions: int = MIN_POSITIONS  # the dearest price paid: a credit per this many
    # node URL → the party its credits are assigned to (`credit_holder.node_party`: its
    # committee key, model hash, shard), filled where the node's key is checked (the router's
    # committee listing, replicas.py's /info); absent: its credits go unassigned
    parties: dict[str, bytes] = field(default_factory=dict)
    _paid: dict[tuple[int, int], int] = field(default_factory=dict)  # (sid, hop) → positions
    # (sid, hop) → the credits sent there and the positions each paid for
    _sent: dict[tuple[int, int], list[tuple[PaidCredit, int]]] = field(default_factory=dict)
    # the same for closed sessions' hops that opened them, newest last (CLOSED_KEPT of them)
    _closed: OrderedDict[tuple[int, int], list[tuple[PaidCredit, int]]] = field(
        default_factory=OrderedDict
    )
    _next_sid: int = 1  # the next session id this payer hands out (1 … MAX_SID, then 1 again)

    def new_sid(self) -> int:
        """A session id no other circuit paid by this payer uses now: circuits that share a
        payer draw their sids here, so their (sid, hop) tallies stay apart."""
        sid = self._next_sid
        self._next_sid = sid % MAX_SID + 1
        return sid

    def pending(self, sid: int) -> bool:
        """Whether credits sent for `sid` wait here for their hop to open it or refuse them."""
        return any(key[0] == sid and sent for key, sent in self._sent.items())

    def price(self, url: str) -> int:
        """`url`'s price (PriceUnregisteredError when it has none this client can check)."""
        price = self.prices.get(url)
        if price is None:
            raise PriceUnregisteredError(url)
        return max(0, int(price))

    def due(self, sid: int, urls: list[str], used: int) -> list[int]:
        """Per hop, how many credits to send so that `used` positions of `sid` are paid."""
        return self.due_each(sid, urls, [used] * len(urls))

    def due_each(self, sid: int, urls: list[str], targets: list[int]) -> list[int]:
        """Per hop, how many credits to send so that `targets[i]` positions of `sid` are paid
        at hop i (the ring pays each hop a chunk of its own price ahead: node/client/ring.py)."""
        owed = []
        for index, (url, target) in enumerate(zip(urls, targets, strict=True)):
            price = self.price(url)
            if 0 < price < self.min_positions:
                raise PriceTooHighError(url, price, self.min_positions)
            paid = self._paid.get((sid, index), 0)
            owed.append(0 if price == 0 or paid >= target else -(-(target - paid) // price))
        return owed

    def take(self, owed: list[int]) -> list[list[PaidCredit]]:
        """Take the credits `owed` per hop out of the wallet at once (OutOfCreditsError, and
        nothing taken, when it holds fewer)."""
        needed = sum(owed)
        if not needed:
            return [[] for _ in owed]
        try:
            credits = self.wallet.take(needed)
        except ProtocolError:
            raise OutOfCreditsError(needed, self.wallet.count()) from None
        self.spent += needed
        return split(credits, owed)

    def to_hop(self, url: str, credit: PaidCredit) -> PaidCredit:
        """`credit` as `url`'s node is paid with it: assigned to that node where the credit is
        holder-bound and the node's party is known, so that no other node can lock or redeem
        it (protocol/committee/credit_holder.py); else as it is."""
        party = self.parties.get(url)
        if party is not None and isinstance(credit, HeldCredit):
            return credit.assign(party)
        return credit

    def paid(self, sid: int, index: int, url: str, credit: PaidCredit) -> None:
        key, price = (sid, index), self.price(url)
        self._paid[key] = self._paid.get(key, 0) + price
        self._sent.setdefault(key, []).append((credit, price))

    def give_back(self, sid: int, index: int, identifier: str) -> bool:
        """Hop `index` did not keep the credit of spent id `identifier` it was sent for `sid`:
        back into the wallet (False when no such credit was sent there)."""
        key = (sid, index)
        for sent, live in ((self._sent.get(key, []), True), (self._closed.get(key, []), False)):
            for item in sent:
                credit, price = item
                if spent_id(credit) == identifier:
                    sent.remove(item)
                    if not sent and key not in self._paid:  # a closed session's, all settled
                        (self._sent if live else self._closed).pop(key, None)
                    # the session still runs: pay it again (a closed one's tally is gone)
                    if live and key in self._paid:
                        self._paid[key] -= price
                    self.wallet.add([credit])
                    self.spent -= 1
                    return True
        return False

    def not_assigned(self, sid: int, index: int, identifier: str) -> bool:
        """Hop `index` refused the credit of spent id `identifier` it was sent for `sid`
        `credit_not_assigned`: its holder's assignment was not for that node (a listing of
        the node that was stale or wrong), checked before the node takes a credit, and one the
        chain would refuse that node's lock of. A holder-bound credit (`HeldCredit`: its seed
        is here) goes back into the wallet as unspent, to be assigned afresh to the next node
        it pays; True then. A bare credit of before stays gone (False): a chain that binds
        holders refuses it at every node, so it would only be refused again."""
        for sent in (self._sent.get((sid, index), []), self._closed.get((sid, index), [])):
            for credit, _ in sent:
                if spent_id(credit) == identifier:
                    return isinstance(credit, HeldCredit) and self.give_back(sid, index, identifier)
        return False

    def forget(self, sid: int, opened: set[int]) -> None:
        """`sid` is closed: the hops in `opened` answered `opened` and keep what they were
        paid; what the others were sent stays here until they refuse it (`give_back`)."""
        for key in [k for k in self._paid if k[0] == sid]:
            del self._paid[key]
        for key in [k for k in self._sent if k[0] == sid]:
            if key[1] in opened or not self._sent[key]:
                sent = self._sent.pop(key)
                if sent:  # kept for a refusal that comes after the close
                    self._closed.setdefault(key, []).extend(sent)
                    self._closed.move_to_end(key)
        while len(self._closed) > CLOSED_KEPT:
            self._closed.popitem(last=False)

    def unsettled(
        self, opened: Callable[[int, int], bool], sids: Container[int] | None = None
    ) -> int:
        """Credits sent to hops that neither opened their session (`opened(sid, hop)`) nor
        refused them yet, of the sessions `sids` only when given (one circuit's: another
        circuit sharing this payer is not waited for)."""
        return sum(
            len(sent)
            for (sid, hop), sent in self._sent.items()
            if (sids is None or sid in sids) and not opened(sid, hop)
        )


EXPIRY_CHECK_S = 30.0  # how often a long-running client looks for credits past their window


@dataclass
class CreditExpiry:
    """Keeps credits the chain no longer redeems, or soon will not, out of the wallet (a node
    refuses them by name, which would cost the client a failed pay): the committee's current
    epoch, height, epoch length and the credits' lifetime (`/credit_keys`), read at most every
    `every_s`; a credit whose window ends within `margin` blocks goes."""

    wallet: CreditWallet
    query: Callable[[str], Awaitable[Any]]  # a committee ABCI query: path → answer
    every_s: float = EXPIRY_CHECK_S
    # blocks before a credit's window ends from which it counts as gone: the nodes refuse it
    # from NODE_MARGIN_BLOCKS on (`credit_expiring`), and this check runs every `every_s`
    margin: int = CLIENT_MARGIN_BLOCKS
    dropped: int = 0
    _checked_at: float = float("-inf")

    async def check(self) -> int:
        """Drop the expired credits, if due; returns how many went (logged)."""
        if time.monotonic() - self._checked_at < self.every_s:
            return 0
        answer = await self.query("/credit_keys")
        current, lifetime = int(answer["epoch"]), lifetime_from_query(answer)
        oldest = current - lifetime
        clock = None
        if "committed_height" in answer:  # the chain's time: what the nodes check against
            clock = clock_from_query(answer)
            oldest = max(oldest, oldest_takeable_epoch(clock, self.margin))
        self._checked_at = time.monotonic()
        gone = self.wallet.drop_expired(oldest, clock if clock and clock.period_blocks else None)
        if gone:
            self.dropped += gone
            log.warning(
                "dropped %d credits minted before epoch %d: the chain no longer redeems them, "
                "or not for long enough that a node takes them (credits are good for %d epochs "
                "after their mint's; a node takes one only %d+ blocks before its window ends)",
                gone,
                oldest,
                lifetime,
                NODE_MARGIN_BLOCKS,
            )
        return gone

    async def check_quietly(self) -> None:
        """`check`, where a committee that does not answer only delays it: the nodes refuse
        an expired credit by name anyway."""
        try:
            await self.check()
        except (PlanetError, KeyError, TypeError, ValueError) as error:
            log.warning("could not check the credits' expiry: %s", error)
