"""Vote extensions: sign bytes, the injected extended commit, ≥ 2/3 checks, median scores."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from abci_app import extensions
from abci_app.app import SCORES_MAX_AGE_EPOCHS, CommitteeApp
from abci_app.codes import Code
from abci_app.encoding import encode_uvarint
from abci_app.proto import abci_pb, canonical_pb
from abci_app.queries import query
from protocol.committee.registry import RegisterNode, sign_registration
from protocol.eip712 import address_of
from tests.committee_chain import CHAIN_ID, Chain, seeded_evm_key, seeded_key

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("height", "round_", "extension", "chain_id"),
    [(5, 0, b'{"epoch":1,"scores":{}}', "planet"), (1, 3, b"", "c"), (2**40, 0, b"\x00" * 300, "")],
)
def test_extensions_sign_bytes_match_cometbft_canonical_proto(
    height: int, round_: int, extension: bytes, chain_id: str
) -> None:
    message = canonical_pb().CanonicalVoteExtension(
        extension=extension, height=height, round=round_, chain_id=chain_id
    )
    body = message.SerializeToString(deterministic=True)
    expected = encode_uvarint(len(body)) + body
    assert extensions.vote_extension_sign_bytes(chain_id, height, round_, extension) == expected


def test_extensions_weighted_lower_median() -> None:
    assert extensions.weighted_lower_median([(5, 10), (1, 10), (3, 10), (9, 10)]) == 3
    assert extensions.weighted_lower_median([(5, 1), (1, 1), (9, 10)]) == 9
    assert extensions.weighted_lower_median([(7, 3)]) == 7


def test_extensions_agreed_scores_need_two_thirds_reporting_power() -> None:
    powers = {"A": 10, "B": 10, "C": 10, "D": 10}
    report = extensions.Report
    reports = {
        "A": report({"n": 1, "m": 5}),
        "B": report({"n": 2}),
        "C": report({"n": 3}),
        "D": report({}),
    }
    assert extensions.agreed_scores(reports, powers, 40) == {"n": 2}


def test_extensions_invalid_reports_zero_only_above_one_third() -> None:
    powers = {"A": 10, "B": 10, "C": 10, "D": 10}
    report = extensions.Report
    # only the leader reports "x" invalid: ignored, the others' scores stand
    one = {
        "A": report({}, ("x",)),
        "B": report({"x": 9}),
        "C": report({"x": 9}),
        "D": report({"x": 9}),
    }
    assert extensions.agreed_scores(one, powers, 40) == {"x": 9}
    # two of four (> 1/3 of the power) report it invalid: C = 0 for the epoch
    two = {
        "A": report({}, ("x",)),
        "B": report({}, ("x",)),
        "C": report({"x": 9}),
        "D": report({"x": 9}),
    }
    assert extensions.agreed_scores(two, powers, 40) == {"x": 0}


def test_extensions_parse_rejects_bad_format() -> None:
    ok = extensions.encode_extension(2, {"ab" * 32: 5}, ("cd" * 32,))
    assert extensions.parse_extension(ok, 10, 5) == extensions.Report({"ab" * 32: 5}, ("cd" * 32,))
    assert extensions.parse_extension(b"", 7, 5) == extensions.EMPTY_REPORT
    bad = [
        (ok, 11),  # not an epoch-closing height
        (extensions.encode_extension(3, {}), 10),  # wrong epoch
        (b'{"epoch":2,"invalid":[],"scores":{"zz":1}}', 10),
        (b'{"epoch":2,"invalid":[],"scores":{"' + b"ab" * 32 + b'":1000001}}', 10),
        (b'{"epoch":2,"invalid":["' + b"ab" * 32 + b'"],"scores":{"' + b"ab" * 32 + b'":1}}', 10),
        (b'{"epoch":2,"invalid":["' + b"cd" * 32 + b'","' + b"ab" * 32 + b'"],"scores":{}}', 10),
        (b'{"epoch":2,"scores":{}}', 10),  # no invalid list
        (b'{"epoch": 2, "invalid": [], "scores": {}}', 10),  # not canonical
        (b"nope", 10),
    ]
    for raw, height in bad:
        with pytest.raises(extensions.VoteExtensionError):
            extensions.parse_extension(raw, height, 5)


def test_extensions_process_proposal_requires_vx_exactly_when_due() -> None:
    chain = Chain()  # epoch_length 5, extensions from height 1
    chain.advance_to(5)
    assert chain.machine.vx_required(6)
    assert not chain.machine.vx_required(5) and not chain.machine.vx_required(7)
    ok, reason = chain.machine.process_proposal(6, [])
    assert not ok and "missing" in reason
    vx = chain.extended_commit(5)
    assert chain.machine.process_proposal(6, [vx]) == (True, "")
    ok, reason = chain.machine.process_proposal(6, [vx, vx])
    assert not ok and "unexpected" in reason
    chain.block()  # height 6
    ok, _ = chain.machine.process_proposal(7, [chain.extended_commit(6)])
    assert not ok


def test_extensions_process_proposal_rejects_bad_signature() -> None:
    chain = Chain()
    chain.advance_to(5)
    scores = {i: {"ab" * 32: 1} for i in range(4)}
    commit = extensions.decode_vx_tx(chain.extended_commit(5, scores))
    lowered = extensions.encode_extension(1, {"ab" * 32: 0})
    forged_vote = dataclasses.replace(commit.votes[0], extension=lowered)
    forged = dataclasses.replace(commit, votes=(forged_vote, *commit.votes[1:])).encode()
    ok, reason = chain.machine.process_proposal(6, [forged])
    assert not ok and "bad extension signature" in reason


def test_extensions_process_proposal_rejects_below_two_thirds() -> None:
    chain = Chain()
    chain.advance_to(5)
    commit = extensions.decode_vx_tx(chain.extended_commit(5))
    absent = [
        dataclasses.replace(v, extension=b"", signature=b"", flag=1) for v in commit.votes[:2]
    ]
    two_of_four = dataclasses.replace(commit, votes=(*absent, *commit.votes[2:])).encode()
    ok, reason = chain.machine.process_proposal(6, [two_of_four])
    assert not ok and "below 2/3" in reason
    three_of_four = dataclasses.replace(commit, votes=(*absent[:1], *commit.votes[1:])).encode()
    assert chain.machine.process_proposal(6, [three_of_four]) == (True, "")


def register_compute(chain: Chain, label: str) -> str:
    key = seeded_key(label)
    evm = seeded_evm_key(label)
    node = key.verify_key.encode().hex()
    body = RegisterNode(
        address_of(evm), sign_registration(evm, node), "compute", "m", (0,), "http://x", 1
    )
    assert chain.block([chain.tx(body, key)])[0].code == 0
    return node


def test_extensions_median_scores_update_reputation_at_epoch_start() -> None:
    chain = Chain()
    node = register_compute(chain, "n1")
    lonely = register_compute(chain, "n2")
    chain.advance_to(5)
    # one byzantine validator reports 0; the lower median of [0, 600k, 800k, 900k] is 600k
    scores = {
        0: {node: 800_000, lonely: 10},
        1: {node: 600_000},
        2: {node: 900_000},
        3: {node: 0, lonely: 10},
    }
    chain.block(scores=scores)  # height 6 carries epoch 1's extensions
    reps = json.loads(query(chain.state, "/reputations", b"")[1])["reputations"]
    # 0.4·0.5 + 0.6·0.6 = 0.56
    assert reps[node]["r"] == 560_000 and reps[node]["window"] == [600_000]
    assert reps[lonely]["r"] == 500_000  # reported by only 2 of 4: unchanged
    [epoch] = json.loads(query(chain.state, "/epochs?epoch=1", b"")[1])["epochs"]
    assert epoch["reputation_applied"] == 1


def test_extensions_invalid_by_two_validators_counts_as_zero_credibility() -> None:
    chain = Chain()
    node = register_compute(chain, "n1")
    chain.advance_to(5)
    chain.block(scores={2: {node: 900_000}, 3: {node: 900_000}}, invalid={0: (node,), 1: (node,)})
    reps = json.loads(query(chain.state, "/reputations", b"")[1])["reputations"]
    assert reps[node]["r"] == 200_000 and reps[node]["window"] == [0]  # 0.4·0.5 + 0.6·0


def test_extensions_repeated_low_scores_mark_node_untrusted() -> None:
    chain = Chain()
    node = register_compute(chain, "n1")
    for epoch in range(1, 4):
        chain.advance_to(5 * epoch)
        chain.block(scores={i: {node: 100_000} for i in range(4)})
    reps = json.loads(query(chain.state, "/reputations", b"")[1])["reputations"]
    # e1: 0.2 + 0.06 = 0.26; e2 (c=2, 6/17): 0.104 + 0.0352941 = 0.1392941;
    # e3 (c=3, 6/22): 0.05571764 + 0.02727272 = 0.08299036 → 82990
    assert reps[node]["r"] == 82_990
    assert reps[node]["untrusted"] is True
    info = json.loads(query(chain.state, f"/node?key={node}", b"")[1])
    assert info["untrusted"] is True and info["routable"] is False


def test_extensions_app_extend_vote_reads_local_scores_file(tmp_path: Path) -> None:
    pb = abci_pb()
    chain = Chain()
    app = CommitteeApp(chain.machine, tmp_path)
    node, other = "ab" * 32, "cd" * 32
    empty = b'{"epoch":1,"invalid":[],"scores":{}}'
    assert app.extend_vote(pb.RequestExtendVote(height=5)).vote_extension == empty
    doc = {"epoch": 1, "scores": {node: 7}, "invalid": [other]}
    (tmp_path / "reputation_scores.json").write_text(json.dumps(doc))
    extension = app.extend_vote(pb.RequestExtendVote(height=5)).vote_extension
    assert extensions.parse_extension(extension, 5, 5) == extensions.Report({node: 7}, (other,))
    assert app.extend_vote(pb.RequestExtendVote(height=4)).vote_extension == b""
    # the latest scores stay the report for SCORES_MAX_AGE_EPOCHS more closes (a verifier may
    # need more than an epoch per challenge); older, later or broken files give an empty one
    last = 5 * (1 + SCORES_MAX_AGE_EPOCHS)
    for height in range(10, last + 1, 5):
        later = app.extend_vote(pb.RequestExtendVote(height=height)).vote_extension
        assert extensions.parse_extension(later, height, 5) == extensions.Report(
            {node: 7}, (other,)
        )
    stale = app.extend_vote(pb.RequestExtendVote(height=last + 5)).vote_extension
    assert extensions.parse_extension(stale, last + 5, 5) == extensions.EMPTY_REPORT
    doc["epoch"] = 2
    (tmp_path / "reputation_scores.json").write_text(json.dumps(doc))
    assert app.extend_vote(pb.RequestExtendVote(height=5)).vote_extension == empty  # future
    doc["epoch"] = "1"
    (tmp_path / "reputation_scores.json").write_text(json.dumps(doc))
    assert app.extend_vote(pb.RequestExtendVote(height=5)).vote_extension == empty
    (tmp_path / "reputation_scores.json").write_text("{broken")
    assert app.extend_vote(pb.RequestExtendVote(height=5)).vote_extension == empty
    (tmp_path / "reputation_scores.json").write_text(json.dumps({"scores": {node: 2.5}}))
    assert app.extend_vote(pb.RequestExtendVote(height=5)).vote_extension == empty


def test_extensions_app_verify_vote_extension_checks_format() -> None:
    pb = abci_pb()
    app = CommitteeApp(Chain().machine)
    accept = pb.ResponseVerifyVoteExtension.ACCEPT
    reject = pb.ResponseVerifyVoteExtension.REJECT

    def status(height: int, extension: bytes) -> int:
        request = pb.RequestVerifyVoteExtension(height=height, vote_extension=extension)
        return app.verify_vote_extension(request).status

    assert status(4, b"") == accept
    assert status(5, extensions.encode_extension(1, {"ab" * 32: 3})) == accept
    assert status(4, extensions.encode_extension(0, {})) == reject
    assert status(5, b"garbage") == reject


def test_extensions_vx_tx_elsewhere_in_block_fails() -> None:
    chain = Chain()
    chain.advance_to(5)
    vx = chain.extended_commit(5)
    machine = chain.machine
    machine.begin_block(6, b"\x00" * 32)
    assert machine.deliver_tx(vx, 1).code == Code.BAD_VOTE_EXTENSIONS


def test_extensions_disabled_when_enable_height_zero() -> None:
    chain = Chain(ve_enable_height=0)
    chain.advance_to(5)
    assert not chain.machine.vx_required(6)
    assert chain.machine.process_proposal(6, []) == (True, "")
    chain.block()
    assert chain.state.height == 6
    assert chain.state.chain_id == CHAIN_ID


def test_extensions_a_benched_verifiers_report_moves_no_reputation() -> None:
    """Validator 0 accused alone and was settled `refused` (benched, abci_app/verdicts.py):
    its vote extension no longer counts, neither toward a score's 2/3 nor toward the > 1/3
    that zeroes a node reported invalid."""
    from abci_app.verdicts import SETTLE_EPOCHS
    from tests.unit.test_abci_state import VERDICT, verdict_vote

    chain = Chain()
    scored, accused = register_compute(chain, "n1"), register_compute(chain, "n2")
    assert chain.block([verdict_vote(chain, 0, VERDICT)])[0].code == Code.OK  # epoch 1
    chain.advance_to(5 * (1 + SETTLE_EPOCHS))  # settled refused: validator 0 benched
    marks = json.loads(query(chain.state, "/verifiers", b"")[1])["verifiers"]
    assert marks[chain.validators[0].address]["benched_until"] > 2 + SETTLE_EPOCHS
    chain.advance_to(5 * (2 + SETTLE_EPOCHS))
    chain.block(
        scores={0: {scored: 900_000}, 1: {scored: 900_000}, 2: {scored: 900_000}},
        invalid={0: (accused,), 1: (accused,)},
    )
    reps = json.loads(query(chain.state, "/reputations", b"")[1])["reputations"]
    # 20 of 40 power left for `scored` (< 2/3), 10 of 40 reporting `accused` invalid (≤ 1/3)
    assert reps[scored]["r"] == 500_000 and reps[scored]["window"] == []
    assert reps[accused]["r"] == 500_000 and reps[accused]["window"] == []
