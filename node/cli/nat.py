"""`planet join` behind NAT: is the node's endpoint reachable, and if not, which relay fronts it
(docs/network.md, *Nodes behind NAT*; docs/overlay.md, *NAT rendezvous*).

    --rendezvous check (default)  ask a listed relay to dial the endpoint back (`/v1/dialback`:
                                  it dials only the address the question came from); reachable:
                                  the node registers its own endpoint; not: as `auto`
    --rendezvous auto             (or --behind-nat) the first listed relay that fronts nodes
                                  gives the node a port; the node registers that address and
                                  names the relay, and the next relay that gives it a port
                                  too (its second address: clients dial it when the first
                                  relay is down)
    --rendezvous URL              that listed relay
    --rendezvous off              register the endpoint as it is, unchecked

Each outcome is said in one line: how the node will be reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from dataclasses import dataclass
from typing import Any

import aiohttp
from nacl.signing import SigningKey

from node.agent.launch import FrontedBy
from node.client.relay_registry import MalformedRelayEntry, parse_entry
from node.dial import refuse_redirects
from node.server.rendezvous import RendezvousRelay, claim_port, public_url
from protocol.errors import PlanetError, ProtocolError, UnavailableError, UsageError

MODES = ("check", "auto", "off")
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
DIALBACK_TIMEOUT_S = 10.0
FRONTING_RELAYS = 2  # relays a node behind NAT claims a port at: its endpoint's and a second


@dataclass(frozen=True)
class ListedRelay:
    url: str
    x25519: bytes
    key: str  # its committee key


@dataclass(frozen=True)
class Reach:
    """How the node will be reached: `line` says it; `fronted` names the relay when it is
    behind NAT, `backups` the other relays that gave it a port (in the order clients try
    them)."""

    line: str
    fronted: FrontedBy | None = None
    backups: tuple[FrontedBy, ...] = ()

    @property
    def relays(self) -> tuple[FrontedBy, ...]:
        """Every relay fronting the node, the registered endpoint's first."""
        return () if self.fronted is None else (self.fronted, *self.backups)


def parse_listed(entry: Any) -> ListedRelay:
    hop = parse_entry(entry)
    key = entry.get("key")
    if not isinstance(key, str) or not _HEX64.match(key):
        raise MalformedRelayEntry(f"relay {hop.url}: key: expected 64 lowercase hex digits")
    return ListedRelay(hop.url, hop.key, key)


def order_for(relays: list[ListedRelay], node_key: str) -> list[ListedRelay]:
    """The relays in the order this node tries them: by a hash of the node key and theirs, so
    nodes spread over the relays rather than all asking the first."""
    return sorted(relays, key=lambda r: hashlib.sha256((node_key + r.key).encode()).digest())


async def dial_back(http: aiohttp.ClientSession, relay: ListedRelay, host: str, port: int) -> Any:
    """Ask `relay` whether it reaches this machine at `port`, listening there meanwhile."""

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(accept, host, port)
    try:
        async with (
            asyncio.timeout(DIALBACK_TIMEOUT_S),
            http.get(f"{relay.url}/v1/dialback", params={"port": str(port)}) as answer,
        ):
            if answer.status != 200:
                return None
            body = await answer.json()
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await server.wait_closed()
    if not isinstance(body, dict) or not isinstance(body.get("reachable"), bool):
        return None
    return body


async def decide(
    mode: str,
    relays: list[ListedRelay],
    node_key: SigningKey,
    host: str,
    port: int,
) -> Reach:
    """`mode` (check, auto, off or a listed relay's URL) → how the node will be reached."""
    own = f"https://{f'[{host}]' if ':' in host else host}:{port}"
    if mode == "off":
        return Reach(f"reachability: not checked (--rendezvous off); registering {own}")
    key = node_key.verify_key.encode().hex()
    ordered = order_for(relays, key)
    if mode not in MODES:
        ordered = [r for r in relays if r.url == mode]
        if not ordered:
            raise UsageError(
                f"--rendezvous {mode}: no relay the committee lists has that endpoint",
                hint="name a listed relay's endpoint, or --rendezvous auto",
            )
    if mode == "check" and not relays:
        return Reach(f"reachability: not checked (the committee lists no relay); {own}")
    async with aiohttp.ClientSession(middlewares=(refuse_redirects,)) as http:
        why = "--rendezvous " + mode if mode != "check" else ""
        if mode == "check":
            seen = None
            for relay in ordered[:3]:
                with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
                    seen = await dial_back(http, relay, host, port)
                if seen is not None:
                    break
            if seen is None:
                return Reach(f"reachability: not checked (no listed relay answered); {own}")
            if seen["reachable"]:
                return Reach(
                    f"reachability: {own} is reachable (relay {relay.url} dialled it back); "
                    "clients dial it directly"
                )
            why = f"{own} is not reachable from relay {relay.url} (it sees this machine at " + (
                f"{seen.get('address')})"
            )
        refusals: list[str] = []
        claimed: list[FrontedBy] = []
        for relay in ordered:
            if len(claimed) == FRONTING_RELAYS:
                break
            target = RendezvousRelay(relay.url, relay.x25519)
            try:
                welcome = await claim_port(http, target, node_key)
            except (ProtocolError, aiohttp.ClientError, OSError, TimeoutError) as error:
                refusals.append(f"{relay.url}: {getattr(error, 'message', error) or error!r}")
                continue
            endpoint = public_url("https", welcome)
            claimed.append(FrontedBy(relay.url, relay.x25519.hex(), relay.key, endpoint))
        if claimed:
            first, *backups = claimed
            second = "".join(
                f"; also at {b.endpoint} through relay {b.relay_url} (if the first is down)"
                for b in backups
            )
            return Reach(
                f"reachability: {why}; the node will be reached at {first.endpoint} through "
                f"relay {first.relay_url}{second} (rendezvous: it dials out, accepts no inbound "
                "connection)",
                first,
                tuple(backups),
            )
    raise UnavailableError(
        f"{why or 'behind NAT'}, and no listed relay fronts nodes: "
        + ("; ".join(refusals[:3]) or "the committee lists none"),
        hint="ask a relay operator to serve with --rendezvous-ports, or forward a public "
        "port to this machine and join with --rendezvous off",
    )


async def read_relays(committee_rpc: str) -> list[ListedRelay]:
    """The relays the committee lists (the first page: up to 1,000), malformed ones left out."""
    from node.chain.committee_link import CommitteeLink  # lazy: the RPC client

    link = CommitteeLink([committee_rpc])
    try:
        page = await link.query("/relays?limit=1000")
    except PlanetError:
        return []
    finally:
        await link.close()
    entries = page.get("relays") if isinstance(page, dict) else None
    listed = []
    for entry in entries if isinstance(entries, list) else []:
        with contextlib.suppress(MalformedRelayEntry):
            listed.append(parse_listed(entry))
    return listed
