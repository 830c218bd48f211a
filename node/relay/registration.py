"""A relay's standing on the committee chain: registered once, kept up by heartbeats.

`planet relay serve` (node/relay/run.py) calls `ensure_registered` before it serves: the relay's
committee key (`<home>/node_key.json`) sends the `relay` tx (abci_app/registry.py) with its
endpoint, its X25519 key and the EIP-191 binding to the operator's staking wallet, unless the
key is registered already with that same endpoint and key (a restart). Then `keep_alive` sends a
`heartbeat` every third of the chain's `heartbeat_timeout`, so the relay stays JOIN/SERVING, the
states in which `/relays` lists it (with its Relay stake agreed by the validators' watchers).

What no retry can change ends the relay with a `RelayStandingError` naming it: the key is a
node's, or has LEFT, or is registered with another endpoint or key, or the chain refuses the
registration by name (address, endpoint or key taken).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Final, Protocol

from node.chain.committee_rpc import TxRejectedError
from protocol.committee.registry import Heartbeat
from protocol.committee.relays import RELAY_ROLE, RegisterRelay
from protocol.errors import PlanetError, RemoteError, UnavailableError

log = logging.getLogger(__name__)

# FinalizeBlock codes (abci_app/codes.py)
OK: Final = 0
ALREADY_REGISTERED: Final = 11
INVALID_LIFECYCLE: Final = 15
REFUSALS: Final = {
    4: ("the chain refused the wallet's registration signature", "is the wallet the staker's?"),
    12: (
        "the staking wallet is bound to another committee key (a node or another relay)",
        "each staking wallet registers one key: use that key's --home, or a new wallet",
    ),
    95: (
        "another relay registered this relay's X25519 key",
        "a relay key is one relay's: use a new --home (a new key)",
    ),
    96: (
        "another relay registered this endpoint",
        "one server is listed once: pass the endpoint others reach this relay at (--endpoint)",
    ),
}
DEFAULT_HEARTBEAT_TIMEOUT: Final = 30  # blocks (docs/committee.md)
POLL_S: Final = 2.0


class RelayStandingError(PlanetError):
    code = "relay_registration"


class Link(Protocol):
    """What the relay needs of `node.chain.committee_link.CommitteeLink`."""

    signer: str

    async def node(self, key: str) -> dict[str, Any] | None: ...
    async def send(self, body: Any, *, timeout_s: float = ...) -> tuple[int, str]: ...
    async def params(self) -> dict[str, Any]: ...
    async def height(self) -> int: ...


@dataclass(frozen=True)
class RelayIdentity:
    """What the relay registers: its endpoint and X25519 key, and its staking wallet's binding."""

    endpoint: str
    relay_key: str  # X25519 public key, 64 hex
    evm_address: str
    evm_signature: str  # EIP-191 over the committee key (protocol.committee.registry)


async def ensure_registered(link: Link, me: RelayIdentity, *, timeout_s: float = 30.0) -> dict:
    """The committee's view of this relay, registering it first when its key is new."""
    view = await link.node(link.signer)
    if view is None:
        body = RegisterRelay(me.evm_address, me.evm_signature, me.endpoint, me.relay_key)
        try:
            code, text = await link.send(body, timeout_s=timeout_s)
        except TxRejectedError as error:
            code, text = error.tx_code, error.log_text
        if code not in (OK, ALREADY_REGISTERED):
            what, hint = REFUSALS.get(code, (f"the chain refused `relay` (code {code})", None))
            raise RelayStandingError(f"{what}: {text}", hint=hint)
        view = await link.node(link.signer)
        if view is None:
            raise UnavailableError("the relay's registration is not visible on the committee yet")
    check_view(view, me)
    return view


def check_view(view: dict[str, Any], me: RelayIdentity) -> None:
    """Refuse a registration that is not this relay's as it starts now."""
    key = str(view.get("key", ""))[:16]
    if view.get("role") != RELAY_ROLE:
        raise RelayStandingError(
            f"key {key}… is registered as a {view.get('role')} node, not a relay",
            hint="a key has one role: serve the relay from another --home",
        )
    if view.get("status") == "LEFT":
        raise RelayStandingError(
            f"relay {key}… has LEFT the network (final on chain)",
            hint="register again from a new --home (a new key; the wallet may be the same only "
            "if it was not bound: use a new wallet)",
        )
    if view.get("endpoint") != me.endpoint or view.get("relay_key") != me.relay_key:
        raise RelayStandingError(
            f"relay {key}… is registered at {view.get('endpoint')} with key "
            f"{str(view.get('relay_key'))[:16]}…, not {me.endpoint} with {me.relay_key[:16]}…",
            hint="serve at the registered endpoint (--endpoint), or `planet relay leave` and "
            "register from a new --home",
        )


def heartbeat_interval(params: Any) -> int:
    """A third of the chain's `heartbeat_timeout` (from `/params`), at least 1 block."""
    genesis = params.get("genesis") if isinstance(params, dict) else None
    timeout = genesis.get("heartbeat_timeout") if isinstance(genesis, dict) else None
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 0 < timeout < 2**31:
        timeout = DEFAULT_HEARTBEAT_TIMEOUT
    return max(1, timeout // 3)


async def keep_alive(link: Link, stop: asyncio.Event, poll_s: float = POLL_S) -> None:
    """Heartbeat every `heartbeat_interval` blocks until `stop`; a validator that does not
    answer is retried at the next poll; a LEFT relay stops heartbeating (it is off the list)."""
    interval, last = DEFAULT_HEARTBEAT_TIMEOUT // 3, -(1 << 62)
    with_params = False
    while not stop.is_set():
        try:
            if not with_params:
                interval, with_params = heartbeat_interval(await link.params()), True
            height = await link.height()
            if height - last >= interval:
                code, text = await link.send(Heartbeat())
                if code == INVALID_LIFECYCLE:
                    log.error("relay has LEFT the committee: heartbeats stop (%s)", text)
                    return
                if code == OK:
                    last = height
                else:
                    log.warning("heartbeat refused code=%d log=%s", code, text)
        except TxRejectedError as error:
            if error.tx_code == INVALID_LIFECYCLE:
                log.error("relay has LEFT the committee: heartbeats stop")
                return
            log.warning("heartbeat refused code=%d log=%s", error.tx_code, error.log_text)
        except (UnavailableError, RemoteError) as error:
            log.warning("committee not reached for a heartbeat: %s", error.message)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), poll_s)
