"""The relays a user's client draws its paths from, read from the committee's `/relays`.

The committee lists the registered relays whose Relay stake the validators agree on and that
are up (abci_app/relay_queries.py), a page at a time. A validator RPC is a peer, not a trusted
source of well-formed data, so each answer is parsed here, once, into `Hop`s:

- a page that is not `{"relays": [...], "next": key or null}`, or whose `next` does not move
  forward, ends the read (`MalformedRelaysAnswer`): paging on would risk a loop;
- an entry that is malformed (endpoint not canonical `http(s)://IP:PORT`, key not 32 bytes of
  hex, ...) or repeats an endpoint or X25519 key already read is refused by name and left out;
  one bad entry never voids the others.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from protocol.committee.relays import EndpointError, relay_endpoint
from protocol.errors import ProtocolError, UnavailableError
from protocol.overlay import Hop

log = logging.getLogger(__name__)

_HEX32 = re.compile(r"[0-9a-f]{64}\Z")
PAGE_LIMIT: Final = 1000  # the committee's largest page
MAX_PAGES: Final = 64  # 64,000 registered relays at most are read


class MalformedRelaysAnswer(ProtocolError):
    code = "relays_answer_malformed"


class MalformedRelayEntry(ProtocolError):
    code = "relay_entry_malformed"


@dataclass
class RelayList:
    """What the pages read so far gave: the relays, and each refused entry with its reason."""

    hops: list[Hop] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    _urls: set[str] = field(default_factory=set)
    _keys: set[bytes] = field(default_factory=set)

    def add_page(self, answer: Any, after: str | None) -> str | None:
        """Take one `/relays` answer (the page after `after`); returns its `next` cursor."""
        if not isinstance(answer, dict) or not isinstance(answer.get("relays"), list):
            raise MalformedRelaysAnswer("/relays: expected an object with a relays list")
        cursor = answer.get("next")
        if cursor is not None and (
            not isinstance(cursor, str)
            or not _HEX32.match(cursor)
            or (after is not None and cursor <= after)
        ):
            raise MalformedRelaysAnswer(
                f"/relays: next {ascii(cursor)[:80]} is not a key after {after}"
            )
        if len(answer["relays"]) > PAGE_LIMIT:
            raise MalformedRelaysAnswer(f"/relays: a page of over {PAGE_LIMIT} relays")
        for index, entry in enumerate(answer["relays"]):
            try:
                hop = parse_entry(entry)
            except MalformedRelayEntry as error:
                self.refused.append(f"relays[{index}] after {after}: {error.message}")
                continue
            if hop.url in self._urls or hop.key in self._keys:
                self.refused.append(f"{hop.url}: listed twice (endpoint or key)")
                continue
            self._urls.add(hop.url)
            self._keys.add(hop.key)
            self.hops.append(hop)
        return cursor


def parse_entry(entry: Any) -> Hop:
    """One `/relays` entry → its `Hop`, or `MalformedRelayEntry` naming what is wrong."""
    if not isinstance(entry, dict):
        raise MalformedRelayEntry("relay: expected an object")
    try:
        url = relay_endpoint(entry.get("endpoint"))
    except EndpointError as error:
        raise MalformedRelayEntry(f"relay: endpoint: {error.reason}") from None
    key = entry.get("relay_key")
    if not isinstance(key, str) or not _HEX32.match(key):
        raise MalformedRelayEntry(f"relay {url}: relay_key: expected 64 lowercase hex digits")
    return Hop(url, bytes.fromhex(key))


Query = Callable[[str], Awaitable[Any]]


async def read_chain_relays(query: Query, *, limit: int = PAGE_LIMIT) -> tuple[Hop, ...]:
    """Every relay `/relays` lists, page after page (`query(path)` answers one path)."""
    relays = RelayList()
    after: str | None = None
    for _ in range(MAX_PAGES):
        path = f"/relays?limit={limit}" + (f"&after={after}" if after else "")
        after = relays.add_page(await query(path), after)
        if after is None:
            break
    else:
        log.warning("relays: stopped after %d pages; the rest are not drawn from", MAX_PAGES)
    for reason in relays.refused:
        log.warning("relays: refused %s", reason)
    if not relays.hops:
        raise UnavailableError(
            "the committee lists no relay",
            hint="relays are listed once registered (`planet relay serve`) with an agreed Relay "
            "stake; or give a relays file: --relays FILE",
        )
    return tuple(relays.hops)
