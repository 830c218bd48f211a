"""Settlement on the committee chain: gateway work reports, node contributions, the epoch close
and payout votes, with every refusal named (abci_app/settlement.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from nacl.signing import SigningKey

from abci_app.codes import Code
from abci_app.queries import query
from protocol.committee.envelope import decode, sign
from protocol.committee.grammar import TxDecodeError
from protocol.committee.registry import Heartbeat
from protocol.committee.settlement import Contribution, NodeWork, PayoutVote, ShardWork, WorkReport
from protocol.committee.verification import VerdictVote
from protocol.eip712 import PayoutRoot, Verdict, address_of, committee_domain
from shares.merkle import Payout, verify
from shares.payouts import ComputeWork, EpochWork, SettledQuery, ShardHealth
from shares.settlement import close_epoch
from tests.committee_chain import (
    COMMITTEE_ADDRESS,
    EVM_CHAIN_ID,
    FRAUD_PROOFS_ADDRESS,
    Chain,
    seeded_evm_key,
    seeded_key,
)
from tests.unit.test_abci_state import hexkey, make_routable, register

pytestmark = pytest.mark.unit

ESCROW = "0x" + "ee" * 20
GATEWAY = seeded_key("gateway")
DOMAIN = committee_domain(EVM_CHAIN_ID, COMMITTEE_ADDRESS)
Q1, Q2, Q3 = ("0x" + f"{i:02x}" * 32 for i in (1, 2, 3))


def settled_chain(**extra: object) -> Chain:
    return Chain(
        genesis={
            "gateways": [hexkey(GATEWAY)],
            "evm": {
                "chain_id": EVM_CHAIN_ID,
                "committee_address": COMMITTEE_ADDRESS,
                "fraud_proofs_address": FRAUD_PROOFS_ADDRESS,
                "escrow_address": ESCROW,
            },
            **extra,
        }
    )


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
    return a, b


def report(*work: NodeWork, queries: tuple[tuple[str, int], ...] = ()) -> WorkReport:
    return WorkReport(
        work=tuple(sorted(work, key=lambda w: (w.node, w.model, w.shard))), queries=queries
    )


def one(chain: Chain, body: object, key: SigningKey) -> object:
    [result] = chain.block([chain.tx(body, key)])
    return result


def next_epoch_end(chain: Chain) -> int:
    length = chain.state.genesis.epoch_length
    end = (chain.state.height // length + 1) * length
    chain.advance_to(end)
    return end // length


def served_epoch(chain: Chain) -> tuple[SigningKey, SigningKey, int]:
    """Both nodes backed (A 2 layers × 10 tokens, B 3 × 10), both contribute, the epoch closes."""
    a, b = two_nodes(chain)
    work = report(
        NodeWork(hexkey(a), "m", 0, 2, 10),
        NodeWork(hexkey(b), "m", 1, 3, 10),
        queries=((Q1, 600), (Q2, 401)),
    )
    assert one(chain, work, GATEWAY).code == Code.OK
    results = chain.block(
        [
            chain.tx(Contribution((ShardWork("m", 0, 2, 10),)), a),
            chain.tx(Contribution((ShardWork("m", 1, 3, 10),)), b),
        ]
    )
    assert [r.code for r in results] == [Code.OK, Code.OK], [r.log for r in results]
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


# --- the whole path ---------------------------------------------------------------------------


def test_settlement_served_work_becomes_the_close_epoch_root_and_proofs_verify() -> None:
    chain = settled_chain()
    _, _, epoch = served_epoch(chain)
    view = ask(chain, f"/payouts?epoch={epoch}")
    expected = close_epoch(
        EpochWork(
            epoch=epoch,
            queries=(SettledQuery(Q1, 600), SettledQuery(Q2, 401)),
            compute=(
                ComputeWork(evm_of("node-a"), "m", 0, 2, 10),
                ComputeWork(evm_of("node-b"), "m", 1, 3, 10),
            ),
            # each shard has one routable node: the 5x scarcity bonus on both (it cancels)
            health=(ShardHealth("m", 0, 1), ShardHealth("m", 1, 1)),
        )
    )
    assert view["root"] == "0x" + expected.root.hex()
    assert view["total"] == "1001" == str(expected.total)
    assert view["queries_hash"] == "0x" + expected.queries_hash.hex()
    assert view["consumer"] == ESCROW
    amounts = {account: int(amount) for account, amount in view["rows"]}
    assert amounts == {evm_of("node-a"): 400, evm_of("node-b"): 601}
    for account, amount in amounts.items():
        proof = ask(chain, f"/payouts/proof?epoch={epoch}&account={account}")
        assert int(proof["amount"]) == amount
        steps = [bytes.fromhex(p[2:]) for p in proof["proof"]]
        assert verify(expected.root, Payout(epoch, account, amount), steps)
    # the queries are settled: re-reporting one with its fee changes nothing, with another fee
    # it is a refused item; the credits are gone
    assert refused_codes(one(chain, report(queries=((Q1, 600),)), GATEWAY)) == []
    assert refused_codes(one(chain, report(queries=((Q1, 1),)), GATEWAY)) == ["DUPLICATE_QUERY"]
    assert chain.state.committed("sqdone", Q1) == {"fee": "600", "statement": epoch}
    assert ask(chain, f"/credits?account={evm_of('node-a')}&epoch={epoch}")["credits"] == []


def test_settlement_payout_votes_confirm_at_two_thirds_and_resigning_is_a_duplicate() -> None:
    chain = settled_chain()
    _, _, epoch = served_epoch(chain)
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


def test_settlement_payout_vote_refusals_are_named() -> None:
    chain = settled_chain()
    _, _, epoch = served_epoch(chain)
    stranger = seeded_evm_key("not-the-operator")
    assert vote(chain, 0, epoch, key=stranger).code == Code.BAD_PAYOUT_SIGNATURE
    no_statement = one(chain, PayoutVote(epoch + 7, "0x" + "11" * 65), chain.validators[0].key)
    assert no_statement.code == Code.NO_STATEMENT
    node = seeded_key("node-a")
    assert one(chain, PayoutVote(epoch, "0x" + "11" * 65), node).code == Code.NOT_VALIDATOR
    plain = Chain()
    refused = one(plain, PayoutVote(1, "0x" + "11" * 65), plain.validators[0].key)
    assert refused.code == Code.SETTLEMENT_DISABLED


# --- evidence rules -----------------------------------------------------------------------------


def test_settlement_contribution_without_backing_is_refused() -> None:
    chain = settled_chain()
    a, _ = two_nodes(chain)
    result = one(chain, Contribution((ShardWork("m", 0, 2, 10),)), a)
    assert result.code == Code.UNBACKED_CONTRIBUTION
    assert ask(chain, f"/credits?account={evm_of('node-a')}")["credits"] == []
    # a shard the node did not register, even with backing on its own shard
    assert one(chain, report(NodeWork(hexkey(a), "m", 0, 2, 10)), GATEWAY).code == Code.OK
    other = one(chain, Contribution((ShardWork("m", 1, 2, 10),)), a)
    assert other.code == Code.UNBACKED_CONTRIBUTION


def test_settlement_contribution_is_credited_only_up_to_the_backing() -> None:
    chain = settled_chain()
    a, _ = two_nodes(chain)
    assert one(chain, report(NodeWork(hexkey(a), "m", 0, 2, 10)), GATEWAY).code == Code.OK
    assert ask(chain, f"/backing?node={hexkey(a)}")["backing"] == [
        {"model": "m", "shard": 0, "layer_tokens": 20, "epochs": {"1": 20}}
    ]
    assert one(chain, Contribution((ShardWork("m", 0, 2, 1000),)), a).code == Code.OK
    [credit] = ask(chain, f"/credits?account={evm_of('node-a')}")["credits"]
    assert credit["layer_tokens"] == 20
    assert ask(chain, f"/backing?node={hexkey(a)}")["backing"] == []
    again = one(chain, Contribution((ShardWork("m", 0, 2, 1),)), a)
    assert again.code == Code.UNBACKED_CONTRIBUTION


def test_settlement_contribution_below_backing_leaves_the_rest_for_later() -> None:
    chain = settled_chain()
    a, _ = two_nodes(chain)
    assert one(chain, report(NodeWork(hexkey(a), "m", 0, 2, 10)), GATEWAY).code == Code.OK
    assert one(chain, Contribution((ShardWork("m", 0, 2, 4),)), a).code == Code.OK
    [left] = ask(chain, f"/backing?node={hexkey(a)}")["backing"]
    assert left["layer_tokens"] == 12


def test_settlement_work_report_refused_whole_only_for_a_stranger() -> None:
    chain = settled_chain()
    a, _ = two_nodes(chain)
    stranger = seeded_key("not-a-gateway")
    body = report(NodeWork(hexkey(a), "m", 0, 2, 10), queries=((Q1, 5),))
    assert one(chain, body, stranger).code == Code.UNKNOWN_GATEWAY
    assert one(chain, body, a).code == Code.UNKNOWN_GATEWAY  # a node cannot back itself
    assert ask(chain, f"/backing?node={hexkey(a)}")["backing"] == []
    assert chain.state.items("squery") == []


def test_settlement_a_bad_item_is_refused_alone_by_name_and_the_others_apply() -> None:
    chain = settled_chain()
    a, b = two_nodes(chain)
    assert one(chain, report(queries=((Q1, 5),)), GATEWAY).code == Code.OK
    verifier = register(chain, "verifier-1", role="verifier")
    unknown = "ab" * 32
    body = report(
        NodeWork(hexkey(a), "m", 0, 2, 10),
        NodeWork(unknown, "m", 0, 2, 10),
        NodeWork(hexkey(verifier), "m", 0, 1, 1),
        NodeWork(hexkey(b), "m", 1, 1, 4),
        queries=((Q1, 6), (Q2, 7), (Q3, 0)),
    )
    result = one(chain, body, GATEWAY)
    assert result.code == Code.OK, result.log
    refused = [dict(attrs) for kind, attrs in result.events if kind == "planet.item_refused"]
    work_refused = sorted(
        [
            ("work", f"{unknown}/m/0", "UNKNOWN_NODE"),
            ("work", f"{hexkey(verifier)}/m/0", "WRONG_ROLE"),
        ],
        key=lambda r: r[1],
    )
    expected = [*work_refused, ("query", Q1, "DUPLICATE_QUERY")]
    assert [(r["kind"], r["id"], r["code"]) for r in refused] == expected
    assert all(r["reason"] for r in refused)
    summary = dict(dict(result.events)["planet.work_report"])
    assert (summary["applied"], summary["unchanged"], summary["refused"]) == ("3", "1", "3")
    # the good items applied: both nodes backed, Q2 pending; Q1 keeps its first fee
    assert ask(chain, f"/backing?node={hexkey(a)}")["backing"][0]["layer_tokens"] == 20
    assert ask(chain, f"/backing?node={hexkey(b)}")["backing"][0]["layer_tokens"] == 4
    assert chain.state.get("squery", Q1)["fee"] == "5"
    assert chain.state.get("squery", Q2)["fee"] == "7"
    assert chain.state.get("squery", Q3) is None  # a zero fee charges nothing


def test_settlement_query_fees_are_idempotent() -> None:
    chain = settled_chain()
    assert refused_codes(one(chain, report(queries=((Q1, 5),)), GATEWAY)) == []
    again = one(chain, report(queries=((Q1, 5),)), GATEWAY)
    assert again.code == Code.OK and refused_codes(again) == []
    assert chain.state.get("squery", Q1) == {"fee": "5", "height": 1}  # not re-dated
    assert refused_codes(one(chain, report(queries=((Q1, 4),)), GATEWAY)) == ["DUPLICATE_QUERY"]


def test_settlement_nothing_to_pay_carries_the_queries_forward() -> None:
    chain = settled_chain()
    a, _ = two_nodes(chain)
    # fees but no credited work in this epoch: no statement
    assert one(chain, report(queries=((Q3, 70),)), GATEWAY).code == Code.OK
    first = next_epoch_end(chain)
    assert ask_code(chain, f"/payouts?epoch={first}") == Code.NOT_FOUND
    # the next epoch has work: the carried query is settled there
    assert one(chain, report(NodeWork(hexkey(a), "m", 0, 1, 7)), GATEWAY).code == Code.OK
    assert one(chain, Contribution((ShardWork("m", 0, 1, 7),)), a).code == Code.OK
    second = next_epoch_end(chain)
    view = ask(chain, f"/payouts?epoch={second}")
    assert view["query_ids"] == [Q3] and view["rows"] == [[evm_of("node-a"), "70"]]


def test_settlement_work_before_its_fees_waits_for_them() -> None:
    chain = settled_chain()
    a, b = two_nodes(chain)
    assert one(chain, report(NodeWork(hexkey(a), "m", 0, 2, 10)), GATEWAY).code == Code.OK
    assert one(chain, Contribution((ShardWork("m", 0, 2, 10),)), a).code == Code.OK
    first = next_epoch_end(chain)  # work, no fee yet: no statement, the credit moves on
    assert ask_code(chain, f"/payouts?epoch={first}") == Code.NOT_FOUND
    assert ask(chain, f"/credits?account={evm_of('node-a')}")["credits"][0]["layer_tokens"] == 20
    work = report(NodeWork(hexkey(b), "m", 1, 1, 20), queries=((Q1, 100),))
    assert one(chain, work, GATEWAY).code == Code.OK
    assert one(chain, Contribution((ShardWork("m", 1, 1, 20),)), b).code == Code.OK
    second = next_epoch_end(chain)
    rows = ask(chain, f"/payouts?epoch={second}")["rows"]
    # equal layer-tokens (20 each), both shards alone (5x): half each
    assert rows == sorted([[evm_of("node-a"), "50"], [evm_of("node-b"), "50"]])


def test_settlement_node_slashed_in_the_epoch_earns_nothing() -> None:
    chain = settled_chain()
    a, b = two_nodes(chain)
    work = report(
        NodeWork(hexkey(a), "m", 0, 2, 10),
        NodeWork(hexkey(b), "m", 1, 3, 10),
        queries=((Q1, 1000),),
    )
    assert one(chain, work, GATEWAY).code == Code.OK
    chain.block(
        [
            chain.tx(Contribution((ShardWork("m", 0, 2, 10),)), a),
            chain.tx(Contribution((ShardWork("m", 1, 3, 10),)), b),
        ]
    )
    verdict = Verdict(
        node=address_of(seeded_evm_key("node-b")),
        offence=1,
        evidence_hash=b"\x07" * 32,
        challenger=address_of(seeded_evm_key("challenger")),
        nonce=1,
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
            verdict_nonce=1,
            signature="0x" + signature.hex(),
        )
        votes.append(chain.tx(body, validator.key))
    assert [r.code for r in chain.block(votes)] == [Code.OK] * 3
    epoch = next_epoch_end(chain)
    assert ask(chain, f"/payouts?epoch={epoch}")["rows"] == [[evm_of("node-a"), "1000"]]


def test_settlement_same_txs_give_the_same_app_hash() -> None:
    one_chain, other = settled_chain(), settled_chain()
    served_epoch(one_chain)
    served_epoch(other)
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
        ("work_report", {"queries": [], "work": []}),
        ("work_report", {"queries": [[Q1, 5]], "work": []}),  # fee not a string
        ("work_report", {"queries": [[Q1, "05"]], "work": []}),
        ("work_report", {"queries": [[Q1, str(1 << 64)]], "work": []}),
        ("work_report", {"queries": [[Q2, "1"], [Q1, "1"]], "work": []}),
        ("work_report", {"queries": [[Q1, "1"], [Q1, "1"]], "work": []}),
        ("work_report", {"queries": [], "work": [[NODE, "m", 0, 2]]}),
        ("work_report", {"queries": [], "work": [[NODE, "m", 0, 0, 1]]}),
        ("work_report", {"queries": [], "work": [[NODE, "m", 0, 1, 0]]}),
        ("work_report", {"queries": [], "work": [[NODE, "m", 70000, 1, 1]]}),
        ("work_report", {"queries": [], "work": [[NODE, "m", 0, 1, 1 << 60]]}),
        ("work_report", {"queries": [], "work": [[NODE.upper(), "m", 0, 1, 1]]}),
        ("work_report", {"queries": [], "work": [[NODE, "bad model", 0, 1, 1]]}),
        ("work_report", {"queries": [], "work": [[NODE, "m", 1, 1, 1], [NODE, "m", 0, 1, 1]]}),
        ("work_report", {"queries": [], "work": [[NODE, "m", True, 1, 1]]}),
        ("work_report", {"queries": "x", "work": []}),
        ("work_report", {"work": []}),
        ("contribution", {"work": []}),
        ("contribution", {"work": [["m", 0, 1, 1], ["m", 0, 1, 1]]}),
        ("contribution", {"work": [["m", 0, 1]]}),
        ("contribution", {"work": [["m", -1, 1, 1]]}),
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
        report(NodeWork(NODE, "m", 0, 2, 10), queries=((Q1, 0), (Q2, (1 << 64) - 1))),
        Contribution((ShardWork("a", 0, 1, 1), ShardWork("m", 3, 2, 5))),
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
        "/backing",
        "/backing?node=XYZ",
        "/credits",
        "/credits?account=" + "11" * 20,
    ],
)
def test_settlement_queries_bad_parameters_are_bad_query(path: str) -> None:
    assert ask_code(settled_chain(), path) == Code.BAD_QUERY


def test_settlement_queries_unknown_epoch_or_account_not_found() -> None:
    chain = settled_chain()
    _, _, epoch = served_epoch(chain)
    assert ask_code(chain, "/payouts?epoch=99") == Code.NOT_FOUND
    stranger = "0x" + "12" * 20
    assert ask_code(chain, f"/payouts/proof?epoch={epoch}&account={stranger}") == Code.NOT_FOUND
    listed = ask(chain, f"/payouts?account={evm_of('node-a')}")
    assert [e["epoch"] for e in listed["epochs"]] == [epoch]
    assert listed["epochs"][0]["amount"] == "400"


def test_settlement_records_are_pruned_with_their_epoch() -> None:
    chain = settled_chain(retention_epochs=1)
    _, _, epoch = served_epoch(chain)
    assert chain.state.committed("sqdone", Q1) == {"fee": "600", "statement": epoch}
    length = chain.state.genesis.epoch_length
    chain.advance_to((epoch + 2) * length + 1)  # first block of epoch e + retention + 1
    assert ask_code(chain, f"/payouts?epoch={epoch}") == Code.NOT_FOUND
    assert chain.state.committed("sqdone", Q1) is None
    assert list(chain.state.committed_items("credit")) == []
    assert list(chain.state.committed_items("squery")) == []


def test_settlement_scarcity_counts_routable_nodes_not_only_contributors() -> None:
    chain = settled_chain()
    a, b = two_nodes(chain)  # A alone on shard 0 (5x); B on shard 1 ...
    c = register(chain, "node-c", shards=(1,))
    make_routable(chain, c)  # ... with C routable there too (2x), though C earns nothing
    unstaked = register(chain, "node-d", shards=(0,))  # not routable: no effect on shard 0
    work = report(
        NodeWork(hexkey(a), "m", 0, 1, 10),
        NodeWork(hexkey(b), "m", 1, 1, 10),
        queries=((Q1, 700),),
    )
    assert one(chain, work, GATEWAY).code == Code.OK
    length = chain.state.genesis.epoch_length
    chain.advance_to((chain.state.height // length + 1) * length - 2)
    # in the epoch's last blocks, so they are SERVING at the close (heartbeat timeout 4)
    results = chain.block(
        [
            chain.tx(Contribution((ShardWork("m", 0, 1, 10),)), a),
            chain.tx(Contribution((ShardWork("m", 1, 1, 10),)), b),
            *(chain.tx(Heartbeat(), key) for key in (a, b, c, unstaked)),
        ]
    )
    assert [r.code for r in results] == [Code.OK] * 6
    epoch = next_epoch_end(chain)
    rows = dict(ask(chain, f"/payouts?epoch={epoch}")["rows"])
    assert rows == {evm_of("node-a"): "500", evm_of("node-b"): "200"}  # 5 : 2


# --- credit belongs to the epoch the work was served in -----------------------------------------


def test_settlement_backing_is_creditable_in_its_epoch_and_the_next_only() -> None:
    chain = settled_chain()
    a, b = two_nodes(chain)
    length = chain.state.genesis.epoch_length
    served = chain.state.height // length + 1
    work = report(NodeWork(hexkey(a), "m", 0, 2, 10), NodeWork(hexkey(b), "m", 1, 3, 10))
    assert refused_codes(one(chain, work, GATEWAY)) == []
    chain.advance_to(served * length)  # epoch `served` closes
    # B claims in the next epoch: one epoch of grace
    assert one(chain, Contribution((ShardWork("m", 1, 3, 10),)), b).code == Code.OK
    [credit] = ask(chain, f"/credits?account={evm_of('node-b')}")["credits"]
    assert credit["layer_tokens"] == 30
    assert ask(chain, f"/backing?node={hexkey(a)}")["backing"] == [
        {"model": "m", "shard": 0, "layer_tokens": 20, "epochs": {str(served): 20}}
    ]
    chain.advance_to((served + 1) * length)  # the epoch after closes: A's backing expires
    assert ask(chain, f"/backing?node={hexkey(a)}")["backing"] == []
    late = one(chain, Contribution((ShardWork("m", 0, 2, 10),)), a)
    assert late.code == Code.UNBACKED_CONTRIBUTION, late.log
    assert ask(chain, f"/credits?account={evm_of('node-a')}")["credits"] == []


def test_settlement_a_contribution_uses_the_older_backing_first() -> None:
    chain = settled_chain()
    a, _ = two_nodes(chain)
    length = chain.state.genesis.epoch_length
    first = chain.state.height // length + 1
    assert refused_codes(one(chain, report(NodeWork(hexkey(a), "m", 0, 1, 6)), GATEWAY)) == []
    chain.advance_to(first * length)
    assert refused_codes(one(chain, report(NodeWork(hexkey(a), "m", 0, 1, 5)), GATEWAY)) == []
    assert one(chain, Contribution((ShardWork("m", 0, 1, 8),)), a).code == Code.OK
    [left] = ask(chain, f"/backing?node={hexkey(a)}")["backing"]
    assert left == {"model": "m", "shard": 0, "layer_tokens": 3, "epochs": {str(first + 1): 3}}


def test_settlement_credits_of_an_epoch_that_paid_nothing_move_on_once() -> None:
    chain = settled_chain()
    a, _ = two_nodes(chain)
    assert refused_codes(one(chain, report(NodeWork(hexkey(a), "m", 0, 2, 10)), GATEWAY)) == []
    assert one(chain, Contribution((ShardWork("m", 0, 2, 10),)), a).code == Code.OK
    first = next_epoch_end(chain)  # no fee: the credit moves to the next epoch, marked carried
    [carried] = ask(chain, f"/credits?account={evm_of('node-a')}")["credits"]
    assert carried["layer_tokens"] == 20
    second = next_epoch_end(chain)  # no fee again: a carried credit moves no further
    assert second == first + 1
    assert ask(chain, f"/credits?account={evm_of('node-a')}")["credits"] == []
