"""The settlement contracts on a real anvil, driven from Python only.

One anvil (on a free port) for the module: the compiled Hardhat artifacts are deployed by
`deploy.evm.deploy_all` with a 4-member committee whose keys sign in Python
(`protocol.eip712`); payout trees come from `shares.merkle`. Every test uses fresh, funded
accounts (anvil_setBalance) and its own ids/epochs, so tests do not depend on each other;
time travel is `evm_increaseTime` + `evm_mine`. The CLI test starts its own anvil on another
free port.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from itertools import count
from pathlib import Path

import pytest
from eth_abi import encode as abi_encode
from eth_utils import keccak

from deploy.anvil import ANVIL_DEV_KEY, REPO_ROOT, Anvil, rpc_call, start_anvil
from deploy.evm import DeployConfig, compile_contracts, deploy_all, load_artifact
from harness.ports import ephemeral_port
from node.chain.evm.account import PlanetChain
from node.chain.evm.deployment import Deployment
from node.chain.evm.errors import (
    AlreadyClaimed,
    AlreadyProven,
    BelowMinimum,
    ChallengeNotCommitted,
    ChallengeWindowOpen,
    ContractRevert,
    FraudWindowOpen,
    InsufficientPower,
    InvalidClaim,
    InvalidGateway,
    QueryExists,
    QueryNotFunded,
    SignersNotSorted,
    UnbondingNotElapsed,
    UnknownSigner,
    WithdrawalNotRequested,
    WithdrawalNotYetAvailable,
    WrongConsumer,
)
from node.procs import run_captured
from protocol.eip712 import (
    OFFENCE_FAILED_VERIFICATION,
    ROLE_COMPUTE,
    ROLE_VERIFIER,
    Commitment,
    CommitteeUpdate,
    ModelRegistration,
    PayoutRoot,
    Reveal,
    Verdict,
    address_of,
    commitment_value,
    committee_signatures,
    evidence_id,
    queries_hash,
)
from protocol.errors import ConfigError, PlanetError, ProtocolError, UnavailableError
from shares.merkle import PayoutTree

pytestmark = pytest.mark.integration

ETHER = 10**18
MILLI = 10**15


PORT = ephemeral_port()
CLI_PORT = ephemeral_port()
UNUSED_PORT = ephemeral_port()
CHALLENGE_WINDOW_S = 60
BURN_ADDRESS = "0x000000000000000000000000000000000000dEaD"
ZERO_ADDRESS = "0x0000000000000000000000000000000000000000"
COMMITTEE_KEYS = [keccak(text=f"planet integration committee {i}") for i in range(4)]
_labels = count()


@pytest.fixture(scope="module")
def anvil() -> Iterator[Anvil]:
    compile_contracts()  # a no-op when artifacts are newer than every source
    with start_anvil(PORT) as node:
        yield node


@pytest.fixture(scope="module")
def deployment(anvil: Anvil, tmp_path_factory: pytest.TempPathFactory) -> Deployment:
    config = DeployConfig.devnet(
        committee=[(address_of(k), 1) for k in COMMITTEE_KEYS],
        challenge_window_s=CHALLENGE_WINDOW_S,
    )
    deployed = deploy_all(anvil.rpc_url, ANVIL_DEV_KEY, config, expected_chain_id=31337)
    deployed.save(tmp_path_factory.mktemp("evm") / "deployment.json")
    return deployed


def account(anvil: Anvil, deployment: Deployment, label: str) -> PlanetChain:
    """A fresh key (unique per call) with 100 ether, as a client."""
    key = keccak(text=f"planet integration {label} {next(_labels)}")
    rpc_call(anvil.rpc_url, "anvil_setBalance", [address_of(key), hex(100 * ETHER)])
    return PlanetChain(deployment, key)


def travel(anvil: Anvil, seconds: int) -> None:
    rpc_call(anvil.rpc_url, "evm_increaseTime", [seconds])
    rpc_call(anvil.rpc_url, "evm_mine", [])


def new_id(label: str) -> bytes:
    return keccak(text=f"{label} {next(_labels)}")


def chain_time(anvil: Anvil) -> int:
    return int(rpc_call(anvil.rpc_url, "eth_getBlockByNumber", ["latest", False])["timestamp"], 16)


MANIFEST = keccak(text="manifest")
INPUT = keccak(text="input")


def test_deploy_all_contracts_wired_together(deployment: Deployment, anvil: Anvil) -> None:
    chain = account(anvil, deployment, "reader")
    assert set(deployment.contracts) == {
        "Committee",
        "Staking",
        "FraudProofs",
        "QueryEscrow",
        "ModelRegistry",
    }
    members = sorted((address_of(k) for k in COMMITTEE_KEYS), key=lambda a: int(a, 16))
    assert chain.committee.members() == members
    assert chain.call("Staking", "fraudProofs") == deployment.address("FraudProofs")
    assert chain.call("FraudProofs", "staking") == deployment.address("Staking")
    assert chain.call("QueryEscrow", "challengeWindow") == CHALLENGE_WINDOW_S
    assert chain.call("Staking", "unstakeDelay") == CHALLENGE_WINDOW_S + 1
    assert chain.call("ModelRegistry", "devOwner") == deployment.deployer
    # The Python domains are the ones the contracts sign under.
    assert chain.call("Committee", "domainSeparator") == chain.committee.domain().separator()
    assert chain.call("FraudProofs", "domainSeparator") == chain.fraud_proofs.domain().separator()


def test_settlement_stake_deposit_post_claim_balances_exact(
    deployment: Deployment, anvil: Anvil
) -> None:
    compute = account(anvil, deployment, "compute")
    verifier = account(anvil, deployment, "verifier")
    user = account(anvil, deployment, "user")
    relayer = account(anvil, deployment, "relayer")
    gateway_chain = account(anvil, deployment, "gateway")  # the deposits' gateway: the payee
    gateway = gateway_chain.address

    compute.staking.stake(ROLE_COMPUTE, 1 * ETHER)
    verifier.staking.stake(ROLE_VERIFIER, ETHER // 2)
    assert (compute.staking.stake_of(), compute.staking.role_of(), compute.staking.status_of()) == (
        ETHER,
        1,
        1,
    )
    assert (verifier.staking.stake_of(), verifier.staking.role_of()) == (ETHER // 2, 2)
    assert compute.staking.is_eligible() and verifier.staking.is_eligible()

    queries = [new_id("query"), new_id("query")]
    model = keccak(text="SmolLM2-135M-Instruct")
    for query in queries:
        deposited = user.escrow.deposit(query, model, gateway, 10 * MILLI)
        assert deposited.event("Deposited")["amount"] == 10 * MILLI
        assert deposited.event("Deposited")["gateway"] == gateway
        assert user.escrow.is_funded(query)
    # one call answers everything a gateway checks before serving
    state = relayer.escrow.deposit_of(queries[0])
    assert (state["user"], state["amount"], state["status"]) == (user.address, 10 * MILLI, 1)
    assert (state["model_id"], state["gateway"]) == (model, gateway)

    fees = [6 * MILLI, 9 * MILLI]
    epoch = 1_000 + next(_labels)
    # A page of per-query fees pays only the deposits' own gateway: one leaf (QueryEscrow's
    # page rule; a page that pays the nodes too reverts RootNotPayee, below)
    tree = PayoutTree.for_epoch(epoch, {gateway: 15 * MILLI})
    assert tree.total == sum(fees)
    statement = PayoutRoot(
        epoch, tree.root, tree.total, queries_hash(queries, fees), deployment.address("QueryEscrow")
    )
    # 3 of 4 equal powers: 3·3 ≥ 2·4.
    sigs = committee_signatures(statement, COMMITTEE_KEYS[:3], relayer.committee.domain())
    split = PayoutTree.for_epoch(epoch, {compute.address: 12 * MILLI, verifier.address: 3 * MILLI})
    escrow = deployment.address("QueryEscrow")
    spread = PayoutRoot(epoch, split.root, split.total, queries_hash(queries, fees), escrow)
    spread_sigs = committee_signatures(spread, COMMITTEE_KEYS[:3], relayer.committee.domain())
    with pytest.raises(ContractRevert) as not_payee:
        relayer.escrow.post_payout_root(spread, queries, fees, spread_sigs)
    assert not_payee.value.error_name == "RootNotPayee"
    posted = relayer.escrow.post_payout_root(statement, queries, fees, sigs)
    assert posted.event("PayoutRootPosted")["epoch"] == epoch
    assert not user.escrow.is_funded(queries[0]) and not user.escrow.is_funded(queries[1])

    payout, proof = tree.proof_for(epoch, gateway)
    with pytest.raises(ChallengeWindowOpen) as early:
        gateway_chain.escrow.claim(epoch, payout.amount, proof)
    assert early.value.named_args["epoch"] == epoch

    travel(anvil, CHALLENGE_WINDOW_S + 1)

    # Only the payee may claim (the escrow pays the caller).
    with pytest.raises(ContractRevert) as relayed:
        relayer.transact("QueryEscrow", "claim", epoch, payout.account, payout.amount, proof)
    assert relayed.value.error_name == "NotPayee"
    # The payee receives exactly its amount, minus exactly the fee it paid.
    before = gateway_chain.balance()
    claimed = gateway_chain.escrow.claim(epoch, payout.amount, proof)
    assert gateway_chain.balance() - before == 15 * MILLI - claimed.fee_wei
    assert claimed.event("Claimed") == {"epoch": epoch, "account": gateway, "amount": 15 * MILLI}
    assert gateway_chain.escrow.is_claimed(epoch, gateway)
    assert verifier.escrow.epoch_of(epoch)["unclaimed"] == 0

    with pytest.raises(AlreadyClaimed):
        gateway_chain.escrow.claim(epoch, payout.amount, proof)
    with pytest.raises(InvalidClaim):  # a leaf the tree does not hold
        relayer.escrow.claim(epoch, 1, proof)

    # The user takes back what each settled query did not spend.
    before = user.balance()
    paid = sum(user.escrow.refund(q).fee_wei for q in queries)
    assert user.balance() - before == (10 * MILLI - 6 * MILLI) + (10 * MILLI - 9 * MILLI) - paid
    assert user.escrow.deposit_of(queries[0])["amount"] == 0


def test_fraud_reveal_mismatch_slashes_all_rewards_half_burns_half(
    deployment: Deployment, anvil: Anvil
) -> None:
    node = account(anvil, deployment, "cheater")
    challenger = account(anvil, deployment, "challenger")
    node.staking.stake(ROLE_COMPUTE, 2 * ETHER)
    domain = node.fraud_proofs.domain()
    session, salt = new_id("session"), new_id("salt")
    committed = Commitment(
        session, 4, 1, commitment_value(session, 4, 1, keccak(text="honest output"), salt), 100
    )
    revealed = Reveal(session, 4, 1, MANIFEST, INPUT, keccak(text="other output"), salt, 101)
    burned_before = challenger.staking.total_burned()
    dead_before = challenger.balance(BURN_ADDRESS)

    result = challenger.fraud_proofs.prove_reveal_mismatch(
        committed,
        committed.sign(node.account.key, domain),
        revealed,
        revealed.sign(node.account.key, domain),
    )

    slashed = result.event("Slashed")
    assert slashed["node"] == node.address and slashed["offence"] == 1
    assert (slashed["amount"], slashed["reward"], slashed["burned"]) == (2 * ETHER, ETHER, ETHER)
    assert node.staking.stake_of() == 0 and node.staking.status_of() == 0
    assert challenger.staking.credit_of() == ETHER
    assert challenger.staking.total_burned() - burned_before == ETHER
    assert challenger.balance(BURN_ADDRESS) - dead_before == ETHER

    before = challenger.balance()
    pulled = challenger.staking.claim_credit()
    assert challenger.balance() - before == ETHER - pulled.fee_wei
    assert challenger.staking.credit_of() == 0

    with pytest.raises(AlreadyProven):
        challenger.fraud_proofs.prove_reveal_mismatch(
            committed,
            committed.sign(node.account.key, domain),
            revealed,
            revealed.sign(node.account.key, domain),
        )


def test_fraud_honest_reveal_is_not_a_fault(deployment: Deployment, anvil: Anvil) -> None:
    node = account(anvil, deployment, "honest")
    node.staking.stake(ROLE_COMPUTE, ETHER)
    domain = node.fraud_proofs.domain()
    session, salt, output = new_id("session"), new_id("salt"), keccak(text="output")
    revealed = Reveal(session, 1, 0, MANIFEST, INPUT, output, salt, 11)
    committed = Commitment(session, 1, 0, revealed.commitment_value(), 10)
    with pytest.raises(ContractRevert) as caught:
        node.fraud_proofs.prove_reveal_mismatch(
            committed,
            committed.sign(node.account.key, domain),
            revealed,
            revealed.sign(node.account.key, domain),
        )
    assert caught.value.error_name == "NotAFault"
    assert node.staking.stake_of() == ETHER


def test_fraud_equivocation_slashes_all(deployment: Deployment, anvil: Anvil) -> None:
    node = account(anvil, deployment, "equivocator")
    challenger = account(anvil, deployment, "watcher")
    node.staking.stake(ROLE_VERIFIER, ETHER)
    domain = node.fraud_proofs.domain()
    session = new_id("session")
    first = Commitment(session, 9, 2, keccak(text="a"), 1)
    second = Commitment(session, 9, 2, keccak(text="b"), 2)
    result = challenger.fraud_proofs.prove_equivocation(
        first, first.sign(node.account.key, domain), second, second.sign(node.account.key, domain)
    )
    slashed = result.event("Slashed")
    assert (slashed["offence"], slashed["amount"], slashed["reward"]) == (2, ETHER, ETHER // 2)
    assert node.staking.stake_of() == 0
    assert challenger.staking.credit_of() == ETHER // 2


def test_fraud_signature_by_another_key_is_rejected(deployment: Deployment, anvil: Anvil) -> None:
    node = account(anvil, deployment, "victim")
    framer = account(anvil, deployment, "framer")
    node.staking.stake(ROLE_COMPUTE, ETHER)
    domain = node.fraud_proofs.domain()
    session = new_id("session")
    first = Commitment(session, 1, 0, keccak(text="a"), 1)
    forged = Commitment(session, 1, 0, keccak(text="b"), 1)
    with pytest.raises(ContractRevert) as caught:
        framer.fraud_proofs.prove_equivocation(
            first,
            first.sign(node.account.key, domain),
            forged,
            forged.sign(framer.account.key, domain),
        )
    assert caught.value.error_name == "SignerMismatch"
    assert caught.value.args == (node.address, framer.address)
    assert node.staking.stake_of() == ETHER


def test_verdict_committee_signed_slashes_half(deployment: Deployment, anvil: Anvil) -> None:
    node = account(anvil, deployment, "judged")
    challenger = account(anvil, deployment, "reporter")
    relayer = account(anvil, deployment, "relayer")
    node.staking.stake(ROLE_COMPUTE, 4 * ETHER)
    domain = relayer.committee.domain()
    nonce = 10_000 + next(_labels)
    verdict = Verdict(
        node.address,
        OFFENCE_FAILED_VERIFICATION,
        new_id("evidence"),
        challenger.address,
        nonce,
        deployment.address("FraudProofs"),
    )

    with pytest.raises(InsufficientPower) as weak:  # 2 of 4: 3·2 < 2·4
        relayer.fraud_proofs.slash_by_verdict(
            verdict, committee_signatures(verdict, COMMITTEE_KEYS[:2], domain)
        )
    assert weak.value.named_args == {"signed": 2, "total": 4}
    ordered = committee_signatures(verdict, COMMITTEE_KEYS, domain)
    with pytest.raises(SignersNotSorted):
        relayer.fraud_proofs.slash_by_verdict(verdict, list(reversed(ordered)))

    result = relayer.fraud_proofs.slash_by_verdict(verdict, ordered)
    slashed = result.event("Slashed")
    assert (slashed["offence"], slashed["amount"]) == (OFFENCE_FAILED_VERIFICATION, 2 * ETHER)
    assert (slashed["challenger"], slashed["reward"]) == (challenger.address, ETHER)
    assert node.staking.stake_of() == 2 * ETHER
    assert challenger.staking.credit_of() == ETHER
    with pytest.raises(ContractRevert) as reused:
        relayer.fraud_proofs.slash_by_verdict(verdict, ordered)
    assert reused.value.error_name == "VerdictNonceUsed"


def test_fault_verifier_hook_accepted_proof_slashes_half(
    deployment: Deployment, anvil: Anvil
) -> None:
    """A deployment wired to a fault verifier (here the test-only MockFaultVerifier, a sound
    verifier of a toy model whose output is keccak256(abi.encode(manifestHash, shard,
    inputHash))) slashes FailedVerification only for a reveal the node signed wrongly."""
    owner = PlanetChain(deployment, ANVIL_DEV_KEY)
    artifact = load_artifact("MockFaultVerifier")
    factory = owner.w3.eth.contract(abi=artifact["abi"], bytecode=artifact["bytecode"])
    signed = owner.account.sign_transaction(
        factory.constructor().build_transaction(
            {
                "from": owner.address,
                "nonce": owner.w3.eth.get_transaction_count(owner.address, "pending"),
            }
        )
    )
    receipt = owner.w3.eth.wait_for_transaction_receipt(
        owner.w3.eth.send_raw_transaction(signed.raw_transaction)
    )
    config = DeployConfig.devnet(
        committee=[(address_of(k), 1) for k in COMMITTEE_KEYS],
        fault_verifier=receipt["contractAddress"],
    )
    with_hook = deploy_all(anvil.rpc_url, ANVIL_DEV_KEY, config)
    node = account(anvil, with_hook, "wrong output")
    challenger = account(anvil, with_hook, "prover")
    node.staking.stake(ROLE_COMPUTE, 2 * ETHER)
    session, domain = new_id("session"), node.fraud_proofs.domain()
    right = keccak(abi_encode(["bytes32", "uint32", "bytes32"], [MANIFEST, 1, INPUT]))
    honest = Reveal(session, 2, 1, MANIFEST, INPUT, right, new_id("salt"), 5)
    with pytest.raises(ContractRevert) as sound:
        challenger.fraud_proofs.prove_computation_fault(
            honest, honest.sign(node.account.key, domain), b"fault"
        )
    assert sound.value.error_name == "NotAFault"
    revealed = Reveal(session, 3, 1, MANIFEST, INPUT, keccak(text="wrong"), new_id("salt"), 6)
    signature = revealed.sign(node.account.key, domain)
    with pytest.raises(ContractRevert) as rejected:
        challenger.fraud_proofs.prove_computation_fault(revealed, signature, b"not a proof")
    assert rejected.value.error_name == "NotAFault"

    result = challenger.fraud_proofs.prove_computation_fault(revealed, signature, b"fault")
    slashed = result.event("Slashed")
    assert (slashed["offence"], slashed["amount"], slashed["reward"]) == (3, ETHER, ETHER // 2)
    assert node.staking.stake_of() == ETHER
    # The module's deployment has no verifier: the hook is off there.
    plain = account(anvil, deployment, "prover")
    with pytest.raises(ContractRevert) as disabled:
        plain.fraud_proofs.prove_computation_fault(revealed, signature, b"")
    assert disabled.value.error_name == "FaultVerifierDisabled"


def test_committee_update_signed_by_old_committee_hands_over_power(anvil: Anvil) -> None:
    """On a deployment of its own (the module's committee must stay as it is)."""
    config = DeployConfig.devnet(committee=[(address_of(k), 1) for k in COMMITTEE_KEYS])
    fresh = deploy_all(anvil.rpc_url, ANVIL_DEV_KEY, config)
    relayer = account(anvil, fresh, "relayer")
    new_keys = [keccak(text=f"planet integration new committee {i}") for i in range(3)]
    members = sorted((address_of(k) for k in new_keys), key=lambda a: int(a, 16))
    update = CommitteeUpdate(tuple(members), (5, 1, 1), relayer.committee.nonce())
    domain = relayer.committee.domain()
    result = relayer.committee.update(update, committee_signatures(update, COMMITTEE_KEYS, domain))
    assert result.event("CommitteeUpdated")["totalPower"] == 7
    assert relayer.committee.members() == members and relayer.committee.nonce() == 1

    with pytest.raises(ContractRevert) as replayed:  # the consumed nonce cannot be reused
        relayer.committee.update(update, committee_signatures(update, new_keys, domain))
    assert replayed.value.error_name == "InvalidNonce"
    registration = ModelRegistration(
        new_id("model"), keccak(text="m"), (keccak(text="s"),), 0, fresh.address("ModelRegistry")
    )
    with pytest.raises(UnknownSigner):  # the old members have no power any more
        relayer.registry.register(
            registration, committee_signatures(registration, COMMITTEE_KEYS, domain)
        )
    # The member with power 5 of 7 alone is enough (3·5 ≥ 2·7).
    heavy = next(k for k in new_keys if address_of(k) == members[0])
    relayer.registry.register(registration, committee_signatures(registration, [heavy], domain))
    assert relayer.registry.manifest_hash_of(registration.model_id) == keccak(text="m")


def test_unstake_withdraw_only_after_delay(deployment: Deployment, anvil: Anvil) -> None:
    node = account(anvil, deployment, "leaver")
    node.staking.stake(ROLE_VERIFIER, ETHER)
    node.staking.request_unstake()
    assert node.staking.status_of() == 2 and node.staking.unbonding_at() > 0
    with pytest.raises(UnbondingNotElapsed):
        node.staking.withdraw()
    travel(anvil, CHALLENGE_WINDOW_S + 2)
    before = node.balance()
    result = node.staking.withdraw()
    assert node.balance() - before == ETHER - result.fee_wei
    assert node.staking.stake_of() == 0


def test_dispute_second_signed_root_freezes_epoch_and_refunds_fees(
    deployment: Deployment, anvil: Anvil
) -> None:
    user = account(anvil, deployment, "user")
    watcher = account(anvil, deployment, "watcher")
    query = new_id("query")
    user.escrow.deposit(query, keccak(text="model"), watcher.address, 10 * MILLI)
    epoch = 5_000 + next(_labels)
    tree = PayoutTree.for_epoch(epoch, {watcher.address: 4 * MILLI})
    domain = user.committee.domain()
    escrow = deployment.address("QueryEscrow")
    posted = PayoutRoot(epoch, tree.root, 4 * MILLI, queries_hash([query], [4 * MILLI]), escrow)
    posted_sigs = committee_signatures(posted, COMMITTEE_KEYS, domain)
    watcher.escrow.post_payout_root(posted, [query], [4 * MILLI], posted_sigs)
    other = PayoutRoot(epoch, keccak(text="other root"), 4 * MILLI, posted.queries_hash, escrow)
    result = watcher.escrow.dispute_root(
        epoch,
        [query],
        [4 * MILLI],
        posted_sigs,
        other,
        committee_signatures(other, COMMITTEE_KEYS, domain),
    )
    assert result.event("RootDisputed")["otherRoot"] == other.root
    assert watcher.escrow.epoch_of(epoch)["status"] == 2
    assert user.escrow.deposit_of(query)["amount"] == 10 * MILLI  # the whole deposit is back
    before = user.balance()
    refunded = user.escrow.refund(query)
    assert user.balance() - before == 10 * MILLI - refunded.fee_wei


def test_prepaid_balance_debited_by_posted_root_then_withdrawn_after_delay(
    deployment: Deployment, anvil: Anvil
) -> None:
    payer = account(anvil, deployment, "payer")
    late = account(anvil, deployment, "late payer")
    operator = account(anvil, deployment, "operator")
    gateway = address_of(new_id("gateway key"))
    payer.escrow.deposit_balance(gateway, 10 * MILLI)
    late.escrow.deposit_balance(gateway, 2 * MILLI)
    assert payer.escrow.prepaid_of(payer.address, gateway) == {
        "balance": 10 * MILLI,
        "withdrawable_at": 0,
    }
    with pytest.raises(WithdrawalNotRequested) as early:
        payer.escrow.withdraw_balance(gateway)
    assert early.value.named_args == {"payer": payer.address, "gateway": gateway}
    # `late` withdraws before the root that debits it lands: the root still posts (shortfall).
    late.escrow.request_withdrawal(gateway)
    timeout = payer.escrow.refund_timeout()
    with pytest.raises(WithdrawalNotYetAvailable):
        late.escrow.withdraw_balance(gateway)
    travel(anvil, timeout + 1)
    late.escrow.withdraw_balance(gateway)
    assert late.escrow.prepaid_of(late.address, gateway)["balance"] == 0

    epoch = 7_000 + next(_labels)
    payers = sorted([payer.address, late.address], key=lambda a: int(a, 16))
    gateways = [gateway, gateway]
    debits = [3 * MILLI if p == payer.address else MILLI for p in payers]
    tree = PayoutTree.for_epoch(epoch, {operator.address: 4 * MILLI})
    escrow = deployment.address("QueryEscrow")
    hashed = queries_hash([], [], payers, gateways, debits)
    statement = PayoutRoot(epoch, tree.root, 4 * MILLI, hashed, escrow)
    sigs = committee_signatures(statement, COMMITTEE_KEYS[:3], operator.committee.domain())
    posted = operator.escrow.post_payout_root(
        statement, [], [], sigs, payers=payers, gateways=gateways, debits=debits
    )
    assert posted.event("SettlementShortfall")["collected"] == 3 * MILLI
    assert payer.escrow.prepaid_of(payer.address, gateway)["balance"] == 7 * MILLI
    assert operator.escrow.shortfall_of(epoch) == {"total": 4 * MILLI, "collected": 3 * MILLI}
    assert operator.escrow.uncharged_of(epoch, late.address, gateway) == MILLI
    travel(anvil, CHALLENGE_WINDOW_S + 1)
    payout, proof = tree.proof_for(epoch, operator.address)
    claimed = operator.escrow.claim(epoch, payout.amount, proof)
    assert claimed.event("Claimed")["amount"] == 3 * MILLI  # pro rata: 4 · 3/4

    payer.escrow.request_withdrawal(gateway)
    travel(anvil, timeout + 1)
    before = payer.balance()
    result = payer.escrow.withdraw_balance(gateway)
    assert payer.balance() - before == 7 * MILLI - result.fee_wei


def test_prepaid_one_payer_two_gateways_each_debits_only_its_own_balance(
    deployment: Deployment, anvil: Anvil
) -> None:
    """Issue 24 (7): one balance can no longer be spent at every gateway. The payer funds two
    gateways; the first reports more than its own balance, the second its share: the first is
    charged only what was deposited for it, the second's balance pays only the second."""
    payer = account(anvil, deployment, "payer")
    operator = account(anvil, deployment, "operator")
    first, second = sorted(
        (address_of(new_id("gateway key")) for _ in range(2)), key=lambda a: int(a, 16)
    )
    payer.escrow.deposit_balance(first, 5 * MILLI)
    payer.escrow.deposit_balance(second, 3 * MILLI)
    assert payer.escrow.prepaid_of(payer.address, second)["balance"] == 3 * MILLI
    epoch = 8_000 + next(_labels)
    payers, gateways, debits = [payer.address] * 2, [first, second], [8 * MILLI, 2 * MILLI]
    tree = PayoutTree.for_epoch(epoch, {operator.address: 10 * MILLI})
    hashed = queries_hash([], [], payers, gateways, debits)
    statement = PayoutRoot(epoch, tree.root, 10 * MILLI, hashed, deployment.address("QueryEscrow"))
    sigs = committee_signatures(statement, COMMITTEE_KEYS, operator.committee.domain())
    posted = operator.escrow.post_payout_root(
        statement, [], [], sigs, payers=payers, gateways=gateways, debits=debits
    )
    assert posted.event("DebitShortfall") == {
        "epoch": epoch,
        "payer": payer.address,
        "gateway": first,
        "debit": 8 * MILLI,
        "charged": 5 * MILLI,
    }
    assert payer.escrow.prepaid_of(payer.address, first)["balance"] == 0
    assert payer.escrow.prepaid_of(payer.address, second)["balance"] == MILLI
    assert operator.escrow.uncharged_of(epoch, payer.address, first) == 3 * MILLI
    assert operator.escrow.epoch_of(epoch)["unclaimed"] == 7 * MILLI
    # the binding refuses unpaired debits before anything is sent
    with pytest.raises(ProtocolError, match="gateways"):
        operator.escrow.post_payout_root(statement, [], [], sigs, payers=payers, debits=debits)


def test_deposit_and_balance_for_the_zero_gateway_revert_invalid_gateway(
    deployment: Deployment, anvil: Anvil
) -> None:
    user = account(anvil, deployment, "user")
    with pytest.raises(InvalidGateway) as query:
        user.escrow.deposit(new_id("query"), keccak(text="m"), ZERO_ADDRESS, MILLI)
    assert query.value.named_args == {"gateway": ZERO_ADDRESS} and query.value.hint
    with pytest.raises(InvalidGateway):
        user.escrow.deposit_balance(ZERO_ADDRESS, MILLI)


def test_revert_decoding_typed_errors_with_arguments(deployment: Deployment, anvil: Anvil) -> None:
    user = account(anvil, deployment, "user")
    query = new_id("query")
    gateway = address_of(new_id("gateway key"))
    user.escrow.deposit(query, keccak(text="m"), gateway, MILLI)
    with pytest.raises(QueryExists) as twice:
        user.escrow.deposit(query, keccak(text="m"), user.address, MILLI)
    assert twice.value.error_name == "QueryExists"
    assert twice.value.args == (query,)
    assert twice.value.contract == "QueryEscrow" and twice.value.function == "deposit"
    assert "QueryExists(queryId=0x" in str(twice.value) and twice.value.hint

    with pytest.raises(BelowMinimum) as low:
        user.staking.stake(ROLE_COMPUTE, ETHER // 10)
    assert low.value.named_args["amount"] == ETHER // 10
    assert low.value.named_args["minimum"] == ETHER

    unknown = new_id("query")
    epoch = 900_000 + next(_labels)
    statement = PayoutRoot(
        epoch, keccak(text="r"), 1, queries_hash([unknown], [1]), deployment.address("QueryEscrow")
    )
    sigs = committee_signatures(statement, COMMITTEE_KEYS, user.committee.domain())
    with pytest.raises(QueryNotFunded) as unfunded:
        user.escrow.post_payout_root(statement, [unknown], [1], sigs)
    assert unfunded.value.args == (unknown,)


def test_model_registration_committee_signed_and_dev_shortcut(
    deployment: Deployment, anvil: Anvil
) -> None:
    relayer = account(anvil, deployment, "relayer")
    model, manifest = new_id("model"), keccak(text="manifest")
    shards = (keccak(text="s0"), keccak(text="s1"), keccak(text="s2"))
    registration = ModelRegistration(
        model, manifest, shards, relayer.registry.nonce(), deployment.address("ModelRegistry")
    )
    sigs = committee_signatures(registration, COMMITTEE_KEYS, relayer.committee.domain())
    relayer.registry.register(registration, sigs)
    assert relayer.registry.manifest_hash_of(model) == manifest
    assert relayer.registry.shard_hashes_of(model) == list(shards)

    with pytest.raises(ContractRevert) as not_owner:
        relayer.registry.dev_register(new_id("model"), manifest, shards)
    assert not_owner.value.error_name == "NotDevOwner"
    owner = PlanetChain(deployment, ANVIL_DEV_KEY)
    dev_model = new_id("model")
    owner.registry.dev_register(dev_model, manifest, shards[:1])
    assert owner.registry.shard_hashes_of(dev_model) == [shards[0]]


def test_recorded_work_keeps_stake_until_its_window_closes(
    deployment: Deployment, anvil: Anvil
) -> None:
    """Issue 13 (e): work a node signs while unbonding keeps its stake slashable for a full
    challenge window after the work's signedAt, even past the unstake delay."""
    node = account(anvil, deployment, "late worker")
    verifier = account(anvil, deployment, "recorder")
    node.staking.stake(ROLE_COMPUTE, ETHER)
    node.staking.request_unstake()
    withdrawable_at = node.staking.unbonding_at()
    travel(anvil, CHALLENGE_WINDOW_S // 2)
    signed_at = chain_time(anvil)
    work = Commitment(new_id("session"), 1, 0, keccak(text="late"), signed_at)
    recorded = verifier.fraud_proofs.record_commitment(
        work, work.sign(node.account.key, node.fraud_proofs.domain())
    )
    locked_until = signed_at + CHALLENGE_WINDOW_S + 1
    assert recorded.event("WithdrawLocked") == {"node": node.address, "lockedUntil": locked_until}
    assert node.staking.locked_until() == locked_until > withdrawable_at
    travel(anvil, withdrawable_at - chain_time(anvil))
    with pytest.raises(FraudWindowOpen) as locked:
        node.staking.withdraw()
    assert locked.value.named_args["lockedUntil"] == locked_until
    travel(anvil, locked_until - chain_time(anvil))
    before = node.balance()
    paid = node.staking.withdraw()
    assert node.balance() - before == ETHER - paid.fee_wei


def test_challenge_needs_own_earlier_commitment_and_consumer_binding(
    deployment: Deployment, anvil: Anvil
) -> None:
    """Issue 13 (c, d): a proof sent without its sender's commitment is refused; a verdict
    signed for another FraudProofs is refused."""
    node = account(anvil, deployment, "cheater")
    copier = account(anvil, deployment, "copier")
    node.staking.stake(ROLE_COMPUTE, ETHER)
    domain = node.fraud_proofs.domain()
    session = new_id("session")
    first = Commitment(session, 2, 0, keccak(text="a"), 1)
    second = Commitment(session, 2, 0, keccak(text="b"), 1)
    sig_a, sig_b = first.sign(node.account.key, domain), second.sign(node.account.key, domain)
    tuple_a = (first.session, first.step, first.shard, first.commitment, first.signed_at)
    tuple_b = (second.session, second.step, second.shard, second.commitment, second.signed_at)
    with pytest.raises(ChallengeNotCommitted):
        copier.transact(
            "FraudProofs", "proveEquivocation", tuple_a, sig_a, tuple_b, sig_b, b"\x00" * 32
        )
    assert node.staking.stake_of() == ETHER
    copier.fraud_proofs.prove_equivocation(first, sig_a, second, sig_b)  # commits, then proves
    assert copier.staking.credit_of() == ETHER // 2
    assert copier.fraud_proofs.penalty_of(evidence_id(node.address, session, 2, 0)) == 10_000

    other = account(anvil, deployment, "other")
    verdict = Verdict(
        other.address, 4, new_id("evidence"), copier.address, 77_000 + next(_labels), ZERO_ADDRESS
    )
    with pytest.raises(WrongConsumer):
        copier.fraud_proofs.slash_by_verdict(
            verdict, committee_signatures(verdict, COMMITTEE_KEYS, copier.committee.domain())
        )


def test_client_unreachable_rpc_is_unavailable_with_hint(deployment: Deployment) -> None:
    with pytest.raises(UnavailableError) as caught:
        PlanetChain(deployment, ANVIL_DEV_KEY, rpc_url=f"http://127.0.0.1:{UNUSED_PORT}")
    assert caught.value.hint


def test_client_wrong_chain_is_config_error(deployment: Deployment, anvil: Anvil) -> None:
    other = Deployment(
        chain_id=1,
        rpc_url=anvil.rpc_url,
        deployer=deployment.deployer,
        block=0,
        contracts=deployment.contracts,
    )
    with pytest.raises(ConfigError, match="chain 31337"):
        PlanetChain(other, ANVIL_DEV_KEY)


def test_deploy_wrong_chain_and_unfunded_deployer_are_refused(anvil: Anvil) -> None:
    config = DeployConfig.devnet(committee=[(address_of(COMMITTEE_KEYS[0]), 1)])
    with pytest.raises(ConfigError, match="expected 1"):
        deploy_all(anvil.rpc_url, ANVIL_DEV_KEY, config, expected_chain_id=1)
    with pytest.raises(PlanetError) as broke:
        deploy_all(anvil.rpc_url, keccak(text="planet unfunded deployer"), config)
    assert broke.value.code == "insufficient_funds" and broke.value.hint


def test_cli_deploy_own_anvil_serves_until_sigterm(tmp_path: Path, anvil: Anvil) -> None:
    out = tmp_path / "deployment.json"
    env = {**os.environ, "PLANET_LOG_LEVEL": "WARNING"}
    command = [
        sys.executable,
        "-m",
        "planet",
        "contracts",
        "deploy",
        "--port",
        str(CLI_PORT),
        "--out",
        str(out),
        "--json",
    ]
    process = subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        summary = json.loads(process.stdout.readline())  # printed once deployed
        assert summary["chain_id"] == 31337 and out.is_file()
        assert summary["rpc_url"] == f"http://127.0.0.1:{CLI_PORT}"
        written = Deployment.load(out)
        assert {n: c.address for n, c in written.contracts.items()} == summary["contracts"]
        client = PlanetChain(written, ANVIL_DEV_KEY)
        assert client.committee.members() == [written.deployer]  # default committee
        assert client.call("QueryEscrow", "challengeWindow") == 60
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    assert process.returncode == 0, stderr
    assert "starting anvil" in stderr and "wrote" in stderr
    with pytest.raises(UnavailableError):
        PlanetChain(written, ANVIL_DEV_KEY)  # the anvil it started is gone


def test_cli_deploy_unreachable_rpc_exits_with_hint(tmp_path: Path) -> None:
    result = run_captured(
        [
            sys.executable,
            "-m",
            "planet",
            "contracts",
            "deploy",
            "--rpc",
            f"http://127.0.0.1:{UNUSED_PORT}",
            "--out",
            str(tmp_path / "d.json"),
        ],
        cwd=REPO_ROOT,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == UnavailableError.exit_status
    assert "error:" in result.stderr and "hint:" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "d.json").exists()


def _planet_balance(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PLANET_HOME": str(tmp_path / "home"),  # no devnet.json: only the flags count
        "PLANET_PASSWORD": "pw",
        "PLANET_LOG_LEVEL": "WARNING",
    }
    return run_captured(
        [sys.executable, "-m", "planet", "balance", *argv],
        cwd=REPO_ROOT,
        env=env,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_balance_per_gateway_by_address_deposit_show_withdraw(
    tmp_path: Path, deployment: Deployment, anvil: Anvil
) -> None:
    """`planet balance … --gateway 0x…` needs no running gateway (a balance at a gateway that is
    down can still be withdrawn); each gateway's balance is its own."""
    from node.keys import create_dev_wallet

    payer = account(anvil, deployment, "cli payer")
    wallet = tmp_path / "wallet.json"
    create_dev_wallet(wallet, "pw", bytes(payer.account.key))
    path = deployment.save(tmp_path / "deployment.json")
    first, second = (address_of(new_id("gateway key")) for _ in range(2))
    common = ["--deployment", str(path), "--evm-rpc", anvil.rpc_url, "--wallet", str(wallet)]

    done = _planet_balance(tmp_path, "deposit", "0.002", "--gateway", first, "--json", *common)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["action"], answer["gateway"], answer["balance_wei"]) == (
        "deposited",
        first,
        str(2 * MILLI),
    )
    assert payer.escrow.prepaid_of(payer.address, first)["balance"] == 2 * MILLI
    shown = _planet_balance(tmp_path, "show", "--gateway", second.lower(), *common)
    assert shown.returncode == 0, shown.stderr
    assert f"at gateway {second}: 0 wei" in shown.stdout
    # nothing to withdraw at the other gateway: a user mistake, error + hint, no traceback
    empty = _planet_balance(tmp_path, "withdraw", "--gateway", second, *common)
    assert empty.returncode == 2
    assert "error:" in empty.stderr and "is empty" in empty.stderr and "hint:" in empty.stderr
    assert "Traceback" not in empty.stderr
    requested = _planet_balance(tmp_path, "withdraw", "--gateway", first, "--json", *common)
    assert json.loads(requested.stdout)["action"] == "requested", requested.stderr
    early = _planet_balance(tmp_path, "withdraw", "--gateway", first, *common)
    assert early.returncode == 2 and "opens at" in early.stderr and "hint:" in early.stderr
    travel(anvil, payer.escrow.refund_timeout() + 1)
    withdrawn = _planet_balance(tmp_path, "withdraw", "--gateway", first, "--json", *common)
    assert json.loads(withdrawn.stdout)["action"] == "withdrawn", withdrawn.stderr
    assert payer.escrow.prepaid_of(payer.address, first) == {"balance": 0, "withdrawable_at": 0}


def test_cli_balance_unreachable_gateway_url_names_the_address_way(
    tmp_path: Path, deployment: Deployment, anvil: Anvil
) -> None:
    from node.keys import create_dev_wallet

    payer = account(anvil, deployment, "cli payer")
    wallet = tmp_path / "wallet.json"
    create_dev_wallet(wallet, "pw", bytes(payer.account.key))
    path = deployment.save(tmp_path / "deployment.json")
    closed = f"http://127.0.0.1:{UNUSED_PORT}"
    result = _planet_balance(
        tmp_path, "show", "--gateway", closed, "--deployment", str(path),
        "--evm-rpc", anvil.rpc_url, "--wallet", str(wallet),
    )  # fmt: skip
    assert result.returncode == UnavailableError.exit_status
    assert "error:" in result.stderr and "--gateway 0x" in result.stderr
    assert "Traceback" not in result.stderr


def test_two_senders_of_one_account_both_land_when_one_took_the_others_nonce(
    deployment: Deployment, anvil: Anvil
) -> None:
    """Two processes paying from one wallet (two `planet ask --pay` at once): the second's
    counted nonce was taken by the first, so its send is refused "nonce too low"; it is signed
    again with the chain's next nonce and lands, and both deposits count."""
    key = keccak(text=f"planet integration one wallet {next(_labels)}")
    rpc_call(anvil.rpc_url, "anvil_setBalance", [address_of(key), hex(100 * ETHER)])
    gateway = address_of(keccak(text="one wallet gateway"))
    first, second = PlanetChain(deployment, key), PlanetChain(deployment, key)
    second.escrow.deposit_balance(gateway, MILLI)  # counts its next nonce: 1
    first.escrow.deposit_balance(gateway, MILLI)  # reads the chain's: 1, and takes it
    second.escrow.deposit_balance(gateway, MILLI)  # its 1 is taken: signed again with 2
    assert first.escrow.prepaid_of(address_of(key), gateway)["balance"] == 3 * MILLI
