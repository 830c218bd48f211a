"""Which node keys a rendezvous relay fronts (docs/overlay.md, *NAT rendezvous*, *Admission*).

A port on the relay is a scarce thing: one per node, a few dozen per relay. Without a rule, one
party with throwaway keys takes them all and honest nodes behind NAT get none. So the relay asks
the committee chain what a key is before it gives it a port:

    MEMBER    registered as a compute or verifier node, not LEFT, with an agreed stake of at
              least its role's minimum (genesis `min_stake`: the test `/node`'s `routable`
              applies too) — a real node: it gets a port kept for it (across restarts)
    PENDING   registered, not LEFT, not (yet) staked enough
    STRANGER  not registered, LEFT, another role (a relay, a gateway), or the committee did
              not answer

A NAT node needs its port BEFORE it registers: `planet join` claims it first, then registers
that address as its endpoint. So PENDING and STRANGER keys are not refused outright: each gets a
*lease* (node/relay/fronting.py) — a port for `lease_s`, at most `provisional_per_address` of
them per source address and `max_provisional` in all (a quarter of the ports) — and the lease
ends unless, when it runs out, the committee shows the key staked (the port is then kept for
it) or registered and waiting for its stake (the lease is renewed; the chain itself deletes an
unstaked registration after `registration_ttl` blocks). A key with no lease to be had is
refused `not_registered`.

`committee_standing(link)` reads the committee through a `CommitteeLink`-like reader;
`admit_any` is the relay that fronts any key (`--rendezvous-admit any`: a lab without a
committee).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from enum import Enum
from typing import Any, Final, Protocol

from protocol.errors import PlanetError

log = logging.getLogger(__name__)

ROLES: Final = ("compute", "verifier")  # the roles a relay fronts (nodes, not relays)
LOOKUP_TIMEOUT_S: Final = 5.0
LOOKUPS_AT_ONCE: Final = 4


class Standing(Enum):
    MEMBER = "member"
    PENDING = "pending"
    STRANGER = "stranger"


LookUp = Callable[[str], Awaitable[Standing]]


class CommitteeReader(Protocol):
    """What the relay reads of the committee (node/chain/committee_link.py `CommitteeLink`)."""

    async def node(self, key: str) -> dict[str, Any] | None: ...

    async def params(self) -> dict[str, Any]: ...


async def admit_any(_key: str) -> Standing:
    return Standing.MEMBER


def standing_of(view: Any, min_stake: dict[str, int]) -> Standing:
    """A `/node` view (or None: not registered) as a Standing, given genesis `min_stake`."""
    if not isinstance(view, dict) or view.get("role") not in ROLES:
        return Standing.STRANGER
    if view.get("status") not in ("JOIN", "SERVING", "DOWN"):
        return Standing.STRANGER  # LEFT, or nothing the app writes
    amount, minimum = _amount(view.get("stake")), min_stake.get(view["role"])
    staked = amount is not None and minimum is not None and amount >= minimum
    return Standing.MEMBER if staked else Standing.PENDING


def _amount(value: Any) -> int | None:
    """A wei amount as the app writes it (ASCII decimal digits, or an int); None otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 0 else None
    text = value if isinstance(value, str) else ""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 78 else None


def min_stakes(params: Any) -> dict[str, int]:
    """Genesis `min_stake` from `/params` ({role: wei}); roles with a malformed amount left
    out (their nodes are then never members)."""
    genesis = params.get("genesis") if isinstance(params, dict) else None
    raw = genesis.get("min_stake") if isinstance(genesis, dict) else None
    out: dict[str, int] = {}
    for role, amount in (raw or {}).items() if isinstance(raw, dict) else ():
        wei = _amount(amount)
        if role in ROLES and wei is not None:
            out[role] = wei
    return out


def committee_standing(reader: CommitteeReader) -> LookUp:
    """A LookUp reading `/node?key=K` (and `/params` once, for the minimum stakes) through
    `reader`; a committee that does not answer within LOOKUP_TIMEOUT_S makes the key a
    STRANGER (it may still get a lease), logged."""
    limit = asyncio.Semaphore(LOOKUPS_AT_ONCE)
    minimums: dict[str, int] = {}

    async def look_up(key: str) -> Standing:
        async with limit:
            try:
                async with asyncio.timeout(LOOKUP_TIMEOUT_S):
                    if not minimums:
                        minimums.update(min_stakes(await reader.params()))
                    view = await reader.node(key)
            except (PlanetError, OSError, TimeoutError) as error:
                log.warning(
                    "rendezvous: committee unread for node %s…: %s",
                    key[:16],
                    getattr(error, "message", None) or type(error).__name__,
                )
                return Standing.STRANGER
        return standing_of(view, minimums)

    return look_up
