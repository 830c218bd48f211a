"""`planet verifier serve`: a validator operator's verifier, epoch after epoch.

Per committee epoch e (followed through `/epochs` on the committee RPC):

1. seeds: reveal the seed of e−1 (`seed_reveal`), commit a fresh secret seed for e+1
   (`seed_commit`), both signed with the validator's consensus key; credit keys: generate the
   RSA blind-signing keys of e and e+1 into `<home>/credit_keys/` and publish them
   (`credit_key`) unless already on chain;
2. challenges: when this verifier's seed for e is on chain, derive `challenges_per_epoch`
   windows of natural text from it (`challenges.epoch_challenges`) and ask each through the
   gateway as a paying user (`asker.GatewayAsker`: echo + logprobs, receipt names the circuit);
3. score each answer teacher-forced against its own reference pass (`echo.echo_gap` → the
   calibrated `echo_map` → C), attribute circuit scores to nodes (`attribution.attribute`) and
   rewrite `<home>/reputation_scores.json` for epoch e after every challenge; the validator's
   ExtendVote at e's last height carries it (docs/committee.md, "Vote extensions");
4. verdicts: when the chain's agreed window for a node holds `verdict_after` consecutive
   credibilities below τ and this verifier's own latest score agrees, it votes
   `verdict_vote(Verdict(node EVM address, FAILED_VERIFICATION, evidence, challenger, nonce))`
   with every field derived from agreed chain data (`failed_verification_verdict`), so all
   honest verifiers vote for the same verdict id (its confirmation needs ≥ 2/3 of the power).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.verifier.asker import GatewayAsker
from node.verifier.attribution import CircuitScore, attribute
from node.verifier.challenges import epoch_challenges
from node.verifier.echo import EchoAnswerError, echo_gap, parse_echo
from node.verifier.reference import Reference
from node.verifier.report import SCORES_FILE, write_scores
from node.verifier.scoring import Challenge, CredibilityMap
from node.verifier.seedbook import SeedBook
from node.verifier.tickets import TicketResult, verdict_for
from protocol.committee.credits import CreditKey
from protocol.committee.verification import SeedCommit, SeedReveal, VerdictVote, seed_commitment
from protocol.credit_keys import CREDIT_KEYS_DIR, CreditKeyStore
from protocol.eip712 import OFFENCE_FAILED_VERIFICATION, Verdict, address_of, committee_domain
from protocol.errors import PlanetError

log = logging.getLogger(__name__)

TAU = 300_000  # C below this is abnormal (genesis reputation.tau default)


@dataclass(frozen=True)
class WorkerSettings:
    home: Path  # the validator's CometBFT home (reputation_scores.json, consensus key)
    challenges_per_epoch: int = 4
    prompt_tokens: int = 32
    continuation_tokens: int = 64
    poll_s: float = 0.5
    verdict_after: int = 1  # consecutive agreed epochs below τ before a verdict vote
    operator_key: bytes | None = None  # secp256k1 key that signs verdicts (None: no verdicts)
    spot_check_ppm: int = 50_000  # spot-check selection rate (the nodes' --spot-check-ppm)
    ticket_deadline_s: float = 30.0  # no valid ticket by then: TIMEOUT (offence 4)


@dataclass
class EpochState:
    epoch: int
    challenges: list[Challenge] = field(default_factory=list)
    next_index: int = 0
    results: list[CircuitScore] = field(default_factory=list)
    scores: dict[str, int] = field(default_factory=dict)


def failed_verification_verdict(
    node_evm_address: str, node_key: str, last_epoch: int, challenger: str, consumer: str
) -> Verdict:
    """The one verdict every honest verifier derives from the same agreed chain data."""
    evidence = hashlib.sha256(
        b"planet/failed-verification/v1" + bytes.fromhex(node_key) + last_epoch.to_bytes(8, "big")
    ).digest()
    return Verdict(
        node=node_evm_address,
        offence=OFFENCE_FAILED_VERIFICATION,
        evidence_hash=evidence,
        challenger=challenger,
        nonce=int.from_bytes(evidence[:8], "big"),
        consumer=consumer,
    )


class VerifierWorker:
    def __init__(
        self,
        settings: WorkerSettings,
        reference: Reference,
        credibility: CredibilityMap,
        asker: GatewayAsker,
        link: Any,  # node.chain.committee_link.CommitteeLink with the consensus key
    ) -> None:
        self.settings = settings
        self.reference = reference
        self.credibility = credibility
        self.asker = asker
        self.link = link
        self.signer = link.key.verify_key.encode().hex()
        self.seeds = SeedBook(settings.home / "verifier" / "seeds.json")
        self.credit_keys = CreditKeyStore(settings.home / CREDIT_KEYS_DIR)
        self.validator_address = (
            hashlib.sha256(link.key.verify_key.encode()).digest()[:20].hex().upper()
        )
        self.state: EpochState | None = None
        self.last_scores: dict[str, int] = {}  # the previous epoch's attribution
        self.voted: set[str] = set()
        self.verdicts_disabled = settings.operator_key is None

    # -- the loop --------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.step()
            except PlanetError as error:
                log.warning("verifier step failed: %s", error.message)
                await _sleep(stop, 2.0)
                continue
            if self.state is not None and self.state.next_index >= len(self.state.challenges):
                await _sleep(stop, self.settings.poll_s)

    async def step(self) -> None:
        epoch = await self.current_epoch()
        if self.state is None or epoch != self.state.epoch:
            await self.open_epoch(epoch)
        state = self.state
        assert state is not None
        if state.next_index < len(state.challenges):
            challenge = state.challenges[state.next_index]
            state.next_index += 1
            await self.run_challenge(state, challenge)

    async def current_epoch(self) -> int:
        answer = await self.link.query("/epochs")
        return int(answer["current"])

    async def open_epoch(self, epoch: int) -> None:
        if self.state is not None:
            self.last_scores = dict(self.state.scores)
        self.state = EpochState(epoch)
        await self.seed_turn(epoch)
        await self.credit_key_turn(epoch)
        mine = [s for s in (await self.link.query("/seeds", epoch=epoch))["seeds"]]
        committed = any(s.get("signer") == self.signer for s in mine)
        seed = self.seeds.get(epoch)
        if committed and seed is not None:
            self.state.challenges = epoch_challenges(
                self.reference.corpus_ids,
                seed,
                epoch,
                count=self.settings.challenges_per_epoch,
                prompt_tokens=self.settings.prompt_tokens,
                continuation_tokens=self.settings.continuation_tokens,
            )
        log.info(
            "epoch=%d challenges=%d (seed committed: %s)",
            epoch,
            len(self.state.challenges),
            committed,
        )
        await self.maybe_vote_verdicts()

    async def seed_turn(self, epoch: int) -> None:
        """Reveal e−1's seed, commit e+1's (each failure is logged, never fatal)."""
        previous = self.seeds.get(epoch - 1)
        if previous is not None and epoch > 1:
            await self._send(SeedReveal(epoch - 1, "0x" + previous.hex()), "seed_reveal")
        following = self.seeds.ensure(epoch + 1)
        value = seed_commitment(self.signer, epoch + 1, following)
        await self._send(SeedCommit(epoch + 1, value), "seed_commit")

    async def credit_key_turn(self, epoch: int) -> None:
        """Publish this validator's credit keys of e and e+1 (`credit_key`) unless on chain:
        generated once into `<home>/credit_keys/`, where the ABCI app signs mints with them."""
        for target in (epoch, epoch + 1):
            published = (await self.link.query("/credit_keys", epoch=target))["keys"]
            if any(k["validator"] == self.validator_address for k in published):
                continue
            private = await asyncio.to_thread(self.credit_keys.ensure, target)  # RSA keygen
            await self._send(CreditKey(target, private.public.to_der()), "credit_key")

    async def _send(self, body: Any, what: str) -> int | None:
        try:
            sent = await self.link.submit(body)
            code, text = await self.link.committed_code(sent.hash, timeout_s=15)
        except PlanetError as error:
            log.warning("%s not sent: %s", what, error.message)
            return None
        if code != 0:
            log.info("%s refused code=%d %s", what, code, text)
        return code

    # -- one challenge ---------------------------------------------------------------------------
    async def run_challenge(self, state: EpochState, challenge: Challenge) -> None:
        try:
            asked = await self.asker.ask(challenge)
            answer = parse_echo(asked.doc, challenge, self.reference.vocab)
        except EchoAnswerError as error:
            log.warning("challenge answer malformed: %s", error.message)
            return
        except PlanetError as error:
            log.warning("challenge not served: %s", error.message)
            return
        reference = await asyncio.to_thread(self.reference.logits, challenge.ids)
        gap = echo_gap(challenge, answer, reference)
        credibility = self.credibility.credibility(gap)
        # A result counts for the epoch whose report is still open when it is known: one that
        # finishes after its epoch closed goes into the next epoch's report (counted once).
        epoch = await self.current_epoch()
        if epoch != state.epoch:
            await self.open_epoch(epoch)
            assert self.state is not None
            state = self.state
        state.results.append(CircuitScore(asked.nodes, credibility))
        log.info(
            "challenge epoch=%d circuit=%s kl=%.6f top1=%.2f C=%d",
            state.epoch,
            [n[:12] for n in asked.nodes],
            gap.kl,
            gap.top1,
            credibility,
        )
        state.scores = attribute(state.results)
        write_scores(self.settings.home / SCORES_FILE, state.epoch, state.scores)

    # -- verdicts --------------------------------------------------------------------------------
    async def maybe_vote_verdicts(self) -> None:
        if self.verdicts_disabled or not self.last_scores:
            return
        reputations = (await self.link.query("/reputations"))["reputations"]
        for key, record in sorted(reputations.items()):
            window: Sequence[int] = record.get("window") or []
            recent = list(window)[-self.settings.verdict_after :]
            if len(recent) < self.settings.verdict_after or max(recent) >= TAU:
                continue
            if self.last_scores.get(key, TAU) >= TAU or key in self.voted:
                continue  # our own measurement must agree
            await self.vote(key, int(record["last_epoch"]))

    async def vote(self, node_key: str, last_epoch: int) -> None:
        context = await self._verdict_context(node_key, last_epoch)
        if context is None:
            return
        evm_address, challenger, consumer = context
        verdict = failed_verification_verdict(
            evm_address, node_key, last_epoch, challenger, consumer
        )
        await self._submit_verdict(verdict, node_key)

    async def vote_spot_check(self, result: TicketResult, node_key: str, epoch: int) -> None:
        """Vote the verdict of a failed (offence 3) or timed-out (offence 4) spot check of a
        block committed in `epoch`: evidence from the finding (`protocol.spotcheck.
        evidence_hash`), challenger = `epoch`'s leader's operator, nonce = the evidence's
        first 8 bytes — agreed data, so every verifier with the same finding votes one id."""
        if self.verdicts_disabled or result.evidence_hash is None:
            return
        context = await self._verdict_context(node_key, epoch)
        if context is None:
            return
        evm_address, challenger, consumer = context
        nonce = int.from_bytes(result.evidence_hash[:8], "big")
        verdict = verdict_for(
            result, node=evm_address, challenger=challenger, nonce=nonce, consumer=consumer
        )
        if verdict is not None:
            await self._submit_verdict(verdict, node_key, remember=False)

    async def _verdict_context(self, node_key: str, epoch: int) -> tuple[str, str, str] | None:
        """(node EVM address, challenger, FraudProofs address), or None (no verdicts)."""
        operator_key = self.settings.operator_key
        if operator_key is None:
            return None
        params = await self.link.query("/params")
        evm = params["genesis"].get("evm") or {}
        consumer = evm.get("fraud_proofs_address")
        if not consumer:
            log.info("verdicts disabled: genesis has no evm.fraud_proofs_address")
            self.verdicts_disabled = True
            return None
        view = await self.link.node(node_key)
        if view is None:
            return None
        challenger = await self.challenger(params, epoch) or address_of(operator_key)
        return str(view["evm_address"]), challenger, str(consumer)

    async def _submit_verdict(self, verdict: Verdict, node_key: str, remember: bool = True) -> None:
        operator_key = self.settings.operator_key
        assert operator_key is not None
        params = await self.link.query("/params")
        evm = params["genesis"].get("evm") or {}
        domain = committee_domain(int(evm["chain_id"]), evm["committee_address"])
        body = VerdictVote(
            node=verdict.node,
            offence=verdict.offence,
            evidence_hash="0x" + verdict.evidence_hash.hex(),
            challenger=verdict.challenger,
            verdict_nonce=verdict.nonce,
            signature="0x" + verdict.sign(operator_key, domain).hex(),
        )
        code = await self._send(body, "verdict_vote")
        log.warning(
            "verdict vote node=%s offence=%d id=0x%s code=%s",
            node_key[:12],
            verdict.offence,
            verdict.struct_hash().hex(),
            code,
        )
        if remember:
            self.voted.add(node_key)

    async def challenger(self, params: dict[str, Any], epoch: int) -> str | None:
        """The operator of `epoch`'s leader: agreed data, so every verifier names the same."""
        records = (await self.link.query("/epochs", epoch=epoch))["epochs"]
        leader = records[0].get("leader") if records else None
        for validator in params.get("validators", []):
            if validator.get("address") == leader and validator.get("operator"):
                return str(validator["operator"])
        return None


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
