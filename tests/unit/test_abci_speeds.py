"""Measured decode speeds on the committee chain (abci_app/speeds.py, issue 44): the verifiers'
vote extensions carry `speeds` for the nodes they scored, the chain keeps per node the lower
median of each distinct verifier's latest report within `retention_epochs`, `/nodes` and
`/node` answer it as `speed`, and hostile reports are refused by name or bounded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from abci_app import extensions
from abci_app.app import CommitteeApp
from abci_app.queries import query
from abci_app.speeds import apply_speeds
from protocol.speeds import MAX_SPEED, lower_median
from tests.committee_chain import CHAIN_ID, Chain, ProposalRejected
from tests.unit.test_abci_extensions import register_compute

pytestmark = pytest.mark.unit

UNREGISTERED = "ee" * 32


def _node(chain: Chain, key: str) -> dict[str, Any]:
    code, answer = query(chain.state, f"/node?key={key}", b"")[:2]
    assert code == 0, answer
    return dict(json.loads(answer))


def _scored(nodes: list[str], validators: range) -> dict[int, dict[str, int]]:
    return {i: {n: 1_000_000 for n in nodes} for i in validators}


def test_speeds_are_the_lower_median_of_distinct_verifiers_and_answered_by_nodes() -> None:
    chain = Chain()
    fast, slow = register_compute(chain, "n1"), register_compute(chain, "n2")
    assert _node(chain, fast)["speed"] is None  # nobody measured it yet
    chain.advance_to(5)
    chain.block(
        scores=_scored([fast, slow], range(4)),
        # validator 3 lies: absurdly fast for `fast`, absurdly slow for `slow`
        speeds={
            0: {fast: 40, slow: 9},
            1: {fast: 42, slow: 10},
            2: {fast: 45, slow: 11},
            3: {fast: MAX_SPEED, slow: 1},
        },
    )
    assert _node(chain, fast)["speed"] == 42  # lower median of [40, 42, 45, 100000]
    assert _node(chain, slow)["speed"] == 9  # of [1, 9, 10, 11]: still an honest value
    listed = json.loads(query(chain.state, "/nodes?role=compute", b"")[1])["nodes"]
    assert {n["key"]: n["speed"] for n in listed} == {fast: 42, slow: 9}
    record = chain.state.committed("speed", fast)
    assert record["epoch"] == 1 and sorted(record["reports"]) == sorted(
        v.address for v in chain.validators
    )


def test_one_liar_among_three_cannot_move_the_median_out_of_the_honest_range() -> None:
    for liar in (1, 17, 30, MAX_SPEED):
        value = lower_median([20, 30, liar])
        assert 20 <= value <= 30
    assert lower_median([30, 20, 25, MAX_SPEED]) == 25
    assert lower_median([7]) == 7 and lower_median([8, 3]) == 3  # two: a liar only lowers it


def test_a_verifiers_latest_report_replaces_its_older_one_and_old_reports_expire() -> None:
    chain = Chain(genesis={"retention_epochs": 2})
    node = register_compute(chain, "n1")
    chain.advance_to(5)
    chain.block(scores=_scored([node], range(4)), speeds={0: {node: 10}, 1: {node: 20}})
    assert _node(chain, node)["speed"] == 10  # [10, 20]
    chain.advance_to(10)
    chain.block(scores=_scored([node], range(4)), speeds={0: {node: 30}, 2: {node: 40}})
    # validator 0's epoch-2 report replaced its epoch-1 one: [30 (v0), 20 (v1), 40 (v2)]
    assert _node(chain, node)["speed"] == 30
    chain.advance_to(15)
    chain.block(scores=_scored([node], range(4)), speeds={3: {node: 50}})
    # epoch 3 keeps the reports of epochs 2 and 3 (retention 2): v1's epoch-1 report went
    record = chain.state.committed("speed", node)
    assert sorted(when for when, _ in record["reports"].values()) == [2, 2, 3]
    assert _node(chain, node)["speed"] == 40  # [30, 40, 50]
    # nobody reports it for more than retention_epochs: the query stops answering a speed
    chain.advance_to(5 * 7)
    assert _node(chain, node)["speed"] is None


def test_speeds_of_unregistered_nodes_are_not_kept() -> None:
    chain = Chain()
    node = register_compute(chain, "n1")
    chain.advance_to(5)
    chain.block(
        scores=_scored([node, UNREGISTERED], range(4)),
        speeds={i: {node: 12, UNREGISTERED: 99} for i in range(4)},
    )
    assert chain.state.committed("speed", UNREGISTERED) is None
    assert _node(chain, node)["speed"] == 12


def test_apply_speeds_drops_the_kept_reports_of_a_validator_no_longer_allowed() -> None:
    chain = Chain()
    node = register_compute(chain, "n1")
    chain.advance_to(5)
    chain.block(scores=_scored([node], range(4)), speeds={0: {node: 5}, 1: {node: 50}})
    _benched, a1, a2 = (v.address for v in chain.validators[:3])
    state = chain.state
    report = extensions.Report({node: 1_000_000}, (), {node: 60})
    assert apply_speeds(state, 2, {a2: report}, allowed={a1, a2}) == 1
    record = state.get("speed", node)
    assert set(record["reports"]) == {a1, a2}  # a0 (benched or gone) no longer counts
    assert record["speed"] == 50
    assert apply_speeds(state, 2, {a2: report}, allowed={a1, a2}) == 0  # applied once


# -- hostile reports: refused by name at the boundary ---------------------------------------------


def test_speed_reports_are_refused_for_unscored_nodes_absurd_values_and_bad_shapes() -> None:
    node, other = "ab" * 32, "cd" * 32
    ok = extensions.encode_extension(2, {node: 5}, (), {node: 17})
    assert extensions.parse_extension(ok, 10, 5) == extensions.Report({node: 5}, (), {node: 17})
    assert extensions.encode_extension(2, {node: 5}, (), {}) == extensions.encode_extension(
        2, {node: 5}
    )  # no speeds: the extension of a verifier that measured none is unchanged
    head = b'{"epoch":2,"invalid":[],"scores":{"' + node.encode() + b'":5},"speeds":'
    refused = {
        # a node this verifier did not score: it did not challenge it
        head + b'{"' + other.encode() + b'":17}}': "does not score",
        head + b'{"' + node.encode() + b'":0}}': "expected an integer in [1, 100000]",
        head + b'{"' + node.encode() + b'":100001}}': "expected an integer in [1, 100000]",
        head + b'{"' + node.encode() + b'":17.5}}': "",
        head + b'{"' + node.encode() + b'":true}}': "expected an integer",
        head + b'{"' + node.encode() + b'":"17"}}': "expected an integer",
        head + b"{}}": "omitted when empty",
        head + b"[17]}": "speeds: expected an object",
        # a duplicate key: one speed per node and report
        head + b'{"' + node.encode() + b'":17,"' + node.encode() + b'":18}}': "",
    }
    for raw, message in refused.items():
        with pytest.raises(extensions.VoteExtensionError) as caught:
            extensions.parse_extension(raw, 10, 5)
        assert message in caught.value.message, (raw, caught.value.message)


def test_a_lying_extension_is_refused_and_a_validator_reports_once_per_close() -> None:
    chain = Chain()
    node = register_compute(chain, "n1")
    unscored = register_compute(chain, "n2")
    chain.advance_to(5)
    with pytest.raises(ProposalRejected, match="does not score"):
        chain.block(scores=_scored([node], range(4)), speeds={0: {unscored: 80}})
    # the proposer's filter turns such a vote absent: the others' speeds still land
    raw = chain.extended_commit(5, _scored([node], range(4)), speeds={0: {unscored: 80}})
    keys = chain.state.validator_keys()
    commit = extensions.without_invalid_extensions(extensions.decode_vx_tx(raw), CHAIN_ID, keys, 5)
    absent = [v for v in commit.votes if v.flag == extensions.BLOCK_ID_FLAG_ABSENT]
    assert [v.address for v in absent] == [chain.validators[0].address]
    # a validator's second vote in one extended commit: refused by name (one report per close)
    doubled = extensions.ExtendedCommit(
        commit.height, commit.round, (*commit.votes, commit.votes[1])
    )
    with pytest.raises(extensions.VoteExtensionError, match="appears twice"):
        extensions.verify_extended_commit(doubled, CHAIN_ID, keys, 5)
    # a key that is not a validator's (a non-verifier) cannot report at all
    stranger = extensions.ExtVote("AB" * 20, 10, b"", b"", extensions.BLOCK_ID_FLAG_ABSENT)
    with pytest.raises(extensions.VoteExtensionError, match="unknown validator"):
        extensions.verify_extended_commit(
            extensions.ExtendedCommit(commit.height, commit.round, (*commit.votes, stranger)),
            CHAIN_ID,
            keys,
            5,
        )


def test_extend_vote_carries_the_speeds_of_the_local_scores_file(tmp_path: Path) -> None:
    chain = Chain()
    app = CommitteeApp(chain.machine, tmp_path)
    node = "ab" * 32
    doc = {"epoch": 1, "scores": {node: 1_000_000}, "invalid": [], "speeds": {node: 23}}
    (tmp_path / "reputation_scores.json").write_text(json.dumps(doc))
    from abci_app.proto import abci_pb

    extension = app.extend_vote(abci_pb().RequestExtendVote(height=5)).vote_extension
    assert extensions.parse_extension(extension, 5, 5).speeds == {node: 23}
    doc["speeds"] = {"cd" * 32: 23}  # a speed of a node the file does not score: no report
    (tmp_path / "reputation_scores.json").write_text(json.dumps(doc))
    extension = app.extend_vote(abci_pb().RequestExtendVote(height=5)).vote_extension
    assert extensions.parse_extension(extension, 5, 5) == extensions.EMPTY_REPORT
