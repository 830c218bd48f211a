"""Bearer credits on the committee (abci_app/credits.py): validators' epoch keys, a mint paid
from a prepaid balance, each validator's blind signatures, the client's finalize, redemptions
that become the node's work for the payout, and every refusal by name."""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from abci_app.codes import Code
from abci_app.credit_queries import signatures
from abci_app.genesis import DEFAULT_CREDIT_LIFETIME_EPOCHS, Genesis
from abci_app.queries import query
from abci_app.query_params import QueryError
from node.client.credit_wallet import (
    CreditWallet,
    MintIncomplete,
    MintRequest,
)
from protocol import blindrsa
from protocol.blindrsa import RsaPrivateKey
from protocol.committee.credits import CreditKey, FundMint, Mint, Redeem
from protocol.committee.envelope import decode, sign
from protocol.committee.grammar import TxDecodeError
from protocol.credit_keys import CreditKeyStore
from protocol.credits import (
    Credit,
    EpochKeys,
    epoch_keys_from_query,
    lifetime_from_query,
    spent_id,
)
from protocol.eip712 import address_of
from protocol.errors import ConfigError, ProtocolError
from tests.committee_chain import EVM_CHAIN_ID, Chain, seeded_evm_key, seeded_key
from tests.unit.test_abci_settlement import ESCROW, ask, next_epoch_end, settled_chain
from tests.unit.test_abci_state import hexkey, make_routable, register, served_commit_tx

pytestmark = pytest.mark.unit

NOW = 1_800_000_000
PRICE = 10**12
LAYER_TOKENS = 4096
PAYER = seeded_evm_key("credit-payer")


@functools.cache
def rsa_key(index: int) -> RsaPrivateKey:
    """Generated once per test session (RSA generation is slow); never derived."""
    return RsaPrivateKey.generate()


def credit_chain(lifetime_epochs: int | None = None, **extra: object) -> Chain:
    credits: dict[str, object] = {"price_wei": str(PRICE), "layer_tokens": LAYER_TOKENS}
    if lifetime_epochs is not None:
        credits["lifetime_epochs"] = lifetime_epochs
    chain = settled_chain(bindings={}, credits=credits, **extra)  # no gateway tx: heights as before
    chain.time_s = NOW
    return chain


def publish_keys(chain: Chain, epoch: int, tmp: Path, offset: int = 0) -> list[CreditKeyStore]:
    """Every validator publishes a key for `epoch`; each keeps its private key in its store."""
    stores, txs = [], []
    for index, validator in enumerate(chain.validators):
        store = CreditKeyStore(tmp / f"v{index}-{epoch}")
        private = rsa_key(index + offset)
        store.save(epoch, private)
        stores.append(store)
        txs.append(chain.tx(CreditKey(epoch, private.public.to_der()), validator.key))
    results = chain.block(txs)
    assert [r.code for r in results] == [Code.OK] * len(txs), [r.log for r in results]
    return stores


def keys_of(chain: Chain, epoch: int) -> EpochKeys:
    return epoch_keys_from_query(ask(chain, f"/credit_keys?epoch={epoch}"))


def epoch_now(chain: Chain) -> int:
    return (chain.state.height) // chain.state.genesis.epoch_length + 1


def mint(chain: Chain, keys: EpochKeys, count: int = 3, **kwargs: object) -> MintRequest:
    request = MintRequest.create(
        keys,
        count,
        PAYER,
        PRICE,
        EVM_CHAIN_ID,
        ESCROW,
        NOW + 3600,
        **kwargs,  # type: ignore[arg-type]
    )
    return request


def send(chain: Chain, body: object, key: SigningKey) -> object:
    [result] = chain.block([chain.tx(body, key)])
    return result


def fund(chain: Chain, mint_id: str, vouchers: int | None = None) -> list[object]:
    """The first `vouchers` validators (all by default) vouch for the mint in one block, as
    their watchers do once the payer's balance covers it (node/watcher/funding.py)."""
    validators = chain.validators[: len(chain.validators) if vouchers is None else vouchers]
    results = chain.block([chain.tx(FundMint(mint_id), v.key) for v in validators])
    assert all(r.code == Code.OK for r in results), [r.log for r in results]
    return results


def answers(chain: Chain, stores: list[CreditKeyStore], mint_id: str) -> dict[str, list[bytes]]:
    gathered: dict[str, list[bytes]] = {}
    for store in stores:
        answer = signatures(chain.state, store, {"mint": mint_id})
        for address, sigs in answer["signatures"].items():
            gathered[address] = [bytes.fromhex(s) for s in sigs]
    return gathered


def minted(chain: Chain, tmp: Path, count: int = 3) -> tuple[list[Credit], EpochKeys, str]:
    """Keys published for the current epoch, a funded mint, its credits finalized by the client
    (three blocks, all in one epoch: keys, mint, funding)."""
    length = chain.state.genesis.epoch_length
    if chain.state.height % length > length - 4:
        next_epoch_end(chain)
    stores = publish_keys(chain, epoch_now(chain), tmp)
    keys = keys_of(chain, epoch_now(chain))
    request = mint(chain, keys, count)
    result = send(chain, request.body, seeded_key("mint-sender"))
    assert result.code == Code.OK, result.log
    fund(chain, request.mint_id)
    return request.finalize(keys, answers(chain, stores, request.mint_id)), keys, request.mint_id


def close_last_blocks_epoch(chain: Chain) -> int:
    """Advance to the end of the epoch the last block belongs to; returns that epoch."""
    length = chain.state.genesis.epoch_length
    epoch = (chain.state.height - 1) // length + 1
    chain.advance_to(epoch * length)
    return epoch


def node_chain(lifetime_epochs: int | None = None, **extra: object) -> tuple[Chain, SigningKey]:
    chain = credit_chain(lifetime_epochs, **extra)
    node = register(chain, "credit-node", shards=(0, 1))
    make_routable(chain, node)
    return chain, node


def redeem(chain: Chain, node: SigningKey, credits: list[Credit], shard: int = 0) -> object:
    """The node commits the positions it served (one record: 32, a position per credit at
    least) and redeems, in one block: a redemption needs committed work (coverage.py)."""
    commit = served_commit_tx(chain, node, shard, blocks=max(1, -(-len(credits) // 32)))
    [_, result] = chain.block([commit, chain.tx(Redeem("m", shard, tuple(credits)), node)])
    return result  # (a stranger's commit is refused: the redeem's own refusal is the point)


# --- the whole path ---------------------------------------------------------------------------


def test_credits_mint_finalize_redeem_becomes_work_and_the_payer_is_debited(tmp_path: Path) -> None:
    chain, node = node_chain()
    credits, _keys, mint_id = minted(chain, tmp_path, count=3)
    assert len(credits) == 3
    assert all(len(c.signatures) == 4 for c in credits)
    record = ask(chain, f"/mints?id={mint_id}")
    assert record["count"] == 3 and record["amount"] == str(3 * PRICE)
    result = redeem(chain, node, credits)
    assert result.code == Code.OK, result.log
    account = address_of(seeded_evm_key("credit-node")).lower()
    epoch = close_last_blocks_epoch(chain)
    payout = ask(chain, f"/payouts?epoch={epoch}")
    # the purchase goes into the escrow's credit pool, the pool pays the redeeming node
    assert _pairs(payout) == {
        (address_of(PAYER).lower(), ESCROW): str(3 * PRICE),
        (ESCROW, ESCROW): str(3 * PRICE),
    }
    assert payout["statement"]["total"] == str(3 * PRICE)
    rows = dict(payout["rows"])
    assert rows[account] == str(3 * PRICE)


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
    chain, node = node_chain()
    credits, _, _ = minted(chain, tmp_path, count=2)
    if (chain.state.height + 1) % chain.state.genesis.epoch_length == 0:
        chain.block()  # not the epoch's last block: its close would move the record
    results = chain.block(
        [served_commit_tx(chain, node, 1, blocks=1)]
        + [chain.tx(Redeem("m", 1, (credit,)), node) for credit in credits]
    )  # two redemptions in one block: one epoch's record
    assert [r.code for r in results] == [Code.OK, Code.OK, Code.OK]
    account = address_of(seeded_evm_key("credit-node")).lower()
    credited = ask(chain, f"/credits?account={account}")
    assert credited["credits"] == [{"layer_tokens": 2 * LAYER_TOKENS, "model": "m", "shard": 1}]


# --- redemption refusals ----------------------------------------------------------------------


def test_credits_twice_spent_is_credit_spent(tmp_path: Path) -> None:
    chain, node = node_chain()
    credits, _, _ = minted(chain, tmp_path, count=2)
    assert redeem(chain, node, credits[:1]).code == Code.OK
    again = redeem(chain, node, credits[:1])
    assert again.code == Code.CREDIT_SPENT, again.log
    twice_in_one = redeem(chain, node, [credits[1], credits[1]])
    assert twice_in_one.code == Code.CREDIT_SPENT
    # the refused tx wrote nothing: the second credit is still good
    assert redeem(chain, node, credits[1:]).code == Code.OK


def test_credits_forged_signature_is_credit_invalid(tmp_path: Path) -> None:
    chain, node = node_chain()
    credits, _, _ = minted(chain, tmp_path, count=1)
    credit = credits[0]
    forged = Credit(
        credit.epoch,
        credit.prepared,
        tuple((a, bytes([s[0] ^ 1]) + s[1:]) for a, s in credit.signatures),
    )
    result = redeem(chain, node, [forged])
    assert result.code == Code.CREDIT_INVALID, result.log
    # a credit the node made up with its own RSA key is no better
    own = rsa_key(99)
    made_up = blindrsa.blind_sign(
        own, blindrsa.blind(own.public, credit.prepared).blinded_msg
    )  # any bytes of the right length
    fake = Credit(credit.epoch, credit.prepared, ((credit.signatures[0][0], made_up),))
    assert redeem(chain, node, [fake]).code == Code.CREDIT_INVALID


def test_credits_altered_message_is_credit_invalid(tmp_path: Path) -> None:
    chain, node = node_chain()
    credits, _, _ = minted(chain, tmp_path, count=1)
    credit = credits[0]
    altered = replace(credit, prepared=credit.prepared[:-1] + bytes([credit.prepared[-1] ^ 1]))
    result = redeem(chain, node, [altered])
    assert result.code == Code.CREDIT_INVALID, result.log
    # the unaltered credit is still unspent and good
    assert redeem(chain, node, credits).code == Code.OK


def test_credits_under_two_thirds_of_the_power_is_credit_invalid(tmp_path: Path) -> None:
    chain, node = node_chain()
    credits, _, _ = minted(chain, tmp_path, count=1)
    credit = credits[0]
    two_of_four = replace(credit, signatures=credit.signatures[:2])
    result = redeem(chain, node, [two_of_four])
    assert result.code == Code.CREDIT_INVALID and "under 2/3" in result.log, result.log
    three_of_four = replace(credit, signatures=credit.signatures[1:])
    assert redeem(chain, node, [three_of_four]).code == Code.OK


def test_credits_wrong_or_expired_epoch_is_refused(tmp_path: Path) -> None:
    chain, node = node_chain(lifetime_epochs=1)
    credits, keys, _ = minted(chain, tmp_path, count=2)
    epoch = keys.epoch
    # relabelled as a credit of the next epoch (whose keys are other keys): invalid
    next_epoch_end(chain)
    publish_keys(chain, epoch + 1, tmp_path, offset=10)
    relabelled = replace(credits[0], epoch=epoch + 1)
    result = redeem(chain, node, [relabelled])
    assert result.code == Code.CREDIT_INVALID, result.log
    # still redeemable in epoch + 1
    assert redeem(chain, node, credits[:1]).code == Code.OK
    # not in epoch + 2
    next_epoch_end(chain)
    late = redeem(chain, node, credits[1:])
    assert late.code == Code.CREDIT_EPOCH, late.log


def test_credits_stay_redeemable_for_their_lifetime_and_spent_ones_stay_spent(
    tmp_path: Path,
) -> None:
    """A credit of epoch e is good until e + lifetime_epochs (genesis), however long ago it was
    bought; its spent entry is kept that long too, even past `retention_epochs`: a credit
    redeemed in e is refused again in e + lifetime, then for its age."""
    chain, node = node_chain(lifetime_epochs=5, retention_epochs=1)
    credits, keys, _ = minted(chain, tmp_path, count=3)
    assert redeem(chain, node, credits[:1]).code == Code.OK
    for _ in range(5):  # to epoch e + 5: settled, pruned with retention 1 all along
        next_epoch_end(chain)
    assert epoch_now(chain) == keys.epoch + 5
    replay = redeem(chain, node, credits[:1])
    assert replay.code == Code.CREDIT_SPENT, replay.log
    assert redeem(chain, node, credits[1:2]).code == Code.OK  # bought 5 epochs ago, still good
    next_epoch_end(chain)
    late = redeem(chain, node, credits[2:])
    assert late.code == Code.CREDIT_EPOCH, late.log
    # the spent entries go once no credit of their epoch can come back
    for _ in range(3):
        next_epoch_end(chain)
    assert ask(chain, f"/credit_spent?id={spent_id(credits[0].prepared)}")["height"] is None


def test_credits_genesis_lifetime_is_checked_and_published() -> None:
    chain = credit_chain()
    answer = ask(chain, "/credit_keys")
    assert answer["lifetime_epochs"] == DEFAULT_CREDIT_LIFETIME_EPOCHS == 4_320
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
    chain, node = node_chain()
    credits, _, _ = minted(chain, tmp_path, count=1)
    assert redeem(chain, node, credits, shard=7).code == Code.REDEEM_SHARD
    assert redeem(chain, seeded_key("stranger"), credits).code == Code.UNKNOWN_NODE
    assert redeem(chain, node, credits).code == Code.OK


def test_credits_redeem_needs_a_committed_position_per_credit(tmp_path: Path) -> None:
    """No commitment, no pay — for credits too: a node that never commits what it served cannot
    redeem what it was paid (a silent node earns 0 and is never spot-checked); one committed
    record (32 positions) covers at most 32 credits, consumed, and the refusal writes nothing."""
    chain, node = node_chain()
    credits, _, _ = minted(chain, tmp_path, count=3)
    silent = send(chain, Redeem("m", 0, tuple(credits)), node)
    assert silent.code == Code.UNCOMMITTED_REDEMPTION, silent.log
    assert chain.state.items("cspent") == [] and chain.state.items("credit") == []
    assert redeem(chain, node, credits[:2]).code == Code.OK  # commits one record: 32 positions
    assert send(chain, Redeem("m", 0, tuple(credits[2:])), node).code == Code.OK  # 30 left
    record = chain.state.get("cover", f"{hexkey(node)}/00000")
    assert sum(row[2] for row in record["recent"]) == 3  # a position consumed per credit
    assert len(chain.state.items("cspent")) == 3


# --- mint refusals ----------------------------------------------------------------------------


def test_credits_mint_rules(tmp_path: Path) -> None:
    chain = credit_chain(epoch_length=20)
    chain.advance_to(1)
    stores = publish_keys(chain, epoch_now(chain), tmp_path)
    keys = keys_of(chain, epoch_now(chain))
    sender = seeded_key("mint-sender")
    request = mint(chain, keys, 2)
    body: Mint = request.body
    assert send(chain, replace(body, amount=PRICE), sender).code == Code.MINT_INVALID
    other = MintRequest.create(
        keys, 2, seeded_evm_key("thief"), PRICE, EVM_CHAIN_ID, ESCROW, NOW + 60
    )
    stolen = replace(other.body, payer=body.payer)
    assert send(chain, stolen, sender).code == Code.MINT_INVALID
    wrong_epoch = replace(body, epoch=body.epoch + 1)
    assert send(chain, wrong_epoch, sender).code == Code.CREDIT_EPOCH
    two = dict(list(body.blinded.items())[:2])
    under = replace(body, blinded=two)
    assert send(chain, under, sender).code == Code.NO_CREDIT_KEYS
    assert send(chain, body, sender).code == Code.OK
    assert send(chain, body, sender).code == Code.MINT_REPLAYED
    fund(chain, request.mint_id)
    got = answers(chain, stores, request.mint_id)
    assert sorted(got) == sorted(keys.keys)
    assert len(request.finalize(keys, got)) == 2


def send_fix(chain: Chain, body: object) -> object:
    return send(chain, body, seeded_key("mint-sender"))


def test_credits_mint_without_genesis_credits_is_disabled(tmp_path: Path) -> None:
    chain = settled_chain(credits=None)
    chain.time_s = NOW
    chain.advance_to(1)
    publish_keys(chain, 1, tmp_path)
    keys = keys_of(chain, 1)
    assert send_fix(chain, mint(chain, keys, 1).body).code == Code.CREDITS_DISABLED


def test_credits_finalize_needs_two_thirds_of_answers(tmp_path: Path) -> None:
    chain = credit_chain()
    chain.advance_to(1)
    stores = publish_keys(chain, 1, tmp_path)
    keys = keys_of(chain, 1)
    request = mint(chain, keys, 1)
    assert send_fix(chain, request.body).code == Code.OK
    fund(chain, request.mint_id)
    got = answers(chain, stores[:2], request.mint_id)
    with pytest.raises(MintIncomplete):
        request.finalize(keys, got)
    bad = answers(chain, stores, request.mint_id)
    first = sorted(bad)[0]
    bad[first] = [b"\x01" * len(bad[first][0])]
    assert len(request.finalize(keys, bad)[0].signatures) == 3


# --- funding: no signature before ≥ 2/3 of the power vouched for the payer's balance -----------


def _one_mint(chain: Chain, tmp: Path, count: int = 2) -> tuple[MintRequest, list[CreditKeyStore]]:
    length = chain.state.genesis.epoch_length
    if chain.state.height % length > length - 4:
        next_epoch_end(chain)
    stores = publish_keys(chain, epoch_now(chain), tmp)
    request = mint(chain, keys_of(chain, epoch_now(chain)), count)
    assert send_fix(chain, request.body).code == Code.OK
    return request, stores


def _pending_debits(chain: Chain) -> list[str]:
    return [k for k, _ in chain.state.committed_items("cpend")]


def test_credits_an_unfunded_mint_gets_no_signature_and_no_charge(tmp_path: Path) -> None:
    """A payer with no balance sends a valid mint: no watcher vouches for it, so no validator
    signs its messages (MINT_UNFUNDED by name) and nothing is charged to anyone's statement."""
    chain = credit_chain()
    request, stores = _one_mint(chain, tmp_path)
    for store in stores:
        with pytest.raises(QueryError) as refused:
            signatures(chain.state, store, {"mint": request.mint_id})
        assert refused.value.code == Code.MINT_UNFUNDED
    assert _pending_debits(chain) == []
    record = ask(chain, f"/mints?id={request.mint_id}")
    assert record["funded_height"] is None and record["vouched"] == []
    assert [m["id"] for m in ask(chain, "/mints?pending=true")["mints"]] == [request.mint_id]


def test_credits_a_mint_is_funded_at_two_thirds_of_the_power_and_charged_once(
    tmp_path: Path,
) -> None:
    chain = credit_chain()
    request, stores = _one_mint(chain, tmp_path)
    fund(chain, request.mint_id, vouchers=2)  # 2 of 4 equal validators: half the power
    assert ask(chain, f"/mints?id={request.mint_id}")["funded_height"] is None
    assert _pending_debits(chain) == []
    [third] = chain.block([chain.tx(FundMint(request.mint_id), chain.validators[2].key)])
    assert third.code == Code.OK
    record = ask(chain, f"/mints?id={request.mint_id}")
    assert record["funded_height"] == chain.state.height and len(record["vouched"]) == 3
    assert len(_pending_debits(chain)) == 1  # the charge, once
    assert ask(chain, "/mints?pending=true")["mints"] == []
    fund(chain, request.mint_id)  # late and repeated votes change nothing
    assert ask(chain, f"/mints?id={request.mint_id}")["funded_height"] == record["funded_height"]
    close_last_blocks_epoch(chain)
    assert _pending_debits(chain) == []  # debited by the close, once, into the credit pool
    payer = address_of(PAYER).lower()
    debits = [_pairs(p).get((payer, ESCROW)) for p in _statements(chain)]
    assert [d for d in debits if d] == [str(2 * PRICE)]
    keys = keys_of(chain, request.body.epoch)
    assert len(request.finalize(keys, answers(chain, stores, request.mint_id))) == 2
    mine = ask(chain, f"/mints?payer={payer}")["mints"]
    assert [m["id"] for m in mine] == [request.mint_id] and "blinded" not in mine[0]


def test_credits_a_funded_mint_can_be_finished_until_its_credits_expire(tmp_path: Path) -> None:
    """A client that comes back after `retention_epochs` still gathers the signatures of a mint
    it paid for (it was `MintLost` before); once the credits' window is over the record goes."""
    chain = credit_chain(lifetime_epochs=4, retention_epochs=1)
    request, stores = _one_mint(chain, tmp_path)
    fund(chain, request.mint_id)
    for _ in range(3):  # epoch + 3: an unfunded mint would be pruned by now
        next_epoch_end(chain)
    chain.block()
    keys = keys_of(chain, request.body.epoch)
    assert len(request.finalize(keys, answers(chain, stores, request.mint_id))) == 2
    for _ in range(3):  # past epoch + lifetime + retention
        next_epoch_end(chain)
    chain.block()
    code, _, _ = query(chain.state, f"/mints?id={request.mint_id}", b"")
    assert code == Code.NOT_FOUND


def test_credits_fund_mint_refusals_are_named(tmp_path: Path) -> None:
    chain = credit_chain(epoch_length=20)
    request, _ = _one_mint(chain, tmp_path)
    stranger = send(chain, FundMint(request.mint_id), seeded_key("not-a-validator"))
    assert stranger.code == Code.NOT_VALIDATOR
    unknown = send(chain, FundMint("0x" + "00" * 32), chain.validators[0].key)
    assert unknown.code == Code.MINT_UNKNOWN
    chain.advance_to((request.body.epoch + 1) * 20)  # its epoch and the next are over
    late = send(chain, FundMint(request.mint_id), chain.validators[0].key)
    assert late.code == Code.MINT_FUND_LATE, late.log
    with pytest.raises(TxDecodeError):
        FundMint.from_json({"mint": "0x" + "zz" * 32})


def test_credits_a_mint_whose_purchase_expired_is_not_funded(tmp_path: Path) -> None:
    chain = credit_chain()
    request, _ = _one_mint(chain, tmp_path)
    chain.time_s = NOW + 3601  # past the purchase's expiry (mint(...) signs NOW + 3600)
    late = send(chain, FundMint(request.mint_id), chain.validators[0].key)
    assert late.code == Code.MINT_FUND_LATE and "expired" in late.log


# --- keys -------------------------------------------------------------------------------------


def test_credits_key_rules(tmp_path: Path) -> None:
    chain = credit_chain()
    chain.advance_to(1)
    v0, v1 = chain.validators[0], chain.validators[1]
    der = rsa_key(0).public.to_der()
    assert send(chain, CreditKey(1, der), seeded_key("not-a-validator")).code == Code.NOT_VALIDATOR
    assert send(chain, CreditKey(4, der), v0.key).code == Code.CREDIT_KEY_EPOCH
    assert send(chain, CreditKey(1, b"\x30\x00"), v0.key).code == Code.CREDIT_KEY_INVALID
    assert send(chain, CreditKey(3, der), v0.key).code == Code.OK
    assert send(chain, CreditKey(3, rsa_key(1).public.to_der()), v0.key).code == (
        Code.DUPLICATE_CREDIT_KEY
    )
    copied = send(chain, CreditKey(3, der), v1.key)
    assert copied.code == Code.CREDIT_KEY_INVALID, copied.log


def test_credits_key_store_generates_and_finds_keys(tmp_path: Path) -> None:
    store = CreditKeyStore(tmp_path / "keys")
    private = store.generate(7)
    again = CreditKeyStore(tmp_path / "keys").private_for(private.public.to_der())
    assert again is not None and again.public == private.public
    assert CreditKeyStore(tmp_path / "keys").private_for(rsa_key(0).public.to_der()) is None
    [path] = (tmp_path / "keys").iterdir()
    assert path.stat().st_mode & 0o777 == 0o600


# --- what is public -----------------------------------------------------------------------------


def test_credits_nothing_in_the_mint_is_in_the_redemption(tmp_path: Path) -> None:
    """The mint tx and record carry blinded messages only: no 16-byte window of a redeemed
    credit (prepared message, signatures) appears in the mint tx or the signers' answers."""
    chain, _node = node_chain()
    credits, _keys, mint_id = minted(chain, tmp_path, count=2)
    public = json.dumps(ask(chain, f"/mints?id={mint_id}")).encode()
    for credit in credits:
        secrets = [credit.prepared[32:], *(s for _, s in credit.signatures)]
        for value in secrets:
            for start in range(0, len(value) - 16, 16):
                assert value[start : start + 16].hex().encode() not in public


# --- wire -------------------------------------------------------------------------------------


def test_credits_txs_round_trip_and_malformed_bodies_are_named(tmp_path: Path) -> None:
    chain = credit_chain()
    chain.advance_to(1)
    publish_keys(chain, 1, tmp_path)
    keys = keys_of(chain, 1)
    request = mint(chain, keys, 2)
    key = seeded_key("x")
    raw = sign(request.body, key, 1).encode()
    assert decode(raw).body == request.body
    body = json.loads(raw)["body"]
    for broken in (
        {**body, "blinded": []},
        {**body, "blinded": list(reversed(body["blinded"]))},
        {
            **body,
            "blinded": [[body["blinded"][0][0], body["blinded"][0][1][:1]], *body["blinded"][1:]],
        },
        {**body, "amount": "01"},
        {**body, "extra": 1},
    ):
        with pytest.raises(TxDecodeError):
            Mint.from_json(broken)
    credit = Credit(1, b"\x00" * 81, (("A" * 40, b"\x01" * 256),))
    redeem_body = Redeem("m", 0, (credit,))
    assert decode(sign(redeem_body, key, 2).encode()).body == redeem_body
    doc = redeem_body.to_json()
    for broken in (
        {**doc, "credits": []},
        {**doc, "credits": [[1, "00" * 80, [["A" * 40, "01" * 256]]]]},
        {**doc, "credits": [[1, "00" * 81, []]]},
        {**doc, "credits": [[1, "00" * 81, [["a" * 40, "01" * 256]]]]},
    ):
        with pytest.raises(TxDecodeError):
            Redeem.from_json(broken)


def test_credits_wallet_keeps_and_spends(tmp_path: Path) -> None:
    chain, _ = node_chain()
    credits, _, _ = minted(chain, tmp_path, count=3)
    wallet = CreditWallet(tmp_path / "wallet.json")
    wallet.add(credits)
    assert wallet.count() == 3
    assert wallet.take(2) == credits[:2]
    assert CreditWallet(tmp_path / "wallet.json").take(1) == credits[2:]
    assert wallet.count() == 0
    assert (tmp_path / "wallet.json").stat().st_mode & 0o777 == 0o600


def test_credits_signatures_query_needs_a_paid_mint(tmp_path: Path) -> None:
    chain = credit_chain()
    code, _, _log = query(chain.state, "/mints?id=0x" + "00" * 32, b"")
    assert code == Code.NOT_FOUND
    code, _, _ = query(chain.state, "/credit_signatures?mint=0x" + "00" * 32, b"")
    assert code == Code.UNKNOWN_QUERY  # served only by an app that holds keys (app.py)


def test_credits_no_state_entry_or_tx_links_the_payer_to_the_node(tmp_path: Path) -> None:
    """Read every committed state entry and both txs: nothing holds the payer (address, mint id,
    any piece of a blinded message) next to the node (key, EVM address). The one exception is the
    epoch's payout record, which lists every payer debited and every account paid in the epoch:
    the epoch is the anonymity set (docs/privacy.md)."""
    chain, node = node_chain(epoch_length=50)
    stores = publish_keys(chain, 1, tmp_path)
    keys = keys_of(chain, 1)
    request = mint(chain, keys, 2)
    mint_raw = chain.tx(request.body, seeded_key("mint-sender"))
    assert chain.block([mint_raw])[0].code == Code.OK
    fund(chain, request.mint_id)
    credits = request.finalize(keys, answers(chain, stores, request.mint_id))
    commit_raw = served_commit_tx(chain, node, 0, blocks=1)
    redeem_raw = chain.tx(Redeem("m", 0, tuple(credits)), node)
    results = chain.block([commit_raw, redeem_raw])
    assert [r.code for r in results] == [Code.OK, Code.OK]
    payer = address_of(PAYER)
    payer_side = {payer.lower(), payer[2:].lower(), request.mint_id, request.mint_id[2:]}
    for messages in request.body.blinded.values():
        for message in messages:
            payer_side |= {message[i : i + 16].hex() for i in range(0, len(message) - 16, 16)}
    node_evm = address_of(seeded_evm_key("credit-node"))
    node_side = {node.verify_key.encode().hex(), node_evm.lower(), node_evm[2:].lower()}
    chain.advance_to(50)  # the epoch closes: its payout record is written
    rows = chain.state.store._db.execute("SELECT ns, key, value FROM kv").fetchall()
    assert any(ns == "payout" for ns, _, _ in rows)
    seen = {"payer": set(), "node": set()}
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
    chain = credit_chain()
    request, _ = _one_mint(chain, tmp_path)
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
        signatures(chain.state, CreditKeyStore(tmp_path / "none"), {"mint": "0x" + "٣" * 64})
    assert refused.value.code == Code.BAD_QUERY
    code, value, _ = query(chain.state, "/mints?pending=true", b"")
    assert code == Code.OK and [m["id"] for m in json.loads(value)["mints"]] == [request.mint_id]
