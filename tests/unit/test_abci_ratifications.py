"""Ratifications (abci_app/ratifications.py, node/watcher/ratifier.py): a verdict confirmed by
a numerics version's quorum below 2/3 of all the power becomes relayable to FraudProofs once
validators' ratifications bring its signatures to 2/3, on the in-process chain (epoch_length
5; verifiers announced in epoch 1, in effect from epoch 2)."""

from __future__ import annotations

from typing import Any

import pytest
from nacl.signing import SigningKey

from abci_app.codes import Code
from abci_app.verdicts import SETTLE_EPOCHS
from node.watcher.ratifier import VerdictRatifier
from node.watcher.verdicts import VerdictRelay
from protocol.committee.envelope import decode, sign
from protocol.committee.grammar import TxDecodeError
from protocol.committee.verification import VerdictRatify
from protocol.eip712 import Verdict, committee_domain
from tests.committee_chain import (
    COMMITTEE_ADDRESS,
    EVM_CHAIN_ID,
    FRAUD_PROOFS_ADDRESS,
    Chain,
    seeded_evm_key,
    seeded_key,
)
from tests.integration.test_abci_fuzz import FIELDS, TX_TYPES
from tests.unit.test_abci_state import VERDICT, ask
from tests.unit.test_numerics_quorum import last_height, setup, verdict, vote

pytestmark = pytest.mark.unit

DOMAIN = committee_domain(EVM_CHAIN_ID, COMMITTEE_ADDRESS)
# validators 0 and 1 run numerics 3 (the node's), the others 2: 3's group holds 20 of the power
FIVE = {"powers": (10, 10, 10, 10, 20), "verifiers": {0: 3, 1: 3, 2: 2, 3: 2, 4: 2}}
FOUR = {"verifiers": {0: 3, 1: 3, 2: 2, 3: 2}}


def ratify_tx(chain: Chain, index: int, ident: str, operator_key: bytes | None = None) -> bytes:
    validator = chain.validators[index]
    signature = VERDICT.sign(operator_key or validator.operator_key, DOMAIN)
    return chain.tx(VerdictRatify(ident, "0x" + signature.hex()), validator.key)


def ratify(chain: Chain, *indexes: int) -> list[tuple[Code, str]]:
    ident = "0x" + VERDICT.struct_hash().hex()
    results = chain.block([ratify_tx(chain, i, ident) for i in indexes])
    return [(Code(r.code), r.log) for r in results]


def quorum_verdict(**kwargs: Any) -> Chain:
    """A chain where validators 0 and 1 (numerics 3's group) convicted VERDICT's node by their
    version's quorum, short of 2/3 of all the power."""
    chain, _ = setup(**kwargs)
    assert vote(chain, 0, 1) == [Code.OK, Code.OK]
    record = verdict(chain)
    assert record["confirmed"] and record["quorum_numerics"] == 3 and not record["relayable"]
    return chain


# --- the chain ------------------------------------------------------------------------------------


def test_ratifications_flip_relayable_exactly_at_two_thirds_of_all_the_power() -> None:
    """60 of power: the group of 3 (20) convicts; ratified by 10 the signatures hold 30 (short
    of 40), by 20 more exactly 40 = 2/3: relayable, every signature over the one verdict."""
    chain = quorum_verdict(**FIVE)
    assert ratify(chain, 2) == [(Code.OK, "")]
    record = verdict(chain)
    assert record["relayable"] is False and record["ratified_power"] == 10
    assert record["power"] == 20  # a ratification is not a vote
    assert ratify(chain, 3) == [(Code.OK, "")]
    record = verdict(chain)
    assert record["relayable"] is True and record["ratified_power"] == 20
    operators = sorted((v.operator for v in chain.validators[:4]), key=lambda a: int(a, 16))
    assert record["signers"] == operators
    recovered = [VERDICT.recover(bytes.fromhex(s[2:]), DOMAIN) for s in record["signatures"]]
    assert recovered == operators
    assert record["ratifiers"] == sorted(
        (chain.validators[i].operator for i in (2, 3)), key=lambda a: int(a, 16)
    )


def test_ratify_only_from_a_validator() -> None:
    chain = quorum_verdict(**FOUR)
    ident = "0x" + VERDICT.struct_hash().hex()
    signature = VERDICT.sign(seeded_evm_key("stranger"), DOMAIN)
    tx = chain.tx(VerdictRatify(ident, "0x" + signature.hex()), seeded_key("stranger"))
    [result] = chain.block([tx])
    assert result.code == Code.NOT_VALIDATOR
    assert ask(chain, f"/verdicts?id={ident}")["ratifiers"] == []


def test_ratify_only_a_confirmed_verdict() -> None:
    chain, _ = setup(**FOUR)
    [(code, log)] = ratify(chain, 2)  # no such verdict
    assert code == Code.VERDICT_NOT_CONFIRMED and "unknown" in log
    vote(chain, 0)  # one vote: open
    [(code, log)] = ratify(chain, 2)
    assert code == Code.VERDICT_NOT_CONFIRMED and "not confirmed" in log
    assert verdict(chain)["ratifiers"] == [] and "ratified_power" not in verdict(chain)


def test_a_superseded_verdict_is_never_ratified() -> None:
    """The node already answers for this epoch and offence: the second verdict is right but
    superseded (not confirmed, never relayed), so it cannot be ratified either."""
    chain = quorum_verdict(**FOUR)
    other = Verdict(**{**_fields(VERDICT), "evidence_hash": b"\x43" * 32})
    txs = [_vote_tx(chain, i, other) for i in (0, 1)]
    assert [r.code for r in chain.block(txs)] == [Code.OK, Code.OK]
    ident = "0x" + other.struct_hash().hex()
    assert ask(chain, f"/verdicts?id={ident}")["superseded"]
    signature = other.sign(chain.validators[2].operator_key, DOMAIN)
    tx = chain.tx(VerdictRatify(ident, "0x" + signature.hex()), chain.validators[2].key)
    [result] = chain.block([tx])
    assert result.code == Code.VERDICT_NOT_CONFIRMED


def test_ratify_once_per_validator_and_never_by_a_voter_replays_refused_by_name() -> None:
    chain = quorum_verdict(**FOUR)
    ident = "0x" + VERDICT.struct_hash().hex()
    assert ratify(chain, 2) == [(Code.OK, "")]
    [(code, log)] = ratify(chain, 2)  # the same ratification again, under a fresh nonce
    assert code == Code.DUPLICATE_VOTE and "already ratified" in log
    [(code, log)] = ratify(chain, 0)  # a voter: its vote carries the same signature
    assert code == Code.DUPLICATE_VOTE and "already voted on" in log
    [result] = chain.block([_vote_tx(chain, 2, VERDICT)])  # a ratifier's later vote
    assert result.code == Code.DUPLICATE_VOTE and "already ratified" in result.log
    # the very same tx bytes replayed: the nonce is spent
    raw = ratify_tx(chain, 3, ident)
    assert [r.code for r in chain.block([raw])] == [Code.OK]
    assert [r.code for r in chain.block([raw])] == [Code.BAD_NONCE]
    record = verdict(chain)
    assert record["ratified_power"] == 20 and len(record["signers"]) == 4


def test_ratify_needs_the_validators_operator_signature_over_that_verdict() -> None:
    chain = quorum_verdict(**FOUR)
    ident = "0x" + VERDICT.struct_hash().hex()
    [result] = chain.block([ratify_tx(chain, 2, ident, operator_key=seeded_evm_key("other"))])
    assert result.code == Code.BAD_VERDICT_SIGNATURE and "not operator" in result.log
    other = Verdict(**{**_fields(VERDICT), "nonce": 9})  # signed another verdict
    signature = other.sign(chain.validators[2].operator_key, DOMAIN)
    tx = chain.tx(VerdictRatify(ident, "0x" + signature.hex()), chain.validators[2].key)
    [result] = chain.block([tx])
    assert result.code == Code.BAD_VERDICT_SIGNATURE
    assert verdict(chain)["ratifiers"] == []


def test_a_ratification_is_not_an_accusation() -> None:
    """Settled, the verdict marks its two voters `confirmed`; the ratifiers get no mark."""
    chain = quorum_verdict(**FOUR)
    ratify(chain, 2, 3)
    chain.advance_to(last_height(2 + SETTLE_EPOCHS))
    assert verdict(chain)["settled"] == "confirmed"
    marks = ask(chain, "/verifiers")["verifiers"]
    assert set(marks) == {chain.validators[0].address, chain.validators[1].address}


def test_verdict_ratify_body_is_strict_and_round_trips() -> None:
    good = {"signature": "0x" + "ab" * 65, "verdict": "0x" + "cd" * 32}
    assert VerdictRatify.from_json(good) == VerdictRatify("0x" + "cd" * 32, "0x" + "ab" * 65)
    for bad in (
        {**good, "verdict": "0x" + "CD" * 32},
        {**good, "verdict": "cd" * 32},
        {**good, "signature": "0x" + "ab" * 64},
        {**good, "extra": 1},
        {"verdict": good["verdict"]},
    ):
        with pytest.raises(TxDecodeError):
            VerdictRatify.from_json(bad)
    body = VerdictRatify.from_json(good)
    assert decode(sign(body, seeded_key("k"), 1).encode()).body == body


def test_the_fuzz_grammar_knows_the_ratification() -> None:
    assert "verdict_ratify" in TX_TYPES and "verdict" in FIELDS


# --- the watcher --------------------------------------------------------------------------------


class ChainLink:
    """A validator's `CommitteeLink` over the in-process chain: each tx in its own block."""

    def __init__(self, chain: Chain, key: SigningKey) -> None:
        self.chain, self.key = chain, key
        self.sent: list[Any] = []

    async def send(self, body: Any, *, timeout_s: float = 15) -> tuple[int, str]:
        self.sent.append(body)
        [result] = self.chain.block([self.chain.tx(body, self.key)])
        return int(result.code), result.log

    async def query(self, path: str, **params: Any) -> Any:
        return ask(self.chain, path + "".join(f"?{k}={v}" for k, v in params.items()))


class FraudProofs:
    """`slashByVerdict` as Committee.sol checks it: signatures by ascending signer over the
    verdict, members' power ≥ 2/3 of the total; raises AssertionError (a revert) otherwise."""

    def __init__(self, chain: Chain) -> None:
        self.powers = {v.operator.lower(): v.power for v in chain.validators}
        self.slashed: list[str] = []

    def relay_confirmed_verdict(self, record: dict[str, Any]) -> Any:
        verdict = Verdict(**{**_fields(VERDICT), "node": record["node"]})
        signers = [
            verdict.recover(bytes.fromhex(s[2:]), DOMAIN).lower() for s in record["signatures"]
        ]
        assert signers == sorted(signers, key=lambda a: int(a, 16))
        assert 3 * sum(self.powers[s] for s in signers) >= 2 * sum(self.powers.values())
        self.slashed.append(record["id"])
        return {"status": 1}


def watcher(chain: Chain, index: int, fraud_proofs: FraudProofs, ratifies: bool) -> VerdictRelay:
    validator = chain.validators[index]
    link = ChainLink(chain, validator.key)
    ratifier = VerdictRatifier(link, validator.operator_key, DOMAIN, FRAUD_PROOFS_ADDRESS)
    return VerdictRelay(link, fraud_proofs, ratifier=ratifier if ratifies else None)


async def test_watchers_ratify_a_minority_version_verdict_then_relay_it() -> None:
    """Validator 2's watcher ratifies (30 of 60: still withheld), validator 3's brings it to 40:
    the next pass relays it, and FraudProofs' 2/3 check passes."""
    chain = quorum_verdict(**FIVE)
    contract = FraudProofs(chain)
    two, three = (watcher(chain, i, contract, ratifies=True) for i in (2, 3))
    assert await two.step() == [] and contract.slashed == []
    assert verdict(chain)["relayable"] is False  # ratified, still short: withheld
    assert await two.step() == []  # not ratified twice
    assert [type(b).__name__ for b in two.committee.sent] == ["VerdictRatify"]
    assert await three.step() == []  # the pass read it unrelayable, then ratified it
    ident = verdict(chain)["id"]
    assert verdict(chain)["relayable"] is True
    assert await three.step() == [ident] and contract.slashed == [ident]


async def test_an_unratified_minority_version_verdict_is_withheld() -> None:
    """Watchers that ratify nothing (no operator key) never send it: FraudProofs would refuse
    it (on main the same happened whatever the watchers did)."""
    chain = quorum_verdict(**FOUR)
    contract = FraudProofs(chain)
    relays = [watcher(chain, i, contract, ratifies=False) for i in range(4)]
    for relay in relays * 2:
        assert await relay.step() == []
    assert contract.slashed == [] and verdict(chain)["relayable"] is False


async def test_a_voters_watcher_does_not_ratify_what_it_signed() -> None:
    chain = quorum_verdict(**FOUR)
    relay = watcher(chain, 0, FraudProofs(chain), ratifies=True)
    assert await relay.step() == []
    assert relay.committee.sent == [] and verdict(chain)["ratifiers"] == []


async def test_a_watcher_for_another_fraud_proofs_signs_nothing() -> None:
    chain = quorum_verdict(**FOUR)
    validator = chain.validators[2]
    link = ChainLink(chain, validator.key)
    ratifier = VerdictRatifier(link, validator.operator_key, DOMAIN, "0x" + "11" * 20)
    assert await ratifier.ratify(verdict(chain)) is False
    assert link.sent == [] and ratifier.ratified == {verdict(chain)["id"]}


def _fields(v: Verdict) -> dict[str, Any]:
    return {
        "node": v.node,
        "offence": v.offence,
        "evidence_hash": v.evidence_hash,
        "challenger": v.challenger,
        "nonce": v.nonce,
        "consumer": v.consumer,
    }


def _vote_tx(chain: Chain, index: int, v: Verdict) -> bytes:
    from tests.unit.test_abci_state import verdict_vote

    return verdict_vote(chain, index, v)
