"""A verifier's spot checks, epoch after epoch (the live side of protocol/spotcheck.py).

When committee epoch e+1 opens, the commitments made during epoch e are selected under e+1's
seed and assigned among the verifier set that e+1's record fixed (abci_app/epochs.py: the
validators that committed a verifier seed for e+1) — the same set the nodes authorize ticket
requests with (node.server.tickets.CommitteePolicy). This verifier (its consensus key) then

1. requests, opens and judges the ticket of each triple assigned to it
   (`ticket_client.spot_check`, recomputation with its own copy of the registered shard, the
   calibrated tolerance of the manifest's quantization). A node's blocks are drawn at the
   chain's rate for it (`node_rate_ppm`: genesis `spot_check_floor` over its committed blocks
   of the epoch, `/coverage`), so a node that serves little is checked on most of it;
2. per node with findings in the epoch, hands one result to `vote` — its first FAILED check
   (offence 3, 50 %) in triple order, else its first TIMEOUT (offence 4, 5 %): one verdict,
   one slash per node and epoch. The worker's verdict vote builds it with
   `tickets.verdict_for`, every field derived from agreed data, so every verifier that reaches
   the same finding votes the same verdict id;
3. reports the checks it did (`spot_check_report`, at most 256 per epoch): the chain credits
   the ones its own draw assigned here, and settlement pays the verifiers' cut by them
   (abci_app/spot_reports.py); the counts also go to `<home>/verifier/spot_checks.json`;
4. **re-judges its peers' findings** (`rejudge`): it knows every selected triple of the recent
   epochs and the evidence hash a FAILED or TIMEOUT finding on each would carry, so a
   `verdict_vote` on chain whose evidence is one of them names the triple. It fetches its OWN
   ticket for that triple (the node answers any verifier of the epoch's set), judges it, and
   votes the same verdict when it reaches the same finding — a failed check gathers 2/3 of the
   power from verifiers that each recomputed it. The ticket cannot differ between verifiers:
   its inputs and fingerprint open the node's commitment (protocol/served.py binds both), so
   honest verifiers judge the same bytes with the same calibrated rule. When its own finding
   differs but is not a pass (the node withheld this verifier's ticket: TIMEOUT where a peer
   found FAILED), it votes its own finding: the chain then sees that ≥ 2/3 of the power
   accused the node and does not count the finder's unconfirmed verdict as a false accusation
   (abci_app/verdicts.py);
5. **forwards its FAILED findings** (node/verifier/findings.py): it keeps the node's signed
   statement of each failed ticket with its own signed request, and serves it sealed to each
   verifier of that epoch's set. Re-judging a peer's FAILED finding, a verifier first fetches
   the finders' copies (`peers`, from the URLs on chain) and judges the node's own bytes — so a
   node that answers only the assigned verifier and withholds its ticket from the others is
   convicted all the same; with no copy it asks the node for its own ticket, as above.

    checker = SpotChecker(link, shards, tolerance, http, vote, home=home, peers=PeerFindings(),
                          epochs=worker.epochs)   # the worker's `follow` reads `/epochs`
    runner = await serve_findings(checker.book, host, port)   # its findings, for its peers
    await checker.run(stop)
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from node.chain.committee_pages import read_pages
from node.retry import Stopped, sleep_or_stop, until_stopped
from node.verifier.epoch_feed import EpochFeed
from node.verifier.findings import FindingBook, PeerFindings
from node.verifier.ticket_client import spot_check
from node.verifier.tickets import TicketResult, judge_ticket
from protocol.committee.verification import MAX_SPOT_REPORT, SpotCheckReport
from protocol.errors import PlanetError
from protocol.fingerprint import Tolerance
from protocol.numerics import NumericsError, announced_at
from protocol.spotcheck import (
    CHECK_LOOKBACK_EPOCHS,
    DEFAULT_RATE_PPM,
    Outcome,
    SelectionError,
    Triple,
    assign_verifier,
    epoch_of_height,
    epoch_verifiers,
    evidence_hash,
    select,
)
from protocol.tickets import TicketRequest, open_forwarded

log = logging.getLogger(__name__)

COUNTS_FILE = Path("verifier") / "spot_checks.json"
FINDINGS_DIR = Path("verifier") / "findings"  # the FAILED findings held for the peers
MAX_COMMITMENT_PAGES = 100  # 100 000 records of one node per epoch check (/commitments pages)
IDLE_POLLS = 10  # with nothing to re-judge, the loop still looks at least every 10 polls

Vote = Callable[[TicketResult, str, int], Awaitable[None]]  # (result, node key, epoch)


@dataclass(frozen=True)
class Assignment:
    """One check this verifier owes: `triple` committed in `epoch`, selected under `seed`."""

    epoch: int
    seed: str
    triple: Triple
    commitment: bytes


def _committed(commitments: Sequence[object], epoch: int, epoch_length: int) -> dict[Triple, bytes]:
    """Triple → commitment value of the records committed in `epoch` (malformed ones skipped:
    a validator RPC is a peer, this is the verifier's boundary)."""
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
    return values


def selections(
    record: object,
    commitments: Sequence[object],
    *,
    epoch: int,
    epoch_length: int,
    rate_ppm: int = DEFAULT_RATE_PPM,
    floor: int = 0,
    blocks: Mapping[str, int] | None = None,
) -> tuple[list[Assignment], list[str]]:
    """Every selected check of `epoch`'s commitments (whoever is assigned) and the verifier
    set of epoch e+1's `/epochs` record; sorted by triple."""
    fixed = epoch_verifiers(record)
    if fixed is None or not fixed[1]:
        return [], []
    seed, verifiers = fixed
    values = _committed(commitments, epoch, epoch_length)
    chosen = select(seed, values, rate_ppm, floor=floor, blocks=blocks)
    return [Assignment(epoch, seed, t, values[t]) for t in chosen], verifiers


def assignments(
    record: object,
    commitments: Sequence[object],
    *,
    epoch: int,
    epoch_length: int,
    me: str,
    rate_ppm: int = DEFAULT_RATE_PPM,
    floor: int = 0,
    blocks: Mapping[str, int] | None = None,
) -> list[Assignment]:
    """The checks of `epoch`'s commitments assigned to verifier `me`, from epoch e+1's
    `/epochs` record (`record`) and `/commitments` records. Sorted by triple."""
    chosen, verifiers = selections(
        record,
        commitments,
        epoch=epoch,
        epoch_length=epoch_length,
        rate_ppm=rate_ppm,
        floor=floor,
        blocks=blocks,
    )
    return [a for a in chosen if assign_verifier(a.seed, a.triple, verifiers) == me]


def too_late(epoch: int, current: int) -> bool:
    """Whether the checks of `epoch`'s commitments (selected under epoch + 1's seed) start too
    late at committee epoch `current`: the node may refuse their tickets by then
    (protocol/spotcheck.py, CHECK_LOOKBACK_EPOCHS), and a refused ticket is an accusation."""
    return epoch + 1 < current - CHECK_LOOKBACK_EPOCHS


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
        peers: PeerFindings | None = None,
        epochs: EpochFeed | None = None,
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
        self.judged: dict[Triple, TicketResult] = {}  # every ticket this verifier judged
        # evidence hash (0x hex) of a possible finding → (the selected check, that outcome)
        self.findable: dict[str, tuple[Assignment, Outcome]] = {}
        self.rejudged: set[str] = set()  # evidence hashes already looked at (or voted here)
        self.sets: dict[int, list[str]] = {}  # epoch checked → its verifier set (this in it)
        self.book = FindingBook(home / FINDINGS_DIR)  # FAILED findings, for the peers
        self.peers = peers  # fetching peers' findings (None: own tickets only)
        self.epochs = epochs  # the follower's `/epochs` readings (None: read them here)
        self.seen = 0  # the committee epoch of the last complete pass

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            failed = True
            try:
                # an epoch's checks wait up to the ticket deadline (30 s): a SIGTERM cancels
                # them (each finding is written whole; `last_epoch` moves past an epoch only
                # once its checks are done)
                await until_stopped(self.check_new_epochs(stop), stop)
                failed = False
            except Stopped:
                break
            except PlanetError as error:
                log.warning("spot checks: %s", error.message)
            except (KeyError, TypeError, ValueError, aiohttp.ClientError) as error:
                log.warning("spot checks: malformed committee answer: %r", error)
            await self._pause(stop, failed)

    async def _pause(self, stop: asyncio.Event, failed: bool) -> None:
        """Between passes: with a feed, until the follower sees an epoch after the last pass's
        begin (at once if it already did) or `stop` — at most one poll while peers' findings
        may need re-judging (`/verdicts`), IDLE_POLLS polls otherwise; without one, or after a
        failed pass, one poll."""
        if self.epochs is None or failed:
            await sleep_or_stop(stop, self.poll_s)
            return
        polls = 1 if self.findable else IDLE_POLLS
        await self.epochs.wait_past(self.seen, stop, self.poll_s * polls)

    async def _current(self) -> int:
        """The committee's epoch: the follower's recent reading, else `/epochs` read here."""
        known = self.epochs.recent() if self.epochs is not None else None
        if known is not None:
            return known
        return int((await self.link.query("/epochs"))["current"])

    async def check_new_epochs(self, stop: asyncio.Event) -> None:
        """One look at the committee: check every epoch closed since the last pass, then
        re-judge the peers' findings."""
        current = await self._current()
        if self.last_epoch == 0:
            self.last_epoch = max(0, current - 2)
        while self.last_epoch + 1 < current and not stop.is_set():
            epoch = self.last_epoch + 1
            if too_late(epoch, current):
                log.warning(
                    "spot checks epoch=%d skipped: the committee is at epoch %d, too "
                    "late for the nodes' tickets (this verifier fell behind)",
                    epoch,
                    current,
                )
            else:
                await self.check_epoch(epoch)
            self.last_epoch += 1
            current = await self._current()
        await self.rejudge(current)
        self.seen = current

    async def _blocks(self, nodes: Sequence[str], epoch: int) -> dict[str, int]:
        """Each node's committed blocks of `epoch` as the chain counts them (`/coverage`)."""
        out: dict[str, int] = {}
        for node in nodes:
            answer = await self.link.query("/coverage", node=node)
            count = 0
            for shard in answer.get("shards", []) if isinstance(answer, dict) else []:
                value = (shard.get("blocks") or {}).get(str(epoch), 0)
                count += value if type(value) is int and value > 0 else 0
            out[node] = count
        return out

    async def _commitments_of(self, node: str) -> list[object]:
        """Every retained commitment record of `node`, page by page (`/commitments` answers
        1 000 at a time), at most `MAX_COMMITMENT_PAGES` pages (past them: logged, the first
        ones checked). A page that is not {commitments: [objects], next} or whose `next` does
        not move on is `BadPage` (node/chain/committee_pages.py): the epoch's checks fail this
        pass by name, never run on a list cut short unseen."""
        records, whole = await read_pages(
            self.link.query,
            "/commitments",
            "commitments",
            max_pages=MAX_COMMITMENT_PAGES,
            node=node,
            limit=1000,
        )
        if not whole:
            log.warning(
                "commitments of node %s past %d pages are not checked this epoch",
                node[:16],
                MAX_COMMITMENT_PAGES,
            )
        return list(records)

    async def check_epoch(self, epoch: int) -> list[TicketResult]:
        """Do every check of `epoch`'s commitments assigned here; vote on findings."""
        params = await self.link.query("/params")
        genesis = params["genesis"]
        epoch_length = int(genesis["epoch_length"])
        floor = genesis.get("spot_check_floor", 1)
        floor = floor if type(floor) is int and floor >= 0 else 1
        records = (await self.link.query("/epochs", epoch=epoch + 1))["epochs"]
        if not records:
            return []
        commitments: list[object] = []
        keys = [str(node["key"]) for node in await self.link.nodes()]
        for key in keys:
            commitments += await self._commitments_of(key)
        chosen, verifiers = selections(
            records[0],
            commitments,
            epoch=epoch,
            epoch_length=epoch_length,
            rate_ppm=self.rate_ppm,
            floor=floor,
            blocks=await self._blocks(keys, epoch) if floor else None,
        )
        if self.me in verifiers:
            self.sets[epoch] = list(verifiers)
            self._index(chosen)  # a verifier outside the set gets no ticket: it re-judges none
        todo = [a for a in chosen if assign_verifier(a.seed, a.triple, verifiers) == self.me]
        results = []
        done: list[Triple] = []
        findings: dict[str, list[TicketResult]] = {}
        for item in todo:
            result = await self.judge(item, "spot check")
            if result is None:
                continue
            results.append(result)
            if result.outcome is Outcome.SKIPPED:
                continue  # other numerics: not recomputed, so neither reported nor a finding
            done.append(item.triple)
            if result.outcome.offence is not None:
                findings.setdefault(item.triple.node, []).append(result)
        log.info("spot checks epoch=%d assigned=%d done=%d", epoch, len(todo), len(results))
        for node, found in sorted(findings.items()):
            if (node, epoch) in self.accused:
                continue
            self.accused.add((node, epoch))  # one verdict per node and epoch: one slash
            failed = [r for r in found if r.outcome is Outcome.FAILED]
            chosen = (failed or found)[0]
            if chosen.evidence_hash is not None:
                self.rejudged.add("0x" + chosen.evidence_hash.hex())  # our own finding
            await self.vote(chosen, node, epoch)
        if done:
            await self.report(epoch, done)
        return results

    def _index(self, chosen: Sequence[Assignment]) -> None:
        """Remember the evidence a finding on each selected check would carry (recent epochs)."""
        for item in chosen:
            for outcome in (Outcome.FAILED, Outcome.TIMEOUT):
                ident = "0x" + evidence_hash(item.seed, item.triple, outcome).hex()
                self.findable[ident] = (item, outcome)
        oldest = max(a.epoch for a in chosen) - 3 if chosen else 0
        for ident, (item, _) in list(self.findable.items()):
            if item.epoch < oldest:
                del self.findable[ident]
        self.book.prune(oldest)
        for epoch in [e for e in self.sets if e < oldest]:
            del self.sets[epoch]

    async def judge(self, item: Assignment, what: str) -> TicketResult | None:
        """One check (own ticket request, recomputation), logged and counted once."""
        held = self.judged.get(item.triple)
        if held is not None:
            return held
        result = await self.check(item)
        if result is None:
            return None
        if result.statement and result.evidence_hash is not None:
            request = TicketRequest(item.triple, item.seed, self.me).signed(self.link.key)
            self._keep(item, request, result)  # ed25519 signs deterministically: as sent
        self._record(item, result, what)
        return result

    def _keep(self, item: Assignment, request: TicketRequest, result: TicketResult) -> None:
        """Hold a FAILED finding's node-signed statement for the peers of its epoch's set."""
        verifiers = self.sets.get(item.epoch)
        if verifiers and result.evidence_hash is not None:
            ident = "0x" + result.evidence_hash.hex()
            self.book.keep(ident, item.epoch, verifiers, request, result.statement)

    def _record(self, item: Assignment, result: TicketResult, what: str) -> None:
        self.judged[item.triple] = result
        counts = self.checked.setdefault(item.epoch, {})
        counts[result.outcome.value] = counts.get(result.outcome.value, 0) + 1
        self._write_counts()
        log.warning(
            "%s epoch=%d node=%s block=%d shard=%d outcome=%s %s",
            what,
            item.epoch,
            item.triple.node[:12],
            item.triple.block,
            item.triple.shard,
            result.outcome.value,
            result.reason,
        )

    async def forwarded(self, item: Assignment, ident: str) -> TicketResult | None:
        """Judge a finder's copy of the node's ticket for finding `ident` (the first peer of the
        epoch's set that hands one over); None when no peer does."""
        verifiers = self.sets.get(item.epoch, [])
        if self.peers is None or item.triple.shard >= len(self.shards) or not verifiers:
            return None
        answer = await self.link.query("/verifier_endpoints")
        urls = answer.get("endpoints", {}) if isinstance(answer, dict) else {}
        urls = urls if isinstance(urls, dict) else {}
        for peer in verifiers:
            if peer == self.me or peer not in urls:
                continue
            try:
                sealed = await self.peers.fetch(urls[peer], ident, self.me)
                request, statement, ticket = open_forwarded(sealed, self.link.key)
            except (PlanetError, aiohttp.ClientError, OSError, TimeoutError) as error:
                log.info("no finding from verifier %s: %s", peer[:12], str(error)[:160])
                continue
            if (request.triple, request.seed) != (item.triple, item.seed) or (
                request.verifier not in verifiers
            ):
                log.warning("verifier %s forwarded a ticket of another check", peer[:12])
                continue
            try:
                # the version of the epoch the block was committed in (a change takes effect
                # at a boundary: protocol/numerics.py), not the one the node announces today
                numerics = announced_at(await self.link.node(item.triple.node), item.epoch)
            except NumericsError as error:
                log.warning("node %s: %s; not judged", item.triple.node[:12], error.message)
                return None
            result = await asyncio.to_thread(
                judge_ticket,
                ticket,
                request,
                shard=self.shards[item.triple.shard],
                commitment=item.commitment,
                tolerance=self.tolerance,
                numerics=numerics,
            )
            if result.evidence_hash is not None:
                result = dataclasses.replace(result, statement=statement)
                self._keep(item, request, result)  # forwardable from here too
            self._record(item, result, f"re-judged spot check (forwarded by {peer[:12]})")
            return result
        return None

    async def rejudge(self, current: int | None = None) -> list[TicketResult]:
        """Re-judge every peer finding on chain (a `verdict_vote` whose evidence names a
        selected check of a recent epoch whose verifier set holds this verifier) — a FAILED one
        from a finder's forwarded copy of the node's ticket when one comes, else from an own
        ticket — and vote it too when this verifier finds the same; findings of epochs
        `too_late` at committee epoch `current` are left alone. Outside the set (its seed
        commit missed the window) the node rightly refuses this verifier's ticket: that
        refusal is no timeout."""
        if not self.findable:
            return []
        verdicts = (await self.link.query("/verdicts", confirmed="false"))["verdicts"]
        out = []
        for verdict in verdicts:
            ident = verdict.get("evidence_hash") if isinstance(verdict, dict) else None
            if not isinstance(ident, str) or ident in self.rejudged or ident not in self.findable:
                continue
            self.rejudged.add(ident)
            item, outcome = self.findable[ident]
            if current is not None and too_late(item.epoch, current):
                continue  # its ticket may be refused now: no accusation from lateness
            held = self.judged.get(item.triple)
            result = None
            if outcome is Outcome.FAILED and (held is None or held.outcome is Outcome.TIMEOUT):
                result = await self.forwarded(item, ident)  # the node's ticket, from a finder
            if result is None:
                result = await self.judge(item, "re-judged spot check")
            if result is None:
                continue
            out.append(result)
            mine = "0x" + result.evidence_hash.hex() if result.evidence_hash else None
            if result.outcome is not outcome:
                log.warning(
                    "peer finding not confirmed node=%s block=%d theirs=%s mine=%s",
                    item.triple.node[:12],
                    item.triple.block,
                    outcome.value,
                    result.outcome.value,
                )
            if mine is None or (mine != ident and mine in self.rejudged):
                continue  # passed here, or this verifier already voted its own finding
            self.rejudged.add(mine)
            self.accused.add((item.triple.node, item.epoch))
            await self.vote(result, item.triple.node, item.epoch)
        return out

    async def report(self, epoch: int, done: Sequence[Triple]) -> int | None:
        """Send the epoch's `spot_check_report`; the committed code (None: not sent)."""
        checks = sorted((t.node, t.session, t.block, t.shard) for t in done)[:MAX_SPOT_REPORT]
        try:
            code, text = await self.link.send(SpotCheckReport(epoch, tuple(checks)), timeout_s=15)
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
        try:
            numerics = announced_at(view, item.epoch)  # the version of the block's epoch
        except NumericsError as error:
            log.warning("spot check: node %s: %s; skipped", triple.node[:12], error.message)
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
            numerics=numerics,  # other than this release's: opened, not recomputed (SKIPPED)
        )

    def _write_counts(self) -> None:
        path = self.home / COUNTS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        table = {str(e): dict(sorted(c.items())) for e, c in sorted(self.checked.items())}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)
