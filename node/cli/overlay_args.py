"""The overlay's flags, shared by the two commands that ask nodes for the user: `planet gateway
serve --personal` and `planet ask` (issue 43). `--relays chain|FILE` and `--overlay N,K,L` mean
the same in both, and both build the same `OverlayRoute` (node/client/overlay.py): n paths of l
relays per node, the entry relays kept as guards, the relays paid from the user's credit file at
the committee's rate.

Import-light: argparse and pathlib at the top; the client's runtime only when a route is built.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Final

from protocol.errors import PlanetError, UsageError

CHAIN_RELAYS: Final = "chain"
DEFAULT_SHAPE: Final = (4, 3, 3)  # the seed's n, k, l (node/client/overlay.py DEFAULT_*)

RELAYS_HELP: Final = (
    "reach every node through the overlay: n paths of relays drawn from the relays "
    "the committee lists (`chain`: registered with an agreed Relay stake, read from "
    "/relays{when}) or from FILE (one `URL KEY` line per relay, as "
    "`planet relay serve` prints it, read once at start, never refreshed; ./chain for a "
    "file named chain), the messages cut into S-IDA cloves, so no node sees this "
    "machine's address (docs/overlay.md)"
)
OVERLAY_HELP: Final = (
    "with --relays: N paths per node, any K of them enough, L relays per path "
    "(default 4,3,3, the seed's; needs N × L relays in the file)"
)


def add_overlay_arguments(group: Any, *, refreshed: str) -> None:
    """`--relays` and `--overlay` on `group` (a parser or an argument group); `refreshed` says
    when a `chain` list is read (the help's words)."""
    group.add_argument(
        "--relays",
        type=relays_source,
        default=None,
        metavar="chain|FILE",
        help=RELAYS_HELP.format(when=refreshed),
    )
    group.add_argument(
        "--overlay", type=overlay_shape, default=None, metavar="N,K,L", help=OVERLAY_HELP
    )


def relays_source(text: str) -> str | Path:
    """--relays: `chain` (the committee's /relays), else a relays file's path."""
    return CHAIN_RELAYS if text == CHAIN_RELAYS else Path(text)


def overlay_shape(text: str) -> tuple[int, int, int]:
    parts = text.split(",")
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not N,K,L (e.g. 4,3,3)")
    n, k, length = (int(p) for p in parts)
    if not (2 <= k <= n <= 16 and 1 <= length <= 5):
        raise argparse.ArgumentTypeError(f"{text!r}: need 2 ≤ K ≤ N ≤ 16 and 1 ≤ L ≤ 5")
    return n, k, length


def read_file_relays(relays: str | Path | None, shape: tuple[int, int, int] | None) -> Any:
    """A relays file's relays (read before anything dials: its mistakes need no chain to find),
    None for `chain` or no --relays; `--overlay` without `--relays` is a usage error."""
    if relays is None and shape is not None:
        raise UsageError(
            "--overlay shapes the paths of --relays", hint="add --relays chain (or FILE)"
        )
    if not isinstance(relays, Path):
        return None
    from node.client.overlay import read_relays  # lazy: aiohttp

    return read_relays(relays)


def overlay_route(
    relays: Any,
    shape: tuple[int, int, int] | None,
    *,
    home: Path,
    committee_rpc: str | None,
    credits_file: Path | None,
) -> Any:
    """The `OverlayRoute` both commands reach nodes by: `relays` (protocol.overlay.Hop) in
    paths of `shape` (default DEFAULT_SHAPE; UsageError when too few relays), the entry relays
    kept as guards under `home`, the relays paid from `credits_file` at the committee's rate
    (not paid without a committee or a credit file: said in one line on stderr)."""
    from node.client.overlay import OverlayRoute  # lazy: aiohttp
    from node.client.relay_guards import GUARDS_FILE, RelayGuards

    n, k, length = shape or DEFAULT_SHAPE
    guards = RelayGuards(home / GUARDS_FILE)  # the paths' entry relays
    # too few relays for the paths: a usage error before the committee is asked anything
    route = OverlayRoute(relays, paths=n, needed=k, length=length, guards=guards)
    if committee_rpc is None or credits_file is None:
        why = "no committee to read their rate from (--committee-rpc)"
        if credits_file is None:
            why = "no credits to pay them with (--credits)"
        print(f"overlay: relays are not paid: {why}", file=sys.stderr, flush=True)
    else:
        route.purse = relay_purse(committee_rpc, credits_file)
    return route


def relay_purse(committee_rpc: str, credits_file: Path) -> Any:
    """What pays the relays: the committee's rate (`/credit_keys` relay_bytes) and the user's
    credit wallet; None, said in one line on stderr, when the committee gives no rate."""
    import asyncio

    from node.chain.committee_link import CommitteeLink  # lazy: aiohttp
    from node.client.credit_wallet import CreditWallet
    from node.client.relay_paying import RelayPurse, read_rate

    async def read() -> int:
        link = CommitteeLink([committee_rpc])
        try:
            return await read_rate(link.query)
        finally:
            await link.close()

    try:
        rate = asyncio.run(read())
    except PlanetError as error:
        print(f"overlay: relays are not paid: {error.message}", file=sys.stderr, flush=True)
        return None
    wallet = CreditWallet(credits_file)
    print(f"overlay: relays paid 1 credit per {rate} clove bytes that arrive", file=sys.stderr)
    return RelayPurse(rate, wallet.take, wallet.add)


def chain_relays(committee_rpc: str) -> Any:
    """The relays the committee lists (every page of /relays), said in one line on stderr."""
    import asyncio

    from node.chain.committee_link import CommitteeLink  # lazy: aiohttp
    from node.client.relay_registry import read_chain_relays

    async def read() -> Any:
        link = CommitteeLink([committee_rpc])
        try:
            return await read_chain_relays(link.query)
        finally:
            await link.close()

    relays = asyncio.run(read())
    print(f"overlay: {len(relays)} relays listed on the committee", file=sys.stderr, flush=True)
    return relays


def ring_default(ring: bool | None, *, relays: bool, speculate: int) -> bool:
    """`--ring` / `--no-ring` as given; without either, the first node's decode loop over the
    overlay (a token there costs 2l + K + 1 link delays with the loop here, 2(K − 1) with the
    ring: docs/overlay.md, *The ring*), never beside --speculate (the other way past round
    trips), and the loop here on direct links, where the ring saves less and shows the middle
    hops the last hop's outputs."""
    if ring is not None:
        return ring
    return relays and not speculate
