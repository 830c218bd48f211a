"""Numerics versions (protocol/numerics.py): parsed strictly where they cross a boundary
(`register_node`, committee node views), stored only when announced, and honoured by the
verifier: a node announcing other numerics than the verifier's is never convicted on a
fingerprint mismatch (its blocks are not comparable bitwise), while a node on the same
numerics, or an unannounced one (an older registration), still is."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch

from node.verifier import spotchecks
from node.verifier.spotchecks import COUNTS_FILE, SpotChecker
from node.verifier.tickets import judge_ticket, verdict_for
from protocol.committee.envelope import decode, sign
from protocol.committee.grammar import TxDecodeError
from protocol.committee.registry import RegisterNode
from protocol.fingerprint import Tolerance
from protocol.numerics import (
    MAX_NUMERICS,
    NUMERICS,
    NumericsError,
    announced,
    comparable,
    parse_numerics,
)
from protocol.spotcheck import Outcome
from tests.committee_chain import Chain, seeded_key
from tests.unit.test_abci_state import hexkey, node, register_body
from tests.unit.test_verifier_tickets import INPUTS, TOLERANCE, TinyShard, _request, _ticket

pytestmark = pytest.mark.unit

OTHER = NUMERICS + 1  # a release whose honest bits differ from this one's
HOSTILE = [0, -1, MAX_NUMERICS + 1, 2**64, True, False, 2.0, "2", None, [2], {"v": 2}]


# -- parsing -------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", HOSTILE, ids=ascii)
def test_parse_numerics_hostile_value_refused_by_name(value: Any) -> None:
    with pytest.raises(NumericsError, match=r"^node\.numerics: expected a numerics version"):
        parse_numerics(value, "node.numerics")


def test_parse_numerics_bounds_accepted() -> None:
    assert parse_numerics(1) == 1 and parse_numerics(MAX_NUMERICS) == MAX_NUMERICS
    assert parse_numerics(NUMERICS) == NUMERICS


@pytest.mark.parametrize("value", HOSTILE, ids=ascii)
def test_register_node_hostile_numerics_refused_by_name(value: Any) -> None:
    body = {**register_body("n").to_json(), "numerics": value}
    with pytest.raises(TxDecodeError, match=r"body\.numerics: expected an integer in \[1, 65535\]"):
        RegisterNode.from_json(body)


def test_register_node_hostile_numerics_refused_in_a_whole_tx() -> None:
    bad = dataclasses.replace(register_body("n"), numerics=0)
    raw = sign(bad, seeded_key("n"), 1).encode()
    with pytest.raises(TxDecodeError, match=r"body\.numerics"):
        decode(raw)


def test_register_node_without_numerics_parses_as_before_and_encodes_the_same() -> None:
    old = register_body("n").to_json()  # the body an older release signs
    assert "numerics" not in old
    parsed = RegisterNode.from_json(old)
    assert parsed.numerics is None
    assert parsed.to_json() == old  # same canonical bytes: old signatures still verify


def test_register_node_with_numerics_roundtrips() -> None:
    body = dataclasses.replace(register_body("n"), numerics=NUMERICS)
    raw = sign(body, seeded_key("n"), 1).encode()
    decoded = decode(raw)
    assert decoded.body.numerics == NUMERICS and decoded.encode() == raw
    decoded.verify()


def test_committee_stores_numerics_only_when_announced() -> None:
    chain = Chain()
    announced_key, old_key = seeded_key("new"), seeded_key("old")
    results = chain.block(
        [
            chain.tx(dataclasses.replace(register_body("new"), numerics=NUMERICS), announced_key),
            chain.tx(register_body("old"), old_key),
        ]
    )
    assert [r.code for r in results] == [0, 0], [r.log for r in results]
    assert node(chain, announced_key)["numerics"] == NUMERICS
    view = node(chain, old_key)
    assert "numerics" not in view and view["key"] == hexkey(old_key)
    assert announced(node(chain, announced_key)) == NUMERICS and announced(view) is None


def test_announced_refuses_a_malformed_view_field() -> None:
    with pytest.raises(NumericsError):
        announced({"numerics": "2"})
    assert announced(None) is None and announced({}) is None


def test_comparable_same_or_unannounced_only() -> None:
    assert comparable(NUMERICS) and comparable(None)
    assert not comparable(OTHER) and not comparable(NUMERICS - 1)


# -- the judge -----------------------------------------------------------------------------------


def _mismatching_ticket():
    """A ticket that opens its commitment but whose block differs from the recomputation on one
    position (what an honest node on other numerics can look like, and what a cheat does)."""
    shard = TinyShard()
    outputs = shard.forward(INPUTS, torch.arange(64), None).clone()
    outputs[0, 40] = outputs[0, 40] * 0.9
    ticket, commitment, _ = _ticket(outputs)
    return shard, ticket, commitment


def test_judge_mismatch_from_node_on_other_numerics_is_not_a_conviction() -> None:
    shard, ticket, commitment = _mismatching_ticket()
    result = judge_ticket(
        ticket, _request(), shard=shard, commitment=commitment, tolerance=TOLERANCE,
        numerics=OTHER,
    )  # fmt: skip
    assert result.outcome is Outcome.SKIPPED and result.outcome.offence is None
    assert result.evidence_hash is None and result.verdict is None
    assert f"numerics {OTHER}" in result.reason and f"with {NUMERICS}" in result.reason
    parties = {"node": "0x" + "11" * 20, "challenger": "0x" + "22" * 20}
    assert verdict_for(result, nonce=1, consumer="0x" + "33" * 20, **parties) is None


@pytest.mark.parametrize("numerics", [NUMERICS, None], ids=["same", "unannounced"])
def test_judge_mismatch_from_node_on_same_or_unannounced_numerics_still_fails(
    numerics: int | None,
) -> None:
    shard, ticket, commitment = _mismatching_ticket()
    result = judge_ticket(
        ticket, _request(), shard=shard, commitment=commitment, tolerance=TOLERANCE,
        numerics=numerics,
    )  # fmt: skip
    assert result.outcome is Outcome.FAILED and result.bad_positions == (40,)
    assert result.evidence_hash is not None


def test_judge_ticket_not_opening_its_commitment_fails_on_any_numerics() -> None:
    shard, ticket, _ = _mismatching_ticket()
    result = judge_ticket(
        ticket, _request(), shard=shard, commitment=b"\x00" * 32, tolerance=TOLERANCE,
        numerics=OTHER,
    )  # fmt: skip
    assert result.outcome is Outcome.FAILED and "does not open" in result.reason


# -- the live spot checker ------------------------------------------------------------------------


class _Link:
    """SpotChecker's committee queries: one node with two committed blocks, assigned here."""

    def __init__(self, view: dict[str, Any]) -> None:
        from tests.unit.test_verifier_spotchecks import ME

        self.key = ME
        self.view = view
        self.sent: list[object] = []

    async def send(self, body: object, *, timeout_s: float = 15) -> tuple[int, str]:
        self.sent.append(body)
        return 0, ""

    async def query(self, path: str, **params: object) -> dict:
        from tests.unit.test_verifier_spotchecks import _Link as Fixed

        return await Fixed.query(self, path, **params)  # type: ignore[arg-type]

    async def nodes(self) -> list[dict]:
        from tests.unit.test_verifier_spotchecks import NODE

        return [{"key": NODE}]

    async def node(self, key: str) -> dict:
        return {"key": key, "evm_address": "0x" + "00" * 20, **self.view}


async def _run_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, view: dict[str, Any]
) -> tuple[list[Outcome], list[Outcome], _Link]:
    """check_epoch(2) where every ticket the node hands over is the mismatching one, judged by
    the real `judge_ticket` with what the checker passes as the node's numerics."""
    from tests.unit.test_verifier_spotchecks import _hex

    shard, ticket, commitment = _mismatching_ticket()

    async def fake_spot_check(http, endpoint, request, key, **kw):  # the HTTP part only
        assert kw["shard"] is shard
        return judge_ticket(
            ticket, _request(), shard=shard, commitment=commitment, tolerance=TOLERANCE,
            numerics=kw["numerics"],
        )  # fmt: skip

    monkeypatch.setattr(spotchecks, "spot_check", fake_spot_check)
    votes: list[Outcome] = []

    async def vote(result, node_key, epoch) -> None:
        votes.append(result.outcome)

    link = _Link({"endpoint": "http://127.0.0.1:1", **view})
    link.verifiers = [_hex(link.key)]  # type: ignore[attr-defined]
    link.verdicts = []  # type: ignore[attr-defined]
    async with aiohttp.ClientSession() as http:
        checker = SpotChecker(
            link, [shard, shard], Tolerance(2, 900, 500), http, vote, home=tmp_path,
            rate_ppm=10**6,
        )  # type: ignore[arg-type]  # fmt: skip
        results = await checker.check_epoch(2)
    return [r.outcome for r in results], votes, link


async def test_spot_checker_node_on_other_numerics_is_skipped_not_voted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="node.verifier.spotchecks")
    outcomes, votes, link = await _run_epoch(tmp_path, monkeypatch, {"numerics": OTHER})
    assert outcomes == [Outcome.SKIPPED, Outcome.SKIPPED]
    assert votes == [] and link.sent == []  # no verdict, no report of checks not done
    assert json.loads((tmp_path / COUNTS_FILE).read_text()) == {"2": {"skipped": 2}}
    line = f"numerics mismatch: node computes with numerics {OTHER}, this release with {NUMERICS}"
    logged = [r.getMessage() for r in caplog.records]
    assert any(line in m and "outcome=skipped" in m for m in logged)


@pytest.mark.parametrize("view", [{"numerics": NUMERICS}, {}], ids=["same", "unannounced"])
async def test_spot_checker_node_on_same_or_unannounced_numerics_is_voted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, view: dict[str, Any]
) -> None:
    outcomes, votes, link = await _run_epoch(tmp_path, monkeypatch, view)
    assert outcomes == [Outcome.FAILED, Outcome.FAILED]
    assert votes == [Outcome.FAILED]  # one verdict per node and epoch
    assert len(link.sent) == 1  # the epoch's spot_check_report


@pytest.mark.parametrize(
    ("view", "expected"),
    [
        # computed on OTHER in epoch 2, on this release's from epoch 3: epoch 2's blocks are
        # not comparable bitwise (judging them under today's version would fail an honest node)
        ({"numerics": NUMERICS, "numerics_epoch": 3, "numerics_previous": OTHER}, "skipped"),
        # the reverse: on this release's numerics in epoch 2, since moved away: still judged
        ({"numerics": OTHER, "numerics_epoch": 3, "numerics_previous": NUMERICS}, "voted"),
        # a change pending for epoch 3 leaves epoch 2 on the version in effect then
        ({"numerics": NUMERICS, "numerics_next": {"epoch": 3, "numerics": OTHER}}, "voted"),
    ],
    ids=["changed-to-ours", "changed-from-ours", "pending"],
)
async def test_spot_checker_judges_a_block_under_the_numerics_of_its_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, view: dict[str, Any], expected: str
) -> None:
    outcomes, votes, _ = await _run_epoch(tmp_path, monkeypatch, view)
    if expected == "skipped":
        assert outcomes == [Outcome.SKIPPED, Outcome.SKIPPED] and votes == []
    else:
        assert outcomes == [Outcome.FAILED, Outcome.FAILED] and votes == [Outcome.FAILED]


async def test_spot_checker_malformed_numerics_on_chain_is_not_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcomes, votes, _ = await _run_epoch(tmp_path, monkeypatch, {"numerics": "2"})
    assert outcomes == [] and votes == []


# -- the operator's view --------------------------------------------------------------------------


def test_status_numerics_line_names_a_mismatch() -> None:
    from node.cli.operator import numerics_line

    assert numerics_line({"numerics": NUMERICS}) == f"{NUMERICS} (this release's)"
    assert "not announced" in numerics_line({})
    line = numerics_line({"numerics": OTHER})
    assert f"numerics {OTHER}" in line and f"this release with {NUMERICS}" in line
    assert "\n" not in line


# -- the sampled check ---------------------------------------------------------------------------


async def test_sampled_circuit_with_a_node_on_other_numerics_is_not_scored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The replay needs the circuit's logits bit for bit: S (whose answers mismatch) announces
    other numerics, so its circuit is logged and left unscored instead of scoring S 0."""
    from node.verifier.report import SCORES_FILE
    from node.verifier.scoring import CredibilityMap
    from node.verifier.worker import VerifierWorker, WorkerSettings
    from tests.unit.test_verifier_sampled import SampledReference, SamplingAsker, _skip
    from tests.unit.test_verifier_worker import A, B, FakeLink, S

    class Link(FakeLink):
        async def node(self, key: str) -> dict[str, Any]:
            return {"evm_address": "0x" + "44" * 20, "numerics": OTHER if key == S else NUMERICS}

    caplog.set_level("WARNING", logger="node.verifier.worker")
    link = Link(epoch=3)
    settings = WorkerSettings(
        home=tmp_path, challenges_per_epoch=2, prompt_tokens=4, continuation_tokens=8,
        operator_key=None, sampled_per_epoch=2, sampled_tokens=48,
    )  # fmt: skip
    worker = VerifierWorker(
        settings, SampledReference(), CredibilityMap(8050, 16963), SamplingAsker(), link
    )
    worker.run_challenge = _skip  # type: ignore[method-assign]
    await worker.step()
    await worker.settle()
    link.epoch = 4
    for _ in range(6):
        await worker.step()
    scores = json.loads((tmp_path / SCORES_FILE).read_text())
    assert scores["scores"] == {A: 1_000_000, B: 1_000_000}  # S neither scored nor blamed
    line = f"numerics mismatch: node computes with numerics {OTHER}, this release with {NUMERICS}"
    assert any("not scored" in r.getMessage() and line in r.getMessage() for r in caplog.records)


def test_a_skipped_check_is_no_evidence() -> None:
    from protocol.spotcheck import SelectionError, evidence_hash

    with pytest.raises(SelectionError, match="a skipped check is no evidence"):
        evidence_hash("0x" + "00" * 32, _request().triple, Outcome.SKIPPED)
