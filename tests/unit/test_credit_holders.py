"""Who may lock or redeem a credit (abci_app/credit_holders.py; issue 42, attack 4 follow-up):
the party its holder assigned it to. A node that copies another node's `credit_lock` out of the
mempool, or a node's or relay's redemption, and gets it into a block first is refused
CREDIT_NOT_ASSIGNED by name, and the honest party then locks or redeems the credit. On a
holder-bound chain (genesis `credits.holder_bound`) the unbound forms of before are refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from abci_app import schema
from abci_app.codes import Code
from abci_app.genesis import Genesis
from protocol.blind_bls import ThresholdCredit
from protocol.committee import credit_holder
from protocol.committee.credit_locks import CreditLock
from protocol.committee.credits import CreditRedeem
from protocol.committee.grammar import TxDecodeError
from protocol.committee.relay_credits import RelayRedeem
from protocol.errors import ConfigError, ProtocolError
from protocol.paid_credits import HeldCredit, spent_id
from tests.committee_chain import Chain
from tests.credit_chain import minted, node_chain, send
from tests.unit.test_abci_relays import add_relay
from tests.unit.test_abci_settlement import ask
from tests.unit.test_abci_state import hexkey, make_routable, price_txs, register, served_commit_tx

pytestmark = pytest.mark.unit

BOUND = {"holder_bound": True}


def held(chain: Chain, tmp_path: Path, count: int) -> list[tuple[ThresholdCredit, bytes]]:
    """`count` holder-bound credits with their holder seeds (what the buyer keeps)."""
    credits, request = minted(chain, tmp_path, count=count)
    assert [credit_holder.holder_of(seed) for seed in request.seeds] == [c.nonce for c in credits]
    assert all(isinstance(c, HeldCredit) for c in credits)  # the wallet keeps them so
    plain = [ThresholdCredit(c.period, c.nonce, c.signature) for c in credits]
    return list(zip(plain, request.seeds, strict=True))


def to_node(seed: bytes, node: SigningKey, shard: int = 0) -> bytes:
    return credit_holder.assign(
        seed, credit_holder.node_party(node.verify_key.encode(), "m", shard)
    )


def bound_lock(
    credits: list[tuple[ThresholdCredit, bytes]], node: SigningKey, epoch: int = 1
) -> CreditLock:
    """The lock `node`'s agent sends for credits its clients assigned to it on ("m", 0)."""
    rows = sorted(
        (spent_id(credit), epoch, credit.nonce, to_node(seed, node)) for credit, seed in credits
    )
    return CreditLock(
        "m", 0, tuple((i, e) for i, e, _, _ in rows), tuple((h, a) for _, _, h, a in rows)
    )


def bound_redeem(credits: list[tuple[ThresholdCredit, bytes]], node: SigningKey) -> CreditRedeem:
    return CreditRedeem(
        "m",
        0,
        tuple(credit for credit, _ in credits),
        tuple(to_node(seed, node) for _, seed in credits),
    )


def two_nodes(tmp_path: Path) -> tuple[Chain, SigningKey, SigningKey]:
    chain, honest = node_chain(tmp_path, credits_extra=BOUND)
    thief = register(chain, "front-runner", shards=(0,))
    make_routable(chain, thief)
    return chain, honest, thief


def test_a_lock_copied_from_the_mempool_is_refused_by_name_and_the_assigned_node_locks(
    tmp_path: Path,
) -> None:
    chain, honest, thief = two_nodes(tmp_path)
    credits = held(chain, tmp_path, 2)
    mine = bound_lock(credits, honest)
    # the thief saw the honest node's lock in the mempool and sends the same body first, in
    # the same block: refused by name, and the honest lock behind it wins every credit
    copied = chain.tx(mine, thief)
    assert chain.machine.check_tx(copied).code == Code.CREDIT_NOT_ASSIGNED  # kept out of blocks
    [stolen, honest_lock] = chain.block([copied, chain.tx(mine, honest)])
    assert stolen.code == Code.CREDIT_NOT_ASSIGNED, stolen.log
    assert "credit 0:" in stolen.log and hexkey(thief) in stolen.log
    assert honest_lock.code == Code.OK, honest_lock.log
    for credit, _ in credits:
        assert ask(chain, f"/credit_lock?id={spent_id(credit)}")["node"] == hexkey(honest)
    # the form of before (spent ids only, no assignment) is refused on this chain too
    bare = CreditLock("m", 0, mine.locks)
    assert chain.machine.check_tx(chain.tx(bare, thief)).code == Code.CREDIT_NOT_ASSIGNED
    assert send(chain, bare, thief).code == Code.CREDIT_NOT_ASSIGNED


def test_the_form_of_before_is_how_the_front_run_worked(tmp_path: Path) -> None:
    """Without holder-bound genesis, the thief's lock of the bare spent ids wins and the honest
    node's lock is refused: the griefing the rule above stops."""
    chain, honest = node_chain(tmp_path)
    thief = register(chain, "front-runner", shards=(0,))
    make_routable(chain, thief)
    credits = held(chain, tmp_path, 1)
    mine = bound_lock(credits, honest)
    [stolen, honest_lock] = chain.block(
        [chain.tx(CreditLock("m", 0, mine.locks), thief), chain.tx(mine, honest)]
    )
    assert stolen.code == Code.OK and honest_lock.code == Code.CREDIT_LOCKED
    # assignments given are checked on any chain: a copy of the bound lock is refused
    other = held(chain, tmp_path, 1)
    assert send(chain, bound_lock(other, honest), thief).code == Code.CREDIT_NOT_ASSIGNED


def _redeem_block(chain: Chain, node: SigningKey, body: CreditRedeem) -> Any:
    """`node` prices shard 0, commits served positions and sends `body`, in one block: a
    redemption with everything but the assignment in order."""
    priced = price_txs(chain, node, 0)
    commit = served_commit_tx(chain, node, 0, blocks=1)
    *_, result = chain.block([*priced, commit, chain.tx(body, node)])
    return result


def test_a_redemption_copied_from_the_mempool_is_refused_and_the_assigned_node_redeems(
    tmp_path: Path,
) -> None:
    chain, honest, thief = two_nodes(tmp_path)
    credits = held(chain, tmp_path, 2)
    mine = bound_redeem(credits, honest)  # never locked: the redemption is its lock and spend
    stolen = _redeem_block(chain, thief, mine)  # the thief's commitments and prices in order
    assert stolen.code == Code.CREDIT_NOT_ASSIGNED, stolen.log
    assert f"node {hexkey(thief)} on m shard 0" in stolen.log
    for credit, _ in credits:
        assert chain.state.get(schema.CREDIT_SPENT, spent_id(credit)) is None
    done = _redeem_block(chain, honest, mine)
    assert done.code == Code.OK, done.log
    # the unbound form (credits only) is refused on a holder-bound chain
    rest = held(chain, tmp_path, 1)
    bare = CreditRedeem("m", 0, (rest[0][0],))
    assert send(chain, bare, honest).code == Code.CREDIT_NOT_ASSIGNED


def test_an_assignment_names_its_shard_and_its_party_kind(tmp_path: Path) -> None:
    chain, honest, _ = two_nodes(tmp_path)
    [(credit, seed)] = held(chain, tmp_path, 1)
    elsewhere = CreditRedeem("m", 1, (credit,), (to_node(seed, honest, shard=0),))
    refused = send(chain, elsewhere, honest)
    assert refused.code == Code.CREDIT_NOT_ASSIGNED and "shard 1" in refused.log
    relay = add_relay(chain, "holder-relay")
    relay_key = bytes.fromhex(chain.state.get(schema.NODE, hexkey(relay))["relay_key"])
    as_relay = credit_holder.assign(seed, credit_holder.relay_party(relay_key))
    assert send(chain, CreditRedeem("m", 0, (credit,), (as_relay,)), honest).code == (
        Code.CREDIT_NOT_ASSIGNED
    )


def test_a_relay_redemption_copied_by_another_relay_or_a_node_is_refused(
    tmp_path: Path,
) -> None:
    chain, node = node_chain(tmp_path, credits_extra={**BOUND, "relay_bytes": 16})
    honest, thief = add_relay(chain, "holder-r1"), add_relay(chain, "holder-r2")
    key = bytes.fromhex(chain.state.get(schema.NODE, hexkey(honest))["relay_key"])
    credits = held(chain, tmp_path, 2)
    body = RelayRedeem(
        tuple(c for c, _ in credits),
        tuple(credit_holder.assign(s, credit_holder.relay_party(key)) for _, s in credits),
    )
    stolen = send(chain, body, thief)
    assert stolen.code == Code.CREDIT_NOT_ASSIGNED and "relay " in stolen.log, stolen.log
    by_node = CreditRedeem("m", 0, body.credits, body.assignments)
    assert send(chain, by_node, node).code == Code.CREDIT_NOT_ASSIGNED
    assert send(chain, RelayRedeem(body.credits), thief).code == Code.CREDIT_NOT_ASSIGNED
    done = send(chain, body, honest)
    assert done.code == Code.OK, done.log


# --- parsing ------------------------------------------------------------------------------------


def test_lock_rows_of_either_form_parse_strictly_and_round_trip() -> None:
    seed = bytes(range(32))
    holder = credit_holder.holder_of(seed)
    assignment = credit_holder.assign(seed, credit_holder.node_party(bytes(32), "m", 0))
    row = [holder.hex(), 3, assignment.hex()]
    lock = CreditLock.from_json({"locks": [row], "model": "m", "shard": 0})
    assert lock.locks == ((spent_id(ThresholdCredit(0, holder, b"")), 3),)
    assert lock.assignments == ((holder, assignment),)
    assert CreditLock.from_json(lock.to_json()) == lock
    bad_rows = [
        [holder.hex().upper(), 3, assignment.hex()],  # uppercase hex
        [holder.hex()[:-2], 3, assignment.hex()],  # 31 bytes
        [holder.hex(), 3, assignment.hex() + "00"],  # 65 bytes
        [holder.hex(), 3, assignment.hex()[:-1] + "g"],  # not hex
        [holder.hex(), 0, assignment.hex()],  # epoch 0
    ]
    for bad in bad_rows:
        with pytest.raises(TxDecodeError):
            CreditLock.from_json({"locks": [bad], "model": "m", "shard": 0})
    other = credit_holder.holder_of(bytes(32))
    mixed = [row, [spent_id(ThresholdCredit(0, other, b"")), 3]]
    with pytest.raises(TxDecodeError, match="3 values"):
        CreditLock.from_json({"locks": mixed, "model": "m", "shard": 0})


def test_redemption_assignments_are_one_per_credit_or_absent(tmp_path: Path) -> None:
    chain, _ = node_chain(tmp_path)
    [(credit, seed)] = held(chain, tmp_path, 1)
    assignment = credit_holder.assign(seed, credit_holder.node_party(bytes(32), "m", 0))
    body = CreditRedeem("m", 0, (credit,), (assignment,))
    assert CreditRedeem.from_json(body.to_json()) == body
    assert "assignments" not in CreditRedeem("m", 0, (credit,)).to_json()
    doc = body.to_json()
    for wrong in ([], [assignment.hex()] * 2, [assignment.hex()[:-2]], "x"):
        with pytest.raises(TxDecodeError, match="assignments"):
            CreditRedeem.from_json({**doc, "assignments": wrong})
    relay = RelayRedeem((credit,), (assignment,))
    assert RelayRedeem.from_json(relay.to_json()) == relay
    with pytest.raises(TxDecodeError, match="assignments"):
        RelayRedeem.from_json({**relay.to_json(), "assignments": []})


def test_genesis_holder_bound_is_a_boolean() -> None:
    genesis = Genesis.parse(
        b'{"credits": {"price_wei": "1", "layer_tokens": 1, "holder_bound": true}}'
    )
    assert genesis.credit_holder_bound and Genesis.from_json(genesis.to_json()).credit_holder_bound
    with pytest.raises(ConfigError, match="holder_bound"):
        Genesis.parse(b'{"credits": {"price_wei": "1", "layer_tokens": 1, "holder_bound": 1}}')
    plain = Genesis.parse(b'{"credits": {"price_wei": "1", "layer_tokens": 1}}')
    assert not plain.credit_holder_bound and "holder_bound" not in plain.to_json()["credits"]


def test_an_assignment_verifies_for_its_party_only() -> None:
    seed = credit_holder.new_seed()
    holder = credit_holder.holder_of(seed)
    party = credit_holder.node_party(bytes(32), "m", 0)
    signed = credit_holder.assign(seed, party)
    assert credit_holder.assigned(holder, party, signed)
    assert not credit_holder.assigned(holder, credit_holder.node_party(bytes(32), "m", 1), signed)
    assert not credit_holder.assigned(holder, credit_holder.relay_party(bytes(32)), signed)
    assert not credit_holder.assigned(bytes(32), party, signed)  # no key: small order
    assert not credit_holder.assigned(holder, party, signed[:-1])


# --- the whole path in process: wallet, pay, node, agent, chain ---------------------------------


async def test_an_assigned_credit_is_taken_locked_and_redeemed_by_its_node_only(
    tmp_path: Path,
) -> None:
    """The client assigns each credit to the node it pays (CreditPayer.to_hop); the `pay`
    carries the assignment; the node checks it and spools it; its agent locks and redeems it
    with it. Another node shown the same credit refuses it by name, and a front-runner that
    locks it with the assignment it saw is refused: the honest node is paid."""
    from node.agent.credit_locker import SpoolLocker
    from node.agent.credit_till import CreditTill, SpoolRedeemer
    from node.client.credit_wallet import CreditWallet
    from node.client.paying import CreditPayer
    from node.server.credit_locks import LockMarks
    from node.server.payments import (
        Account,
        CreditCheck,
        CreditNotAssignedError,
        CreditSpool,
        Payments,
    )
    from protocol.paid_credits import AssignedCredit
    from protocol.stream import parse_control, pay_message
    from tests.unit.test_credit_till import ChainLink

    chain, honest, thief = two_nodes(tmp_path)
    chain.block(price_txs(chain, thief))
    *credits, spare = minted(chain, tmp_path, count=3)[0]
    wallet = CreditWallet(tmp_path / "credits.json")
    wallet.add(credits)
    parties = {
        url: credit_holder.node_party(key.verify_key.encode(), "m", 0)
        for url, key in (("https://honest", honest), ("https://thief", thief))
    }
    payer = CreditPayer(wallet, {"https://honest": 8}, parties=parties)
    [taken] = payer.take([2])
    assert all(isinstance(c, HeldCredit) for c in taken)  # the seeds came back from the file
    sent = [pay_message(1, payer.to_hop("https://honest", credit)) for credit in taken]
    paid = [parse_control(json.dumps(m), frozenset({"pay"})).credit for m in sent]
    assert all(isinstance(c, AssignedCredit) for c in paid)

    def node(key: SigningKey, name: str) -> tuple[Payments, SpoolRedeemer]:
        link = ChainLink(chain, key)
        spool = CreditSpool(tmp_path / f"spool-{name}")
        payments = Payments(
            8,
            CreditCheck(link, margin_blocks=1),
            spool,
            locks=LockMarks(spool.dir),
            party=parties[f"https://{name}"],
        )
        locker = SpoolLocker(link, "m", 0, spool)
        return payments, SpoolRedeemer(CreditTill(link, "m", 0), spool, locker=locker)

    pay_honest, agent_honest = node(honest, "honest")
    pay_thief, agent_thief = node(thief, "thief")
    for credit in paid:
        await pay_honest.accept(Account(), credit)
        with pytest.raises(CreditNotAssignedError):  # shown to the thief: not its credit
            await pay_thief.accept(Account(), credit)
    # a credit without an assignment: this holder-bound chain would not let the node lock it
    bare = ThresholdCredit(spare.period, spare.nonce, spare.signature)
    with pytest.raises(CreditNotAssignedError, match="holder's assignment"):
        await pay_honest.accept(Account(), bare)
    # the thief copies the honest node's lock rows (what the mempool shows) and lands first
    copied = CreditLock(
        "m",
        0,
        tuple(sorted((spent_id(c), 1) for c in paid)),
        tuple(
            (c.nonce, c.assignment)
            for c in sorted(paid, key=spent_id)
            if isinstance(c, AssignedCredit)
        ),
    )
    [stolen] = chain.block([chain.tx(copied, thief)])
    assert stolen.code == Code.CREDIT_NOT_ASSIGNED, stolen.log
    commit = served_commit_tx(chain, honest, 0, blocks=1)
    chain.block([commit])
    assert await agent_honest.step() == 2  # locked with the assignments, then redeemed
    for credit in paid:
        assert chain.state.get(schema.CREDIT_SPENT, spent_id(credit)) is not None
    assert await agent_thief.step() == 0  # it took nothing: nothing to lock or redeem


def test_the_wallet_keeps_each_credits_holder_seed_and_reads_files_of_before(
    tmp_path: Path,
) -> None:
    from node.client.credit_wallet import CreditWallet
    from protocol.errors import UsageError
    from protocol.paid_credits import credit_json

    chain, _ = node_chain(tmp_path)
    credits, request = minted(chain, tmp_path, count=2)
    path = tmp_path / "credits.json"
    CreditWallet(path).add(credits)
    doc = json.loads(path.read_text())
    assert doc["credits"][0] == {"credit": credit_json(credits[0]), "seed": request.seeds[0].hex()}
    assert CreditWallet(path).take(2) == credits  # HeldCredit, seeds and all
    # a file of before: bare credits, read and spent as they were (unassigned)
    plain = [ThresholdCredit(c.period, c.nonce, c.signature) for c in credits]
    path.write_text(json.dumps({"credits": [credit_json(c) for c in plain], "pending": []}))
    assert CreditWallet(path).take(2) == plain
    # a seed that is not the credit's: the file is refused by name
    doc["credits"][0]["seed"] = request.seeds[1].hex()
    path.write_text(json.dumps(doc))
    with pytest.raises(UsageError, match="not a credit file"):
        CreditWallet(path).count()


async def test_a_relay_is_paid_assigned_credits_and_redeems_them_itself(tmp_path: Path) -> None:
    """The client assigns a pay note's credits to the relay's X25519 key (overlay `to_relay`);
    the note carries the assignments; a relay that is not the assignee refuses them by name; the
    assignee keeps them across a restart and redeems them on the chain."""
    from nacl.public import PrivateKey

    from node.client.overlay import to_relay
    from node.relay.earnings import Earnings
    from node.relay.redeem import redeem_held
    from node.relay.relay import Relay
    from protocol.paid_credits import AssignedCredit
    from protocol.relay_pay import open_pay, wrap_pay

    chain, _ = node_chain(tmp_path, credits_extra={**BOUND, "relay_bytes": 16})
    relay = add_relay(chain, "holder-pay-relay")
    key = bytes.fromhex(chain.state.get(schema.NODE, hexkey(relay))["relay_key"])
    credits, _ = minted(chain, tmp_path, count=2)
    given = to_relay(list(credits), key)
    assert all(isinstance(c, AssignedCredit) for c in given)
    hop_key = bytes(range(32))
    body = wrap_pay([hop_key], [0], 0, given)
    opened = open_pay(hop_key, 0, body, exit_relay=True)
    assert list(opened.credits) == given
    stranger = Relay(PrivateKey.generate())  # another relay shown the note: not its credits
    assert stranger._assigned_here(opened.credits) == []
    earnings = Earnings(tmp_path / "relay-credits")
    earnings.take(opened.credits)
    restarted = Earnings(tmp_path / "relay-credits")
    assert sorted(restarted.pending(), key=spent_id) == sorted(given, key=spent_id)

    class Link:
        async def send(self, body: object, *, timeout_s: float = 15.0) -> tuple[int, str]:
            result = send(chain, body, relay)
            return result.code, result.log

    done = await redeem_held(Link(), restarted)
    assert done.credits == 2 and not restarted.pending()
    for credit in credits:
        assert chain.state.get(schema.CREDIT_SPENT, spent_id(credit)) is not None


def test_a_purchase_in_flight_keeps_its_holder_seeds(tmp_path: Path) -> None:
    from node.client.mint_request import MintRequest
    from tests.credit_chain import request

    chain, _ = node_chain(tmp_path)
    req = request(chain, 2)
    doc = req.to_json()
    assert MintRequest.from_json(doc).seeds == req.seeds
    assert [len(row) for row in doc["blindings"]] == [3, 3]  # nonce, factor, seed
    doc["blindings"][0][2] = req.seeds[1].hex()  # a seed that is not that credit's
    with pytest.raises(ProtocolError, match="holder seeds"):
        MintRequest.from_json(doc)
    doc["blindings"] = [row[:2] for row in req.to_json()["blindings"]]  # written before seeds
    assert MintRequest.from_json(doc).seeds == ()
