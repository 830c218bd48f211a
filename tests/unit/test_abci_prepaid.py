"""Prepaid charges through the committee: a gateway's work_report carries its vouchers' charges,
the chain checks each (signature, cap, expiry against block time, replay), the epoch close
debits the payers in the signed statement (abci_app/settlement.py)."""

from __future__ import annotations

import pytest

from abci_app.codes import Code
from abci_app.prepaid import MAX_VOUCHER_LIFETIME_S
from abci_app.settlement import model_key
from protocol.committee.envelope import decode, sign
from protocol.committee.grammar import TxDecodeError
from protocol.committee.settlement import Contribution, NodeWork, PrepaidItem, ShardWork, WorkReport
from protocol.eip712 import address_of
from protocol.payment import Voucher, parse_voucher_key, payment_domain, sign_voucher
from shares.payouts import ComputeWork, EpochWork, PayerDebit, ShardHealth
from shares.settlement import close_epoch
from tests.committee_chain import EVM_CHAIN_ID, Chain, seeded_evm_key
from tests.unit.test_abci_settlement import (
    ESCROW,
    GATEWAY,
    ask,
    next_epoch_end,
    one,
    settled_chain,
    two_nodes,
)
from tests.unit.test_abci_state import hexkey

pytestmark = pytest.mark.unit

NOW = 1_800_000_000
GATEWAY_EVM = "0x" + "9a" * 20
MODEL_ID = "0x" + "4d" * 32
PAYER_KEYS = {label: seeded_evm_key(label) for label in ("payer-1", "payer-2")}
PAYMENT = payment_domain(EVM_CHAIN_ID, ESCROW)


def payer(label: str) -> str:
    return address_of(PAYER_KEYS[label]).lower()


def charge(
    label: str,
    n: int,
    fee: int,
    *,
    cap: int = 10**6,
    expiry: int = NOW + 3600,
    key: bytes | None = None,
    consumer: str = ESCROW,
) -> PrepaidItem:
    query_id = "0x" + f"{n:064x}"
    voucher = Voucher(
        GATEWAY_EVM, bytes.fromhex(query_id[2:]), bytes.fromhex(MODEL_ID[2:]), cap, expiry, consumer
    )
    domain = payment_domain(EVM_CHAIN_ID, consumer)
    proof = parse_voucher_key(sign_voucher(key or PAYER_KEYS[label], voucher, domain))
    return PrepaidItem(
        GATEWAY_EVM,
        payer(label),
        query_id,
        MODEL_ID,
        fee,
        cap,
        expiry,
        "0x" + proof.signature.hex(),
    )


def prepaid_report(*items: PrepaidItem, work: tuple[NodeWork, ...] = ()) -> WorkReport:
    ordered = tuple(sorted(items, key=lambda p: (p.payer, p.query_id)))
    return WorkReport(work=work, queries=(), prepaid=ordered)


def chain_at_time() -> Chain:
    chain = settled_chain()
    chain.time_s = NOW
    return chain


def backed_and_credited(chain: Chain, *items: PrepaidItem) -> tuple[str, str]:
    """Two nodes backed by one report that also carries `items`; both contribute."""
    a, b = two_nodes(chain)
    work = tuple(
        sorted(
            (NodeWork(hexkey(a), "m", 0, 2, 10), NodeWork(hexkey(b), "m", 1, 3, 10)),
            key=lambda w: (w.node, w.model, w.shard),
        )
    )
    result = one(chain, prepaid_report(*items, work=work), GATEWAY)
    assert result.code == Code.OK, result.log
    results = chain.block(
        [
            chain.tx(Contribution((ShardWork("m", 0, 2, 10),)), a),
            chain.tx(Contribution((ShardWork("m", 1, 3, 10),)), b),
        ]
    )
    assert [r.code for r in results] == [Code.OK, Code.OK], [r.log for r in results]
    return hexkey(a), hexkey(b)


def test_prepaid_charges_become_the_statements_debits_and_match_close_epoch() -> None:
    chain = chain_at_time()
    items = (charge("payer-1", 1, 300), charge("payer-1", 2, 200), charge("payer-2", 3, 101))
    node_a, node_b = backed_and_credited(chain, *items)
    epoch = next_epoch_end(chain)
    view = ask(chain, f"/payouts?epoch={epoch}")
    first, second = sorted((payer("payer-1"), payer("payer-2")))
    debit = {payer("payer-1"): 500, payer("payer-2"): 101}
    assert view["payers"] == [first, second]
    assert view["debits"] == [str(debit[first]), str(debit[second])]
    assert view["query_ids"] == [] and view["total"] == "601"
    # the settled list names payers and query ids only: no node, circuit or session
    assert sorted(view["charges"]) == sorted([[p.payer, p.query_id] for p in items])
    # the same statement `shares` computes from the same input
    a_acct = chain.state.get("node", node_a)["evm_address"].lower()
    b_acct = chain.state.get("node", node_b)["evm_address"].lower()
    expected = close_epoch(
        EpochWork(
            epoch=epoch,
            queries=(),
            compute=(
                ComputeWork(a_acct, model_key("m"), 0, 1, 20),
                ComputeWork(b_acct, model_key("m"), 1, 1, 30),
            ),
            health=(ShardHealth(model_key("m"), 0, 1), ShardHealth(model_key("m"), 1, 1)),
            debits=(PayerDebit(first, debit[first]), PayerDebit(second, debit[second])),
        )
    )
    assert view["root"] == "0x" + expected.root.hex()
    assert view["queries_hash"] == "0x" + expected.queries_hash.hex()
    # settled charges leave the pending set; their replay guard stays until expiry
    assert chain.state.items("vpend") == []
    replay = one(chain, prepaid_report(items[0]), GATEWAY)
    assert replay.code == Code.VOUCHER_REPLAYED, replay.log


def test_a_charge_replayed_in_a_later_report_or_twice_pending_is_refused_by_name() -> None:
    chain = chain_at_time()
    first = charge("payer-1", 7, 100)
    assert one(chain, prepaid_report(first), GATEWAY).code == Code.OK
    again = one(chain, prepaid_report(first), GATEWAY)
    assert again.code == Code.VOUCHER_REPLAYED and "already charged" in again.log
    # the same voucher with another fee is the same (payer, query id): refused too
    other_fee = one(chain, prepaid_report(charge("payer-1", 7, 50)), GATEWAY)
    assert other_fee.code == Code.VOUCHER_REPLAYED
    assert len(chain.state.items("vpend")) == 1


@pytest.mark.parametrize(
    ("item", "code"),
    [
        (lambda: charge("payer-1", 1, 101, cap=100), Code.VOUCHER_INVALID),
        (lambda: charge("payer-1", 1, 10, key=PAYER_KEYS["payer-2"]), Code.VOUCHER_INVALID),
        (lambda: charge("payer-1", 1, 10, consumer="0x" + "12" * 20), Code.VOUCHER_INVALID),
        (lambda: charge("payer-1", 1, 10, expiry=NOW - 1), Code.VOUCHER_EXPIRED),
        (
            lambda: charge("payer-1", 1, 10, expiry=NOW + MAX_VOUCHER_LIFETIME_S + 1),
            Code.VOUCHER_EXPIRY_TOO_FAR,
        ),
    ],
    ids=["over_cap", "not_the_payer", "other_escrow", "expired", "expiry_too_far"],
)
def test_a_bad_charge_refuses_the_whole_report_with_no_trace(item: object, code: Code) -> None:
    chain = chain_at_time()
    a, _ = two_nodes(chain)
    work = (NodeWork(hexkey(a), "m", 0, 2, 10),)
    result = one(chain, prepaid_report(item(), work=work), GATEWAY)  # type: ignore[operator]
    assert result.code == code, result.log
    assert chain.state.items("vpend") == [] and chain.state.items("vseen") == []
    assert chain.state.get("backing", f"{hexkey(a)}/m/0") is None


def test_the_replay_guard_is_pruned_after_expiry_and_the_voucher_is_then_expired() -> None:
    chain = chain_at_time()
    item = charge("payer-1", 9, 10, expiry=NOW + 60)
    assert one(chain, prepaid_report(item), GATEWAY).code == Code.OK
    key = f"{item.payer}/{item.query_id}"
    chain.time_s = NOW + 60  # expiry itself is still valid
    chain.block()
    assert chain.state.get("vseen", key) == NOW + 60
    chain.time_s = NOW + 61
    chain.block()
    assert chain.state.get("vseen", key) is None
    assert chain.state.items("gcexp") == []
    assert chain.state.get("vpend", key) is not None  # still owed: the close will debit it
    late = one(chain, prepaid_report(item), GATEWAY)
    assert late.code == Code.VOUCHER_EXPIRED, late.log


def test_prepaid_without_escrow_is_settlement_disabled() -> None:
    chain = Chain(genesis={"gateways": [hexkey(GATEWAY)]})
    chain.time_s = NOW
    result = one(chain, prepaid_report(charge("payer-1", 1, 10)), GATEWAY)
    assert result.code == Code.SETTLEMENT_DISABLED


def test_the_wire_keeps_old_reports_unchanged_and_refuses_hostile_prepaid_lists() -> None:
    plain = WorkReport(work=(), queries=(("0x" + "01" * 32, 5),))
    assert "prepaid" not in plain.to_json()
    item = charge("payer-1", 1, 10)
    body = prepaid_report(item)
    raw = sign(body, GATEWAY, 1).encode()
    assert decode(raw).body == body
    good = item.to_json()
    hostile = [
        [],
        [good, good],
        [[*good[:4], "01", *good[5:]]],
        [[*good[:4], "-1", *good[5:]]],
        [[*good[:4], str(1 << 128), *good[5:]]],
        [[good[0].upper(), *good[1:]]],
        [[*good[:6], True, good[7]]],
        [[*good[:6], 1 << 64, good[7]]],
        [good[:7]],
        "x",
    ]
    for bad in hostile:
        with pytest.raises(TxDecodeError):
            WorkReport.from_json({"work": [], "queries": [], "prepaid": bad})
