"""Route statements that do not check out, turned into EVM fraud proofs (100 % slash).

A client, gateway, next node or verifier that holds a node's signed route statements
(`protocol.routing.RouteStep`) calls `prove_route_fraud`: a reveal that does not open its
signed commitment goes to `FraudProofs.proveRevealMismatch`; two different signed commitments
for the same route slot (the node showed one route to the client and another elsewhere) go to
`FraudProofs.proveEquivocation`. The caller's account is the challenger and earns half of the
slash (commit-then-prove, `node.chain.evm.fraud_proofs`).

    evidence = route_fraud(step, other_step)       # "reveal_mismatch" | "equivocation" | None
    result = prove_route_fraud(chain, step, other_step)   # TxResult, or None when no fault
"""

from __future__ import annotations

from typing import Any

from protocol.routing import RouteStep, fraud_proof_for


def route_fraud(step: RouteStep, other: RouteStep | None = None) -> str | None:
    """The provable fault in one route statement, or in two for the same slot."""
    own = fraud_proof_for((step.commitment, step.commitment_sig), (step.reveal, step.reveal_sig))
    if own is not None or other is None:
        return own
    return fraud_proof_for(
        (step.commitment, step.commitment_sig), (other.commitment, other.commitment_sig)
    )


def prove_route_fraud(chain: Any, step: RouteStep, other: RouteStep | None = None) -> Any:
    """Send the matching FraudProofs proof from `chain` (a `node.chain.evm.account.PlanetChain`);
    None when the statements hold no provable fault."""
    kind = route_fraud(step, other)
    if kind == "reveal_mismatch":
        return chain.fraud_proofs.prove_reveal_mismatch(
            step.commitment, step.commitment_sig, step.reveal, step.reveal_sig
        )
    if kind == "equivocation" and other is not None:
        return chain.fraud_proofs.prove_equivocation(
            step.commitment, step.commitment_sig, other.commitment, other.commitment_sig
        )
    return None
