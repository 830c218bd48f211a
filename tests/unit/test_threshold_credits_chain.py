"""Threshold-BLS credits on the chain (abci_app/threshold_credits.py): a mint carries ONE list
of blinded points, every validator signs that list (`/credit_partials`, checked against X_i),
the client combines t and unblinds; a mint of N gives exactly N credits — issue 42 attack 1
tried against it fails — and the credits redeem once under the period's key X_p."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from abci_app import schema
from abci_app.codes import Code
from abci_app.query_params import QueryError
from abci_app.threshold_queries import partials
from node.client.mint_request import MintIncomplete, MintRequest, PeriodKey
from protocol import blind_bls, bls
from protocol.blind_bls import ThresholdCredit
from protocol.committee.credits import CreditMint, CreditRedeem, FundMint
from protocol.committee.grammar import TxDecodeError
from protocol.credit_shares import CreditShareStore
from protocol.eip712 import address_of
from tests.committee_chain import EVM_CHAIN_ID, Chain
from tests.credit_chain import NOW, PAYER, PRICE, post_with
from tests.unit.test_abci_settlement import ESCROW, ask, settled_chain
from tests.unit.test_abci_state import make_routable, price_txs, register, served_commit_tx
from tests.unit.test_credit_dkg_chain import PERIOD_BLOCKS, PHASE, SCHEDULE, play

pytestmark = pytest.mark.unit


def keyed_chain(tmp_path: Path) -> tuple[Chain, list[CreditShareStore], object]:
    chain = settled_chain(
        bindings={},  # no gateway tx in block 1: the DKG phases' heights as planned
        credits={
            "price_wei": str(PRICE),
            "layer_tokens": 16,
            "key_period_blocks": PERIOD_BLOCKS,
            "dkg_phase_blocks": PHASE,
        },
    )
    chain.time_s = NOW
    stores = [CreditShareStore(tmp_path / f"v{i}") for i in range(len(chain.validators))]
    play(chain, stores, 0, SCHEDULE.dkg_finish_height(0) + 1)
    node = register(chain, "threshold-node", shards=(0,))
    make_routable(chain, node)
    return chain, stores, node


def period_key(chain: Chain) -> PeriodKey:
    return PeriodKey.from_answer(ask(chain, "/credit_period"))


def request(chain: Chain, count: int) -> MintRequest:
    return MintRequest.create(
        period_key(chain), count, PAYER, PRICE, EVM_CHAIN_ID, ESCROW, NOW + 3600
    )


def mint_and_fund(chain: Chain, req: MintRequest) -> None:
    [result] = chain.block([chain.tx(req.body, chain.validators[0].key)])
    assert result.code == Code.OK, result.log
    results = chain.block([chain.tx(FundMint(req.mint_id), v.key) for v in chain.validators])
    assert all(r.code == Code.OK for r in results), [r.log for r in results]


def gather(chain: Chain, stores: list[CreditShareStore], mint_id: str) -> list[dict]:
    post_with(chain, stores, mint_id)  # each validator's watcher posts its set
    return [partials(chain.state, store, {"mint": mint_id}) for store in stores]


def redeem(chain: Chain, node, credits: list[ThresholdCredit]):  # type: ignore[no-untyped-def]
    priced = price_txs(chain, node)
    commit = served_commit_tx(chain, node, 0, blocks=max(1, -(-len(credits) // 32)))
    body = CreditRedeem("m", 0, tuple(credits))
    *_, result = chain.block([*priced, commit, chain.tx(body, node)])
    return result


def test_a_mint_of_three_gives_three_credits_that_redeem_once(tmp_path: Path) -> None:
    chain, stores, node = keyed_chain(tmp_path)
    req = request(chain, 3)
    mint_and_fund(chain, req)
    answers = gather(chain, stores, req.mint_id)
    # every validator signed the same one list
    assert {len(a["partials"]) for a in answers} == {3}
    credits = req.finalize(period_key(chain), answers)
    assert len(credits) == 3 and len({c.nonce for c in credits}) == 3
    # any 3 of the 4 validators suffice, and give the same credits (σ is deterministic)
    assert req.finalize(period_key(chain), answers[1:]) == credits
    assert redeem(chain, node, credits).code == Code.OK
    assert redeem(chain, node, credits[:1]).code == Code.CREDIT_SPENT
    assert ask(chain, "/credit_period?period=0")["buyers"] == 1


def test_attack_1_a_mint_of_three_never_gives_four(tmp_path: Path) -> None:
    """Issue 42 attack 1: with per-validator keys the payer listed different messages to each
    validator and combined more credits than it paid for. Now there is one list."""
    chain, stores, node = keyed_chain(tmp_path)
    req = request(chain, 3)
    # (a) the old per-validator form does not even parse as a threshold mint
    per_validator = {**req.body.to_json(), "blinded": [[v.address, []] for v in chain.validators]}
    with pytest.raises(TxDecodeError):
        CreditMint.from_json(per_validator)
    # (b) a different list for some validators under the same paid purchase: the purchase
    # signature binds the one list (the mint id), so the variant is refused
    extra = blind_bls.blind(0, b"\x09" * 32).blinded
    forged = replace(req.body, blinded=(*req.body.blinded[:2], extra))
    [result] = chain.block([chain.tx(forged, chain.validators[0].key)])
    assert result.code == Code.MINT_INVALID
    mint_and_fund(chain, req)
    answers = gather(chain, stores, req.mint_id)
    credits = req.finalize(period_key(chain), answers)
    # (c) a fourth credit from the partials: combining partials of different points, or of
    # fewer than t validators, gives nothing that verifies under X_0
    key = period_key(chain)
    fourth = blind_bls.blind(0, b"\x04" * 32)
    mixed = {
        answers[0]["index"]: bytes.fromhex(answers[0]["partials"][0]),
        answers[1]["index"]: bytes.fromhex(answers[1]["partials"][1]),
        answers[2]["index"]: bytes.fromhex(answers[2]["partials"][2]),
    }
    with pytest.raises(blind_bls.CreditSignatureError):
        blind_bls.unblind(fourth, blind_bls.combine(mixed, key.threshold), key.key)
    # (d) a validator signs only the points of the paid mint's list: another id is NOT_FOUND
    with pytest.raises(QueryError) as unknown:
        partials(chain.state, stores[0], {"mint": "0x" + "ab" * 32})
    assert unknown.value.code == Code.NOT_FOUND
    fake = ThresholdCredit(0, fourth.nonce, credits[0].signature)
    assert redeem(chain, node, [*credits, fake]).code == Code.CREDIT_INVALID
    assert redeem(chain, node, credits).code == Code.OK  # the 3 paid for, and no more


def test_a_bad_partial_is_left_out_and_too_few_is_named(tmp_path: Path) -> None:
    chain, stores, _ = keyed_chain(tmp_path)
    req = request(chain, 2)
    mint_and_fund(chain, req)
    answers = gather(chain, stores, req.mint_id)
    answers[0] = {**answers[0], "partials": list(reversed(answers[0]["partials"]))}
    assert len(req.finalize(period_key(chain), answers)) == 2  # 3 honest of 4 remain
    answers[1] = {**answers[1], "partials": list(reversed(answers[1]["partials"]))}
    with pytest.raises(MintIncomplete):
        req.finalize(period_key(chain), answers)


def test_a_mint_whose_answers_check_costs_one_pairing_check_for_all_its_credits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quick way: the t lowest validators' partials combined and the credits checked as
    one batch, not each partial of each validator (~1 ms a pairing check); a bad answer of a
    validator above the t lowest is never looked at, and the credits are the same."""
    chain, stores, node = keyed_chain(tmp_path)
    req = request(chain, 4)
    mint_and_fund(chain, req)
    answers = gather(chain, stores, req.mint_id)
    expected = req.finalize(period_key(chain), answers)
    checks = []
    real = bls.pairing_equal
    monkeypatch.setattr(bls, "pairing_equal", lambda *a: checks.append(1) or real(*a))
    highest = max(range(len(answers)), key=lambda i: answers[i]["index"])
    answers[highest] = {**answers[highest], "partials": answers[highest]["partials"][::-1]}
    assert req.finalize(period_key(chain), answers) == expected
    assert len(checks) == 1
    # a bad answer among the t lowest: the checked way finds it and leaves it out
    checks.clear()
    lowest = min(range(len(answers)), key=lambda i: answers[i]["index"])
    answers[lowest] = {**answers[lowest], "partials": answers[lowest]["partials"][::-1]}
    with pytest.raises(MintIncomplete):
        req.finalize(period_key(chain), answers)  # 2 honest of 4 left
    assert len(checks) > 1
    answers[highest] = gather(chain, stores, req.mint_id)[highest]
    assert req.finalize(period_key(chain), answers) == expected
    assert redeem(chain, node, expected).code == Code.OK


def test_refusals_by_name(tmp_path: Path) -> None:
    chain, stores, _ = keyed_chain(tmp_path)
    req = request(chain, 2)
    [r] = chain.block([chain.tx(req.body, chain.validators[0].key)])
    assert r.code == Code.OK
    with pytest.raises(QueryError) as unfunded:
        partials(chain.state, stores[0], {"mint": req.mint_id})
    assert unfunded.value.code == Code.MINT_UNFUNDED
    wrong = replace(req.body, period=1)
    [r] = chain.block([chain.tx(wrong, chain.validators[0].key)])
    assert r.code == Code.CREDIT_EPOCH
    [r] = chain.block([chain.tx(req.body, chain.validators[0].key)])
    assert r.code == Code.MINT_REPLAYED
    round_trip = MintRequest.from_json(req.to_json())
    assert round_trip.mint_id == req.mint_id


def test_before_the_first_key_a_mint_is_no_credit_keys(tmp_path: Path) -> None:
    chain = settled_chain(
        bindings={},  # no gateway tx in block 1: the DKG phases' heights as planned
        credits={
            "price_wei": str(PRICE),
            "layer_tokens": 16,
            "key_period_blocks": PERIOD_BLOCKS,
            "dkg_phase_blocks": PHASE,
        },
    )
    chain.time_s = NOW
    point = blind_bls.blind(0, b"\x01" * 32).blinded
    body = CreditMint(address_of(PAYER).lower(), 0, (point,), PRICE, NOW + 60, "0x" + "00" * 65)
    [r] = chain.block([chain.tx(body, chain.validators[0].key)])
    assert r.code == Code.NO_CREDIT_KEYS


def test_a_threshold_credit_locked_by_one_node_is_refused_to_another(tmp_path: Path) -> None:
    """Attack 4 on the threshold form: a credit shown to two nodes is locked by the first (under
    the chain's current epoch: the credit carries only its key period) and the second node's
    `credit_redeem` of it is refused CREDIT_LOCKED by name; the locker redeems it."""
    from abci_app import rules
    from protocol.committee.credit_locks import CreditLock
    from protocol.paid_credits import spent_id

    chain, stores, node = keyed_chain(tmp_path)
    other = register(chain, "threshold-other", shards=(0,))
    make_routable(chain, other)
    req = request(chain, 2)
    mint_and_fund(chain, req)
    credits = req.finalize(period_key(chain), gather(chain, stores, req.mint_id))
    epoch = rules.epoch_of(chain.state, chain.state.block_height + 1)
    locks = tuple(sorted((spent_id(c), epoch) for c in credits))
    [locked] = chain.block([chain.tx(CreditLock("m", 0, locks), node)])
    assert locked.code == Code.OK, locked.log
    stolen = redeem(chain, other, credits)
    assert stolen.code == Code.CREDIT_LOCKED and "locked by node" in stolen.log
    assert redeem(chain, node, credits).code == Code.OK


def _run_rows(chain: Chain, period: int) -> list[str]:
    """What the chain keeps of `period`'s DKG: its record and its messages' keys."""
    prefix = f"{schema.epoch_key(period)}/"
    rows = [
        key for key, _ in chain.state.items(schema.CREDIT_DKG_MESSAGE, prefix, prefix[:-1] + "0")
    ]
    if chain.state.get(schema.CREDIT_DKG, schema.epoch_key(period)) is not None:
        rows.append("record")
    return rows


def test_old_periods_dkg_state_goes_and_the_redeemable_periods_keys_stay(tmp_path: Path) -> None:
    """A period's DKG (~3 KB per validator) is pruned once its credits' window is over (issue
    epoch + lifetime, then retention), not kept forever; the previous period's key, whose
    credits are still redeemable, and the current one's stay and verify credits."""
    chain = settled_chain(
        bindings={},
        epoch_length=10,
        retention_epochs=1,
        credits={
            "price_wei": str(PRICE),
            "layer_tokens": 16,
            "key_period_blocks": PERIOD_BLOCKS,
            "dkg_phase_blocks": PHASE,
            "lifetime_epochs": 1,
        },
    )
    chain.time_s = NOW
    stores = [CreditShareStore(tmp_path / f"v{i}") for i in range(len(chain.validators))]
    for period in (0, 1, 2):
        play(chain, stores, period, SCHEDULE.dkg_finish_height(period) + 1)
    assert _run_rows(chain, 0) == []  # period 0: issue epoch 3 + 1, settled, + 1 retained
    assert "record" in _run_rows(chain, 1) and len(_run_rows(chain, 1)) > 4  # epoch ≤ 7: kept
    node = register(chain, "pruned-dkg-node", shards=(0,))
    make_routable(chain, node)
    previous = request(chain, 2)
    mint_and_fund(chain, previous)
    previous_credits = previous.finalize(period_key(chain), gather(chain, stores, previous.mint_id))
    play(chain, stores, 3, SCHEDULE.dkg_finish_height(3) + 1)
    assert chain.state.height > 80 and SCHEDULE.period_of(chain.state.height) == 3
    assert _run_rows(chain, 0) == [] and _run_rows(chain, 1) == []
    assert ask(chain, "/credit_period?period=1")["run"] is None
    assert "record" in _run_rows(chain, 2) and "record" in _run_rows(chain, 3)
    make_routable(chain, node)
    current = request(chain, 1)
    mint_and_fund(chain, current)
    current_credits = current.finalize(period_key(chain), gather(chain, stores, current.mint_id))
    assert {c.period for c in previous_credits} == {2} and current_credits[0].period == 3
    assert redeem(chain, node, [*previous_credits, *current_credits]).code == Code.OK
