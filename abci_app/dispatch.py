"""The one dispatcher: tx type → the rule that executes it (each `handler(state, tx)` raises
`Rejected` or writes through `state`; `machine.py` keeps or drops its writes)."""

from __future__ import annotations

from collections.abc import Callable

from abci_app import (
    commitments,
    coverage,
    credit_dkg,
    credits,
    registry,
    seeds,
    settlement,
    spot_reports,
    threshold_credits,
    verdicts,
    verifier_endpoints,
)
from abci_app.state import State
from protocol.committee.commitments import CommitBatch, RevealBatch
from protocol.committee.credit_dkg import DkgComplaint, DkgDeal, DkgJustify
from protocol.committee.credits import CreditKey, FundMint, Mint, Redeem
from protocol.committee.envelope import SignedTx
from protocol.committee.registry import AttestStake, Heartbeat, Leave, RegisterNode
from protocol.committee.settlement import PayoutVote, WorkReport
from protocol.committee.threshold_credits import ThresholdMint, ThresholdRedeem
from protocol.committee.verification import (
    SeedCommit,
    SeedReveal,
    SpotCheckReport,
    VerdictVote,
    VerifierEndpoint,
)

Handler = Callable[[State, SignedTx], None]


def work_report(state: State, tx: SignedTx) -> None:
    """Settlement's rule, then the reported tokens counted against the nodes' commitments."""
    settlement.work_report(state, tx)
    coverage.record_report(state, tx.body)


HANDLERS: dict[str, Handler] = {
    RegisterNode.TYPE: registry.register_node,
    Heartbeat.TYPE: registry.heartbeat,
    Leave.TYPE: registry.leave,
    AttestStake.TYPE: registry.attest_stake,
    CommitBatch.TYPE: commitments.commit,
    RevealBatch.TYPE: commitments.reveal,
    VerdictVote.TYPE: verdicts.verdict_vote,
    SeedCommit.TYPE: seeds.seed_commit,
    SeedReveal.TYPE: seeds.seed_reveal,
    SpotCheckReport.TYPE: spot_reports.spot_check_report,
    VerifierEndpoint.TYPE: verifier_endpoints.verifier_endpoint,
    WorkReport.TYPE: work_report,
    PayoutVote.TYPE: settlement.payout_vote,
    CreditKey.TYPE: credits.credit_key,
    Mint.TYPE: credits.mint,
    FundMint.TYPE: credits.fund_mint,
    Redeem.TYPE: credits.redeem,
    DkgDeal.TYPE: credit_dkg.dkg_deal,
    DkgComplaint.TYPE: credit_dkg.dkg_complaint,
    DkgJustify.TYPE: credit_dkg.dkg_justify,
    ThresholdMint.TYPE: threshold_credits.credit_mint,
    ThresholdRedeem.TYPE: threshold_credits.credit_redeem,
}
