"""The one dispatcher: tx type → the rule that executes it (each `handler(state, tx)` raises
`Rejected` or writes through `state`; `machine.py` keeps or drops its writes)."""

from __future__ import annotations

from collections.abc import Callable

from abci_app import (
    commitments,
    credit_dkg,
    credit_locks,
    credits,
    gateway_bindings,
    liveness,
    mint_partials,
    numerics,
    prices,
    ratifications,
    registry,
    relay_credits,
    seeds,
    settlement,
    spot_reports,
    validator_set,
    verdicts,
    verifier_endpoints,
)
from abci_app.state import State
from protocol.committee.commitments import CommitBatch, RevealBatch
from protocol.committee.credit_dkg import DkgComplaint, DkgDeal, DkgJustify
from protocol.committee.credit_locks import CreditLock
from protocol.committee.credits import CreditMint, CreditRedeem, FundMint, MintPartials
from protocol.committee.envelope import SignedTx
from protocol.committee.gateways import GatewayBind
from protocol.committee.prices import SetPrice
from protocol.committee.registry import (
    AttestStake,
    Heartbeat,
    Leave,
    MoveShards,
    RegisterNode,
    SetNumerics,
)
from protocol.committee.relay_credits import RelayRedeem
from protocol.committee.relays import RegisterRelay
from protocol.committee.settlement import PayoutVote, WorkReport
from protocol.committee.validator_set import ValidatorApprove, ValidatorChange
from protocol.committee.verification import (
    SeedCommit,
    SeedReveal,
    SpotCheckReport,
    VerdictRatify,
    VerdictVote,
    VerifierEndpoint,
    VerifierNumerics,
)

Handler = Callable[[State, SignedTx], None]


def serving(handler: Handler) -> Handler:
    """`handler`, then its signer counted alive: the tx shows the node at work (liveness.py)."""

    def run(state: State, tx: SignedTx) -> None:
        handler(state, tx)
        liveness.note_service(state, tx.signer)

    return run


HANDLERS: dict[str, Handler] = {
    RegisterNode.TYPE: registry.register_node,
    Heartbeat.TYPE: registry.heartbeat,
    Leave.TYPE: registry.leave,
    MoveShards.TYPE: registry.move_shards,
    SetNumerics.TYPE: numerics.set_numerics,
    AttestStake.TYPE: registry.attest_stake,
    RegisterRelay.TYPE: registry.register_relay,
    CommitBatch.TYPE: serving(commitments.commit),
    RevealBatch.TYPE: serving(commitments.reveal),
    VerdictVote.TYPE: verdicts.verdict_vote,
    VerdictRatify.TYPE: ratifications.verdict_ratify,
    SeedCommit.TYPE: seeds.seed_commit,
    SeedReveal.TYPE: seeds.seed_reveal,
    SpotCheckReport.TYPE: spot_reports.spot_check_report,
    VerifierEndpoint.TYPE: verifier_endpoints.verifier_endpoint,
    VerifierNumerics.TYPE: numerics.verifier_numerics,
    WorkReport.TYPE: settlement.work_report,
    PayoutVote.TYPE: settlement.payout_vote,
    FundMint.TYPE: credits.fund_mint,
    MintPartials.TYPE: mint_partials.mint_partials,
    SetPrice.TYPE: prices.set_price,
    CreditLock.TYPE: serving(credit_locks.credit_lock),
    GatewayBind.TYPE: gateway_bindings.gateway,
    DkgDeal.TYPE: credit_dkg.dkg_deal,
    DkgComplaint.TYPE: credit_dkg.dkg_complaint,
    DkgJustify.TYPE: credit_dkg.dkg_justify,
    CreditMint.TYPE: credits.credit_mint,
    CreditRedeem.TYPE: serving(credits.credit_redeem),
    RelayRedeem.TYPE: relay_credits.relay_redeem,
    ValidatorChange.TYPE: validator_set.validator_change,
    ValidatorApprove.TYPE: validator_set.validator_approve,
}
