"""Bearer credits on the committee (abci_app/credits.py): the key period's committee key (a real
DKG on the chain), a mint paid from a prepaid balance, each validator's partial signatures, the
client's finalize, redemptions that become the node's work for the payout, every refusal by
name — and the retired RSA form's txs refused as unknown kinds."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from abci_app.codes import Code
from abci_app.genesis import DEFAULT_CREDIT_LIFETIME_EPOCHS, Genesis
from abci_app.queries import query
from abci_app.query_params import QueryError
from abci_app.threshold_queries import partials
from node.client.credit_wallet import CreditWallet
from node.client.mint_request import MintIncomplete, MintRequest
from protocol import blind_bls, bls
from protocol.blind_bls import ThresholdCredit
from protocol.canonical import canonical_json
from protocol.committee.credits import CreditMint, CreditRedeem, FundMint
from protocol.committee.envelope import SIGN_DOMAIN, decode, sign
from protocol.committee.grammar import TxDecodeError
from protocol.credit_shares import CreditShareStore
from protocol.credits import lifetime_from_query
from protocol.eip712 import address_of
from protocol.errors import ConfigError, ProtocolError
from protocol.paid_credits import spent_id
from tests.committee_chain import EVM_CHAIN_ID, Chain, seeded_evm_key, seeded_key
from tests.credit_chain import (
    LAYER_TOKENS,
    NOW,
    PAYER,
    PRICE,
    close_last_blocks_epoch,
    credit_chain,
    epoch_now,
    fund,
    gather,
    minted,
    node_chain,
    period_key,
    redeem,
    request,
    send,
)
from tests.unit.test_abci_settlement import ESCROW, ask, net, next_epoch_end, settled_chain
from tests.unit.test_abci_state import hexkey, served_commit_tx

pytestmark = pytest.mark.unit


# --- the whole path ---------------------------------------------------------------------------


def test_credits_mint_finalize_redeem_becomes_work_and_the_payer_is_debited(tmp_path: Path) -> None:
    chain, node = node_chain(tmp_path)
    credits, req = minted(chain, tmp_path, count=3)
    assert len(credits) == 3 and len({c.nonce for c in credits}) == 3
    record = ask(chain, f"/mints?id={req.mint_id}")
    assert record["count"] == 3 and record["amount"] == str(3 * PRICE)
    result = redeem(chain, node, credits)
    assert result.code == Code.OK, result.log
    account = address_of(seeded_evm_key("credit-node")).lower()
    epoch = close_last_blocks_epoch(chain)
    payout = ask(chain, f"/payouts?epoch={epoch}")
    # the purchase goes into the escrow's credit pool, the pool pays the redeeming node its
    # credits' price less the verifiers' cut (no verifier: their part stays due)
    assert _pairs(payout) == {
        (address_of(PAYER).lower(), ESCROW): str(3 * PRICE),
        (ESCROW, ESCROW): str(net(3)),
    }
    assert payout["statement"]["total"] == str(net(3))
    rows = dict(payout["rows"])
    assert rows[account] == str(net(3))


def _pairs(payout: dict) -> dict[tuple[str, str], str]:
    """A statement's debits by (payer, gateway)."""
    return {
        (p, g): d
        for p, g, d in zip(payout["payers"], payout["gateways"], payout["debits"], strict=True)
    }


def _statements(chain: Chain) -> list[dict]:
    listing = ask(chain, "/payouts?limit=200")["epochs"]
    return [ask(chain, f"/payouts?epoch={s['epoch']}") for s in listing]


def test_credits_redemptions_become_layer_tokens_of_the_node(tmp_path: Path) -> None:
    chain, node = node_chain(tmp_path)
    credits, _ = minted(chain, tmp_path, count=2)
    if (chain.state.height + 1) % chain.state.genesis.epoch_length == 0:
        chain.block()  # not the epoch's last block: its close would move the record
    results = chain.block(
        [served_commit_tx(chain, node, 1, blocks=1)]
        + [chain.tx(CreditRedeem("m", 1, (credit,)), node) for credit in credits]
    )  # two redemptions in one block: one epoch's record
    assert [r.code for r in results] == [Code.OK, Code.OK, Code.OK]
    account = address_of(seeded_evm_key("credit-node")).lower()
    credited = ask(chain, f"/credits?account={account}")
    assert credited["credits"] == [{"layer_tokens": 2 * LAYER_TOKENS, "model": "m", "shard": 1}]


# --- redemption refusals ----------------------------------------------------------------------


def test_credits_twice_spent_is_credit_spent(tmp_path: Path) -> None:
    chain, node = node_chain(tmp_path)
    credits, _ = minted(chain, tmp_path, count=2)
    assert redeem(chain, node, credits[:1]).code == Code.OK
    again = redeem(chain, node, credits[:1])
    assert again.code == Code.CREDIT_SPENT, again.log
    twice_in_one = redeem(chain, node, [credits[1], credits[1]])
    assert twice_in_one.code == Code.CREDIT_SPENT
    # the refused tx wrote nothing: the second credit is still good
    assert redeem(chain, node, credits[1:]).code == Code.OK


def test_credits_forged_signature_is_credit_invalid(tmp_path: Path) -> None:
    chain, node = node_chain(tmp_path)
    credits, _ = minted(chain, tmp_path, count=2)
    # another credit's σ on this nonce: a valid point, not this credit's signature
    swapped = replace(credits[0], signature=credits[1].signature)
    result = redeem(chain, node, [swapped])
    assert result.code == Code.CREDIT_INVALID, result.log
    # a credit the node made up with a key of its own is no better
    own = 0x1234567
    made_up = bls.g1_bytes(bls.g1_mul(blind_bls.credit_point(0, credits[0].nonce), own))
    fake = replace(credits[0], signature=made_up)
    assert redeem(chain, node, [fake]).code == Code.CREDIT_INVALID
    assert redeem(chain, node, credits).code == Code.OK


def test_credits_altered_message_is_credit_invalid(tmp_path: Path) -> None:
    chain, node = node_chain(tmp_path)
    credits, _ = minted(chain, tmp_path, count=1)
    credit = credits[0]
    altered = replace(credit, nonce=credit.nonce[:-1] + bytes([credit.nonce[-1] ^ 1]))
    result = redeem(chain, node, [altered])
    assert result.code == Code.CREDIT_INVALID, result.log
    # the unaltered credit is still unspent and good
    assert redeem(chain, node, credits).code == Code.OK


def test_credits_under_the_threshold_of_partials_is_no_credit(tmp_path: Path) -> None:
    """A credit needs t = 3 of the 4 validators' partials: 2 give nothing (`MintIncomplete`),
    and 2 combined as if they were enough give no σ that verifies under the period's key."""
    chain, node = node_chain(tmp_path)
    req = request(chain, 1)
    assert send(chain, req.body).code == Code.OK
    fund(chain, req.mint_id)
    key = period_key(chain)
    answers = gather(chain, tmp_path, req.mint_id)
    with pytest.raises(MintIncomplete):
        req.finalize(key, answers[:2])
    two = {a["index"]: bytes.fromhex(a["partials"][0]) for a in answers[:2]}
    with pytest.raises(blind_bls.ThresholdCreditError):
        blind_bls.unblind(req.blindings[0], blind_bls.combine(two, 2), key.key)
    credits = req.finalize(key, answers[1:])  # any 3 of 4
    assert redeem(chain, node, credits).code == Code.OK


def test_credits_of_another_period_or_past_their_window_are_refused(tmp_path: Path) -> None:
    """Period 0 (blocks 1 … 30, 5 blocks an epoch) issues in epoch 6: its credits redeem until
    epoch 6 + lifetime (1), not in epoch 8; one relabelled as period 1's is not redeemable in
    period 0's time (CREDIT_EPOCH), nor valid later (period 1 has no key: CREDIT_INVALID)."""
    chain, node = node_chain(tmp_path, lifetime_epochs=1)
    credits, req = minted(chain, tmp_path, count=3)
    relabelled = replace(credits[0], period=1)
    early = redeem(chain, node, [relabelled])
    assert early.code == Code.CREDIT_EPOCH, early.log
    issue = ask(chain, f"/mints?id={req.mint_id}")["issue_epoch"]
    assert issue == 6
    chain.advance_to(issue * 5 + 1)  # epoch 7: issue + lifetime
    assert redeem(chain, node, [relabelled]).code == Code.CREDIT_INVALID  # no key of period 1
    assert redeem(chain, node, credits[:1]).code == Code.OK  # still redeemable in 6 + 1
    next_epoch_end(chain)
    late = redeem(chain, node, credits[1:2])
    assert late.code == Code.CREDIT_EPOCH, late.log


def test_credits_stay_redeemable_for_their_lifetime_and_spent_ones_stay_spent(
    tmp_path: Path,
) -> None:
    """A credit of issue epoch e is good until e + lifetime_epochs (genesis), however long ago
    it was bought; its spent entry is kept that long too, even past `retention_epochs`: a credit
    redeemed early is refused again in e + lifetime, then for its age."""
    chain, node = node_chain(tmp_path, lifetime_epochs=5, retention_epochs=1)
    credits, req = minted(chain, tmp_path, count=3)
    issue = ask(chain, f"/mints?id={req.mint_id}")["issue_epoch"]
    assert redeem(chain, node, credits[:1]).code == Code.OK
    while epoch_now(chain) < issue + 5:  # settled, pruned with retention 1 all along
        next_epoch_end(chain)
    assert epoch_now(chain) == issue + 5
    replay = redeem(chain, node, credits[:1])
    assert replay.code == Code.CREDIT_SPENT, replay.log
    assert redeem(chain, node, credits[1:2]).code == Code.OK  # bought long ago, still good
    next_epoch_end(chain)
    late = redeem(chain, node, credits[2:])
    assert late.code == Code.CREDIT_EPOCH, late.log
    # the spent entries go once no credit of their epoch can come back
    for _ in range(3):
        next_epoch_end(chain)
    assert ask(chain, f"/credit_spent?id={spent_id(credits[0])}")["height"] is None


def test_credits_genesis_lifetime_is_checked_and_published() -> None:
    chain = settled_chain(bindings={})
    answer = ask(chain, "/credit_keys")
    assert answer["lifetime_epochs"] == DEFAULT_CREDIT_LIFETIME_EPOCHS == 4_320
    assert "keys" not in answer and "total_power" not in answer  # no per-validator keys
    assert lifetime_from_query(answer) == 4_320
    assert lifetime_from_query({"epoch": 1}) == 1  # a validator from before the parameter
    for bad in (0, -1, 10**6 + 1, "7", True, None):
        with pytest.raises(ProtocolError):
            lifetime_from_query({"lifetime_epochs": bad})
    for bad in (0, 10**6 + 1, "x"):
        doc = {"credits": {"price_wei": "1", "layer_tokens": 1, "lifetime_epochs": bad}}
        with pytest.raises(ConfigError, match="lifetime_epochs"):
            Genesis.parse(json.dumps(doc).encode())
    unknown = {"credits": {"price_wei": "1", "layer_tokens": 1, "x": 1}}
    with pytest.raises(ConfigError, match="credits"):
        Genesis.parse(json.dumps(unknown).encode())
    doc = {"credits": {"price_wei": "1", "layer_tokens": 1, "lifetime_epochs": 9}}
    custom = Genesis.parse(json.dumps(doc).encode())
    assert custom.credit_lifetime_epochs == 9
    assert Genesis.from_json(custom.to_json()) == custom


def test_credits_redeem_on_an_unregistered_shard_or_by_a_stranger(tmp_path: Path) -> None:
    chain, node = node_chain(tmp_path)
    credits, _ = minted(chain, tmp_path, count=1)
    assert redeem(chain, node, credits, shard=7).code == Code.REDEEM_SHARD
    assert redeem(chain, seeded_key("stranger"), credits).code == Code.UNKNOWN_NODE
    assert redeem(chain, node, credits).code == Code.OK


def test_credits_redeem_needs_a_committed_position_per_credit(tmp_path: Path) -> None:
    """No commitment, no pay — for credits too: a node that never commits what it served cannot
    redeem what it was paid (a silent node earns 0 and is never spot-checked); one committed
    record (32 positions) covers at most 32 credits, consumed, and the refusal writes nothing."""
    chain, node = node_chain(tmp_path)
    credits, _ = minted(chain, tmp_path, count=3)
    silent = send(chain, CreditRedeem("m", 0, tuple(credits)), node)
    assert silent.code == Code.UNCOMMITTED_REDEMPTION, silent.log
    assert chain.state.items("cspent") == [] and chain.state.items("credit") == []
    assert redeem(chain, node, credits[:2]).code == Code.OK  # commits one record: 32 positions
    assert send(chain, CreditRedeem("m", 0, tuple(credits[2:])), node).code == Code.OK
    record = chain.state.get("cover", f"{hexkey(node)}/00000")
    assert sum(row[2] for row in record["recent"]) == 3  # a position consumed per credit
    assert len(chain.state.items("cspent")) == 3


# --- mint refusals ----------------------------------------------------------------------------


def test_credits_mint_rules(tmp_path: Path) -> None:
    chain = credit_chain(tmp_path, epoch_length=20)
    req = request(chain, 2)
    body: CreditMint = req.body
    assert send(chain, replace(body, amount=PRICE)).code == Code.MINT_INVALID
    other = MintRequest.create(
        period_key(chain), 2, seeded_evm_key("thief"), PRICE, EVM_CHAIN_ID, ESCROW, NOW + 60
    )
    stolen = replace(other.body, payer=body.payer)
    assert send(chain, stolen).code == Code.MINT_INVALID
    wrong_period = replace(body, period=body.period + 1)
    assert send(chain, wrong_period).code == Code.CREDIT_EPOCH
    identity = replace(body, blinded=(bls.g1_bytes(bls.g1_identity()), body.blinded[1]))
    assert send(chain, identity).code == Code.MINT_INVALID
    assert send(chain, body).code == Code.OK
    assert send(chain, body).code == Code.MINT_REPLAYED
    fund(chain, req.mint_id)
    answers = gather(chain, tmp_path, req.mint_id)
    assert {a["validator"] for a in answers} == {v["address"] for v in chain.state.validators}
    assert len(req.finalize(period_key(chain), answers)) == 2


def test_credits_mint_without_genesis_credits_is_disabled() -> None:
    chain = settled_chain(credits=None)
    chain.time_s = NOW
    point = blind_bls.blind(0, b"\x01" * 32).blinded
    body = CreditMint(address_of(PAYER).lower(), 0, (point,), PRICE, NOW + 60, "0x" + "00" * 65)
    assert send(chain, body).code == Code.CREDITS_DISABLED


def test_credits_finalize_leaves_a_bad_answer_out(tmp_path: Path) -> None:
    chain = credit_chain(tmp_path)
    req = request(chain, 1)
    assert send(chain, req.body).code == Code.OK
    fund(chain, req.mint_id)
    answers = gather(chain, tmp_path, req.mint_id)
    bad = {**answers[0], "partials": [bls.g1_bytes(bls.g1_generator()).hex()]}
    assert len(req.finalize(period_key(chain), [bad, *answers[1:]])) == 1  # 3 good of 4
    with pytest.raises(MintIncomplete):
        req.finalize(period_key(chain), [bad, *answers[2:]])


# --- funding: no signature before ≥ 2/3 of the power vouched for the payer's balance -----------


def _one_mint(chain: Chain, count: int = 2) -> MintRequest:
    """A mint sent at the start of an epoch (its funding blocks before the epoch's close)."""
    length = chain.state.genesis.epoch_length
    if chain.state.height % length > length - 4:
        next_epoch_end(chain)
    req = request(chain, count)
    assert send(chain, req.body).code == Code.OK
    return req


def _pending_debits(chain: Chain) -> list[str]:
    return [k for k, _ in chain.state.committed_items("cpend")]


def test_credits_an_unfunded_mint_gets_no_signature_and_no_charge(tmp_path: Path) -> None:
    """A payer with no balance sends a valid mint: no watcher vouches for it, so no validator
    signs its points (MINT_UNFUNDED by name) and nothing is charged to anyone's statement."""
    chain = credit_chain(tmp_path)
    req = _one_mint(chain)
    for index in range(len(chain.validators)):
        store = CreditShareStore(tmp_path / "shares" / f"v{index}")
        with pytest.raises(QueryError) as refused:
            partials(chain.state, store, {"mint": req.mint_id})
        assert refused.value.code == Code.MINT_UNFUNDED
    assert _pending_debits(chain) == []
    record = ask(chain, f"/mints?id={req.mint_id}")
    assert record["funded_height"] is None and record["vouched"] == []
    assert [m["id"] for m in ask(chain, "/mints?pending=true")["mints"]] == [req.mint_id]


def test_credits_a_mint_is_funded_at_two_thirds_of_the_power_and_charged_once(
    tmp_path: Path,
) -> None:
    chain = credit_chain(tmp_path)
    req = _one_mint(chain)
    fund(chain, req.mint_id, vouchers=2)  # 2 of 4 equal validators: half the power
    assert ask(chain, f"/mints?id={req.mint_id}")["funded_height"] is None
    assert _pending_debits(chain) == []
    [third] = chain.block([chain.tx(FundMint(req.mint_id), chain.validators[2].key)])
    assert third.code == Code.OK
    record = ask(chain, f"/mints?id={req.mint_id}")
    assert record["funded_height"] == chain.state.height and len(record["vouched"]) == 3
    assert len(_pending_debits(chain)) == 1  # the charge, once
    assert ask(chain, "/mints?pending=true")["mints"] == []
    fund(chain, req.mint_id)  # late and repeated votes change nothing
    assert ask(chain, f"/mints?id={req.mint_id}")["funded_height"] == record["funded_height"]
    close_last_blocks_epoch(chain)
    assert _pending_debits(chain) == []  # debited by the close, once, into the credit pool
    payer = address_of(PAYER).lower()
    debits = [_pairs(p).get((payer, ESCROW)) for p in _statements(chain)]
    assert [d for d in debits if d] == [str(2 * PRICE)]
    assert len(req.finalize(period_key(chain, 0), gather(chain, tmp_path, req.mint_id))) == 2
    mine = ask(chain, f"/mints?payer={payer}")["mints"]
    assert [m["id"] for m in mine] == [req.mint_id]


def test_credits_a_funded_mint_can_be_finished_until_its_credits_expire(tmp_path: Path) -> None:
    """A client that comes back after `retention_epochs` still gathers the partials of a mint
    it paid for (it was `MintLost` before); once the credits' window is over the record goes."""
    chain = credit_chain(tmp_path, lifetime_epochs=4, retention_epochs=1)
    req = _one_mint(chain)
    fund(chain, req.mint_id)
    issue = ask(chain, f"/mints?id={req.mint_id}")["issue_epoch"]
    while epoch_now(chain) < issue + 2:  # an unfunded mint would be pruned by now
        next_epoch_end(chain)
    chain.block()
    answers = gather(chain, tmp_path, req.mint_id)
    assert len(req.finalize(period_key(chain, 0), answers)) == 2
    while epoch_now(chain) <= issue + 4 + 2:  # past issue epoch + lifetime + retention
        next_epoch_end(chain)
    chain.block()
    code, _, _ = query(chain.state, f"/mints?id={req.mint_id}", b"")
    assert code == Code.NOT_FOUND


def test_credits_fund_mint_refusals_are_named(tmp_path: Path) -> None:
    chain = credit_chain(tmp_path, epoch_length=20)
    req = _one_mint(chain)
    stranger = send(chain, FundMint(req.mint_id), seeded_key("not-a-validator"))
    assert stranger.code == Code.NOT_VALIDATOR
    unknown = send(chain, FundMint("0x" + "00" * 32), chain.validators[0].key)
    assert unknown.code == Code.MINT_UNKNOWN
    epoch = ask(chain, f"/mints?id={req.mint_id}")["epoch"]
    chain.advance_to((epoch + 1) * 20)  # its epoch and the next are over
    late = send(chain, FundMint(req.mint_id), chain.validators[0].key)
    assert late.code == Code.MINT_FUND_LATE, late.log
    with pytest.raises(TxDecodeError):
        FundMint.from_json({"mint": "0x" + "zz" * 32})


def test_credits_a_mint_whose_purchase_expired_is_not_funded(tmp_path: Path) -> None:
    chain = credit_chain(tmp_path)
    req = _one_mint(chain)
    chain.time_s = NOW + 3601  # past the purchase's expiry (`request` signs NOW + 3600)
    late = send(chain, FundMint(req.mint_id), chain.validators[0].key)
    assert late.code == Code.MINT_FUND_LATE and "expired" in late.log


# --- the retired RSA form -----------------------------------------------------------------------


def _retired_tx(kind: str, body: dict, key: SigningKey, nonce: int = 1) -> bytes:
    """A tx of a kind the chain no longer has, signed as any tx is (the envelope's bytes)."""
    unsigned = {"body": body, "nonce": nonce, "signer": hexkey(key), "type": kind}
    sig = key.sign(SIGN_DOMAIN + canonical_json(unsigned)).signature.hex()
    return canonical_json({**unsigned, "sig": sig})


def test_credits_the_rsa_mint_and_redeem_are_unknown_kinds_and_give_no_credit(
    tmp_path: Path,
) -> None:
    """Issue 42 attack 1 through the retired RSA form: a `mint` listing a different set of
    blinded messages to each validator (a credit needed only 2/3 of the signers, so a mint of 3
    gave 4). The kind is gone: the envelope refuses `mint`, `redeem` and `credit_key` by name as
    unknown tx kinds (CheckTx; PrepareProposal leaves them out), nothing is written, no mint is
    listed for funding, and the payer is never charged. (Before, `mint` decoded and the chain
    took it.)"""
    chain, node = node_chain(tmp_path)
    payer = address_of(PAYER).lower()
    addresses = sorted(v["address"] for v in chain.state.validators)
    rows = []  # validator v gets messages {v, v + 1, v + 2} of four: four credits from three
    for index, address in enumerate(addresses):
        messages = [bytes([1 + (index + k) % 4]) * 256 for k in range(3)]
        rows.append([address, [m.hex() for m in messages]])
    mint_body = {
        "amount": str(3 * PRICE),
        "blinded": rows,
        "epoch": epoch_now(chain),
        "expiry": NOW + 3600,
        "payer": payer,
        "signature": "0x" + "11" * 65,
    }
    redeem_body = {
        "credits": [[1, "00" * 81, [[addresses[0], "01" * 256]]]],
        "model": "m",
        "shard": 0,
    }
    sender = seeded_key("rsa-mint-sender")
    for kind, body, key in (
        ("mint", mint_body, sender),
        ("redeem", redeem_body, node),
        ("credit_key", {"epoch": 1, "key": "30" * 40}, chain.validators[0].key),
    ):
        raw = _retired_tx(kind, body, key)
        with pytest.raises(TxDecodeError, match=f"unknown tx type '{kind}'"):
            decode(raw)
        checked = chain.machine.check_tx(raw)  # the mempool's door
        assert checked.code == Code.MALFORMED_TX, (kind, checked.log)
        assert f"unknown tx type '{kind}'" in checked.log
        assert chain.block([raw]) == []  # never proposed: no block carries it
    assert chain.state.items("mint") == [] and chain.state.items("mpend") == []
    assert ask(chain, "/mints?pending=true")["mints"] == []
    assert ask(chain, f"/mints?payer={payer}")["mints"] == []
    assert _pending_debits(chain) == [] and chain.state.items("cspent") == []
    for path in ("/credit_signatures?mint=0x" + "00" * 32, "/credit_keys?epoch=1"):
        code, value, _ = query(chain.state, path, b"")
        assert code == Code.UNKNOWN_QUERY or b'"keys"' not in value


# --- what is public -----------------------------------------------------------------------------


def test_credits_nothing_in_the_mint_is_in_the_redemption(tmp_path: Path) -> None:
    """The mint tx and record carry blinded points only: no 16-byte window of a redeemed credit
    (nonce, σ) appears in the mint record or the validators' partial signatures."""
    chain, _node = node_chain(tmp_path)
    credits, req = minted(chain, tmp_path, count=2)
    public = json.dumps(ask(chain, f"/mints?id={req.mint_id}")).encode()
    public += json.dumps(gather(chain, tmp_path, req.mint_id)).encode()
    for credit in credits:
        for value in (credit.nonce, credit.signature):
            for start in range(0, len(value) - 16, 16):
                assert value[start : start + 16].hex().encode() not in public


# --- wire -------------------------------------------------------------------------------------


def test_credits_txs_round_trip_and_malformed_bodies_are_named(tmp_path: Path) -> None:
    chain = credit_chain(tmp_path)
    req = request(chain, 2)
    key = seeded_key("x")
    raw = sign(req.body, key, 1).encode()
    assert decode(raw).body == req.body
    body = json.loads(raw)["body"]
    for broken in (
        {**body, "blinded": []},
        {**body, "blinded": [body["blinded"][0], body["blinded"][0]]},
        {**body, "blinded": [body["blinded"][0][:-2]]},
        {**body, "blinded": [[a, [a]] for a in body["blinded"]]},  # the RSA per-validator shape
        {**body, "amount": "01"},
        {**body, "extra": 1},
    ):
        with pytest.raises(TxDecodeError):
            CreditMint.from_json(broken)
    credit = ThresholdCredit(0, b"\x07" * 32, bls.g1_bytes(bls.g1_generator()))
    redeem_body = CreditRedeem("m", 0, (credit,))
    assert decode(sign(redeem_body, key, 2).encode()).body == redeem_body
    doc = redeem_body.to_json()
    for broken in (
        {**doc, "credits": [doc["credits"][0][:-2]]},
        {**doc, "credits": [doc["credits"][0].upper()]},
        {**doc, "credits": [[1, "00" * 81, [["A" * 40, "01" * 256]]]]},  # an RSA credit
        {**doc, "credits": ["00" * 88]},  # σ not a point
    ):
        with pytest.raises(TxDecodeError):
            CreditRedeem.from_json(broken)


def test_credits_wallet_keeps_and_spends(tmp_path: Path) -> None:
    chain, _ = node_chain(tmp_path)
    credits, _ = minted(chain, tmp_path, count=3)
    wallet = CreditWallet(tmp_path / "wallet.json")
    wallet.add(credits)
    assert wallet.count() == 3
    assert wallet.take(2) == credits[:2]
    assert CreditWallet(tmp_path / "wallet.json").take(1) == credits[2:]
    assert wallet.count() == 0
    assert (tmp_path / "wallet.json").stat().st_mode & 0o777 == 0o600


def test_credits_partials_query_is_the_apps_own(tmp_path: Path) -> None:
    chain = settled_chain(bindings={})
    code, _, _log = query(chain.state, "/mints?id=0x" + "00" * 32, b"")
    assert code == Code.NOT_FOUND
    for path in ("/credit_partials", "/credit_signatures"):
        code, _, _ = query(chain.state, f"{path}?mint=0x" + "00" * 32, b"")
        assert code == Code.UNKNOWN_QUERY  # served only by an app that holds a share (app.py)
    with pytest.raises(QueryError) as unknown:
        partials(chain.state, CreditShareStore(tmp_path / "none"), {"mint": "0x" + "00" * 32})
    assert unknown.value.code == Code.NOT_FOUND


def test_credits_no_state_entry_or_tx_links_the_payer_to_the_node(tmp_path: Path) -> None:
    """Read every committed state entry and both txs: nothing holds the payer (address, mint id,
    any piece of a blinded point) next to the node (key, EVM address). The one exception is the
    epoch's payout record, which lists every payer debited and every account paid in the epoch:
    the epoch is the anonymity set (docs/privacy.md)."""
    chain, node = node_chain(tmp_path, epoch_length=50)
    req = request(chain, 2)
    mint_raw = chain.tx(req.body, seeded_key("mint-sender"))
    assert chain.block([mint_raw])[0].code == Code.OK
    fund(chain, req.mint_id)
    credits = req.finalize(period_key(chain), gather(chain, tmp_path, req.mint_id))
    commit_raw = served_commit_tx(chain, node, 0, blocks=1)
    redeem_raw = chain.tx(CreditRedeem("m", 0, tuple(credits)), node)
    results = chain.block([commit_raw, redeem_raw])
    assert [r.code for r in results] == [Code.OK, Code.OK]
    payer = address_of(PAYER)
    payer_side = {payer.lower(), payer[2:].lower(), req.mint_id, req.mint_id[2:]}
    for point in req.body.blinded:
        payer_side |= {point[i : i + 16].hex() for i in range(0, len(point) - 16, 16)}
    node_evm = address_of(seeded_evm_key("credit-node"))
    node_side = {node.verify_key.encode().hex(), node_evm.lower(), node_evm[2:].lower()}
    chain.advance_to(50)  # the epoch closes: its payout record is written
    rows = chain.state.store._db.execute("SELECT ns, key, value FROM kv").fetchall()
    assert any(ns == "payout" for ns, _, _ in rows)
    seen: dict[str, set[str]] = {"payer": set(), "node": set()}
    for ns, key, value in rows:
        text = f"{ns}/{key}={value}".lower()
        has_payer = any(p in text for p in payer_side)
        has_node = any(n in text for n in node_side)
        assert not (has_payer and has_node) or ns == "payout", (ns, key)
        for side, present in (("payer", has_payer), ("node", has_node)):
            if present:
                seen[side].add(ns)
    assert {"mint", "spent"} <= seen["payer"] and {"node", "evm"} <= seen["node"], seen
    redeem_text = redeem_raw.decode().lower()
    assert not any(p in redeem_text for p in payer_side)
    mint_text = mint_raw.decode().lower()
    assert not any(n in mint_text for n in node_side)


def test_credits_mints_query_refuses_hostile_parameters_by_name(tmp_path: Path) -> None:
    """`/mints` from a stranger: wrong types, non-ASCII digits, oversized and nested values are
    BAD_QUERY (or NOT_FOUND for a well-formed unknown id); the app answers normally after."""
    chain = credit_chain(tmp_path)
    req = _one_mint(chain)
    payer = address_of(PAYER).lower()
    hostile = [
        ("/mints", b""),
        ("/mints?pending=yes", b""),
        ("/mints?pending=1", b""),
        ("/mints?payer=0x" + "٣" * 40, b""),
        ("/mints?payer=" + payer + "00", b""),
        ("/mints?payer=" + "a" * 5000, b""),
        ("/mints?id=0x" + "zz" * 32, b""),
        ("/mints", json.dumps({"payer": [[[[payer]]]]}).encode()),
        ("/mints", json.dumps({"pending": {"a": 1}}).encode()),
        ("/mints", json.dumps({"id": 7}).encode()),
    ]
    for path, data in hostile:
        code, _, log = query(chain.state, path, data)
        assert code == Code.BAD_QUERY, (path, data, code, log)
    code, _, _ = query(chain.state, "/mints?id=0x" + "00" * 32, b"")
    assert code == Code.NOT_FOUND
    with pytest.raises(QueryError) as refused:
        partials(chain.state, CreditShareStore(tmp_path / "none"), {"mint": "0x" + "٣" * 64})
    assert refused.value.code == Code.BAD_QUERY
    code, value, _ = query(chain.state, "/mints?pending=true", b"")
    assert code == Code.OK and [m["id"] for m in json.loads(value)["mints"]] == [req.mint_id]


def test_credits_finalize_one_bad_partial_voids_that_validators_whole_set(tmp_path: Path) -> None:
    """A set is checked as one batch: the validator whose second of three partials is wrong
    counts for none of the three credits, and the others' sets still make the mint."""
    chain = credit_chain(tmp_path)
    req = request(chain, 3)
    assert send(chain, req.body).code == Code.OK
    fund(chain, req.mint_id)
    answers = gather(chain, tmp_path, req.mint_id)
    partials = list(answers[0]["partials"])
    partials[1] = bls.g1_bytes(bls.g1_generator()).hex()
    bad = {**answers[0], "partials": partials}
    assert len(req.finalize(period_key(chain), [bad, *answers[1:]])) == 3  # 3 good of 4
    with pytest.raises(MintIncomplete):
        req.finalize(period_key(chain), [bad, *answers[2:]])  # 2 good: t is 3
