"""Which next hops a node keeps a warm link to (node/server/link_pool.py): the replicas of the
shard after its own, as far as its next-hop policy (next_hops.py) names them.

    committee   the nodes the committee chain lists for the next shard, under their node keys
                (the keys the links are pinned to), at the addresses the policy dials; a node
                behind NAT at its endpoint, else at its other rendezvous relays' addresses
                (registered for its key), in turn
    list        the `--next-hops` URLs whose node says (GET /info) it serves the next shard of
                this model; plaintext links only (a list names no node keys, and an https link
                is only ever pinned to a key the client or the chain names)
    none, any   nothing ahead of a question (any: the clients' next hops are anyone's choice)

A list node's answer is asked again after `reprobe_s` (or at once after a failed probe, at most
every round); at most MAX_PROBED URLs of a list are asked.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from node.links import link_ssl
from node.server.link_pool import LinkId, Targets, WarmTarget, no_targets
from node.server.next_hops import ForwardCommittee, ForwardList
from protocol.errors import PlanetError

log = logging.getLogger(__name__)

MAX_PROBED = 64
PROBE_TIMEOUT_S = 3.0
REPROBE_S = 60.0
MAX_INFO_BYTES = 1 << 20  # of a node's /info answer read


def served_shard(answer: Any, model_hash: str) -> int | None:
    """The shard a node's /info answer (untrusted) says it serves of the model `model_hash`;
    None when it is not that model or the answer is not well-formed."""
    if not isinstance(answer, dict) or answer.get("model_hash") != model_hash:
        return None
    shard = answer.get("shard")
    if not isinstance(shard, int) or isinstance(shard, bool) or shard < 0:
        return None
    return shard


class ListTargets:
    """The `--next-hops` list's nodes of the next shard (probed by /info, cached)."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        policy: ForwardList,
        model_hash: str,
        *,
        plaintext_ok: bool,
        reprobe_s: float = REPROBE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.http = http
        self.model_hash = model_hash
        self.want = policy.own_shard + 1
        self.reprobe_s = reprobe_s
        self.clock = clock
        self.urls: list[str] = []
        for url in sorted(policy.urls):
            try:  # https without a key, or http off loopback outside local mode: not ahead
                if link_ssl(url, None, plaintext_ok=plaintext_ok) is True:
                    self.urls.append(url)
            except PlanetError:
                continue
        self.urls = self.urls[:MAX_PROBED]
        self._shards: dict[str, tuple[int | None, float]] = {}  # url -> (shard, probed at)
        self.incomplete = False  # a probe of the last call failed (the pool asks again soon)

    async def _probe(self, url: str) -> None:
        shard = None
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                async with self.http.get(f"{url}/info") as answer:
                    if answer.status == 200:
                        body = await answer.content.read(MAX_INFO_BYTES)
                        shard = served_shard(json.loads(body), self.model_hash)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as error:
            log.debug("next-hop probe failed url=%s: %s", url, error)
            self._shards.pop(url, None)  # asked again next round
            return
        self._shards[url] = (shard, self.clock())

    async def __call__(self) -> list[LinkId]:
        now = self.clock()
        stale = [
            url
            for url in self.urls
            if url not in self._shards or now - self._shards[url][1] >= self.reprobe_s
        ]
        await asyncio.gather(*(self._probe(url) for url in stale))
        self.incomplete = any(url not in self._shards for url in self.urls)
        return [
            (url, None)
            for url in self.urls
            if url in self._shards and self._shards[url][0] == self.want
        ]


def warm_targets(
    policy: Any, http: aiohttp.ClientSession, model_hash: str, *, plaintext_ok: bool
) -> Targets:
    """The warm targets of a node under `policy` (module docstring)."""
    if isinstance(policy, ForwardCommittee):

        async def committee() -> list[LinkId | WarmTarget]:
            hops = await policy.next_shard_hops()
            return [WarmTarget(url, key, others) for url, key, others in hops]

        return committee
    if isinstance(policy, ForwardList):
        return ListTargets(http, policy, model_hash, plaintext_ok=plaintext_ok)
    return no_targets
