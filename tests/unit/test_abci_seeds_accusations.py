"""Verifier seeds (commit before the epoch, reveal after; abci_app/seeds.py) and verifiers'
track record (a verdict the committee does not confirm counts against its voters;
abci_app/accusations.py), on the in-process chain (epoch_length 5, 4 validators of power 10)."""

from __future__ import annotations

import dataclasses
import secrets

import pytest

from abci_app.codes import Code
from abci_app.verdicts import BENCH_EPOCHS, SETTLE_EPOCHS
from protocol.committee.envelope import decode, sign
from protocol.committee.grammar import TxDecodeError
from protocol.committee.verification import SeedCommit, SeedReveal, seed_commitment
from protocol.eip712 import address_of
from tests.committee_chain import Chain, seeded_evm_key, seeded_key
from tests.unit.test_abci_state import VERDICT, ask, verdict_vote

pytestmark = pytest.mark.unit

LENGTH = 5  # the in-process chain's epoch length


def settles(voted_in: int) -> int:
    """The height whose EndBlock settles a verdict first voted in epoch `voted_in`."""
    return LENGTH * (voted_in + SETTLE_EPOCHS)


def _signer(chain: Chain, index: int) -> str:
    return chain.validators[index].key.verify_key.encode().hex()


def commit(chain: Chain, index: int, epoch: int, seed: bytes) -> bytes:
    value = seed_commitment(_signer(chain, index), epoch, seed)
    return chain.tx(SeedCommit(epoch, value), chain.validators[index].key)


def reveal(chain: Chain, index: int, epoch: int, seed: bytes) -> bytes:
    return chain.tx(SeedReveal(epoch, "0x" + seed.hex()), chain.validators[index].key)


def test_seed_commit_then_reveal_after_the_epoch_is_recorded() -> None:
    chain = Chain()
    seed = secrets.token_bytes(32)
    assert chain.block([commit(chain, 0, 2, seed)])[0].code == Code.OK  # height 1, epoch 1
    [record] = ask(chain, "/seeds?epoch=2")["seeds"]
    assert record["seed"] is None and record["validator"] == chain.validators[0].address
    chain.advance_to(7)  # epoch 2 is 6..10: not closed yet
    assert chain.block([reveal(chain, 0, 2, seed)])[0].code == Code.SEED_NOT_CLOSED
    chain.advance_to(10)
    assert chain.block([reveal(chain, 0, 2, seed)])[0].code == Code.OK  # height 11, epoch 3
    [record] = ask(chain, "/seeds?epoch=2")["seeds"]
    assert record["seed"] == "0x" + seed.hex() and record["revealed_height"] == 11
    assert chain.block([reveal(chain, 0, 2, seed)])[0].code == Code.ALREADY_REVEALED


def test_seed_reveal_that_does_not_open_the_commitment_is_refused() -> None:
    chain = Chain()
    seed = secrets.token_bytes(32)
    chain.block([commit(chain, 0, 2, seed)])
    chain.advance_to(10)
    other = bytes(32)
    assert chain.block([reveal(chain, 0, 2, other)])[0].code == Code.SEED_MISMATCH
    # another validator cannot open (or claim) it: the commitment is bound to its signer
    assert chain.block([reveal(chain, 1, 2, seed)])[0].code == Code.UNKNOWN_SEED
    assert ask(chain, "/seeds?epoch=2")["seeds"][0]["seed"] is None


def test_seed_commit_for_a_started_or_far_epoch_or_twice_is_refused() -> None:
    chain = Chain()
    seed = secrets.token_bytes(32)
    assert chain.block([commit(chain, 0, 1, seed)])[0].code == Code.SEED_NOT_IN_FUTURE
    assert chain.block([commit(chain, 0, 4, seed)])[0].code == Code.SEED_NOT_IN_FUTURE
    assert chain.block([commit(chain, 0, 3, seed)])[0].code == Code.OK
    assert chain.block([commit(chain, 0, 3, seed)])[0].code == Code.DUPLICATE_SEED
    stranger = seeded_key("not-a-validator")
    value = seed_commitment(stranger.verify_key.encode().hex(), 2, seed)
    assert chain.block([chain.tx(SeedCommit(2, value), stranger)])[0].code == Code.NOT_VALIDATOR


@pytest.mark.parametrize(
    ("cls", "body"),
    [
        (SeedCommit, {"epoch": 0, "commitment": "0x" + "ab" * 32}),
        (SeedCommit, {"epoch": True, "commitment": "0x" + "ab" * 32}),
        (SeedCommit, {"epoch": 2, "commitment": "0x" + "AB" * 32}),
        (SeedCommit, {"epoch": 2, "commitment": "0x" + "ab" * 32, "x": 1}),
        (SeedReveal, {"epoch": 2, "seed": "ab" * 32}),
        (SeedReveal, {"epoch": 2**63, "seed": "0x" + "ab" * 32}),
        (SeedReveal, {"epoch": 2}),
    ],
)
def test_seed_tx_bodies_are_strict(cls: type, body: dict) -> None:
    with pytest.raises(TxDecodeError):
        cls.from_json(body)


def test_seed_tx_round_trips_and_commitment_needs_valid_inputs() -> None:
    raw = sign(SeedCommit(2, "0x" + "ab" * 32), seeded_key("v"), 1).encode()
    assert decode(raw).body == SeedCommit(2, "0x" + "ab" * 32)
    with pytest.raises(ValueError):
        seed_commitment("zz", 1, bytes(32))
    a = seed_commitment("00" * 32, 1, bytes(32))
    assert a != seed_commitment("00" * 32, 2, bytes(32)) != seed_commitment("11" * 32, 1, bytes(32))


def test_accusation_refused_verdict_marks_its_voter_and_confirmed_verdict_credits() -> None:
    """Validator 0 accuses alone (10 of 40 power): the verdict is never confirmed, and at the
    end of the SETTLE_EPOCHS-th epoch after its vote it is settled `refused` and validator 0
    gets one refused mark. A verdict three validators vote for is confirmed and credits all
    three."""
    chain = Chain()
    assert chain.block([verdict_vote(chain, 0, VERDICT)])[0].code == Code.OK  # height 1
    chain.advance_to(settles(1) - 1)
    assert ask(chain, "/verifiers")["verifiers"] == {}  # the others may still re-judge it
    chain.advance_to(settles(1))
    accuser = chain.validators[0].address
    marks = ask(chain, "/verifiers")["verifiers"]
    last = 1 + SETTLE_EPOCHS
    assert marks == {
        accuser: {
            "confirmed": 0,
            "refused": 1,
            "unconfirmed": 0,
            "last_epoch": last,
            "benched_until": last + BENCH_EPOCHS,
        }
    }
    [verdict] = ask(chain, "/verdicts")["verdicts"]
    assert verdict["confirmed"] is False and verdict["settled"] == "refused"

    honest = dataclasses.replace(VERDICT, node=address_of(seeded_evm_key("cheater")))
    chain.block([verdict_vote(chain, i, honest) for i in (1, 2, 3)])  # epoch last + 1
    chain.advance_to(settles(last + 1))
    marks = ask(chain, "/verifiers")["verifiers"]
    assert marks[accuser]["refused"] == 1 and marks[accuser]["confirmed"] == 0
    for index in (1, 2, 3):
        address = chain.validators[index].address
        assert marks[address] == {
            "confirmed": 1,
            "refused": 0,
            "unconfirmed": 0,
            "last_epoch": last + 1 + SETTLE_EPOCHS,
            "benched_until": 0,
        }


def test_accusation_confirmed_late_within_the_window_is_not_refused() -> None:
    chain = Chain()
    chain.block([verdict_vote(chain, 0, VERDICT)])  # epoch 1
    chain.advance_to(settles(1) - 2)  # the others' re-judgements arrive in the last epoch
    chain.block([verdict_vote(chain, 1, VERDICT), verdict_vote(chain, 2, VERDICT)])
    chain.advance_to(settles(1))
    marks = ask(chain, "/verifiers")["verifiers"]
    assert {m["refused"] for m in marks.values()} == {0} and len(marks) == 3


def test_false_accusation_benches_its_author_from_votes_and_spot_checks() -> None:
    """A refused failed-verification accusation costs its author: its next verdict votes are
    refused (VERIFIER_BENCHED) and its verifier is left out of the spot-check verifier sets,
    so it is assigned no checks and earns no verification share, until the bench ends."""
    chain = Chain()
    assert chain.block([verdict_vote(chain, 0, VERDICT)])[0].code == Code.OK  # epoch 1
    chain.advance_to(settles(1))  # settled refused
    now = 2 + SETTLE_EPOCHS
    other = dataclasses.replace(VERDICT, evidence_hash=b"\x43" * 32)
    [result] = chain.block([verdict_vote(chain, 0, other)])  # epoch `now`
    assert result.code == Code.VERIFIER_BENCHED
    others = chain.block([verdict_vote(chain, i, other) for i in (1, 2, 3)])
    assert [r.code for r in others] == [Code.OK] * 3  # the others still vote (and confirm)
    target = now + 2
    chain.block([commit(chain, 0, target, b"\x00" * 32), commit(chain, 1, target, b"\x01" * 32)])
    chain.advance_to(LENGTH * (target - 1))  # the target epoch's record fixes its verifiers
    [record] = ask(chain, f"/epochs?epoch={target}")["epochs"]
    assert record["verifiers"] == [_signer(chain, 1)]
    until = ask(chain, "/verifiers")["verifiers"][chain.validators[0].address]["benched_until"]
    chain.advance_to(until * 5)  # the bench's last epoch has closed
    assert chain.block([verdict_vote(chain, 0, other)])[0].code == Code.OK


def test_timeout_accusation_nobody_confirms_costs_nothing() -> None:
    """A node can withhold a ticket from one verifier only: an unconfirmed timeout accusation
    (offence 4) is settled `unconfirmed`, not refused, and benches nobody."""
    chain = Chain()
    timeout = dataclasses.replace(VERDICT, offence=4)
    chain.block([verdict_vote(chain, 0, timeout)])
    chain.advance_to(settles(1))
    [verdict] = ask(chain, "/verdicts")["verdicts"]
    assert verdict["settled"] == "unconfirmed"
    mark = ask(chain, "/verifiers")["verifiers"][chain.validators[0].address]
    assert mark["refused"] == 0 and mark["unconfirmed"] == 1 and mark["benched_until"] == 0
    assert chain.block([verdict_vote(chain, 0, VERDICT)])[0].code == Code.OK


def test_accusation_on_a_node_convicted_meanwhile_is_not_false() -> None:
    """Two verifiers found different failing blocks of one node; the committee confirmed one:
    the other accusation was right about the node and costs its author nothing."""
    chain = Chain()
    lone = dataclasses.replace(VERDICT, evidence_hash=b"\x44" * 32)
    chain.block([verdict_vote(chain, 0, lone)])  # epoch 1, never confirmed
    chain.block([verdict_vote(chain, i, VERDICT) for i in (1, 2, 3)])  # confirmed
    chain.advance_to(settles(1))
    views = {v["evidence_hash"]: v for v in ask(chain, "/verdicts")["verdicts"]}
    assert views["0x" + "44" * 32]["settled"] == "unconfirmed"
    assert ask(chain, "/verifiers")["verifiers"][chain.validators[0].address]["refused"] == 0


def test_confirmed_failed_verification_convicts_the_node_untrusted() -> None:
    from tests.unit.test_abci_state import make_routable, register

    chain = Chain()
    key = register(chain, "n1")  # VERDICT names n1's EVM address
    make_routable(chain, key)
    hexed = key.verify_key.encode().hex()
    assert ask(chain, f"/node?key={hexed}")["routable"] is True
    chain.block([verdict_vote(chain, i, VERDICT) for i in (0, 1, 2)])
    view = ask(chain, f"/node?key={hexed}")
    assert view["reputation"] == 0 and view["untrusted"] is True and view["routable"] is False


def test_failed_finding_withheld_from_the_rest_costs_its_finders_nothing() -> None:
    """A node answers the two verifiers that find it out and withholds its ticket from the other
    two, whose re-judgements become a timeout accusation: neither verdict reaches 2/3, but the
    committee (≥ 2/3 of the power) accused the node, so the failed finding is not false."""
    chain = Chain()
    timeout = dataclasses.replace(VERDICT, offence=4, evidence_hash=b"\x45" * 32)
    chain.block([verdict_vote(chain, i, VERDICT) for i in (0, 1)])  # epoch 1: failed, 2 of 4
    chain.advance_to(6)
    chain.block([verdict_vote(chain, i, timeout) for i in (2, 3)])  # epoch 2: timeout, 2 of 4
    chain.advance_to(settles(2))  # both settled
    views = {v["evidence_hash"]: v for v in ask(chain, "/verdicts")["verdicts"]}
    assert views["0x" + VERDICT.evidence_hash.hex()]["settled"] == "unconfirmed"
    assert views["0x" + "45" * 32]["settled"] == "unconfirmed"
    marks = ask(chain, "/verifiers")["verifiers"]
    assert {m["refused"] for m in marks.values()} == {0}
    assert {m["benched_until"] for m in marks.values()} == {0}


def test_false_accusation_by_a_third_is_refused_even_with_a_second_verdict() -> None:
    """Two colluders (half the power, short of 2/3) accuse an honest node with two verdicts:
    their accusers together stay below 2/3, so both are false accusations and both benched."""
    chain = Chain()
    other = dataclasses.replace(VERDICT, offence=4, evidence_hash=b"\x46" * 32)
    chain.block([verdict_vote(chain, i, VERDICT) for i in (0, 1)])
    chain.block([verdict_vote(chain, i, other) for i in (0, 1)])
    chain.advance_to(settles(1))
    views = {v["evidence_hash"]: v for v in ask(chain, "/verdicts")["verdicts"]}
    assert views["0x" + VERDICT.evidence_hash.hex()]["settled"] == "refused"
    marks = ask(chain, "/verifiers")["verifiers"]
    for index in (0, 1):
        assert marks[chain.validators[index].address]["benched_until"] > 0


def test_one_slash_per_node_epoch_and_offence() -> None:
    """Verifiers found two different failing blocks of one node in one epoch: the first verdict
    to reach 2/3 is confirmed (and relayed: `/verdicts?confirmed=true`), the second is
    superseded — right, but not executed — and costs its voters nothing; the next epoch's
    finding is confirmed again. A timeout verdict is superseded by a second timeout, not by a
    failed verification, which still convicts."""
    chain = Chain()
    second = dataclasses.replace(VERDICT, evidence_hash=b"\x47" * 32, nonce=2)
    chain.block([verdict_vote(chain, i, VERDICT) for i in (0, 1, 2)])  # epoch 1: confirmed
    chain.block([verdict_vote(chain, i, second) for i in (0, 1, 2, 3)])  # 2/3 at height 2
    views = {v["evidence_hash"]: v for v in ask(chain, "/verdicts")["verdicts"]}
    first_view, second_view = views["0x" + "42" * 32], views["0x" + "47" * 32]
    assert first_view["confirmed"] is True
    assert second_view["confirmed"] is False and second_view["superseded"] == 2
    assert second_view["confirmed_height"] is None and second_view["power"] == 40
    relayed = ask(chain, "/verdicts?confirmed=true")["verdicts"]
    assert [v["evidence_hash"] for v in relayed] == ["0x" + "42" * 32]
    chain.advance_to(settles(1))
    views = {v["evidence_hash"]: v for v in ask(chain, "/verdicts")["verdicts"]}
    assert views["0x" + "47" * 32]["settled"] == "unconfirmed"
    marks = ask(chain, "/verifiers")["verifiers"]
    assert {m["refused"] for m in marks.values()} == {0}
    assert {m["benched_until"] for m in marks.values()} == {0}
    later = dataclasses.replace(VERDICT, evidence_hash=b"\x48" * 32, nonce=3)
    chain.block([verdict_vote(chain, i, later) for i in (0, 1, 2)])  # another epoch
    assert ask(chain, f"/verdicts?id=0x{later.struct_hash().hex()}")["confirmed"] is True

    node = address_of(seeded_evm_key("n2"))
    timeout = dataclasses.replace(VERDICT, node=node, offence=4, evidence_hash=b"\x49" * 32)
    again = dataclasses.replace(timeout, evidence_hash=b"\x4a" * 32)
    failed = dataclasses.replace(VERDICT, node=node, evidence_hash=b"\x4b" * 32)
    for verdict in (timeout, again, failed):
        chain.block([verdict_vote(chain, i, verdict) for i in (0, 1, 2)])
    confirmed = {
        v["evidence_hash"]: v["confirmed"]
        for v in ask(chain, "/verdicts")["verdicts"]
        if v["node"].lower() == node.lower()
    }
    assert confirmed == {"0x" + "49" * 32: True, "0x" + "4a" * 32: False, "0x" + "4b" * 32: True}
