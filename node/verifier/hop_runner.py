"""The verifier's one-hop probes, run live: one node timed alone, paid as any question pays.

    runner = HopRunner(reference, tolerance, HopSettings(), payer=payer, private_ranges=())
    targets = runner.targets(await link.nodes(model=..., role="compute"), seed, epoch, recent)
    timed = await runner.time_node(targets[0], seed, epoch)   # Timing, or None: no timing

For each round `saturate` asks for (hop_probe.py), the verifier draws the sessions' tokens from
the epoch's secret seed (hop_schedule.probe_tokens), computes the probed shard's input rows and
its own outputs with its copies of the shards (hop_session.probe_rows, in a worker thread,
before the clock starts), and steps them through a one-hop `CircuitClient` to the node
(hop_session.run_probe). A span node (shards a … b as one hop) is timed as that one hop: shard
a's inputs in, the verifier's own outputs of shards a … b checked, the layers all of theirs, so
its speed is the tokens/s of the whole span (what each of its shards gets from it in the pool).
A charging node is paid by the client's `CreditPayer` from the operator's credit wallet, as a
personal client pays (node/client/paying.py): credits ahead of each frame for the positions it
carries, so every position the node computes is paid once, at the price the node registered on the
chain; a node with no registered price is dialled unpaid.

No timing (None, logged by the worker) when the node cannot be dialled, refuses a session or a
credit, closes the stream, answers a wrong output or runs past `HopSettings.timeout_s`: as for
a challenge it did not serve, nothing is credited and nothing else follows from it here (its
circuits' challenges judge its answers; refusing a paid question is its own loss).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Container, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp

from node.client.circuit import CircuitClient
from node.client.paying import CreditPayer
from node.client.types import Hop, payee
from node.server.next_hops import Network, PublicResolver, address_refusal
from node.verifier.hop_probe import Clock, HopProbe, HopResult, saturate
from node.verifier.hop_schedule import HopSettings, ProbeTarget, candidates, choose, probe_tokens
from node.verifier.hop_session import probe_rows, run_probe
from protocol.committee.credit_holder import node_party
from protocol.errors import PlanetError
from protocol.fingerprint import Tolerance
from protocol.urls import BadUrlError, canonical_url

log = logging.getLogger(__name__)

# what a node, its link or its refusal can make a probe end with (no timing)
FAILURES = (PlanetError, aiohttp.ClientError, OSError)


@dataclass(frozen=True, slots=True)
class Timing:
    """One clean timed probe: what `EpochSpeeds.note_hop` keeps."""

    node: str
    shard: int
    layers: int  # the shard's layers in the verifier's manifest
    positions: int  # all the probe's sessions' positions
    seconds: float
    sessions: int


class HopRunner:
    """Times one node alone (module docstring)."""

    def __init__(
        self,
        reference: Any,  # node.verifier.reference.Reference (head, shards, model_hash)
        tolerance: Tolerance,
        settings: HopSettings,
        *,
        payer: CreditPayer | None = None,
        private_ranges: tuple[Network, ...] = (),
        clock: Clock = time.monotonic,
    ) -> None:
        self.reference = reference
        self.tolerance = tolerance
        self.settings = settings
        self.payer = payer
        self.private_ranges = private_ranges
        self.clock = clock

    @property
    def model_hash(self) -> str:
        return str(self.reference.model_hash)

    @property
    def shard_count(self) -> int:
        return len(self.reference.shards)

    def allowed(self, endpoint: str) -> bool:
        """Whether this verifier's address policy lets it dial `endpoint`: public addresses,
        or IP literals in its private ranges (`--private-peers`)."""
        try:
            url = canonical_url(endpoint)
        except BadUrlError:
            return False
        ranges = self.private_ranges
        return address_refusal(url, not ranges, ranges) is None

    def targets(
        self, entries: Iterable[Any], seed: bytes, epoch: int, recent: Container[str]
    ) -> list[ProbeTarget]:
        """The nodes to time this epoch (hop_schedule.choose)."""
        return choose(
            candidates(entries, self.shard_count),
            seed=seed,
            epoch=epoch,
            count=self.settings.per_epoch,
            recent=recent,
            can_pay=self.payer is not None,
            allowed=self.allowed,
        )

    def layers(self, shard: int, last: int | None = None) -> int:
        """Layers of `shard` (through `last`: a span's) in the verifier's manifest."""
        total = 0
        for each in range(shard, shard + 1 if last is None else last + 1):
            start, end = self.reference.shards[each].layers
            total += int(end) - int(start)
        return total

    async def time_node(self, target: ProbeTarget, seed: bytes, epoch: int) -> Timing | None:
        """`target` timed alone (its fastest clean probe), or None: no timing."""
        try:
            async with asyncio.timeout(self.settings.timeout_s):
                found = await self._saturated(target, seed, epoch)
        except TimeoutError:
            log.info("hop probe of %s: past %.0f s", target.key[:12], self.settings.timeout_s)
            return None
        except FAILURES as error:
            log.info("hop probe of %s: %s", target.key[:12], getattr(error, "message", error))
            return None
        except ExceptionGroup as group:  # raised inside `time_hop`'s sessions
            if group.split(FAILURES)[1] is not None:
                raise
            log.info("hop probe of %s: %s", target.key[:12], group.exceptions[0])
            return None
        if found is None:
            return None
        sessions, result = found
        positions = sessions * self.settings.positions
        return Timing(
            target.key, target.shard, self.layers(target.shard, target.last), positions,
            result.seconds, sessions,
        )  # fmt: skip

    async def _saturated(
        self, target: ProbeTarget, seed: bytes, epoch: int
    ) -> tuple[int, HopResult] | None:
        settings, reference = self.settings, self.reference
        shard, span = target.shard, target.span
        hop = Hop(target.endpoint, shard, target.key, last=target.last)
        payer = self.payer if target.charging else None
        if payer is not None:  # a span hop is paid per shard (node/client/types.py `payee`)
            assert isinstance(payer.prices, dict)
            for each, price in target.prices():
                name = payee(target.endpoint, None if span.size == 1 else each)
                payer.prices[name] = int(price or 0)
                payer.parties[name] = node_party(
                    bytes.fromhex(target.key), reference.model_hash, each
                )
        connector = None if self.private_ranges else aiohttp.TCPConnector(resolver=PublicResolver())
        rounds = iter(range(1 << 16))
        async with aiohttp.ClientSession(connector=connector) as http:
            client = CircuitClient(
                [hop],
                hidden_size=int(reference.head.hidden_size),
                http=http,
                payer=payer,
                plaintext_links=bool(self.private_ranges),
                request_timeout_s=settings.timeout_s,
            )
            async with client:

                async def run(sessions: int) -> HopResult:
                    tokens = probe_tokens(
                        seed, epoch, target.key, next(rounds), sessions, settings.positions,
                        int(reference.head.vocab_size),
                    )  # fmt: skip
                    rows = await asyncio.to_thread(
                        probe_rows,
                        reference.head.embed,
                        reference.shards[:shard],
                        reference.shards[shard],
                        tokens,
                        reference.shards[shard + 1 : span.last + 1],
                    )
                    probe = HopProbe(
                        target.key, shard, self.layers(shard, target.last), sessions,
                        settings.positions,
                    )  # fmt: skip
                    return await run_probe(client, probe, rows, self.tolerance, self.clock)

                return await saturate(
                    run, settings.positions, settings.sessions, settings.most_sessions
                )
