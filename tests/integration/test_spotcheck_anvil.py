"""Spot-check outcomes and computational-randomness routing against the real contracts on anvil.

A failed ticket check and a ticket timeout become committee-signed verdicts (the evidence hash
every verifier derives from the selection) that `FraudProofs.slashByVerdict` executes: 50 % and
5 % of the stake, the verifier as challenger.

A staked node's honest route statement checks out, derives the next node, and is not a fault on
chain (NotAFault). A node whose revealed output does not open the commitment its route was
derived from, or that signs a second commitment for the same route slot (one route shown to the
client, another elsewhere), is slashed 100 % by `FraudProofs` through `prove_route_fraud`; the
challenger's credit is half the stake, the other half is burned.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest
from eth_utils import keccak

from deploy.anvil import ANVIL_DEV_KEY, Anvil, rpc_call, start_anvil
from deploy.evm import DeployConfig, compile_contracts, deploy_all
from harness.ports import ephemeral_port
from node.chain.evm.account import PlanetChain
from node.chain.evm.deployment import Deployment
from node.chain.evm.errors import ContractRevert
from node.chain.route_proofs import prove_route_fraud, route_fraud
from node.verifier.tickets import TicketResult, verdict_for
from protocol.eip712 import ROLE_COMPUTE, Commitment, Reveal, address_of, committee_signatures
from protocol.fingerprint import encode_block
from protocol.routing import (
    RevealMismatchError,
    RouteMismatchError,
    RouteStep,
    check_step,
    next_node,
    output_hash,
    route_salt,
    sign_step,
)
from protocol.spotcheck import Outcome, Triple, evidence_hash

pytestmark = pytest.mark.integration

ETHER = 10**18
COMMITTEE_KEYS = [keccak(text=f"route committee {i}") for i in range(4)]
CANDIDATES = [hashlib.sha256(f"shard-1 node {i}".encode()).hexdigest() for i in range(4)]
MANIFEST = keccak(text="manifest")
INPUT = keccak(text="input")


@pytest.fixture(scope="module")
def anvil() -> Iterator[Anvil]:
    compile_contracts()
    with start_anvil(ephemeral_port()) as node:
        yield node


@pytest.fixture(scope="module")
def deployment(anvil: Anvil) -> Deployment:
    config = DeployConfig.devnet(
        committee=[(address_of(k), 1) for k in COMMITTEE_KEYS], challenge_window_s=60
    )
    return deploy_all(anvil.rpc_url, ANVIL_DEV_KEY, config, expected_chain_id=31337)


def _account(anvil: Anvil, deployment: Deployment, label: str) -> PlanetChain:
    key = keccak(text=f"route test {label}")
    rpc_call(anvil.rpc_url, "anvil_setBalance", [address_of(key), hex(100 * ETHER)])
    return PlanetChain(deployment, key)


def _fingerprint(value: int) -> bytes:
    return encode_block([[(3, value), (9, 0x4000), (17, 0x4200), (40, 0x4400)]] * 32)


def _step(node: PlanetChain, session: bytes, value: int) -> RouteStep:
    return sign_step(
        node.account.key,
        node.fraud_proofs.domain(),
        session,
        0,
        _fingerprint(value),
        manifest_hash=MANIFEST,
        input_hash=INPUT,
        signed_at=1_700_000_000,
    )


def test_route_honest_step_derives_next_node_and_is_no_fault(
    anvil: Anvil, deployment: Deployment
) -> None:
    node = _account(anvil, deployment, "honest node")
    challenger = _account(anvil, deployment, "honest challenger")
    node.staking.stake(ROLE_COMPUTE, ETHER)
    step = _step(node, keccak(text="honest session"), 0x3C00)
    domain = challenger.fraud_proofs.domain()
    expected = next_node(step.commitment.commitment, 1, CANDIDATES)
    assert (
        check_step(
            step,
            domain,
            node_address=node.address,
            next_shard=1,
            candidates=CANDIDATES,
            next_key=expected,
        )
        == node.address
    )
    wrong = next(c for c in CANDIDATES if c != expected)
    with pytest.raises(RouteMismatchError):  # the gateway or node steered elsewhere: refused
        check_step(step, domain, next_shard=1, candidates=CANDIDATES, next_key=wrong)
    assert route_fraud(step) is None and prove_route_fraud(challenger, step) is None
    with pytest.raises(ContractRevert) as caught:  # the contract agrees: nothing to prove
        challenger.fraud_proofs.prove_reveal_mismatch(
            step.commitment, step.commitment_sig, step.reveal, step.reveal_sig
        )
    assert caught.value.error_name == "NotAFault"
    assert node.staking.stake_of() == ETHER


def test_route_reveal_differing_from_commitment_slashed_all(
    anvil: Anvil, deployment: Deployment
) -> None:
    node = _account(anvil, deployment, "lying node")
    challenger = _account(anvil, deployment, "client as challenger")
    node.staking.stake(ROLE_COMPUTE, 2 * ETHER)
    domain = node.fraud_proofs.domain()
    honest = _step(node, keccak(text="lying session"), 0x3C00)
    # The node routes by one commitment, then reveals another output for the same slot.
    r = honest.reveal
    other = output_hash(_fingerprint(0x3C01))
    reveal = Reveal(
        r.session,
        r.step,
        r.shard,
        MANIFEST,
        INPUT,
        other,
        route_salt(r.session, r.shard, other),
        r.signed_at,
    )
    lying = RouteStep(
        honest.commitment,
        honest.commitment_sig,
        reveal,
        reveal.sign(node.account.key, domain),
        _fingerprint(0x3C01),
    )
    with pytest.raises(RevealMismatchError):
        check_step(lying, challenger.fraud_proofs.domain())
    assert route_fraud(lying) == "reveal_mismatch"
    result = prove_route_fraud(challenger, lying)
    slashed = result.event("Slashed")
    assert slashed["node"] == node.address and slashed["offence"] == 1
    assert (slashed["amount"], slashed["reward"], slashed["burned"]) == (2 * ETHER, ETHER, ETHER)
    assert node.staking.stake_of() == 0 and challenger.staking.credit_of() == ETHER


def test_route_two_commitments_for_one_slot_slashed_all(
    anvil: Anvil, deployment: Deployment
) -> None:
    node = _account(anvil, deployment, "equivocating node")
    challenger = _account(anvil, deployment, "verifier as challenger")
    node.staking.stake(ROLE_COMPUTE, ETHER)
    session = keccak(text="equivocating session")
    shown_to_client = _step(node, session, 0x3C00)
    shown_elsewhere = _step(node, session, 0x3C02)  # a different output: another route
    assert shown_to_client.commitment.commitment != shown_elsewhere.commitment.commitment
    assert route_fraud(shown_to_client, shown_elsewhere) == "equivocation"
    result = prove_route_fraud(challenger, shown_to_client, shown_elsewhere)
    slashed = result.event("Slashed")
    assert (slashed["offence"], slashed["amount"], slashed["reward"]) == (2, ETHER, ETHER // 2)
    assert node.staking.stake_of() == 0 and challenger.staking.credit_of() == ETHER // 2
    # A commitment re-signed for another slot is no equivocation.
    moved = Commitment(session, 3, 0, shown_to_client.commitment.commitment, 1)
    moved_step = RouteStep(
        moved,
        moved.sign(node.account.key, node.fraud_proofs.domain()),
        shown_to_client.reveal,
        shown_to_client.reveal_sig,
        shown_to_client.fingerprint,
    )
    assert route_fraud(shown_to_client, moved_step) is None


@pytest.mark.parametrize(("outcome", "share"), [(Outcome.FAILED, 2), (Outcome.TIMEOUT, 20)])
def test_spotcheck_finding_verdict_slashes_its_offence_share(
    anvil: Anvil, deployment: Deployment, outcome: Outcome, share: int
) -> None:
    node = _account(anvil, deployment, f"spot-checked node {outcome.value}")
    verifier = _account(anvil, deployment, f"spot-check verifier {outcome.value}")
    node.staking.stake(ROLE_COMPUTE, 2 * ETHER)
    triple = Triple("ab" * 32, "0x" + keccak(text=outcome.value).hex(), 3, 1)
    seed = keccak(text="epoch seed")
    result = TicketResult(outcome, "test", evidence_hash=evidence_hash(seed, triple, outcome))
    verdict = verdict_for(
        result,
        node=node.address,
        challenger=verifier.address,
        nonce=int.from_bytes(keccak(text=outcome.value)[:4], "big"),
        consumer=deployment.address("FraudProofs"),
    )
    assert verdict is not None and verdict.offence == outcome.offence
    sigs = committee_signatures(verdict, COMMITTEE_KEYS[:3], verifier.committee.domain())
    slashed = verifier.fraud_proofs.slash_by_verdict(verdict, sigs).event("Slashed")
    assert slashed["offence"] == outcome.offence
    assert slashed["amount"] == 2 * ETHER // share
    assert node.staking.stake_of() == 2 * ETHER - 2 * ETHER // share
    assert verifier.staking.credit_of() == ETHER // share
    assert (
        verdict_for(
            TicketResult(Outcome.PASSED, "ok"),
            node=node.address,
            challenger=verifier.address,
            nonce=1,
            consumer=deployment.address("FraudProofs"),
        )
        is None
    )
