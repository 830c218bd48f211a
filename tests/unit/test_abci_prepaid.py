"""Prepaid charges through the committee: a gateway's work_report carries cumulative charges under
payer-signed authorizations (vouchers and payment keys); the chain checks each item on its own
(signature, cap, expiry against block time, never below what it charged before), keeps the
running total per authorization and debits each (payer, gateway) the increase in the epoch's
statement (abci_app/settlement.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from abci_app.codes import Code
from abci_app.settlement import MAX_LIFETIME_S
from protocol.committee.envelope import decode, sign
from protocol.committee.grammar import TxDecodeError
from protocol.committee.settlement import ChargeItem, WorkReport, statement_number
from protocol.eip712 import address_of, sign_digest
from protocol.payment import PaymentKey, Voucher, payment_domain
from shares.payouts import EpochWork, PayerDebit
from shares.settlement import PageCharges, close_epoch_pages
from tests.committee_chain import COMMITTEE_ADDRESS, EVM_CHAIN_ID, Chain, seeded_evm_key, seeded_key
from tests.unit.test_abci_settlement import (
    ESCROW,
    GATEWAY,
    GATEWAY_EVM,
    GATEWAY_EVM_KEY,
    ask,
    bind_gateway,
    next_epoch_end,
    one,
    settled_chain,
    two_nodes,
)
from tests.unit.test_abci_state import hexkey

pytestmark = pytest.mark.unit

NOW = 1_800_000_000
OTHER_GATEWAY_EVM = address_of(seeded_evm_key("other-gateway")).lower()
MODEL_ID = "0x" + "4d" * 32
PAYER_KEYS = {label: seeded_evm_key(label) for label in ("payer-1", "payer-2")}
PAYMENT = payment_domain(EVM_CHAIN_ID, ESCROW)


def payer(label: str) -> str:
    return address_of(PAYER_KEYS[label]).lower()


def charge(
    label: str,
    n: int,
    total: int,
    *,
    kind: str = "voucher",
    cap: int = 10**6,
    expiry: int = NOW + 3600,
    key: bytes | None = None,
    consumer: str = ESCROW,
    gateway: str = GATEWAY_EVM,
) -> ChargeItem:
    """A `kind` authorization number `n` of payer `label`, charged `total` in all."""
    ident = bytes.fromhex(f"{n:064x}")
    model = bytes.fromhex(MODEL_ID[2:])
    struct: Voucher | PaymentKey
    if kind == "voucher":
        struct = Voucher(gateway, ident, model, cap, expiry, consumer)
    else:
        struct = PaymentKey(gateway, ident, model, cap, expiry, consumer)
    digest = struct.digest(payment_domain(EVM_CHAIN_ID, consumer))
    signature = sign_digest(key or PAYER_KEYS[label], digest)
    return ChargeItem(
        kind,
        gateway,
        payer(label),
        "0x" + ident.hex(),
        MODEL_ID,
        total,
        cap,
        expiry,
        "0x" + signature.hex(),
    )


def charges_report(*items: ChargeItem) -> WorkReport:
    return WorkReport(queries=(), charges=tuple(sorted(items, key=lambda c: c.key)))


def chain_at_time() -> Chain:
    chain = settled_chain()
    chain.time_s = NOW
    return chain


def refusals(result: Any) -> list[dict[str, str]]:
    """The `planet.item_refused` events of a tx result, as dicts."""
    return [dict(attrs) for kind, attrs in result.events if kind == "planet.item_refused"]


def reported_with(chain: Chain, *items: ChargeItem) -> tuple[str, str]:
    """Two registered nodes, and one report carrying `items`."""
    a, b = two_nodes(chain)
    result = one(chain, charges_report(*items), GATEWAY)
    assert result.code == Code.OK and refusals(result) == [], result.log
    return hexkey(a), hexkey(b)


def test_charges_are_debited_on_each_gateways_own_pages_and_paid_to_it() -> None:
    other_key = seeded_key("other-gateway")  # bound to OTHER_GATEWAY_EVM: no genesis list
    chain = settled_chain({GATEWAY: GATEWAY_EVM_KEY, other_key: seeded_evm_key("other-gateway")})
    chain.time_s = NOW
    items = (
        charge("payer-1", 1, 300),
        charge("payer-1", 2, 200),
        charge("payer-1", 3, 50, gateway=OTHER_GATEWAY_EVM),
        charge("payer-2", 4, 101, kind="key"),
    )
    reported_with(chain, *(c for c in items if c.gateway == GATEWAY_EVM))
    theirs = one(chain, charges_report(*(c for c in items if c.gateway != GATEWAY_EVM)), other_key)
    assert theirs.code == Code.OK and refusals(theirs) == [], theirs.log
    epoch = next_epoch_end(chain)
    views = [ask(chain, f"/payouts?epoch={statement_number(epoch, page)}") for page in (0, 1)]
    assert [view["pages"] for view in views] == [2, 2]
    by_gateway = {view["rows"][0][0]: view for view in views}
    expected = {
        GATEWAY_EVM: sorted(
            [(payer("payer-1"), GATEWAY_EVM, 500), (payer("payer-2"), GATEWAY_EVM, 101)]
        ),
        OTHER_GATEWAY_EVM: [(payer("payer-1"), OTHER_GATEWAY_EVM, 50)],
    }
    assert sorted(by_gateway) == sorted(expected)
    for gateway, debits in expected.items():
        view = by_gateway[gateway]
        listed = zip(view["payers"], view["gateways"], map(int, view["debits"]), strict=True)
        assert list(listed) == debits
        total = sum(d for _, _, d in debits)
        # one row: the gateway, for what its own payers were charged; no node, no share
        assert view["rows"] == [[gateway, str(total)]] and view["total"] == str(total)
        assert view["query_ids"] == [] and view["shares"] == {}
        # what the root covers, per authorization: no node, circuit or session
        assert sorted(view["charges"]) == sorted(
            [c.payer, c.gateway, c.kind, c.id, str(c.total)] for c in items if c.gateway == gateway
        )
        page = PageCharges(
            view["epoch"], debits=tuple(PayerDebit(p, g, d) for p, g, d in debits), gateway=gateway
        )
        [statement] = close_epoch_pages(EpochWork(epoch=epoch, queries=(), compute=()), [page])
        assert view["root"] == "0x" + statement.root.hex()
        assert view["queries_hash"] == "0x" + statement.queries_hash.hex()
    assert chain.state.items("cpend") == []
    # the same items again after the root: charged already, nothing new to debit
    again = one(chain, charges_report(*items[:2], items[3]), GATEWAY)
    assert again.code == Code.OK and refusals(again) == []
    assert chain.state.items("cpend") == []


def test_a_key_is_charged_cumulatively_never_twice_never_below_never_above_its_cap() -> None:
    chain = chain_at_time()
    first = one(chain, charges_report(charge("payer-1", 7, 100, kind="key", cap=1000)), GATEWAY)
    assert refusals(first) == []
    assert one(chain, charges_report(charge("payer-1", 7, 250, kind="key", cap=1000)), GATEWAY)
    key = f"{payer('payer-1')}/{GATEWAY_EVM}/key/0x{7:064x}"
    assert chain.state.get("cpend", key) == {"from": "0", "total": "250", "height": 2}
    resent = one(chain, charges_report(charge("payer-1", 7, 250, kind="key", cap=1000)), GATEWAY)
    assert refusals(resent) == [] and ("applied", "0") in dict(resent.events)["planet.work_report"]
    lower = one(chain, charges_report(charge("payer-1", 7, 200, kind="key", cap=1000)), GATEWAY)
    assert [(r["code"], r["kind"], r["id"]) for r in refusals(lower)] == [
        ("CHARGE_BELOW_PREVIOUS", "charge", key)
    ]
    above = one(chain, charges_report(charge("payer-1", 7, 1001, kind="key", cap=1000)), GATEWAY)
    assert [r["code"] for r in refusals(above)] == ["CHARGE_OVER_CAP"]
    assert chain.state.get("spent", key)["total"] == "250"


def test_a_charge_after_its_statement_debits_only_the_increase() -> None:
    chain = chain_at_time()
    reported_with(chain, charge("payer-1", 7, 100, kind="key"))
    epoch = next_epoch_end(chain)
    assert ask(chain, f"/payouts?epoch={epoch}")["debits"] == ["100"]
    assert one(chain, charges_report(charge("payer-1", 7, 160, kind="key")), GATEWAY)
    key = f"{payer('payer-1')}/{GATEWAY_EVM}/key/0x{7:064x}"
    assert chain.state.get("cpend", key)["from"] == "100"


@pytest.mark.parametrize(
    ("item", "code"),
    [
        (lambda: charge("payer-1", 1, 101, cap=100), "CHARGE_OVER_CAP"),
        (lambda: charge("payer-1", 1, 10, key=PAYER_KEYS["payer-2"]), "AUTHORIZATION_INVALID"),
        (lambda: charge("payer-1", 1, 10, consumer="0x" + "12" * 20), "AUTHORIZATION_INVALID"),
        (lambda: charge("payer-1", 1, 10, kind="key", key=b"\x07" * 32), "AUTHORIZATION_INVALID"),
        (lambda: charge("payer-1", 1, 10, expiry=NOW - 1), "AUTHORIZATION_EXPIRED"),
        (
            lambda: charge("payer-1", 1, 10, expiry=NOW + MAX_LIFETIME_S["voucher"] + 1),
            "AUTHORIZATION_EXPIRY_TOO_FAR",
        ),
        # signed by the payer, but the pair (payer, escrow) is a credit purchase on the escrow
        (lambda: charge("payer-1", 1, 10, gateway=ESCROW), "WRONG_GATEWAY"),
    ],
    ids=[
        "over_cap",
        "not_the_payer",
        "other_escrow",
        "key_not_the_payer",
        "expired",
        "too_far",
        "the_escrow",
    ],
)
def test_a_bad_charge_is_refused_alone_by_name_and_the_rest_applies(item: Any, code: str) -> None:
    chain = chain_at_time()
    bad = item()
    good = charge("payer-2", 2, 40)
    result = one(chain, charges_report(bad, good), GATEWAY)
    assert result.code == Code.OK, result.log
    [refused] = refusals(result)
    assert (refused["kind"], refused["id"], refused["code"]) == ("charge", bad.name, code)
    assert refused["reason"]
    # the report's other item applied: the good charge is pending
    assert [key for key, _ in chain.state.items("cpend")] == [good.name]
    assert [key for key, _ in chain.state.items("spent")] == [good.name]


def test_a_charge_under_another_expiry_of_the_same_authorization_is_refused() -> None:
    chain = chain_at_time()
    assert one(chain, charges_report(charge("payer-1", 3, 10, kind="key")), GATEWAY)
    other = one(
        chain, charges_report(charge("payer-1", 3, 20, kind="key", expiry=NOW + 7200)), GATEWAY
    )
    assert [r["code"] for r in refusals(other)] == ["AUTHORIZATION_INVALID"]


def test_the_replay_guard_is_pruned_after_expiry_and_the_authorization_is_then_expired() -> None:
    chain = chain_at_time()
    item = charge("payer-1", 9, 10, expiry=NOW + 60)
    assert refusals(one(chain, charges_report(item), GATEWAY)) == []
    chain.time_s = NOW + 60  # expiry itself is still valid
    chain.block()
    assert chain.state.get("spent", item.name) == {"total": "10", "expiry": NOW + 60}
    chain.time_s = NOW + 61
    chain.block()
    assert chain.state.get("spent", item.name) is None
    assert chain.state.items("gcexp") == []
    assert chain.state.get("cpend", item.name) is not None  # still owed: the close debits it
    late = one(chain, charges_report(item), GATEWAY)
    assert [r["code"] for r in refusals(late)] == ["AUTHORIZATION_EXPIRED"]


def test_charges_without_escrow_are_refused_items_settlement_disabled() -> None:
    evm = {"chain_id": EVM_CHAIN_ID, "committee_address": COMMITTEE_ADDRESS}  # no escrow
    chain = Chain(genesis={"evm": evm})
    chain.time_s = NOW
    [bound] = chain.block([bind_gateway(chain, GATEWAY, GATEWAY_EVM_KEY)])
    assert bound.code == Code.OK, bound.log
    result = one(chain, charges_report(charge("payer-1", 1, 10)), GATEWAY)
    assert result.code == Code.OK
    assert [r["code"] for r in refusals(result)] == ["SETTLEMENT_DISABLED"]


def test_the_wire_keeps_old_reports_unchanged_and_refuses_hostile_charge_lists() -> None:
    plain = WorkReport(queries=(("0x" + "01" * 32, 5),))
    assert "charges" not in plain.to_json()
    item = charge("payer-1", 1, 10)
    body = charges_report(item, charge("payer-1", 1, 10, kind="key"))
    raw = sign(body, GATEWAY, 1).encode()
    assert decode(raw).body == body
    good = item.to_json()
    hostile = [
        [],
        [good, good],
        [[*good[:5], "01", *good[6:]]],
        [[*good[:5], "-1", *good[6:]]],
        [[*good[:5], str(1 << 128), *good[6:]]],
        [[*good[:6], str(1 << 128), *good[7:]]],
        [["prepaid", *good[1:]]],
        [[good[0], good[1].upper(), *good[2:]]],
        [[*good[:7], True, good[8]]],
        [[*good[:7], 1 << 64, good[8]]],
        [good[:8]],
        "x",
    ]
    for bad in hostile:
        with pytest.raises(TxDecodeError):
            WorkReport.from_json({"queries": [], "charges": bad})


def test_a_bound_gateway_key_charges_only_for_its_own_address() -> None:
    chain = settled_chain()  # GATEWAY bound to GATEWAY_EVM by a gateway tx
    chain.time_s = NOW
    own, other = charge("payer-1", 1, 10), charge("payer-1", 2, 10, gateway=OTHER_GATEWAY_EVM)
    result = one(chain, charges_report(own, other), GATEWAY)
    assert [(r["id"], r["code"]) for r in refusals(result)] == [(other.name, "WRONG_GATEWAY")]
    assert [key for key, _ in chain.state.items("cpend")] == [own.name]


def test_genesis_gateway_lists_are_refused_by_name() -> None:
    from abci_app.genesis import Genesis
    from protocol.errors import ConfigError

    key = hexkey(GATEWAY)
    with pytest.raises(ConfigError, match="gateway_addresses was removed"):
        Genesis.parse(json.dumps({"gateway_addresses": {key: GATEWAY_EVM}}).encode())
    with pytest.raises(ConfigError, match="gateways was removed: no list of gateways is trusted"):
        Genesis.parse(json.dumps({"gateways": [key]}).encode())
