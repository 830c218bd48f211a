"""The committee app on compact binary commit/reveal batches: the same state rules (and the same
state) as the JSON txs, named codes for malformed or forged batches, the proposer's work budget."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from nacl.signing import SigningKey

from abci_app import machine
from abci_app.codes import Code
from abci_app.queries import query
from protocol import commit_batch as cb
from protocol.committee.commitments import CommitBatch, CommitmentRecord, RevealBatch, RevealRecord
from protocol.committee.registry import AttestStake, RegisterNode, sign_registration
from protocol.eip712 import address_of, commitment_value
from tests.committee_chain import Chain, seeded_evm_key, seeded_key

pytestmark = pytest.mark.unit

SESSION = "0x" + "01" * 32
OUTPUT = "0x" + "02" * 32
SALT = "0x" + "03" * 32


def ask(chain: Chain, path: str) -> dict:
    code, value, log = query(chain.state, path, b"")
    assert code == Code.OK, log
    return json.loads(value)


def register(chain: Chain, label: str, role: str = "compute") -> SigningKey:
    """A node registered (and, a compute node, staked: only staked nodes commit)."""
    key = seeded_key(label)
    evm = seeded_evm_key(label)
    body = RegisterNode(
        evm_address=address_of(evm),
        evm_signature=sign_registration(evm, key.verify_key.encode().hex()),
        role=role,
        model="m",
        shards=(0,),
        endpoint=f"http://{label}",
        capacity=2,
    )
    [result] = chain.block([chain.tx(body, key)])
    assert result.code == Code.OK, result.log
    if role == "compute":
        node = key.verify_key.encode().hex()
        attests = [chain.tx(AttestStake(node, 10**18), v.key) for v in chain.validators[:3]]
        assert {r.code for r in chain.block(attests)} == {Code.OK}
    return key


def commitment(step: int, output: str = OUTPUT, salt: str = SALT) -> str:
    return "0x" + commitment_value(SESSION, step, 0, output, salt).hex()


def commits(*steps: int) -> CommitBatch:
    return CommitBatch(tuple(CommitmentRecord(SESSION, s, 0, commitment(s)) for s in steps))


def reveals(*steps: int, output: str = OUTPUT) -> RevealBatch:
    return RevealBatch(tuple(RevealRecord(SESSION, s, 0, output, SALT) for s in steps))


def test_abci_binary_commit_and_reveal_same_state_as_json() -> None:
    chains = {"json": Chain(), "binary": Chain()}
    hashes = {}
    for name, chain in chains.items():
        key = register(chain, "n1")
        send = chain.tx if name == "json" else chain.batch_tx
        assert chain.block([send(commits(1, 2, 3), key)])[0].code == Code.OK
        [result] = chain.block([send(reveals(1, 3), key)])
        assert result.code == Code.OK
        hashes[name] = chain.state.app_hash
    assert hashes["json"] == hashes["binary"]  # byte for byte the same state
    answer = ask(chains["binary"], "/commitments")["commitments"]
    assert [(c["step"], c.get("match")) for c in answer] == [(1, True), (2, None), (3, True)]


def test_abci_binary_reveal_mismatch_stored_as_evidence() -> None:
    chain = Chain()
    key = register(chain, "n1")
    chain.block([chain.batch_tx(commits(1, 2), key)])
    [result] = chain.block([chain.batch_tx(reveals(1, 2, output="0x" + "ff" * 32), key)])
    assert result.code == Code.OK
    assert dict(dict(result.events)["planet.reveal"])["mismatches"] == "2"
    evidence = ask(chain, "/evidence")["evidence"]
    assert {e["kind"] for e in evidence} == {"reveal_mismatch"}
    assert sorted(e["step"] for e in evidence) == [1, 2]


def test_abci_binary_equivocation_and_duplicate() -> None:
    chain = Chain()
    key = register(chain, "n1")
    chain.block([chain.batch_tx(commits(1), key)])
    assert chain.block([chain.batch_tx(commits(1), key)])[0].code == Code.DUPLICATE_COMMITMENT
    other = CommitBatch((CommitmentRecord(SESSION, 1, 0, "0x" + "ee" * 32),))
    assert chain.block([chain.batch_tx(other, key)])[0].code == Code.OK
    [evidence] = ask(chain, "/evidence")["evidence"]
    assert evidence["kind"] == "equivocation"
    assert evidence["other_commitment"] == "0x" + "ee" * 32
    [record] = ask(chain, "/commitments")["commitments"]
    assert record["commitment"] == commitment(1)  # the first stands


def test_abci_binary_reveal_unknown_or_twice_refused_atomically() -> None:
    chain = Chain()
    key = register(chain, "n1")
    chain.block([chain.batch_tx(commits(1), key)])
    assert chain.block([chain.batch_tx(reveals(1, 9), key)])[0].code == Code.UNKNOWN_COMMITMENT
    [record] = ask(chain, "/commitments")["commitments"]
    assert "revealed_height" not in record
    assert chain.block([chain.batch_tx(reveals(1), key)])[0].code == Code.OK
    assert chain.block([chain.batch_tx(reveals(1), key)])[0].code == Code.ALREADY_REVEALED


def test_abci_binary_commit_role_and_registration_rules() -> None:
    chain = Chain()
    verifier = register(chain, "v1", role="verifier")
    assert chain.block([chain.batch_tx(commits(1), verifier)])[0].code == Code.WRONG_ROLE
    stranger = seeded_key("stranger")
    assert chain.block([chain.batch_tx(commits(1), stranger)])[0].code == Code.UNKNOWN_NODE


def test_abci_binary_nonce_shared_with_json_txs() -> None:
    chain = Chain()
    key = register(chain, "n1")  # nonce 1
    assert chain.block([chain.batch_tx(commits(1), key, nonce=5)])[0].code == Code.OK
    replay = chain.batch_tx(commits(2), key, nonce=5)
    assert chain.machine.check_tx(replay).code == Code.BAD_NONCE
    assert chain.machine.check_tx(chain.tx(commits(2), key, nonce=4)).code == Code.BAD_NONCE
    assert chain.machine.check_tx(chain.tx(commits(2), key, nonce=6)).code == Code.OK


def test_abci_binary_malformed_and_forged_batches_named_codes() -> None:
    chain = Chain()
    key = register(chain, "n1")
    raw = chain.batch_tx(commits(1, 2), key)
    assert chain.machine.check_tx(raw[:-1]).code == Code.MALFORMED_TX
    assert chain.machine.check_tx(raw + b"\x00").code == Code.MALFORMED_TX
    forged = bytearray(raw)
    forged[-70] ^= 1  # a commitment byte: format fine, signature broken
    assert chain.machine.check_tx(bytes(forged)).code == Code.BAD_SIGNATURE
    ok, reason = chain.machine.process_proposal(chain.state.height + 1, [raw[:-1]])
    assert not ok and "binary batch" in reason
    assert chain.machine.prepare_proposal(
        chain.state.height + 1, [raw[:-1], raw], 1 << 20, None
    ) == [raw]


def test_abci_binary_proposal_stops_at_the_work_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "MAX_PROPOSAL_WORK", 10)
    chain = Chain()
    key = register(chain, "n1")
    txs = [chain.batch_tx(commits(*range(4 * i, 4 * i + 4)), key) for i in range(3)]
    height = chain.state.height + 1
    proposal = chain.machine.prepare_proposal(height, txs, 1 << 20, None)
    assert proposal == txs[:2]  # 5 + 5 work units; the third waits for the next block
    assert chain.machine.process_proposal(height, proposal) == (True, "")
    ok, reason = chain.machine.process_proposal(height, txs)  # a proposer ignoring the budget
    assert not ok and "exceeds 10" in reason


def test_abci_binary_batch_state_bytes_per_record_bounded() -> None:
    """What a record costs in state (the bound docs/committee.md states for binary batches)."""
    chain = Chain()
    key = register(chain, "n1")
    store = chain.state.store
    session = b"\x11" * 32
    cases = [
        cb.encode_batch(1, session, [(s, 0, bytes([s % 256]) * 32) for s in range(1024)], key, 2),
        # equivocation: every record conflicts → evidence for each
        cb.encode_batch(
            1, session, [(s, 0, bytes([s % 256 ^ 1]) * 32) for s in range(1024)], key, 3
        ),
        # reveals that do not match → evidence for each
        cb.encode_batch(
            2, session, [(s, 0, b"\x22" * 32, b"\x33" * 32) for s in range(800)], key, 4
        ),
    ]
    for raw in cases:
        records = (len(raw) - cb.HEADER_BYTES - cb.SIG_BYTES) // cb.RECORD_BYTES[raw[4]]
        before = store.size_bytes()
        [result] = chain.block([raw])
        assert result.code == Code.OK, result.log
        added = store.size_bytes() - before
        assert added <= 900 * records + 1024, (records, added)
        assert added <= 16 * len(raw) + 1024


def test_abci_binary_tx_cache_accounts_parsed_size() -> None:
    rows = [(i * 1_000_003, 7, bytes([i % 251]) * 31 + b"\x01") for i in range(1024)]
    raw = cb.encode_batch(cb.KIND_COMMIT, b"\x01" * 32, rows, seeded_key("a"), 1)
    tracemalloc.start()
    try:
        parsed = cb.decode_batch(raw)
        retained = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(parsed.body.commitments) == 1024
    assert machine.tx_cache_cost(raw) >= len(raw) + retained


def test_abci_state_get_many_equals_get_through_every_layer() -> None:
    chain = Chain()
    key = register(chain, "n1")
    chain.block([chain.batch_tx(commits(1, 2, 3), key)])
    state = chain.state
    prefix = f"{key.verify_key.encode().hex()}/{SESSION}/"
    keys = [f"{prefix}{step}/0" for step in (1, 2, 3, 4)]
    state.begin_block(state.height + 1, b"\x00" * 32)
    state.delete("commit", keys[0])  # staged deletion hides a committed value
    state.put("commit", keys[3], {"commitment": "x", "height": 0})  # staged write
    many = state.get_many("commit", [*keys, f"{prefix}9/0"])
    assert many == {k: state.get("commit", k) for k in keys if state.get("commit", k) is not None}
    assert set(many) == set(keys[1:])


def test_commitments_query_pages_every_record_once_in_key_order() -> None:
    """`/commitments` answers a page at a time: `next` is the `after` of the next page, so a
    verifier sees every retained record of a node, not only the first page's (the first 1 000)."""
    chain = Chain()
    key, other = register(chain, "n1"), register(chain, "n2")
    steps = (1, 2, 3, 10, 11, 20, 100)  # key order is string order: 1, 10, 100, 11, 2, 20, 3
    assert chain.block([chain.batch_tx(commits(*steps), key)])[0].code == Code.OK
    assert chain.block([chain.batch_tx(commits(5), other)])[0].code == Code.OK
    node = key.verify_key.encode().hex()
    whole = ask(chain, f"/commitments?node={node}")
    assert whole["next"] is None and len(whole["commitments"]) == len(steps)
    seen: list[int] = []
    after, pages = "", 0
    while True:
        cursor = f"&after={after}" if after else ""
        page = ask(chain, f"/commitments?node={node}&limit=3{cursor}")
        pages += 1
        seen += [c["step"] for c in page["commitments"]]
        assert all(c["node"] == node for c in page["commitments"])
        if page["next"] is None:
            break
        last = page["commitments"][-1]
        assert page["next"] == f"{node}/{last['session']}/{last['step']}/{last['shard']}"
        after = page["next"]
    assert pages == 3
    assert seen == [c["step"] for c in whole["commitments"]] == [1, 10, 100, 11, 2, 20, 3]
    # a full last page says nothing follows only when nothing does
    six = ask(chain, f"/commitments?node={node}&limit=6")
    assert ask(chain, f"/commitments?node={node}&limit=1&after={six['next']}")["next"] is None
    # a cursor is a record key or nothing: anything else is refused by name
    code, _, log = query(chain.state, f"/commitments?node={node}&after=../../x", b"")
    assert code == Code.BAD_QUERY and "after" in log
