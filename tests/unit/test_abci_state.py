"""Committee state machine: every tx type's transitions and rejections, with named codes."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
from nacl.signing import SigningKey

from abci_app import schema
from abci_app.codes import Code
from abci_app.queries import query
from protocol.committee.commitments import CommitBatch, CommitmentRecord, RevealBatch, RevealRecord
from protocol.committee.prices import SetPrice
from protocol.committee.registry import (
    AttestStake,
    Heartbeat,
    Leave,
    RegisterNode,
    sign_registration,
)
from protocol.committee.verification import VerdictVote
from protocol.eip712 import Verdict, address_of, commitment_value, committee_domain
from tests.committee_chain import (
    COMMITTEE_ADDRESS,
    EVM_CHAIN_ID,
    FRAUD_PROOFS_ADDRESS,
    Chain,
    seeded_evm_key,
    seeded_key,
)

pytestmark = pytest.mark.unit

SESSION = "0x" + "01" * 32
OUTPUT = "0x" + "02" * 32
SALT = "0x" + "03" * 32


def ask(chain: Chain, path: str) -> dict:
    code, value, log = query(chain.state, path, b"")
    assert code == Code.OK, log
    return json.loads(value)


def register_body(
    label: str, role: str = "compute", shards: tuple[int, ...] = (0,)
) -> RegisterNode:
    key = seeded_key(label)
    evm = seeded_evm_key(label)
    return RegisterNode(
        evm_address=address_of(evm),
        evm_signature=sign_registration(evm, key.verify_key.encode().hex()),
        role=role,
        model="m",
        shards=shards,
        endpoint=f"http://{label}",
        capacity=2,
    )


def register(chain: Chain, label: str, **kwargs: object) -> SigningKey:
    key = seeded_key(label)
    [result] = chain.block([chain.tx(register_body(label, **kwargs), key)])  # type: ignore[arg-type]
    assert result.code == Code.OK, result.log
    return key


def hexkey(key: SigningKey) -> str:
    return key.verify_key.encode().hex()


def node(chain: Chain, key: SigningKey) -> dict:
    return ask(chain, f"/node?key={hexkey(key)}")


def commit_served(chain: Chain, key: SigningKey, shard: int = 0, blocks: int = 4) -> None:
    """`blocks` commitment records of `key` on `shard` (32 positions each): the committed served
    work a redemption consumes (abci_app/coverage.py)."""
    [result] = chain.block([served_commit_tx(chain, key, shard, blocks)])
    assert result.code == Code.OK, result.log


def price_txs(chain: Chain, key: SigningKey, shard: int = 0, positions: int = 1) -> list[bytes]:
    """A `set_price` tx of `positions` per credit on `shard` when `key` registered no price
    there yet (a redemption needs one: abci_app/prices.py), else none; to put in the block
    before a redemption (a first price counts from its own block)."""
    if chain.state.get(schema.PRICE, schema.price_key(hexkey(key), shard)) is not None:
        return []
    return [chain.tx(SetPrice("m", shard, positions), key)]


def served_commit_tx(chain: Chain, key: SigningKey, shard: int = 0, blocks: int = 4) -> bytes:
    """The `commit` tx of `commit_served`, to put in a block with others."""
    session = (
        "0x"
        + hashlib.sha256(b"served/%s/%d" % (hexkey(key).encode(), chain.state.height)).hexdigest()
    )
    records = tuple(
        CommitmentRecord(
            session,
            step,
            shard,
            "0x" + hashlib.sha256(b"c%d" % step + session.encode()).hexdigest(),
        )
        for step in range(blocks)
    )
    return chain.tx(CommitBatch(records), key)


def stake(chain: Chain, key: SigningKey, amount: int = 10**18) -> None:
    """`key` staked (3 of the 4 validators attest `amount`): in its model's staked pool, so it
    may commit (abci_app/commitments.py)."""
    txs = [chain.tx(AttestStake(hexkey(key), amount), v.key) for v in chain.validators[:3]]
    assert [r.code for r in chain.block(txs)] == [Code.OK] * 3


def make_routable(chain: Chain, key: SigningKey, amount: int = 10**18) -> None:
    txs = [chain.tx(Heartbeat(), key)]
    txs += [chain.tx(AttestStake(hexkey(key), amount), v.key) for v in chain.validators[:3]]
    results = chain.block(txs)
    assert [r.code for r in results] == [Code.OK] * 4


# --- authentication and nonces ------------------------------------------------------------------


def test_abci_register_node_valid_becomes_join() -> None:
    chain = Chain()
    key = register(chain, "n1")
    info = node(chain, key)
    assert info["status"] == "JOIN"
    assert info["evm_address"] == address_of(seeded_evm_key("n1"))
    assert info["reputation"] == 500_000
    assert info["routable"] is False


def finalize_raw(chain: Chain, txs: list[bytes]) -> list:
    """Run a block without PrepareProposal's filtering (as a byzantine proposer could)."""
    machine = chain.machine
    machine.begin_block(chain.state.height + 1, b"\x00" * 32)
    results = [machine.deliver_tx(raw, i) for i, raw in enumerate(txs)]
    machine.end_block()
    machine.commit()
    return results


def tampered(raw: bytes) -> bytes:
    data = bytearray(raw)
    index = data.index(b'"sig":"') + 8
    data[index] = ord("0") if data[index] != ord("0") else ord("1")
    return bytes(data)


def test_abci_bad_signature_rejected_in_check_proposal_and_block() -> None:
    chain = Chain()
    raw = tampered(chain.tx(Heartbeat(), seeded_key("n1")))
    assert chain.machine.check_tx(raw).code == Code.BAD_SIGNATURE
    ok, reason = chain.machine.process_proposal(1, [raw])
    assert not ok and "signature" in reason
    assert chain.machine.prepare_proposal(1, [raw], 1 << 20, None) == []
    assert finalize_raw(chain, [raw])[0].code == Code.BAD_SIGNATURE


def test_abci_check_tx_malformed_rejected() -> None:
    chain = Chain()
    assert chain.machine.check_tx(b"{}").code == Code.MALFORMED_TX
    assert chain.machine.check_tx(b"\xff\xfe").code == Code.MALFORMED_TX


def test_abci_check_tx_injected_extension_tx_reserved() -> None:
    chain = Chain()
    chain.advance_to(5)
    vx = chain.extended_commit(5)
    assert chain.machine.check_tx(vx).code == Code.RESERVED_TX


def test_abci_replayed_nonce_rejected_in_check_and_block() -> None:
    chain = Chain()
    key = register(chain, "n1")
    first = chain.tx(Heartbeat(), key, nonce=2)
    assert chain.block([first])[0].code == Code.OK
    replay = chain.tx(Heartbeat(), key, nonce=2)
    assert chain.machine.check_tx(replay).code == Code.BAD_NONCE
    older = chain.tx(Heartbeat(), key, nonce=1)
    assert chain.machine.check_tx(older).code == Code.BAD_NONCE
    assert chain.block([first])[0].code == Code.BAD_NONCE
    assert ask(chain, f"/nonce?account={hexkey(key)}")["nonce"] == 2


def test_abci_nonce_gaps_allowed_and_consumed_by_rejected_tx() -> None:
    chain = Chain()
    key = register(chain, "n1")
    chain.block([chain.tx(Leave(), key, nonce=5)])
    [result] = chain.block([chain.tx(Heartbeat(), key, nonce=10)])
    assert result.code == Code.INVALID_LIFECYCLE
    # a known account's refused tx spends its nonce: the same bytes cannot be replayed later
    assert ask(chain, f"/nonce?account={hexkey(key)}")["nonce"] == 10
    assert chain.machine.check_tx(chain.tx(Heartbeat(), key, nonce=10)).code == Code.BAD_NONCE


def test_abci_two_txs_same_account_one_block_in_order() -> None:
    chain = Chain()
    key = register(chain, "n1")
    results = chain.block([chain.tx(Heartbeat(), key), chain.tx(Leave(), key)])
    assert [r.code for r in results] == [Code.OK, Code.OK]
    assert node(chain, key)["status"] == "LEFT"


# --- registry -----------------------------------------------------------------------------------


def test_abci_register_twice_rejected() -> None:
    chain = Chain()
    key = register(chain, "n1")
    [result] = chain.block([chain.tx(register_body("n1"), key)])
    assert result.code == Code.ALREADY_REGISTERED


def test_abci_register_bad_evm_signature_rejected() -> None:
    chain = Chain()
    body = dataclasses.replace(
        register_body("n1"), evm_address=address_of(seeded_evm_key("someone-else"))
    )
    raw = chain.tx(body, seeded_key("n1"))
    assert chain.machine.check_tx(raw).code == Code.BAD_EVM_SIGNATURE
    assert finalize_raw(chain, [raw])[0].code == Code.BAD_EVM_SIGNATURE
    assert query(chain.state, f"/node?key={hexkey(seeded_key('n1'))}", b"")[0] == Code.NOT_FOUND


def test_abci_register_evm_address_taken_rejected() -> None:
    chain = Chain()
    register(chain, "n1")
    evm = seeded_evm_key("n1")
    other = seeded_key("n2")
    body = RegisterNode(
        evm_address=address_of(evm),
        evm_signature=sign_registration(evm, hexkey(other)),
        role="compute",
        model="m",
        shards=(0,),
        endpoint="http://n2",
        capacity=1,
    )
    assert chain.block([chain.tx(body, other)])[0].code == Code.EVM_ADDRESS_TAKEN


# --- lifecycle ----------------------------------------------------------------------------------


def test_abci_lifecycle_join_serving_down_serving_left() -> None:
    chain = Chain()  # heartbeat_timeout = 4 blocks
    key = register(chain, "n1")  # height 1
    assert chain.block([chain.tx(Heartbeat(), key)])[0].code == Code.OK  # height 2
    assert node(chain, key)["status"] == "SERVING"
    chain.advance_to(6)  # last heartbeat 2, 2 + 4 = 6: still within the timeout
    assert node(chain, key)["status"] == "SERVING"
    chain.advance_to(7)  # 7 > 2 + 4: DOWN, exactly at this height
    info = node(chain, key)
    assert info["status"] == "DOWN"
    assert info["status_height"] == 7
    chain.block([chain.tx(Heartbeat(), key)])
    assert node(chain, key)["status"] == "SERVING"
    chain.block([chain.tx(Leave(), key)])
    assert node(chain, key)["status"] == "LEFT"
    assert chain.block([chain.tx(Heartbeat(), key)])[0].code == Code.INVALID_LIFECYCLE
    assert chain.block([chain.tx(Leave(), key)])[0].code == Code.INVALID_LIFECYCLE
    chain.advance_to(20)
    assert node(chain, key)["status"] == "LEFT"  # timeouts never resurrect or touch LEFT


def test_abci_join_without_heartbeat_goes_down() -> None:
    chain = Chain()
    key = register(chain, "n1")  # height 1
    chain.advance_to(6)
    assert node(chain, key)["status"] == "DOWN"


def test_abci_heartbeat_unknown_node_rejected() -> None:
    chain = Chain()
    assert chain.block([chain.tx(Heartbeat(), seeded_key("nobody"))])[0].code == Code.UNKNOWN_NODE


# --- stake attestations -------------------------------------------------------------------------


def test_abci_attestation_by_non_validator_rejected() -> None:
    chain = Chain()
    key = register(chain, "n1")
    result = chain.block([chain.tx(AttestStake(hexkey(key), 10**18), key)])[0]
    assert result.code == Code.NOT_VALIDATOR


def test_abci_attestation_unknown_node_rejected() -> None:
    chain = Chain()
    result = chain.block([chain.tx(AttestStake("ab" * 32, 1), chain.validators[0].key)])[0]
    assert result.code == Code.UNKNOWN_NODE


def test_abci_stake_agreed_only_at_two_thirds_same_amount() -> None:
    chain = Chain()  # 4 validators × 10 power: 2/3 needs 3 of them
    key = register(chain, "n1")
    chain.block([chain.tx(Heartbeat(), key)])
    v = chain.validators
    chain.block([chain.tx(AttestStake(hexkey(key), 10**18), v[0].key)])
    chain.block([chain.tx(AttestStake(hexkey(key), 10**18), v[1].key)])
    chain.block([chain.tx(AttestStake(hexkey(key), 2 * 10**18), v[2].key)])
    info = node(chain, key)
    assert info["stake"] is None and info["routable"] is False
    chain.block([chain.tx(AttestStake(hexkey(key), 10**18), v[3].key)])
    info = node(chain, key)
    assert info["stake"] == str(10**18)
    assert info["routable"] is True


def test_abci_stake_below_minimum_not_routable() -> None:
    chain = Chain()
    key = register(chain, "n1")
    make_routable(chain, key, amount=10**17)
    info = node(chain, key)
    assert info["stake"] == str(10**17)
    assert info["routable"] is False


# --- commit-reveal ------------------------------------------------------------------------------


def commitment(output: str = OUTPUT, salt: str = SALT, step: int = 1) -> str:
    return "0x" + commitment_value(SESSION, step, 0, output, salt).hex()


def test_abci_commit_reveal_match_recorded() -> None:
    chain = Chain()
    key = register(chain, "n1")
    stake(chain, key)
    records = tuple(CommitmentRecord(SESSION, step, 0, commitment(step=step)) for step in (1, 2))
    assert chain.block([chain.tx(CommitBatch(records), key)])[0].code == Code.OK
    reveal = RevealBatch((RevealRecord(SESSION, 1, 0, OUTPUT, SALT),))
    assert chain.block([chain.tx(reveal, key)])[0].code == Code.OK
    answer = ask(chain, f"/commitments?node={hexkey(key)}")["commitments"]
    assert len(answer) == 2
    assert len(ask(chain, f"/commitments?node={hexkey(key)}&limit=1")["commitments"]) == 1
    assert answer[0]["match"] is True and answer[0]["output_hash"] == OUTPUT
    assert "match" not in answer[1]
    assert ask(chain, "/evidence")["evidence"] == []


def test_abci_reveal_mismatch_stored_as_evidence() -> None:
    chain = Chain()
    key = register(chain, "n1")
    stake(chain, key)
    chain.block([chain.tx(CommitBatch((CommitmentRecord(SESSION, 1, 0, commitment()),)), key)])
    wrong = RevealBatch((RevealRecord(SESSION, 1, 0, "0x" + "ff" * 32, SALT),))
    [result] = chain.block([chain.tx(wrong, key)])
    assert result.code == Code.OK
    assert any(kind == "planet.evidence" for kind, _ in result.events)
    [evidence] = ask(chain, "/evidence")["evidence"]
    assert evidence["kind"] == "reveal_mismatch"
    assert evidence["node"] == hexkey(key)
    assert evidence["commitment"] == commitment()
    assert evidence["id"].startswith("0x") and len(evidence["id"]) == 66


def test_abci_reveal_unknown_commitment_rejects_whole_batch() -> None:
    chain = Chain()
    key = register(chain, "n1")
    stake(chain, key)
    chain.block([chain.tx(CommitBatch((CommitmentRecord(SESSION, 1, 0, commitment()),)), key)])
    batch = RevealBatch(
        (RevealRecord(SESSION, 1, 0, OUTPUT, SALT), RevealRecord(SESSION, 9, 0, OUTPUT, SALT))
    )
    assert chain.block([chain.tx(batch, key)])[0].code == Code.UNKNOWN_COMMITMENT
    [record] = ask(chain, "/commitments")["commitments"]
    assert "revealed_height" not in record  # atomic: the valid half was not applied either


def test_abci_reveal_twice_rejected() -> None:
    chain = Chain()
    key = register(chain, "n1")
    stake(chain, key)
    chain.block([chain.tx(CommitBatch((CommitmentRecord(SESSION, 1, 0, commitment()),)), key)])
    reveal = RevealBatch((RevealRecord(SESSION, 1, 0, OUTPUT, SALT),))
    chain.block([chain.tx(reveal, key)])
    assert chain.block([chain.tx(reveal, key)])[0].code == Code.ALREADY_REVEALED


def test_abci_duplicate_commitment_rejected_and_conflict_is_equivocation() -> None:
    chain = Chain()
    key = register(chain, "n1")
    stake(chain, key)
    batch = CommitBatch((CommitmentRecord(SESSION, 1, 0, commitment()),))
    chain.block([chain.tx(batch, key)])
    assert chain.block([chain.tx(batch, key)])[0].code == Code.DUPLICATE_COMMITMENT
    other = CommitBatch((CommitmentRecord(SESSION, 1, 0, "0x" + "ee" * 32),))
    assert chain.block([chain.tx(other, key)])[0].code == Code.OK
    [evidence] = ask(chain, "/evidence")["evidence"]
    assert evidence["kind"] == "equivocation"
    [record] = ask(chain, "/commitments")["commitments"]
    assert record["commitment"] == commitment()  # the first commitment stands


def test_abci_commit_by_verifier_wrong_role() -> None:
    chain = Chain()
    key = register(chain, "v1", role="verifier")
    batch = CommitBatch((CommitmentRecord(SESSION, 1, 0, commitment()),))
    assert chain.block([chain.tx(batch, key)])[0].code == Code.WRONG_ROLE


def test_abci_commit_unknown_node_rejected() -> None:
    chain = Chain()
    batch = CommitBatch((CommitmentRecord(SESSION, 1, 0, commitment()),))
    assert chain.block([chain.tx(batch, seeded_key("x"))])[0].code == Code.UNKNOWN_NODE


# --- verdicts -----------------------------------------------------------------------------------


def verdict_vote(
    chain: Chain, index: int, verdict: Verdict, signer_key: bytes | None = None
) -> bytes:
    validator = chain.validators[index]
    domain = committee_domain(EVM_CHAIN_ID, COMMITTEE_ADDRESS)
    signature = verdict.sign(signer_key or validator.operator_key, domain)
    body = VerdictVote(
        node=verdict.node,
        offence=verdict.offence,
        evidence_hash="0x" + verdict.evidence_hash.hex(),
        challenger=verdict.challenger,
        verdict_nonce=verdict.nonce,
        signature="0x" + signature.hex(),
    )
    return chain.tx(body, validator.key)


VERDICT = Verdict(
    node=address_of(seeded_evm_key("n1")),
    offence=3,
    evidence_hash=b"\x42" * 32,
    challenger=address_of(seeded_evm_key("challenger")),
    nonce=1,
    consumer=FRAUD_PROOFS_ADDRESS,
)


def test_abci_verdict_below_two_thirds_not_confirmed_then_confirmed() -> None:
    chain = Chain()
    results = chain.block([verdict_vote(chain, 0, VERDICT), verdict_vote(chain, 1, VERDICT)])
    assert [r.code for r in results] == [Code.OK, Code.OK]
    [verdict] = ask(chain, "/verdicts")["verdicts"]
    assert verdict["confirmed"] is False and verdict["power"] == 20
    chain.block([verdict_vote(chain, 2, VERDICT)])
    answer = ask(chain, f"/verdicts?id={verdict['id']}")
    assert answer["confirmed"] is True and answer["power"] == 30
    assert answer["id"] == "0x" + VERDICT.struct_hash().hex()
    # signatures come sorted by ascending operator address and recover to those operators
    domain = committee_domain(EVM_CHAIN_ID, COMMITTEE_ADDRESS)
    signers = [VERDICT.recover(bytes.fromhex(s[2:]), domain) for s in answer["signatures"]]
    assert signers == answer["signers"]
    assert [int(s, 16) for s in signers] == sorted(int(s, 16) for s in signers)
    assert set(signers) == {v.operator for v in chain.validators[:3]}


def test_abci_verdict_duplicate_vote_rejected() -> None:
    chain = Chain()
    chain.block([verdict_vote(chain, 0, VERDICT)])
    assert chain.block([verdict_vote(chain, 0, VERDICT)])[0].code == Code.DUPLICATE_VOTE


def test_abci_verdict_signature_by_wrong_key_rejected() -> None:
    chain = Chain()
    raw = verdict_vote(chain, 0, VERDICT, signer_key=seeded_evm_key("intruder"))
    assert chain.block([raw])[0].code == Code.BAD_VERDICT_SIGNATURE


def test_abci_verdict_vote_by_non_validator_rejected() -> None:
    chain = Chain()
    domain = committee_domain(EVM_CHAIN_ID, COMMITTEE_ADDRESS)
    body = VerdictVote(
        node=VERDICT.node,
        offence=VERDICT.offence,
        evidence_hash="0x" + VERDICT.evidence_hash.hex(),
        challenger=VERDICT.challenger,
        verdict_nonce=1,
        signature="0x" + VERDICT.sign(seeded_evm_key("x"), domain).hex(),
    )
    assert chain.block([chain.tx(body, seeded_key("x"))])[0].code == Code.NOT_VALIDATOR


def test_abci_verdict_without_evm_genesis_disabled() -> None:
    chain = Chain(genesis={"evm": None})
    assert chain.block([verdict_vote(chain, 0, VERDICT)])[0].code == Code.VERDICTS_DISABLED


def test_abci_verdict_without_consumer_in_genesis_disabled() -> None:
    """A verdict names the FraudProofs contract it is for: no consumer, no verdicts."""
    chain = Chain(
        genesis={"evm": {"chain_id": EVM_CHAIN_ID, "committee_address": COMMITTEE_ADDRESS}}
    )
    assert chain.block([verdict_vote(chain, 0, VERDICT)])[0].code == Code.VERDICTS_DISABLED


def test_abci_verdict_signed_for_other_consumer_rejected() -> None:
    chain = Chain()
    other = dataclasses.replace(VERDICT, consumer=address_of(seeded_evm_key("elsewhere")))
    validator = chain.validators[0]
    signature = other.sign(
        validator.operator_key, committee_domain(EVM_CHAIN_ID, COMMITTEE_ADDRESS)
    )
    body = VerdictVote(
        node=VERDICT.node,
        offence=VERDICT.offence,
        evidence_hash="0x" + VERDICT.evidence_hash.hex(),
        challenger=VERDICT.challenger,
        verdict_nonce=VERDICT.nonce,
        signature="0x" + signature.hex(),
    )
    assert chain.block([chain.tx(body, validator.key)])[0].code == Code.BAD_VERDICT_SIGNATURE


# --- epochs and pool health ---------------------------------------------------------------------


def test_abci_epoch_leader_and_challenges_fixed_from_block_hash() -> None:
    chain = Chain()  # epoch_length 5
    a = register(chain, "a")
    b = register(chain, "b")
    v = register(chain, "v", role="verifier")
    for key in (a, b):  # the draw is among the staked pools' SERVING nodes (test_abci_epoch_draw)
        make_routable(chain, key)  # heights 4, 5
    chain.advance_to(8)
    chain.block([chain.tx(Heartbeat(), k) for k in (a, b, v)])  # height 9
    chain.block(block_hash=b"\x07" * 32)  # height 10 closes epoch 2
    epochs = ask(chain, "/epochs?epoch=3")
    assert epochs["current"] == 3
    [epoch] = epochs["epochs"]
    assert epoch["seed"] == "07" * 32
    assert epoch["start_height"] == 11 and epoch["end_height"] == 15
    assert epoch["leader"] in {val.address for val in chain.validators}
    assert [c["node"] for c in epoch["challenges"]] == sorted([hexkey(a), hexkey(b)])
    assert len({c["prompt_seed"] for c in epoch["challenges"]}) == 2
    # the same chain with the same block hashes picks the same leader and seeds
    twin = Chain()
    register(twin, "a")
    register(twin, "b")
    register(twin, "v", role="verifier")
    for key in (a, b):
        make_routable(twin, key)
    twin.advance_to(8)
    twin.block([twin.tx(Heartbeat(), k) for k in (a, b, v)])  # height 9
    twin.block(block_hash=b"\x07" * 32)
    assert ask(twin, "/epochs?epoch=3") == epochs
    assert twin.state.app_hash == chain.state.app_hash


def test_abci_epoch_challenges_per_epoch_limits_list() -> None:
    chain = Chain(genesis={"challenges_per_epoch": 1})
    keys = [register(chain, label) for label in ("a", "b")]
    for key in keys:
        make_routable(chain, key)  # heights 3, 4
    chain.advance_to(5)
    [epoch] = ask(chain, "/epochs?epoch=2")["epochs"]
    assert len(epoch["challenges"]) == 1


def test_abci_pool_health_incomplete_degraded_healthy() -> None:
    chain = Chain(genesis={"models": {"m": {"shards": 2}}})
    assert ask(chain, "/pool_health?model=m")["status"] == "incomplete"
    keys = [register(chain, f"s0-{i}", shards=(0,)) for i in range(3)]
    keys += [register(chain, "s1-0", shards=(1,))]
    for key in keys:
        make_routable(chain, key)
    health = ask(chain, "/pool_health?model=m")
    assert health["routable_per_shard"] == [3, 1]
    assert health["status"] == "degraded"
    more = [register(chain, f"s1-{i}", shards=(1,)) for i in (1, 2)]
    chain.block([chain.tx(Heartbeat(), k) for k in keys])  # keep the first ones alive
    for key in more:
        make_routable(chain, key)
    health = ask(chain, "/pool_health?model=m")
    assert health["routable_per_shard"] == [3, 3]
    assert health["status"] == "healthy"
    nodes = ask(chain, "/nodes?model=m&shard=1")["nodes"]
    assert len(nodes) == 3 and all(n["routable"] for n in nodes)


def test_abci_query_unknown_path_and_bad_params() -> None:
    chain = Chain()
    assert query(chain.state, "/nope", b"")[0] == Code.UNKNOWN_QUERY
    assert query(chain.state, "/nodes", b"[1]")[0] == Code.BAD_QUERY
    assert query(chain.state, "/nodes?shard=x", b"")[0] == Code.BAD_QUERY
    assert query(chain.state, "/node?key=00", b"")[0] == Code.NOT_FOUND
    code, value, _ = query(chain.state, "/nodes", b'{"model": "m"}')
    assert code == Code.OK and json.loads(value) == {"nodes": [], "next": None}


def test_abci_prepare_proposal_respects_max_bytes_with_proto_overhead() -> None:
    chain = Chain()
    txs = [chain.tx(Heartbeat(), seeded_key(f"k{i}")) for i in range(3)]
    # each tx costs tag (1) + uvarint length + bytes inside the block's Data message
    cost = [1 + (1 if len(t) < 128 else 2) + len(t) for t in txs]
    assert chain.machine.prepare_proposal(1, txs, cost[0] + cost[1], None) == txs[:2]
    assert chain.machine.prepare_proposal(1, txs, cost[0] + cost[1] - 1, None) == txs[:1]
    chain.advance_to(5)
    vx = chain.extended_commit(5)
    vx_cost = 1 + 2 + len(vx)
    assert chain.machine.prepare_proposal(6, txs, vx_cost + cost[0], vx) == [vx, txs[0]]
