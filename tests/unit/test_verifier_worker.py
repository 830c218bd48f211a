"""The verifier's epoch loop (node/verifier/worker.py) with in-process fakes of the committee
link, the gateway and the reference model: seeds are committed for the next epoch and revealed
after, challenges run only with a committed seed, the scores file names the substitute node
with C = 0 and the honest ones with 10^6, and a verdict vote follows agreed low scores."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from node.chain.committee_pages import BadPage
from node.verifier.asker import Asked
from node.verifier.echo import vocabulary_index
from node.verifier.report import SCORES_FILE
from node.verifier.scoring import Challenge, CredibilityMap
from node.verifier.worker import VerifierWorker, WorkerSettings, failed_verification_verdict
from protocol.committee.credit_dkg import DkgComplaint, DkgDeal, DkgJustify
from protocol.committee.verification import SeedCommit, SeedReveal, VerdictVote, seed_commitment
from protocol.credit_shares import CREDIT_SHARES_DIR
from protocol.eip712 import address_of
from tests.unit.test_verifier_echo import TEXTS, _gateway_doc

pytestmark = pytest.mark.unit

V = len(TEXTS)
A, B, S = "a" * 64, "b" * 64, "c" * 64
OPERATOR = bytes.fromhex("77" * 32)


class FakeReference:
    corpus_ids = list(range(V)) * 3
    vocab = vocabulary_index(TEXTS)

    def logits(self, ids: list[int]) -> torch.Tensor:
        rows = torch.arange(len(ids), dtype=torch.float32)[:, None]
        return torch.sin(rows * 0.7 + torch.arange(V, dtype=torch.float32)[None, :]) * 4


class FakeAsker:
    """Circuits alternate (A, B) honest and (A, S) where S's logits are far off."""

    def __init__(self) -> None:
        self.count = 0
        self.reference = FakeReference()

    async def ask(self, challenge: Challenge) -> Asked:
        self.count += 1
        logits = self.reference.logits(challenge.ids)
        nodes = (A, B) if self.count % 2 else (A, S)
        if nodes[1] == S:
            logits = torch.flip(logits, dims=[1])
        return Asked(_gateway_doc(challenge, logits), nodes)


@dataclass
class FakeLink:
    epoch: int = 3
    sent: list[Any] = field(default_factory=list)
    reputations: dict[str, Any] = field(default_factory=dict)
    queried: list[str] = field(default_factory=list)
    key: Any = field(
        default_factory=lambda: SimpleNamespace(
            verify_key=SimpleNamespace(encode=lambda: bytes(32))
        )
    )

    async def query(self, path: str, **params: Any) -> Any:
        self.queried.append(path)
        if path == "/epochs":
            if "epoch" in params:
                return {"epochs": [{"leader": "V0"}]}
            return {"current": self.epoch}
        if path == "/seeds":
            epoch = params["epoch"]
            committed = [b for b in self.sent if isinstance(b, SeedCommit) and b.epoch == epoch]
            return {"seeds": [{"signer": "00" * 32} for _ in committed]}
        if path == "/reputations":
            return {"reputations": self.reputations}
        if path == "/params":
            return {
                "genesis": {
                    "evm": {
                        "chain_id": 31337,
                        "committee_address": "0x" + "11" * 20,
                        "fraud_proofs_address": "0x" + "22" * 20,
                    }
                },
                "validators": [{"address": "V0", "operator": "0x" + "33" * 20}],
            }
        raise AssertionError(path)

    async def send(self, body: Any, *, timeout_s: float = 15) -> tuple[int, str]:
        self.sent.append(body)
        return 0, ""

    async def node(self, key: str) -> dict[str, Any]:
        return {"evm_address": "0x" + "44" * 20}


async def _step(worker: VerifierWorker) -> None:
    """One step and the chain txs it started (they run beside the challenges)."""
    await worker.step()
    await worker.settle()


def _worker(tmp_path, link: FakeLink, challenges: int = 4) -> VerifierWorker:
    settings = WorkerSettings(
        home=tmp_path,
        challenges_per_epoch=challenges,
        prompt_tokens=4,
        continuation_tokens=8,
        verdict_after=1,
        operator_key=OPERATOR,
        challenge_source="corpus",  # generated text: test_verifier_sampled.py
        sampled_per_epoch=0,
    )
    return VerifierWorker(settings, FakeReference(), CredibilityMap(8050, 16963), FakeAsker(), link)


async def _scored_through_epoch_4(tmp_path) -> tuple[FakeLink, VerifierWorker]:
    """A worker that committed its seed in epoch 3 and asked all of epoch 4's challenges."""
    link = FakeLink(epoch=3)
    worker = _worker(tmp_path, link)
    await _step(worker)
    link.epoch = 4
    for _ in range(5):
        await _step(worker)
    return link, worker


async def test_worker_commits_next_seed_and_skips_an_epoch_without_its_own_seed(tmp_path) -> None:
    link = FakeLink(epoch=3)
    worker = _worker(tmp_path, link)
    await _step(worker)
    [commit] = link.sent
    assert isinstance(commit, SeedCommit) and commit.epoch == 4
    assert commit.commitment == seed_commitment("00" * 32, 4, worker.seeds.get(4))
    assert worker.state is not None and worker.state.challenges == []
    assert not (tmp_path / SCORES_FILE).exists()


async def test_worker_challenges_scores_substitute_zero_reveals_and_votes(tmp_path) -> None:
    link, worker = await _scored_through_epoch_4(tmp_path)
    report = json.loads((tmp_path / SCORES_FILE).read_text())
    assert report["epoch"] == 4
    assert report["scores"] == {A: 1_000_000, B: 1_000_000, S: 0}
    # epoch 5: reveal 4's seed, commit 6's, vote on S (the chain agreed C < τ, and so do we)
    link.reputations = {
        S: {"window": [0], "last_epoch": 4},
        A: {"window": [1_000_000], "last_epoch": 4},
    }
    link.epoch = 5
    await _step(worker)
    kinds = [type(b) for b in link.sent]
    assert kinds == [SeedCommit, SeedCommit, SeedReveal, SeedCommit, VerdictVote]
    reveal = link.sent[2]
    assert reveal.epoch == 4 and bytes.fromhex(reveal.seed[2:]) == worker.seeds.get(4)
    vote = link.sent[-1]
    expected = failed_verification_verdict(
        "0x" + "44" * 20, S, 4, "0x" + "33" * 20, "0x" + "22" * 20
    )
    assert vote.evidence_hash == "0x" + expected.evidence_hash.hex()
    assert vote.challenger == "0x" + "33" * 20 and vote.offence == 3
    assert address_of(OPERATOR) != vote.challenger  # the leader's operator, agreed data
    await worker.open_epoch(6)
    await worker.settle()
    assert sum(isinstance(b, VerdictVote) for b in link.sent) == 1  # once per node


async def test_a_vote_waits_for_the_chain_to_agree_even_after_the_node_is_no_longer_asked(
    tmp_path,
) -> None:
    """The verifier scored S at 0 in epoch 4, but the chain had not yet agreed by epoch 5's turn
    (its window still empty there: a slow committee). S, untrusted, is unroutable from then on,
    so epoch 5 scores only A and B; once the chain's window holds S's 0, epoch 6's turn votes
    on the verifier's latest own score of S, not on the previous epoch's alone (where S is
    missing: the old code never voted, and the substitute kept its stake)."""
    link, worker = await _scored_through_epoch_4(tmp_path)
    assert worker.state is not None and worker.state.scores[S] == 0
    link.epoch = 5
    await _step(worker)  # epoch 5's turn: nothing agreed on chain yet
    assert not any(isinstance(b, VerdictVote) for b in link.sent)
    worker.state.scores = {A: 1_000_000, B: 1_000_000}  # S no longer routed to
    link.reputations = {S: {"window": [0], "last_epoch": 4}}
    link.epoch = 6
    await worker.open_epoch(6)
    await worker.settle()
    [vote] = [b for b in link.sent if isinstance(b, VerdictVote)]
    expected = failed_verification_verdict(
        "0x" + "44" * 20, S, 4, "0x" + "33" * 20, "0x" + "22" * 20
    )
    assert vote.evidence_hash == "0x" + expected.evidence_hash.hex()


async def test_a_worker_of_zero_challenges_asks_nothing_and_still_turns_its_seeds(
    tmp_path,
) -> None:
    """`--challenges-per-epoch 0` (a devnet's idle verifier, issue 41): no question is asked,
    no score written, yet each epoch's seeds are still committed and revealed (its spot checks
    of the epoch's blocks need them), and the worker idles between epochs."""
    link = FakeLink(epoch=3)
    worker = _worker(tmp_path, link, challenges=0)
    await _step(worker)
    link.epoch = 4
    for _ in range(3):
        await _step(worker)
    link.epoch = 5
    await _step(worker)
    assert worker.asker.count == 0  # type: ignore[attr-defined]
    assert worker.state is not None and worker.state.challenges == [] and not worker.state.pending
    assert not (tmp_path / SCORES_FILE).exists()
    kinds = [type(b) for b in link.sent]
    assert kinds == [SeedCommit, SeedCommit, SeedReveal, SeedCommit]


async def test_worker_result_finishing_after_its_epoch_counts_in_the_next(tmp_path) -> None:
    link = FakeLink(epoch=3)
    worker = _worker(tmp_path, link)
    await _step(worker)
    link.epoch = 4
    await _step(worker)  # epoch 4: (A, B) clean
    original = worker.asker.ask

    async def slow_ask(challenge: Challenge) -> Asked:
        asked = await original(challenge)
        link.epoch = 5  # epoch 4 closes while this (A, S) challenge runs
        return asked

    worker.asker.ask = slow_ask
    await _step(worker)
    report = json.loads((tmp_path / SCORES_FILE).read_text())
    assert report["epoch"] == 5 and report["scores"] == {}  # (A, S) alone: ambiguous
    assert worker.state is not None and worker.state.epoch == 5
    assert len(worker.state.results) == 1 and worker.last_scores == {A: 10**6, B: 10**6}


async def test_an_ambiguous_low_circuit_is_carried_once_and_blamed_when_its_partner_clears(
    tmp_path,
) -> None:
    """One challenge per epoch (a slow verifier): epoch 4 sees only (A, S) low — ambiguous —;
    epoch 5's clean (A, B) clears A, so S is blamed in epoch 5's report; epoch 6 does not carry
    the (A, S) result again (it was carried once) and says nothing of S."""
    link = FakeLink(epoch=3)
    worker = _worker(tmp_path, link)
    await _step(worker)
    worker.asker.count = 1  # the next circuit asked is (A, S)
    link.epoch = 4
    await _step(worker)
    report = json.loads((tmp_path / SCORES_FILE).read_text())
    assert (report["epoch"], report["scores"]) == (4, {})
    link.epoch = 5
    worker.asker.count = 0  # (A, B)
    await _step(worker)
    report = json.loads((tmp_path / SCORES_FILE).read_text())
    assert (report["epoch"], report["scores"]) == (5, {A: 10**6, B: 10**6, S: 0})
    link.epoch = 6
    worker.asker.count = 0  # (A, B)
    await _step(worker)
    report = json.loads((tmp_path / SCORES_FILE).read_text())
    assert (report["epoch"], report["scores"]) == (6, {A: 10**6, B: 10**6})


async def test_spot_check_findings_become_the_same_verdict_for_every_verifier(tmp_path) -> None:
    """A failed check → offence 3, a timeout → offence 4; evidence from the finding, nonce and
    challenger from agreed data: two verifiers' votes carry one verdict (the same struct hash
    signed by different operators). A passed check votes nothing."""
    from node.verifier.tickets import _result
    from protocol.eip712 import Verdict
    from protocol.spotcheck import Outcome, Triple
    from protocol.tickets import TicketRequest

    triple = Triple(S, "0x" + "55" * 32, 2, 1)
    request = TicketRequest(triple, "0x" + "66" * 32, "00" * 32)
    votes = []
    for index, operator in enumerate((OPERATOR, bytes.fromhex("78" * 32))):
        link = FakeLink(epoch=5)
        worker = _worker(tmp_path / str(index), link)
        worker.settings = WorkerSettings(home=tmp_path, operator_key=operator)
        for outcome in (Outcome.FAILED, Outcome.TIMEOUT, Outcome.PASSED):
            await worker.vote_spot_check(_result(request, outcome, "test"), S, 4)
        assert len(link.sent) == 2 and all(isinstance(b, VerdictVote) for b in link.sent)
        votes.append(link.sent)
    for first, second in zip(*votes, strict=True):
        assert (first.evidence_hash, first.verdict_nonce, first.challenger) == (
            second.evidence_hash,
            second.verdict_nonce,
            second.challenger,
        )
        assert first.signature != second.signature
    failed, timeout = votes[0]
    assert (failed.offence, timeout.offence) == (3, 4)
    assert failed.challenger == "0x" + "33" * 20 and failed.node == "0x" + "44" * 20
    verdict = Verdict(
        failed.node,
        3,
        bytes.fromhex(failed.evidence_hash[2:]),
        failed.challenger,
        failed.verdict_nonce,
        "0x" + "22" * 20,
    )
    assert verdict.nonce == int.from_bytes(verdict.evidence_hash[:8], "big")


async def test_worker_leaves_credit_keys_to_the_watcher(tmp_path) -> None:
    """The validator's watcher is the one process that takes part in the credit key periods'
    DKG (node/watcher/credit_dkg.py): the verifier's epoch turns send no DKG message, read no
    key period, and write no key share its ABCI app could sign with."""
    link = FakeLink(epoch=3)
    worker = _worker(tmp_path, link)
    await _step(worker)
    link.epoch = 4
    await _step(worker)
    dkg = (DkgDeal, DkgComplaint, DkgJustify)
    assert link.sent and not any(isinstance(b, dkg) for b in link.sent)
    assert "/credit_period" not in link.queried
    assert not (tmp_path / CREDIT_SHARES_DIR).exists()


async def test_worker_challenges_while_its_seed_txs_wait_for_their_blocks(tmp_path) -> None:
    """A busy committee takes seconds per block: the epoch's first challenge runs while the
    epoch's seed commit (of epoch 5) still waits for its block, not after it."""
    link = FakeLink(epoch=3)
    worker = _worker(tmp_path, link)
    await _step(worker)  # epoch 3: seed of 4 committed
    gate = asyncio.Event()
    sent_before = link.send

    async def slow_send(body: Any, *, timeout_s: float = 15) -> tuple[int, str]:
        await gate.wait()
        return await sent_before(body, timeout_s=timeout_s)

    link.send = slow_send  # type: ignore[method-assign]
    link.epoch = 4
    await worker.step()  # opens epoch 4 and runs its first challenge
    assert worker.state is not None and worker.state.epoch == 4 and len(worker.state.results) == 1
    assert [b.epoch for b in link.sent if isinstance(b, SeedCommit)] == [4]  # 5's waits
    gate.set()
    await worker.settle()
    assert [b.epoch for b in link.sent if isinstance(b, SeedCommit)] == [4, 5]


async def test_worker_commits_every_epochs_seed_while_a_long_challenge_runs(tmp_path) -> None:
    """Epochs shorter than one challenge (a slow box, a short-epoch devnet): while the first
    challenge of epoch 4 runs, the committee moves through epochs 5 and 6, and the seeds of 6
    and 7 are committed as those epochs begin — not skipped until the challenge ends (an epoch
    without this verifier's seed leaves the spot checks of the blocks before it to nobody)."""
    link = FakeLink(epoch=3)
    worker = _worker(tmp_path, link)
    worker.settings = dataclasses.replace(worker.settings, poll_s=0.01)
    await _step(worker)  # epoch 3: seed of 4 committed
    gate, asking = asyncio.Event(), asyncio.Event()
    answer = worker.asker.ask

    async def slow_ask(challenge: Challenge) -> Asked:
        asking.set()
        await gate.wait()
        return await answer(challenge)

    worker.asker.ask = slow_ask  # type: ignore[method-assign]
    link.epoch = 4
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    await asyncio.wait_for(asking.wait(), 5)  # epoch 4's first challenge is under way

    def committed() -> list[int]:
        return [b.epoch for b in link.sent if isinstance(b, SeedCommit)]

    for epoch in (5, 6):
        link.epoch = epoch
        for _ in range(200):
            if epoch + 1 in committed():
                break
            await asyncio.sleep(0.01)
    assert committed() == [4, 5, 6, 7]
    assert worker.state is not None and worker.state.epoch == 4  # still in its challenge
    gate.set()
    stop.set()
    await asyncio.wait_for(running, 5)


async def test_a_stop_cancels_the_running_challenge_at_once(tmp_path) -> None:
    """SIGTERM (the `stop` event) while a challenge waits on the gateway: `run` returns within
    a second, the challenge is cancelled (its clean-up runs), and the scores file keeps the last
    complete report — the cancelled challenge writes nothing (`planet devnet down` waited
    10 s for such a verifier, then killed it)."""
    link = FakeLink(epoch=3)
    worker = _worker(tmp_path, link)
    await _step(worker)
    link.epoch = 4
    await _step(worker)  # epoch 4's first challenge: a complete report
    before = (tmp_path / SCORES_FILE).read_bytes()
    asking, cancelled = asyncio.Event(), asyncio.Event()

    async def endless_ask(challenge: Challenge) -> Asked:
        asking.set()
        try:
            await asyncio.Event().wait()  # a gateway that never answers
        finally:
            cancelled.set()
        raise AssertionError("unreachable")

    worker.asker.ask = endless_ask  # type: ignore[method-assign]
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    await asyncio.wait_for(asking.wait(), 5)
    stop.set()
    await asyncio.wait_for(running, 1)
    assert cancelled.is_set()
    assert (tmp_path / SCORES_FILE).read_bytes() == before
    assert not list(tmp_path.glob(f".{SCORES_FILE}.*"))  # no temporary left behind


async def test_an_idle_worker_leaves_the_epoch_polling_to_follow_and_wakes_when_it_turns(
    tmp_path,
) -> None:
    """Between epochs (its challenges done) the worker reads `/epochs` once per poll — the
    `follow` loop's read — not twice (its own loop read it too, ~1 query a second per
    verifier for nothing), and still opens the next epoch within a few polls of its start."""
    link = FakeLink(epoch=3)
    worker = _worker(tmp_path, link)
    poll_s = 0.02
    worker.settings = dataclasses.replace(worker.settings, poll_s=poll_s)
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    await asyncio.sleep(0.2)  # epoch 3 opened (no seed of its own: nothing to ask)
    assert worker.state is not None and worker.state.epoch == 3 and not worker.state.pending
    before, started = link.queried.count("/epochs"), asyncio.get_running_loop().time()
    await asyncio.sleep(40 * poll_s)
    polls = link.queried.count("/epochs") - before
    elapsed = asyncio.get_running_loop().time() - started
    # follow's one read a poll (fewer on a loaded machine), not two
    assert 1 <= polls <= 1.25 * elapsed / poll_s + 2, (polls, elapsed)
    link.epoch = 4
    for _ in range(100):  # the worker and the feed it follows each turn within a few polls
        if worker.state.epoch == 4 and worker.epochs.current == 4:
            break
        await asyncio.sleep(poll_s)
    assert worker.state.epoch == 4 and worker.state.challenges  # 4's seed was committed in 3
    assert worker.epochs.current == 4  # what the spot checker waits on (spotchecks.py)
    stop.set()
    await asyncio.wait_for(running, 1)


@dataclass
class PagedReputationsLink(FakeLink):
    """`/reputations` a record a page (`after`, `next`), as the committee pages 1 000;
    `bad_page` replaces the second page."""

    bad_page: Any = None

    async def query(self, path: str, **params: Any) -> Any:
        if path != "/reputations":
            return await super().query(path, **params)
        self.queried.append(f"{path}?after={params.get('after')}")
        if params.get("after") is not None and self.bad_page is not None:
            return self.bad_page
        keys = sorted(k for k in self.reputations if k > params.get("after", ""))
        more = len(keys) > 1
        return {
            "reputations": {keys[0]: self.reputations[keys[0]]},
            "next": keys[0] if more else None,
        }


async def test_worker_votes_on_a_node_listed_past_the_first_reputations_page(tmp_path) -> None:
    """The verdict vote reads every page of `/reputations` (`read_reputations`): the node it
    measured below τ is on the third page; a malformed page is `BadPage` (logged by the
    caller) and no vote is made on a list it could not read."""
    records = {k: {"window": [0], "last_epoch": 4} for k in (A, B, S)}
    link = PagedReputationsLink(epoch=5, reputations=records)
    worker = _worker(tmp_path, link)
    worker.last_scores = {S: 0}
    await worker.maybe_vote_verdicts()
    [vote] = link.sent
    assert isinstance(vote, VerdictVote) and link.queried[:3] == [
        "/reputations?after=None",
        f"/reputations?after={A}",
        f"/reputations?after={B}",
    ]
    other = PagedReputationsLink(epoch=5, reputations=records, bad_page={"reputations": [S]})
    worker = _worker(tmp_path, other)
    worker.last_scores = {S: 0}
    with pytest.raises(BadPage):
        await worker.maybe_vote_verdicts()
    assert other.sent == []
