"""A node changes its numerics version at an epoch boundary, rate-limited; verifiers announce
theirs; a spot-check verdict on a node is confirmed by the quorum of the verifiers running its
version, above a floor (abci_app/numerics.py, abci_app/verdicts.py), on the in-process chain
(epoch_length 5: heights 5(e−1)+1 … 5e are epoch e; 4 validators of power 10 unless given)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from nacl.signing import SigningKey

from abci_app.codes import Code
from abci_app.numerics import MIN_GROUP_VERIFIERS, NUMERICS_COOLDOWN_EPOCHS
from abci_app.verdicts import SETTLE_EPOCHS
from node.verifier.service import announce_numerics
from protocol.committee.envelope import decode, sign
from protocol.committee.grammar import TxDecodeError
from protocol.committee.registry import Leave, SetNumerics
from protocol.committee.verification import VerifierNumerics
from protocol.numerics import NUMERICS, NumericsError, announced_at
from tests.committee_chain import Chain, seeded_key
from tests.unit.test_abci_state import VERDICT, ask, node, register_body, verdict_vote

pytestmark = pytest.mark.unit

LENGTH = 5
UPGRADE = {"numerics": [2, 3]}  # an upgrade under way: both versions listed


def last_height(epoch: int) -> int:
    return LENGTH * epoch


def send(chain: Chain, body: Any, key: SigningKey) -> tuple[Code, str]:
    [result] = chain.block([chain.tx(body, key)])
    return Code(result.code), result.log


def register(chain: Chain, label: str, numerics: int | None, role: str = "compute") -> SigningKey:
    key = seeded_key(label)
    body = dataclasses.replace(register_body(label, role=role), numerics=numerics)
    assert send(chain, body, key)[0] == Code.OK
    return key


def announce(chain: Chain, versions: dict[int, int]) -> None:
    """Validators (index → version) announce their verifiers' numerics in one block."""
    txs = [chain.tx(VerifierNumerics(v), chain.validators[i].key) for i, v in versions.items()]
    assert [r.code for r in chain.block(txs)] == [Code.OK] * len(txs)


def vote(chain: Chain, *indexes: int) -> list[Code]:
    return [Code(r.code) for r in chain.block([verdict_vote(chain, i, VERDICT) for i in indexes])]


def verdict(chain: Chain) -> dict[str, Any]:
    [record] = ask(chain, "/verdicts")["verdicts"]
    return record


def versions(chain: Chain) -> dict[int, dict[str, Any]]:
    return {v["numerics"]: v for v in ask(chain, "/numerics")["versions"]}


def setup(
    genesis: dict[str, Any] = UPGRADE,
    powers: tuple[int, ...] = (10, 10, 10, 10),
    verifiers: dict[int, int] | None = None,
    node_numerics: int = 3,
) -> tuple[Chain, SigningKey]:
    """A chain whose validators announce `verifiers` (in effect from epoch 2) and a node `n1`
    (the one VERDICT accuses) registered on `node_numerics`; returns at the start of epoch 2."""
    chain = Chain(genesis=genesis, powers=powers)
    key = register(chain, "n1", node_numerics)
    announce(chain, verifiers or {})
    chain.advance_to(last_height(1))
    return chain, key


# --- a node's version change ---------------------------------------------------------------------


def test_set_numerics_takes_effect_at_the_next_epoch_boundary() -> None:
    chain = Chain(genesis=UPGRADE)
    key = register(chain, "n1", 2)  # height 1, epoch 1
    assert send(chain, SetNumerics(3), key)[0] == Code.OK  # height 2
    pending = node(chain, key)
    assert pending["numerics"] == 2  # epoch 1 is judged under 2 to its end
    assert pending["numerics_next"] == {"epoch": 2, "numerics": 3}
    assert announced_at(pending, 1) == 2 and announced_at(pending, 2) == 3
    chain.advance_to(last_height(1) - 1)
    assert node(chain, key)["numerics"] == 2
    chain.advance_to(last_height(1))  # EndBlock of height 5 opens epoch 2
    changed = node(chain, key)
    assert changed["numerics"] == 3 and changed["numerics_epoch"] == 2
    assert changed["numerics_previous"] == 2 and "numerics_next" not in changed
    # a verifier judging epoch 1's work still reads 2, epoch 2's reads 3
    assert announced_at(changed, 1) == 2 and announced_at(changed, 2) == 3


def test_an_unannounced_node_announces_a_version_by_changing() -> None:
    chain = Chain(genesis=UPGRADE)
    key = register(chain, "old", None)  # an older release's registration
    assert send(chain, SetNumerics(3), key)[0] == Code.OK
    chain.advance_to(last_height(1))
    changed = node(chain, key)
    assert changed["numerics"] == 3 and "numerics_previous" not in changed
    assert announced_at(changed, 1) is None and announced_at(changed, 2) == 3


def test_flapping_is_refused_by_name_until_the_cooldown_has_passed() -> None:
    chain = Chain(genesis=UPGRADE)
    key = register(chain, "n1", 2)
    assert send(chain, SetNumerics(3), key)[0] == Code.OK
    code, log = send(chain, SetNumerics(3), key)  # the same change again
    assert code == Code.NUMERICS_UNCHANGED and "already changes to numerics 3 at epoch 2" in log
    code, log = send(chain, SetNumerics(2), key)  # back again before the boundary
    assert code == Code.NUMERICS_TOO_SOON and "already changes to numerics 3 at epoch 2" in log
    chain.advance_to(last_height(1))
    code, log = send(chain, SetNumerics(2), key)  # epoch 2: the change just took effect
    assert code == Code.NUMERICS_TOO_SOON
    first_allowed = 2 + NUMERICS_COOLDOWN_EPOCHS - 1  # takes effect 2 + COOLDOWN
    assert f"send it from epoch {first_allowed}" in log
    chain.advance_to(last_height(first_allowed - 1) - 1)
    assert send(chain, SetNumerics(2), key)[0] == Code.NUMERICS_TOO_SOON  # last block before
    assert chain.state.height == last_height(first_allowed - 1)
    assert send(chain, SetNumerics(2), key)[0] == Code.OK  # first block of first_allowed
    assert node(chain, key)["numerics_next"] == {"epoch": first_allowed + 1, "numerics": 2}


def test_set_numerics_refusals_are_named_and_write_nothing() -> None:
    chain = Chain(genesis=UPGRADE)
    key = register(chain, "n1", 2)
    code, log = send(chain, SetNumerics(2), key)
    assert code == Code.NUMERICS_UNCHANGED and "already has numerics 2" in log
    code, log = send(chain, SetNumerics(4), key)
    assert code == Code.NUMERICS_NOT_ACCEPTED and "numerics 4" in log and "[2, 3]" in log
    assert send(chain, SetNumerics(3), seeded_key("stranger"))[0] == Code.UNKNOWN_NODE
    verifier = register(chain, "v", 2, role="verifier")
    assert send(chain, SetNumerics(3), verifier)[0] == Code.WRONG_ROLE
    assert send(chain, Leave(), key)[0] == Code.OK
    assert send(chain, SetNumerics(3), key)[0] == Code.INVALID_LIFECYCLE
    assert "numerics_next" not in node(chain, key)
    assert chain.state.keys("numdue") == []


def test_verifier_numerics_needs_a_validator_and_takes_effect_at_the_boundary() -> None:
    chain = Chain(genesis=UPGRADE)
    code = send(chain, VerifierNumerics(3), seeded_key("stranger"))[0]
    assert code == Code.NOT_VALIDATOR
    assert send(chain, VerifierNumerics(4), chain.validators[0].key)[0] == (
        Code.NUMERICS_NOT_ACCEPTED
    )
    announce(chain, {0: 3, 1: 3})
    assert versions(chain)[3]["verifiers"] == []  # epoch 1: not yet
    assert set(ask(chain, "/numerics")["pending"]) == {
        chain.validators[0].address,
        chain.validators[1].address,
    }
    chain.advance_to(last_height(1))
    three = versions(chain)[3]
    assert three["power"] == 20 and three["checked"] and three["threshold"] == 14
    assert three["verifiers"] == sorted(v.address for v in chain.validators[:2])
    assert versions(chain)[2] == {
        "numerics": 2,
        "verifiers": [],
        "power": 0,
        "checked": False,
        "threshold": None,
    }
    code, _ = send(chain, VerifierNumerics(2), chain.validators[0].key)
    assert code == Code.NUMERICS_TOO_SOON  # a verifier cannot hop between groups either


def test_set_numerics_body_is_strict_and_round_trips() -> None:
    for cls in (SetNumerics, VerifierNumerics):
        for bad in ({"numerics": 0}, {"numerics": 65536}, {"numerics": True}, {"numerics": "2"}):
            with pytest.raises(TxDecodeError, match=r"body\.numerics"):
                cls.from_json(bad)
        with pytest.raises(TxDecodeError):
            cls.from_json({"numerics": 2, "epoch": 3})
        raw = sign(cls(3), seeded_key("k"), 1).encode()
        assert decode(raw).body == cls(3)


def test_announced_at_refuses_malformed_fields() -> None:
    for view in (
        {"numerics": 3, "numerics_epoch": "2"},
        {"numerics": 3, "numerics_next": {"epoch": 2}},
        {"numerics": 3, "numerics_next": [3]},
        {"numerics": 3, "numerics_epoch": 4, "numerics_previous": 0},
    ):
        with pytest.raises(NumericsError):
            announced_at(view, 2)
    assert announced_at({"numerics": 3, "numerics_epoch": 4}, 2) is None


# --- the version quorum --------------------------------------------------------------------------


def test_minority_version_node_is_convicted_by_its_versions_quorum() -> None:
    """Two of four verifiers run 3 (20 of 40 power: at the floor); their two votes convict a
    node on 3 though they are short of 2/3 of all the power (on main: not confirmed)."""
    chain, key = setup(verifiers={0: 3, 1: 3, 2: 2, 3: 2})
    assert node(chain, key)["numerics_checked"] is True
    assert vote(chain, 0) == [Code.OK]
    assert verdict(chain)["confirmed"] is False  # one voter: never alone
    assert vote(chain, 1) == [Code.OK]
    record = verdict(chain)
    assert record["confirmed"] is True and record["quorum_numerics"] == 3
    assert record["power"] == 20 and record["numerics"] == [3]
    assert node(chain, key)["reputation"] == 0  # convicted
    assert record["relayable"] is False  # FraudProofs needs 2/3 of all: the watcher waits
    vote(chain, 2)
    assert verdict(chain)["relayable"] is True


def test_votes_from_other_versions_do_not_count_in_a_versions_quorum() -> None:
    chain, _ = setup(verifiers={0: 3, 1: 2, 2: 2, 3: 2})
    vote(chain, 0, 1)  # 1 runs 2: not in 3's group; 20 of 40 is not 2/3 of all either
    assert verdict(chain)["confirmed"] is False


def test_a_version_below_the_floor_is_unchecked_and_its_verifier_cannot_convict() -> None:
    chain, key = setup(verifiers={0: 3, 1: 2, 2: 2, 3: 2})
    assert node(chain, key)["numerics_checked"] is False
    three = versions(chain)[3]
    assert three["checked"] is False and three["threshold"] is None and three["power"] == 10
    vote(chain, 0)
    assert verdict(chain)["confirmed"] is False
    chain.advance_to(last_height(2 + SETTLE_EPOCHS))
    assert verdict(chain)["settled"] == "refused"  # as before: a lone accusation costs its author
    # 2/3 of all the power still convicts, whatever the versions (today's rule kept)
    chain2, _ = setup(verifiers={0: 3, 1: 2, 2: 2, 3: 2})
    vote(chain2, 0, 1, 2)
    assert verdict(chain2)["confirmed"] is True and "quorum_numerics" not in verdict(chain2)


@pytest.mark.parametrize(
    ("powers", "verifiers", "voters"),
    [
        # one verifier holding 40 % of the power (above a third): below K = 2 verifiers
        ((40, 20, 20, 20), {0: 3, 1: 2, 2: 2, 3: 2}, (0,)),
        # two verifiers with 10 of 100: below a third of the power
        ((45, 5, 5, 45), {1: 3, 2: 3, 0: 2, 3: 2}, (1, 2)),
    ],
)
def test_a_small_group_cannot_convict_alone(
    powers: tuple[int, ...], verifiers: dict[int, int], voters: tuple[int, ...]
) -> None:
    chain, key = setup(powers=powers, verifiers=verifiers)
    assert node(chain, key)["numerics_checked"] is False
    assert all(code == Code.OK for code in vote(chain, *voters))
    assert verdict(chain)["confirmed"] is False
    assert MIN_GROUP_VERIFIERS == 2


def test_unannounced_verifiers_leave_the_rule_as_before() -> None:
    chain, key = setup(verifiers={})  # no verifier announced: every version unchecked
    assert node(chain, key)["numerics_checked"] is False
    vote(chain, 0, 1)
    assert verdict(chain)["confirmed"] is False
    vote(chain, 2)
    assert verdict(chain)["confirmed"] is True


def test_unannounced_node_has_no_checked_field_and_only_two_thirds_convicts() -> None:
    chain, key = setup(verifiers={0: 3, 1: 3}, node_numerics=None)  # type: ignore[arg-type]
    assert "numerics_checked" not in node(chain, key)
    vote(chain, 0, 1)
    record = verdict(chain)
    assert record["confirmed"] is False and "numerics" not in record


def test_a_node_that_switches_after_cheating_is_still_judged_by_its_old_versions_quorum() -> None:
    """n1 computes on 3 in epoch 2, switches to 2 from epoch 3; the verifiers of 3 find its
    epoch-2 block in epoch 3: the verdict pins both versions, and 3's quorum convicts."""
    chain, key = setup(verifiers={0: 3, 1: 3, 2: 2, 3: 2})
    assert send(chain, SetNumerics(2), key)[0] == Code.OK
    chain.advance_to(last_height(2))
    assert node(chain, key)["numerics"] == 2
    vote(chain, 0, 1)
    record = verdict(chain)
    assert record["numerics"] == [2, 3]
    assert record["confirmed"] is True and record["quorum_numerics"] == 3


# --- adversarial ---------------------------------------------------------------------------------


def test_faulty_verifiers_announcing_a_version_they_do_not_run_cannot_convict() -> None:
    """Seven validators of power 10 (70; faulty power < 70/3 means at most 2). One honest
    verifier runs 3; the two faulty ones announce 3 too, making a group of 30 (above the floor)
    in which they hold 2/3. Their false verdict is not confirmed: a conviction also needs a
    third of ALL the power, which faulty power never reaches, so one honest vote is needed."""
    chain, _ = setup(powers=(10,) * 7, verifiers={0: 3, 5: 3, 6: 3, 1: 2, 2: 2, 3: 2, 4: 2})
    three = versions(chain)[3]
    assert three["checked"] and three["power"] == 30 and three["threshold"] == 24
    assert vote(chain, 5, 6) == [Code.OK, Code.OK]
    assert verdict(chain)["confirmed"] is False  # 20 ≥ 2/3 of 30, but 20 < 70/3
    # they cannot hop to a fresh version of their own either: below the floor, and too soon
    assert send(chain, VerifierNumerics(2), chain.validators[5].key)[0] == Code.NUMERICS_TOO_SOON
    chain.advance_to(last_height(2 + SETTLE_EPOCHS))
    assert verdict(chain)["settled"] == "refused"
    benched = ask(chain, "/verifiers")["verifiers"]
    assert {chain.validators[5].address, chain.validators[6].address} <= set(benched)
    # the honest verifier's vote with theirs would have reached it (30 ≥ 24 and 30 ≥ 70/3)
    chain2, _ = setup(powers=(10,) * 7, verifiers={0: 3, 5: 3, 6: 3, 1: 2, 2: 2, 3: 2, 4: 2})
    vote(chain2, 0, 5, 6)
    assert verdict(chain2)["confirmed"] is True


def test_announcing_mid_verdict_does_not_join_the_group_before_the_boundary() -> None:
    """A verifier that announces a version while a verdict is open is not in that version's
    group before the next boundary: its vote does not count there, so a lone accuser cannot
    recruit a second vote by announcement within the epoch."""
    chain, _ = setup(verifiers={0: 3, 1: 3, 3: 2})
    vote(chain, 1)
    assert send(chain, VerifierNumerics(3), chain.validators[2].key)[0] == Code.OK
    vote(chain, 2)  # same epoch: 2's announcement is pending, its vote is outside the group
    assert verdict(chain)["confirmed"] is False


# --- the verifier service announces its release's numerics --------------------------------------


class _ChainLink:
    """`CommitteeLink.send` over the in-process chain: each tx in its own block."""

    def __init__(self, chain: Chain, key: SigningKey) -> None:
        self.chain, self.key = chain, key

    async def send(self, body: Any, *, timeout_s: float = 15) -> tuple[int, str]:
        [result] = self.chain.block([self.chain.tx(body, self.key)])
        return int(result.code), result.log


async def test_verifier_service_announces_this_releases_numerics_and_a_restart_is_fine() -> None:
    chain = Chain(genesis={"numerics": [NUMERICS]})
    link = _ChainLink(chain, chain.validators[0].key)
    assert await announce_numerics(link, pause_s=0)
    assert await announce_numerics(link, pause_s=0)  # restarted before the boundary: pending
    chain.advance_to(last_height(1))
    assert await announce_numerics(link, pause_s=0)  # and after it: in effect
    [group] = ask(chain, "/numerics")["versions"]
    assert group["numerics"] == NUMERICS and group["verifiers"] == [chain.validators[0].address]
    refused = Chain(genesis={"numerics": [NUMERICS + 1]})
    assert not await announce_numerics(_ChainLink(refused, refused.validators[0].key), pause_s=0)
