"""Settlement on the committee chain: gateway work reports (served counts, query fees), the
epoch close — the credit pool's draw paid to the epoch's redeeming nodes (less the verifiers'
cut), each gateway's revenue
paid to it on its own pages — and payout votes, with every refusal named
(abci_app/settlement.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from abci_app.codes import Code
from abci_app.queries import query
from abci_app.schema import epoch_key
from protocol.committee.credits import CreditRedeem
from protocol.committee.envelope import decode, sign
from protocol.committee.gateways import sign_binding
from protocol.committee.grammar import TxDecodeError
from protocol.committee.registry import Heartbeat
from protocol.committee.settlement import (
    PayoutVote,
    WorkReport,
    statement_number,
)
from protocol.committee.verification import VerdictVote
from protocol.eip712 import PayoutRoot, Verdict, address_of, committee_domain
from shares.merkle import Payout, verify
from tests.committee_chain import (
    CHAIN_ID,
    COMMITTEE_ADDRESS,
    EVM_CHAIN_ID,
    FRAUD_PROOFS_ADDRESS,
    Chain,
    seeded_evm_key,
    seeded_key,
)
from tests.unit.test_abci_state import (
    hexkey,
    make_routable,
    price_txs,
    register,
    served_commit_tx,
)

pytestmark = pytest.mark.unit

ESCROW = "0x" + "ee" * 20
GATEWAY = seeded_key("gateway")
GATEWAY_EVM_KEY = seeded_evm_key("gateway")
GATEWAY_EVM = address_of(GATEWAY_EVM_KEY).lower()  # GATEWAY's bound address: its revenue's payee
DOMAIN = committee_domain(EVM_CHAIN_ID, COMMITTEE_ADDRESS)
Q1, Q2, Q3 = ("0x" + f"{i:02x}" * 32 for i in (1, 2, 3))
CREDIT_PRICE = 10**12  # as tests/credit_chain.py
CREDIT_LAYER_TOKENS = 4096
CREDIT_NOW = 1_800_000_000
VERIFIER_CUT_BPS = 1_000  # genesis default


def net(credits: int, price: int = CREDIT_PRICE) -> int:
    """A node's row for `credits` redeemed credits: their price less the verifiers' cut."""
    return credits * price * (10_000 - VERIFIER_CUT_BPS) // 10_000


def bind_gateway(
    chain: Chain, key: SigningKey, evm_key: bytes, *, bound: bool = True, nonce: int = 1
) -> bytes:
    """A `gateway` tx of `key` binding (or releasing) the address of `evm_key`."""
    body = sign_binding(
        evm_key,
        hexkey(key),
        bound=bound,
        nonce=nonce,
        chain_id=CHAIN_ID,
        evm_chain_id=EVM_CHAIN_ID,
        committee_address=COMMITTEE_ADDRESS,
    )
    return chain.tx(body, key)


def settled_chain(bindings: dict[SigningKey, bytes] | None = None, **extra: object) -> Chain:
    """A chain whose genesis settles epochs (escrow) and sells credits, where each key of
    `bindings` (default: GATEWAY) is bound to its EVM key's address by a `gateway` tx in block
    1; `extra` overrides genesis keys (None drops one)."""
    genesis: dict[str, object] = {
        "evm": {
            "chain_id": EVM_CHAIN_ID,
            "committee_address": COMMITTEE_ADDRESS,
            "fraud_proofs_address": FRAUD_PROOFS_ADDRESS,
            "escrow_address": ESCROW,
        },
        # a key period's DKG in 3 × 2 blocks: a test forms the credit key in a few blocks
        # (tests/credit_chain.py `ensure_key`)
        "credits": {
            "price_wei": str(CREDIT_PRICE),
            "layer_tokens": CREDIT_LAYER_TOKENS,
            "dkg_phase_blocks": 2,
        },
    }
    genesis.update(extra)
    chain = Chain(genesis={k: v for k, v in genesis.items() if v is not None})
    chain.time_s = CREDIT_NOW  # block time: what mints' and charges' expiries are checked against
    bindings = {GATEWAY: GATEWAY_EVM_KEY} if bindings is None else bindings
    if bindings:
        txs = [bind_gateway(chain, key, evm_key) for key, evm_key in bindings.items()]
        assert [r.code for r in chain.block(txs)] == [Code.OK] * len(txs)
    return chain


def ask(chain: Chain, path: str) -> dict:
    code, value, log = query(chain.state, path, b"")
    assert code == Code.OK, log
    return json.loads(value)


def ask_code(chain: Chain, path: str) -> Code:
    return Code(query(chain.state, path, b"")[0])


def two_nodes(chain: Chain) -> tuple[SigningKey, SigningKey]:
    a = register(chain, "node-a", shards=(0,))
    b = register(chain, "node-b", shards=(1,))
    make_routable(chain, a)
    make_routable(chain, b)
    # both nodes' committed served work in one block (what redemptions consume)
    results = chain.block([served_commit_tx(chain, a, 0), served_commit_tx(chain, b, 1)])
    assert [r.code for r in results] == [Code.OK, Code.OK]
    return a, b


def report(queries: tuple[tuple[str, int], ...] = ()) -> WorkReport:
    return WorkReport(queries=queries)


def one(chain: Chain, body: object, key: SigningKey) -> object:
    [result] = chain.block([chain.tx(body, key)])
    return result


def next_epoch_end(chain: Chain) -> int:
    length = chain.state.genesis.epoch_length
    end = (chain.state.height // length + 1) * length
    chain.advance_to(end)
    return end // length


def close_current(chain: Chain) -> int:
    """Advance to the close of the epoch the last block belongs to (closed already when that
    block was its last); returns that epoch."""
    length = chain.state.genesis.epoch_length
    epoch = -(-chain.state.height // length)
    chain.advance_to(epoch * length)
    return epoch


def redeemed(
    chain: Chain,
    tmp: Path,
    shares: dict[SigningKey, tuple[int, int]],
    others: Callable[[], list[bytes]] = list,
) -> list[object]:
    """Credits bought (one funded mint), then each node (key → (shard, credits)) commits what it
    served and redeems its credits, in one block with the txs `others()` makes then (after the
    mint's, so their nonces follow): all in one epoch."""
    from tests.credit_chain import ensure_key, minted

    ensure_key(chain, tmp)  # the credit key first (its DKG's blocks), where it is not formed
    length = chain.state.genesis.epoch_length
    if chain.state.height % length > length - 5:  # the prices', minted's 2 and this block fit
        next_epoch_end(chain)
    unpriced = [tx for key, (shard, _) in shares.items() for tx in price_txs(chain, key, shard)]
    if unpriced:  # a redemption needs a registered price (abci_app/prices.py)
        assert all(r.code == Code.OK for r in chain.block(unpriced))
    credits, _ = minted(chain, tmp, count=sum(n for _, n in shares.values()))
    txs, taken = [], 0
    for key, (shard, count) in shares.items():
        txs.append(served_commit_tx(chain, key, shard))
        redeem = CreditRedeem("m", shard, tuple(credits[taken : taken + count]))
        txs.append(chain.tx(redeem, key))
        taken += count
    return chain.block([*txs, *others()])


def served_epoch(chain: Chain, tmp: Path) -> tuple[SigningKey, SigningKey, int]:
    """A redeems 2 credits on shard 0, B 3 on shard 1; the gateway reports two query fees (600
    and 401); the epoch closes."""
    a, b = two_nodes(chain)
    work = report(queries=((Q1, 600), (Q2, 401)))
    results = redeemed(chain, tmp, {a: (0, 2), b: (1, 3)}, lambda: [chain.tx(work, GATEWAY)])
    assert [r.code for r in results] == [Code.OK] * 5, [r.log for r in results]
    return a, b, next_epoch_end(chain)


def refused_codes(result: Any) -> list[str]:
    """The code names of a tx result's `planet.item_refused` events, in order."""
    return [dict(attrs)["code"] for kind, attrs in result.events if kind == "planet.item_refused"]


def evm_of(label: str) -> str:
    return address_of(seeded_evm_key(label)).lower()


def vote(chain: Chain, index: int, epoch: int, key: bytes | None = None) -> object:
    record = ask(chain, f"/payouts?epoch={epoch}")["statement"]
    statement = PayoutRoot(
        epoch=record["epoch"],
        root=bytes.fromhex(record["root"][2:]),
        total=int(record["total"]),
        queries_hash=bytes.fromhex(record["queries_hash"][2:]),
        consumer=record["consumer"],
    )
    validator = chain.validators[index]
    signature = statement.sign(key or validator.operator_key, DOMAIN)
    return one(chain, PayoutVote(epoch, "0x" + signature.hex()), validator.key)


def rows(chain: Chain, number: int) -> dict[str, int]:
    return {a: int(amount) for a, amount in ask(chain, f"/payouts?epoch={number}")["rows"]}


# --- the whole path ---------------------------------------------------------------------------


def test_settlement_the_pool_pays_redemptions_and_the_gateway_its_revenue_with_proofs(
    tmp_path: Path,
) -> None:
    chain = settled_chain()
    _, _, epoch = served_epoch(chain, tmp_path)
    pool = ask(chain, f"/payouts?epoch={epoch}")
    revenue = ask(chain, f"/payouts?epoch={statement_number(epoch, 1)}")
    assert (pool["page"], pool["pages"], revenue["page"], revenue["pages"]) == (0, 2, 1, 2)
    # page 0, the pool's: the mint's purchase goes in, the draw comes out: each node its
    # credits' price less the verifiers' cut (no verifier this epoch: their part stays due)
    assert pool["gateways"] == [ESCROW, ESCROW] and pool["query_ids"] == []
    assert pool["total"] == str(net(5))
    assert rows(chain, epoch) == {evm_of("node-a"): net(2), evm_of("node-b"): net(3)}
    assert chain.state.get("cdue", epoch_key(epoch + 1)) == str(5 * CREDIT_PRICE - net(5))
    # page 1, the gateway's: its two query fees, one row, its own address
    assert revenue["query_ids"] == [Q1, Q2] and revenue["fees"] == ["600", "401"]
    assert revenue["total"] == "1001" and revenue["payers"] == []
    assert rows(chain, statement_number(epoch, 1)) == {GATEWAY_EVM: 1001}
    assert revenue["consumer"] == pool["consumer"] == ESCROW
    for number, view in ((epoch, pool), (statement_number(epoch, 1), revenue)):
        root = bytes.fromhex(view["root"][2:])
        for account, amount in rows(chain, number).items():
            proof = ask(chain, f"/payouts/proof?epoch={number}&account={account}")
            assert int(proof["amount"]) == amount
            steps = [bytes.fromhex(p[2:]) for p in proof["proof"]]
            assert verify(root, Payout(number, account, amount), steps)
    # the queries are settled: re-reporting one with its fee changes nothing, with another fee
    # it is a refused item; the redemptions are gone
    assert refused_codes(one(chain, report(queries=((Q1, 600),)), GATEWAY)) == []
    assert refused_codes(one(chain, report(queries=((Q1, 1),)), GATEWAY)) == ["DUPLICATE_QUERY"]
    assert chain.state.committed("sqdone", f"{Q1}/{GATEWAY_EVM}") == {
        "fee": "600",
        "statement": statement_number(epoch, 1),
    }
    assert ask(chain, f"/credits?account={evm_of('node-a')}&epoch={epoch}")["credits"] == []


def test_settlement_payout_votes_confirm_at_two_thirds_and_resigning_is_a_duplicate(
    tmp_path: Path,
) -> None:
    chain = settled_chain()
    _, _, epoch = served_epoch(chain, tmp_path)
    assert vote(chain, 0, epoch).code == Code.OK
    assert vote(chain, 1, epoch).code == Code.OK
    assert ask(chain, f"/payouts?epoch={epoch}")["confirmed"] is False
    assert vote(chain, 2, epoch).code == Code.OK
    view = ask(chain, f"/payouts?epoch={epoch}")
    assert view["confirmed"] is True and view["power"] == 30
    operators = sorted((v.operator for v in chain.validators[:3]), key=lambda a: int(a, 16))
    assert view["signers"] == operators
    before = view["root"]
    # the same validator signing the same statement again: refused, nothing recomputed
    assert vote(chain, 0, epoch).code == Code.DUPLICATE_VOTE
    assert ask(chain, f"/payouts?epoch={epoch}")["root"] == before


def test_settlement_payout_vote_refusals_are_named(tmp_path: Path) -> None:
    chain = settled_chain()
    _, _, epoch = served_epoch(chain, tmp_path)
    stranger = seeded_evm_key("not-the-operator")
    assert vote(chain, 0, epoch, key=stranger).code == Code.BAD_PAYOUT_SIGNATURE
    no_statement = one(chain, PayoutVote(epoch + 7, "0x" + "11" * 65), chain.validators[0].key)
    assert no_statement.code == Code.NO_STATEMENT
    node = seeded_key("node-a")
    assert one(chain, PayoutVote(epoch, "0x" + "11" * 65), node).code == Code.NOT_VALIDATOR
    plain = Chain()
    refused = one(plain, PayoutVote(1, "0x" + "11" * 65), plain.validators[0].key)
    assert refused.code == Code.SETTLEMENT_DISABLED


# --- what a gateway reports ---------------------------------------------------------------------


def test_settlement_work_report_refused_whole_only_for_a_stranger() -> None:
    chain = settled_chain()
    a, _ = two_nodes(chain)
    stranger = seeded_key("not-a-gateway")
    body = report(queries=((Q1, 5),))
    assert one(chain, body, stranger).code == Code.UNKNOWN_GATEWAY
    assert one(chain, body, a).code == Code.UNKNOWN_GATEWAY  # a node cannot report itself
    assert chain.state.items("squery") == []


def test_settlement_a_report_naming_nodes_is_refused_by_name() -> None:
    """Reports carry no per-node served counts any more (issue 45: they decided nothing, and
    tied a report's query ids to its nodes): a `work` field is refused at decoding, by name,
    whatever else the report holds, and the chain keeps nothing of it."""
    chain = settled_chain()
    a, _ = two_nodes(chain)
    raw = _raw({"queries": [[Q1, "5"]], "work": [[hexkey(a), "m", 0, 2, 10]]}, WorkReport.TYPE)
    with pytest.raises(TxDecodeError, match="'work'"):
        decode(raw)
    checked = chain.machine.check_tx(raw)
    assert checked.code == Code.MALFORMED_TX and "'work'" in checked.log
    from tests.unit.test_abci_state import finalize_raw

    [result] = finalize_raw(chain, [raw])  # a byzantine proposer's block holding it anyway
    assert result.code == Code.MALFORMED_TX
    assert chain.state.get("squery", f"{Q1}/{GATEWAY_EVM}") is None
    assert "reported" not in chain.state.get("cover", f"{hexkey(a)}/00000")


def test_settlement_a_bad_item_is_refused_alone_by_name_and_the_others_apply() -> None:
    chain = settled_chain()
    assert one(chain, report(queries=((Q1, 5),)), GATEWAY).code == Code.OK
    body = report(queries=((Q1, 6), (Q2, 7), (Q3, 0)))
    result = one(chain, body, GATEWAY)
    assert result.code == Code.OK, result.log
    refused = [dict(attrs) for kind, attrs in result.events if kind == "planet.item_refused"]
    assert [(r["kind"], r["id"], r["code"]) for r in refused] == [("query", Q1, "DUPLICATE_QUERY")]
    assert all(r["reason"] for r in refused)
    summary = dict(dict(result.events)["planet.work_report"])
    assert (summary["applied"], summary["unchanged"], summary["refused"]) == ("1", "1", "1")
    # the good items applied: Q2 pending; Q1 keeps its first fee
    assert chain.state.get("squery", f"{Q1}/{GATEWAY_EVM}")["fee"] == "5"
    assert chain.state.get("squery", f"{Q2}/{GATEWAY_EVM}")["fee"] == "7"
    assert chain.state.get("squery", f"{Q3}/{GATEWAY_EVM}") is None  # a zero fee charges nothing


def test_settlement_query_fees_are_idempotent() -> None:
    chain = settled_chain()
    assert refused_codes(one(chain, report(queries=((Q1, 5),)), GATEWAY)) == []
    again = one(chain, report(queries=((Q1, 5),)), GATEWAY)
    assert again.code == Code.OK and refused_codes(again) == []
    # not re-dated (block 1 bound the gateway); paid to the address bound to the reporting key
    assert chain.state.get("squery", f"{Q1}/{GATEWAY_EVM}") == {
        "fee": "5",
        "height": 2,
        "gateway": GATEWAY_EVM,
    }
    assert refused_codes(one(chain, report(queries=((Q1, 4),)), GATEWAY)) == ["DUPLICATE_QUERY"]


def test_settlement_a_key_that_released_its_binding_reports_nothing_at_all() -> None:
    """No genesis list of gateways: a key that is not bound (now, after a release) is a
    stranger."""
    chain = settled_chain()
    [result] = chain.block([bind_gateway(chain, GATEWAY, GATEWAY_EVM_KEY, bound=False, nonce=2)])
    assert result.code == Code.OK, result.log
    result = one(chain, report(queries=((Q1, 5),)), GATEWAY)
    assert result.code == Code.UNKNOWN_GATEWAY
    assert chain.state.get("squery", f"{Q1}/{GATEWAY_EVM}") is None


def test_settlement_revenue_is_paid_with_no_redemption_and_no_share_at_all() -> None:
    chain = settled_chain()
    # fees, no node paid by credits this epoch: the gateway is paid anyway (no share needed)
    assert one(chain, report(queries=((Q3, 70),)), GATEWAY).code == Code.OK
    epoch = next_epoch_end(chain)
    view = ask(chain, f"/payouts?epoch={epoch}")
    assert view["query_ids"] == [Q3] and view["rows"] == [[GATEWAY_EVM, "70"]]
    assert view["pages"] == 1 and view["shares"] == {}


def slash_votes(chain: Chain, label: str, tag: int) -> list[bytes]:
    """Three validators' votes confirming a verdict against `label`'s node."""
    verdict = Verdict(
        node=address_of(seeded_evm_key(label)),
        offence=1,
        evidence_hash=bytes([tag]) * 32,
        challenger=address_of(seeded_evm_key("challenger")),
        nonce=tag,
        consumer=FRAUD_PROOFS_ADDRESS,
    )
    votes = []
    for validator in chain.validators[:3]:
        signature = verdict.sign(validator.operator_key, DOMAIN)
        body = VerdictVote(
            node=verdict.node,
            offence=1,
            evidence_hash="0x" + verdict.evidence_hash.hex(),
            challenger=verdict.challenger,
            verdict_nonce=tag,
            signature="0x" + signature.hex(),
        )
        votes.append(chain.tx(body, validator.key))
    return votes


def test_settlement_slashed_node_earns_nothing_and_the_gateway_is_paid_anyway(
    tmp_path: Path,
) -> None:
    chain = settled_chain()
    a, b = two_nodes(chain)
    fee = report(queries=((Q1, 1000),))
    results = redeemed(chain, tmp_path, {a: (0, 1), b: (1, 3)}, lambda: [chain.tx(fee, GATEWAY)])
    assert [r.code for r in results] == [Code.OK] * 5, [r.log for r in results]
    assert [r.code for r in chain.block(slash_votes(chain, "node-b", 7))] == [Code.OK] * 3
    epoch = close_current(chain)
    # A is paid its credit; B's three are not drawn (they stay in the pool, not due); the
    # gateway's fee is its own, untouched
    assert rows(chain, epoch) == {evm_of("node-a"): net(1)}
    assert chain.state.get("cdue", epoch_key(epoch + 1)) == str(CREDIT_PRICE - net(1))
    assert chain.state.get("cpool", "balance") == str(4 * CREDIT_PRICE - net(1))
    assert rows(chain, statement_number(epoch, 1)) == {GATEWAY_EVM: 1000}


def test_settlement_a_slashed_redeemers_credits_stay_in_the_pool_and_pay_nobody_later(
    tmp_path: Path,
) -> None:
    chain = settled_chain()
    a, b = two_nodes(chain)
    results = redeemed(chain, tmp_path, {a: (0, 2)})
    assert [r.code for r in results] == [Code.OK] * 2
    assert [r.code for r in chain.block(slash_votes(chain, "node-a", 8))] == [Code.OK] * 3
    first = close_current(chain)  # only a slashed redeemer: the purchase goes in, no draw
    view = ask(chain, f"/payouts?epoch={first}")
    assert view["rows"] == [] and view["gateways"] == [ESCROW]
    assert rows(chain, first) == {}
    # A's credits are not due to anyone: their price stays in the pool
    assert chain.state.get("cdue", epoch_key(first + 1)) is None
    assert chain.state.get("cpool", "balance") == str(2 * CREDIT_PRICE)
    results = redeemed(chain, tmp_path / "later", {b: (1, 1)})
    assert [r.code for r in results] == [Code.OK] * 2
    later = next_epoch_end(chain)  # B is paid its own credit only (before: A's two as well)
    assert rows(chain, later) == {evm_of("node-b"): net(1)}


def test_settlement_same_txs_give_the_same_app_hash(tmp_path: Path) -> None:
    one_chain, other = settled_chain(), settled_chain()
    blocks: list[tuple[int, list[bytes]]] = []
    deliver = one_chain.block

    def recording(txs: list[bytes] | None = None, **kwargs: Any) -> list[Any]:
        blocks.append((one_chain.state.height, list(txs or [])))
        return deliver(txs, **kwargs)

    one_chain.block = recording  # type: ignore[method-assign]
    served_epoch(one_chain, tmp_path)
    for height, txs in blocks:  # the same bytes at the same heights (mints carry random nonces)
        other.advance_to(height)
        other.block(txs)
    other.advance_to(one_chain.state.height)
    assert one_chain.state.app_hash == other.state.app_hash


# --- hostile inputs -----------------------------------------------------------------------------


def _raw(body_json: dict, kind: str) -> bytes:
    """A correctly signed tx around an arbitrary body (bypassing the dataclasses)."""
    from protocol.canonical import canonical_json
    from protocol.committee.envelope import SIGN_DOMAIN

    key = GATEWAY
    unsigned = {"body": body_json, "nonce": 1, "signer": hexkey(key), "type": kind}
    sig = key.sign(SIGN_DOMAIN + canonical_json(unsigned)).signature.hex()
    return canonical_json({**unsigned, "sig": sig})


NODE = "ab" * 32


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("work_report", {"queries": []}),
        ("work_report", {"queries": [[Q1, 5]]}),  # fee not a string
        ("work_report", {"queries": [[Q1, "05"]]}),
        ("work_report", {"queries": [[Q1, str(1 << 64)]]}),
        ("work_report", {"queries": [[Q2, "1"], [Q1, "1"]]}),
        ("work_report", {"queries": [[Q1, "1"], [Q1, "1"]]}),
        ("work_report", {"queries": "x"}),
        ("work_report", {"queries": [[Q1, "1"]], "work": []}),  # served counts: gone, by name
        ("work_report", {"queries": [[Q1, "1"]], "charges": []}),
        ("work_report", {"work": []}),
        ("contribution", {"work": [["m", 0, 1, 1]]}),  # the retired tx: no such type now
        ("payout_vote", {"epoch": 0, "signature": "0x" + "11" * 65}),
        ("payout_vote", {"epoch": 1, "signature": "0x" + "11" * 64}),
        ("payout_vote", {"epoch": 1, "signature": "0x" + "11" * 65, "extra": 1}),
    ],
)
def test_settlement_hostile_bodies_are_malformed_never_a_crash(kind: str, body: dict) -> None:
    raw = _raw(body, kind)
    with pytest.raises(TxDecodeError):
        decode(raw)
    chain = settled_chain()
    assert chain.machine.check_tx(raw).code == Code.MALFORMED_TX


def test_settlement_tx_bodies_round_trip() -> None:
    for body in (
        report(queries=((Q1, 0), (Q2, (1 << 64) - 1))),
        PayoutVote(3, "0x" + "11" * 65),
    ):
        tx = sign(body, GATEWAY, 5)
        assert decode(tx.encode()).body == body


@pytest.mark.parametrize(
    "path",
    [
        "/payouts?epoch=0",
        "/payouts?epoch=x",
        "/payouts?account=0x12",
        "/payouts/proof?epoch=1",
        "/payouts/proof?account=0x" + "11" * 20,
        "/credits",
        "/credits?account=" + "11" * 20,
    ],
)
def test_settlement_queries_bad_parameters_are_bad_query(path: str) -> None:
    assert ask_code(settled_chain(), path) == Code.BAD_QUERY


def test_settlement_the_retired_backing_query_is_unknown_and_the_app_answers_on() -> None:
    chain = settled_chain()
    for path in ("/backing", "/backing?node=" + "ab" * 32, "/backing?node=١٢"):
        assert ask_code(chain, path) == Code.UNKNOWN_QUERY
    assert ask_code(chain, "/backing?node=" + "x" * 100_000) == Code.BAD_QUERY  # too long at all
    assert ask(chain, "/payouts")["epochs"] == []  # still answering


def test_settlement_queries_unknown_epoch_or_account_not_found(tmp_path: Path) -> None:
    chain = settled_chain()
    _, _, epoch = served_epoch(chain, tmp_path)
    assert ask_code(chain, "/payouts?epoch=99") == Code.NOT_FOUND
    stranger = "0x" + "12" * 20
    assert ask_code(chain, f"/payouts/proof?epoch={epoch}&account={stranger}") == Code.NOT_FOUND
    listed = ask(chain, f"/payouts?account={evm_of('node-a')}")
    assert [e["amount"] for e in listed["epochs"] if e["epoch"] == epoch] == [str(net(2))]
    revenue = ask(chain, f"/payouts?account={GATEWAY_EVM}")
    assert [e["amount"] for e in revenue["epochs"] if e["epoch"] == epoch + (1 << 32)] == ["1001"]


def test_settlement_records_are_pruned_with_their_epoch(tmp_path: Path) -> None:
    chain = settled_chain(retention_epochs=1)
    _, _, epoch = served_epoch(chain, tmp_path)
    page = statement_number(epoch, 1)
    assert chain.state.committed("sqdone", f"{Q1}/{GATEWAY_EVM}") == {
        "fee": "600",
        "statement": page,
    }
    length = chain.state.genesis.epoch_length
    chain.advance_to((epoch + 2) * length + 1)  # first block of epoch e + retention + 1
    assert ask_code(chain, f"/payouts?epoch={epoch}") == Code.NOT_FOUND
    assert ask_code(chain, f"/payouts?epoch={page}") == Code.NOT_FOUND
    assert chain.state.committed("sqdone", f"{Q1}/{GATEWAY_EVM}") is None
    assert list(chain.state.committed_items("credit")) == []
    assert list(chain.state.committed_items("squery")) == []


def test_settlement_scarcity_changes_no_nodes_pay_per_credit(tmp_path: Path) -> None:
    """Before issue 42 a lone node's credits earned 5x shares of the draw (and 2x for two
    routable nodes): here A took 5/7 of two credits' price. Now each credit pays its node its
    price less the verifiers' cut, however scarce the shard."""
    from tests.credit_chain import ensure_key

    chain = settled_chain()
    ensure_key(chain, tmp_path)  # the credit key first: `redeemed` below then takes 3 blocks
    a, b = two_nodes(chain)  # A alone on shard 0 (5x); B on shard 1 ...
    c = register(chain, "node-c", shards=(1,))
    make_routable(chain, c)  # ... with C routable there too (2x), though C earns nothing
    unstaked = register(chain, "node-d", shards=(0,))  # not routable: no effect on shard 0
    length = chain.state.genesis.epoch_length
    chain.block([*price_txs(chain, a), *price_txs(chain, b, 1)])  # so `redeemed` adds no block
    next_epoch_end(chain)
    # in the epoch's last blocks, so they are SERVING at the close (heartbeat timeout 4)
    results = redeemed(
        chain,
        tmp_path,
        {a: (0, 1), b: (1, 1)},
        lambda: [chain.tx(Heartbeat(), key) for key in (a, b, c, unstaked)],
    )
    assert [r.code for r in results] == [Code.OK] * 8, [r.log for r in results]
    assert chain.state.height % length == length - 2  # the close 2 blocks on: within timeout 4
    epoch = next_epoch_end(chain)
    # equal redemptions, equal pay: A alone on shard 0 (was 5x), B with C on shard 1 (was 2x)
    assert rows(chain, epoch) == {evm_of("node-a"): net(1), evm_of("node-b"): net(1)}
