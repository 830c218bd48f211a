"""A path whose exit refuses to reach the node at set-up (DESTROY back: the node not reached,
or an address its policy refuses) is one failed path of the link, not the link's end: with k
paths up the link opens and carries messages; with fewer it fails by name
(node/client/overlay.py `OverlayLink`; real relays and a real door on loopback)."""

from __future__ import annotations

import aiohttp
import pytest

from node.client.overlay import OverlayLink
from protocol.errors import UnavailableError
from tests.unit.test_relay_paid_paths import exchange, network

pytestmark = pytest.mark.unit


async def test_one_path_refused_at_set_up_leaves_a_working_link() -> None:
    async with network(4) as net, aiohttp.ClientSession() as http:
        net.relays[3].allow_private = False  # the node's loopback address: refused, DESTROY
        link = OverlayLink(http, net.paths(4, 1), net.node_url, k=3)
        await link.__aenter__()
        try:
            assert link.failed_paths == 1 and sum(p.alive for p in link.paths) == 3
            assert len(await exchange(link, 5)) == 5  # the link was not ended by the refusal
        finally:
            await link.close()


async def test_too_many_paths_refused_at_set_up_fail_the_link_by_name() -> None:
    async with network(4) as net, aiohttp.ClientSession() as http:
        for relay in net.relays[2:]:
            relay.allow_private = False
        link = OverlayLink(http, net.paths(4, 1), net.node_url, k=3)
        with pytest.raises(UnavailableError, match="only 2 of 4 overlay paths"):
            await link.__aenter__()
