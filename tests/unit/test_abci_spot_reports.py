"""Spot-check reports (abci_app/spot_reports.py): the chain credits a verifier only the checks
its own draw assigned to it (committed in the epoch, selected under the next epoch's seed,
assigned among that epoch's verifier set), and settlement pays the verifiers' cut by them."""

from __future__ import annotations

from pathlib import Path

import pytest

from abci_app.codes import Code
from abci_app.settlement import verification_work
from protocol.committee.commitments import CommitBatch, CommitmentRecord
from protocol.committee.credits import CreditRedeem
from protocol.committee.grammar import TxDecodeError
from protocol.committee.verification import SpotCheckReport
from protocol.spotcheck import Triple, checks_for, epoch_verifiers
from shares.payouts import ComputeWork, EpochWork, PayerDebit, ShardHealth, VerificationWork
from shares.settlement import close_epoch
from tests.committee_chain import Chain
from tests.unit.test_abci_seeds_accusations import _signer, commit
from tests.unit.test_abci_settlement import (
    CREDIT_LAYER_TOKENS,
    CREDIT_PRICE,
    ESCROW,
    ask,
    evm_of,
    one,
    settled_chain,
    two_nodes,
)
from tests.unit.test_abci_state import hexkey, price_txs, served_commit_tx

pytestmark = pytest.mark.unit


def _epoch1_with_commitments(chain: Chain, tmp: Path):
    """The validators form the first key period's key (its DKG); validators 0 and 1 commit
    verifier seeds for epoch 2; node A commits 16 blocks and a payer buys one credit (mint,
    funding), all in epoch 1 (20 blocks); the chain reaches epoch 2 (every block is selected:
    10^6 ppm). Returns the credit too."""
    from tests.credit_chain import ensure_key, fund, gather, period_key, request, send

    ensure_key(chain, tmp)

    chain.block([commit(chain, 0, 2, b"\x00" * 32), commit(chain, 1, 2, b"\x01" * 32)])
    a, b = two_nodes(chain)
    records = tuple(
        CommitmentRecord("0x" + f"{i:064x}", 0, 0, "0x" + "aa" * 32) for i in range(1, 17)
    )
    assert one(chain, CommitBatch(records), a).code == Code.OK
    req = request(chain, 1)
    assert send(chain, req.body, b).code == Code.OK
    fund(chain, req.mint_id)
    credits = req.finalize(period_key(chain), gather(chain, tmp, req.mint_id))
    assert chain.state.height <= 20
    chain.advance_to(20)
    seed, verifiers = epoch_verifiers(ask(chain, "/epochs?epoch=2")["epochs"][0])
    assert verifiers == sorted([_signer(chain, 0), _signer(chain, 1)])
    triples = [Triple(hexkey(a), r.session, 0, 0) for r in records]
    owed = [checks_for(seed, triples, verifiers, _signer(chain, i), 10**6) for i in (0, 1)]
    assert owed[0] and owed[1] and len(owed[0]) + len(owed[1]) == 16
    return a, b, owed, credits


def _report(triples: list[Triple], epoch: int = 1) -> SpotCheckReport:
    return SpotCheckReport(epoch, tuple((t.node, t.session, t.block, t.shard) for t in triples))


def test_reports_are_credited_only_for_assigned_checks_and_paid_at_settlement(
    tmp_path: Path,
) -> None:
    chain = settled_chain(bindings={}, spot_check_ppm=1_000_000, epoch_length=20)
    a, _, owed, credits = _epoch1_with_commitments(chain, tmp_path)
    v0, v1, v2 = (chain.validators[i].key for i in range(3))
    assert one(chain, _report(owed[0]), v1).code == Code.SPOT_CHECK_NOT_ASSIGNED  # v0's checks
    assert one(chain, _report(owed[1][:1]), v2).code == Code.SPOT_CHECK_NOT_ASSIGNED  # no seed
    assert one(chain, _report(owed[1], epoch=2), v1).code == Code.SPOT_REPORT_EPOCH  # open
    assert one(chain, _report(owed[0]), a).code == Code.NOT_VALIDATOR
    assert one(chain, _report(owed[0]), v0).code == Code.OK
    assert one(chain, _report(owed[0][:1]), v0).code == Code.DUPLICATE_SPOT_REPORT
    assert one(chain, _report(owed[1][:2]), v1).code == Code.OK  # a partial report counts 2
    operators = [chain.validators[i].operator.lower() for i in (0, 1)]
    credited = verification_work(chain.state, 2)
    assert credited == tuple(
        sorted(
            (VerificationWork(operators[0], len(owed[0])), VerificationWork(operators[1], 2)),
            key=lambda w: w.account,
        )
    )
    view = ask(chain, "/spot_reports?epoch=2")
    assert view["credits"] == sorted(
        ({"account": w.account, "spot_checks": w.spot_checks} for w in credited),
        key=lambda c: c["account"],
    )
    reports = ask(chain, "/spot_reports?epoch=1")["reports"]
    assert {r["signer"]: r["count"] for r in reports} == {
        _signer(chain, 0): len(owed[0]),
        _signer(chain, 1): 2,
    }
    # epoch 2 has paid work (A redeems the credit): the pool's draw is split with the
    # verifiers' cut, by checks
    results = chain.block(
        [
            *price_txs(chain, a),
            served_commit_tx(chain, a, 0),
            chain.tx(CreditRedeem("m", 0, credits), a),
        ]
    )
    assert [r.code for r in results] == [Code.OK] * len(results), [r.log for r in results]
    chain.advance_to(40)
    view = ask(chain, "/payouts?epoch=2")
    expected = close_epoch(
        EpochWork(
            epoch=2,
            queries=(),
            compute=(ComputeWork(evm_of("node-a"), "m", 0, 1, CREDIT_LAYER_TOKENS),),
            verification=credited,
            health=(ShardHealth("m", 0, 1),),
            debits=(PayerDebit(ESCROW, ESCROW, CREDIT_PRICE),),  # the draw: the rows' total
        )
    )
    assert view["root"] == "0x" + expected.root.hex()
    rows = {account: int(amount) for account, amount in view["rows"]}
    assert set(operators) <= set(rows) and rows[operators[0]] > rows[operators[1]] > 0
    # too late: epoch 1's checks were reportable during epochs 2 and 3 only
    chain.advance_to(60)
    assert one(chain, _report(owed[1][2:]), v1).code == Code.SPOT_REPORT_EPOCH


def test_a_commitment_of_another_epoch_is_not_credited(tmp_path: Path) -> None:
    chain = settled_chain(bindings={}, spot_check_ppm=1_000_000, epoch_length=20)
    a, _, owed, _ = _epoch1_with_commitments(chain, tmp_path)
    late = CommitmentRecord("0x" + "77" * 32, 0, 0, "0x" + "aa" * 32)
    assert one(chain, CommitBatch((late,)), a).code == Code.OK  # epoch 2
    chain.advance_to(40)
    stray = Triple(hexkey(a), late.session, 0, 0)
    code = one(chain, _report(sorted([*owed[0], stray])), chain.validators[0].key).code
    assert code == Code.SPOT_CHECK_NOT_ASSIGNED  # committed in epoch 2, reported as epoch 1


@pytest.mark.parametrize(
    "body",
    [
        {"epoch": 1, "checks": []},
        {"epoch": 0, "checks": [["ab" * 32, "0x" + "cd" * 32, 0, 0]]},
        {"epoch": 1, "checks": [["AB" * 32, "0x" + "cd" * 32, 0, 0]]},
        {"epoch": 1, "checks": [["ab" * 32, "cd" * 32, 0, 0]]},
        {"epoch": 1, "checks": [["ab" * 32, "0x" + "cd" * 32, 0, 70000]]},
        {"epoch": 1, "checks": [["ab" * 32, "0x" + "cd" * 32, 0, 0]] * 2},
        {"epoch": 1, "checks": [["ab" * 32, "0x" + "cd" * 32, s, 0] for s in (1, 0)]},
        {"epoch": 1, "checks": [["ab" * 32, "0x" + "cd" * 32, 0]]},
        {"epoch": 1, "checks": [["ab" * 32, "0x" + "cd" * 32, 0, 0]] * 257},
        {"epoch": 1, "checks": [["ab" * 32, "0x" + "cd" * 32, True, 0]]},
        {"epoch": 1},
    ],
)  # fmt: skip
def test_malformed_reports_are_refused_by_name(body: dict) -> None:
    with pytest.raises(TxDecodeError):
        SpotCheckReport.from_json(body)


def test_report_round_trips() -> None:
    body = _report([Triple("ab" * 32, "0x" + "cd" * 32, 3, 1)], epoch=4)
    assert SpotCheckReport.from_json(body.to_json()) == body
