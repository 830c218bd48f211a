"""Honest fp32, int8 and int4 nodes over 50 epochs of the committee's verification rules, with
the measured scoring numbers (node/verifier/calibration.json), on the in-process chain.

Four validators of equal power; nine honest nodes (fp32, int8, int4 on each of 3 shards). Every
epoch, per node: a gateway reports three 97-token questions (96 prompt positions + 1 generated
token, a verifier's echo challenge), the node commits the blocks it served (3 per question:
96 positions, its own spool), redeems the credit it was paid with (the first epoch), and every
validator's vote extension carries
the credibility its verifier would give the node's quant at its WORST measured echo challenge
(`echo_gaps[quant].kl` through `echo_map`). Spot checks of honest blocks pass (calibration's
`fingerprint_cases`: every honest block passed), so no verifier votes a verdict.

Over 50 epochs (a 50-epoch devnet is too slow for CI; this is the chain's own code with the
real numbers): every node stays routable at every epoch's close (R ≥ 0.4, never `uncommitted`),
nobody is accused or slashed, every node is paid.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from abci_app import rules
from node.verifier.calibration import CALIBRATION_FILE
from node.verifier.scoring import CredibilityMap, Gap
from protocol.committee.credit_locks import CreditLock
from protocol.committee.credits import CreditRedeem
from protocol.committee.registry import Heartbeat
from tests.committee_chain import Chain, seeded_key
from tests.unit.test_abci_settlement import GATEWAY, ask, evm_of, report, settled_chain
from tests.unit.test_abci_state import commit_served, hexkey, make_routable, price_txs, register

pytestmark = pytest.mark.unit

EPOCHS = 50
QUANTS = ("fp32", "int8", "int4")
QUESTIONS = 3  # per node and epoch
TOKENS = 97  # a 96-token echo challenge + 1 generated token
BLOCKS = 3  # 96 served positions, committed as 3 blocks of 32


def _calibration() -> dict:
    return json.loads(CALIBRATION_FILE.read_text(encoding="utf-8"))


def worst_honest_credibility(quant: str) -> int:
    """The credibility the deployed echo map gives `quant` at its worst measured challenge."""
    calibration = _calibration()
    echo = calibration["echo_map"]
    mapping = CredibilityMap(int(echo["full_micro"]), int(echo["zero_micro"]))
    worst = max(calibration["echo_gaps"][quant]["kl"])
    return mapping.credibility(Gap(tokens=64, kl=worst, nll_gap=0.0, top1=1.0))


def test_calibration_says_honest_quants_score_full_and_their_blocks_pass() -> None:
    for quant in QUANTS:
        assert worst_honest_credibility(quant) == 1_000_000
        case = _calibration()["fingerprint_cases"][f"honest_{quant}"]
        assert case["blocks_passed"] == case["blocks"] > 0


def _epoch(
    chain: Chain, nodes: dict[str, tuple[str, int]], scores: dict[str, int], paid: dict[str, Any]
) -> None:
    """One epoch of honest traffic and verification, ending with its close; each node in `paid`
    redeems its credit."""
    length = chain.state.genesis.epoch_length
    query = "0x" + hashlib.sha256(b"question %d" % chain.state.height).hexdigest()
    [result] = chain.block([chain.tx(report(queries=((query, 10**15),)), GATEWAY)])
    assert result.code == 0, result.log
    # a paid node's price is on the chain before it serves: what it commits while unpriced
    # is free and pays no credit (abci_app/coverage.py rule 4)
    pricing = [
        tx
        for label, (_, shard) in nodes.items()
        if label in paid
        for tx in price_txs(chain, seeded_key(label), shard)
    ]
    if pricing:
        assert all(r.code == 0 for r in chain.block(pricing))
    for label, (_, shard) in nodes.items():
        commit_served(chain, seeded_key(label), shard=shard, blocks=BLOCKS * QUESTIONS)
    # the first epoch each node redeems its credit; later ones, it locks the credit its next
    # question was paid with (a charging node that commits sells: coverage.py rule 5)
    epoch = rules.epoch_of(chain.state, chain.state.height + 1)
    claims = [
        chain.tx(CreditRedeem("m", shard, (paid[label],)), seeded_key(label))
        if label in paid
        else chain.tx(
            CreditLock("m", shard, ((_spent_id(label, epoch), epoch),)), seeded_key(label)
        )
        for label, (_, shard) in nodes.items()
    ]
    results = chain.block(claims)
    assert [r.code for r in results] == [0] * len(claims), [r.log for r in results]
    end = (chain.state.height // length + 1) * length
    chain.advance_to(end - 1)
    heartbeats = [chain.tx(_heartbeat(), seeded_key(label)) for label in nodes]
    chain.block(heartbeats)  # the epoch's last block
    # the next block carries every validator's vote extension for the closed epoch
    chain.block(scores={i: scores for i in range(len(chain.validators))})


def _spent_id(label: str, epoch: int) -> str:
    return hashlib.sha256(f"{label}/{epoch}".encode()).hexdigest()


def _heartbeat() -> Heartbeat:
    return Heartbeat()


def test_honest_fp32_int8_int4_nodes_stay_routable_and_unslashed_for_50_epochs(
    tmp_path: Path,
) -> None:
    from tests.credit_chain import ensure_key, minted

    chain: Chain = settled_chain(epoch_length=10, heartbeat_timeout=30)
    ensure_key(chain, tmp_path)  # the credit key first
    nodes: dict[str, tuple[str, int]] = {}
    for quant in QUANTS:
        for shard in range(3):
            label = f"honest-{quant}-{shard}"
            key = register(chain, label, shards=(shard,))
            make_routable(chain, key)
            nodes[label] = (quant, shard)
    keyed = {hexkey(seeded_key(label)): (quant, shard) for label, (quant, shard) in nodes.items()}
    scores = {key: worst_honest_credibility(quant) for key, (quant, _) in keyed.items()}
    credits, _ = minted(chain, tmp_path, count=len(nodes))
    lowest: dict[str, int] = {}
    for epoch in range(EPOCHS):
        _epoch(chain, nodes, scores, dict(zip(nodes, credits, strict=True)) if epoch == 0 else {})
        if epoch == 0:  # the first close paid every node for its credit
            pool = max(s["epoch"] for s in ask(chain, "/payouts")["epochs"] if s["epoch"] < 2**32)
            paid = {a: int(n) for a, n in ask(chain, f"/payouts?epoch={pool}")["rows"]}
        for key in keyed:
            view = ask(chain, f"/node?key={key}")
            assert view["routable"], view
            assert not view["uncommitted"] and not view["untrusted"], view
            lowest[key] = min(lowest.get(key, view["reputation"]), view["reputation"])
    assert min(lowest.values()) >= 500_000  # never below where they started
    assert all(ask(chain, f"/node?key={k}")["reputation"] > 990_000 for k in keyed)
    assert ask(chain, "/verdicts")["verdicts"] == []
    assert ask(chain, "/coverage")["uncommitted"] == []
    assert all(paid.get(evm_of(label), 0) > 0 for label in nodes)
