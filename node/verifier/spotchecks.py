"""A verifier's spot checks, epoch after epoch (the live side of protocol/spotcheck.py).

When committee epoch e+1 opens, the commitments made during epoch e are selected under e+1's
seed and assigned among the verifier set that e+1's record fixed (abci_app/epochs.py: the
validators that committed a verifier seed for e+1) — the same set the nodes authorize ticket
requests with (node.server.tickets.CommitteePolicy). This verifier (its consensus key) then

1. requests, opens and judges the ticket of each triple assigned to it
   (`ticket_client.spot_check`, recomputation with its own copy of the registered shard, the
   calibrated tolerance of the manifest's quantization);
2. per node with findings in the epoch, hands one result to `vote` — its first FAILED check
   (offence 3, 50 %) in triple order, else its first TIMEOUT (offence 4, 5 %): one verdict,
   one slash per node and epoch. The worker's verdict vote builds it with
   `tickets.verdict_for`, every field derived from agreed data, so every verifier that reaches
   the same finding votes the same verdict id;
3. reports the checks it did (`spot_check_report`, at most 256 per epoch): the chain credits
   the ones its own draw assigned here, and settlement pays the verifiers' cut by them
   (abci_app/spot_reports.py); the counts also go to `<home>/verifier/spot_checks.json`.

    checker = SpotChecker(link, shards, tolerance, http, vote, home=home)
    await checker.run(stop)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from node.verifier.ticket_client import spot_check
from node.verifier.tickets import TicketResult
from protocol.committee.verification import MAX_SPOT_REPORT, SpotCheckReport
from protocol.errors import PlanetError
from protocol.fingerprint import Tolerance
from protocol.spotcheck import (
    DEFAULT_RATE_PPM,
    Outcome,
    SelectionError,
    Triple,
    checks_for,
    epoch_of_height,
    epoch_verifiers,
)
from protocol.tickets import TicketRequest

log = logging.getLogger(__name__)

COUNTS_FILE = Path("verifier") / "spot_checks.json"

Vote = Callable[[TicketResult, str, int], Awaitable[None]]  # (result, node key, epoch)


@dataclass(frozen=True)
class Assignment:
    """One check this verifier owes: `triple` committed in `epoch`, selected under `seed`."""

    epoch: int
    seed: str
    triple: Triple
    commitment: bytes


def assignments(
    record: object,
    commitments: Sequence[object],
    *,
    epoch: int,
    epoch_length: int,
    me: str,
    rate_ppm: int = DEFAULT_RATE_PPM,
) -> list[Assignment]:
    """The checks of `epoch`'s commitments assigned to verifier `me`, from epoch e+1's
    `/epochs` record (`record`) and `/commitments` records (malformed ones skipped: a
    validator RPC is a peer, this is the verifier's boundary). Sorted by triple."""
    fixed = epoch_verifiers(record)
    if fixed is None or not fixed[1]:
        return []
    seed, verifiers = fixed
    values: dict[Triple, bytes] = {}
    for entry in commitments:
        if not isinstance(entry, dict):
            continue
        height, value = entry.get("height"), entry.get("commitment")
        if type(height) is not int or height < 1 or not isinstance(value, str):
            continue
        if epoch_of_height(height, epoch_length) != epoch:
            continue
        try:
            fields = (entry.get(k) for k in ("node", "session", "step", "shard"))
            triple = Triple(*fields)  # type: ignore[arg-type]
            raw = bytes.fromhex(value.removeprefix("0x"))
        except (SelectionError, ValueError):
            continue
        if len(raw) == 32:
            values[triple] = raw
    mine = checks_for(seed, values, verifiers, me, rate_ppm)
    return [Assignment(epoch, seed, t, values[t]) for t in mine]


class SpotChecker:
    def __init__(
        self,
        link: Any,  # node.chain.committee_link.CommitteeLink with the consensus key
        shards: Sequence[Any],  # the verifier's own shard models, by shard id
        tolerance: Tolerance,
        http: aiohttp.ClientSession,
        vote: Vote,
        *,
        home: Path,
        rate_ppm: int = DEFAULT_RATE_PPM,
        deadline_s: float = 30.0,
        retry_s: float = 1.0,
        poll_s: float = 1.0,
    ) -> None:
        self.link = link
        self.shards = shards
        self.tolerance = tolerance
        self.http = http
        self.vote = vote
        self.home = home
        self.rate_ppm = rate_ppm
        self.deadline_s = deadline_s
        self.retry_s = retry_s
        self.poll_s = poll_s
        self.me = link.key.verify_key.encode().hex()
        self.checked: dict[int, dict[str, int]] = {}  # epoch → outcome name → count
        self.last_epoch = 0  # the last epoch whose commitments were checked
        self.accused: set[tuple[str, int]] = set()  # (node, epoch) already voted on

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                current = int((await self.link.query("/epochs"))["current"])
                if self.last_epoch == 0:
                    self.last_epoch = max(0, current - 2)
                while self.last_epoch + 1 < current and not stop.is_set():
                    await self.check_epoch(self.last_epoch + 1)
                    self.last_epoch += 1
            except PlanetError as error:
                log.warning("spot checks: %s", error.message)
            except (KeyError, TypeError, ValueError, aiohttp.ClientError) as error:
                log.warning("spot checks: malformed committee answer: %r", error)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.poll_s)

    async def check_epoch(self, epoch: int) -> list[TicketResult]:
        """Do every check of `epoch`'s commitments assigned here; vote on findings."""
        params = await self.link.query("/params")
        epoch_length = int(params["genesis"]["epoch_length"])
        records = (await self.link.query("/epochs", epoch=epoch + 1))["epochs"]
        if not records:
            return []
        commitments: list[object] = []
        for node in await self.link.nodes():
            answer = await self.link.query("/commitments", node=node["key"], limit=1000)
            commitments += answer.get("commitments", [])
        todo = assignments(
            records[0],
            commitments,
            epoch=epoch,
            epoch_length=epoch_length,
            me=self.me,
            rate_ppm=self.rate_ppm,
        )
        results = []
        done: list[Triple] = []
        findings: dict[str, list[TicketResult]] = {}
        for item in todo:
            result = await self.check(item)
            if result is None:
                continue
            results.append(result)
            done.append(item.triple)
            counts = self.checked.setdefault(epoch, {})
            counts[result.outcome.value] = counts.get(result.outcome.value, 0) + 1
            self._write_counts()
            log.warning(
                "spot check epoch=%d node=%s block=%d shard=%d outcome=%s %s",
                epoch,
                item.triple.node[:12],
                item.triple.block,
                item.triple.shard,
                result.outcome.value,
                result.reason,
            )
            if result.outcome is not Outcome.PASSED:
                findings.setdefault(item.triple.node, []).append(result)
        log.info("spot checks epoch=%d assigned=%d done=%d", epoch, len(todo), len(results))
        for node, found in sorted(findings.items()):
            if (node, epoch) in self.accused:
                continue
            self.accused.add((node, epoch))  # one verdict per node and epoch: one slash
            failed = [r for r in found if r.outcome is Outcome.FAILED]
            await self.vote((failed or found)[0], node, epoch)
        if done:
            await self.report(epoch, done)
        return results

    async def report(self, epoch: int, done: Sequence[Triple]) -> int | None:
        """Send the epoch's `spot_check_report`; the committed code (None: not sent)."""
        checks = sorted((t.node, t.session, t.block, t.shard) for t in done)[:MAX_SPOT_REPORT]
        try:
            sent = await self.link.submit(SpotCheckReport(epoch, tuple(checks)))
            code, text = await self.link.committed_code(sent.hash, timeout_s=15)
        except PlanetError as error:
            log.warning("spot_check_report not sent: %s", error.message)
            return None
        log.info("spot_check_report epoch=%d checks=%d code=%d %s", epoch, len(checks), code, text)
        return code

    async def check(self, item: Assignment) -> TicketResult | None:
        triple = item.triple
        if triple.shard >= len(self.shards):
            log.warning("spot check: shard %d is not in the model; skipped", triple.shard)
            return None
        view = await self.link.node(triple.node)
        endpoint = (view or {}).get("endpoint")
        if not isinstance(endpoint, str) or not endpoint:
            log.warning("spot check: node %s has no endpoint; skipped", triple.node[:12])
            return None
        request = TicketRequest(triple, item.seed, self.me).signed(self.link.key)
        return await spot_check(
            self.http,
            endpoint.rstrip("/"),
            request,
            self.link.key,
            shard=self.shards[triple.shard],
            commitment=item.commitment,
            tolerance=self.tolerance,
            deadline_s=self.deadline_s,
            retry_s=self.retry_s,
        )

    def _write_counts(self) -> None:
        path = self.home / COUNTS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        table = {str(e): dict(sorted(c.items())) for e, c in sorted(self.checked.items())}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)
