"""Validator set changes on the in-process chain (abci_app/validator_set.py): a change applies
at the epoch boundary once validators with ≥ 2/3 of the power approved it, CometBFT is told in
that block's FinalizeBlock and the app switches with it two blocks later; every refusal by
name; a join then a leave: the next key period's key is dealt to the new set, old credits
still redeem, a cheating dealer of the new set is excluded by complaint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from abci_app.app import CommitteeApp, pb
from abci_app.codes import Code
from abci_app.query_params import QueryError
from abci_app.threshold_queries import partials
from abci_app.validator_set import CHANGE_EPOCHS
from node.client.mint_request import MintRequest
from node.watcher.credit_dkg import plan
from protocol import dkg_wire
from protocol.blind_bls import ThresholdCredit
from protocol.committee.credit_dkg import DkgDeal
from protocol.committee.credits import CreditRedeem
from protocol.committee.grammar import TxDecodeError
from protocol.committee.prices import SetPrice
from protocol.committee.validator_set import (
    ValidatorApprove,
    ValidatorChange,
    change_id,
)
from protocol.credit_periods import KeySchedule
from protocol.credit_shares import CreditShareStore
from protocol.dkg import Deal
from protocol.threshold_mint import PeriodKey
from tests.committee_chain import (
    EVM_CHAIN_ID,
    Chain,
    Validator,
    seeded_evm_key,
    seeded_key,
    seeded_validators,
)
from tests.credit_chain import NOW, PAYER, PHASE, PRICE, credit_chain, fund, post_with, send
from tests.unit.test_abci_settlement import ESCROW, ask
from tests.unit.test_abci_state import make_routable, price_txs, register, served_commit_tx

pytestmark = pytest.mark.unit

NEWCOMER = Validator(seeded_key("validator-new"), seeded_evm_key("operator-new"), 10)


def known(chain: Chain) -> dict[str, Validator]:
    every = chain.__dict__.setdefault("every_validator", {})
    for v in [*chain.validators, NEWCOMER]:
        every.setdefault(v.pubkey.hex(), v)
    return every


def step(chain: Chain, txs: list[bytes] | None = None) -> list[Any]:
    """One block; the harness's validators (who sign extended commits) follow the app's set."""
    results = chain.block(txs)
    every = known(chain)
    chain.validators = [
        Validator(every[v["pub_key"]].key, every[v["pub_key"]].operator_key, v["power"])
        for v in chain.state.validators
    ]
    return results


def advance(chain: Chain, height: int) -> None:
    while chain.state.height < height:
        step(chain)


def add(validator: Validator = NEWCOMER) -> ValidatorChange:
    return ValidatorChange(
        "add", validator.pubkey.hex(), validator.power, validator.operator.lower()
    )


def propose(chain: Chain, change: ValidatorChange, by: int = 0) -> tuple[Any, str]:
    identifier = change_id(change, chain.state.height + 1)
    [result] = step(chain, [chain.tx(change, chain.validators[by].key)])
    return result, identifier


def approve(chain: Chain, identifier: str, by: list[int]) -> list[Any]:
    keys = [chain.validators[i].key for i in by]
    return step(chain, [chain.tx(ValidatorApprove(identifier), key) for key in keys])


def boundary_after(chain: Chain) -> int:
    length = chain.state.genesis.epoch_length
    return (chain.state.height // length + 1) * length


def test_a_change_below_two_thirds_does_nothing_and_at_two_thirds_applies_at_the_boundary() -> None:
    chain = Chain()
    app = CommitteeApp(chain.machine)
    result, identifier = propose(chain, add())
    assert result.code == Code.OK, result.log
    assert [r.code for r in approve(chain, identifier, [1])] == [Code.OK]  # 20 of 40
    first = boundary_after(chain)
    advance(chain, first + 2)
    assert len(chain.state.validators) == 4 and chain.state.validator_updates == []
    assert ask(chain, "/params")["validators"][0]["power"] == 10
    assert [r.code for r in approve(chain, identifier, [2])] == [Code.OK]  # 30 of 40: approved
    [pending] = ask(chain, "/validator_changes")["changes"]
    assert pending["id"] == identifier and pending["approved_height"] == chain.state.height
    assert len(pending["approvals"]) == 3
    boundary = boundary_after(chain)
    advance(chain, boundary - 1)
    assert chain.state.validator_updates == []
    # the boundary block, through the ABCI adapter: FinalizeBlock names the new validator
    assert not chain.machine.vx_required(boundary)  # not an extended-commit block (epochs of 5)
    response = app.finalize_block(
        pb.RequestFinalizeBlock(height=boundary, hash=b"\x01" * 32, txs=[])
    )
    app.commit(pb.RequestCommit())
    waiting = ask(chain, "/validator_changes")
    assert waiting["changes"] == [] and waiting["next"]["from_height"] == boundary + 2
    [update] = response.validator_updates
    assert update.pub_key.ed25519 == NEWCOMER.pubkey and update.power == 10
    assert len(chain.state.validators) == 4  # CometBFT's set changes at boundary + 2
    step(chain)  # boundary + 1: nothing more to tell CometBFT; the app switches at its end
    assert chain.state.validator_updates == []
    assert len(chain.state.validators) == 5
    assert NEWCOMER.pubkey.hex() in chain.state.by_pubkey
    assert ask(chain, "/params")["validators"][0]["address"] in chain.state.by_address
    # the newcomer is a validator from boundary + 2: it approves, its txs count
    result, removal = propose(chain, ValidatorChange("remove", chain.validators[0].pubkey.hex()))
    assert result.code == Code.OK, result.log
    newcomer = [v.pubkey for v in chain.validators].index(NEWCOMER.pubkey)
    assert [r.code for r in approve(chain, removal, [newcomer])] == [Code.OK]


def test_refusals_by_name() -> None:
    chain = Chain()
    stranger = seeded_key("stranger")
    [refused] = step(chain, [chain.tx(add(), stranger)])
    assert refused.code == Code.NOT_VALIDATOR
    member = chain.validators[1].pubkey.hex()
    for change, code in [
        (
            ValidatorChange("add", member, 5, NEWCOMER.operator.lower()),
            Code.VALIDATOR_CHANGE_INVALID,
        ),
        (
            ValidatorChange("add", "ff" * 32, 5, NEWCOMER.operator.lower()),
            Code.VALIDATOR_CHANGE_INVALID,
        ),
        (ValidatorChange("remove", member), Code.VALIDATOR_CHANGE_INVALID),  # 4 → 3 < minimum
        (ValidatorChange("power", member, 10), Code.VALIDATOR_CHANGE_INVALID),  # unchanged
        (ValidatorChange("power", NEWCOMER.pubkey.hex(), 3), Code.VALIDATOR_CHANGE_INVALID),
    ]:
        [result] = step(chain, [chain.tx(change, chain.validators[0].key)])
        assert result.code == code, (change, result.log)
    result, identifier = propose(chain, add())
    assert result.code == Code.OK
    proposed_epoch = (chain.state.height - 1) // chain.state.genesis.epoch_length + 1
    # one pending change per proposer and per target
    [again] = step(chain, [chain.tx(ValidatorChange("power", member, 7), chain.validators[0].key)])
    assert again.code == Code.VALIDATOR_CHANGE_PENDING
    [same] = step(chain, [chain.tx(add(), chain.validators[1].key)])
    assert same.code == Code.VALIDATOR_CHANGE_PENDING
    [stranger_vote] = step(chain, [chain.tx(ValidatorApprove(identifier), stranger)])
    assert stranger_vote.code == Code.NOT_VALIDATOR
    [unknown] = approve(chain, "0x" + "ab" * 32, [1])
    assert unknown.code == Code.VALIDATOR_CHANGE_UNKNOWN
    [own] = approve(chain, identifier, [0])  # the proposal was the proposer's approval
    assert own.code == Code.DUPLICATE_VOTE
    signed = chain.tx(ValidatorApprove(identifier), chain.validators[1].key)
    assert [r.code for r in step(chain, [signed])] == [Code.OK]
    assert [r.code for r in step(chain, [signed])] == [Code.BAD_NONCE]  # the same bytes again
    [twice] = approve(chain, identifier, [1])
    assert twice.code == Code.DUPLICATE_VOTE
    # 20 of 40 until its last epoch ends: expired, refused by name, then gone
    length = chain.state.genesis.epoch_length
    last = chain.state.get("vchange", identifier)["last_epoch"]
    assert last == proposed_epoch + CHANGE_EPOCHS
    advance(chain, last * length + 1)
    [late] = approve(chain, identifier, [2])
    assert late.code == Code.VALIDATOR_CHANGE_EXPIRED
    assert len(chain.state.validators) == 4
    result, _ = propose(chain, add())  # proposer and target are free again
    assert result.code == Code.OK, result.log
    advance(chain, (last + 1) * length + 1)
    [gone] = approve(chain, identifier, [2])
    assert gone.code == Code.VALIDATOR_CHANGE_UNKNOWN


def test_two_removals_approved_together_never_leave_fewer_than_the_minimum() -> None:
    chain = Chain(powers=(10, 10, 10, 10, 10))
    v = chain.validators
    changes = [  # each alone valid: a removal leaves 4
        (0, ValidatorChange("remove", v[3].pubkey.hex())),
        (1, ValidatorChange("remove", v[4].pubkey.hex())),
        (2, ValidatorChange("power", v[2].pubkey.hex(), 25)),
    ]
    ids = [change_id(change, chain.state.height + 1) for _, change in changes]
    proposed = step(chain, [chain.tx(change, v[by].key) for by, change in changes])
    assert [r.code for r in proposed] == [Code.OK] * 3, [r.log for r in proposed]
    approvals = [  # 40 of 50 each, in one block of the same epoch
        chain.tx(ValidatorApprove(identifier), v[i].key)
        for identifier, approvers in zip(ids, ([1, 2, 4], [0, 2, 3], [0, 1, 3]), strict=True)
        for i in approvers
    ]
    assert {r.code for r in step(chain, approvals)} == {Code.OK}
    assert chain.state.height < chain.state.genesis.epoch_length
    advance(chain, chain.state.genesis.epoch_length)
    # in id order: the first removal applies, the second would leave 3 and is dropped
    removals = sorted(ids[:2])
    kept = changes[ids.index(removals[0])][1].pub_key
    assert dict(chain.state.validator_updates) == {kept: 0, v[2].pubkey.hex(): 25}
    step(chain)
    assert len(chain.state.validators) == 4 and chain.state.total_power == 55
    assert kept not in chain.state.by_pubkey
    assert ask(chain, "/validator_changes") == {"changes": [], "next": None}


# --- a join then a leave, with credits ------------------------------------------------------------


def stores(tmp_path: Path) -> dict[str, CreditShareStore]:
    """Each validator's share store by consensus key (the newcomer's too)."""
    return {
        key: CreditShareStore(tmp_path / "by-key" / key[:16])
        for key in [v.pubkey.hex() for v in seeded_validators_and_newcomer()]
    }


def seeded_validators_and_newcomer() -> list[Validator]:
    return [*seeded_validators((10, 10, 10, 10)), NEWCOMER]


def play(
    chain: Chain,
    shares: dict[str, CreditShareStore],
    period: int,
    until: int,
    skip: frozenset[str] = frozenset(),
) -> None:
    """Every validator of the app's set (but `skip`) sends what its watcher would."""
    while chain.state.height < until:
        answer = ask(chain, f"/credit_period?period={period}")
        txs = []
        for validator in chain.validators:
            key = validator.pubkey.hex()
            if key not in skip:
                txs += [
                    chain.tx(b, validator.key) for b in plan(answer, validator.key, shares[key])
                ]
        results = step(chain, txs)
        assert all(r.code == Code.OK for r in results), [r.log for r in results]


def mint(
    chain: Chain, shares: dict[str, CreditShareStore], count: int
) -> tuple[list[ThresholdCredit], list[dict[str, Any]]]:
    """A mint of the next block's period, funded; every current validator's partials."""
    key = PeriodKey.from_answer(ask(chain, "/credit_period"))
    req = MintRequest.create(key, count, PAYER, PRICE, EVM_CHAIN_ID, ESCROW, NOW + 3600)
    assert send(chain, req.body).code == Code.OK
    fund(chain, req.mint_id)
    # every current validator holding a share of the period posts its partials on the chain,
    # as its watcher's MintSigner does (node/watcher/mint_signer.py)
    posted = post_with(chain, [shares[v.pubkey.hex()] for v in chain.validators], req.mint_id)
    assert all(r.code == Code.OK for r in posted), [r.log for r in posted]
    answers = []
    for v in chain.validators:
        try:
            answers.append(partials(chain.state, shares[v.pubkey.hex()], {"mint": req.mint_id}))
        except QueryError:  # a validator with no share of the period answers none
            continue
    credits = req.finalize(
        PeriodKey.from_answer(ask(chain, f"/credit_period?period={key.period}")), answers
    )
    return credits, answers


def test_join_then_leave_deals_the_next_period_to_the_new_set_and_old_credits_redeem(
    tmp_path: Path,
) -> None:
    chain = credit_chain(tmp_path, lifetime_epochs=12, period_blocks=60)  # period 0 keyed
    shares = stores(tmp_path)
    for i, v in enumerate(chain.validators):  # credit_chain's period-0 shares, by key
        old = CreditShareStore(tmp_path / "shares" / f"v{i}")
        shares[v.pubkey.hex()].save(0, old.load(0))
    node = register(chain, "credit-node", shards=(0, 1))
    make_routable(chain, node)
    assert send(chain, SetPrice("m", 0, 1), node).code == Code.OK
    old_credits, _ = mint(chain, shares, 2)
    leaver = chain.validators[3]
    # the newcomer joins (approved by 3 of 4), at the next boundary
    result, joined = propose(chain, add())
    assert result.code == Code.OK, result.log
    approve(chain, joined, [1, 2])
    advance(chain, boundary_after(chain) + 1)
    assert len(chain.state.validators) == 5
    # then validator 3 leaves (4 of 5 approve: 40 of 50)
    result, left = propose(chain, ValidatorChange("remove", leaver.pubkey.hex()), by=0)
    assert result.code == Code.OK, result.log
    newcomer = [v.pubkey for v in chain.validators].index(NEWCOMER.pubkey)
    approve(chain, left, [1, 2, newcomer])
    advance(chain, boundary_after(chain) + 1)
    members = {v["pub_key"] for v in chain.state.validators}
    assert NEWCOMER.pubkey.hex() in members and leaver.pubkey.hex() not in members
    plan_ = KeySchedule(60, PHASE)
    assert chain.state.height < plan_.dkg_config_height(1)  # the run of period 1: after both
    # period 1's key: dealt to the new set, the newcomer a cheating dealer, excluded by complaint
    advance(chain, plan_.dkg_config_height(1))
    answer = ask(chain, "/credit_period?period=1")
    receivers = [pub for _, pub in answer["run"]["receivers"]]
    assert sorted(receivers) == sorted(members) and answer["run"]["threshold"] == 3
    [honest] = plan(answer, NEWCOMER.key, shares[NEWCOMER.pubkey.hex()])
    deal = dkg_wire.decode_deal(honest.deal)
    bad = Deal(
        deal.dealer, deal.commitments, tuple(c[:-1] + bytes([c[-1] ^ 1]) for c in deal.ciphertexts)
    )
    step(chain, [chain.tx(DkgDeal(1, dkg_wire.encode_deal(bad)), NEWCOMER.key)])
    cheat = frozenset({NEWCOMER.pubkey.hex()})
    play(chain, shares, 1, plan_.dkg_finish_height(1), skip=cheat)
    run = ask(chain, "/credit_period?period=1")["run"]
    assert sorted({d for d, _ in run["complaints"]}) == [deal.dealer]
    assert deal.dealer not in run["result"]["qualified"] and len(run["result"]["qualified"]) == 3
    period0 = ask(chain, "/credit_period?period=0")["run"]["result"]["key"]
    assert run["result"]["key"] != period0  # a key of its own: see docs/credits.md
    play(
        chain, shares, 1, plan_.period_start(1)
    )  # every member of the new set (the newcomer too) saves its share
    assert shares[NEWCOMER.pubkey.hex()].share(1) is not None
    assert shares[leaver.pubkey.hex()].share(1) is None  # the leaver holds no share of period 1
    # a period-1 mint: signed by the new set's shares only
    new_credits, answers = mint(chain, shares, 2)
    assert {a["validator"] for a in answers} == {v["address"] for v in chain.state.validators}
    assert all(c.period == 1 for c in new_credits)
    # period 0's credits still redeem in period 1 (their key's record kept), once
    priced = price_txs(chain, node, 0)
    commit = served_commit_tx(chain, node, 0, blocks=1)
    *_, redeemed = step(
        chain, [*priced, commit, chain.tx(CreditRedeem("m", 0, tuple(old_credits)), node)]
    )
    assert redeemed.code == Code.OK, redeemed.log
    commit = served_commit_tx(chain, node, 0, blocks=1)
    *_, fresh = step(chain, [commit, chain.tx(CreditRedeem("m", 0, tuple(new_credits)), node)])
    assert fresh.code == Code.OK, fresh.log


@pytest.mark.parametrize(
    "body",
    [
        {"action": "add", "pub_key": "ab" * 32, "power": 1},  # no operator
        {"action": "add", "pub_key": "ab" * 32, "power": 0, "operator": "0x" + "a" * 40},
        {"action": "add", "pub_key": "ab" * 32, "power": 1, "operator": "0x" + "A" * 40},
        {"action": "power", "pub_key": "ab" * 32, "power": 10**12 + 1},
        {"action": "power", "pub_key": "AB" * 32, "power": 1},
        {"action": "remove", "pub_key": "ab" * 32, "power": 0},  # a removal names no power
        {"action": "join", "pub_key": "ab" * 32},
        {"action": "remove", "pub_key": "ab" * 31},
        {"action": "power", "pub_key": "ab" * 32, "power": True},
        ["remove", "ab" * 32],
        # unhashable actions: the fuzzer's seed 674294 crashed PrepareProposal with TypeError
        {"action": {"mint": "a"}, "pub_key": "ab" * 32},
        {"action": ["add"], "pub_key": "ab" * 32, "power": 1},
    ],
)
def test_a_malformed_change_never_decodes(body: object) -> None:
    with pytest.raises(TxDecodeError):
        ValidatorChange.from_json(body)


def test_a_change_round_trips_its_canonical_body() -> None:
    for change in [
        add(),
        ValidatorChange("power", "ab" * 32, 7),
        ValidatorChange("remove", "ab" * 32),
    ]:
        assert ValidatorChange.from_json(change.to_json()) == change
    with pytest.raises(TxDecodeError):
        ValidatorApprove.from_json({"change": "0x" + "AB" * 32})
